//! The real `swiftlet` binary as a node of a test's API server: its own
//! root dir, cgroup root (a test cgroup, removed on drop), ports and log
//! file; stopped with SIGTERM (then SIGKILL) on drop, and its log printed
//! when the test fails.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::cgroup::TestCgroup;

/// Where test ports are taken from: below the kernel's ephemeral range
/// (`ip_local_port_range` starts at 32768 by default). A port the kernel
/// handed out with `bind(0)` and that was then released can be handed out
/// again at once, to another listener or as the local port of any outgoing
/// connection, before the process the test gives it to binds it.
const TEST_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// A TCP port free on every address, for a process the test starts to
/// bind later. Each call in a process gives a different port; the first
/// is placed by the process id, so test binaries run one after another
/// do not start on the same one.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let span = u32::from(TEST_PORTS.end - TEST_PORTS.start);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7919) % span,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..span {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % span;
        let port = TEST_PORTS.start + offset as u16;
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
    panic!("no free TCP port in {TEST_PORTS:?}")
}

pub struct NodeProcess {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub log: PathBuf,
    pub cgroup: TestCgroup,
    pub args: Vec<String>,
    rust_log: String,
}

impl NodeProcess {
    /// The arguments every test run gets: root dir, cgroup root, CRI
    /// endpoint, ports, cgroupfs signal source; then `extra`.
    pub fn args(dir: &Path, cgroup: &TestCgroup, extra: &[String]) -> Vec<String> {
        let mut a = vec![
            format!("--root-dir={}", dir.join("root").display()),
            format!("--cgroup-root=/{}", cgroup.root),
            format!("--container-runtime-endpoint={}", crate::agent::cri_endpoint()),
            format!("--port={}", free_port()),
            format!("--healthz-port={}", free_port()),
            "--signal-source=cgroupfs".into(),
            // As AgentSetup: image GC off (100%), or a shared disk over 85%
            // full makes it delete the locally built test images, which
            // cannot be pulled again.
            "--image-gc-high-threshold=100".into(),
        ];
        a.extend(extra.iter().cloned());
        a
    }

    /// Starts swiftlet; `config_yaml` (if any) becomes its --config file.
    pub fn start(config_yaml: Option<&str>, extra: &[String]) -> NodeProcess {
        let rust_log =
            std::env::var("SWIFTLET_TEST_LOG").unwrap_or_else(|_| "info,kube_client::client::builder=off".into());
        NodeProcess::start_logging(config_yaml, extra, &rust_log)
    }

    /// A node bootstrapped with a token against the fake API server (TLS),
    /// its Lease renewed every second, :10250 on loopback `port`; returns
    /// once the Lease exists. `config_extra` goes at the end of its
    /// KubeletConfiguration.
    pub fn on_fake_apiserver(
        server: &crate::apiserver::FakeApiServer,
        name: &str,
        port: u16,
        extra: &[String],
        config_extra: &str,
    ) -> NodeProcess {
        let token = "swlhrd.0123456789abcdef";
        server.set_token(
            token,
            crate::apiserver::auth::UserInfo::new("system:bootstrap:swlhrd", &["system:bootstrappers"]),
        );
        let bootstrap = server.dir().join(format!("bootstrap-{name}.kubeconfig"));
        server.write_kubeconfig(&bootstrap, &crate::apiserver::Credentials::Token(token.into())).unwrap();
        let state = server.dir().join(name);
        std::fs::create_dir_all(&state).unwrap();
        let mut args = vec![
            format!("--bootstrap-kubeconfig={}", bootstrap.display()),
            format!("--kubeconfig={}", state.join("kubelet.conf").display()),
            format!("--cert-dir={}", state.join("pki").display()),
            format!("--hostname-override={name}"),
            format!("--port={port}"),
            "--address=127.0.0.1".into(),
        ];
        args.extend(extra.iter().cloned());
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nnodeStatusUpdateFrequency: 1s\n\
             nodeLeaseDurationSeconds: 4\nevictionHard:\n  memory.available: 100Mi\n{config_extra}"
        );
        let mut agent = NodeProcess::start(Some(&config), &args);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while server.get(&crate::apiserver::resources::LEASES, "kube-node-lease", name).is_none() {
            agent.assert_running();
            assert!(std::time::Instant::now() < deadline, "no Lease within 60s\n{}", agent.log_text());
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        agent
    }

    /// [`NodeProcess::start`] with its log filter (RUST_LOG) given.
    pub fn start_logging(config_yaml: Option<&str>, extra: &[String], rust_log: &str) -> NodeProcess {
        crate::prereq::require_root();
        let cgroup = TestCgroup::new();
        let dir = tempfile::Builder::new()
            .prefix(&format!("swiftlet-agent-{}-", std::process::id()))
            .tempdir()
            .expect("tempdir");
        let mut extra = extra.to_vec();
        if let Some(y) = config_yaml {
            let p = dir.path().join("config.yaml");
            fs::write(&p, y).expect("write config");
            extra.push(format!("--config={}", p.display()));
        }
        let args = NodeProcess::args(dir.path(), &cgroup, &extra);
        let log = dir.path().join("swiftlet.log");
        let mut node = NodeProcess { child: None, dir, log, cgroup, args, rust_log: rust_log.to_owned() };
        node.respawn();
        node
    }

    /// Starts the binary (again, after [`NodeProcess::kill`] or
    /// [`NodeProcess::stop`]) with the same arguments and root dir; its
    /// log goes on in the same file.
    pub fn respawn(&mut self) {
        assert!(self.child.is_none(), "swiftlet is still running");
        let out = fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("log file");
        let child = Command::new(crate::workload::sibling_binary("swiftlet"))
            .args(&self.args)
            .env("RUST_LOG", &self.rust_log)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .expect("start swiftlet");
        self.child = Some(child);
    }

    /// SIGKILL, as a crash: what it started (pods, mounts) stays.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `--root-dir`.
    pub fn root_dir(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Panics (with the log) if the agent has exited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            panic!("swiftlet exited ({status}); its log:\n{}", self.log_text());
        }
    }

    /// Sends `signal` (e.g. SIGHUP for a reload) to the agent.
    pub fn signal(&self, signal: i32) {
        if let Some(child) = &self.child {
            // SAFETY: signalling the process we started, by its PID.
            unsafe { libc::kill(child.id() as i32, signal) };
        }
    }

    /// The agent's PID (None once stopped).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The agent's --config file (when it was started with one).
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.yaml")
    }

    /// SIGTERM, then SIGKILL after 15 s; returns whether it exited by itself.
    pub fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else { return true };
        crate::process::terminate(&mut child, Duration::from_secs(15))
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("---- swiftlet log ({}) ----\n{}", self.log.display(), self.log_text());
        }
        // The agent makes its root dir a shared bind mount of itself (as
        // the kubelet does) and, as the kubelet, leaves it when it stops.
        crate::agent::unmount_under(self.dir.path());
    }
}

/// Stops and removes, through CRI, every sandbox of the given pod uids:
/// what a test's API pods left on the shared containerd (the agent leaves
/// pods running when it stops, as the kubelet does).
pub struct PodCleanup {
    pub uids: std::sync::Mutex<Vec<String>>,
    /// Static pods of this node (their names end in `-<node>`).
    pub static_node: Option<String>,
}

impl PodCleanup {
    pub fn new() -> PodCleanup {
        PodCleanup { uids: std::sync::Mutex::new(vec![]), static_node: None }
    }

    pub fn with_static_pods_of(node: &str) -> PodCleanup {
        PodCleanup { uids: std::sync::Mutex::new(vec![]), static_node: Some(node.to_owned()) }
    }

    pub fn track(&self, uid: &str) {
        self.uids.lock().unwrap_or_else(|p| p.into_inner()).push(uid.to_owned());
    }
}

impl Default for PodCleanup {
    fn default() -> Self {
        PodCleanup::new()
    }
}

impl Drop for PodCleanup {
    fn drop(&mut self) {
        let uids = self.uids.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if uids.is_empty() && self.static_node.is_none() {
            return;
        }
        use swiftlet::cri::{CriClient, RuntimeService, api, labels};
        let Ok(rt) = tokio::runtime::Builder::new_multi_thread().enable_all().build() else { return };
        let Ok(cri) = ({
            let _in = rt.enter();
            CriClient::new(&crate::agent::cri_endpoint(), Duration::from_secs(30))
        }) else {
            return;
        };
        rt.block_on(async {
            for uid in uids {
                let mut sel = labels::managed_selector();
                sel.insert(labels::POD_UID.into(), uid);
                let filter = api::PodSandboxFilter { label_selector: sel, ..Default::default() };
                for s in cri.list_pod_sandbox(Some(filter)).await.unwrap_or_default() {
                    let _ = cri.stop_pod_sandbox(&s.id).await;
                    let _ = cri.remove_pod_sandbox(&s.id).await;
                }
            }
        });
        if let Some(node) = &self.static_node {
            crate::agent::force_remove_pods(&cri, &rt, node);
        }
    }
}
