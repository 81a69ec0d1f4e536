//! Wiring: reads the machine, prepares the pods' cgroup hierarchy, opens
//! the signal source and the runtime client, and builds every manager.

use std::{collections::HashSet, sync::Arc};

use k8s_openapi::api::core::v1::ObjectReference;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    cgroups::CgroupFs,
    cm::{
        allocatable::{NodeAllocatable, Resource, machine_capacity},
        hierarchy::kubepods_limits,
        pod_cgroups::PodCgroups,
    },
    config::{CgroupDriver, Config},
    cri::{CriClient, RuntimeService},
    events::{EventRecorder, LogRecorder},
    eviction::{
        core::EvictionConfig,
        driver::{DriverConfig, EvictionManager},
        observe::NodeInfo,
    },
    flowcontrol::BackoffPolicy,
    gc::{ContainerGc, DiskReclaimer, GcPolicy},
    host,
    images::{ImageGc, ImageGcPolicy, ImageManager, ImageManagerConfig, ImageMetrics},
    kubeapi::{ApiAgent, recorder::TeeRecorder},
    logs::{ContainerLogManager, LogPolicy},
    metrics::Metrics,
    pods::{
        admission::Capacity,
        local_storage::LocalStorageMonitor,
        manager::PodManager,
        metrics::{PodMetrics, ProbeLabels},
        source::SourceKind,
        spec::{NodeSettings, parse_resolv_conf},
        worker::{ProbeObserver, WorkerDeps},
    },
    reload::LiveSettings,
    shutdown::{NodeShutdownManager, ShutdownPods, trigger::Detector},
    signals::{self, ebpf::EbpfOptions, node},
    volumes::{NoApiServer, ObjectSource, VolumeConfig, VolumeManager},
};
// ---- server ----
use crate::server::{
    events::{DebugEvents, EvictionTap},
    health::HealthChecks,
};
// ---- end server ----

use super::{Agent, PLAN_INTERVAL, StartError};

/// The eviction manager's settings from a KubeletConfiguration.
pub fn eviction_config(k: &crate::config::KubeletConfiguration) -> EvictionConfig {
    EvictionConfig {
        thresholds: k.eviction_thresholds(),
        pressure_transition_period: k.eviction_pressure_transition_period,
        max_pod_grace_period_secs: k.eviction_max_pod_grace_period.max(0) as u64,
    }
}

pub(super) fn quantity(list: &crate::cm::allocatable::ResourceList, r: Resource) -> crate::quantity::Quantity {
    list.get(&r).copied().unwrap_or_default()
}

/// What new pods are admitted against: node allocatable.
pub(super) fn admission_capacity(alloc: &crate::cm::allocatable::ResourceList) -> Capacity {
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

/// The runtime's client and name; sets the cgroup driver to the one the
/// runtime reports through RuntimeConfig, as the kubelet does (containerd
/// 2.x answers; 1.x does not, and the configured driver stays).
async fn connect_runtime(config: &mut Config) -> Result<(Arc<CriClient>, String), StartError> {
    let k = &config.kubelet;
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
            // Not asked for its driver either: the configured one is used
            // (the kubelet would not start without an answer).
            warn!("container runtime not reachable yet (retrying in the background): {e}");
            return Ok((cri, "containerd".into()));
        }
    };
    let configured = config.kubelet.cgroup_driver;
    let driver = match crate::cri::runtime_config::cgroup_driver(cri.as_ref(), crate::cri::runtime_config::RETRY_DELAY)
        .await
    {
        Ok(Some(crate::cri::api::CgroupDriver::Systemd)) => CgroupDriver::Systemd,
        Ok(Some(crate::cri::api::CgroupDriver::Cgroupfs)) => CgroupDriver::Cgroupfs,
        Ok(None) => {
            info!(
                "the container runtime does not support RuntimeConfig; using cgroupDriver from the configuration ({configured:?})"
            );
            configured
        }
        Err(e) => return Err(StartError::Refused(format!("cannot learn the runtime's cgroup driver: {e}"))),
    };
    if driver != configured {
        info!(cgroup_driver = ?driver, configured = ?configured, "using the cgroup driver the container runtime reports");
    }
    if driver == CgroupDriver::Systemd
        && let Err(e) = crate::config::systemd_root_parts(&config.kubelet.cgroup_root)
    {
        return Err(StartError::Refused(format!(
            "the container runtime uses the systemd cgroup driver, but cgroupRoot: {e}"
        )));
    }
    config.kubelet.cgroup_driver = driver;
    Ok((cri, runtime_name))
}

impl Agent {
    /// Reads the machine, prepares the pods' cgroup hierarchy, opens the
    /// signal source and the runtime client, and builds the managers.
    /// Nothing runs until [`Agent::run`].
    pub async fn build(config: Config, shutdown: CancellationToken) -> Result<Agent, StartError> {
        Agent::build_with_recorder(config, shutdown, Arc::new(LogRecorder)).await
    }

    /// [`Agent::build`] with events going to `recorder`.
    pub async fn build_with_recorder(
        config: Config,
        shutdown: CancellationToken,
        recorder: Arc<dyn EventRecorder>,
    ) -> Result<Agent, StartError> {
        Agent::build_with(config, shutdown, recorder, Arc::new(NoApiServer)).await
    }

    /// [`Agent::build_with_recorder`] with ConfigMaps, Secrets and tokens
    /// for volumes and environments from `objects` (the API server's
    /// client, or an in-memory store); `VolumeManager::set_objects`
    /// replaces it later.
    pub async fn build_with(
        mut config: Config,
        shutdown: CancellationToken,
        recorder: Arc<dyn EventRecorder>,
        objects: Arc<dyn ObjectSource>,
    ) -> Result<Agent, StartError> {
        let node_name = config.node_name()?;
        // The runtime first: the cgroup driver it reports decides how the
        // pods' cgroups are named.
        let (cri, runtime_name) = connect_runtime(&mut config).await?;
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
        // ---- API server ----
        // Not standalone: events also go to the API server.
        let api = (!config.standalone()).then(|| Arc::new(ApiAgent::new(&config, &node_name, &allocatable)));
        let recorder: Arc<dyn EventRecorder> = match &api {
            Some(api) => Arc::new(TeeRecorder(vec![recorder, api.event_recorder()])),
            None => recorder,
        };
        // ---- end API server ----

        // ---- plugin watcher ----
        // The CSI drivers registered through the plugin watcher (filled by
        // its CSI handler, started in run), read by the volume manager.
        let csi_drivers = Arc::new(crate::volumes::csi::CsiDrivers::default());
        let plugin_watcher = Arc::new(crate::pluginwatcher::PluginWatcher::new(crate::pluginwatcher::registry_dir(
            &config.flags.root_dir,
        )));
        // ---- end plugin watcher ----
        let mut metrics = Metrics::new();
        let pod_metrics = PodMetrics::default();
        pod_metrics.register(&mut metrics.registry);
        let image_metrics = ImageMetrics::register(&mut metrics.registry);
        metrics.registry.register_collector(Box::new(plugin_watcher.collector()));
        let metrics = Arc::new(metrics);
        // ---- server ----
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
                stats_period: k.volume_stats_agg_period,
                node_name: node_name.clone(),
                // The Node's labels as registered, and its name for
                // `matchFields` on metadata.name.
                node_labels: {
                    let settings = crate::node::NodeSettings::from_config(&config, &node_name, &allocatable);
                    let mut labels = settings.registration.labels();
                    labels.insert("metadata.name".into(), node_name.clone());
                    labels
                },
            },
            objects,
            recorder.clone(),
        ));
        volumes.start();
        volumes.set_metrics(metrics.storage.clone());
        volumes.set_csi_drivers(csi_drivers.clone());
        if let Some(api) = &api {
            api.connect_volumes(volumes.volumes_in_use());
        }
        // ---- device plugins ----
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
            allocations: Arc::new(crate::pods::resize::Allocator::load(&config.flags.root_dir)),
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
        // ---- server ----
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
        // ---- API server ----
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
            csi_drivers,
            plugin_watcher,
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
}
