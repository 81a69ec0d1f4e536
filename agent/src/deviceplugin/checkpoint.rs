//! `<root-dir>/device-plugins/kubelet_internal_checkpoint`: which devices
//! each pod's containers hold (with the plugin's Allocate answer, so a
//! restarted agent can create the containers again without asking), and
//! the devices each resource had. The layout is the kubelet's
//! (`Data.PodDeviceEntries`, `Data.RegisteredDevices`, `Checksum`;
//! device ids under NUMA node "-1"); the checksum is FNV-1a over the
//! JSON of `Data`, so the file is not interchangeable with a kubelet's.
//! Written to a temporary file, synced, and renamed over the old one
//! (`host::write_atomic`: a random O_EXCL name, since device-plugin pods
//! write this directory and could plant a symlink at a name known in
//! advance); read without following a symlink.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Read,
    path::{Path, PathBuf},
};

use base64::Engine;
use prost::Message;
use rustix::fs::{Mode, OFlags};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{
    allocation::{Assignments, ContainerDevices},
    api,
};

#[derive(Debug, Error)]
pub enum CheckpointError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: not a device manager checkpoint: {message}", path.display())]
    Corrupt { path: PathBuf, message: String },
}

/// What the checkpoint holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Checkpoint {
    pub assignments: Assignments,
    pub registered: BTreeMap<String, Vec<String>>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct FileFormat {
    data: Data,
    checksum: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Data {
    pod_device_entries: Vec<Entry>,
    registered_devices: BTreeMap<String, Vec<String>>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Entry {
    #[serde(rename = "PodUID")]
    pod_uid: String,
    container_name: String,
    resource_name: String,
    /// NUMA node → ids; swiftlet keeps no topology: all under "-1".
    #[serde(rename = "DeviceIDs")]
    device_ids: BTreeMap<String, Vec<String>>,
    /// The ContainerAllocateResponse, protobuf, base64 (Go's []byte).
    #[serde(default)]
    alloc_resp: String,
}

const NO_NUMA_NODE: &str = "-1";

fn fnv1a32(bytes: &[u8]) -> u64 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    u64::from(h)
}

fn encode(c: &Checkpoint) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut entries = vec![];
    for (uid, containers) in &c.assignments.pods {
        for (container, resources) in containers {
            for (resource, d) in resources {
                entries.push(Entry {
                    pod_uid: uid.clone(),
                    container_name: container.clone(),
                    resource_name: resource.clone(),
                    device_ids: BTreeMap::from([(NO_NUMA_NODE.to_owned(), d.ids.iter().cloned().collect())]),
                    alloc_resp: d.response.as_ref().map(|r| b64.encode(r.encode_to_vec())).unwrap_or_default(),
                });
            }
        }
    }
    let data = Data { pod_device_entries: entries, registered_devices: c.registered.clone() };
    let checksum = fnv1a32(&serde_json::to_vec(&data).unwrap_or_default());
    serde_json::to_vec(&FileFormat { data, checksum }).unwrap_or_default()
}

fn decode(path: &Path, bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
    let corrupt = |message: String| CheckpointError::Corrupt { path: path.to_owned(), message };
    let file: FileFormat = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
    let sum = fnv1a32(&serde_json::to_vec(&file.data).unwrap_or_default());
    if sum != file.checksum {
        return Err(corrupt(format!("checksum {} does not match the data ({sum})", file.checksum)));
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut assignments = Assignments::default();
    for e in file.data.pod_device_entries {
        let response = if e.alloc_resp.is_empty() {
            None
        } else {
            let raw = b64.decode(&e.alloc_resp).map_err(|err| corrupt(format!("AllocResp of {}: {err}", e.pod_uid)))?;
            Some(
                api::ContainerAllocateResponse::decode(raw.as_slice())
                    .map_err(|err| corrupt(format!("AllocResp of {}: {err}", e.pod_uid)))?,
            )
        };
        let ids: BTreeSet<String> = e.device_ids.into_values().flatten().collect();
        assignments
            .pods
            .entry(e.pod_uid)
            .or_default()
            .entry(e.container_name)
            .or_default()
            .insert(e.resource_name, ContainerDevices { ids, response });
    }
    Ok(Checkpoint { assignments, registered: file.data.registered_devices })
}

/// Reads the checkpoint; a missing file is an empty one. A symlink in its
/// place is refused (ELOOP), not followed.
pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
    let read = || -> std::io::Result<Vec<u8>> {
        let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let mut f = std::fs::File::from(rustix::fs::open(path, flags, Mode::empty())?);
        let mut b = vec![];
        f.read_to_end(&mut b)?;
        Ok(b)
    };
    match read() {
        Ok(b) => decode(path, &b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Checkpoint::default()),
        Err(source) => Err(CheckpointError::Io { path: path.to_owned(), source }),
    }
}

/// Replaces the checkpoint atomically (a random temporary name, fsync,
/// rename).
pub fn save(path: &Path, c: &Checkpoint) -> Result<(), CheckpointError> {
    crate::host::write_atomic(path, &encode(c), 0o644)
        .map_err(|source| CheckpointError::Io { path: path.to_owned(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        let mut c = Checkpoint::default();
        let response = api::ContainerAllocateResponse {
            envs: [("FAKE_DEVICES".to_string(), "0".to_string())].into(),
            ..Default::default()
        };
        c.assignments.pods.entry("uid-1".into()).or_default().entry("c".into()).or_default().insert(
            "swiftlet.dev/fake".into(),
            ContainerDevices { ids: ["0".to_string()].into(), response: Some(response) },
        );
        c.assignments.pods.entry("uid-2".into()).or_default().entry("c".into()).or_default().insert(
            "swiftlet.dev/fake".into(),
            ContainerDevices { ids: ["1".to_string(), "2".to_string()].into(), response: None },
        );
        c.registered.insert("swiftlet.dev/fake".into(), vec!["0".into(), "1".into(), "2".into()]);
        c
    }

    #[test]
    fn round_trip_and_kubelet_layout() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet_internal_checkpoint");
        assert_eq!(load(&path).unwrap(), Checkpoint::default(), "missing = empty");
        save(&path, &sample()).unwrap();
        assert_eq!(load(&path).unwrap(), sample());
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let e = &v["Data"]["PodDeviceEntries"][0];
        assert_eq!(e["PodUID"], "uid-1");
        assert_eq!(e["ContainerName"], "c");
        assert_eq!(e["ResourceName"], "swiftlet.dev/fake");
        assert_eq!(e["DeviceIDs"]["-1"], serde_json::json!(["0"]));
        assert!(!e["AllocResp"].as_str().unwrap().is_empty());
        assert_eq!(v["Data"]["RegisteredDevices"]["swiftlet.dev/fake"], serde_json::json!(["0", "1", "2"]));
        assert!(v["Checksum"].is_u64());
        // Nothing left beside it.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    /// A pod that can write the device-plugins directory plants symlinks
    /// where the agent writes: at the temporary name an earlier version
    /// used (`<name>.tmp.<pid>`) and at the checkpoint itself. Neither
    /// target may change, and the checkpoint is still written.
    #[test]
    fn planted_symlinks_are_never_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet_internal_checkpoint");
        let target = outside.path().join("shadow");
        std::fs::write(&target, "root:secret\n").unwrap();
        let old_tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        std::os::unix::fs::symlink(&target, &old_tmp).unwrap();
        save(&path, &sample()).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "root:secret\n");
        assert_eq!(load(&path).unwrap(), sample());
        // A symlink at the checkpoint's own name is replaced, not followed,
        // and never read through.
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert!(load(&path).is_err(), "a symlinked checkpoint is refused");
        save(&path, &sample()).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "root:secret\n");
        assert!(!std::fs::symlink_metadata(&path).unwrap().file_type().is_symlink());
        assert_eq!(load(&path).unwrap(), sample());
    }

    #[test]
    fn corrupt_files_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet_internal_checkpoint");
        std::fs::write(&path, "{not json").unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}: not a device manager checkpoint", path.display())), "{e}");
        save(&path, &sample()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap().replace("uid-1", "uid-9");
        std::fs::write(&path, text).unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("checksum"), "{e}");
    }
}
