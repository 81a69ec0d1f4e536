//! The composition root: builds every manager from the effective
//! configuration, connects them through their traits, runs them until
//! shutdown, and stops them in order.
//!
//! Components expose a constructor and a `run(shutdown)` future; this
//! module is the only place that knows all of them. Stopping the agent
//! leaves the pods running (as the kubelet): a restarted agent re-adopts
//! them.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::ObjectReference;
use thiserror::Error;
use tokio::{sync::watch, task::JoinHandle};
use tracing::{info, warn};

use crate::{
    cgroups::{CgroupError, CgroupFs},
    cm::{
        allocatable::{NodeAllocatable, Resource, machine_capacity},
        hierarchy::kubepods_limits,
        manager::CmError,
        pod_cgroups::PodCgroups,
    },
    config::Config,
    cri::{CriClient, CriError, ImageService, RuntimeService},
    events::{EventRecorder, LogRecorder},
    eviction::{
        core::EvictionConfig,
        driver::{DriverConfig, EvictionLoop, EvictionManager},
        observe::NodeInfo,
    },
    gc::{ContainerGc, DiskReclaimer, GcPolicy},
    host,
    images::{ImageGc, ImageGcPolicy, ImageManager, ImageManagerConfig, ImageMetrics},
    kubeapi::{ApiAgent, ApiError, pod_watch::TeeSink, recorder::TeeRecorder},
    logs::{ContainerLogManager, LogPolicy},
    metrics::Metrics,
    pods::{
        admission::Capacity,
        backoff::BackoffPolicy,
        file::FileSource,
        local_storage::LocalStorageMonitor,
        manager::PodManager,
        metrics::{PodMetrics, ProbeLabels},
        source::{PodSink, SourceKind},
        spec::{NodeSettings, parse_resolv_conf},
        worker::{ProbeObserver, WorkerDeps},
    },
    reload::{self, ConfigDiff, LiveSettings},
    shutdown::{NodeShutdownManager, ShutdownPods, trigger::Detector},
    signals::{self, OpenedSource, SignalError, ebpf::EbpfOptions, node},
    volumes::{NoApiServer, ObjectSource, PodsInUse, VolumeConfig, VolumeManager},
};
// ---- server (issue 8) ----
use crate::server::{
    ServerError,
    events::{DebugEvents, EvictionTap},
    health::HealthChecks,
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
    // ---- server (issue 8) ----
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
    /// The configuration in effect (the start one plus reloaded live fields),
    /// as /configz shows it.
    running: watch::Sender<Arc<Config>>,
    live: watch::Sender<LiveSettings>,
    log_level: Mutex<Option<LogLevelHook>>,
    eviction_loop: Mutex<Option<EvictionLoop>>,
    shutdown: watch::Receiver<bool>,
    // ---- API server (issue 7) ----
    /// Node, Lease, API pods, pod statuses, mirror pods and events; None in
    /// standalone mode.
    pub api: Option<Arc<ApiAgent>>,
    // ---- end API server ----
    // ---- server (issue 8) ----
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

/// The eviction manager's settings from a KubeletConfiguration.
pub fn eviction_config(k: &crate::config::KubeletConfiguration) -> EvictionConfig {
    EvictionConfig {
        thresholds: k.eviction_thresholds(),
        pressure_transition_period: k.eviction_pressure_transition_period,
        max_pod_grace_period_secs: k.eviction_max_pod_grace_period.max(0) as u64,
    }
}

fn quantity(list: &crate::cm::allocatable::ResourceList, r: Resource) -> crate::quantity::Quantity {
    list.get(&r).copied().unwrap_or_default()
}

/// What new pods are admitted against: node allocatable.
fn admission_capacity(alloc: &crate::cm::allocatable::ResourceList) -> Capacity {
    Capacity {
        pods: quantity(alloc, Resource::Pods).value(),
        cpu_milli: quantity(alloc, Resource::Cpu).milli_value(),
        memory: quantity(alloc, Resource::Memory).value(),
        hugepages: alloc
            .iter()
            .filter_map(|(r, q)| match r {
                Resource::Hugepages(size) => Some((*size, q.value())),
                _ => None,
            })
            .collect(),
    }
}

/// What the host offers pods, for admission: sysctls for this kernel and
/// allowedUnsafeSysctls, AppArmor, and the runtime's features (asked once
/// at start; an unreachable runtime offers none).
async fn host_support(config: &Config, cri: &CriClient) -> Result<crate::pods::admission::HostSupport, StartError> {
    let kernel = crate::startup::kernel_release();
    let version = crate::pods::sysctl::kernel_version(&kernel).unwrap_or((0, 0));
    let sysctls = crate::pods::sysctl::Allowlist::new(version, &config.kubelet.allowed_unsafe_sysctls)
        .map_err(|e| StartError::Refused(format!("allowedUnsafeSysctls: {e}")))?;
    let status = cri.status().await.ok();
    Ok(crate::pods::admission::HostSupport {
        sysctls,
        apparmor: crate::startup::apparmor_enabled(),
        userns_handlers: status
            .iter()
            .flat_map(|s| &s.runtime_handlers)
            .filter(|h| h.features.as_ref().is_some_and(|f| f.user_namespaces))
            .map(|h| h.name.clone())
            .collect(),
        supplemental_groups_policy: status
            .as_ref()
            .and_then(|s| s.features.as_ref())
            .is_some_and(|f| f.supplemental_groups_policy),
    })
}

impl Agent {
    /// Reads the machine, prepares the pods' cgroup hierarchy, opens the
    /// signal source and the runtime client, and builds the managers.
    /// Nothing runs until [`Agent::run`].
    pub async fn build(config: Config, shutdown: watch::Receiver<bool>) -> Result<Agent, StartError> {
        Agent::build_with_recorder(config, shutdown, Arc::new(LogRecorder)).await
    }

    /// [`Agent::build`] with events going to `recorder`.
    pub async fn build_with_recorder(
        config: Config,
        shutdown: watch::Receiver<bool>,
        recorder: Arc<dyn EventRecorder>,
    ) -> Result<Agent, StartError> {
        Agent::build_with(config, shutdown, recorder, Arc::new(NoApiServer)).await
    }

    /// [`Agent::build_with_recorder`] with ConfigMaps, Secrets and tokens
    /// for volumes and environments from `objects` (the API server's
    /// client, or an in-memory store); `VolumeManager::set_objects`
    /// replaces it later.
    pub async fn build_with(
        config: Config,
        shutdown: watch::Receiver<bool>,
        recorder: Arc<dyn EventRecorder>,
        objects: Arc<dyn ObjectSource>,
    ) -> Result<Agent, StartError> {
        let node_name = config.node_name()?;
        let k = &config.kubelet;
        // protectKernelDefaults: the kubelet's tunables, checked first.
        match crate::kernel_tunables::check(k.protect_kernel_defaults) {
            Err(e) => return Err(StartError::Io(std::io::Error::other(format!("protectKernelDefaults: {e}")))),
            Ok(diffs) if !diffs.is_empty() => tracing::warn!(
                "kernel tunables differ from the kubelet's (the kubelet would set them; swiftlet leaves the host's sysctls alone): {}",
                diffs.join("; ")
            ),
            Ok(_) => {}
        }
        // The root dir (pod state) is root-only.
        let root_dir = &config.flags.root_dir;
        if crate::host::ensure_private_dir(root_dir)
            .map_err(|e| std::io::Error::new(e.kind(), format!("root dir {}: {e}", root_dir.display())))?
        {
            tracing::warn!(dir = %root_dir.display(), "the root dir was open to group or others; made it 0700");
        }
        let cgroupfs = CgroupFs::detect()?;
        // ---- pod fields ----
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
        if let Some(why) = crate::startup::host_refusal(k, &swaps, cgroupfs.version()) {
            return Err(StartError::Refused(why));
        }
        // ---- end pod fields ----
        let capacity =
            machine_capacity(&config.flags.root_dir, k.max_pods, k.pods_per_core).map_err(StartError::Capacity)?;
        let allocatable = NodeAllocatable::new(capacity, k);
        let pod_cgroups = PodCgroups::for_config(cgroupfs.clone(), k).await?;
        pod_cgroups.ensure_hierarchy(&kubepods_limits(&allocatable.kubepods)).await?;
        pod_cgroups.enforce_reserved(k).await?;
        let ebpf_opts = EbpfOptions {
            kernel_eviction: config.swiftlet.kernel_eviction,
            reader_priority: config.swiftlet.eviction_realtime_priority,
            ..Default::default()
        };
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
        let runtime_name = match cri.version().await {
            Ok(v) => {
                info!(
                    runtime = v.runtime_name,
                    version = v.runtime_version,
                    api = v.runtime_api_version,
                    "container runtime"
                );
                v.runtime_name
            }
            Err(e) => {
                warn!("container runtime not reachable yet (retrying in the background): {e}");
                "containerd".into()
            }
        };

        // ---- API server (issue 7) ----
        // Not standalone: events also go to the API server.
        let api = (!config.standalone()).then(|| Arc::new(ApiAgent::new(&config, &node_name, &allocatable)));
        let recorder: Arc<dyn EventRecorder> = match &api {
            Some(api) => Arc::new(TeeRecorder(vec![recorder, api.event_recorder()])),
            None => recorder,
        };
        // ---- end API server ----

        let mut metrics = Metrics::new();
        let pod_metrics = PodMetrics::default();
        pod_metrics.register(&mut metrics.registry);
        let image_metrics = ImageMetrics::register(&mut metrics.registry);
        let metrics = Arc::new(metrics);
        // ---- server (issue 8) ----
        cri.observe_with(metrics.clone());
        // ---- end server ----

        let cap = &allocatable.capacity;
        let alloc = &allocatable.allocatable;
        let node_ip = host::node_ip(&config.flags.node_ip).map(|ip| ip.to_string());
        let host_dns = k
            .resolv_conf
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .map(|t| parse_resolv_conf(&t))
            .unwrap_or_default();
        let settings = NodeSettings {
            node_name: node_name.clone(),
            node_ip,
            pod_logs_dir: k.pod_logs_dir.clone(),
            pods_dir: config.flags.root_dir.join("pods"),
            memory_capacity: quantity(cap, Resource::Memory).value().max(0) as u64,
            cpu_cfs_quota: k.cpu_cfs_quota,
            cpu_cfs_quota_period: k.cpu_cfs_quota_period,
            naming: pod_cgroups.naming().clone(),
            host_dns,
            cluster_dns: k.cluster_dns.iter().map(ToString::to_string).collect(),
            cluster_domain: k.cluster_domain.clone(),
            allocatable_cpu_milli: quantity(alloc, Resource::Cpu).milli_value(),
            allocatable_memory: quantity(alloc, Resource::Memory).value(),
            allocatable_ephemeral_storage: quantity(alloc, Resource::EphemeralStorage).value(),
            // ---- pod fields ----
            features: crate::pods::spec::NodeFeatures {
                security: crate::pods::security::SecuritySettings {
                    seccomp_default: k.seccomp_default,
                    seccomp_root: config.flags.root_dir.join("seccomp"),
                },
                oom_kills_whole_container: crate::startup::oom_kills_whole_container(k, cgroupfs.version()),
                hugepage_sizes: if crate::cm::hugepages::limits_supported(&cgroupfs) {
                    crate::cm::hugepages::host_page_sizes(std::path::Path::new(crate::cm::hugepages::SYSFS))
                        .unwrap_or_default()
                        .iter()
                        .map(|p| p.bytes)
                        .collect()
                } else {
                    vec![]
                },
            },
            // ---- end pod fields ----
        };
        let volumes = Arc::new(VolumeManager::new(
            VolumeConfig {
                pods_dir: settings.pods_dir.clone(),
                allocatable_memory: settings.allocatable_memory,
                downward: crate::pods::spec::downward_context(&settings, &[]),
                refresh_period: k.sync_frequency,
                sweep_period: config.swiftlet.housekeeping_interval,
            },
            objects,
            recorder.clone(),
        ));
        volumes.start();
        volumes.set_metrics(metrics.storage.clone());
        // ---- device plugins (issue 13) ----
        let devices = crate::deviceplugin::DeviceManager::new(&config.flags.root_dir);
        if let Some(api) = &api {
            api.connect_devices(devices.extended_resources());
        }
        // ---- end device plugins ----
        let probes = pod_metrics.probes.clone();
        let observer: ProbeObserver = Arc::new(move |pod, container, kind, outcome| {
            probes
                .get_or_create(&ProbeLabels {
                    probe_type: kind.as_str().into(),
                    result: outcome.result_label().into(),
                    container: container.into(),
                    pod: pod.metadata.name.clone().unwrap_or_default(),
                    namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                    pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
                })
                .inc();
        });
        let runtime_classes = match &api {
            Some(_) => crate::pods::runtime_class::RuntimeClasses::awaiting_api(),
            None => crate::pods::runtime_class::RuntimeClasses::default(),
        };
        // ---- pod fields ----
        // Credential provider plugins: a configuration in error stops the
        // start, as the kubelet.
        let plugins =
            match (&config.flags.image_credential_provider_config, &config.flags.image_credential_provider_bin_dir) {
                (Some(cfg), Some(dir)) => crate::images::credentials::load_plugins(cfg, dir)
                    .map_err(|e| StartError::Refused(format!("--image-credential-provider-config: {e}")))?,
                _ => vec![],
            };
        let pull_credentials = Arc::new(
            crate::images::credentials::PullCredentials::new(volumes.clone(), plugins)
                .with_node_config(&config.flags.root_dir),
        );
        // ---- end pod fields ----
        let deps = Arc::new(WorkerDeps {
            runtime: cri.clone(),
            images: Arc::new(
                ImageManager::new(cri.clone(), recorder.clone(), ImageManagerConfig::from_kubelet(k))
                    .with_metrics(image_metrics.clone())
                    .with_credentials(pull_credentials),
            ),
            cgroups: pod_cgroups.clone(),
            settings,
            recorder: recorder.clone(),
            runtime_name,
            cpu_cfs_quota: k.cpu_cfs_quota,
            cpu_cfs_quota_period: k.cpu_cfs_quota_period,
            pod_pids_limit: k.pod_pids_limit,
            resync: k.sync_frequency,
            restart_backoff: match k.crash_loop_back_off_max {
                Some(max) => BackoffPolicy { initial: max.min(BackoffPolicy::default().initial), max },
                None => BackoffPolicy::default(),
            },
            probe_results: Some(observer),
            volumes: volumes.clone(),
            devices: Some(devices.clone()),
            runtime_classes: runtime_classes.clone(),
            metrics: pod_metrics.clone(),
        });
        let mut expected = HashSet::new();
        if k.static_pod_path.is_some() {
            expected.insert(SourceKind::File);
        }
        if !config.standalone() {
            expected.insert(SourceKind::Api);
        }
        let admit = admission_capacity(alloc);
        let pods = PodManager::new(deps, expected, admit, pod_metrics.clone(), shutdown.clone());
        // ---- pod fields ----
        pods.set_host_support(host_support(&config, cri.as_ref()).await?);
        // ---- end pod fields ----
        pods.set_evict_static_pods(config.swiftlet.evict_static_pods);

        // Image GC keeps the image sandboxes are made from.
        let mut pinned: Vec<String> = config.flags.pod_infra_container_image.iter().cloned().collect();
        pinned.extend(cri.sandbox_image().await);
        let node_ref = ObjectReference {
            kind: Some("Node".into()),
            name: Some(node_name.clone()),
            uid: Some(node_name.clone()),
            ..Default::default()
        };
        let image_gc = Arc::new(
            ImageGc::new(
                cri.clone(),
                cri.clone(),
                ImageGcPolicy::from_kubelet(k, pinned),
                recorder.clone(),
                node_ref.clone(),
            )
            .with_metrics(image_metrics),
        );
        let logs = Arc::new(ContainerLogManager::new(cri.clone(), LogPolicy::from_kubelet(k))?);
        let container_gc = Arc::new(
            ContainerGc::new(cri.clone(), Arc::new(pods.clone()), GcPolicy::default(), k.pod_logs_dir.clone())
                .with_log_cleaner(logs.clone()),
        );
        // imagefs is where the runtime keeps its images (ImageFsInfo), when
        // that is not the root dir's filesystem.
        let imagefs_path = crate::gc::reclaim::locate_imagefs(&*cri, &config.flags.root_dir).await;
        let reclaimer = Arc::new(DiskReclaimer::new(container_gc.clone(), image_gc.clone(), imagefs_path.is_some()));

        let driver = DriverConfig {
            eviction: eviction_config(k),
            node: NodeInfo {
                memory_capacity: quantity(cap, Resource::Memory).value().max(0) as u64,
                allocatable_memory: quantity(&allocatable.kubepods, Resource::Memory).value().max(0) as u64,
                pid_limit: node::pid_limit().unwrap_or(u64::from(u32::MAX)),
                kubepods_cgroup: pod_cgroups.naming().kubepods(),
            },
            nodefs_path: config.flags.root_dir.clone(),
            imagefs_path,
            housekeeping_interval: config.swiftlet.housekeeping_interval,
            plan_interval: PLAN_INTERVAL,
            kernel_eviction: config.swiftlet.kernel_eviction,
            reclaim_before_eviction: config.swiftlet.memory_reclaim_before_eviction,
        };
        // ---- server (issue 8) ----
        let health = Arc::new(HealthChecks::new());
        let debug_events = DebugEvents::new(Arc::new(pods.clone()));
        let evictor = Arc::new(EvictionTap { inner: Arc::new(pods.clone()), events: debug_events.clone() });
        // ---- end server ----
        let (eviction, eviction_loop) = EvictionManager::new(
            driver,
            signals.source.clone(),
            cgroupfs.clone(),
            Arc::new(pods.clone()),
            evictor,
            Some(reclaimer),
            metrics.clone(),
        );
        // New pods are admitted as the kubelet's eviction admit handler says
        // while the node reports pressure.
        pods.set_node_conditions(eviction.conditions());
        // Disk pressure ranks pods by what they hold on nodefs, measured as
        // the local storage limits measure it.
        eviction.set_disk_meter(Arc::new(LocalStorageMonitor {
            pods: Arc::new(pods.clone()),
            evictor: Arc::new(pods.clone()),
            runtime: cri.clone(),
            volumes: volumes.clone(),
            pod_logs_dir: k.pod_logs_dir.clone(),
            period: config.swiftlet.housekeeping_interval,
        }));
        // ---- API server (issue 7) ----
        // Pod statuses to the API, API pods to the pod manager, pressure
        // conditions to node status.
        if let Some(api) = &api {
            pods.set_reporter(api.status_reporter());
            api.connect_pods(Arc::new(pods.clone()));
            api.connect_pressure(eviction.conditions());
        }
        // ---- end API server ----
        let shutdown_pods: Arc<dyn ShutdownPods> = Arc::new(pods.clone());
        let node_shutdown = Arc::new(NodeShutdownManager::new(
            k.shutdown_grace_period,
            k.shutdown_grace_period_critical_pods,
            Detector { marker: config.swiftlet.node_shutdown_marker.clone(), system: true },
            shutdown_pods,
            recorder.clone(),
            node_ref.clone(),
        ));
        if let Some(api) = &api {
            api.connect_shutdown(node_shutdown.shutting_down());
        }
        Ok(Agent {
            runtime_classes,
            devices,
            health,
            debug_events,
            node_shutdown,
            running: watch::channel(Arc::new(config.clone())).0,
            live: watch::channel(LiveSettings::of(&config)).0,
            log_level: Mutex::new(None),
            api,
            node_name,
            metrics,
            pod_metrics,
            cgroupfs,
            pod_cgroups,
            allocatable,
            signals,
            cri,
            recorder,
            pods,
            eviction,
            image_gc,
            container_gc,
            logs,
            volumes,
            eviction_loop: Mutex::new(Some(eviction_loop)),
            shutdown,
            config,
        })
    }

    /// The memory.pressure eviction signal: PSI triggers on the node's file
    /// and, on cgroup v2, on each pod's.
    fn start_memory_pressure(&self, signal: crate::config::MemoryPressureSignal) -> std::io::Result<JoinHandle<()>> {
        use crate::eviction::{pressure::PressureConfig, pressure_watch};
        let cfg = PressureConfig {
            threshold_percent: signal.threshold_percent,
            grace_period: signal.grace_period,
            transition_period: self.config.kubelet.eviction_pressure_transition_period,
        };
        let sink = self.eviction.pressure_sink(cfg, self.recorder.clone());
        let fs = self.cgroupfs.clone();
        if fs.version() == crate::cgroups::Version::V1 {
            info!(
                "memory.pressure signal: the pods' cgroups are cgroup v1, which has no pressure files: the node only"
            );
        }
        let pod_file: pressure_watch::PodPressureFile = Box::new(move |p| {
            (fs.version() == crate::cgroups::Version::V2).then(|| fs.memory_dir(&p.cgroup).join("memory.pressure"))
        });
        pressure_watch::spawn(cfg, Arc::new(self.pods.clone()), pod_file, sink, self.shutdown.clone())
    }

    /// Runs every manager until shutdown, then waits for them to stop.
    pub async fn run(self: Arc<Self>) -> Result<(), StartError> {
        let k = &self.config.kubelet;
        let mut tasks: Vec<JoinHandle<()>> = vec![];
        tasks.push(tokio::spawn(self.pods.clone().run(RELIST_PERIOD)));
        if let Some(l) = self.eviction_loop.lock().unwrap_or_else(|p| p.into_inner()).take() {
            tasks.push(tokio::spawn(l.run(self.shutdown.clone())));
        }
        if let Some(signal) = self.config.swiftlet.memory_pressure {
            match self.start_memory_pressure(signal) {
                Ok(t) => tasks.push(t),
                Err(e) => tracing::error!("--eviction-memory-pressure is set but the signal cannot run: {e}"),
            }
        }
        tasks.push(tokio::spawn(self.image_gc.clone().run(self.shutdown.clone())));
        tasks.push(tokio::spawn(self.container_gc.clone().run(self.shutdown.clone())));
        tasks.push(tokio::spawn(self.logs.clone().run(self.shutdown.clone())));
        tasks.push(tokio::spawn(self.node_shutdown.clone().run(self.shutdown.clone())));
        if self.node_shutdown.enabled() {
            if crate::shutdown::logind::available() {
                tasks.push(tokio::spawn(crate::shutdown::logind::run(
                    self.node_shutdown.clone(),
                    self.shutdown.clone(),
                )));
            } else {
                info!(
                    "graceful node shutdown: systemd is not PID 1, so no logind; the shutdown marker and SIGTERM start it"
                );
            }
        }
        // ---- device plugins (issue 13) ----
        // The kubelet cannot start without its device manager; swiftlet
        // runs on without device plugins and says why.
        match self.devices.start(self.shutdown.clone()) {
            Ok(t) => tasks.push(t),
            Err(e) => tracing::error!("device plugins are not available: {e}"),
        }
        // ---- end device plugins ----
        let in_use: Arc<dyn PodsInUse> = Arc::new(self.pods.clone());
        tasks.push(tokio::spawn(self.volumes.clone().run(in_use, self.cri.clone(), self.shutdown.clone())));
        if k.local_storage_capacity_isolation {
            let monitor = LocalStorageMonitor {
                pods: Arc::new(self.pods.clone()),
                evictor: Arc::new(self.pods.clone()),
                runtime: self.cri.clone(),
                volumes: self.volumes.clone(),
                pod_logs_dir: k.pod_logs_dir.clone(),
                period: self.config.swiftlet.housekeeping_interval,
            };
            tasks.push(tokio::spawn(monitor.run(self.shutdown.clone())));
        }
        // ---- API server (issue 7) ----
        let mut api_task = self.api.clone().map(|api| {
            let runtime: Arc<dyn RuntimeService> = self.cri.clone();
            let images: Arc<dyn ImageService> = self.cri.clone();
            tokio::spawn(api.run(runtime, images, self.live.subscribe(), self.shutdown.clone()))
        });
        // ConfigMaps, Secrets and service account tokens for volumes and
        // environments come from the API server once connected.
        if let Some(api) = self.api.clone() {
            let volumes = self.volumes.clone();
            let runtime_classes = self.runtime_classes.clone();
            let mut stop = self.shutdown.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    if let Some(client) = api.client() {
                        runtime_classes.set_source(Arc::new(crate::kubeapi::runtime_class::KubeRuntimeClasses::new(
                            client.clone(),
                        )));
                        volumes.set_objects(Arc::new(crate::volumes::kube::KubeObjects::new(client)));
                        return;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                        _ = stop.changed() => return,
                    }
                }
            }));
        }
        // ---- end API server ----
        if let Some(dir) = &k.static_pod_path {
            let mut sink: Arc<dyn PodSink> = Arc::new(self.pods.clone());
            // ---- API server (issue 7) ----
            // Static pods also get their mirror pods.
            if let Some(api) = &self.api {
                sink = Arc::new(TeeSink(vec![sink, api.mirror_sink()]));
            }
            // ---- end API server ----
            let source = FileSource::new(
                dir.clone(),
                self.node_name.clone(),
                k.file_check_frequency,
                sink,
                self.pod_metrics.manifest_errors.clone(),
            );
            tasks.push(tokio::spawn(source.run(self.shutdown.clone())));
        }
        info!(
            node = self.node_name,
            mode = self.signals.source.mode().as_str(),
            standalone = self.config.standalone(),
            static_pods = k.static_pod_path.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            "swiftlet started"
        );
        // ---- server (issue 8): :10248, :10250 and the debug socket ----
        // The forwarder ends only when the eviction manager's sender is
        // dropped, which this Agent outlives: it is aborted at shutdown.
        let debug_forwarder = self.debug_events.forward(self.eviction.events());
        let servers = crate::server::agent::serve(&self, self.shutdown.clone()).await?;
        // ---- end server ----
        let mut shutdown = self.shutdown.clone();
        while !*shutdown.borrow() {
            tokio::select! {
                // ---- API server (issue 7) ----
                // It ends early only on a fatal error (a bad kubeconfig, a
                // refused bootstrap): the agent stops, as the kubelet exits.
                r = async { api_task.as_mut().expect("guarded").await }, if api_task.is_some() => {
                    api_task = None;
                    match r {
                        Ok(Err(e)) => return Err(e.into()),
                        Err(e) => return Err(StartError::Io(std::io::Error::other(format!("API loops: {e}")))),
                        Ok(Ok(())) => {}
                    }
                }
                // ---- end API server ----
                changed = shutdown.changed() => if changed.is_err() { break },
            }
        }
        if let Some(t) = api_task {
            let _ = t.await;
        }
        // ---- server (issue 8) ----
        // Open connections (a follow, a long scrape) must not keep the
        // agent from stopping.
        if tokio::time::timeout(Duration::from_secs(5), servers.join()).await.is_err() {
            warn!("the kubelet API servers did not stop within 5s; leaving them");
        }
        debug_forwarder.abort();
        // ---- end server ----
        for t in tasks {
            let _ = t.await;
        }
        info!("swiftlet stopped");
        Ok(())
    }

    /// Settings that change with a reload (node status frequencies, log
    /// verbosity), for the API side.
    pub fn live_settings(&self) -> watch::Receiver<LiveSettings> {
        self.live.subscribe()
    }

    /// How a reload changes the log verbosity (the binary's subscriber).
    pub fn set_log_level_hook(&self, hook: LogLevelHook) {
        *self.log_level.lock().unwrap_or_else(|p| p.into_inner()) = Some(hook);
    }

    /// The configuration in effect.
    pub fn running_config(&self) -> Config {
        (**self.running.borrow()).clone()
    }

    /// The configuration in effect, as it changes (for /configz).
    pub fn running_configs(&self) -> watch::Receiver<Arc<Config>> {
        self.running.subscribe()
    }

    /// Applies a newly loaded configuration (SIGHUP): the live fields take
    /// effect, the others are reported as needing a restart. Pods are not
    /// touched.
    pub fn reload(&self, new: Config) -> ConfigDiff {
        // One reload at a time: the signal handler is the only caller.
        let running = self.running_config();
        let diff = reload::diff(&running, &new);
        if diff.is_empty() {
            info!("configuration reloaded: nothing changed");
            return diff;
        }
        let next = reload::apply_live(&running, &new);
        let mut allocatable = self.live.borrow().allocatable.clone();
        if diff.eviction_changed() {
            self.eviction.reconfigure(eviction_config(&next.kubelet));
            // Node allocatable subtracts the hard memory threshold: node
            // status and pod admission follow.
            let alloc = reload::allocatable(&self.allocatable.capacity, &next);
            let a = &alloc.allocatable;
            self.pods.set_capacity(admission_capacity(a));
            allocatable = Some(crate::node::resource_strings(a));
        }
        if next.kubelet.logging.verbosity != running.kubelet.logging.verbosity
            && let Some(hook) = self.log_level.lock().unwrap_or_else(|p| p.into_inner()).as_ref()
        {
            hook(next.kubelet.logging.verbosity);
        }
        self.live.send_if_modified(|l| {
            let want = LiveSettings { allocatable: allocatable.clone(), ..LiveSettings::of(&next) };
            let changed = *l != want;
            *l = want;
            changed
        });
        if !diff.applied.is_empty() {
            info!(fields = ?diff.applied, "configuration reloaded: applied");
        }
        if !diff.needs_restart.is_empty() {
            warn!(fields = ?diff.needs_restart, "configuration reloaded: these changes need a restart and are not applied");
        }
        self.running.send_replace(Arc::new(next));
        diff
    }
}
