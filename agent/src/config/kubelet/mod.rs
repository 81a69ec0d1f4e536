//! The effective KubeletConfiguration (kubelet.config.k8s.io/v1beta1):
//! typed fields with the kubelet's defaults, read from the merged tree of
//! files and flags, validated as the kubelet validates them, and rendered
//! back for /configz.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
    time::Duration,
};

use k8s_openapi::api::core::v1::Taint;
use serde_json::{Value as Json, json};

use super::{
    audit, duration,
    error::ConfigError,
    thresholds,
    tree::{Node, Value},
    validation,
    values::{Ctx, Object},
};
use crate::{
    cm::naming::{CgroupDriver, CgroupNaming},
    eviction::signal::{EvictionSignal, EvictionThreshold, ThresholdValue},
    quantity::Quantity,
};

pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
pub const KIND: &str = "KubeletConfiguration";

const SECOND: Duration = Duration::from_secs(1);
const MINUTE: Duration = Duration::from_secs(60);

/// A resource kubeReserved / systemReserved may reserve.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReservedResource {
    Cpu,
    Memory,
    EphemeralStorage,
    Pid,
}

impl ReservedResource {
    pub const ALL: [ReservedResource; 4] =
        [ReservedResource::Cpu, ReservedResource::Memory, ReservedResource::EphemeralStorage, ReservedResource::Pid];

    pub fn name(self) -> &'static str {
        match self {
            ReservedResource::Cpu => "cpu",
            ReservedResource::Memory => "memory",
            ReservedResource::EphemeralStorage => "ephemeral-storage",
            ReservedResource::Pid => "pid",
        }
    }

    pub fn from_name(s: &str) -> Option<ReservedResource> {
        ReservedResource::ALL.into_iter().find(|r| r.name() == s)
    }
}

/// kubeReserved or systemReserved.
pub type Reservation = BTreeMap<ReservedResource, Quantity>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AuthorizationMode {
    AlwaysAllow,
    #[default]
    Webhook,
}

impl AuthorizationMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AuthorizationMode::AlwaysAllow => "AlwaysAllow",
            AuthorizationMode::Webhook => "Webhook",
        }
    }
}

/// An entry of enforceNodeAllocatable (`none` is the empty set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Enforcement {
    Pods,
    SystemReserved,
    SystemReservedCompressible,
    KubeReserved,
    KubeReservedCompressible,
}

impl Enforcement {
    pub const ALL: [Enforcement; 5] = [
        Enforcement::Pods,
        Enforcement::SystemReserved,
        Enforcement::SystemReservedCompressible,
        Enforcement::KubeReserved,
        Enforcement::KubeReservedCompressible,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Enforcement::Pods => "pods",
            Enforcement::SystemReserved => "system-reserved",
            Enforcement::SystemReservedCompressible => "system-reserved-compressible",
            Enforcement::KubeReserved => "kube-reserved",
            Enforcement::KubeReservedCompressible => "kube-reserved-compressible",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Authentication {
    /// authentication.x509.clientCAFile
    pub client_ca_file: Option<PathBuf>,
    /// authentication.webhook.enabled
    pub webhook_enabled: bool,
    /// authentication.webhook.cacheTTL
    pub webhook_cache_ttl: Duration,
    /// authentication.anonymous.enabled
    pub anonymous_enabled: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Authorization {
    pub mode: AuthorizationMode,
    /// authorization.webhook.cacheAuthorizedTTL
    pub webhook_cache_authorized_ttl: Duration,
    /// authorization.webhook.cacheUnauthorizedTTL
    pub webhook_cache_unauthorized_ttl: Duration,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Logging {
    /// `text` or `json`.
    pub format: String,
    /// `--v`.
    pub verbosity: u32,
    pub flush_frequency: Duration,
    /// vmodule and options, kept verbatim.
    pub other: serde_json::Map<String, Json>,
}

/// The effective KubeletConfiguration. Field docs give the kubelet's
/// camelCase name where it is not the obvious one.
#[derive(Clone, Debug, PartialEq)]
pub struct KubeletConfiguration {
    pub enable_server: bool,
    /// staticPodPath (`--pod-manifest-path`); None: no static pods.
    pub static_pod_path: Option<PathBuf>,
    pub pod_logs_dir: PathBuf,
    pub sync_frequency: Duration,
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
            eviction_hard: super::thresholds::default_hard_thresholds(),
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

    /// Names of the pods' cgroups under cgroupRoot for the configured driver.
    pub fn cgroup_naming(&self) -> CgroupNaming {
        CgroupNaming::new(self.cgroup_driver, &self.cgroup_root)
    }

    /// The endpoint for images (imageServiceEndpoint, else the runtime's).
    pub fn image_endpoint(&self) -> &str {
        self.image_service_endpoint.as_deref().unwrap_or(&self.container_runtime_endpoint)
    }

    /// The configuration as /configz shows it inside `kubeletconfig`, with
    /// the kubelet's field names.
    pub fn to_json(&self) -> Json {
        let d = |x: Duration| Json::String(duration::format(x));
        let opt_path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        let mut m = serde_json::Map::new();
        let mut put = |k: &str, v: Json| {
            if !(v.is_null() || v == json!("") || v == json!([]) || v == json!({})) {
                m.insert(k.to_owned(), v);
            }
        };
        put("enableServer", json!(self.enable_server));
        put("staticPodPath", json!(opt_path(&self.static_pod_path)));
        put("podLogsDir", json!(self.pod_logs_dir.display().to_string()));
        put("syncFrequency", d(self.sync_frequency));
        put("fileCheckFrequency", d(self.file_check_frequency));
        put("address", json!(self.address.to_string()));
        put("port", json!(self.port));
        put("readOnlyPort", json!(self.read_only_port));
        put("tlsCertFile", json!(opt_path(&self.tls_cert_file)));
        put("tlsPrivateKeyFile", json!(opt_path(&self.tls_private_key_file)));
        put("tlsCipherSuites", json!(self.tls_cipher_suites));
        put("tlsMinVersion", json!(self.tls_min_version));
        put(
            "authentication",
            json!({
                "x509": {"clientCAFile": opt_path(&self.authentication.client_ca_file)},
                "webhook": {
                    "enabled": self.authentication.webhook_enabled,
                    "cacheTTL": duration::format(self.authentication.webhook_cache_ttl),
                },
                "anonymous": {"enabled": self.authentication.anonymous_enabled},
            }),
        );
        put(
            "authorization",
            json!({
                "mode": self.authorization.mode.as_str(),
                "webhook": {
                    "cacheAuthorizedTTL": duration::format(self.authorization.webhook_cache_authorized_ttl),
                    "cacheUnauthorizedTTL": duration::format(self.authorization.webhook_cache_unauthorized_ttl),
                },
            }),
        );
        put("registryPullQPS", json!(self.registry_pull_qps));
        put("registryBurst", json!(self.registry_burst));
        put("eventRecordQPS", json!(self.event_record_qps));
        put("eventBurst", json!(self.event_burst));
        put("enableDebuggingHandlers", json!(self.enable_debugging_handlers));
        put("healthzPort", json!(self.healthz_port));
        put("healthzBindAddress", json!(self.healthz_bind_address.to_string()));
        put("oomScoreAdj", json!(self.oom_score_adj));
        put("clusterDomain", json!(self.cluster_domain));
        put("clusterDNS", json!(self.cluster_dns.iter().map(|ip| ip.to_string()).collect::<Vec<_>>()));
        put("nodeStatusUpdateFrequency", d(self.node_status_update_frequency));
        put("nodeStatusReportFrequency", d(self.node_status_report_frequency));
        put("nodeLeaseDurationSeconds", json!(self.node_lease_duration_seconds));
        put("imageMinimumGCAge", d(self.image_minimum_gc_age));
        put("imageMaximumGCAge", d(self.image_maximum_gc_age));
        put("imageGCHighThresholdPercent", json!(self.image_gc_high_threshold_percent));
        put("imageGCLowThresholdPercent", json!(self.image_gc_low_threshold_percent));
        put("cgroupRoot", json!(self.cgroup_root));
        put(
            "cgroupDriver",
            json!(match self.cgroup_driver {
                CgroupDriver::Cgroupfs => "cgroupfs",
                CgroupDriver::Systemd => "systemd",
            }),
        );
        put("runtimeRequestTimeout", d(self.runtime_request_timeout));
        put("streamingConnectionIdleTimeout", d(self.streaming_connection_idle_timeout));
        put("maxPods", json!(self.max_pods));
        put("podsPerCore", json!(self.pods_per_core));
        put("podPidsLimit", json!(self.pod_pids_limit));
        put("protectKernelDefaults", json!(self.protect_kernel_defaults));
        put("rotateCertificates", json!(self.rotate_certificates));
        put("serverTLSBootstrap", json!(self.server_tls_bootstrap));
        put("resolvConf", json!(opt_path(&self.resolv_conf).unwrap_or_default()));
        put("cpuCFSQuota", json!(self.cpu_cfs_quota));
        put("cpuCFSQuotaPeriod", d(self.cpu_cfs_quota_period));
        put("nodeStatusMaxImages", json!(self.node_status_max_images));
        put("kubeAPIQPS", json!(self.kube_api_qps));
        put("kubeAPIBurst", json!(self.kube_api_burst));
        put("serializeImagePulls", json!(self.serialize_image_pulls));
        put("maxParallelImagePulls", json!(self.max_parallel_image_pulls));
        let thresholds = |ts: &[EvictionThreshold]| -> Json {
            ts.iter().map(|t| (t.signal.name().to_owned(), json!(thresholds::format_value(&t.value)))).collect()
        };
        put("evictionHard", thresholds(&self.eviction_hard));
        put("evictionSoft", thresholds(&self.eviction_soft));
        put(
            "evictionSoftGracePeriod",
            self.eviction_soft_grace_period.iter().map(|(s, g)| (s.name().to_owned(), d(*g))).collect(),
        );
        put("evictionPressureTransitionPeriod", d(self.eviction_pressure_transition_period));
        put("evictionMaxPodGracePeriod", json!(self.eviction_max_pod_grace_period));
        put(
            "evictionMinimumReclaim",
            self.eviction_minimum_reclaim
                .iter()
                .map(|(s, v)| (s.name().to_owned(), json!(thresholds::format_value(v))))
                .collect(),
        );
        put("mergeDefaultEvictionSettings", json!(self.merge_default_eviction_settings));
        put("failSwapOn", json!(self.fail_swap_on));
        put("containerLogMaxSize", json!(format_quantity(&self.container_log_max_size)));
        put("containerLogMaxFiles", json!(self.container_log_max_files));
        let reservation = |r: &Reservation| -> Json {
            r.iter().map(|(k, q)| (k.name().to_owned(), json!(format_quantity(q)))).collect()
        };
        put("systemReserved", reservation(&self.system_reserved));
        put("kubeReserved", reservation(&self.kube_reserved));
        put("systemReservedCgroup", json!(self.system_reserved_cgroup));
        put("kubeReservedCgroup", json!(self.kube_reserved_cgroup));
        let enforce: Vec<&str> = self.enforce_node_allocatable.iter().map(|e| e.as_str()).collect();
        put("enforceNodeAllocatable", if enforce.is_empty() { json!(["none"]) } else { json!(enforce) });
        put("providerID", json!(self.provider_id));
        let mut logging = self.logging.other.clone();
        logging.insert("format".into(), json!(self.logging.format));
        logging.insert("flushFrequency".into(), d(self.logging.flush_frequency));
        logging.insert("verbosity".into(), json!(self.logging.verbosity));
        put("logging", Json::Object(logging));
        put("shutdownGracePeriod", d(self.shutdown_grace_period));
        if let Some(max) = self.crash_loop_back_off_max {
            put("crashLoopBackOff", json!({ "maxContainerRestartPeriod": d(max) }));
        }
        put("shutdownGracePeriodCriticalPods", d(self.shutdown_grace_period_critical_pods));
        put("registerWithTaints", serde_json::to_value(&self.register_with_taints).unwrap_or(Json::Null));
        put("registerNode", json!(self.register_node));
        put("containerRuntimeEndpoint", json!(self.container_runtime_endpoint));
        put("imageServiceEndpoint", json!(self.image_service_endpoint));
        put("featureGates", json!(self.feature_gates));
        put("seccompDefault", json!(self.seccomp_default));
        put("localStorageCapacityIsolation", json!(self.local_storage_capacity_isolation));
        put("allowedUnsafeSysctls", json!(self.allowed_unsafe_sysctls));
        put("singleProcessOOMKill", json!(self.single_process_oom_kill));
        put("failCgroupV1", json!(self.fail_cgroup_v1));
        put("maxOpenFiles", json!(self.max_open_files));
        put("reservedSystemCPUs", json!(self.reserved_system_cpus));
        for (k, v) in &self.other {
            put(k, v.clone());
        }
        // An empty evictionHard (every threshold 0% or 100%) means no hard
        // threshold; left out, reading it back would give the defaults.
        m.entry("evictionHard").or_insert_with(|| json!({}));
        Json::Object(m)
    }
}

/// A quantity as Kubernetes prints it: `500m`, `2Gi`, `100M`, `1536`.
pub fn format_quantity(q: &Quantity) -> String {
    let milli = q.milli_value();
    if milli % 1000 != 0 {
        return format!("{milli}m");
    }
    let v = milli / 1000;
    if v == 0 {
        return "0".to_owned();
    }
    for (suffix, shift) in [("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
        if v % (1i64 << shift) == 0 {
            return format!("{}{suffix}", v >> shift);
        }
    }
    for (suffix, pow) in [("E", 18), ("P", 15), ("T", 12), ("G", 9), ("M", 6), ("k", 3)] {
        let p = 10i64.pow(pow);
        if v % p == 0 {
            return format!("{}{suffix}", v / p);
        }
    }
    v.to_string()
}

fn u16_port(v: i64) -> u16 {
    v as u16
}

/// Reads the merged tree into the effective configuration.
pub fn read(cx: &Ctx, root: &Node, warnings: &mut Vec<String>) -> Result<KubeletConfiguration, ConfigError> {
    let mut c = KubeletConfiguration::default();
    let mut o = Object::new(cx, root, "")?;
    // Checked per file before merging.
    o.get("apiVersion");
    o.get("kind");

    if let Some(v) = o.boolean("enableServer")? {
        c.enable_server = v;
    }
    c.static_pod_path = o.path("staticPodPath")?;
    if let Some(p) = o.path("podLogsDir")? {
        c.pod_logs_dir = p;
    }
    c.sync_frequency = o.duration_or("syncFrequency", c.sync_frequency)?;
    c.file_check_frequency = o.duration_or("fileCheckFrequency", c.file_check_frequency)?;
    if let Some(n) = o.get("address") {
        let s = cx.string(n, "address")?;
        if !s.is_empty() {
            c.address = cx.ip(n, "address")?;
        }
    }
    if let Some(p) = o.int_in("port", 0, 65535)?.filter(|p| *p != 0) {
        c.port = u16_port(p);
    }
    if let Some(p) = o.int_in("readOnlyPort", 0, 65535)? {
        c.read_only_port = u16_port(p);
    }
    c.tls_cert_file = o.path("tlsCertFile")?;
    c.tls_private_key_file = o.path("tlsPrivateKeyFile")?;
    if let Some(l) = o.string_list("tlsCipherSuites")? {
        c.tls_cipher_suites = l;
    }
    if let Some(n) = o.get("tlsMinVersion") {
        let v = cx.string(n, "tlsMinVersion")?;
        if !v.is_empty() {
            const VERSIONS: [&str; 4] = ["VersionTLS10", "VersionTLS11", "VersionTLS12", "VersionTLS13"];
            if !VERSIONS.contains(&v.as_str()) {
                return Err(cx.err(n, "tlsMinVersion", format!("{v:?} is not one of {}", VERSIONS.join(", "))));
            }
            c.tls_min_version = Some(v);
        }
    }
    if let Some(n) = o.get("authentication") {
        read_authentication(cx, n, &mut c.authentication)?;
    }
    if let Some(n) = o.get("authorization") {
        read_authorization(cx, n, &mut c.authorization)?;
    }
    let non_negative = |o: &mut Object, key: &str| o.int_in(key, 0, i32::MAX as i64).map(|v| v.map(|v| v as u32));
    if let Some(v) = non_negative(&mut o, "registryPullQPS")? {
        c.registry_pull_qps = v;
    }
    if let Some(v) = non_negative(&mut o, "registryBurst")?.filter(|v| *v != 0) {
        c.registry_burst = v;
    }
    if let Some(v) = non_negative(&mut o, "eventRecordQPS")? {
        c.event_record_qps = v;
    }
    if let Some(v) = non_negative(&mut o, "eventBurst")?.filter(|v| *v != 0) {
        c.event_burst = v;
    }
    if let Some(v) = o.boolean("enableDebuggingHandlers")? {
        c.enable_debugging_handlers = v;
    }
    if let Some(p) = o.int_in("healthzPort", 0, 65535)? {
        c.healthz_port = u16_port(p);
    }
    if let Some(n) = o.get("healthzBindAddress")
        && !cx.string(n, "healthzBindAddress")?.is_empty()
    {
        c.healthz_bind_address = cx.ip(n, "healthzBindAddress")?;
    }
    if let Some(v) = o.int_in("oomScoreAdj", -1000, 1000)? {
        c.oom_score_adj = v as i32;
    }
    c.cluster_domain = o.string("clusterDomain")?.filter(|s| !s.is_empty());
    if let Some(n) = o.get("clusterDNS") {
        c.cluster_dns = cx.list(n, "clusterDNS")?.iter().map(|ip| cx.ip(ip, "clusterDNS")).collect::<Result<_, _>>()?;
    }
    c.node_status_update_frequency = o.duration_or("nodeStatusUpdateFrequency", c.node_status_update_frequency)?;
    c.node_status_report_frequency = o.duration_or("nodeStatusReportFrequency", c.node_status_report_frequency)?;
    if let Some(v) = non_negative(&mut o, "nodeLeaseDurationSeconds")?.filter(|v| *v != 0) {
        c.node_lease_duration_seconds = v;
    }
    c.image_minimum_gc_age = o.duration_or("imageMinimumGCAge", c.image_minimum_gc_age)?;
    if let Some(v) = o.duration("imageMaximumGCAge")? {
        c.image_maximum_gc_age = v;
    }
    if let Some(v) = o.int_in("imageGCHighThresholdPercent", 0, 100)? {
        c.image_gc_high_threshold_percent = v as u8;
    }
    let low_node = o.get("imageGCLowThresholdPercent");
    if let Some(n) = low_node {
        c.image_gc_low_threshold_percent = cx.int_in(n, "imageGCLowThresholdPercent", 0, 100)? as u8;
    }
    if c.image_gc_low_threshold_percent >= c.image_gc_high_threshold_percent {
        let n = low_node.or_else(|| root.get("imageGCHighThresholdPercent")).unwrap_or(root);
        return Err(cx.err(
            n,
            "imageGCLowThresholdPercent",
            format!(
                "{} must be less than imageGCHighThresholdPercent ({})",
                c.image_gc_low_threshold_percent, c.image_gc_high_threshold_percent
            ),
        ));
    }
    if let Some(v) = o.string("cgroupRoot")?.filter(|s| !s.is_empty()) {
        c.cgroup_root = v;
    }
    if let Some(n) = o.get("cgroupDriver") {
        c.cgroup_driver = match cx.string(n, "cgroupDriver")?.as_str() {
            "" | "cgroupfs" => CgroupDriver::Cgroupfs,
            "systemd" => CgroupDriver::Systemd,
            other => return Err(cx.err(n, "cgroupDriver", format!("{other:?} is not one of cgroupfs, systemd"))),
        };
    }
    if c.cgroup_driver == CgroupDriver::Systemd
        && let Err(e) = crate::cm::naming::systemd_root_parts(&c.cgroup_root)
    {
        let n = root.get("cgroupRoot").or_else(|| root.get("cgroupDriver")).unwrap_or(root);
        return Err(cx.err(n, "cgroupRoot", e));
    }
    c.runtime_request_timeout = o.duration_or("runtimeRequestTimeout", c.runtime_request_timeout)?;
    c.streaming_connection_idle_timeout =
        o.duration_or("streamingConnectionIdleTimeout", c.streaming_connection_idle_timeout)?;
    if let Some(v) = non_negative(&mut o, "maxPods")?.filter(|v| *v != 0) {
        c.max_pods = v;
    }
    if let Some(v) = non_negative(&mut o, "podsPerCore")? {
        c.pods_per_core = v;
    }
    if let Some(v) = o.int_in("podPidsLimit", i64::MIN, i64::MAX)? {
        c.pod_pids_limit = if v <= 0 { -1 } else { v };
    }
    if let Some(v) = o.boolean("protectKernelDefaults")? {
        c.protect_kernel_defaults = v;
    }
    if let Some(v) = o.boolean("rotateCertificates")? {
        c.rotate_certificates = v;
    }
    if let Some(v) = o.boolean("serverTLSBootstrap")? {
        c.server_tls_bootstrap = v;
    }
    if let Some(n) = o.get("resolvConf") {
        let p = cx.path(n, "resolvConf")?;
        c.resolv_conf = (!p.as_os_str().is_empty()).then_some(p);
    }
    if let Some(v) = o.boolean("cpuCFSQuota")? {
        c.cpu_cfs_quota = v;
    }
    if let Some(n) = o.get("cpuCFSQuotaPeriod") {
        let d = cx.duration(n, "cpuCFSQuotaPeriod")?;
        if d < Duration::from_millis(1) || d > SECOND {
            return Err(cx.err(n, "cpuCFSQuotaPeriod", format!("{} must be between 1ms and 1s", duration::format(d))));
        }
        c.cpu_cfs_quota_period = d;
    }
    if let Some(v) = o.int_in("nodeStatusMaxImages", -1, i32::MAX as i64)? {
        c.node_status_max_images = v as i32;
    }
    if let Some(v) = non_negative(&mut o, "kubeAPIQPS")? {
        c.kube_api_qps = v;
    }
    if let Some(v) = non_negative(&mut o, "kubeAPIBurst")?.filter(|v| *v != 0) {
        c.kube_api_burst = v;
    }
    let serialize = o.get("serializeImagePulls");
    let parallel = o.get("maxParallelImagePulls");
    if let Some(n) = parallel {
        c.max_parallel_image_pulls = Some(cx.int_in(n, "maxParallelImagePulls", 1, i32::MAX as i64)? as u32);
    }
    c.serialize_image_pulls = match serialize {
        Some(n) => cx.boolean(n, "serializeImagePulls")?,
        // Unset: serial unless parallel pulls were asked for.
        None => c.max_parallel_image_pulls.is_none_or(|p| p < 2),
    };
    if let (true, Some(p @ 2..), Some(n)) = (c.serialize_image_pulls, c.max_parallel_image_pulls, parallel) {
        return Err(cx.err(
            n,
            "maxParallelImagePulls",
            format!("{p} cannot be larger than 1 unless serializeImagePulls (--serialize-image-pulls) is false"),
        ));
    }
    read_eviction(cx, &mut o, &mut c)?;
    if let Some(v) = o.boolean("failSwapOn")? {
        c.fail_swap_on = v;
    }
    if let Some(n) = o.get("containerLogMaxSize") {
        let raw = cx.scalar_string(n, "containerLogMaxSize")?;
        if !raw.is_empty() {
            let q = cx.quantity(n, "containerLogMaxSize")?;
            if q.is_negative() || q == Quantity::ZERO {
                return Err(cx.err(n, "containerLogMaxSize", format!("{raw:?} must be positive")));
            }
            c.container_log_max_size = q;
        }
    }
    if let Some(v) = o.int_in("containerLogMaxFiles", 2, i32::MAX as i64)? {
        c.container_log_max_files = v as u32;
    }
    if let Some(n) = o.get("systemReserved") {
        c.system_reserved = read_reservation(cx, n, "systemReserved")?;
    }
    if let Some(n) = o.get("kubeReserved") {
        c.kube_reserved = read_reservation(cx, n, "kubeReserved")?;
    }
    c.system_reserved_cgroup = o.string("systemReservedCgroup")?.filter(|s| !s.is_empty());
    c.kube_reserved_cgroup = o.string("kubeReservedCgroup")?.filter(|s| !s.is_empty());
    if let Some(n) = o.get("enforceNodeAllocatable") {
        c.enforce_node_allocatable = read_enforcement(cx, n, &c)?;
    }
    c.provider_id = o.string("providerID")?.filter(|s| !s.is_empty());
    if let Some(n) = o.get("logging") {
        read_logging(cx, n, &mut c.logging)?;
    }
    if let Some(v) = o.duration("shutdownGracePeriod")? {
        c.shutdown_grace_period = v;
    }
    if let Some(n) = o.get("shutdownGracePeriodCriticalPods") {
        let v = cx.duration(n, "shutdownGracePeriodCriticalPods")?;
        if v > c.shutdown_grace_period {
            return Err(cx.err(
                n,
                "shutdownGracePeriodCriticalPods",
                format!(
                    "{} must not exceed shutdownGracePeriod ({})",
                    duration::format(v),
                    duration::format(c.shutdown_grace_period)
                ),
            ));
        }
        c.shutdown_grace_period_critical_pods = v;
    }
    if let Some(n) = o.get("registerWithTaints") {
        c.register_with_taints = cx
            .list(n, "registerWithTaints")?
            .iter()
            .enumerate()
            .map(|(i, t)| read_taint(cx, t, &format!("registerWithTaints[{i}]")))
            .collect::<Result<_, _>>()?;
    }
    if let Some(v) = o.boolean("registerNode")? {
        c.register_node = v;
    }
    if let Some(v) = o.string("containerRuntimeEndpoint")?.filter(|s| !s.is_empty()) {
        c.container_runtime_endpoint = v;
    }
    c.image_service_endpoint = o.string("imageServiceEndpoint")?.filter(|s| !s.is_empty());
    if let Some(n) = o.get("featureGates") {
        for (k, v) in cx.map(n, "featureGates")? {
            let on = cx
                .boolean(v, "featureGates")
                .map_err(|e| ConfigError { message: format!("{k:?}: {}", e.message), ..e })?;
            c.feature_gates.insert(k.clone(), on);
        }
    }
    if let Some(v) = o.boolean("seccompDefault")? {
        c.seccomp_default = v;
    }
    if let Some(v) = o.boolean("localStorageCapacityIsolation")? {
        c.local_storage_capacity_isolation = v;
    }
    if let Some(n) = o.get("crashLoopBackOff") {
        let mut b = Object::new(cx, n, "crashLoopBackOff")?;
        if let Some(v) = b.duration("maxContainerRestartPeriod")? {
            let field = "crashLoopBackOff.maxContainerRestartPeriod";
            let at = b.get("maxContainerRestartPeriod").unwrap_or(n);
            if c.feature_gates.get("KubeletCrashLoopBackOffMax") != Some(&true) {
                return Err(cx.err(at, field, "FeatureGate KubeletCrashLoopBackOffMax not enabled"));
            }
            if v < Duration::from_secs(1) || v > Duration::from_secs(300) {
                return Err(cx.err(at, field, format!("{} must be between 1s and 300s", duration::format(v))));
            }
            c.crash_loop_back_off_max = Some(v);
        }
        b.finish()?;
    }
    super::kubelet_extra::read(cx, &mut o, &mut c)?;
    audit::read_unimplemented(cx, &mut o, warnings)?;
    o.finish()?;
    warnings.extend(audit::typed_warnings(&c));
    Ok(c)
}

fn read_authentication(cx: &Ctx, node: &Node, a: &mut Authentication) -> Result<(), ConfigError> {
    let mut o = Object::new(cx, node, "authentication")?;
    if let Some(n) = o.get("x509") {
        let mut x = Object::new(cx, n, "authentication.x509")?;
        a.client_ca_file = x.path("clientCAFile")?;
        x.finish()?;
    }
    if let Some(n) = o.get("webhook") {
        let mut w = Object::new(cx, n, "authentication.webhook")?;
        if let Some(v) = w.boolean("enabled")? {
            a.webhook_enabled = v;
        }
        a.webhook_cache_ttl = w.duration_or("cacheTTL", a.webhook_cache_ttl)?;
        w.finish()?;
    }
    if let Some(n) = o.get("anonymous") {
        let mut an = Object::new(cx, n, "authentication.anonymous")?;
        if let Some(v) = an.boolean("enabled")? {
            a.anonymous_enabled = v;
        }
        an.finish()?;
    }
    o.finish()
}

fn read_authorization(cx: &Ctx, node: &Node, a: &mut Authorization) -> Result<(), ConfigError> {
    let mut o = Object::new(cx, node, "authorization")?;
    if let Some(n) = o.get("mode") {
        a.mode = match cx.string(n, "authorization.mode")?.as_str() {
            "" | "Webhook" => AuthorizationMode::Webhook,
            "AlwaysAllow" => AuthorizationMode::AlwaysAllow,
            other => {
                return Err(cx.err(n, "authorization.mode", format!("{other:?} is not one of AlwaysAllow, Webhook")));
            }
        };
    }
    if let Some(n) = o.get("webhook") {
        let mut w = Object::new(cx, n, "authorization.webhook")?;
        a.webhook_cache_authorized_ttl = w.duration_or("cacheAuthorizedTTL", a.webhook_cache_authorized_ttl)?;
        a.webhook_cache_unauthorized_ttl = w.duration_or("cacheUnauthorizedTTL", a.webhook_cache_unauthorized_ttl)?;
        w.finish()?;
    }
    o.finish()
}

fn read_logging(cx: &Ctx, node: &Node, l: &mut Logging) -> Result<(), ConfigError> {
    let mut o = Object::new(cx, node, "logging")?;
    if let Some(n) = o.get("format") {
        let f = cx.string(n, "logging.format")?;
        match f.as_str() {
            "" => {}
            "text" | "json" => l.format = f,
            other => return Err(cx.err(n, "logging.format", format!("{other:?} is not one of text, json"))),
        }
    }
    if let Some(n) = o.get("flushFrequency") {
        // A duration string, or nanoseconds as an integer (kubeadm writes 0).
        let d = match &n.value {
            Value::Int(ns) if *ns >= 0 => Duration::from_nanos(*ns as u64),
            _ => cx.duration(n, "logging.flushFrequency")?,
        };
        if !d.is_zero() {
            l.flush_frequency = d;
        }
    }
    if let Some(v) = o.int_in("verbosity", 0, u32::MAX as i64)? {
        l.verbosity = v as u32;
    }
    for key in ["vmodule", "options"] {
        if let Some(n) = o.get(key) {
            l.other.insert(key.to_owned(), audit::node_json(n));
        }
    }
    o.finish()
}

fn read_reservation(cx: &Ctx, node: &Node, field: &str) -> Result<Reservation, ConfigError> {
    let mut out = Reservation::new();
    for (k, raw, n) in cx.string_map(node, field)? {
        let Some(r) = ReservedResource::from_name(&k) else {
            return Err(cx.err(n, field, format!("cannot reserve {k:?} (only cpu, memory, ephemeral-storage, pid)")));
        };
        let q: Quantity = raw
            .parse()
            .map_err(|e| cx.err(n, field, format!("{k:?}: {}", super::values::quantity_problem(&raw, &e))))?;
        if q.is_negative() {
            return Err(cx.err(n, field, format!("{k:?}: {raw:?} must not be negative")));
        }
        out.insert(r, q);
    }
    Ok(out)
}

fn read_enforcement(cx: &Ctx, node: &Node, c: &KubeletConfiguration) -> Result<BTreeSet<Enforcement>, ConfigError> {
    let field = "enforceNodeAllocatable";
    let items = cx.list(node, field)?;
    let mut out = BTreeSet::new();
    let mut none = None;
    for item in items {
        let s = cx.string(item, field)?;
        match s.as_str() {
            "" => {}
            "none" => none = Some(item),
            _ => {
                let Some(e) = Enforcement::ALL.into_iter().find(|e| e.as_str() == s) else {
                    return Err(cx.err(
                        item,
                        field,
                        format!(
                            "{s:?} is not one of none, pods, system-reserved, system-reserved-compressible, \
                             kube-reserved, kube-reserved-compressible"
                        ),
                    ));
                };
                let (cgroup, cgroup_field) = match e {
                    Enforcement::SystemReserved | Enforcement::SystemReservedCompressible => {
                        (&c.system_reserved_cgroup, "systemReservedCgroup (--system-reserved-cgroup)")
                    }
                    Enforcement::KubeReserved | Enforcement::KubeReservedCompressible => {
                        (&c.kube_reserved_cgroup, "kubeReservedCgroup (--kube-reserved-cgroup)")
                    }
                    Enforcement::Pods => (&None, ""),
                };
                if e != Enforcement::Pods && cgroup.is_none() {
                    return Err(cx.err(item, field, format!("{s:?} needs {cgroup_field}")));
                }
                out.insert(e);
            }
        }
    }
    for (a, b) in [
        (Enforcement::SystemReserved, Enforcement::SystemReservedCompressible),
        (Enforcement::KubeReserved, Enforcement::KubeReservedCompressible),
    ] {
        if out.contains(&a) && out.contains(&b) {
            return Err(cx.err(node, field, format!("{:?} and {:?} exclude each other", a.as_str(), b.as_str())));
        }
    }
    if let Some(n) = none
        && !out.is_empty()
    {
        return Err(cx.err(n, field, "\"none\" cannot be combined with other enforcements"));
    }
    Ok(out)
}

fn read_taint(cx: &Ctx, node: &Node, field: &str) -> Result<Taint, ConfigError> {
    let mut o = Object::new(cx, node, field)?;
    let key = o.string("key")?.unwrap_or_default();
    let value = o.string("value")?.filter(|v| !v.is_empty());
    let effect = o.string("effect")?.unwrap_or_default();
    // timeAdded is set by the API server for NoExecute taints; accept it.
    o.get("timeAdded");
    o.finish()?;
    let spec = match &value {
        Some(v) => format!("{key}={v}:{effect}"),
        None => format!("{key}:{effect}"),
    };
    if let Err(why) = validation::qualified_name(&key) {
        return Err(cx.err(node, field, format!("taint {spec:?}: key {key:?} {why}")));
    }
    if let Some(v) = &value
        && let Err(why) = validation::label_value(v)
    {
        return Err(cx.err(node, field, format!("taint {spec:?}: value {v:?} {why}")));
    }
    if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect.as_str()) {
        let why = if effect.is_empty() { "needs an effect".to_owned() } else { format!("has effect {effect:?}") };
        return Err(cx.err(
            node,
            field,
            format!("taint {spec:?} {why}: expected NoSchedule, PreferNoSchedule or NoExecute"),
        ));
    }
    Ok(Taint { key, value, effect, time_added: None })
}

/// evictionHard, evictionSoft, evictionSoftGracePeriod,
/// evictionMinimumReclaim, evictionPressureTransitionPeriod,
/// evictionMaxPodGracePeriod and mergeDefaultEvictionSettings.
fn read_eviction(cx: &Ctx, o: &mut Object, c: &mut KubeletConfiguration) -> Result<(), ConfigError> {
    let statements = |entry: Option<(&'static str, &Node)>| -> Result<Vec<(String, String, Node)>, ConfigError> {
        match entry {
            Some((field, n)) => Ok(cx.string_map(n, field)?.into_iter().map(|(k, v, n)| (k, v, n.clone())).collect()),
            None => Ok(vec![]),
        }
    };
    if let Some(v) = o.boolean("mergeDefaultEvictionSettings")? {
        c.merge_default_eviction_settings = v;
    }
    let hard = o.get("evictionHard").map(|n| ("evictionHard", n));
    let soft = o.get("evictionSoft").map(|n| ("evictionSoft", n));
    let grace = o.get("evictionSoftGracePeriod").map(|n| ("evictionSoftGracePeriod", n));
    let reclaim = o.get("evictionMinimumReclaim").map(|n| ("evictionMinimumReclaim", n));

    let mut reclaims = BTreeMap::new();
    for (k, v, n) in statements(reclaim)? {
        let (s, r) = thresholds::parse_min_reclaim(&k, &v).map_err(|m| cx.err(&n, "evictionMinimumReclaim", m))?;
        reclaims.insert(s, r);
    }
    let mut graces = BTreeMap::new();
    for (k, v, n) in statements(grace)? {
        let (s, g) = thresholds::parse_grace_period(&k, &v).map_err(|m| cx.err(&n, "evictionSoftGracePeriod", m))?;
        graces.insert(s, g);
    }
    let parse_all = |field: &str, entries: Vec<(String, String, Node)>| {
        let mut out = BTreeMap::new();
        let mut nodes = BTreeMap::new();
        for (k, v, n) in entries {
            if let Some((s, t)) = thresholds::parse_threshold(&k, &v).map_err(|m| cx.err(&n, field, m))? {
                out.insert(s, t);
                nodes.insert(s, n);
            }
        }
        Ok::<_, ConfigError>((out, nodes))
    };
    // Absent (or null) evictionHard means the defaults; the loader has
    // already put them in the tree so drop-ins merge into them as upstream.
    let hard_entries = match hard {
        Some(_) => statements(hard)?,
        None => thresholds::DEFAULT_EVICTION_HARD
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned(), Node::str(*v, super::tree::Origin::Default)))
            .collect(),
    };
    let (mut hard_map, _) = parse_all("evictionHard", hard_entries)?;
    if c.merge_default_eviction_settings {
        // Signals the configuration names (even as 0%) keep their value.
        for (k, v) in thresholds::DEFAULT_EVICTION_HARD {
            let present = hard.and_then(|(_, n)| n.get(k)).is_some();
            if !present && let Ok(Some((s, t))) = thresholds::parse_threshold(k, v) {
                hard_map.insert(s, t);
            }
        }
    }
    let (soft_map, soft_nodes) = parse_all("evictionSoft", statements(soft)?)?;
    c.eviction_hard = thresholds::hard_thresholds(&hard_map, &reclaims);
    c.eviction_soft = thresholds::soft_thresholds(&soft_map, &graces, &reclaims).map_err(|signal| {
        cx.err(
            &soft_nodes[&signal],
            "evictionSoft",
            format!(
                "{:?} has no grace period: set it in evictionSoftGracePeriod (--eviction-soft-grace-period)",
                signal.name()
            ),
        )
    })?;
    c.eviction_soft_grace_period = graces;
    c.eviction_minimum_reclaim = reclaims;
    c.eviction_pressure_transition_period =
        o.duration_or("evictionPressureTransitionPeriod", c.eviction_pressure_transition_period)?;
    if let Some(v) = o.int_in("evictionMaxPodGracePeriod", i32::MIN as i64, i32::MAX as i64)? {
        c.eviction_max_pod_grace_period = v as i32;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_print_as_kubernetes_does() {
        for (input, want) in [
            ("500m", "500m"),
            ("1", "1"),
            ("1.5", "1500m"),
            ("2Gi", "2Gi"),
            ("100Mi", "100Mi"),
            ("1536Mi", "1536Mi"),
            ("100M", "100M"),
            ("1000", "1k"),
            ("1537", "1537"),
            ("0", "0"),
            ("10Mi", "10Mi"),
        ] {
            assert_eq!(format_quantity(&input.parse().unwrap()), want, "{input}");
        }
    }
}
