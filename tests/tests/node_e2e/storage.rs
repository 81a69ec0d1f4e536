//! The storage path on the production node: swiftlet from its systemd unit
//! (cgroup v2, the VM's cgroup driver) with the fake API server's storage
//! controllers and the in-repo CSI driver (`swiftlet-test-csi-driver`
//! from the payload: loop devices, a real ext4, real mounts) registered
//! through the plugin watcher in /var/lib/kubelet/plugins_registry, as
//! node-driver-registrar does beside a kubelet. The same objects as the
//! host's storage tests (`swiftlet_tests::storage_objects`).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::{Value, json};
use swiftlet_tests::{
    apiserver::{
        resources::{CSIDRIVERS, CSINODES, PVCS, PVS, STORAGE_CLASSES, VOLUME_ATTACHMENTS},
        storage::StorageOptions,
        store::DeleteOptions,
    },
    csi::{CsiDriverOptions, CsiDriverProcess, DEFAULT_NAME as DRIVER},
    node_vm::{NODE_NAME, Node, require_node_vm, scratch, wait},
    storage_objects::{
        LoopDevice, assert_no_duplicate, claim, claim_volume, csi_driver, csi_handle, local_claim, local_pv,
        mount_points, storage_class, volume_spec,
    },
};

use super::{assert_pod_cgroup, container, container_status, pod};

/// The agent's --root-dir on the node (the kubelet's default).
const ROOT: &str = "/var/lib/kubelet";
const CLASS: &str = "swiftlet-csi";
/// Each step under TCG: a pod start with a stage and a publish takes tens
/// of seconds.
const T: Duration = Duration::from_secs(180);

/// A pod of `name` running `script` in one container, with `volumes` (see
/// [`volume_spec`]) and no restarts: a failing script shows as Failed.
fn pod_with_volumes(name: &str, volumes: Value, script: &str) -> Value {
    let (volumes, mounts, devices) = volume_spec(&volumes);
    let mut c = container("app", script);
    c["volumeMounts"] = json!(mounts);
    c["volumeDevices"] = json!(devices);
    pod(name, json!({"containers": [c], "volumes": volumes, "restartPolicy": "Never"}))
}

/// The CSI mounts under the root dir: staged (plugins/kubernetes.io/csi)
/// and published (pods/<uid>/volumes/kubernetes.io~csi), in mount order.
fn csi_mounts() -> Vec<PathBuf> {
    let staged = Path::new(ROOT).join("plugins/kubernetes.io/csi");
    let pods = Path::new(ROOT).join("pods");
    mount_points()
        .into_iter()
        .filter(|m| {
            m.starts_with(&staged) || (m.starts_with(&pods) && m.to_string_lossy().contains("kubernetes.io~csi"))
        })
        .collect()
}

/// Mounts under a pod's directory.
fn pod_mounts(uid: &str) -> Vec<PathBuf> {
    let dir = Path::new(ROOT).join("pods").join(uid);
    mount_points().into_iter().filter(|m| m.starts_with(&dir)).collect()
}

/// The node with the test CSI driver registered, its CSIDriver and an ext4
/// StorageClass of it. Dropped in this order: the node (its pods deleted,
/// the volumes unpublished and unstaged by the agent), then the driver
/// (SIGKILLed; what its volumes left mounted or attached swept away), then
/// the sockets it left, which the next check's agent would otherwise meet.
struct CsiNode {
    node: Node,
    driver: CsiDriverProcess,
    _sockets: RemovedOnDrop,
}

struct RemovedOnDrop(Vec<PathBuf>);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl CsiNode {
    fn start(check: &str, driver_extra: &[&str]) -> CsiNode {
        require_node_vm();
        let state = scratch(&format!("csi-{check}"));
        let _ = std::fs::remove_dir_all(&state);
        let mut opts = CsiDriverOptions::for_kubelet(Path::new(ROOT), NODE_NAME, &state);
        opts.require_attach = true;
        opts.extra = driver_extra.iter().map(|s| s.to_string()).collect();
        let node = Node::start("syncFrequency: 5s\n", "");
        node.api.start_storage_controllers(StorageOptions::default());
        let driver = CsiDriverProcess::start(&opts).expect("start the test CSI driver");
        node.api.add_csi_controller(DRIVER, driver.socket());
        let store = node.api.store();
        store.create(&CSIDRIVERS, "", csi_driver()).expect("the CSIDriver");
        store
            .create(&STORAGE_CLASSES, "", storage_class(CLASS, json!({"csi.storage.k8s.io/fstype": "ext4"})))
            .expect("the StorageClass");
        wait("the driver registered in the CSINode", T, || {
            let n = node.api.get(&CSINODES, "", NODE_NAME)?;
            n["spec"]["drivers"]
                .as_array()?
                .iter()
                .any(|d| d["name"] == DRIVER && d["nodeID"] == NODE_NAME)
                .then_some(())
        });
        let sockets = RemovedOnDrop(vec![opts.registration_socket(), opts.csi_socket.clone()]);
        CsiNode { node, driver, _sockets: sockets }
    }

    fn claim(&self, name: &str) {
        self.node.api.store().create(&PVCS, "default", claim(name, CLASS, "64Mi")).expect("create the claim");
    }

    /// The PV bound to `claim` once it is.
    fn pv_of(&self, claim: &str) -> Value {
        let pv = wait(&format!("{claim} bound"), T, || {
            let c = self.node.api.get(&PVCS, "default", claim)?;
            (c["status"]["phase"] == "Bound").then(|| c["spec"]["volumeName"].as_str().map(str::to_owned)).flatten()
        });
        self.node.api.get(&PVS, "", &pv).expect("the bound PV")
    }

    /// Where the agent publishes `pv` for pod `uid`.
    fn published(uid: &str, pv: &Value) -> PathBuf {
        let name = pv["metadata"]["name"].as_str().expect("a PV name");
        Path::new(ROOT).join(format!("pods/{uid}/volumes/kubernetes.io~csi/{name}/mount"))
    }

    fn calls(&self, prefix: &str) -> Vec<String> {
        self.driver.calls().into_iter().filter(|c| c.starts_with(prefix)).collect()
    }

    /// Deletes the pod; by the time it leaves the API its volume is
    /// unpublished and unstaged, and then detached.
    fn delete_and_check_nothing_left(&self, name: &str, uid: &str) {
        self.node.delete_pod(name, T);
        assert_eq!(csi_mounts(), Vec::<PathBuf>::new(), "no CSI mount left once {name} is gone");
        assert_eq!(pod_mounts(uid), Vec::<PathBuf>::new(), "no mount left in {name}'s directory");
        wait("the volume detached", T, || self.node.api.list(&VOLUME_ATTACHMENTS, None).is_empty().then_some(()));
    }
}

/// The one staged mount of the driver's among `mounts`.
fn staged(mounts: &[PathBuf]) -> Vec<&PathBuf> {
    let dir = Path::new(ROOT).join("plugins/kubernetes.io/csi").join(DRIVER);
    mounts.iter().filter(|m| m.starts_with(&dir) && m.ends_with("globalmount")).collect()
}

#[test]
#[ignore = "runs in the node VM: cargo xtask vmtest --e2e"]
fn a_provisioned_claim_keeps_its_data_across_a_recreated_pod_in_its_slice() {
    let n = CsiNode::start("claim", &[]);
    // As a StatefulSet names them: claim <template>-<pod>, pod <set>-<ordinal>.
    n.claim("data-web-0");
    let volumes = json!([claim_volume("data", "data-web-0")]);
    let uid = n.node.create_pod(pod_with_volumes("web-0", volumes.clone(), "echo hello > /data/f && exec sleep 3600"));
    n.node.wait_running("web-0", T);
    let pv = n.pv_of("data-web-0");
    let published = CsiNode::published(&uid, &pv);
    let mounts = csi_mounts();
    assert!(mounts.contains(&published), "{} not in {mounts:?}", published.display());
    assert_eq!(staged(&mounts).len(), 1, "one staged global mount in {mounts:?}");
    assert_eq!(mounts.len(), 2, "staged and published, nothing else: {mounts:?}");
    assert_no_duplicate(&mounts);
    wait("the pod's write in the published volume", T, || {
        std::fs::read_to_string(published.join("f")).ok().filter(|t| t == "hello\n")
    });
    // The container runs in the pod's slice (a transient unit with the
    // systemd driver), in its own scope.
    assert_pod_cgroup(&n.node, "besteffort", &uid);
    assert_eq!((n.calls("NodeStageVolume").len(), n.calls("NodePublishVolume").len()), (1, 1));

    n.delete_and_check_nothing_left("web-0", &uid);
    let calls = n.driver.calls();
    let unpublish = calls.iter().position(|c| c.starts_with("NodeUnpublishVolume")).expect("unpublished");
    let unstage = calls.iter().position(|c| c.starts_with("NodeUnstageVolume")).expect("unstaged");
    assert!(unpublish < unstage, "unpublished before unstaged: {calls:?}");

    // Re-created with the same claim: it reads what the first one wrote.
    let reader = "grep -qx hello /data/f || exit 7; exec sleep 3600";
    let uid = n.node.create_pod(pod_with_volumes("web-0", volumes, reader));
    let p = n.node.wait_running("web-0", T);
    assert_eq!(container_status(&p, "app")["restartCount"], 0);
    let mounts = csi_mounts();
    assert!(mounts.contains(&CsiNode::published(&uid, &pv)), "published again: {mounts:?}");
    assert_eq!(staged(&mounts).len(), 1, "staged again: {mounts:?}");
    assert_pod_cgroup(&n.node, "besteffort", &uid);
    n.delete_and_check_nothing_left("web-0", &uid);

    // The claim deleted: its volume goes (reclaim policy Delete).
    let pv_name = pv["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    n.node.api.store().delete(&PVCS, "default", "data-web-0", &DeleteOptions::default()).expect("delete the claim");
    wait("the volume deleted", T, || n.node.api.get(&PVS, "", &pv_name).is_none().then_some(()));
    let handle = csi_handle(&pv);
    assert!(n.driver.wait_for_call(&format!("DeleteVolume {handle}"), T).is_some(), "{:?}", n.driver.calls());
}

#[test]
#[ignore = "runs in the node VM: cargo xtask vmtest --e2e"]
fn a_local_block_volume_is_a_device_the_container_writes() {
    require_node_vm();
    let dev = LoopDevice::new(&scratch("block.img"));
    let node = Node::start("", "");
    node.api.start_storage_controllers(StorageOptions::default());
    let store = node.api.store();
    store.create(&PVS, "", local_pv("local-block", &dev.0, true, NODE_NAME)).expect("the local PV");
    store.create(&PVCS, "default", local_claim("raw", "local-block", true)).expect("its claim");
    let mut raw = claim_volume("raw", "raw");
    raw["block"] = json!(true);
    let script = "test -b /dev/raw || exit 5; \
                  printf swiftlet-block | dd of=/dev/raw bs=512 conv=sync,fsync && exec sleep 3600";
    let uid = node.create_pod(pod_with_volumes("device", json!([raw]), script));
    let p = node.wait_running("device", T);
    assert_eq!(container_status(&p, "app")["restartCount"], 0);
    wait("the container's bytes on the device", T, || {
        std::fs::read(&dev.0).ok().filter(|head| head.starts_with(b"swiftlet-block")).map(drop)
    });
    // The kubelet's link to the device in the pod's volumeDevices.
    let link = Path::new(ROOT).join(format!("pods/{uid}/volumeDevices/kubernetes.io~local-volume/local-block"));
    assert_eq!(std::fs::read_link(&link).ok(), Some(PathBuf::from(&dev.0)), "{}", link.display());
    assert_pod_cgroup(&node, "besteffort", &uid);
    node.delete_pod("device", T);
    assert_eq!(pod_mounts(&uid), Vec::<PathBuf>::new());
    assert!(!mount_points().iter().any(|m| m.to_string_lossy().contains("local-block")));
    // The device outlives the pod, as a local PV's disk does.
    assert!(std::fs::read(&dev.0).is_ok_and(|head| head.starts_with(b"swiftlet-block")));
}

#[test]
#[ignore = "runs in the node VM: cargo xtask vmtest --e2e"]
fn a_killed_agent_keeps_the_csi_volume_mounted_once_and_leaks_nothing() {
    let n = CsiNode::start("kill", &[]);
    n.claim("data-db-0");
    let volumes = json!([claim_volume("data", "data-db-0")]);
    let uid = n.node.create_pod(pod_with_volumes("db-0", volumes, "echo kept > /data/f && exec sleep 3600"));
    n.node.wait_running("db-0", T);
    let published = CsiNode::published(&uid, &n.pv_of("data-db-0"));
    let before = csi_mounts();
    assert_eq!(before.len(), 2, "staged and published: {before:?}");
    let ids = n.node.runtime_ids(&uid);
    let calls_before = n.driver.calls().len();

    // SIGKILL: systemd restarts the agent, which finds the volume mounted.
    n.node.kill_agent();
    wait("the restarted agent to know the pod", T, || {
        n.node.try_kubelet_get("/pods").filter(|p| p.contains("\"db-0\"")).map(drop)
    });
    // A few sync passes (syncFrequency 5 s) for the volume manager to act.
    std::thread::sleep(Duration::from_secs(15));
    let p = n.node.wait_running("db-0", T);
    assert_eq!(container_status(&p, "app")["restartCount"], 0, "the pod ran on");
    assert_eq!(n.node.runtime_ids(&uid), ids, "same sandbox and container");
    let after = csi_mounts();
    assert_eq!(after, before, "the same mounts after the restart");
    assert_no_duplicate(&after);
    let new_calls: Vec<String> = n.driver.calls().into_iter().skip(calls_before).collect();
    assert!(
        !new_calls.iter().any(|c| c.starts_with("NodeStageVolume") || c.starts_with("NodePublishVolume")),
        "neither staged nor published again: {new_calls:?}"
    );
    assert_eq!(std::fs::read_to_string(published.join("f")).ok().as_deref(), Some("kept\n"));
    n.delete_and_check_nothing_left("db-0", &uid);
}
