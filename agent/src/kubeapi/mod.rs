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
pub mod smp;
pub mod status;

use std::{
    collections::BTreeSet,
    path::PathBuf,
    sync::{Arc, OnceLock},
    time::Duration,
};

use thiserror::Error;
use tokio::sync::watch;
use tracing::info;

use self::{
    client::ClientSettings, mirror::MirrorPods, pod_api::KubePodApi, pod_watch::LatchSink, recorder::ApiEventRecorder,
    status::StatusManager,
};
use crate::{
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
    client: OnceLock<kube::Client>,
    /// How often unwritten statuses and mirror pods are retried.
    pub resync: Duration,
}

impl ApiAgent {
    pub fn new(config: &Config, node_name: &str, allocatable: &NodeAllocatable) -> ApiAgent {
        let k = &config.kubelet;
        let recorder = Arc::new(ApiEventRecorder::new(node_name, k.event_record_qps, k.event_burst));
        let settings = NodeSettings::from_config(config, node_name, allocatable);
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
            client: OnceLock::new(),
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

    /// The client, once `run` has connected.
    pub fn client(&self) -> Option<kube::Client> {
        self.client.get().cloned()
    }

    /// Connects and runs every API loop until `shutdown`.
    pub async fn run(
        self: Arc<Self>,
        runtime: Arc<dyn RuntimeService>,
        images: Arc<dyn ImageService>,
        frequencies: watch::Receiver<crate::reload::LiveSettings>,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), ApiError> {
        let client = client::connect(&self.client_settings).await?;
        let _ = self.client.set(client.clone());
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
