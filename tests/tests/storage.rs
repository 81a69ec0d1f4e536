//! The kubelet's storage path end to end on this host (cgroup v1): the
//! real swiftlet binary, a node of the fake API server running its storage
//! controllers (binder, provisioner, attacher, resizer, ephemeral claims),
//! and the in-repo CSI driver (`swiftlet-test-csi-driver`: loop devices, a
//! real ext4, real mounts) registered through the plugin watcher.
//!
//! - a dynamically provisioned claim: staged and published while its pod
//!   runs (the mount table shows both, volumesInUse names it), unpublished
//!   then unstaged when the pod goes (nothing left mounted, the volume
//!   detached); a new pod reads what the first wrote;
//! - a `local` PV with `volumeMode: Block` is a device in the container;
//!   a local PV of another node is refused with the kubelet's reason;
//! - SIGKILL between stage and publish, and with three pods holding
//!   volumes: restarted, no second stage or publish, every pod's data
//!   intact, nothing left mounted once they are deleted;
//! - a claim grown from 64 MiB to 128 MiB is seen inside its running pod;
//! - inline and generic ephemeral volumes come and go with their pods;
//! - a driver killed and started again registers again; its pods run on;
//! - an unknown driver and a failing driver leave the pod ContainerCreating
//!   with a FailedMount event, and recover once the cause is gone.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use swiftlet_tests::{
    apiserver::{
        FakeApiServer, Options,
        resources::{
            CSIDRIVERS, CSINODES, EVENTS, NODES, PODS, PVCS, PVS, SECRETS, STORAGE_CLASSES, VOLUME_ATTACHMENTS,
        },
        storage::StorageOptions,
        store::DeleteOptions,
    },
    csi::{CsiDriverOptions, CsiDriverProcess},
    node_process::{NodeProcess, PodCleanup, free_port},
    storage_objects::{
        LoopDevice, assert_no_duplicate, claim, claim_volume, csi_driver, csi_handle, local_claim, local_pv,
        mount_points, storage_class, volume_spec,
    },
};

const BUSYBOX: &str = "swiftlet.local/busybox:1.35";
const DRIVER: &str = "csi.swiftlet.dev";
const CLASS: &str = "swiftlet-csi";
const GROWABLE: &str = "swiftlet-btrfs";
const T: Duration = Duration::from_secs(90);

/// One node with the driver registered, and its API server.
struct StorageNode {
    // Dropped in this order: the pods, the driver (it unmounts and
    // detaches what its volumes left, while its state dir, inside the
    // agent's, still exists), the agent (its root dir's mounts go with it),
    // the API server.
    cleanup: PodCleanup,
    driver: CsiDriverProcess,
    node: NodeProcess,
    api: FakeApiServer,
    name: String,
}

impl StorageNode {
    fn start(name: &str, driver_extra: &[&str]) -> StorageNode {
        swiftlet_tests::prereq::require_root();
        let api = FakeApiServer::start(Options { tls: true, ..Default::default() }).expect("fake API server");
        api.start_storage_controllers(StorageOptions::default());
        let node = NodeProcess::on_fake_apiserver(
            &api,
            name,
            free_port(),
            &[],
            "syncFrequency: 5s\nvolumeStatsAggPeriod: 2s\n",
        );
        let root = node.root_dir();
        let mut opts = CsiDriverOptions::for_kubelet(&root, name, &node.dir.path().join("csi-state"));
        opts.require_attach = true;
        opts.extra = driver_extra.iter().map(|s| s.to_string()).collect();
        let driver = CsiDriverProcess::start(&opts).expect("start the CSI driver");
        api.add_csi_controller(DRIVER, driver.socket());
        let create = |rt, ns: &str, obj: Value| api.store().create(rt, ns, obj).expect("create");
        create(&CSIDRIVERS, "", csi_driver());
        create(
            &STORAGE_CLASSES,
            "",
            storage_class(
                CLASS,
                json!({"csi.storage.k8s.io/fstype": "ext4",
                       "csi.storage.k8s.io/node-stage-secret-name": "stage-creds",
                       "csi.storage.k8s.io/node-stage-secret-namespace": "${pvc.namespace}"}),
            ),
        );
        // The secret NodeStageVolume gets (the PV's nodeStageSecretRef).
        create(
            &SECRETS,
            "default",
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "stage-creds"},
                   "data": {"password": "c3dpZnRsZXQ="}}),
        );
        // btrfs grows while mounted with CAP_SYS_ADMIN; ext4 needs
        // CAP_SYS_RESOURCE, which containers on this host's kind lack.
        create(&STORAGE_CLASSES, "", storage_class(GROWABLE, json!({"csi.storage.k8s.io/fstype": "btrfs"})));
        let sn = StorageNode { cleanup: PodCleanup::new(), driver, node, api, name: name.into() };
        sn.wait("the driver in the CSINode", |s| {
            let n = s.api.get(&CSINODES, "", &s.name)?;
            n["spec"]["drivers"]
                .as_array()?
                .iter()
                .any(|d| d["name"] == DRIVER && d["nodeID"] == s.name.as_str())
                .then_some(())
        });
        sn
    }

    fn root(&self) -> PathBuf {
        self.node.root_dir()
    }

    fn wait<R>(&self, what: &str, mut f: impl FnMut(&StorageNode) -> Option<R>) -> R {
        let deadline = Instant::now() + T;
        loop {
            if let Some(r) = f(self) {
                return r;
            }
            assert!(Instant::now() < deadline, "timed out after {T:?} waiting for {what}\n{}", self.node.log_text());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn claim(&self, name: &str, size: &str) {
        self.claim_of(CLASS, name, size)
    }

    fn claim_of(&self, class: &str, name: &str, size: &str) {
        self.api.store().create(&PVCS, "default", claim(name, class, size)).expect("create the claim");
    }

    /// A pod on this node running `script` with `volumes`, each mounted at
    /// /<name> (block volumes at /dev/<name>).
    fn pod(&self, name: &str, volumes: Value, script: &str, restart: &str) -> String {
        let (volumes, mounts, devices) = volume_spec(&volumes);
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "nodeName": self.name, "restartPolicy": restart, "terminationGracePeriodSeconds": 1,
                "securityContext": {"fsGroup": 2000},
                "volumes": volumes,
                "containers": [{"name": "c", "image": BUSYBOX, "imagePullPolicy": "Never",
                                "command": ["sh", "-c", script],
                                "volumeMounts": mounts, "volumeDevices": devices}],
            },
        });
        let created = self.api.store().create(&PODS, "default", pod).expect("create the pod");
        let uid = created["metadata"]["uid"].as_str().expect("uid").to_owned();
        self.cleanup.track(&uid);
        uid
    }

    fn phase(&self, pod: &str) -> Option<String> {
        self.api.get(&PODS, "default", pod).and_then(|p| p["status"]["phase"].as_str().map(str::to_owned))
    }

    fn wait_phase(&self, pod: &str, phase: &str) {
        self.wait(&format!("{pod} {phase}"), |s| (s.phase(pod).as_deref() == Some(phase)).then_some(()));
    }

    fn delete_pod(&self, pod: &str) {
        self.api.store().delete(&PODS, "default", pod, &DeleteOptions::default()).expect("delete the pod");
        self.wait(&format!("{pod} removed from the API"), |s| s.api.get(&PODS, "default", pod).is_none().then_some(()));
    }

    fn pv_of(&self, claim: &str) -> Value {
        let pv = self.wait(&format!("{claim} bound"), |s| {
            let c = s.api.get(&PVCS, "default", claim)?;
            (c["status"]["phase"] == "Bound").then(|| c["spec"]["volumeName"].as_str().map(str::to_owned)).flatten()
        });
        self.api.get(&PVS, "", &pv).expect("the bound PV")
    }

    /// Mount points under the agent's root dir, but the root dir itself.
    fn mounts(&self) -> Vec<PathBuf> {
        let root = self.root();
        mount_points().into_iter().filter(|m| m.starts_with(&root) && *m != root).collect()
    }

    fn warnings(&self, reason: &str, pod: &str) -> Vec<String> {
        self.api
            .list(&EVENTS, Some("default"))
            .into_iter()
            .filter(|e| e["reason"] == reason && e["involvedObject"]["name"] == pod)
            .filter_map(|e| e["message"].as_str().map(str::to_owned))
            .collect()
    }

    fn calls(&self, prefix: &str) -> Vec<String> {
        self.driver.calls().into_iter().filter(|c| c.starts_with(prefix)).collect()
    }
}

/// A storage quantity in bytes (plain, or with a binary suffix).
fn bytes(q: &str) -> Option<u64> {
    let (n, unit) = q.find(|c: char| !c.is_ascii_digit()).map_or((q, ""), |i| q.split_at(i));
    let shift = match unit {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        _ => return None,
    };
    n.parse::<u64>().ok().map(|n| n << shift)
}

#[test]
fn a_provisioned_claim_keeps_its_data_across_pods_and_leaves_no_mount() {
    let n = StorageNode::start("storage-life", &[]);
    n.claim("data", "64Mi");
    let uid = n.pod("writer", json!([claim_volume("data", "data")]), "echo hello > /data/f && sleep 3600", "Never");
    n.wait_phase("writer", "Running");
    let pv = n.pv_of("data");
    let (pv_name, handle) = (pv["metadata"]["name"].as_str().unwrap().to_owned(), csi_handle(&pv));
    // Staged once for the node, published into the pod's directory.
    let published = n.root().join(format!("pods/{uid}/volumes/kubernetes.io~csi/{pv_name}/mount"));
    let mounts = n.mounts();
    assert!(mounts.contains(&published), "{published:?} not in {mounts:?}");
    assert!(
        mounts
            .iter()
            .any(|m| m.starts_with(n.root().join("plugins/kubernetes.io/csi").join(DRIVER))
                && m.ends_with("globalmount")),
        "no staged global mount in {mounts:?}"
    );
    assert!(std::fs::read_to_string(published.join("f")).is_ok_and(|t| t == "hello\n"));
    let data: Value =
        serde_json::from_slice(&std::fs::read(published.parent().unwrap().join("vol_data.json")).unwrap()).unwrap();
    assert_eq!((data["driverName"].as_str(), data["volumeHandle"].as_str()), (Some(DRIVER), Some(handle.as_str())));
    let unique = format!("kubernetes.io/csi/{DRIVER}^{handle}");
    n.wait("volumesInUse", |s| {
        let node = s.api.get(&NODES, "", &s.name)?;
        node["status"]["volumesInUse"].as_array()?.iter().any(|v| v == unique.as_str()).then_some(())
    });
    // The PV's stage secret, read by the agent and handed to the driver.
    let stage = n.calls("NodeStageVolume");
    assert!(stage.len() == 1 && stage[0].ends_with("secrets=password"), "{stage:?}");
    // The pod info the CSIDriver asked for.
    let publish = n.calls("NodePublishVolume");
    assert_eq!(publish.len(), 1, "{publish:?}");
    assert!(publish[0].contains("csi.storage.k8s.io/pod.name=writer"), "{publish:?}");

    n.delete_pod("writer");
    let calls = n.driver.calls();
    let unpublish = calls.iter().position(|c| c.starts_with("NodeUnpublishVolume")).expect("unpublished");
    let unstage = calls.iter().position(|c| c.starts_with("NodeUnstageVolume")).expect("unstaged");
    assert!(unpublish < unstage, "unpublish before unstage: {calls:?}");
    assert_eq!(n.mounts(), Vec::<PathBuf>::new(), "nothing left mounted once the pod is gone");
    // Out of volumesInUse, then detached by the controller.
    n.wait("the volume detached", |s| s.api.list(&VOLUME_ATTACHMENTS, None).is_empty().then_some(()));

    n.pod("reader", json!([claim_volume("data", "data")]), "grep -q hello /data/f", "Never");
    n.wait_phase("reader", "Succeeded");
    // A finished pod's volumes are released without its deletion (the API
    // server deletes a terminal pod at once, without the kubelet).
    n.wait("the finished pod's volume released", |s| s.mounts().is_empty().then_some(()));
    n.delete_pod("reader");
    // The claim deleted: its volume goes (reclaim policy Delete).
    n.api.store().delete(&PVCS, "default", "data", &DeleteOptions::default()).unwrap();
    n.wait("the volume deleted", |s| s.api.get(&PVS, "", &pv_name).is_none().then_some(()));
    assert!(n.driver.wait_for_call(&format!("DeleteVolume {handle}"), T).is_some());
}

#[test]
fn a_local_block_volume_is_a_device_and_another_nodes_disk_is_refused() {
    let n = StorageNode::start("storage-local", &[]);
    let dev = LoopDevice::new(&n.node.dir.path().join("block.img"));
    n.api.store().create(&PVS, "", local_pv("local-block", &dev.0, true, &n.name)).unwrap();
    n.api.store().create(&PVCS, "default", local_claim("raw", "local-block", true)).unwrap();
    let disk = n.node.dir.path().join("other-disk");
    std::fs::create_dir_all(&disk).unwrap();
    n.api.store().create(&PVS, "", local_pv("elsewhere", disk.to_str().unwrap(), false, "another-node")).unwrap();
    n.api.store().create(&PVCS, "default", local_claim("far", "elsewhere", false)).unwrap();

    let mut block = claim_volume("raw", "raw");
    block["block"] = json!(true);
    n.pod(
        "device",
        json!([block]),
        "printf swiftlet-block | dd of=/dev/raw bs=512 conv=sync,fsync && sleep 3600",
        "Never",
    );
    n.wait_phase("device", "Running");
    n.wait("the bytes on the device", |_| {
        let head = std::fs::read(&dev.0).ok()?;
        head.starts_with(b"swiftlet-block").then_some(())
    });

    n.pod("far", json!([claim_volume("far", "far")]), "sleep 3600", "Never");
    n.wait("FailedMount for another node's disk", |s| {
        s.warnings("FailedMount", "far").into_iter().find(|m| m.contains("no matching NodeSelectorTerms"))
    });
    assert_eq!(n.phase("far").as_deref(), Some("Pending"));
    // The device pod was not disturbed.
    assert_eq!(n.phase("device").as_deref(), Some("Running"));
    n.delete_pod("far");
    n.delete_pod("device");
    assert_eq!(n.mounts(), Vec::<PathBuf>::new());
}

#[test]
fn a_killed_agent_neither_stages_nor_publishes_twice_and_leaks_nothing() {
    // Publishing takes 3 s: the agent is killed once the volume is staged
    // and its publish asked for.
    let mut n = StorageNode::start("storage-kill", &["--delay", "NodePublishVolume=3000"]);
    n.claim("first", "64Mi");
    n.pod("first", json!([claim_volume("data", "first")]), "echo first > /data/f && sleep 3600", "Never");
    n.driver.wait_for_call("NodePublishVolume", T).expect("staged, then a publish asked for");
    n.node.kill();
    n.node.respawn();
    n.wait_phase("first", "Running");
    // The staged volume was found, not staged again; whether the driver
    // finished the interrupted publish or not, the target is mounted once.
    assert_eq!(n.calls("NodeStageVolume").len(), 1, "{:?}", n.driver.calls());
    assert_no_duplicate(&n.mounts());

    // Three pods holding volumes, then SIGKILL again.
    n.claim("second", "64Mi");
    n.claim("third", "64Mi");
    n.pod("second", json!([claim_volume("data", "second")]), "echo second > /data/f && sleep 3600", "Never");
    n.pod("third", json!([claim_volume("data", "third")]), "echo third > /data/f && sleep 3600", "Never");
    n.wait_phase("second", "Running");
    n.wait_phase("third", "Running");
    let before = n.mounts();
    let calls_before = n.driver.calls().len();
    n.node.kill();
    n.node.respawn();
    // Re-adopted: the node reports again and nothing is mounted twice.
    std::thread::sleep(Duration::from_secs(8));
    for p in ["first", "second", "third"] {
        assert_eq!(n.phase(p).as_deref(), Some("Running"), "{p}");
    }
    assert_eq!(n.mounts(), before, "the same mounts after the restart");
    assert_no_duplicate(&before);
    let new_calls: Vec<String> = n.driver.calls().into_iter().skip(calls_before).collect();
    assert!(
        !new_calls.iter().any(|c| c.starts_with("NodeStageVolume") || c.starts_with("NodePublishVolume")),
        "{new_calls:?}"
    );
    // Each pod's data intact, read from its published volume.
    for p in ["first", "second", "third"] {
        let uid = n.api.get(&PODS, "default", p).unwrap()["metadata"]["uid"].as_str().unwrap().to_owned();
        let dir = n.root().join(format!("pods/{uid}/volumes/kubernetes.io~csi"));
        let pv = std::fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
        assert_eq!(std::fs::read_to_string(pv.join("mount/f")).unwrap(), format!("{p}\n"));
    }
    // Deleted while the agent is down: cleaned up after its start.
    n.node.kill();
    n.api
        .store()
        .delete(&PODS, "default", "third", &DeleteOptions { grace_period_seconds: Some(0), ..Default::default() })
        .ok();
    n.node.respawn();
    for p in ["first", "second"] {
        n.delete_pod(p);
    }
    n.wait("every mount gone", |s| s.mounts().is_empty().then_some(()));
}

#[test]
fn a_grown_claim_is_seen_inside_its_running_pod() {
    let n = StorageNode::start("storage-grow", &[]);
    n.claim_of(GROWABLE, "grow", "64Mi");
    let uid = n.pod(
        "grow",
        json!([claim_volume("data", "grow")]),
        "while true; do df -k /data | tail -1 > /data/df.tmp && mv /data/df.tmp /data/df; sleep 1; done",
        "Never",
    );
    n.wait_phase("grow", "Running");
    let pv_name = n.pv_of("grow")["metadata"]["name"].as_str().unwrap().to_owned();
    let df = n.root().join(format!("pods/{uid}/volumes/kubernetes.io~csi/{pv_name}/mount/df"));
    let size_kib = |s: &StorageNode| -> Option<u64> {
        let _ = s;
        std::fs::read_to_string(&df).ok()?.split_whitespace().nth(1)?.parse().ok()
    };
    let before = n.wait("df from inside the pod", |s| size_kib(s));
    assert!(before <= 64 * 1024, "{before} KiB");
    let mut claim = n.api.get(&PVCS, "default", "grow").unwrap();
    claim["spec"]["resources"]["requests"]["storage"] = json!("128Mi");
    n.api.store().update(&PVCS, "default", "grow", claim, |_, _| {}).expect("grow the claim");
    let after = n.wait("the pod seeing 128 MiB", |s| size_kib(s).filter(|k| *k > 100 * 1024));
    assert!(after > before);
    // The claim's capacity follows the volume's (btrfs grows in steps of
    // at least 256 MiB, so the driver may give more than was asked).
    n.wait("the claim's capacity", |s| {
        let c = s.api.get(&PVCS, "default", "grow")?;
        let pv = s.api.get(&PVS, "", &pv_name)?;
        let want = bytes(pv["spec"]["capacity"]["storage"].as_str()?)?;
        (want >= 128 << 20 && bytes(c["status"]["capacity"]["storage"].as_str()?)? == want).then_some(())
    });
    assert!(!n.calls("NodeExpandVolume").is_empty());
    assert_eq!(n.phase("grow").as_deref(), Some("Running"));
    n.delete_pod("grow");
}

#[test]
fn inline_and_generic_ephemeral_volumes_come_and_go_with_their_pod() {
    let n = StorageNode::start("storage-ephemeral", &[]);
    let inline = json!({"name": "scratch", "csi": {"driver": DRIVER, "volumeAttributes": {"size": "16Mi"}}});
    let generic = json!({"name": "cache", "ephemeral": {"volumeClaimTemplate": {"spec": {
        "accessModes": ["ReadWriteOnce"], "storageClassName": CLASS, "resources": {"requests": {"storage": "32Mi"}}}}}});
    n.pod("eph", json!([inline, generic]), "echo a > /scratch/a && echo b > /cache/b && sleep 3600", "Never");
    n.wait_phase("eph", "Running");
    let pv_name = n.pv_of("eph-cache")["metadata"]["name"].as_str().unwrap().to_owned();
    assert!(n.calls("NodePublishVolume").iter().any(|c| c.contains("csi.storage.k8s.io/ephemeral=true")));
    assert_eq!(n.mounts().len(), 3, "inline published, generic staged and published: {:?}", n.mounts());
    n.delete_pod("eph");
    assert_eq!(n.mounts(), Vec::<PathBuf>::new());
    n.wait("the pod's claim and volume gone", |s| {
        (s.api.get(&PVCS, "default", "eph-cache").is_none() && s.api.get(&PVS, "", &pv_name).is_none()).then_some(())
    });
}

#[test]
fn a_restarted_driver_registers_again_and_failures_leave_only_their_pod_waiting() {
    let mut n = StorageNode::start("storage-driver", &[]);
    n.claim("kept", "64Mi");
    n.pod("kept", json!([claim_volume("data", "kept")]), "sleep 3600", "Never");
    n.wait_phase("kept", "Running");
    n.driver.kill();
    n.driver.restart().expect("restart the driver");
    n.wait("a second registration", |s| (s.calls("registered").len() >= 2).then_some(()));
    assert_eq!(n.phase("kept").as_deref(), Some("Running"));

    // An unknown driver: FailedMount, and the pod waits.
    n.api
        .store()
        .create(
            &PVS,
            "",
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "unknown-driver"},
                   "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "none",
                            "csi": {"driver": "nope.example.com", "volumeHandle": "v"}}}),
        )
        .unwrap();
    n.api
        .store()
        .create(
            &PVCS,
            "default",
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "nope"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "none", "volumeName": "unknown-driver",
                     "resources": {"requests": {"storage": "1Gi"}}}}),
        )
        .unwrap();
    n.api
        .store()
        .create(
            &CSIDRIVERS,
            "",
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": "nope.example.com"}, "spec": {"attachRequired": false}}),
        )
        .unwrap();
    n.pod("nope", json!([claim_volume("data", "nope")]), "sleep 3600", "Never");
    // (Before the claim is bound the FailedMount says so; then the driver.)
    n.wait("FailedMount for the unknown driver", |s| {
        s.warnings("FailedMount", "nope")
            .into_iter()
            .find(|m| m.contains("driver name nope.example.com not found in the list of registered CSI drivers"))
    });

    // A driver that fails to stage: FailedMount with its error, then the
    // pod starts once the failure is gone.
    n.driver.set_fail(&["NodeStageVolume"]).unwrap();
    n.claim("flaky", "64Mi");
    n.pod("flaky", json!([claim_volume("data", "flaky")]), "sleep 3600", "Never");
    n.wait("FailedMount with the driver's error", |s| {
        s.warnings("FailedMount", "flaky").into_iter().find(|m| m.contains("injected failure"))
    });
    assert_eq!(n.phase("flaky").as_deref(), Some("Pending"));
    n.driver.set_fail(&[]).unwrap();
    n.wait_phase("flaky", "Running");
    assert_eq!(n.phase("kept").as_deref(), Some("Running"));
    assert_eq!(n.phase("nope").as_deref(), Some("Pending"));
    for p in ["nope", "flaky", "kept"] {
        n.delete_pod(p);
    }
    assert_eq!(n.mounts(), Vec::<PathBuf>::new());
}
