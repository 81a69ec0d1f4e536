//! The configuration rendered back for /configz, with the kubelet's field
//! names and the quantity formatting Kubernetes prints.

use std::{path::PathBuf, time::Duration};

use serde_json::{Value as Json, json};

use super::{configuration::KubeletConfiguration, resources::Reservation};
use crate::{
    config::{CgroupDriver, duration, thresholds},
    eviction::signal::EvictionThreshold,
    quantity::Quantity,
};

impl KubeletConfiguration {
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
        put("volumeStatsAggPeriod", d(self.volume_stats_agg_period));
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
