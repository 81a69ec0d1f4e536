//! Device plugins on the real containerd, through the whole agent and the
//! in-repo test plugin (`swiftlet-test-device-plugin`): a refused version,
//! registration → the Node's capacity and allocatable (on the fake API
//! server), a pod given one device (its environment, mount and device node
//! seen from inside, Allocate and PreStartContainer called), a pod asking
//! for more than remains refused with UnexpectedAdmissionError, a device
//! turning unhealthy lowering allocatable, devices freed with their pod,
//! the plugin going away (allocatable 0), and the checkpoint read back.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::PodStatus;
use serde_json::Value;
use swiftlet::deviceplugin::{CHECKPOINT_FILE, DeviceManager, KUBELET_SOCKET};
use swiftlet_tests::{
    agent::TestAgent,
    apiserver::{Credentials, FakeApiServer, Options, resources::NODES},
};

const BUSYBOX: &str = "swiftlet.local/busybox:1.35";
const RESOURCE: &str = "swiftlet.dev/fake";
const T: Duration = Duration::from_secs(60);

/// The test plugin, killed on drop.
struct PluginProcess(Child);

impl PluginProcess {
    fn start(plugin_dir: &Path, state: &Path, extra: &[&str]) -> PluginProcess {
        let child = Command::new(env!("CARGO_BIN_EXE_swiftlet-test-device-plugin"))
            .arg("--plugin-dir")
            .arg(plugin_dir)
            .arg("--state")
            .arg(state)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start swiftlet-test-device-plugin");
        PluginProcess(child)
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + T;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {T:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn running(s: &PodStatus) -> bool {
    s.container_statuses
        .as_ref()
        .is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| c.state.as_ref().is_some_and(|st| st.running.is_some())))
}

/// (capacity, allocatable) of the resource in the Node's status.
fn node_resource(server: &FakeApiServer, node: &str) -> (Option<String>, Option<String>) {
    let n = server.get(&NODES, "", node).unwrap_or(Value::Null);
    let get = |field: &str| n["status"][field][RESOURCE].as_str().map(str::to_owned);
    (get("capacity"), get("allocatable"))
}

fn wait_node(server: &FakeApiServer, node: &str, capacity: &str, allocatable: &str) {
    let want = (Some(capacity.to_owned()), Some(allocatable.to_owned()));
    let deadline = Instant::now() + T;
    loop {
        let got = node_resource(server, node);
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "node {node}: {RESOURCE} is {got:?}, waited for {want:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn pod_manifest(name: &str, count: u32) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {BUSYBOX}
    command: ["sleep", "3600"]
    resources:
      limits: {{{RESOURCE}: {count}}}
"#
    )
}

fn sh(a: &TestAgent, pod: &str, script: &str) -> String {
    let (code, out, err) = a.exec(pod, "c", script);
    assert_eq!(code, 0, "`{script}` in {pod}: {out} {err}");
    out.trim().to_owned()
}

fn calls(state: &Path) -> Vec<String> {
    std::fs::read_to_string(state.join("calls.log")).unwrap_or_default().lines().map(str::to_owned).collect()
}

#[test]
fn device_plugin_registers_allocates_refuses_and_tracks_health() {
    swiftlet_tests::prereq::require_root();
    let server = FakeApiServer::start(Options::default()).unwrap();
    let kubeconfig = server.dir().join("kubelet.kubeconfig");
    server.write_kubeconfig(&kubeconfig, &Credentials::None).unwrap();
    let a = TestAgent::start(
        "nodeStatusUpdateFrequency: 1s",
        &["--signal-source=cgroupfs", &format!("--kubeconfig={}", kubeconfig.display()), "--register-node=true"],
    );
    let plugin_dir: PathBuf = a.root_dir().join("device-plugins");
    wait("the registration socket", || plugin_dir.join(KUBELET_SOCKET).exists().then_some(()));
    wait("the Node", || server.get(&NODES, "", &a.node));

    // A plugin built against another version is refused with the reason.
    let state_dir = tempfile::Builder::new().prefix("swiftlet-fake-devices-").tempdir().unwrap();
    let mut old = PluginProcess::start(&plugin_dir, &state_dir.path().join("old"), &["--version", "v1alpha1"]);
    let status = wait("the refused plugin to exit", || old.0.try_wait().unwrap());
    let mut stderr = String::new();
    std::io::Read::read_to_string(old.0.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            r#"requested API version "v1alpha1" is not supported by kubelet. Supported versions are ["v1beta1"]"#
        ),
        "{stderr}"
    );
    drop(old);

    // Two devices: the Node shows them.
    let state = state_dir.path().join("fake");
    let plugin = PluginProcess::start(&plugin_dir, &state, &["--devices", "2", "--pre-start"]);
    wait_node(&server, &a.node, "2", "2");
    let extended = a.agent.devices.extended_resources().borrow().clone();
    assert_eq!((extended.capacity[RESOURCE], extended.allocatable[RESOURCE]), (2, 2));

    // One device for the first pod: exactly one id, its mount and node.
    let one = a.add_manifest("one.yaml", &pod_manifest("one", 1));
    a.wait_status(&one, T, "running", running);
    let given = sh(&a, &one, "echo $FAKE_DEVICES");
    assert!(given == "fake-0" || given == "fake-1", "FAKE_DEVICES={given:?}: one device id");
    assert_eq!(sh(&a, &one, &format!("cat /fake/{given}")), format!("fake device {given}"));
    sh(&a, &one, &format!("test -c /dev/fake-{given}"));
    let (code, _, _) = a.exec(&one, "c", &format!("echo x > /fake/{given}"));
    assert_ne!(code, 0, "the device mount is read-only");
    let log = calls(&state);
    assert!(log.contains(&format!("allocate {given}")), "{log:?}");
    assert!(log.contains(&format!("prestart {given}")), "PreStartContainer (the plugin asks for it): {log:?}");
    let one_uid = a.pod(&one).unwrap().metadata.uid.unwrap();
    let checkpoint = std::fs::read_to_string(plugin_dir.join(CHECKPOINT_FILE)).unwrap();
    assert!(checkpoint.contains(&one_uid) && checkpoint.contains(&given), "{checkpoint}");

    // Two more than remain: refused as the kubelet refuses it.
    let two = a.add_manifest("two.yaml", &pod_manifest("two", 2));
    let s = a.wait_status(&two, T, "rejection", |s| s.phase.as_deref() == Some("Failed"));
    assert_eq!(s.reason.as_deref(), Some("UnexpectedAdmissionError"));
    assert_eq!(
        s.message.as_deref(),
        Some(
            "Allocate failed due to requested number of devices unavailable for swiftlet.dev/fake. Requested: 2, Available: 1, which is unexpected"
        )
    );
    assert!(!a.events.with_reason("UnexpectedAdmissionError").is_empty(), "an event for the rejection");

    // The other device turns unhealthy: allocatable 1 of 2.
    let other = if given == "fake-0" { "fake-1" } else { "fake-0" };
    std::fs::write(state.join("unhealthy"), format!("{other}\n")).unwrap();
    wait_node(&server, &a.node, "2", "1");

    // The first pod goes: its device is free again, and the only healthy
    // one, so the next pod gets it.
    a.remove_manifest("one.yaml");
    a.remove_manifest("two.yaml");
    a.wait_gone(&one, T);
    a.wait_gone(&two, T);
    let three = a.add_manifest("three.yaml", &pod_manifest("three", 1));
    a.wait_status(&three, T, "running", running);
    assert_eq!(sh(&a, &three, "echo $FAKE_DEVICES"), given);
    let three_uid = a.pod(&three).unwrap().metadata.uid.unwrap();

    // The plugin goes away: capacity stays, nothing is allocatable.
    drop(plugin);
    wait_node(&server, &a.node, "2", "0");

    // What a restarted agent reads: the running pod's device.
    let restored = DeviceManager::new(&a.root_dir()).pod_devices(&three_uid);
    assert_eq!(restored["c"][RESOURCE].iter().cloned().collect::<Vec<_>>(), vec![given.clone()]);
    assert!(DeviceManager::new(&a.root_dir()).pod_devices(&one_uid).is_empty(), "the first pod's devices were freed");
}
