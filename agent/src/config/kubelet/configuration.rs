//! The typed KubeletConfiguration and the kubelet's defaults for every
//! field, with the accessors other modules ask it (eviction thresholds in
//! effect, cgroup names, the image endpoint).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
    time::Duration,
};

use k8s_openapi::api::core::v1::Taint;
use serde_json::Value as Json;

use super::{
    host::Logging,
    resources::{Enforcement, Reservation},
    server::{Authentication, Authorization, AuthorizationMode},
};
use crate::{
    config::{CgroupDriver, audit, thresholds},
    eviction::signal::{EvictionSignal, EvictionThreshold, ThresholdValue},
    quantity::Quantity,
};

pub(super) const SECOND: Duration = Duration::from_secs(1);
const MINUTE: Duration = Duration::from_secs(60);

/// The effective KubeletConfiguration. Field docs give the kubelet's
/// camelCase name where it is not the obvious one.
#[derive(Clone, Debug, PartialEq)]
pub struct KubeletConfiguration {
    pub enable_server: bool,
    /// staticPodPath (`--pod-manifest-path`); None: no static pods.
    pub static_pod_path: Option<PathBuf>,
    pub pod_logs_dir: PathBuf,
    pub sync_frequency: Duration,
    /// volumeStatsAggPeriod: how often persistent volumes' usage is read
    /// (kubelet_volume_stats_*, the summary's PVC entries); 0 disables.
    pub volume_stats_agg_period: Duration,
    pub file_check_frequency: Duration,
    pub address: IpAddr,
    pub port: u16,
    /// 0: disabled.
    pub read_only_port: u16,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    pub tls_cipher_suites: Vec<String>,
    pub tls_min_version: Option<String>,
    pub authentication: Authentication,
    pub authorization: Authorization,
    /// registryPullQPS (0: no limit)
    pub registry_pull_qps: u32,
    pub registry_burst: u32,
    /// eventRecordQPS (0: no limit)
    pub event_record_qps: u32,
    pub event_burst: u32,
    pub enable_debugging_handlers: bool,
    /// 0: disabled.
    pub healthz_port: u16,
    pub healthz_bind_address: IpAddr,
    /// The agent's own oom_score_adj.
    pub oom_score_adj: i32,
    pub cluster_domain: Option<String>,
    /// clusterDNS
    pub cluster_dns: Vec<IpAddr>,
    pub node_status_update_frequency: Duration,
    pub node_status_report_frequency: Duration,
    pub node_lease_duration_seconds: u32,
    /// imageMinimumGCAge
    pub image_minimum_gc_age: Duration,
    /// imageMaximumGCAge (0: disabled)
    pub image_maximum_gc_age: Duration,
    /// imageGCHighThresholdPercent
    pub image_gc_high_threshold_percent: u8,
    /// imageGCLowThresholdPercent
    pub image_gc_low_threshold_percent: u8,
    /// cgroupRoot ("/" when unset, as the kubelet does with cgroupsPerQOS).
    pub cgroup_root: String,
    pub cgroup_driver: CgroupDriver,
    pub runtime_request_timeout: Duration,
    /// streamingConnectionIdleTimeout: exec, attach and port-forward
    /// sessions with no data moving for this long are closed (0: never).
    pub streaming_connection_idle_timeout: Duration,
    pub max_pods: u32,
    /// 0: no per-core limit.
    pub pods_per_core: u32,
    /// -1: no limit beyond the node's.
    pub pod_pids_limit: i64,
    /// protectKernelDefaults: refuse to start when the kernel tunables
    /// the kubelet checks differ from its values.
    pub protect_kernel_defaults: bool,
    /// rotateCertificates: the client certificate is renewed by CSR before
    /// it expires.
    pub rotate_certificates: bool,
    /// serverTLSBootstrap: the serving certificate is requested by CSR
    /// (signer kubernetes.io/kubelet-serving) and rotated.
    pub server_tls_bootstrap: bool,
    /// resolvConf; None when set to "" (no DNS from the host).
    pub resolv_conf: Option<PathBuf>,
    /// cpuCFSQuota
    pub cpu_cfs_quota: bool,
    /// cpuCFSQuotaPeriod
    pub cpu_cfs_quota_period: Duration,
    /// -1: no cap.
    pub node_status_max_images: i32,
    /// kubeAPIQPS
    pub kube_api_qps: u32,
    /// kubeAPIBurst
    pub kube_api_burst: u32,
    pub serialize_image_pulls: bool,
    pub max_parallel_image_pulls: Option<u32>,
    /// evictionHard, parsed (grace period 0, min_reclaim filled in).
    pub eviction_hard: Vec<EvictionThreshold>,
    /// evictionSoft, parsed (grace period from evictionSoftGracePeriod).
    pub eviction_soft: Vec<EvictionThreshold>,
    pub eviction_soft_grace_period: BTreeMap<EvictionSignal, Duration>,
    pub eviction_minimum_reclaim: BTreeMap<EvictionSignal, ThresholdValue>,
    pub eviction_pressure_transition_period: Duration,
    /// Seconds; caps a pod's grace period on soft eviction.
    pub eviction_max_pod_grace_period: i32,
    pub merge_default_eviction_settings: bool,
    pub fail_swap_on: bool,
    pub container_log_max_size: Quantity,
    pub container_log_max_files: u32,
    pub system_reserved: Reservation,
    pub kube_reserved: Reservation,
    pub system_reserved_cgroup: Option<String>,
    pub kube_reserved_cgroup: Option<String>,
    pub enforce_node_allocatable: BTreeSet<Enforcement>,
    /// providerID
    pub provider_id: Option<String>,
    pub logging: Logging,
    pub shutdown_grace_period: Duration,
    /// crashLoopBackOff.maxContainerRestartPeriod (feature gate
    /// KubeletCrashLoopBackOffMax): the cap of the restart back-off.
    pub crash_loop_back_off_max: Option<Duration>,
    pub shutdown_grace_period_critical_pods: Duration,
    pub register_with_taints: Vec<Taint>,
    pub register_node: bool,
    pub container_runtime_endpoint: String,
    /// Defaults to container_runtime_endpoint when None.
    pub image_service_endpoint: Option<String>,
    pub feature_gates: BTreeMap<String, bool>,
    pub seccomp_default: bool,
    pub local_storage_capacity_isolation: bool,
    /// Unsafe sysctls (or patterns ending in `*`) pods may set.
    pub allowed_unsafe_sysctls: Vec<String>,
    /// singleProcessOOMKill; None: the kubelet's default for the cgroup
    /// version (false on v2: the whole container is OOM-killed).
    pub single_process_oom_kill: Option<bool>,
    pub fail_cgroup_v1: bool,
    /// The agent's own RLIMIT_NOFILE.
    pub max_open_files: u64,
    /// reservedSystemCPUs as given (already counted in systemReserved cpu).
    pub reserved_system_cpus: Option<String>,
    /// Fields swiftlet accepts but does not act on, with the value in
    /// effect (for /configz); see `audit`.
    pub other: BTreeMap<String, Json>,
}

impl Default for KubeletConfiguration {
    fn default() -> Self {
        KubeletConfiguration {
            enable_server: true,
            static_pod_path: None,
            pod_logs_dir: "/var/log/pods".into(),
            sync_frequency: MINUTE,
            volume_stats_agg_period: MINUTE,
            file_check_frequency: 20 * SECOND,
            address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            port: 10250,
            read_only_port: 0,
            tls_cert_file: None,
            tls_private_key_file: None,
            tls_cipher_suites: vec![],
            tls_min_version: None,
            authentication: Authentication {
                client_ca_file: None,
                webhook_enabled: true,
                webhook_cache_ttl: 2 * MINUTE,
                anonymous_enabled: false,
            },
            authorization: Authorization {
                mode: AuthorizationMode::Webhook,
                webhook_cache_authorized_ttl: 5 * MINUTE,
                webhook_cache_unauthorized_ttl: 30 * SECOND,
            },
            registry_pull_qps: 5,
            registry_burst: 10,
            event_record_qps: 50,
            event_burst: 100,
            enable_debugging_handlers: true,
            healthz_port: 10248,
            healthz_bind_address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            oom_score_adj: -999,
            cluster_domain: None,
            cluster_dns: vec![],
            node_status_update_frequency: 10 * SECOND,
            node_status_report_frequency: 5 * MINUTE,
            node_lease_duration_seconds: 40,
            image_minimum_gc_age: 2 * MINUTE,
            image_maximum_gc_age: Duration::ZERO,
            image_gc_high_threshold_percent: 85,
            image_gc_low_threshold_percent: 80,
            cgroup_root: "/".into(),
            cgroup_driver: CgroupDriver::Cgroupfs,
            runtime_request_timeout: 2 * MINUTE,
            streaming_connection_idle_timeout: 4 * 60 * MINUTE,
            max_pods: 110,
            pods_per_core: 0,
            pod_pids_limit: -1,
            protect_kernel_defaults: false,
            rotate_certificates: false,
            server_tls_bootstrap: false,
            resolv_conf: Some("/etc/resolv.conf".into()),
            cpu_cfs_quota: true,
            cpu_cfs_quota_period: Duration::from_millis(100),
            node_status_max_images: 50,
            kube_api_qps: 50,
            kube_api_burst: 100,
            serialize_image_pulls: true,
            max_parallel_image_pulls: None,
            eviction_hard: thresholds::default_hard_thresholds(),
            eviction_soft: vec![],
            eviction_soft_grace_period: BTreeMap::new(),
            eviction_minimum_reclaim: BTreeMap::new(),
            eviction_pressure_transition_period: 5 * MINUTE,
            eviction_max_pod_grace_period: 0,
            merge_default_eviction_settings: false,
            fail_swap_on: true,
            container_log_max_size: Quantity::from_units(10 << 20),
            container_log_max_files: 5,
            system_reserved: Reservation::new(),
            kube_reserved: Reservation::new(),
            system_reserved_cgroup: None,
            kube_reserved_cgroup: None,
            enforce_node_allocatable: BTreeSet::from([Enforcement::Pods]),
            provider_id: None,
            logging: Logging {
                format: "text".into(),
                verbosity: 0,
                flush_frequency: 5 * SECOND,
                other: serde_json::Map::new(),
            },
            shutdown_grace_period: Duration::ZERO,
            crash_loop_back_off_max: None,
            shutdown_grace_period_critical_pods: Duration::ZERO,
            register_with_taints: vec![],
            register_node: true,
            container_runtime_endpoint: "unix:///run/containerd/containerd.sock".into(),
            image_service_endpoint: None,
            feature_gates: BTreeMap::new(),
            seccomp_default: false,
            local_storage_capacity_isolation: true,
            allowed_unsafe_sysctls: vec![],
            single_process_oom_kill: None,
            fail_cgroup_v1: false,
            max_open_files: 1_000_000,
            reserved_system_cpus: None,
            other: audit::in_effect_defaults(),
        }
    }
}

impl KubeletConfiguration {
    /// All eviction thresholds the eviction manager evaluates: hard, soft,
    /// and with `enforceNodeAllocatable: [pods]` an
    /// allocatableMemory.available twin of each hard memory.available one
    /// (as the kubelet's ParseThresholdConfig).
    pub fn eviction_thresholds(&self) -> Vec<EvictionThreshold> {
        let all: Vec<EvictionThreshold> = self.eviction_hard.iter().chain(&self.eviction_soft).cloned().collect();
        if self.enforces(Enforcement::Pods) { thresholds::with_allocatable_thresholds(all) } else { all }
    }

    pub fn enforces(&self, e: Enforcement) -> bool {
        self.enforce_node_allocatable.contains(&e)
    }

    /// The endpoint for images (imageServiceEndpoint, else the runtime's).
    pub fn image_endpoint(&self) -> &str {
        self.image_service_endpoint.as_deref().unwrap_or(&self.container_runtime_endpoint)
    }
}
