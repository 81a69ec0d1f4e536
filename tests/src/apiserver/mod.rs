//! A fake Kubernetes API server for tests, good enough for kube-rs and for
//! kubectl: real HTTP (TLS with a generated CA when asked), objects held in
//! memory, discovery, list/get/create/update/patch/delete/watch with
//! resourceVersions, selectors, bookmarks and 410 Gone, server-side
//! printing (Table), pod defaulting and graceful deletion, TokenReview and
//! SubjectAccessReview answers from configurable rules, and a CSR signer.
//!
//! It runs on its own thread and runtime, so sync tests and tokio tests
//! use it alike; it can be stopped and restarted on the same port with its
//! objects kept (an API server outage). Run it by hand with
//! `cargo run -p swiftlet-tests --bin fake-apiserver`.
//!
//! Storage ([`storage`]): PersistentVolumes, PersistentVolumeClaims and
//! storage.k8s.io/v1 (StorageClasses, CSIDrivers, CSINodes,
//! VolumeAttachments), with the API server's defaults and claim validation.
//! [`FakeApiServer::start_storage_controllers`] adds the control plane's
//! storage controllers: the PV controller (binding, Released, reclaim), and
//! for the CSI drivers added with [`FakeApiServer::add_csi_controller`]
//! the external-provisioner (CreateVolume → PV, DeleteVolume), the
//! attach-detach controller with the external-attacher (VolumeAttachments,
//! ControllerPublishVolume, node.status.volumesAttached), the
//! external-resizer (ControllerExpandVolume), and the ephemeral volume
//! controller (a generic ephemeral volume's claim, deleted with its pod).
//!
//! What it does not do: authentication is recorded, not enforced (every
//! request is allowed); no protobuf, no server-side apply, no admission
//! beyond pod defaults and storage; no controllers but the storage ones
//! (no scheduler, no general garbage collector, no node lifecycle
//! controller).

pub mod admission;
pub mod auth;
pub mod csr;
pub mod defaults;
mod ephemeral;
pub mod openapi;
pub mod patch;
pub mod proxy;
mod resize;
pub mod resources;
pub mod selectors;
mod server;
pub mod storage;
pub mod store;
pub mod table;

use std::{
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, RwLock},
    thread,
    time::{Duration, Instant},
};

use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
pub use server::{Fault, RequestRecord};
pub use storage::StorageOptions;
use tokio::sync::{mpsc, oneshot, watch};

use self::{
    auth::{AccessRule, AuthConfig, Pki, UserInfo},
    resources::ResourceType,
    server::State,
    store::Store,
};

#[derive(Clone, Debug)]
pub struct Options {
    /// Serve HTTPS with a certificate from a generated CA.
    pub tls: bool,
    /// 0: any free port.
    pub port: u16,
    /// Interval of BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
    /// Changes kept for watches to resume from; older ones get 410.
    pub history_limit: usize,
    /// Approve and sign kubelet client CSRs at once (TLS only).
    pub auto_approve_csrs: bool,
    /// Which CSRs are approved at once and how long certificates live.
    pub csr: csr::Policy,
    pub auth: AuthConfig,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            tls: false,
            port: 0,
            bookmark_interval: Duration::from_secs(5),
            history_limit: 10_000,
            auto_approve_csrs: true,
            csr: csr::Policy::default(),
            auth: AuthConfig::default(),
        }
    }
}

/// How a kubeconfig written by [`FakeApiServer::write_kubeconfig`]
/// authenticates.
#[derive(Clone, Debug)]
pub enum Credentials {
    None,
    Token(String),
    /// PEM files.
    ClientCert {
        cert: PathBuf,
        key: PathBuf,
    },
}

enum Command {
    Start(oneshot::Sender<Result<(), String>>),
    Stop(oneshot::Sender<()>),
    Quit,
}

pub struct FakeApiServer {
    state: Arc<State>,
    addr: SocketAddr,
    stop_tx: Arc<watch::Sender<bool>>,
    commands: mpsc::UnboundedSender<Command>,
    thread: Option<thread::JoinHandle<()>>,
    dir: tempfile::TempDir,
    storage: storage::Storage,
}

impl FakeApiServer {
    pub fn start(options: Options) -> std::io::Result<FakeApiServer> {
        let listener = TcpListener::bind(("127.0.0.1", options.port))?;
        let addr = listener.local_addr()?;
        let pki = if options.tls { Some(Pki::generate().map_err(std::io::Error::other)?) } else { None };
        let dir = tempfile::Builder::new().prefix(&format!("fake-apiserver-{}-", std::process::id())).tempdir()?;
        if let Some(p) = &pki {
            std::fs::write(dir.path().join("ca.crt"), &p.ca_pem)?;
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        // The API server's kubelet client certificate (system:masters).
        let kubelet_client = match &pki {
            Some(p) => {
                let (cert, key) =
                    p.client_cert(proxy::KUBELET_CLIENT_USER, &["system:masters"]).map_err(std::io::Error::other)?;
                Some(proxy::kubelet_client_config(&cert, &key).map_err(std::io::Error::other)?)
            }
            None => None,
        };
        let state = Arc::new(State {
            kubelet_client,
            store: Store::new(options.history_limit),
            auth: RwLock::new(options.auth.clone()),
            pki,
            bookmark_interval: options.bookmark_interval,
            auto_approve_csrs: options.auto_approve_csrs,
            csr: RwLock::new(options.csr.clone()),
            requests: Mutex::new(vec![]),
            faults: Mutex::new(vec![]),
            server_address: addr.to_string(),
            shutdown: stop_rx,
        });
        let stop_tx = Arc::new(stop_tx);
        let (commands, mut rx) = mpsc::unbounded_channel::<Command>();
        let st = state.clone();
        let stop = stop_tx.clone();
        let thread = thread::Builder::new().name("fake-apiserver".into()).spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("fake-apiserver")
                .enable_all()
                .build()
                .expect("tokio runtime");
            rt.block_on(async move {
                let mut running: Option<tokio::task::JoinHandle<()>> =
                    Some(tokio::spawn(accept_loop(st.clone(), listener, stop.subscribe())));
                while let Some(cmd) = rx.recv().await {
                    match cmd {
                        Command::Stop(done) => {
                            stop.send_replace(true);
                            if let Some(t) = running.take() {
                                let _ = t.await;
                            }
                            let _ = done.send(());
                        }
                        Command::Start(done) => {
                            if running.is_some() {
                                let _ = done.send(Ok(()));
                                continue;
                            }
                            // The port was ours a moment ago; retry briefly
                            // while the old sockets close.
                            let deadline = Instant::now() + Duration::from_secs(10);
                            let listener = loop {
                                match TcpListener::bind(addr) {
                                    Ok(l) => break Ok(l),
                                    Err(e) if Instant::now() < deadline => {
                                        let _ = e;
                                        tokio::time::sleep(Duration::from_millis(100)).await;
                                    }
                                    Err(e) => break Err(format!("cannot bind {addr} again: {e}")),
                                }
                            };
                            match listener {
                                Ok(l) => {
                                    stop.send_replace(false);
                                    running = Some(tokio::spawn(accept_loop(st.clone(), l, stop.subscribe())));
                                    let _ = done.send(Ok(()));
                                }
                                Err(e) => {
                                    let _ = done.send(Err(e));
                                }
                            }
                        }
                        Command::Quit => break,
                    }
                }
                stop.send_replace(true);
                if let Some(t) = running.take() {
                    let _ = t.await;
                }
            });
        })?;
        Ok(FakeApiServer { state, addr, stop_tx, commands, thread: Some(thread), dir, storage: Default::default() })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self) -> String {
        let scheme = if self.state.pki.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// The CA certificate (PEM file), with TLS.
    pub fn ca_file(&self) -> Option<PathBuf> {
        self.state.pki.as_ref().map(|_| self.dir.path().join("ca.crt"))
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Issues a client certificate signed by the fake's CA (TLS only);
    /// returns the (cert, key) PEM files.
    pub fn client_cert(&self, user: &str, groups: &[&str]) -> Option<(PathBuf, PathBuf)> {
        let pki = self.state.pki.as_ref()?;
        let (cert, key) = pki.client_cert(user, groups).ok()?;
        let safe = user.replace(':', "_");
        let (c, k) = (self.dir.path().join(format!("{safe}.crt")), self.dir.path().join(format!("{safe}.key")));
        std::fs::write(&c, cert).ok()?;
        std::fs::write(&k, key).ok()?;
        Some((c, k))
    }

    /// Writes a kubeconfig for this server (JSON, which is YAML).
    pub fn write_kubeconfig(&self, path: &Path, credentials: &Credentials) -> std::io::Result<()> {
        let mut cluster = json!({"server": self.url()});
        if let Some(ca) = self.ca_file() {
            cluster["certificate-authority"] = ca.display().to_string().into();
        }
        let user = match credentials {
            Credentials::None => json!({}),
            Credentials::Token(t) => json!({"token": t}),
            Credentials::ClientCert { cert, key } => {
                json!({"client-certificate": cert.display().to_string(), "client-key": key.display().to_string()})
            }
        };
        let doc = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": cluster}],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "user", "namespace": "default"}}],
            "current-context": "fake",
        });
        std::fs::write(path, serde_json::to_vec_pretty(&doc).map_err(std::io::Error::other)?)
    }

    /// Stops serving (the port closes, open connections and watches are
    /// cut); the objects are kept.
    pub fn stop(&self) {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::Stop(tx)).is_ok() {
            let _ = rx.blocking_recv();
        }
    }

    /// Serves again on the same port.
    pub fn restart(&self) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        self.commands.send(Command::Start(tx)).map_err(|_| "the server thread is gone".to_owned())?;
        rx.blocking_recv().map_err(|_| "the server thread is gone".to_owned())?
    }

    pub fn is_serving(&self) -> bool {
        !*self.stop_tx.borrow()
    }

    pub fn store(&self) -> &Store {
        &self.state.store
    }

    pub fn get(&self, rt: &ResourceType, ns: &str, name: &str) -> Option<Value> {
        self.state.store.get(rt, ns, name).ok()
    }

    pub fn list(&self, rt: &ResourceType, ns: Option<&str>) -> Vec<Value> {
        self.state.store.list(rt, ns).0
    }

    pub fn set_token(&self, token: &str, user: UserInfo) {
        self.state.auth.write().unwrap_or_else(|p| p.into_inner()).tokens.insert(token.into(), user);
    }

    pub fn remove_token(&self, token: &str) {
        self.state.auth.write().unwrap_or_else(|p| p.into_inner()).tokens.remove(token);
    }

    /// Replaces the authorization rules (first match decides).
    pub fn set_rules(&self, rules: Vec<AccessRule>) {
        self.state.auth.write().unwrap_or_else(|p| p.into_inner()).rules = rules;
    }

    pub fn add_rule(&self, rule: AccessRule) {
        self.state.auth.write().unwrap_or_else(|p| p.into_inner()).rules.push(rule);
    }

    /// Changes which CSRs are approved at once and how long certificates
    /// live, from now on.
    pub fn set_csr_policy(&self, policy: csr::Policy) {
        *self.state.csr.write().unwrap_or_else(|p| p.into_inner()) = policy;
    }

    /// Approves a CSR as `kubectl certificate approve` does; the signer
    /// then issues its certificate.
    pub fn approve_csr(&self, name: &str) -> Result<(), String> {
        let mut csr = self.state.store.get(&resources::CSRS, "", name).map_err(|e| e.message.clone())?;
        let t = store::now_rfc3339();
        csr["status"]["conditions"] = json!([{
            "type": "Approved", "status": "True", "reason": "KubectlApprove",
            "message": "This CSR was approved by the test.", "lastUpdateTime": t, "lastTransitionTime": t,
        }]);
        let updated = self
            .state
            .store
            .update(&resources::CSRS, "", name, csr, server::merge_for(&resources::CSRS, Some("status")))
            .map_err(|e| e.message.clone())?;
        csr::on_update(&self.state, updated);
        Ok(())
    }

    pub fn inject(&self, fault: Fault) {
        self.state.faults.lock().unwrap_or_else(|p| p.into_inner()).push(fault);
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.state.requests.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Makes every older resourceVersion expire (watches get 410 Gone).
    pub fn compact(&self) {
        self.state.store.compact();
    }

    /// Starts the storage controllers (see [`storage`]); they run until the
    /// server is dropped. Called again, they restart with `opts`.
    pub fn start_storage_controllers(&self, opts: StorageOptions) {
        self.storage.start(self.state.clone(), opts);
    }

    /// Makes `driver`'s CSI Controller service, served on the unix socket
    /// `socket`, the provisioner, attacher and resizer of its volumes
    /// (before or after the controllers start; again: a new socket).
    pub fn add_csi_controller(&self, driver: &str, socket: &Path) {
        self.storage.add_driver(driver, socket);
    }

    /// Polls `f` every 50 ms until it returns Some or `timeout` passes.
    pub fn wait_for<T>(&self, timeout: Duration, mut f: impl FnMut(&FakeApiServer) -> Option<T>) -> Option<T> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = f(self) {
                return Some(v);
            }
            if Instant::now() > deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Quit);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn accept_loop(state: Arc<State>, listener: TcpListener, mut stop: watch::Receiver<bool>) {
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
    let tls = state.pki.as_ref().and_then(|p| tls_acceptor(p).map_err(|e| eprintln!("fake-apiserver: TLS: {e}")).ok());
    let mut connections = tokio::task::JoinSet::new();
    let conn_stop = stop.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let state = state.clone();
                let tls = tls.clone();
                let mut stop = conn_stop.clone();
                connections.spawn(async move {
                    tokio::select! {
                        _ = serve_connection(state, stream, tls) => {}
                        _ = async { stop.wait_for(|s| *s).await.is_ok() } => {}
                    }
                });
            }
            _ = async { stop.wait_for(|s| *s).await.is_ok() } => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    connections.shutdown().await;
}

async fn serve_connection(state: Arc<State>, stream: tokio::net::TcpStream, tls: Option<tokio_rustls::TlsAcceptor>) {
    let _ = stream.set_nodelay(true);
    let builder = hyper::server::conn::http1::Builder::new();
    match tls {
        None => {
            let svc = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, std::convert::Infallible>(server::handle(state, req, None).await) }
            });
            let _ = builder.serve_connection(TokioIo::new(stream), svc).with_upgrades().await;
        }
        Some(acceptor) => {
            let Ok(tls_stream) = acceptor.accept(stream).await else { return };
            let peer = tls_stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| auth::peer_from_cert(c.as_ref()));
            let svc = hyper::service::service_fn(move |req| {
                let state = state.clone();
                let peer = peer.clone();
                async move { Ok::<_, std::convert::Infallible>(server::handle(state, req, peer).await) }
            });
            let _ = builder.serve_connection(TokioIo::new(tls_stream), svc).with_upgrades().await;
        }
    }
}

fn tls_acceptor(pki: &Pki) -> Result<tokio_rustls::TlsAcceptor, String> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pki.server_cert_pem.as_bytes())
        .chain(CertificateDer::pem_slice_iter(pki.ca_pem.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let key = PrivateKeyDer::from_pem_slice(pki.server_key_pem.as_bytes()).map_err(|e| e.to_string())?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(pki.ca_pem.as_bytes()) {
        roots.add(c.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    }
    // Client certificates are optional: tokens and anonymous requests are
    // served too.
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|e| e.to_string())?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}
