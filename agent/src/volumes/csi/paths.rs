//! Where CSI volumes live on the node, and the `vol_data.json` files that
//! let a restarted agent (or the kubelet, after swiftlet) find them again.
//! The kubelet's layout:
//!
//! ```text
//! <root>/plugins/kubernetes.io/csi/<driver>/<sha256(volumeHandle)>/globalmount   staged (NodeStageVolume)
//! <root>/plugins/kubernetes.io/csi/<driver>/<sha256(volumeHandle)>/vol_data.json {driverName, volumeHandle}
//! <root>/pods/<uid>/volumes/kubernetes.io~csi/<spec name>/mount                   published (NodePublishVolume)
//! <root>/pods/<uid>/volumes/kubernetes.io~csi/<spec name>/vol_data.json
//! ```
//!
//! The spec name is the PV's name for a claim, the pod's volume name for
//! an inline volume.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The kubelet's plugin directory name for CSI volumes under a pod.
pub const POD_PLUGIN_DIR: &str = "kubernetes.io~csi";
pub const DATA_FILE: &str = "vol_data.json";
const GLOBAL_MOUNT: &str = "globalmount";
const MOUNT_DIR: &str = "mount";

/// `volumeLifecycleMode` values.
pub const PERSISTENT: &str = "Persistent";
pub const EPHEMERAL: &str = "Ephemeral";

fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>`.
pub fn global_dir(root_dir: &Path, driver: &str, volume_handle: &str) -> PathBuf {
    root_dir.join("plugins/kubernetes.io/csi").join(driver).join(sha256_hex(volume_handle))
}

/// Where the driver stages the volume.
pub fn staging_path(root_dir: &Path, driver: &str, volume_handle: &str) -> PathBuf {
    global_dir(root_dir, driver, volume_handle).join(GLOBAL_MOUNT)
}

/// `<pod dir>/volumes/kubernetes.io~csi/<spec name>`.
pub fn pod_volume_dir(pod_dir: &Path, spec_name: &str) -> PathBuf {
    pod_dir.join("volumes").join(POD_PLUGIN_DIR).join(spec_name)
}

/// Where the driver publishes the volume for the pod's containers.
pub fn publish_path(pod_dir: &Path, spec_name: &str) -> PathBuf {
    pod_volume_dir(pod_dir, spec_name).join(MOUNT_DIR)
}

/// The name of the VolumeAttachment the attach-detach controller makes
/// for a volume on a node.
pub fn attachment_name(volume_handle: &str, driver: &str, node: &str) -> String {
    format!("csi-{}", sha256_hex(&format!("{volume_handle}{driver}{node}")))
}

/// The volume's name in `node.status.volumesInUse` and
/// `volumesAttached`.
pub fn unique_name(driver: &str, volume_handle: &str) -> String {
    format!("kubernetes.io/csi/{driver}^{volume_handle}")
}

/// The inline volume's handle (the kubelet's `makeVolumeHandle`).
pub fn ephemeral_handle(pod_uid: &str, volume_name: &str) -> String {
    format!("csi-{}", sha256_hex(&format!("{pod_uid}{volume_name}")))
}

/// A pod volume's `vol_data.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodVolumeData {
    #[serde(rename = "specVolID")]
    pub spec_vol_id: String,
    pub volume_handle: String,
    pub driver_name: String,
    pub node_name: String,
    #[serde(rename = "attachmentID", default, skip_serializing_if = "String::is_empty")]
    pub attachment_id: String,
    #[serde(default)]
    pub volume_lifecycle_mode: String,
}

/// A staged volume's `vol_data.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GlobalVolumeData {
    pub driver_name: String,
    pub volume_handle: String,
}

fn write_json<T: Serialize>(dir: &Path, data: &T) -> Result<(), String> {
    fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let bytes = serde_json::to_vec(data).map_err(|e| e.to_string())?;
    crate::host::write_atomic(&dir.join(DATA_FILE), &bytes, 0o640)
        .map_err(|e| format!("writing {}: {e}", dir.join(DATA_FILE).display()))
}

fn read_json<T: for<'de> Deserialize<'de>>(dir: &Path) -> Result<T, String> {
    let path = dir.join(DATA_FILE);
    let bytes = fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

impl PodVolumeData {
    pub fn write(&self, pod_volume_dir: &Path) -> Result<(), String> {
        write_json(pod_volume_dir, self)
    }

    pub fn read(pod_volume_dir: &Path) -> Result<PodVolumeData, String> {
        read_json(pod_volume_dir)
    }
}

impl GlobalVolumeData {
    pub fn write(&self, global_dir: &Path) -> Result<(), String> {
        write_json(global_dir, self)
    }
}

/// Every CSI volume directory of one pod, with its data when readable.
pub fn pod_volumes(pod_dir: &Path) -> Vec<(PathBuf, Result<PodVolumeData, String>)> {
    let Ok(entries) = fs::read_dir(pod_dir.join("volumes").join(POD_PLUGIN_DIR)) else { return vec![] };
    let mut out: Vec<_> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| {
            let dir = e.path();
            let data = PodVolumeData::read(&dir);
            (dir, data)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// How many pods under `pods_dir` other than `except_uid` still have a
/// directory for the volume (driver, handle): the staged volume is kept
/// while one does.
pub fn other_pods_using(pods_dir: &Path, except_uid: &str, driver: &str, volume_handle: &str) -> usize {
    let Ok(pods) = fs::read_dir(pods_dir) else { return 0 };
    pods.flatten()
        .filter(|p| p.file_name().to_string_lossy() != except_uid)
        .filter(|p| {
            pod_volumes(&p.path())
                .iter()
                .any(|(_, d)| d.as_ref().is_ok_and(|d| d.driver_name == driver && d.volume_handle == volume_handle))
        })
        .count()
}

/// The volume context the kubelet adds for drivers with `podInfoOnMount`.
pub fn pod_info(
    name: &str,
    namespace: &str,
    uid: &str,
    service_account: &str,
    ephemeral: bool,
) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("csi.storage.k8s.io/pod.name".to_owned(), name.to_owned()),
        ("csi.storage.k8s.io/pod.namespace".to_owned(), namespace.to_owned()),
        ("csi.storage.k8s.io/pod.uid".to_owned(), uid.to_owned()),
        ("csi.storage.k8s.io/serviceAccount.name".to_owned(), service_account.to_owned()),
        ("csi.storage.k8s.io/ephemeral".to_owned(), ephemeral.to_string()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelets_paths_and_names() {
        let root = Path::new("/var/lib/kubelet");
        let g = global_dir(root, "csi.example.com", "vol-1");
        assert_eq!(g.parent().unwrap(), Path::new("/var/lib/kubelet/plugins/kubernetes.io/csi/csi.example.com"));
        assert_eq!(g.file_name().unwrap().to_str().unwrap(), sha256_hex("vol-1"));
        assert_eq!(sha256_hex("vol-1").len(), 64);
        assert_eq!(staging_path(root, "csi.example.com", "vol-1"), g.join("globalmount"));
        let pod = root.join("pods/uid-1");
        assert_eq!(
            publish_path(&pod, "pvc-123"),
            Path::new("/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pvc-123/mount")
        );
        assert_eq!(unique_name("csi.example.com", "vol-1"), "kubernetes.io/csi/csi.example.com^vol-1");
        // The same inputs, the same names; any other input, another name.
        assert_eq!(attachment_name("v", "d", "n"), attachment_name("v", "d", "n"));
        assert_ne!(attachment_name("v", "d", "n"), attachment_name("v", "d", "m"));
        assert!(attachment_name("v", "d", "n").starts_with("csi-"));
        assert_eq!(ephemeral_handle("u", "scratch").len(), 4 + 64);
        // sha256 of the empty string, a known value.
        assert_eq!(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }

    #[test]
    fn vol_data_has_the_kubelets_keys_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let d = PodVolumeData {
            spec_vol_id: "pvc-1".into(),
            volume_handle: "vol-1".into(),
            driver_name: "csi.example.com".into(),
            node_name: "node-a".into(),
            attachment_id: "csi-abc".into(),
            volume_lifecycle_mode: PERSISTENT.into(),
        };
        let vdir = pod_volume_dir(dir.path(), "pvc-1");
        d.write(&vdir).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&fs::read(vdir.join(DATA_FILE)).unwrap()).unwrap();
        for key in ["specVolID", "volumeHandle", "driverName", "nodeName", "attachmentID", "volumeLifecycleMode"] {
            assert!(json.get(key).is_some(), "{key} in {json}");
        }
        assert_eq!(PodVolumeData::read(&vdir).unwrap(), d);
        assert_eq!(pod_volumes(dir.path()).len(), 1);
        // Another pod's directory for the same volume keeps it staged.
        let pods = tempfile::tempdir().unwrap();
        d.write(&pod_volume_dir(&pods.path().join("a"), "pvc-1")).unwrap();
        d.write(&pod_volume_dir(&pods.path().join("b"), "pvc-1")).unwrap();
        assert_eq!(other_pods_using(pods.path(), "a", "csi.example.com", "vol-1"), 1);
        assert_eq!(other_pods_using(pods.path(), "a", "csi.example.com", "vol-2"), 0);
        // A broken file names itself.
        fs::write(vdir.join(DATA_FILE), b"{").unwrap();
        assert!(PodVolumeData::read(&vdir).unwrap_err().contains("vol_data.json"));
    }
}
