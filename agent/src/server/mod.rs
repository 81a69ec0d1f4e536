//! The kubelet's HTTP servers.
//!
//! - `:10248` (`healthzBindAddress:healthzPort`, loopback by default):
//!   plain HTTP, `/healthz` only.
//! - `:10250` (`address:port`): HTTPS (rustls; the serving certificate from
//!   `--tls-cert-file` or self-signed in `--cert-dir`), every request
//!   authenticated and authorized (`auth`, `webhook`), serving /pods,
//!   /healthz, /configz, /stats/summary, /metrics, /metrics/resource,
//!   /metrics/cadvisor, /metrics/probes, /metrics/slis, /containerLogs and
//!   /debug/events (the metrics routes are in `metrics_routes`).
//! - a unix socket in the root dir (`swiftlet/debug.sock`, root only) for
//!   the node's own tools (`swiftlet events`): /debug/events and /healthz,
//!   trusted by file permission as the eBPF programs are.

pub mod auth;
pub mod cadvisor;
mod cadvisor_psi;
pub mod cgroup_sample;
pub mod collectors;
pub mod conn;
pub mod events;
pub use crate::metrics::exposition;
pub mod health;
pub mod http;
pub mod listen;
mod log_route;
pub mod logs;
mod metrics_routes;
pub mod review_cache;
pub mod spdy;
pub mod stats;
pub mod stats_read;
pub mod streaming;
pub mod summary;
pub mod tls;
mod tls_config;
pub mod webhook;

use std::{
    net::{IpAddr, SocketAddr},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    sync::Arc,
};

use bytes::Bytes;
use hyper::{
    Method, Request, Response, StatusCode,
    body::Incoming,
    header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue},
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};
use thiserror::Error;
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use self::{
    auth::{Authenticator, Authorizer, Credentials, Outcome},
    events::DebugEvents,
    health::HealthChecks,
    http::{Body, ConnInfo},
    stats::StatsProvider,
};
use crate::{
    config::{AuthorizationMode, Config},
    cri::RuntimeService,
    metrics::{Metrics, storage::VolumeStates},
    pods::source::PodView,
    signals::SignalSource,
};

#[derive(Debug, Error)]
pub enum ServerError {
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("listen tcp {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("listen unix {path}: {source}")]
    ListenUnix { path: PathBuf, source: std::io::Error },
    #[error("API server client from the kubeconfig {0}")]
    ApiClient(String),
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

/// A pod view with no pods, until the pod manager provides one.
pub struct NoPods;

impl PodView for NoPods {
    fn pods(&self) -> Vec<k8s_openapi::api::core::v1::Pod> {
        vec![]
    }
}

/// What the handlers serve from.
pub struct Server {
    pub node_name: String,
    pub config: Arc<Config>,
    pub pods: Arc<dyn PodView>,
    pub stats: Arc<StatsProvider>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<HealthChecks>,
    pub events: DebugEvents,
    /// For the log path of a container whose file is not where the layout says.
    pub runtime: Option<Arc<dyn RuntimeService>>,
    /// For the signal source's counters on /metrics.
    pub source: Option<Arc<dyn SignalSource>>,
    pub authn: Arc<dyn Authenticator>,
    pub authz: Arc<dyn Authorizer>,
    /// KubeletFineGrainedAuthz.
    pub fine_grained_authz: bool,
    pub debugging_handlers: bool,
    /// Families read at scrape time (process, eBPF programs, node name).
    extra: Registry,
    /// /metrics/probes (prober_probe_total, fed by the prober).
    probes: Registry,
    /// Bodies encoded from the latest stats pass, by endpoint and variant:
    /// a pass is encoded once, however many scrapers ask.
    encoded: parking_lot::Mutex<EncodedBodies>,
    /// exec, attach, port-forward (the runtime's streaming calls are set
    /// with [`streaming::Streaming::set_runtime`]).
    pub streaming: streaming::Streaming,
    /// Set by the first /metrics/cadvisor request.
    cadvisor_scraped: std::sync::atomic::AtomicBool,
    /// The configuration in effect after reloads (/configz).
    running: Option<watch::Receiver<Arc<Config>>>,
    /// The mounted claims' usage, for the summary's PVC entries.
    volumes: Option<Arc<dyn VolumeStates>>,
    /// Open `/containerLogs?follow=true` streams per user.
    follows: log_route::Follows,
    client_ca: Option<Arc<tls::ClientCa>>,
    serving: Option<Arc<crate::certs::Manager>>,
}

/// Encoded bodies by (endpoint, variant), with the stats pass they encode.
type EncodedBodies = std::collections::HashMap<(&'static str, u8), (k8s_openapi::jiff::Timestamp, Bytes)>;

/// The authenticator and authorizer of the :10250 server.
pub type AuthPair = (Arc<dyn Authenticator>, Arc<dyn Authorizer>);

/// The pieces a [`Server`] is built from.
pub struct ServerParts {
    pub node_name: String,
    pub config: Arc<Config>,
    pub pods: Arc<dyn PodView>,
    pub stats: Arc<StatsProvider>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<HealthChecks>,
    pub events: DebugEvents,
    pub runtime: Option<Arc<dyn RuntimeService>>,
    pub source: Option<Arc<dyn SignalSource>>,
    pub ebpf: Option<Arc<crate::signals::ebpf::EbpfSource>>,
    pub authn: Arc<dyn Authenticator>,
    pub authz: Arc<dyn Authorizer>,
    /// The prober's registry for /metrics/probes.
    pub probes: Registry,
    /// The desired and mounted volumes (volume_manager_total_volumes).
    pub volumes: Option<Arc<dyn VolumeStates>>,
    /// The configuration in effect after reloads, for /configz (None: `config`).
    pub running: Option<watch::Receiver<Arc<Config>>>,
    /// `--client-ca-file`, followed (the same one `auth_from_config` got).
    pub client_ca: Option<Arc<tls::ClientCa>>,
    /// The serving certificate's manager with serverTLSBootstrap.
    pub serving: Option<Arc<crate::certs::Manager>>,
    /// The certificate managers' metrics (kubelet_certificate_manager_*).
    pub certificates: crate::certs::CertificateMetrics,
}

impl Server {
    pub fn new(p: ServerParts) -> Server {
        let mut extra = Registry::default();
        extra.register_collector(Box::new(collectors::ProcessCollector));
        if let Some(e) = p.ebpf {
            extra.register_collector(Box::new(collectors::EbpfProgramCollector(e)));
        }
        if let Some(v) = p.volumes.clone() {
            extra.register_collector(Box::new(crate::metrics::storage::VolumeManagerCollector(v)));
        }
        let node: Family<NodeLabels, Gauge> = Family::default();
        node.get_or_create(&NodeLabels { node: p.node_name.clone() }).set(1);
        extra.register("kubelet_node_name", "[ALPHA] The node's name. The count is always 1.", node);
        extra.register_collector(Box::new(p.certificates));
        let k = &p.config.kubelet;
        Server {
            fine_grained_authz: k.feature_gates.get("KubeletFineGrainedAuthz").copied().unwrap_or(true),
            debugging_handlers: k.enable_debugging_handlers,
            node_name: p.node_name,
            config: p.config,
            pods: p.pods,
            stats: p.stats,
            metrics: p.metrics,
            health: p.health,
            events: p.events,
            runtime: p.runtime,
            source: p.source,
            authn: p.authn,
            authz: p.authz,
            extra,
            probes: p.probes,
            encoded: Default::default(),
            streaming: Default::default(),
            cadvisor_scraped: Default::default(),
            running: p.running,
            volumes: p.volumes,
            follows: Default::default(),
            client_ca: p.client_ca,
            serving: p.serving,
        }
    }

    /// The secure port's handler: authenticate, authorize, route.
    pub async fn handle_secure(self: Arc<Self>, req: Request<Incoming>, conn: ConnInfo) -> Response<Body> {
        let path = req.uri().path().to_owned();
        let token = req.headers().get(AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let creds =
            Credentials { client_certs: &conn.client_certs, bearer_token: auth::bearer_token(token.as_deref()) };
        let outcome = auth::check(
            self.authn.as_ref(),
            self.authz.as_ref(),
            &creds,
            req.method(),
            &path,
            &self.node_name,
            self.fine_grained_authz,
        )
        .await;
        match outcome {
            Outcome::Allowed(user) => self.route(req, Some(&user.name)).await,
            Outcome::Unauthorized => http::text(StatusCode::UNAUTHORIZED, "Unauthorized"),
            Outcome::TooManyRequests => {
                let mut r = http::text(StatusCode::TOO_MANY_REQUESTS, "Too many requests, please try again later.\n");
                r.headers_mut().insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
                r
            }
            Outcome::Forbidden(msg) => http::text(StatusCode::FORBIDDEN, msg),
            Outcome::Error(msg) => http::text(StatusCode::INTERNAL_SERVER_ERROR, msg),
        }
    }

    /// The read-only port's handler: no authentication, so, as the
    /// kubelet's read-only server, only the default handlers (pods, stats,
    /// metrics, healthz), never configz, logs or debugging.
    pub async fn handle_read_only(self: Arc<Self>, req: Request<Incoming>, _conn: ConnInfo) -> Response<Body> {
        let path = req.uri().path();
        if path == "/configz"
            || path.starts_with("/containerLogs")
            || path.starts_with("/debug")
            || streaming::request::kind_of(path).is_some()
        {
            return http::not_found();
        }
        self.route(req, None).await
    }

    /// The unix socket's handler (no authentication: file permissions).
    pub async fn handle_local(self: Arc<Self>, req: Request<Incoming>, _conn: ConnInfo) -> Response<Body> {
        let path = req.uri().path();
        if req.method() != Method::GET {
            return method_not_allowed();
        }
        if path == "/debug/events" {
            return self.debug_events();
        }
        if auth::subresources(path, true).first() == Some(&"healthz") {
            return self.healthz(&req);
        }
        http::not_found()
    }

    fn healthz(&self, req: &Request<Incoming>) -> Response<Body> {
        let (status, body) = self.health.answer(req.uri().path(), &http::query_pairs(req.uri().query()));
        let mut r = http::text(status, body);
        r.headers_mut().insert("x-content-type-options", HeaderValue::from_static("nosniff"));
        r
    }

    /// `user`: who was authenticated (None on the read-only port).
    async fn route(&self, req: Request<Incoming>, user: Option<&str>) -> Response<Body> {
        let path = req.uri().path().to_owned();
        if streaming::request::kind_of(&path).is_some() {
            if !self.debugging_handlers {
                return debug_disabled();
            }
            return streaming::serve(self, req).await;
        }
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return method_not_allowed();
        }
        let query = http::query_pairs(req.uri().query());
        match path.as_str() {
            "/pods" | "/pods/" => self.pod_list(),
            "/configz" => {
                let configz = match &self.running {
                    Some(r) => r.borrow().configz(),
                    None => self.config.configz(),
                };
                http::json(StatusCode::OK, &configz)
            }
            "/stats/summary" | "/stats/summary/" => self.summary(&query).await,
            "/metrics" | "/metrics/resource" | "/metrics/cadvisor" | "/metrics/probes" | "/metrics/slis" => {
                self.metrics_route(&path).await
            }
            "/debug/events" if self.debugging_handlers => self.debug_events(),
            p if p.starts_with("/healthz") && auth::subresources(p, true).first() == Some(&"healthz") => {
                self.healthz(&req)
            }
            p if p.starts_with("/containerLogs/") => {
                if !self.debugging_handlers {
                    return debug_disabled();
                }
                self.container_logs(p, &query, user.unwrap_or(auth::ANONYMOUS_USER)).await
            }
            "/debug/events" => debug_disabled(),
            _ => http::not_found(),
        }
    }

    fn pod_list(&self) -> Response<Body> {
        let list = serde_json::json!({
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {},
            "items": self.pods.pods(),
        });
        http::json(StatusCode::OK, &list)
    }

    async fn summary(&self, query: &[(String, String)]) -> Response<Body> {
        let snap = self.stats.latest().await;
        // metrics-server's older query: only CPU and memory.
        let only = query.iter().any(|(k, v)| k == "only_cpu_and_memory" && v == "true");
        let claims = if only { vec![] } else { self.volumes.as_ref().map(|v| v.claim_stats()).unwrap_or_default() };
        let body = self.encoded("summary", u8::from(only), &snap, || {
            let mut s = summary_body(&snap, only);
            summary::add_claims(&mut s, &claims);
            serde_json::to_vec(&s).unwrap_or_default()
        });
        http::respond(StatusCode::OK, "application/json", body)
    }
}

/// The Summary of a stats pass, optionally only CPU and memory.
fn summary_body(snap: &stats::StatsSnapshot, only_cpu_and_memory: bool) -> summary::Summary {
    let mut s = summary::summary(snap);
    if only_cpu_and_memory {
        s.node.network = None;
        s.node.fs = None;
        s.node.runtime = None;
        s.node.rlimit = None;
        for p in &mut s.pods {
            p.network = None;
            p.volume_stats.clear();
            p.ephemeral_storage = None;
            p.process_stats = None;
            for c in &mut p.containers {
                c.rootfs = None;
                c.logs = None;
            }
        }
    }
    s
}

impl Server {
    fn debug_events(&self) -> Response<Body> {
        let mut rx = self.events.subscribe();
        let (tx, body) = http::channel(256);
        tokio::spawn(async move {
            loop {
                let line = match rx.recv().await {
                    Ok(e) => match serde_json::to_vec(&*e) {
                        Ok(mut v) => {
                            v.push(b'\n');
                            v
                        }
                        Err(_) => continue,
                    },
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        format!("{{\"type\":\"lagged\",\"missed\":{n}}}\n").into_bytes()
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                };
                if tx.send(Bytes::from(line)).await.is_err() {
                    break;
                }
            }
        });
        let mut r = Response::new(body);
        r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/jsonl"));
        r
    }
}

fn method_not_allowed() -> Response<Body> {
    http::text(StatusCode::METHOD_NOT_ALLOWED, "405: Method Not Allowed")
}

fn debug_disabled() -> Response<Body> {
    http::text(StatusCode::METHOD_NOT_ALLOWED, "Debug endpoints are disabled.")
}

/// The authenticator and authorizer the configuration asks for. `client`
/// is the API server connection (None in standalone mode: webhook
/// authentication then rejects tokens, webhook authorization allows
/// nothing, and both say so in the log).
pub fn auth_from_config(
    config: &Config,
    client: Option<kube::Client>,
    client_ca: Option<Arc<tls::ClientCa>>,
) -> Result<AuthPair, ServerError> {
    let a = &config.kubelet.authentication;
    let x509: Option<Arc<dyn Authenticator>> =
        client_ca.map(|ca| Arc::new(auth::X509Authenticator::following(ca)) as Arc<dyn Authenticator>);
    let token: Option<Arc<dyn Authenticator>> = match (&client, a.webhook_enabled) {
        (Some(c), true) => {
            let l = &config.swiftlet.server;
            let limits = webhook::ReviewLimits { qps: l.token_review_qps, burst: l.token_review_burst };
            Some(Arc::new(webhook::TokenReviewAuthenticator::new(c.clone(), a.webhook_cache_ttl, limits)))
        }
        (None, true) => {
            warn!("authentication.webhook.enabled but no API server (standalone): bearer tokens are rejected");
            None
        }
        _ => None,
    };
    let authn: Arc<dyn Authenticator> =
        Arc::new(auth::KubeletAuthenticator { x509, token, anonymous: a.anonymous_enabled });
    let z = &config.kubelet.authorization;
    let authz: Arc<dyn Authorizer> = match (z.mode, client) {
        (AuthorizationMode::AlwaysAllow, _) => Arc::new(auth::AlwaysAllow),
        (AuthorizationMode::Webhook, Some(c)) => Arc::new(webhook::SubjectAccessReviewAuthorizer::new(
            c,
            z.webhook_cache_authorized_ttl,
            z.webhook_cache_unauthorized_ttl,
        )),
        (AuthorizationMode::Webhook, None) => {
            warn!(
                "authorization.mode is Webhook but there is no API server (standalone): every request to :{} is refused with 403; use --authorization-mode=AlwaysAllow for a standalone node",
                config.kubelet.port
            );
            Arc::new(auth::Unavailable("no API server to ask (standalone mode)".into()))
        }
    };
    Ok((authn, authz))
}

/// `--client-ca-file`, loaded (None without one).
pub fn client_ca(config: &Config) -> Result<Option<Arc<tls::ClientCa>>, ServerError> {
    Ok(config.kubelet.authentication.client_ca_file.as_deref().map(tls::ClientCa::load).transpose()?)
}

/// The unix socket of `swiftlet events` under the root dir.
pub fn debug_socket_path(root_dir: &Path) -> PathBuf {
    root_dir.join("swiftlet").join("debug.sock")
}

/// The running servers.
pub struct Servers {
    pub healthz: Option<SocketAddr>,
    pub secure: Option<SocketAddr>,
    /// The unauthenticated HTTP port (`readOnlyPort`), when not 0.
    pub read_only: Option<SocketAddr>,
    pub debug_socket: Option<PathBuf>,
    tasks: Vec<JoinHandle<()>>,
}

impl Servers {
    /// Waits for the servers to stop (after shutdown turned true).
    pub async fn join(self) {
        for t in self.tasks {
            let _ = t.await;
        }
        if let Some(p) = &self.debug_socket {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The connection limits of a listener, from swiftlet's --server-* flags
/// and the open-file limit in effect.
fn limits(config: &Config) -> conn::Limits {
    let l = &config.swiftlet.server;
    conn::Limits {
        max_connections: conn::effective_cap(l.max_connections, conn::open_file_limit()),
        request_header_timeout: l.request_header_timeout,
        idle_timeout: l.idle_timeout,
        write_timeout: l.write_timeout,
    }
}

async fn bind(ip: IpAddr, port: u16) -> Result<TcpListener, ServerError> {
    let addr = SocketAddr::new(ip, port);
    TcpListener::bind(addr).await.map_err(|source| ServerError::Listen { addr, source })
}

/// Starts :10248, :10250 (unless `enableServer` is false) and the debug
/// socket, and the stats sampling loop. All stop when `shutdown` is cancelled.
pub async fn start(server: Arc<Server>, shutdown: CancellationToken) -> Result<Servers, ServerError> {
    let k = &server.config.kubelet;
    let mut tasks = vec![];
    tasks.push(tokio::spawn(server.stats.clone().run(shutdown.clone())));
    tasks.push(tokio::spawn(server.clone().warm(shutdown.clone())));
    let mut healthz = None;
    if k.healthz_port != 0 {
        let l = bind(k.healthz_bind_address, k.healthz_port).await?;
        healthz = l.local_addr().ok();
        let health = server.health.clone();
        let handler = move |req: Request<Incoming>, _conn: ConnInfo| {
            let health = health.clone();
            async move {
                let path = req.uri().path();
                if req.method() != Method::GET && req.method() != Method::HEAD {
                    return method_not_allowed();
                }
                if path != "/healthz" && !path.starts_with("/healthz/") {
                    return http::not_found();
                }
                let (status, body) = health.answer(path, &http::query_pairs(req.uri().query()));
                http::text(status, body)
            }
        };
        let conns = conn::Connections::new(limits(&server.config));
        tasks.push(tokio::spawn(listen::serve(l, conns, None, handler, shutdown.clone())));
        info!("healthz listening on http://{}/healthz", healthz.map(|a| a.to_string()).unwrap_or_default());
    }
    let mut secure = None;
    if k.enable_server {
        let tls = server.tls_config(&shutdown, &mut tasks)?;
        let l = bind(k.address, k.port).await?;
        secure = l.local_addr().ok();
        let s = server.clone();
        let handler = move |req, conn| s.clone().handle_secure(req, conn);
        let conns = conn::Connections::new(limits(&server.config));
        info!(max_connections = conns.limits.max_connections, "kubelet API connection cap");
        tasks.push(tokio::spawn(listen::serve(l, conns, Some(tls), handler, shutdown.clone())));
        info!("kubelet API listening on https://{}", secure.map(|a| a.to_string()).unwrap_or_default());
    }
    let mut read_only = None;
    if k.enable_server && k.read_only_port != 0 {
        let l = bind(k.address, k.read_only_port).await?;
        read_only = l.local_addr().ok();
        let s = server.clone();
        let handler = move |req, conn| s.clone().handle_read_only(req, conn);
        let conns = conn::Connections::new(limits(&server.config));
        tasks.push(tokio::spawn(listen::serve(l, conns, None, handler, shutdown.clone())));
        info!("read-only kubelet API listening on http://{}", read_only.map(|a| a.to_string()).unwrap_or_default());
    }
    let sock = debug_socket_path(&server.config.flags.root_dir);
    let mut debug_socket = None;
    match bind_unix(&sock) {
        Ok(l) => {
            let s = server.clone();
            let handler = move |req, conn| s.clone().handle_local(req, conn);
            let conns = conn::Connections::new(limits(&server.config));
            tasks.push(tokio::spawn(listen::serve(l, conns, None, handler, shutdown.clone())));
            debug_socket = Some(sock);
        }
        // The node's tools then attach by themselves; the agent runs on.
        Err(e) => warn!("{e}"),
    }
    Ok(Servers { healthz, secure, read_only, debug_socket, tasks })
}

fn bind_unix(path: &Path) -> Result<tokio::net::UnixListener, ServerError> {
    let err = |source| ServerError::ListenUnix { path: path.to_owned(), source };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(err)?;
    }
    // A socket left by an earlier run: nobody listens on it any more
    // (connecting fails), so it can go.
    if path.exists() && std::os::unix::net::UnixStream::connect(path).is_err() {
        let _ = std::fs::remove_file(path);
    }
    let l = tokio::net::UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    Ok(l)
}
