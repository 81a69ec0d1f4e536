//! Every field of KubeletConfiguration v1beta1, set to a value that is not
//! the kubelet's default: each is either implemented (the value reaches
//! /configz), or logged at start as not implemented (and /configz keeps
//! what is in effect), or refused with an error naming it. The list is the
//! upstream type's, kept here independently of `audit`'s tables so a field
//! missing from them fails this test.

use serde_json::Value as Json;

use super::{ConfigFs, audit, load_with};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    Implemented,
    Warned,
    Refused,
}

use Want::*;

/// (field, YAML of a non-default value, what happens).
const FIELDS: &[(&str, &str, Want)] = &[
    ("enableServer", "false", Implemented),
    ("staticPodPath", "/etc/kubernetes/manifests", Implemented),
    ("podLogsDir", "/srv/pod-logs", Implemented),
    ("syncFrequency", "30s", Implemented),
    ("fileCheckFrequency", "10s", Implemented),
    ("httpCheckFrequency", "5s", Warned),
    ("staticPodURL", "http://example.com/pods", Warned),
    ("staticPodURLHeader", "{a: [b]}", Warned),
    ("address", "127.0.0.1", Implemented),
    ("port", "10260", Implemented),
    ("readOnlyPort", "10255", Implemented),
    ("tlsCertFile", "/etc/kubelet.crt", Implemented),
    ("tlsPrivateKeyFile", "/etc/kubelet.key", Implemented),
    ("tlsCipherSuites", "[TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]", Implemented),
    ("tlsCurvePreferences", "[23]", Warned),
    ("tlsMinVersion", "VersionTLS13", Implemented),
    ("rotateCertificates", "true", Implemented),
    ("serverTLSBootstrap", "true", Implemented),
    ("authentication", "{anonymous: {enabled: true}}", Implemented),
    ("authorization", "{mode: AlwaysAllow}", Implemented),
    ("registryPullQPS", "7", Implemented),
    ("registryBurst", "20", Implemented),
    ("imagePullCredentialsVerificationPolicy", "AlwaysVerify", Warned),
    ("preloadedImagesVerificationAllowlist", "[registry.k8s.io/pause]", Warned),
    ("eventRecordQPS", "9", Implemented),
    ("eventBurst", "19", Implemented),
    ("enableDebuggingHandlers", "false", Implemented),
    ("enableContentionProfiling", "true", Warned),
    ("healthzPort", "10249", Implemented),
    ("healthzBindAddress", "0.0.0.0", Implemented),
    ("oomScoreAdj", "-500", Implemented),
    ("clusterDomain", "cluster.local", Implemented),
    ("clusterDNS", "[10.96.0.10]", Implemented),
    ("streamingConnectionIdleTimeout", "1h", Implemented),
    ("nodeStatusUpdateFrequency", "20s", Implemented),
    ("nodeStatusReportFrequency", "1m", Implemented),
    ("nodeLeaseDurationSeconds", "60", Implemented),
    ("imageMinimumGCAge", "5m", Implemented),
    ("imageMaximumGCAge", "24h", Implemented),
    ("imageGCHighThresholdPercent", "90", Implemented),
    ("imageGCLowThresholdPercent", "70", Implemented),
    ("volumeStatsAggPeriod", "2m", Implemented),
    ("kubeletCgroups", "/kubelet", Warned),
    ("systemCgroups", "/system", Warned),
    ("cgroupRoot", "/custom", Implemented),
    ("cgroupsPerQOS", "false", Refused),
    ("cgroupDriver", "systemd", Implemented),
    ("cpuManagerPolicy", "static", Refused),
    ("singleProcessOOMKill", "true", Implemented),
    ("cpuManagerPolicyOptions", "{full-pcpus-only: \"true\"}", Warned),
    ("cpuManagerReconcilePeriod", "5s", Warned),
    ("memoryManagerPolicy", "Static", Refused),
    ("topologyManagerPolicy", "single-numa-node", Refused),
    ("topologyManagerScope", "pod", Warned),
    ("topologyManagerPolicyOptions", "{prefer-closest-numa-nodes: \"true\"}", Warned),
    ("qosReserved", "{memory: 50%}", Refused),
    ("runtimeRequestTimeout", "5m", Implemented),
    ("hairpinMode", "hairpin-veth", Warned),
    ("maxPods", "50", Implemented),
    ("podCIDR", "10.244.0.0/24", Warned),
    ("podPidsLimit", "1024", Implemented),
    ("resolvConf", "/run/systemd/resolve/resolv.conf", Implemented),
    ("runOnce", "true", Refused),
    ("cpuCFSQuota", "false", Implemented),
    ("cpuCFSQuotaPeriod", "50ms", Implemented),
    ("nodeStatusMaxImages", "10", Implemented),
    ("maxOpenFiles", "65536", Implemented),
    ("contentType", "application/yaml", Warned),
    ("kubeAPIQPS", "25", Implemented),
    ("kubeAPIBurst", "60", Implemented),
    ("serializeImagePulls", "false", Implemented),
    ("maxParallelImagePulls", "3", Implemented),
    ("evictionHard", "{memory.available: 200Mi}", Implemented),
    ("evictionSoft", "{memory.available: 300Mi}", Implemented),
    ("evictionSoftGracePeriod", "{memory.available: 30s}", Implemented),
    ("evictionPressureTransitionPeriod", "1m", Implemented),
    ("evictionMaxPodGracePeriod", "60", Implemented),
    ("evictionMinimumReclaim", "{memory.available: 100Mi}", Implemented),
    ("mergeDefaultEvictionSettings", "true", Implemented),
    ("podsPerCore", "10", Implemented),
    ("enableControllerAttachDetach", "false", Warned),
    ("protectKernelDefaults", "true", Implemented),
    ("makeIPTablesUtilChains", "true", Warned),
    ("iptablesMasqueradeBit", "13", Warned),
    ("iptablesDropBit", "16", Warned),
    ("featureGates", "{KubeletFineGrainedAuthz: false}", Implemented),
    ("failSwapOn", "false", Implemented),
    ("memorySwap", "{swapBehavior: LimitedSwap}", Refused),
    ("containerLogMaxSize", "20Mi", Implemented),
    ("containerLogMaxFiles", "3", Implemented),
    ("containerLogMaxWorkers", "4", Warned),
    ("containerLogMonitorInterval", "30s", Warned),
    ("configMapAndSecretChangeDetectionStrategy", "Cache", Warned),
    ("systemReserved", "{cpu: 500m}", Implemented),
    ("kubeReserved", "{memory: 1Gi}", Implemented),
    ("reservedSystemCPUs", "\"0-1\"", Implemented),
    ("showHiddenMetricsForVersion", "\"1.32\"", Warned),
    ("systemReservedCgroup", "/system.slice", Implemented),
    ("kubeReservedCgroup", "/kube.slice", Implemented),
    ("enforceNodeAllocatable", "[none]", Implemented),
    ("allowedUnsafeSysctls", "[\"net.core.somaxconn\"]", Implemented),
    ("defaultPodSysctls", "{net.core.somaxconn: \"1024\"}", Refused),
    ("volumePluginDir", "/opt/volume-plugins", Warned),
    ("providerID", "aws:///eu-west-1a/i-0123", Implemented),
    ("kernelMemcgNotification", "true", Warned),
    ("logging", "{verbosity: 3}", Implemented),
    ("enableSystemLogHandler", "true", Warned),
    ("enableSystemLogQuery", "true", Warned),
    ("shutdownGracePeriod", "30s", Implemented),
    ("shutdownGracePeriodCriticalPods", "0s", Implemented),
    ("shutdownGracePeriodByPodPriority", "[{priority: 0, shutdownGracePeriodSeconds: 30}]", Refused),
    ("crashLoopBackOff", "{maxContainerRestartPeriod: 60s}", Implemented),
    ("reservedMemory", "[{numaNode: 0, limits: {memory: 1Gi}}]", Refused),
    ("enableProfilingHandler", "true", Warned),
    ("enableDebugFlagsHandler", "true", Warned),
    ("seccompDefault", "true", Implemented),
    ("memoryThrottlingFactor", "0.8", Warned),
    ("memoryReservationPolicy", "Reserve", Warned),
    ("registerWithTaints", "[{key: a, effect: NoSchedule}]", Implemented),
    ("registerNode", "false", Implemented),
    ("tracing", "{samplingRatePerMillion: 1}", Warned),
    ("localStorageCapacityIsolation", "false", Implemented),
    ("containerRuntimeEndpoint", "unix:///run/crio/crio.sock", Implemented),
    ("imageServiceEndpoint", "unix:///run/images.sock", Implemented),
    ("failCgroupV1", "true", Implemented),
    ("userNamespaces", "{idsPerPod: 131072}", Warned),
];

struct Mem(Vec<(String, String)>);

impl ConfigFs for Mem {
    fn read_to_string(&self, path: &std::path::Path) -> std::io::Result<String> {
        self.0
            .iter()
            .find(|(p, _)| std::path::Path::new(p) == path)
            .map(|(_, t)| t.clone())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
    }

    fn read_dir(&self, _dir: &std::path::Path) -> std::io::Result<Vec<(std::path::PathBuf, bool)>> {
        Ok(vec![])
    }
}

fn load(body: &str) -> Result<super::Config, String> {
    let text = format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{body}");
    load_with(["--config=/k.yaml"], &Mem(vec![("/k.yaml".into(), text)])).map_err(|e| e.to_string())
}

fn configz_field(c: &super::Config, field: &str) -> Json {
    c.configz()["kubeletconfig"].get(field).cloned().unwrap_or(Json::Null)
}

#[test]
fn every_v1beta1_field_is_implemented_warned_or_refused() {
    let defaults = load("").expect("an empty configuration loads");
    let mut failures = vec![];
    for (field, value, want) in FIELDS {
        // crashLoopBackOff needs its gate; shutdownGracePeriodCriticalPods
        // needs a grace period to fit in.
        let extra = match *field {
            "crashLoopBackOff" => "featureGates: {KubeletCrashLoopBackOffMax: true}\n",
            "shutdownGracePeriodCriticalPods" => "shutdownGracePeriod: 30s\n",
            "evictionSoft" => "evictionSoftGracePeriod: {memory.available: 30s}\n",
            _ => "",
        };
        let loaded = load(&format!("{extra}{field}: {value}\n"));
        let named = |w: &String| w.starts_with(&format!("KubeletConfiguration {field}:"));
        let got = match &loaded {
            Err(e) if e.contains(&format!(": {field}: ")) => Refused,
            Err(e) => {
                failures.push(format!("{field}: unexpected error {e}"));
                continue;
            }
            Ok(c) if c.warnings.iter().any(named) => {
                if configz_field(c, field) != configz_field(&defaults, field) {
                    failures.push(format!("{field}: warned, but /configz shows the value asked for"));
                }
                Warned
            }
            Ok(c) => {
                let base = if extra.is_empty() { &defaults } else { &load(extra).expect("the extra loads") };
                if configz_field(c, field) == configz_field(base, field) && *field != "shutdownGracePeriodCriticalPods"
                {
                    failures.push(format!("{field}: neither warned nor in /configz ({})", configz_field(c, field)));
                }
                Implemented
            }
        };
        if got != *want {
            failures.push(format!("{field}: {got:?}, expected {want:?} ({loaded:?})"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_audit_tables_name_exactly_the_upstream_fields() {
    let upstream: Vec<&str> = FIELDS.iter().map(|(f, _, _)| *f).collect();
    for f in audit::IMPLEMENTED.iter().copied().chain(audit::UNIMPLEMENTED.iter().map(|u| u.name)) {
        assert!(upstream.contains(&f), "{f} is not a KubeletConfiguration v1beta1 field");
    }
    for f in &upstream {
        let listed = audit::IMPLEMENTED.contains(f) || audit::unimplemented(f).is_some();
        assert!(listed, "{f} is in neither audit table");
    }
}

#[test]
fn warnings_are_one_line_per_field_and_the_default_is_quiet() {
    let c = load("hairpinMode: promiscuous-bridge\ncpuManagerReconcilePeriod: 0s\nmemorySwap: {}\n").unwrap();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    let c = load("hairpinMode: hairpin-veth\nfeatureGates: {MemoryQoS: true}\n").unwrap();
    assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
}
