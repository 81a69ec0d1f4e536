//! The watcher end to end: real registration servers (tonic, on unix
//! sockets in a temporary directory) and a handler that records calls.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::{sync::oneshot, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::{
    CSI_PLUGIN, PluginHandler, PluginWatcher,
    api::{
        InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
        registration_server::{Registration, RegistrationServer},
    },
};
use crate::flowcontrol::BackoffPolicy;

/// A plugin's registration server: answers GetInfo with `info`, records
/// the calls and the statuses it is sent.
#[derive(Clone)]
struct FakePlugin {
    info: PluginInfo,
    calls: Arc<Mutex<Vec<String>>>,
    statuses: Arc<Mutex<Vec<RegistrationStatus>>>,
}

#[tonic::async_trait]
impl Registration for FakePlugin {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        self.calls.lock().push("GetInfo".into());
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        r: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        self.statuses.lock().push(r.into_inner());
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// A served plugin; dropping `stop` ends the server.
struct Served {
    plugin: FakePlugin,
    socket: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Served {
    fn start(socket: &Path, kind: &str, name: &str, endpoint: &str, versions: &[&str]) -> Served {
        let plugin = FakePlugin {
            info: PluginInfo {
                r#type: kind.into(),
                name: name.into(),
                endpoint: endpoint.into(),
                supported_versions: versions.iter().map(|v| v.to_string()).collect(),
            },
            calls: Default::default(),
            statuses: Default::default(),
        };
        let listener = tokio::net::UnixListener::bind(socket).unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let server = RegistrationServer::new(plugin.clone());
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(server)
                .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), async {
                    let _ = rx.await;
                })
                .await;
        });
        Served { plugin, socket: socket.to_path_buf(), stop: Some(tx), task }
    }

    fn statuses(&self) -> Vec<RegistrationStatus> {
        self.plugin.statuses.lock().clone()
    }

    /// Stops serving and removes the socket (the plugin going away).
    async fn remove(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = self.task.await;
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Records every call; refuses names listed in `refuse` at validation and
/// in `fail` at registration.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<String>>,
    refuse: Mutex<Vec<String>>,
    fail: Mutex<Vec<String>>,
}

#[async_trait]
impl PluginHandler for Recorder {
    fn validate(&self, name: &str, endpoint: &Path, versions: &[String]) -> Result<(), String> {
        self.calls.lock().push(format!("validate {name} {} {}", endpoint.display(), versions.join(",")));
        if self.refuse.lock().iter().any(|n| n == name) {
            return Err(format!("version {} of {name} is not supported", versions.join(",")));
        }
        Ok(())
    }

    async fn register(&self, name: &str, endpoint: &Path, _versions: &[String]) -> Result<(), String> {
        self.calls.lock().push(format!("register {name} {}", endpoint.display()));
        if self.fail.lock().iter().any(|n| n == name) {
            return Err(format!("{name}: NodeGetInfo failed"));
        }
        Ok(())
    }

    async fn deregister(&self, name: &str) {
        self.calls.lock().push(format!("deregister {name}"));
    }
}

impl Recorder {
    /// The calls other than validate.
    fn effects(&self) -> Vec<String> {
        self.calls.lock().iter().filter(|c| !c.starts_with("validate")).cloned().collect()
    }
}

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

struct Setup {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    watcher: Arc<PluginWatcher>,
    handler: Arc<Recorder>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("plugins_registry");
    let watcher = Arc::new(
        PluginWatcher::new(&dir)
            .with_backoff(BackoffPolicy { initial: Duration::from_millis(100), max: Duration::from_millis(400) }),
    );
    let handler = Arc::new(Recorder::default());
    watcher.add_handler(CSI_PLUGIN, handler.clone());
    let stop = CancellationToken::new();
    let task = tokio::spawn(watcher.clone().run(stop.clone()));
    Setup { _tmp: tmp, dir, watcher, handler, stop, task }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_register_deregister_and_reregister_when_made_again() {
    let s = setup();
    eventually("the directory", || s.dir.is_dir()).await;
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&s.dir).unwrap().permissions().mode() & 0o777, 0o750);

    // A driver whose registrar names its own endpoint.
    let sock = s.dir.join("csi.example.com-reg.sock");
    let p = Served::start(&sock, CSI_PLUGIN, "csi.example.com", "/run/csi/csi.sock", &["1.0.0"]);
    eventually("the registration", || s.handler.effects() == ["register csi.example.com /run/csi/csi.sock"]).await;
    eventually("the status", || !p.statuses().is_empty()).await;
    assert_eq!(p.statuses(), [RegistrationStatus { plugin_registered: true, error: String::new() }]);
    assert_eq!(s.handler.calls.lock()[0], "validate csi.example.com /run/csi/csi.sock 1.0.0");
    let plugins = s.watcher.plugins();
    assert_eq!(plugins.len(), 1);
    assert_eq!((plugins[0].name.as_str(), plugins[0].socket.as_path()), ("csi.example.com", sock.as_path()));
    let metrics = {
        let mut r = prometheus_client::registry::Registry::default();
        r.register_collector(Box::new(s.watcher.collector()));
        crate::metrics::exposition::encode(&[&r])
    };
    for state in ["desired_state_of_world", "actual_state_of_world"] {
        let want = format!("plugin_manager_total_plugins{{socket_path=\"{}\",state=\"{state}\"}} 1", sock.display());
        assert!(metrics.lines().any(|l| l == want), "{want} missing:\n{metrics}");
    }

    // The driver restarts: its socket is made again at the same path.
    p.remove().await;
    let p2 = Served::start(&sock, CSI_PLUGIN, "csi.example.com", "", &["1.0.0"]);
    let want_endpoint = format!("register csi.example.com {}", sock.display());
    eventually("the re-registration", || s.handler.effects().len() == 3).await;
    assert_eq!(
        s.handler.effects(),
        ["register csi.example.com /run/csi/csi.sock", "deregister csi.example.com", want_endpoint.as_str()]
    );
    eventually("the second status", || p2.statuses().len() == 1).await;
    assert!(p2.statuses()[0].plugin_registered);

    // It goes away: deregistered, and nothing is left.
    p2.remove().await;
    eventually("the deregistration", || s.handler.effects().len() == 4).await;
    assert_eq!(s.handler.effects()[3], "deregister csi.example.com");
    eventually("an empty view", || s.watcher.plugins().is_empty() && s.watcher.sockets().is_empty()).await;

    s.stop.cancel();
    s.task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_told_to_the_plugin_and_retried_and_dot_files_and_subdirs_are_handled() {
    let s = setup();
    eventually("the directory", || s.dir.is_dir()).await;
    s.handler.refuse.lock().push("old.example.com".into());
    s.handler.fail.lock().push("flaky.example.com".into());

    // An unknown type: refused with the kubelet's message, never handed over.
    let dra = Served::start(&s.dir.join("dra.sock"), "Bogus", "dra.example.com", "", &["1.0.0"]);
    eventually("the unknown type's status", || !dra.statuses().is_empty()).await;
    let st = &dra.statuses()[0];
    assert!(!st.plugin_registered);
    assert_eq!(
        st.error,
        format!(
            "RegisterPlugin error -- no handler registered for plugin type: Bogus at socket {}",
            dra.socket.display()
        )
    );

    // A refused version: told why, not registered.
    let old = Served::start(&s.dir.join("old.sock"), CSI_PLUGIN, "old.example.com", "", &["0.3.0"]);
    eventually("the refusal", || !old.statuses().is_empty()).await;
    assert_eq!(
        old.statuses()[0].error,
        "RegisterPlugin error -- plugin validation failed with err: version 0.3.0 of old.example.com is not supported"
    );
    assert!(!old.statuses()[0].plugin_registered);

    // A failed registration is retried (with back-off) and then succeeds.
    let flaky = Served::start(&s.dir.join("flaky.sock"), CSI_PLUGIN, "flaky.example.com", "", &["1.0.0"]);
    eventually("a failed registration", || !flaky.statuses().is_empty()).await;
    assert_eq!(
        flaky.statuses()[0].error,
        "RegisterPlugin error -- plugin registration failed with err: flaky.example.com: NodeGetInfo failed"
    );
    s.handler.fail.lock().clear();
    eventually("the retry", || flaky.statuses().iter().any(|st| st.plugin_registered)).await;
    // Refusals are retried too, and told again each time.
    eventually("a second refusal", || old.statuses().len() >= 2).await;

    // A dot file is never dialed.
    let hidden = Served::start(&s.dir.join(".hidden.sock"), CSI_PLUGIN, "hidden.example.com", "", &["1.0.0"]);
    // A socket in a subdirectory made after the start is.
    std::fs::create_dir(s.dir.join("nested")).unwrap();
    let nested = Served::start(&s.dir.join("nested/n.sock"), CSI_PLUGIN, "nested.example.com", "", &["1.0.0"]);
    eventually("the nested plugin", || nested.statuses().iter().any(|st| st.plugin_registered)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(hidden.plugin.calls.lock().is_empty());
    assert!(!s.handler.calls.lock().iter().any(|c| c.contains("hidden")));
    let mut names: Vec<String> = s.watcher.plugins().into_iter().map(|p| p.name).collect();
    names.sort();
    assert_eq!(names, ["flaky.example.com", "nested.example.com"]);
    // The refused and unknown ones never reached register.
    assert!(!s.handler.effects().iter().any(|c| c.contains("old.example.com") || c.contains("dra.example.com")));

    s.stop.cancel();
    s.task.await.unwrap();
    for p in [dra, old, flaky, hidden, nested] {
        p.remove().await;
    }
}
