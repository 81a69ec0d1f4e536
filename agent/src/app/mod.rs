//! The composition root: builds every manager from the effective
//! configuration, connects them through their traits, runs them until
//! shutdown, and stops them in order.
//!
//! Components expose a constructor and a `run(shutdown)` future; this
//! module is the only place that knows all of them. Stopping the agent
//! leaves the pods running (as the kubelet): a restarted agent re-adopts
//! them.

use std::{sync::Arc, time::Duration};

use parking_lot::Mutex;
use thiserror::Error;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::{
    cgroups::{CgroupError, CgroupFs},
    cm::{allocatable::NodeAllocatable, manager::CmError, pod_cgroups::PodCgroups},
    config::Config,
    cri::{CriClient, CriError},
    events::EventRecorder,
    eviction::driver::{EvictionLoop, EvictionManager},
    gc::ContainerGc,
    images::ImageGc,
    kubeapi::{ApiAgent, ApiError},
    logs::ContainerLogManager,
    metrics::Metrics,
    pods::{manager::PodManager, metrics::PodMetrics},
    reload::LiveSettings,
    shutdown::NodeShutdownManager,
    signals::{OpenedSource, SignalError},
    volumes::VolumeManager,
};
// ---- server ----
use crate::server::{ServerError, events::DebugEvents, health::HealthChecks};
// ---- end server ----

mod build;
mod reload;
mod run;
pub mod serve;

pub use build::eviction_config;

#[derive(Debug, Error)]
pub enum StartError {
    #[error("cgroups: {0}")]
    Cgroup(#[from] CgroupError),
    #[error("container manager: {0}")]
    Cm(#[from] CmError),
    #[error("signals: {0}")]
    Signals(#[from] SignalError),
    #[error("container runtime: {0}")]
    Runtime(#[from] CriError),
    #[error("node capacity: {0}")]
    Capacity(std::io::Error),
    #[error("container logs: {0}")]
    Logs(#[from] crate::logs::LogError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("API server: {0}")]
    Api(#[from] ApiError),
    /// The host or configuration cannot run as configured (swap on,
    /// cgroup v1 refused, a credential provider configuration in error).
    #[error("{0}")]
    Refused(String),
    // ---- server ----
    #[error("kubelet server: {0}")]
    Server(#[from] ServerError),
    // ---- end server ----
}

/// How often the runtime is relisted (the kubelet's PLEG period).
const RELIST_PERIOD: Duration = Duration::from_secs(1);
/// How often the eviction manager re-ranks its victim plan.
const PLAN_INTERVAL: Duration = Duration::from_secs(1);

/// Everything the managers share, built once at start.
pub struct Agent {
    pub config: Config,
    pub node_name: String,
    pub metrics: Arc<Metrics>,
    pub pod_metrics: PodMetrics,
    pub cgroupfs: CgroupFs,
    pub pod_cgroups: PodCgroups,
    pub allocatable: NodeAllocatable,
    pub signals: OpenedSource,
    pub cri: Arc<CriClient>,
    pub recorder: Arc<dyn EventRecorder>,
    pub pods: PodManager,
    pub eviction: EvictionManager,
    pub image_gc: Arc<ImageGc>,
    pub container_gc: Arc<ContainerGc>,
    pub logs: Arc<ContainerLogManager>,
    pub volumes: Arc<VolumeManager>,
    /// Graceful node shutdown; its phase is the node's NotReady signal.
    pub node_shutdown: Arc<NodeShutdownManager>,
    /// Device plugins: registration, extended resources, Allocate.
    pub devices: Arc<crate::deviceplugin::DeviceManager>,
    /// The CSI drivers registered on this node (by the plugin watcher).
    pub csi_drivers: Arc<crate::volumes::csi::CsiDrivers>,
    /// `<root-dir>/plugins_registry`: CSI driver registration.
    pub plugin_watcher: Arc<crate::pluginwatcher::PluginWatcher>,
    /// The configuration in effect (the start one plus reloaded live fields),
    /// as /configz shows it.
    running: watch::Sender<Arc<Config>>,
    live: watch::Sender<LiveSettings>,
    log_level: Mutex<Option<LogLevelHook>>,
    eviction_loop: Mutex<Option<EvictionLoop>>,
    shutdown: CancellationToken,
    // ---- API server ----
    /// Node, Lease, API pods, pod statuses, mirror pods and events; None in
    /// standalone mode.
    pub api: Option<Arc<ApiAgent>>,
    // ---- end API server ----
    // ---- server ----
    /// /healthz checks: `ping` and `runtime` are registered by the server;
    /// the pod manager may register `syncloop` (a `server::health::Heartbeat`).
    pub health: Arc<HealthChecks>,
    /// /debug/events: the eviction manager's signal events and evictions.
    pub debug_events: DebugEvents,
    // ---- end server ----
    // ---- pod fields ----
    /// RuntimeClasses for the pod workers (from the API server once it
    /// answers).
    pub runtime_classes: crate::pods::runtime_class::RuntimeClasses,
    // ---- end pod fields ----
}

/// Sets the log verbosity (`--v`) of the running agent.
pub type LogLevelHook = Box<dyn Fn(u32) + Send + Sync>;
