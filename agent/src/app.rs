//! The composition root: builds every manager from the effective
//! configuration, connects them through their traits, runs them until
//! shutdown, and stops them in order.
//!
//! Components expose a constructor and a `run(shutdown)` future; this
//! module is the only place that knows all of them.

use std::{sync::Arc, time::Duration};

use thiserror::Error;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::{
    cgroups::{CgroupError, CgroupFs},
    cm::{
        allocatable::{NodeAllocatable, machine_capacity},
        hierarchy::{CmError, PodCgroups, kubepods_limits},
    },
    config::Config,
    cri::{CriClient, CriError, RuntimeService},
    metrics::Metrics,
    signals::{self, OpenedSource, SignalError, ebpf::EbpfOptions},
};
// ---- server (issue 8) ----
use crate::{
    pods::source::PodView,
    server::{NoPods, ServerError, events::DebugEvents, health::HealthChecks},
};
// ---- end server ----

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
    #[error("{0}")]
    Io(#[from] std::io::Error),
    // ---- server (issue 8) ----
    #[error("kubelet server: {0}")]
    Server(#[from] ServerError),
    // ---- end server ----
}

/// Everything the managers share, built once at start.
pub struct Agent {
    pub config: Config,
    pub node_name: String,
    pub metrics: Arc<Metrics>,
    pub cgroupfs: CgroupFs,
    pub pod_cgroups: PodCgroups,
    pub allocatable: NodeAllocatable,
    pub signals: OpenedSource,
    pub cri: Arc<CriClient>,
    // ---- server (issue 8) ----
    /// What /pods, /stats, /containerLogs and /debug/events see: the pod
    /// manager's view once it exists (set it in `build`).
    pub pod_view: Arc<dyn PodView>,
    /// /healthz checks: `ping` and `runtime` are registered; the pod
    /// manager registers `syncloop` (a `server::health::Heartbeat`).
    pub health: Arc<HealthChecks>,
    /// /debug/events: feed it `debug_events.forward(eviction.events())`
    /// and wrap the PodEvictor in `server::events::EvictionTap`.
    pub debug_events: DebugEvents,
    // ---- end server ----
}

impl Agent {
    /// Reads the machine, prepares the pods' cgroup hierarchy and opens the
    /// signal source and the runtime client. Nothing is started yet.
    pub fn build(config: Config) -> Result<Agent, StartError> {
        let node_name = config.node_name()?;
        let k = &config.kubelet;
        let cgroupfs = CgroupFs::detect()?;
        let capacity =
            machine_capacity(&config.flags.root_dir, k.max_pods, k.pods_per_core).map_err(StartError::Capacity)?;
        let allocatable = NodeAllocatable::new(capacity, k);
        let pod_cgroups = PodCgroups::from_config(cgroupfs.clone(), k);
        pod_cgroups.ensure_hierarchy(&kubepods_limits(&allocatable.kubepods))?;
        let ebpf_opts = EbpfOptions { kernel_eviction: config.swiftlet.kernel_eviction, ..Default::default() };
        let signals = signals::open(
            config.swiftlet.signal_source,
            cgroupfs.clone(),
            &ebpf_opts,
            config.swiftlet.housekeeping_interval,
        )?;
        let metrics = Arc::new(Metrics::new());
        let cri = Arc::new(
            CriClient::with_image_endpoint(
                &k.container_runtime_endpoint,
                k.image_endpoint(),
                k.runtime_request_timeout,
            )?
            .with_metrics(metrics.clone()),
        );
        // ---- server (issue 8) ----
        let pod_view: Arc<dyn PodView> = Arc::new(NoPods);
        let health = Arc::new(HealthChecks::new());
        let debug_events = DebugEvents::new(pod_view.clone());
        // ---- end server ----
        Ok(Agent {
            node_name,
            metrics,
            pod_view,
            health,
            debug_events,
            cgroupfs,
            pod_cgroups,
            allocatable,
            signals,
            cri,
            config,
        })
    }

    /// Runs until `shutdown` turns true.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) -> Result<(), StartError> {
        match self.cri.version().await {
            Ok(v) => info!(
                runtime = v.runtime_name,
                version = v.runtime_version,
                api = v.runtime_api_version,
                "container runtime"
            ),
            Err(e) => warn!("container runtime not reachable yet (retrying in the background): {e}"),
        }
        info!(
            node = self.node_name,
            mode = self.signals.source.mode().as_str(),
            standalone = self.config.standalone(),
            "swiftlet started"
        );
        // ---- server (issue 8): :10248, :10250 and the debug socket ----
        let servers = crate::server::agent::serve(&self, shutdown.clone()).await?;
        // ---- end server ----
        let mut tick = tokio::time::interval(Duration::from_secs(30));
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if let Ok(s) = self.signals.source.snapshot() {
                        info!(working_set_mib = s.node.working_set_bytes >> 20, tasks = s.node.tasks, "node");
                    }
                }
                _ = shutdown.changed() => if *shutdown.borrow() { break },
            }
        }
        // ---- server (issue 8) ----
        servers.join().await;
        // ---- end server ----
        info!("swiftlet stopped");
        Ok(())
    }
}
