//! The API server side of the agent (not in standalone mode): the kube-rs
//! client, the Node (see `node/`), the pod watch feeding the pod manager,
//! the status manager, mirror pods for static pods, and events.
//!
//! [`ApiAgent`] is built with the agent, before the client exists, so its
//! seams can be connected at once: `status_reporter()` and
//! `event_recorder()` for the pod workers and eviction, `connect_pods()`
//! for the pod manager, `mirror_sink()` for the static pod source, and
//! `connect_pressure()` for the eviction manager's conditions. `run`
//! connects (bootstrapping a client certificate if needed) and starts
//! everything; what was reported before is written then.

pub mod bootstrap;
pub mod client;
pub mod instrument;
pub mod mirror;
pub mod pod_api;
pub mod pod_watch;
pub mod ratelimit;
pub mod recorder;
pub mod runtime_class;
pub mod status;

pub use crate::smp;
use std::{
    collections::BTreeSet,
    path::PathBuf,
    sync::{Arc, OnceLock},
    time::Duration,
};

use thiserror::Error;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::info;

use self::{
    client::ClientSettings, mirror::MirrorPods, pod_api::KubePodApi, pod_watch::LatchSink, recorder::ApiEventRecorder,
    status::StatusManager,
};
use crate::{
    certs::{
        Manager, SwappableClient,
        csr::{CsrApi, Kind, KubeCsrApi, Template},
        store::FileStore,
    },
    cm::allocatable::NodeAllocatable,
    config::Config,
    cri::{ImageService, RuntimeService},
    events::{EventRecorder, EventType},
    eviction::signal::NodeCondition,
    node::{NodeAgent, NodeInputs, NodeSettings, lease},
    pods::source::{PodSink, StatusReporter},
};

pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";
pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";

#[derive(Debug, Error)]
pub enum ApiError {
    #[error("kubeconfig {}: {message}", path.display())]
    Kubeconfig { path: PathBuf, message: String },
    #[error("API client: {0}")]
    Client(String),
    #[error("TLS bootstrap: {0}")]
    Bootstrap(String),
}

/// What is handed the client when the agent connects.
type ConnectHook = Box<dyn FnOnce(kube::Client) + Send>;

/// Everything that talks to the API server.
pub struct ApiAgent {
    pub node_name: String,
    client_settings: ClientSettings,
    pub node: NodeAgent,
    event_qps: (u32, u32),
    pub recorder: Arc<ApiEventRecorder>,
    pub status: Arc<StatusManager>,
    pods: Arc<LatchSink>,
    pub mirrors: Arc<MirrorPods>,
    pressure: watch::Sender<Option<watch::Receiver<BTreeSet<NodeCondition>>>>,
    shutdown_phase: watch::Sender<Option<watch::Receiver<crate::shutdown::Phase>>>,
    devices: watch::Sender<Option<watch::Receiver<crate::deviceplugin::devices::ExtendedResources>>>,
    volumes_in_use: watch::Sender<Option<watch::Receiver<Vec<String>>>>,
    client: OnceLock<kube::Client>,
    /// Called with the client once connected, before the pod watch starts.
    on_connect: parking_lot::Mutex<Vec<ConnectHook>>,
    /// The connection every client of the agent goes through (replaced
    /// when the client certificate rotates).
    connection: SwappableClient,
    /// kubeAPIQPS/kubeAPIBurst, in front of the agent's client.
    limiter: Arc<ratelimit::RateLimiter>,
    /// The agent's client (built on first use: a kube client needs the
    /// runtime, `new` may run outside it).
    limited: OnceLock<kube::Client>,
    /// The webhooks' client: the node's current credentials, but not the
    /// kubeAPIQPS bucket the Lease and node status wait on.
    reviews: OnceLock<kube::Client>,
    /// rotateCertificates: the client certificate's manager.
    pub client_certificate: Option<Arc<Manager>>,
    /// serverTLSBootstrap: the serving certificate's manager.
    pub serving_certificate: Option<Arc<Manager>>,
    /// How often unwritten statuses and mirror pods are retried.
    pub resync: Duration,
}

impl ApiAgent {
    pub fn new(config: &Config, node_name: &str, allocatable: &NodeAllocatable) -> ApiAgent {
        let k = &config.kubelet;
        let recorder = Arc::new(ApiEventRecorder::new(node_name, k.event_record_qps, k.event_burst));
        let settings = NodeSettings::from_config(config, node_name, allocatable);
        let connection = SwappableClient::default();
        let limiter = Arc::new(ratelimit::RateLimiter::new(f64::from(k.kube_api_qps), k.kube_api_burst));
        let client_certificate = k.rotate_certificates.then(|| {
            let store = FileStore::new(&config.flags.cert_dir, Kind::Client.prefix());
            Arc::new(Manager::new(Kind::Client, store, Template::node(node_name)))
        });
        // serverTLSBootstrap, with the RotateKubeletServerCertificate gate
        // (on by default) as the kubelet requires it.
        let rotate_serving = k.feature_gates.get("RotateKubeletServerCertificate").copied().unwrap_or(true);
        let serving_certificate = (k.server_tls_bootstrap && rotate_serving).then(|| {
            let mut store = FileStore::new(&config.flags.cert_dir, Kind::Serving.prefix());
            store.cert_file = k.tls_cert_file.clone();
            store.key_file = k.tls_private_key_file.clone();
            let addresses = crate::node::info::node_addresses(&settings.node_ips, &settings.registration.hostname);
            Arc::new(Manager::new(Kind::Serving, store, serving_template(node_name, &addresses)))
        });
        ApiAgent {
            node_name: node_name.into(),
            client_settings: ClientSettings::from_config(config, node_name),
            node: NodeAgent::new(settings, recorder.clone()),
            event_qps: (k.event_record_qps, k.event_burst),
            recorder,
            status: Arc::new(StatusManager::default()),
            pods: Arc::new(LatchSink::default()),
            mirrors: Arc::new(MirrorPods::new(node_name, k.static_pod_path.is_some())),
            pressure: watch::channel(None).0,
            shutdown_phase: watch::channel(None).0,
            devices: watch::channel(None).0,
            volumes_in_use: watch::channel(None).0,
            client: OnceLock::new(),
            on_connect: Default::default(),
            connection,
            limiter,
            limited: OnceLock::new(),
            reviews: OnceLock::new(),
            client_certificate,
            serving_certificate,
            resync: status::RESYNC,
        }
    }

    /// Pod status changes → the API server.
    pub fn status_reporter(&self) -> Arc<dyn StatusReporter> {
        self.status.clone()
    }

    /// Events → the API server (deduplicated, rate-limited).
    pub fn event_recorder(&self) -> Arc<dyn EventRecorder> {
        self.recorder.clone()
    }

    /// Where the API's pods for this node go (the pod manager); it gets
    /// the latest snapshot at once.
    pub fn connect_pods(&self, sink: Arc<dyn PodSink>) {
        self.pods.connect(sink);
    }

    /// The latest snapshot of API pods (for tests and /pods before the pod
    /// manager is connected).
    pub fn api_pods(&self) -> Option<crate::pods::source::PodSnapshot> {
        self.pods.latest()
    }

    /// Give it the static pod source's snapshots: it keeps their mirror pods.
    pub fn mirror_sink(&self) -> Arc<dyn PodSink> {
        self.mirrors.clone()
    }

    /// The eviction manager's node conditions (`EvictionManager::conditions()`).
    pub fn connect_pressure(&self, conditions: watch::Receiver<BTreeSet<NodeCondition>>) {
        self.pressure.send_replace(Some(conditions));
    }

    /// The graceful node shutdown's phase (`NodeShutdownManager::shutting_down()`):
    /// the node turns NotReady while it is not Idle.
    pub fn connect_shutdown(&self, phase: watch::Receiver<crate::shutdown::Phase>) {
        self.shutdown_phase.send_replace(Some(phase));
    }

    /// The device manager's extended resources
    /// (`DeviceManager::extended_resources()`): node status reports them.
    pub fn connect_devices(&self, resources: watch::Receiver<crate::deviceplugin::devices::ExtendedResources>) {
        self.devices.send_replace(Some(resources));
    }

    /// The volume manager's attachable volumes in use
    /// (`VolumeManager::volumes_in_use()`): node status reports them.
    pub fn connect_volumes(&self, in_use: watch::Receiver<Vec<String>>) {
        self.volumes_in_use.send_replace(Some(in_use));
    }

    /// Runs `hook` with the client once `run` has connected, before the
    /// pod watch starts (register before `run`).
    pub fn on_connect(&self, hook: impl FnOnce(kube::Client) + Send + 'static) {
        self.on_connect.lock().push(Box::new(hook));
    }

    /// The client, once `run` has connected.
    pub fn client(&self) -> Option<kube::Client> {
        self.client.get().cloned()
    }

    /// The webhooks' client: usable at once (its requests fail until `run`
    /// has connected), always with the node's current credentials. Called
    /// within the runtime.
    pub fn review_client(&self) -> kube::Client {
        self.reviews.get_or_init(|| self.connection.client_with(tower::layer::util::Identity::new())).clone()
    }

    /// The agent's client, paced by kubeAPIQPS/kubeAPIBurst. Called within
    /// the runtime.
    fn limited(&self) -> kube::Client {
        self.limited
            .get_or_init(|| self.connection.client_with(ratelimit::RateLimitLayer(self.limiter.clone())))
            .clone()
    }

    /// Connects with the kubeconfig, or with the current client
    /// certificate when it rotates; follows each rotation.
    async fn connect(&self, shutdown: &CancellationToken) -> Result<(), ApiError> {
        let cfg = client::prepare(&self.client_settings).await?;
        let Some(manager) = self.client_certificate.clone() else {
            self.connection.set(client::unlimited(cfg)?);
            return Ok(());
        };
        manager.adopt_stored();
        let store_file = manager.store().current_path();
        let mut current = manager.current();
        let initial = if current.borrow_and_update().is_some() {
            client::with_identity(cfg.clone(), &store_file)
        } else {
            // No stored pair (a kubeconfig with its own credentials): they
            // ask for the first one, which replaces them.
            cfg.clone()
        };
        self.connection.set(client::unlimited(initial)?);
        let connection = self.connection.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    r = current.changed() => if r.is_err() { return },
                    _ = stop.cancelled() => return,
                }
                match client::unlimited(client::with_identity(cfg.clone(), &store_file)) {
                    Ok(c) => {
                        connection.set(c);
                        info!("API client now uses the rotated client certificate");
                    }
                    Err(e) => tracing::warn!("the rotated client certificate cannot be used yet: {e}"),
                }
            }
        });
        let api: Arc<dyn CsrApi> = Arc::new(KubeCsrApi(self.review_client()));
        tokio::spawn(manager.run(api, shutdown.clone()));
        Ok(())
    }

    /// Connects and runs every API loop until `shutdown`.
    pub async fn run(
        self: Arc<Self>,
        runtime: Arc<dyn RuntimeService>,
        images: Arc<dyn ImageService>,
        frequencies: watch::Receiver<crate::reload::LiveSettings>,
        shutdown: CancellationToken,
    ) -> Result<(), ApiError> {
        self.connect(&shutdown).await?;
        if let Some(m) = self.serving_certificate.clone() {
            let api: Arc<dyn CsrApi> = Arc::new(KubeCsrApi(self.limited()));
            tokio::spawn(m.run(api, shutdown.clone()));
        }
        let client = self.limited();
        let _ = self.client.set(client.clone());
        // What pods read from the API (their volumes' objects, RuntimeClasses)
        // is connected before the first API pod arrives.
        let hooks: Vec<ConnectHook> = std::mem::take(&mut *self.on_connect.lock());
        for hook in hooks {
            hook(client.clone());
        }
        info!(node = self.node_name, qps = self.event_qps.0, "connected to the API server");
        self.recorder.record(
            &recorder::node_ref(&self.node_name),
            EventType::Normal,
            "Starting",
            &format!("Starting swiftlet v{}.", env!("CARGO_PKG_VERSION")),
        );
        let pods_api: Arc<dyn pod_api::PodApi> =
            Arc::new(KubePodApi { client: client.clone(), timeout: Duration::from_secs(10) });
        let inputs = NodeInputs {
            runtime,
            images,
            pressure: self.pressure.subscribe(),
            shutdown: self.shutdown_phase.subscribe(),
            frequencies,
            devices: self.devices.subscribe(),
            volumes_in_use: self.volumes_in_use.subscribe(),
        };
        let sink: Arc<dyn recorder::EventSink> = Arc::new(recorder::KubeEventSink(client.clone()));
        let pods_sink: Arc<dyn PodSink> = self.pods.clone();
        tokio::join!(
            self.recorder.run(sink, shutdown.clone()),
            self.node.run(client.clone(), inputs, shutdown.clone()),
            lease::run(
                client.clone(),
                self.node_name.clone(),
                self.node.settings.lease_duration_seconds,
                self.node.node_uid(),
                shutdown.clone()
            ),
            pod_watch::run(client.clone(), &self.node_name, pods_sink, self.mirrors.clone(), shutdown.clone()),
            self.status.run(pods_api.clone(), self.resync, shutdown.clone()),
            self.mirrors.run(pods_api, self.node.node_uid(), self.resync, shutdown.clone()),
        );
        info!("API loops stopped");
        Ok(())
    }
}

/// The serving certificate's subject and names: the node's identity, its
/// IPs, and its host name unless that is an IP too (the kubelet's
/// addressesToHostnamesAndIPs, sorted).
pub fn serving_template(node_name: &str, addresses: &[k8s_openapi::api::core::v1::NodeAddress]) -> Template {
    let mut t = Template::node(node_name);
    for a in addresses {
        match a.address.parse::<std::net::IpAddr>() {
            Ok(ip) if !t.ips.contains(&ip) => t.ips.push(ip),
            Ok(_) => {}
            Err(_) if a.type_ != "InternalIP" && a.type_ != "ExternalIP" && !t.dns_names.contains(&a.address) => {
                t.dns_names.push(a.address.clone())
            }
            Err(_) => {}
        }
    }
    t.ips.sort_by_key(|ip| ip.to_string());
    t.dns_names.sort();
    t
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::NodeAddress;

    use super::*;

    #[test]
    fn serving_names_are_the_nodes_ips_and_host_name() {
        let a = |t: &str, v: &str| NodeAddress { type_: t.into(), address: v.into() };
        let t = serving_template(
            "n1",
            &[
                a("InternalIP", "192.0.2.1"),
                a("Hostname", "n1.example"),
                a("InternalIP", "10.0.0.5"),
                a("ExternalIP", "10.0.0.5"),
                // A host name that is an IP counts as an IP.
                a("Hostname", "10.0.0.6"),
                a("InternalIP", "not-an-ip"),
            ],
        );
        assert_eq!(t.common_name, "system:node:n1");
        assert_eq!(t.organizations, vec!["system:nodes".to_owned()]);
        let ips: Vec<String> = t.ips.iter().map(|ip| ip.to_string()).collect();
        assert_eq!(ips, vec!["10.0.0.5", "10.0.0.6", "192.0.2.1"]);
        assert_eq!(t.dns_names, vec!["n1.example".to_owned()]);
    }
}
