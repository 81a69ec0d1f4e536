//! The node VM's side of the end-to-end checks (`tests/tests/node_e2e.rs`,
//! booted by `cargo xtask vmtest --e2e`): swiftlet from the project's
//! systemd unit on a node with systemd as PID 1, cgroup v2 only and
//! containerd, configured through the files kubeadm writes
//! (/var/lib/kubelet/config.yaml, /var/lib/kubelet/kubeadm-flags.env,
//! /etc/default/kubelet, /etc/kubernetes/kubelet.conf), against a fake API
//! server in the test process on 127.0.0.1:6443. Dropping a [`Node`]
//! deletes its pods through the API, waits for the runtime to be empty and
//! stops the agent.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use serde_json::Value;
use swiftlet::cri::{CriClient, RuntimeService, api, labels};

use crate::{
    apiserver::{
        Credentials, FakeApiServer, Options,
        auth::{AccessRule, UserInfo},
        defaults,
        resources::PODS,
        store::DeleteOptions,
    },
    https::Https,
    kubectl::Kubectl,
};

/// Set by the node VM's runner; the checks refuse to run anywhere else.
pub const NODE_E2E_ENV: &str = "SWIFTLET_NODE_E2E";
/// The node's hostname, and so its Node name.
pub const NODE_NAME: &str = "swiftlet-node";
/// The API server the node's kubeconfig points at.
const API_PORT: u16 = 6443;
const RUNTIME: &str = "unix:///run/containerd/containerd.sock";
/// A token the checks use on :10250 (allowed by the fake's authorizer).
const TOKEN: &str = "node-e2e-observer";

/// The cgroup driver the VM was booted for (kubelet and containerd agree).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    Systemd,
    Cgroupfs,
}

impl Driver {
    pub fn name(self) -> &'static str {
        match self {
            Driver::Systemd => "systemd",
            Driver::Cgroupfs => "cgroupfs",
        }
    }
}

/// Panics unless this is the node VM (systemd as PID 1, cgroup v2, the
/// runner's environment); returns its driver.
pub fn require_node_vm() -> Driver {
    assert!(
        std::env::var_os(NODE_E2E_ENV).is_some() && Path::new("/run/systemd/system").is_dir(),
        "this check runs in the node VM (systemd as PID 1, cgroup v2, containerd): `cargo xtask vmtest --e2e`"
    );
    assert!(
        Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
        "the node VM must boot with cgroup v2 only (systemd.unified_cgroup_hierarchy=1)"
    );
    match std::env::var("SWIFTLET_E2E_DRIVER").as_deref() {
        Ok("cgroupfs") => Driver::Cgroupfs,
        _ => Driver::Systemd,
    }
}

/// Runs a command and returns its output (panics if it cannot start).
pub fn sh(program: &str, args: &[&str]) -> Output {
    Command::new(program).args(args).output().unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
}

/// Runs a command that must succeed; its stdout.
pub fn sh_ok(program: &str, args: &[&str]) -> String {
    let out = sh(program, args);
    assert!(
        out.status.success(),
        "{program} {} failed ({}): {}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A unit's properties as `systemctl show` gives them.
pub fn unit_property(unit: &str, property: &str) -> String {
    sh_ok("systemctl", &["show", unit, "-p", property, "--value"]).trim().to_owned()
}

/// A cgroup v2 interface file.
pub fn cgroup_file(rel: &str, file: &str) -> String {
    let p = Path::new("/sys/fs/cgroup").join(rel.trim_matches('/')).join(file);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).trim().to_owned()
}

/// Polls `f` every 200 ms until it gives a value.
pub fn wait<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// This machine's MemTotal in bytes.
pub fn mem_total() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .expect("MemTotal")
        * 1024
}

/// The pod cgroup the kubelet gives a pod of `qos` ("guaranteed",
/// "burstable", "besteffort") under either driver, written out here
/// rather than asked of swiftlet's naming code.
pub fn pod_cgroup(driver: Driver, qos: &str, uid: &str) -> String {
    match (driver, qos) {
        (Driver::Systemd, "guaranteed") => format!("kubepods.slice/kubepods-pod{}.slice", uid.replace('-', "_")),
        (Driver::Systemd, q) => {
            format!("kubepods.slice/kubepods-{q}.slice/kubepods-{q}-pod{}.slice", uid.replace('-', "_"))
        }
        (Driver::Cgroupfs, "guaranteed") => format!("kubepods/pod{uid}"),
        (Driver::Cgroupfs, q) => format!("kubepods/{q}/pod{uid}"),
    }
}

/// The QoS cgroup of a class under either driver.
pub fn qos_cgroup(driver: Driver, qos: &str) -> String {
    match (driver, qos) {
        (Driver::Systemd, "guaranteed") => "kubepods.slice".into(),
        (Driver::Systemd, q) => format!("kubepods.slice/kubepods-{q}.slice"),
        (Driver::Cgroupfs, "guaranteed") => "kubepods".into(),
        (Driver::Cgroupfs, q) => format!("kubepods/{q}"),
    }
}

/// The node: the fake API server, kubectl, and swiftlet as a systemd service.
pub struct Node {
    pub api: FakeApiServer,
    pub kubectl: Kubectl,
    pub driver: Driver,
    pub cri: CriClient,
    pub rt: tokio::runtime::Runtime,
    /// The journal cursor at start: the agent's log from here on.
    cursor: String,
}

impl Node {
    /// Writes the node's configuration with `config` added to the
    /// KubeletConfiguration, `extra_args` as KUBELET_EXTRA_ARGS, starts
    /// swiftlet.service and waits until the Node is Ready.
    pub fn start(config: &str, extra_args: &str) -> Node {
        let driver = require_node_vm();
        let api = FakeApiServer::start(Options { tls: true, port: API_PORT, ..Options::default() })
            .expect("the fake API server on 127.0.0.1:6443");
        api.set_token(TOKEN, UserInfo::new("node-e2e", &["system:masters"]));
        api.set_rules(vec![AccessRule::allow()]);
        let admin = api.dir().join("admin.kubeconfig");
        let (cert, key) = api.client_cert("admin", &["system:masters"]).expect("an admin certificate");
        api.write_kubeconfig(&admin, &Credentials::ClientCert { cert, key }).expect("admin kubeconfig");
        let (cert, key) =
            api.client_cert(&format!("system:node:{NODE_NAME}"), &["system:nodes"]).expect("the node's certificate");
        std::fs::create_dir_all("/etc/kubernetes/pki").expect("/etc/kubernetes/pki");
        api.write_kubeconfig(Path::new("/etc/kubernetes/kubelet.conf"), &Credentials::ClientCert { cert, key })
            .expect("/etc/kubernetes/kubelet.conf");
        std::fs::copy(api.ca_file().expect("a TLS fake has a CA"), "/etc/kubernetes/pki/ca.crt")
            .expect("/etc/kubernetes/pki/ca.crt");
        write_node_files(driver, config, extra_args);
        let cursor = sh_ok("journalctl", &["-n", "0", "--show-cursor", "--no-pager"])
            .lines()
            .find_map(|l| l.strip_prefix("-- cursor: "))
            .unwrap_or_default()
            .to_owned();
        sh_ok("systemctl", &["daemon-reload"]);
        sh_ok("systemctl", &["restart", "swiftlet.service"]);
        let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
        let cri = rt.block_on(async { CriClient::new(RUNTIME, Duration::from_secs(60)) }).expect("a CRI client");
        let node = Node { kubectl: Kubectl::new(&admin), api, driver, cri, rt, cursor };
        node.wait_ready(Duration::from_secs(180));
        node
    }

    /// Rewrites the node's configuration and restarts the agent (its pods
    /// run on and are re-adopted).
    pub fn reconfigure(&self, config: &str, extra_args: &str) {
        write_node_files(self.driver, config, extra_args);
        sh_ok("systemctl", &["restart", "swiftlet.service"]);
        self.wait_ready(Duration::from_secs(180));
    }

    /// Waits for the Node object to report Ready.
    pub fn wait_ready(&self, timeout: Duration) {
        wait("the Node to be Ready", timeout, || {
            let n = self.api.get(&crate::apiserver::resources::NODES, "", NODE_NAME)?;
            let ready = n
                .pointer("/status/conditions")?
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            ready.then_some(())
        });
    }

    /// swiftlet's journal since this node started.
    pub fn journal(&self) -> String {
        let out = sh(
            "journalctl",
            &[
                "-u",
                "swiftlet.service",
                "--no-pager",
                "-o",
                "short-monotonic",
                &format!("--after-cursor={}", self.cursor),
            ],
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Creates a pod bound to this node from its JSON (metadata and spec).
    pub fn create_pod(&self, mut pod: Value) -> String {
        pod["spec"]["nodeName"] = Value::from(NODE_NAME);
        defaults::pod(&mut pod);
        let created = self.api.store().create(&PODS, "default", pod).expect("create the pod");
        created["metadata"]["uid"].as_str().expect("a uid").to_owned()
    }

    pub fn pod(&self, name: &str) -> Option<Value> {
        self.api.get(&PODS, "default", name)
    }

    /// Waits for `pred` on the pod's API object.
    pub fn wait_pod(&self, name: &str, what: &str, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let p = self.pod(name);
            if let Some(p) = p.as_ref().filter(|p| pred(p)) {
                return p.clone();
            }
            if Instant::now() >= deadline {
                panic!(
                    "timed out after {timeout:?} waiting for pod {name} to be {what}; it is {}\nswiftlet's journal:\n{}",
                    serde_json::to_string_pretty(&p.map(|p| p["status"].clone())).unwrap_or_default(),
                    self.journal()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Running and Ready.
    pub fn wait_running(&self, name: &str, timeout: Duration) -> Value {
        self.wait_pod(name, "Running and Ready", timeout, |p| {
            p["status"]["phase"] == "Running"
                && p["status"]["conditions"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
        })
    }

    /// Deletes a pod through the API (gracefully, as kubectl does) and
    /// waits until the agent has removed it.
    pub fn delete_pod(&self, name: &str, timeout: Duration) {
        let _ = self.api.store().delete(&PODS, "default", name, &DeleteOptions::default());
        wait(&format!("pod {name} to be gone"), timeout, || self.pod(name).is_none().then_some(()));
    }

    /// The runtime's sandboxes and containers of a pod.
    pub fn runtime(&self, uid: &str) -> (Vec<api::PodSandbox>, Vec<api::Container>) {
        self.rt.block_on(async {
            let sandboxes = self.cri.list_pod_sandbox(None).await.unwrap_or_default();
            let containers = self.cri.list_containers(None).await.unwrap_or_default();
            let mine =
                |l: &std::collections::HashMap<String, String>| l.get(labels::POD_UID).map(String::as_str) == Some(uid);
            (
                sandboxes.into_iter().filter(|s| mine(&s.labels)).collect(),
                containers.into_iter().filter(|c| mine(&c.labels)).collect(),
            )
        })
    }

    /// The ids of the pod's sandboxes and containers, sorted: the same
    /// list before and after means nothing was recreated.
    pub fn runtime_ids(&self, uid: &str) -> Vec<String> {
        let (sandboxes, containers) = self.runtime(uid);
        let mut ids: Vec<String> =
            sandboxes.into_iter().map(|s| s.id).chain(containers.into_iter().map(|c| c.id)).collect();
        ids.sort();
        ids
    }

    /// SIGKILLs the agent, as a crash: systemd restarts it (Restart=always)
    /// and the Node is Ready again.
    pub fn kill_agent(&self) {
        let main_pid = || unit_property("swiftlet.service", "MainPID");
        let old = main_pid();
        sh_ok("systemctl", &["kill", "-s", "KILL", "swiftlet.service"]);
        wait("systemd to restart swiftlet", Duration::from_secs(60), || {
            let pid = main_pid();
            (pid != old && pid != "0").then_some(())
        });
        self.wait_ready(Duration::from_secs(180));
    }

    /// A GET on the node's :10250 with a token the fake authorizes; None
    /// while it does not answer 200.
    pub fn try_kubelet_get(&self, path: &str) -> Option<String> {
        let https = Https::new("127.0.0.1:10250".parse().expect("address"), None).with_token(TOKEN);
        let reply = self.rt.block_on(https.get(path)).ok()?;
        (reply.status == 200).then(|| reply.text())
    }

    /// [`Node::try_kubelet_get`] that must answer.
    pub fn kubelet_get(&self, path: &str) -> String {
        wait(&format!("GET {path} on :10250 to answer 200"), Duration::from_secs(30), || self.try_kubelet_get(path))
    }

    /// A sample of the agent's /metrics.
    pub fn metric(&self, series: &str) -> Option<f64> {
        self.kubelet_get("/metrics")
            .lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- swiftlet's journal ----\n{}\n---- end ----", self.journal());
        }
        let pods = self.api.list(&PODS, None);
        for p in &pods {
            let (ns, name) = (
                p["metadata"]["namespace"].as_str().unwrap_or("default"),
                p["metadata"]["name"].as_str().unwrap_or_default(),
            );
            let _ = self.api.store().delete(&PODS, ns, name, &DeleteOptions::default());
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            let left = self.rt.block_on(self.cri.list_pod_sandbox(None)).map(|s| s.len()).unwrap_or(0);
            if left == 0 && self.api.list(&PODS, None).is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let _ = sh("systemctl", &["stop", "swiftlet.service"]);
        // Whatever the agent left, removed directly: the next check starts clean.
        self.rt.block_on(async {
            for s in self.cri.list_pod_sandbox(None).await.unwrap_or_default() {
                let _ = self.cri.stop_pod_sandbox(&s.id).await;
                let _ = self.cri.remove_pod_sandbox(&s.id).await;
            }
        });
    }
}

/// The files kubeadm writes for a kubelet, written for swiftlet.
fn write_node_files(driver: Driver, config: &str, extra_args: &str) {
    let kubelet_config = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: {driver}
containerRuntimeEndpoint: {RUNTIME}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
clusterDomain: cluster.local
clusterDNS: [10.96.0.10]
staticPodPath: /etc/kubernetes/manifests
evictionPressureTransitionPeriod: 10s
{config}
",
        driver = driver.name()
    );
    std::fs::create_dir_all("/var/lib/kubelet").expect("/var/lib/kubelet");
    std::fs::create_dir_all("/etc/kubernetes/manifests").expect("/etc/kubernetes/manifests");
    write("/var/lib/kubelet/config.yaml", &kubelet_config);
    write(
        "/var/lib/kubelet/kubeadm-flags.env",
        &format!("KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint={RUNTIME}\"\n"),
    );
    write("/etc/default/kubelet", &format!("KUBELET_EXTRA_ARGS=\"{extra_args}\"\n"));
}

fn write(path: &str, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{path}: {e}"));
}

/// Where a file the checks keep between steps goes.
pub fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("node-e2e-{name}"))
}
