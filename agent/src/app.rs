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
    cri::{CriClient, CriError, ImageService, RuntimeService},
    kubeapi::{ApiAgent, ApiError},
    metrics::Metrics,
    signals::{self, OpenedSource, SignalError, ebpf::EbpfOptions},
};

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
    #[error("API server: {0}")]
    Api(#[from] ApiError),
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
    // ---- API server (issue 7) ----
    /// None in standalone mode. The seams to connect: `status_reporter()`
    /// and `event_recorder()` (pod workers, eviction), `connect_pods()`
    /// (pod manager), `mirror_sink()` (static pod source) and
    /// `connect_pressure()` (eviction conditions).
    pub api: Option<Arc<ApiAgent>>,
    // ---- end API server ----
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
        let cri = Arc::new(CriClient::with_image_endpoint(
            &k.container_runtime_endpoint,
            k.image_endpoint(),
            k.runtime_request_timeout,
        )?);
        // ---- API server (issue 7) ----
        let api = (!config.standalone()).then(|| Arc::new(ApiAgent::new(&config, &node_name, &allocatable)));
        // ---- end API server ----
        Ok(Agent {
            api,
            node_name,
            metrics: Arc::new(Metrics::new()),
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
        // ---- API server (issue 7) ----
        let mut api_task = self.api.clone().map(|api| {
            let runtime: Arc<dyn RuntimeService> = self.cri.clone();
            let images: Arc<dyn ImageService> = self.cri.clone();
            tokio::spawn(api.run(runtime, images, shutdown.clone()))
        });
        // ---- end API server ----
        let mut tick = tokio::time::interval(Duration::from_secs(30));
        loop {
            tokio::select! {
                r = async { api_task.as_mut().expect("guarded").await }, if api_task.is_some() => {
                    api_task = None;
                    match r {
                        Ok(Err(e)) => return Err(e.into()),
                        Ok(Ok(())) => {}
                        Err(e) => return Err(StartError::Io(std::io::Error::other(format!("API loops: {e}")))),
                    }
                }
                _ = tick.tick() => {
                    if let Ok(s) = self.signals.source.snapshot() {
                        info!(working_set_mib = s.node.working_set_bytes >> 20, tasks = s.node.tasks, "node");
                    }
                }
                _ = shutdown.changed() => if *shutdown.borrow() { break },
            }
        }
        if let Some(t) = api_task {
            let _ = t.await;
        }
        info!("swiftlet stopped");
        Ok(())
    }
}
