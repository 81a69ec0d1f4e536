//! The kubelet API under test, two ways:
//!
//! - [`InProcess`]: the server module started in the test process over an
//!   in-memory PodView, real cgroups and a real containerd, on an ephemeral
//!   port (for routes that need pods before the pod manager exists).
//! - [`RunningAgent`]: the real `swiftlet` binary on free ports, with its
//!   pods' cgroup root inside a test cgroup.

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use swiftlet::{
    cgroups::CgroupFs,
    config::{self, Config},
    cri::CriClient,
    metrics::Metrics,
    pods::source::PodView,
    server::{
        self, Server, ServerParts, Servers,
        events::DebugEvents,
        health::HealthChecks,
        stats::{StatsConfig, StatsProvider, StatsRuntime},
    },
};
use tokio_util::sync::CancellationToken;

use crate::{
    cgroup::TestCgroup,
    https::{Https, Identity},
};

pub use crate::node_process::free_port;

/// target/<profile>/swiftlet, built beside the test binaries, or the build
/// `SWIFTLET_BINARY` names (to measure another build with the same test).
pub fn swiftlet_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("SWIFTLET_BINARY") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let p = dir.join("swiftlet");
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build -p swiftlet` (cargo xtask test builds the workspace first)",
        p.display()
    );
    p
}

fn write_config(dir: &std::path::Path) -> PathBuf {
    // Not `<root>/pods`: that is where pod directories (volumes) live.
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).expect("pod logs dir");
    let path = dir.join("config.yaml");
    std::fs::write(
        &path,
        format!(
            // As the agent fixture: on this shared, often full disk only
            // memory evicts, and image GC (which would delete the locally
            // built test images) stays off.
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\npodLogsDir: {}\n\
             evictionHard:\n  memory.available: 100Mi\nimageGCHighThresholdPercent: 100\n",
            logs.display()
        ),
    )
    .expect("config file");
    path
}

/// The runtime an [`InProcess`] server reads: the CRI client, or a fake.
#[derive(Default)]
pub struct Runtime {
    pub stats: Option<Arc<dyn StatsRuntime>>,
    pub runtime: Option<Arc<dyn swiftlet::cri::RuntimeService>>,
    /// The stats sampling interval (1 s when None).
    pub interval: Option<Duration>,
}

impl From<Option<Arc<CriClient>>> for Runtime {
    fn from(c: Option<Arc<CriClient>>) -> Runtime {
        Runtime {
            stats: c.clone().map(|c| c as Arc<dyn StatsRuntime>),
            runtime: c.map(|c| c as Arc<dyn swiftlet::cri::RuntimeService>),
            interval: None,
        }
    }
}

pub struct InProcess {
    pub server: Arc<Server>,
    pub addr: SocketAddr,
    pub servers: Option<Servers>,
    pub config: Config,
    pub events: DebugEvents,
    pub metrics: Arc<Metrics>,
    pub stats: Arc<StatsProvider>,
    pub dir: tempfile::TempDir,
    stop: CancellationToken,
}

impl InProcess {
    /// Starts the server with `flags` after the test defaults (loopback,
    /// ephemeral port, AlwaysAllow and anonymous requests allowed unless
    /// the flags say otherwise).
    pub async fn start(
        pods: Arc<dyn PodView>,
        cgroup_root: &str,
        cri: Option<Arc<CriClient>>,
        flags: &[String],
    ) -> InProcess {
        InProcess::start_with(pods, cgroup_root, Runtime::from(cri), flags, None).await
    }

    /// [`InProcess::start`] with any runtime, and webhooks asking the API
    /// server named in `kubeconfig`.
    pub async fn start_with(
        pods: Arc<dyn PodView>,
        cgroup_root: &str,
        runtime: Runtime,
        flags: &[String],
        kubeconfig: Option<&std::path::Path>,
    ) -> InProcess {
        swiftlet::server::tls::install_default_provider();
        let dir = tempfile::tempdir().expect("temp dir");
        let cfg_file = write_config(dir.path());
        let mut args: Vec<String> = vec![
            format!("--config={}", cfg_file.display()),
            format!("--root-dir={}", dir.path().display()),
            format!("--cert-dir={}", dir.path().join("pki").display()),
            format!("--cgroup-root={cgroup_root}"),
            "--address=127.0.0.1".into(),
            "--healthz-port=0".into(),
            "--authorization-mode=AlwaysAllow".into(),
            "--anonymous-auth=true".into(),
            "--hostname-override=test-node".into(),
        ];
        args.extend(flags.iter().cloned());
        let mut config = config::load(args).expect("test configuration");
        // An ephemeral port: nothing to race for.
        config.kubelet.port = 0;
        let metrics = Arc::new(Metrics::new());
        let stats = Arc::new(StatsProvider::new(
            StatsConfig {
                node_name: "test-node".into(),
                root_dir: dir.path().to_owned(),
                pod_logs_dir: config.kubelet.pod_logs_dir.clone(),
                naming: config.kubelet.cgroup_naming(),
                interval: runtime.interval.unwrap_or(Duration::from_secs(1)),
                sandbox_image: String::new(),
            },
            CgroupFs::detect().expect("cgroupfs"),
            pods.clone(),
            runtime.stats.clone(),
            Some(metrics.clone()),
        ));
        let events = DebugEvents::new(pods.clone());
        let client = match kubeconfig {
            Some(k) => Some(swiftlet::app::serve::client_from_kubeconfig(k).await.expect("API client")),
            None => None,
        };
        let client_ca = server::client_ca(&config).expect("client CA");
        let (authn, authz) = server::auth_from_config(&config, client, client_ca.clone()).expect("auth");
        let server = Arc::new(Server::new(ServerParts {
            node_name: "test-node".into(),
            config: Arc::new(config.clone()),
            pods,
            stats: stats.clone(),
            metrics: metrics.clone(),
            health: Arc::new(HealthChecks::new()),
            events: events.clone(),
            runtime: runtime.runtime.clone(),
            source: None,
            ebpf: None,
            authn,
            authz,
            probes: Default::default(),
            volumes: None,
            running: None,
            client_ca,
            serving: None,
            certificates: Default::default(),
        }));
        let stop = CancellationToken::new();
        let rx = stop.clone();
        let servers = server::start(server.clone(), rx).await.expect("start the servers");
        let addr = servers.secure.expect("secure port");
        InProcess { server, addr, servers: Some(servers), config, events, metrics, stats, dir, stop }
    }

    pub fn https(&self, identity: Option<Identity>) -> Https {
        Https::new(self.addr, identity)
    }

    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(s) = self.servers.take() {
            s.join().await;
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The swiftlet binary, running.
pub struct RunningAgent {
    child: Child,
    pub healthz_port: u16,
    pub port: u16,
    pub dir: tempfile::TempDir,
    pub log: PathBuf,
    pub cgroup: TestCgroup,
    /// Sandboxes that existed before the agent started (others are its pods).
    sandboxes_before: Vec<String>,
}

/// The sandbox ids in the test containerd (empty without one).
fn sandboxes() -> Vec<String> {
    let Ok(ep) = std::env::var("SWIFTLET_TEST_CRI_ENDPOINT") else { return vec![] };
    on_own_runtime(async move {
        let c = CriClient::new(&ep, Duration::from_secs(10)).ok()?;
        Some(swiftlet::cri::RuntimeService::list_pod_sandbox(&c, None).await.ok()?.into_iter().map(|s| s.id).collect())
    })
    .unwrap_or_default()
}

/// Runs `f` on a runtime of its own, on a thread of its own (callers may
/// be inside a runtime already).
fn on_own_runtime<T: Send + 'static>(f: impl std::future::Future<Output = T> + Send + 'static) -> T {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(f)
    })
    .join()
    .expect("runtime thread")
}

impl RunningAgent {
    /// Starts the agent with `flags` after the test defaults and waits for
    /// its healthz.
    pub fn start(flags: &[String]) -> RunningAgent {
        crate::prereq::require_root();
        let cgroup = TestCgroup::new();
        let dir = tempfile::tempdir().expect("temp dir");
        let cfg_file = write_config(dir.path());
        let healthz_port = free_port();
        let port = free_port();
        let endpoint = std::env::var("SWIFTLET_TEST_CRI_ENDPOINT")
            .unwrap_or_else(|_| format!("unix://{}/no-runtime.sock", dir.path().display()));
        let mut args: Vec<String> = vec![
            format!("--config={}", cfg_file.display()),
            format!("--root-dir={}", dir.path().display()),
            format!("--cert-dir={}", dir.path().join("pki").display()),
            format!("--cgroup-root={}", cgroup.root),
            format!("--container-runtime-endpoint={endpoint}"),
            format!("--healthz-port={healthz_port}"),
            format!("--port={port}"),
            "--signal-source=cgroupfs".into(),
            "--hostname-override=test-node".into(),
            // This machine's disk is shared and may be fuller than the
            // default imagefs/nodefs thresholds allow: only memory counts.
            "--eviction-hard=memory.available<1Mi".into(),
        ];
        args.extend(flags.iter().cloned());
        let sandboxes_before = sandboxes();
        let log = dir.path().join("swiftlet.log");
        let child = Command::new(swiftlet_binary())
            .args(&args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).expect("log file"))
            .stderr(std::fs::File::create(&log).expect("log file").try_clone().expect("log file"))
            .spawn()
            .expect("start swiftlet");
        let mut a = RunningAgent { child, healthz_port, port, dir, log, cgroup, sandboxes_before };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = a.child.try_wait().expect("wait") {
                panic!("swiftlet exited ({status}); its log:\n{}", a.log_text());
            }
            if healthz_ok(healthz_port) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "swiftlet's healthz did not answer within 20s; its log:\n{}",
                a.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // The secure port comes up right after healthz.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "swiftlet's :{port} did not open; its log:\n{}", a.log_text());
            std::thread::sleep(Duration::from_millis(50));
        }
        a
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn https(&self, identity: Option<Identity>) -> Https {
        Https::new(SocketAddr::from(([127, 0, 0, 1], self.port)), identity)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// GET /healthz over plain HTTP; true on `200 ok`.
pub fn healthz_ok(port: u16) -> bool {
    plain_get(SocketAddr::from(([127, 0, 0, 1], port)), "/healthz").is_ok_and(|(s, b)| s == 200 && b == "ok")
}

/// A plain HTTP/1.0 GET: (status, body).
pub fn plain_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Ok((status, body))
}

impl Drop for RunningAgent {
    fn drop(&mut self) {
        crate::process::terminate(&mut self.child, Duration::from_secs(10));
        // Pods outlive the kubelet by design; the test's are removed here.
        let Ok(ep) = std::env::var("SWIFTLET_TEST_CRI_ENDPOINT") else { return };
        let before = self.sandboxes_before.clone();
        on_own_runtime(async move {
            use swiftlet::cri::RuntimeService;
            let Ok(c) = CriClient::new(&ep, Duration::from_secs(30)) else { return };
            for s in c.list_pod_sandbox(None).await.unwrap_or_default() {
                if before.contains(&s.id) {
                    continue;
                }
                let _ = c.stop_pod_sandbox(&s.id).await;
                let _ = c.remove_pod_sandbox(&s.id).await;
            }
        });
    }
}
