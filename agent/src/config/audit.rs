//! What swiftlet does with each KubeletConfiguration (v1beta1) field, so
//! that nothing accepted is silently ignored:
//!
//! - **implemented**: read into [`KubeletConfiguration`]'s typed fields
//!   and acted on ([`IMPLEMENTED`]);
//! - **warned**: accepted and type-checked, but swiftlet behaves as with
//!   the value it has in effect; any other value is logged once at start
//!   as not implemented, and /configz shows the value in effect, not the
//!   one asked for ([`UNIMPLEMENTED`] with [`Treatment::Warned`]);
//! - **refused**: a value that would change what a pod gets (exclusive
//!   CPUs, NUMA placement, reserved QoS memory) stops the start with an
//!   error naming the field ([`Treatment::Refused`]).
//!
//! Feature gates follow the same rule: the gates swiftlet reads are in
//! [`HONOURED_GATES`]; any other gate that is set is logged.
//!
//! [`KubeletConfiguration`]: super::KubeletConfiguration

use std::collections::BTreeMap;

use serde_json::{Value as Json, json};

use super::{
    duration,
    error::ConfigError,
    kubelet::KubeletConfiguration,
    tree::{Node, Value},
    values::{Ctx, Object},
};

/// Every field swiftlet reads into a typed value and acts on.
pub const IMPLEMENTED: &[&str] = &[
    "enableServer",
    "staticPodPath",
    "podLogsDir",
    "syncFrequency",
    "volumeStatsAggPeriod",
    "fileCheckFrequency",
    "address",
    "port",
    "readOnlyPort",
    "tlsCertFile",
    "tlsPrivateKeyFile",
    "tlsCipherSuites",
    "tlsMinVersion",
    "authentication",
    "authorization",
    "registryPullQPS",
    "registryBurst",
    "eventRecordQPS",
    "eventBurst",
    "enableDebuggingHandlers",
    "healthzPort",
    "healthzBindAddress",
    "oomScoreAdj",
    "clusterDomain",
    "clusterDNS",
    "nodeStatusUpdateFrequency",
    "nodeStatusReportFrequency",
    "nodeLeaseDurationSeconds",
    "imageMinimumGCAge",
    "imageMaximumGCAge",
    "imageGCHighThresholdPercent",
    "imageGCLowThresholdPercent",
    "cgroupRoot",
    "cgroupDriver",
    "runtimeRequestTimeout",
    "maxPods",
    "podPidsLimit",
    "resolvConf",
    "cpuCFSQuota",
    "cpuCFSQuotaPeriod",
    "nodeStatusMaxImages",
    "kubeAPIQPS",
    "kubeAPIBurst",
    "serializeImagePulls",
    "maxParallelImagePulls",
    "evictionHard",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionPressureTransitionPeriod",
    "evictionMaxPodGracePeriod",
    "evictionMinimumReclaim",
    "mergeDefaultEvictionSettings",
    "podsPerCore",
    "featureGates",
    "failSwapOn",
    "containerLogMaxSize",
    "containerLogMaxFiles",
    "systemReserved",
    "kubeReserved",
    "reservedSystemCPUs",
    "enforceNodeAllocatable",
    "allowedUnsafeSysctls",
    "providerID",
    "logging",
    "shutdownGracePeriod",
    "shutdownGracePeriodCriticalPods",
    "crashLoopBackOff",
    "seccompDefault",
    "registerWithTaints",
    "registerNode",
    "localStorageCapacityIsolation",
    "containerRuntimeEndpoint",
    "imageServiceEndpoint",
    "failCgroupV1",
    "singleProcessOOMKill",
    "maxOpenFiles",
    "protectKernelDefaults",
    "rotateCertificates",
    "serverTLSBootstrap",
    "streamingConnectionIdleTimeout",
    // Limited with the reservations when enforceNodeAllocatable names them.
    "systemReservedCgroup",
    "kubeReservedCgroup",
];

/// How an accepted field is type-checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Bool,
    Int,
    Float,
    Str,
    Duration,
    StrList,
    StrMap,
    /// Structured; kept as given.
    Any,
}

/// What happens to a value other than the one in effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Treatment {
    /// Logged at start as not implemented.
    Warned,
    /// The start is refused with an error naming the field.
    Refused,
}

/// A field swiftlet accepts without acting on.
#[derive(Clone, Copy, Debug)]
pub struct Unimplemented {
    pub name: &'static str,
    pub kind: Kind,
    pub treatment: Treatment,
    /// What swiftlet does, as JSON text (None: nothing; the field is left
    /// out of /configz).
    pub in_effect: Option<&'static str>,
    /// Other values that change nothing (the kubelet's default where it
    /// only differs from `in_effect` in name), as JSON text.
    pub quiet: &'static [&'static str],
    /// Why, for the log line or the error.
    pub why: &'static str,
}

const fn warned(name: &'static str, kind: Kind, in_effect: Option<&'static str>, why: &'static str) -> Unimplemented {
    Unimplemented { name, kind, treatment: Treatment::Warned, in_effect, quiet: &[], why }
}

const fn refused(name: &'static str, kind: Kind, in_effect: Option<&'static str>, why: &'static str) -> Unimplemented {
    Unimplemented { name, kind, treatment: Treatment::Refused, in_effect, quiet: &[], why }
}

use Kind::*;

/// Every field swiftlet accepts without acting on.
pub const UNIMPLEMENTED: &[Unimplemented] = &[
    warned("staticPodURL", Str, None, "static pods come only from staticPodPath"),
    warned("staticPodURLHeader", Any, None, "static pods come only from staticPodPath"),
    warned("httpCheckFrequency", Duration, Some("\"20s\""), "static pods come only from staticPodPath"),
    warned("tlsCurvePreferences", Any, None, "TLS key exchange uses rustls's default curves"),
    warned(
        "imagePullCredentialsVerificationPolicy",
        Str,
        None,
        "images already on the node are used without checking the pod's own credentials",
    ),
    warned(
        "preloadedImagesVerificationAllowlist",
        StrList,
        None,
        "images already on the node are used without checking the pod's own credentials",
    ),
    warned("enableContentionProfiling", Bool, Some("false"), "no profiling handlers are served"),
    warned("kubeletCgroups", Str, None, "swiftlet stays in the cgroup it was started in"),
    refused(
        "cgroupsPerQOS",
        Bool,
        Some("true"),
        "pods always get the kubepods, burstable and besteffort cgroups; only true is supported",
    ),
    warned("systemCgroups", Str, None, "non-kernel processes are not moved to a system cgroup"),
    refused(
        "cpuManagerPolicy",
        Str,
        Some("\"none\""),
        "swiftlet has no CPU manager, so Guaranteed pods would not get exclusive CPUs; only \"none\" is supported",
    ),
    warned("cpuManagerPolicyOptions", StrMap, None, "swiftlet has no CPU manager"),
    warned("cpuManagerReconcilePeriod", Duration, Some("\"10s\""), "swiftlet has no CPU manager"),
    refused(
        "memoryManagerPolicy",
        Str,
        Some("\"None\""),
        "swiftlet has no memory manager, so pods would not get NUMA-pinned memory; only \"None\" is supported",
    ),
    refused(
        "topologyManagerPolicy",
        Str,
        Some("\"none\""),
        "swiftlet has no topology manager, so pods would not be aligned to NUMA nodes; only \"none\" is supported",
    ),
    warned("topologyManagerScope", Str, Some("\"container\""), "swiftlet has no topology manager"),
    warned("topologyManagerPolicyOptions", StrMap, None, "swiftlet has no topology manager"),
    refused(
        "qosReserved",
        StrMap,
        None,
        "the QoS cgroups' memory is not reserved for higher QoS classes, so Burstable and BestEffort pods would not \
         be limited as asked; only an empty map is supported",
    ),
    Unimplemented {
        quiet: &["\"promiscuous-bridge\""],
        ..warned("hairpinMode", Str, Some("\"none\""), "the runtime's CNI network configures hairpin traffic")
    },
    warned("podCIDR", Str, None, "the runtime's CNI network assigns pod addresses"),
    refused(
        "runOnce",
        Bool,
        Some("false"),
        "swiftlet keeps running its pods; run-once mode is not supported, only false",
    ),
    Unimplemented {
        quiet: &["\"application/vnd.kubernetes.protobuf\""],
        ..warned("contentType", Str, Some("\"application/json\""), "API requests are JSON")
    },
    warned("enableControllerAttachDetach", Bool, Some("true"), "volumes are never attached by the node"),
    warned("makeIPTablesUtilChains", Bool, Some("false"), "no iptables chains are created"),
    Unimplemented { quiet: &["14"], ..warned("iptablesMasqueradeBit", Int, None, "no iptables chains are created") },
    Unimplemented { quiet: &["15"], ..warned("iptablesDropBit", Int, None, "no iptables chains are created") },
    Unimplemented {
        quiet: &["{\"swapBehavior\":\"NoSwap\"}", "{\"swapBehavior\":\"\"}"],
        ..refused(
            "memorySwap",
            Any,
            None,
            "pods get no swap; only swapBehavior NoSwap is supported (LimitedSwap would give Burstable pods swap)",
        )
    },
    warned("containerLogMaxWorkers", Int, Some("1"), "logs are rotated by one worker"),
    warned("containerLogMonitorInterval", Duration, Some("\"10s\""), "logs are checked every 10s"),
    Unimplemented {
        quiet: &["\"Watch\""],
        ..warned(
            "configMapAndSecretChangeDetectionStrategy",
            Str,
            Some("\"Get\""),
            "ConfigMaps and Secrets are read again every syncFrequency",
        )
    },
    warned("showHiddenMetricsForVersion", Str, None, "hidden metrics are never shown"),
    refused("defaultPodSysctls", StrMap, None, "pods would not get these sysctls; only an empty map is supported"),
    warned("volumePluginDir", Str, None, "FlexVolume plugins are not supported"),
    warned(
        "kernelMemcgNotification",
        Bool,
        Some("false"),
        "memory thresholds come from swiftlet's own kernel programs or cgroup notifications",
    ),
    warned("enableSystemLogHandler", Bool, Some("false"), "/logs is not served"),
    warned("enableSystemLogQuery", Bool, Some("false"), "/logs is not served"),
    refused(
        "shutdownGracePeriodByPodPriority",
        Any,
        None,
        "node shutdown grace periods come from shutdownGracePeriod and shutdownGracePeriodCriticalPods; pods would \
         not get these per-priority grace periods",
    ),
    refused("reservedMemory", Any, None, "swiftlet has no memory manager, so no memory is reserved per NUMA node"),
    warned("enableProfilingHandler", Bool, Some("false"), "/debug/pprof is not served"),
    warned("enableDebugFlagsHandler", Bool, Some("false"), "/debug/flags/v is not served"),
    warned("memoryThrottlingFactor", Float, Some("0.9"), "memory QoS (memory.high) is not set"),
    warned("memoryReservationPolicy", Str, None, "memory QoS (memory.min) is not set"),
    warned("tracing", Any, None, "no traces are exported"),
    warned("userNamespaces", Any, None, "user namespaces are the runtime's; see hostUsers"),
];

/// Feature gates swiftlet reads; every other gate that is set is logged.
pub const HONOURED_GATES: &[&str] = &["KubeletCrashLoopBackOffMax", "KubeletFineGrainedAuthz"];

/// The audit entry of a field swiftlet does not implement.
pub fn unimplemented(name: &str) -> Option<&'static Unimplemented> {
    UNIMPLEMENTED.iter().find(|f| f.name == name)
}

/// A node as JSON, for fields kept verbatim.
pub fn node_json(node: &Node) -> Json {
    match &node.value {
        Value::Null => Json::Null,
        Value::Bool(b) => json!(b),
        Value::Int(i) => json!(i),
        Value::Float(f) => json!(f),
        Value::Str(s) => json!(s),
        Value::List(items) => Json::Array(items.iter().map(node_json).collect()),
        Value::Map(entries) => Json::Object(entries.iter().map(|(k, v)| (k.clone(), node_json(v))).collect()),
    }
}

fn typed(cx: &Ctx, node: &Node, field: &str, kind: Kind) -> Result<Json, ConfigError> {
    match kind {
        Kind::Bool => cx.boolean(node, field).map(|b| json!(b)),
        Kind::Int => cx.int(node, field).map(|i| json!(i)),
        Kind::Float => cx.float(node, field).map(|f| json!(f)),
        Kind::Str => cx.string(node, field).map(|s| json!(s)),
        Kind::Duration => cx.duration(node, field).map(|d| json!(duration::format(d))),
        Kind::StrList => cx.string_list(node, field).map(|l| json!(l)),
        Kind::StrMap => cx.string_map(node, field).map(|e| e.into_iter().map(|(k, v, _)| (k, json!(v))).collect()),
        Kind::Any => Ok(node_json(node)),
    }
}

/// Values that mean "the default" in the kubelet's decoding: empty
/// strings, lists and maps, and zero durations (kubeadm writes `0s`).
fn means_default(v: &Json) -> bool {
    match v {
        Json::Null => true,
        Json::String(s) => s.is_empty() || s == "0s",
        Json::Array(a) => a.is_empty(),
        Json::Object(m) => m.is_empty(),
        _ => false,
    }
}

fn parse(text: &str) -> Json {
    serde_json::from_str(text).unwrap_or(Json::Null)
}

/// Whether `given` changes nothing for `field`.
pub fn is_in_effect(field: &Unimplemented, given: &Json) -> bool {
    means_default(given)
        || field.in_effect.is_some_and(|e| parse(e) == *given)
        || field.quiet.iter().any(|q| parse(q) == *given)
}

/// The values in effect of the accepted fields, as /configz shows them.
pub fn in_effect_defaults() -> BTreeMap<String, Json> {
    UNIMPLEMENTED.iter().filter_map(|f| Some((f.name.to_owned(), parse(f.in_effect?)))).collect()
}

/// The start-time line for a field set to a value swiftlet does not act on.
pub fn warning(field: &Unimplemented, given: &Json) -> String {
    let effect = match field.in_effect {
        Some(e) => format!("; in effect: {e}"),
        None => String::new(),
    };
    format!("KubeletConfiguration {}: {given} is not implemented ({}){effect}", field.name, field.why)
}

/// Reads every accepted-but-unimplemented field of the top-level object:
/// type-checks it, refuses values that would change what a pod gets, and
/// returns the /configz values in effect and the warnings for the log.
pub fn read_unimplemented(cx: &Ctx, o: &mut Object, warnings: &mut Vec<String>) -> Result<(), ConfigError> {
    for field in UNIMPLEMENTED {
        let Some(n) = o.get(field.name) else { continue };
        let given = typed(cx, n, field.name, field.kind)?;
        if is_in_effect(field, &given) {
            continue;
        }
        match field.treatment {
            Treatment::Refused => {
                return Err(cx.err(n, field.name, format!("{given} is not supported: {}", field.why)));
            }
            // /configz keeps showing the value in effect.
            Treatment::Warned => warnings.push(warning(field, &given)),
        }
    }
    Ok(())
}

/// Warnings for typed fields with a part swiftlet does not act on: feature
/// gates it does not read.
pub fn typed_warnings(c: &KubeletConfiguration) -> Vec<String> {
    gate_warnings(&c.feature_gates)
}

/// Warnings for feature gates swiftlet does not read.
pub fn gate_warnings(gates: &BTreeMap<String, bool>) -> Vec<String> {
    gates
        .iter()
        .filter(|(name, _)| !HONOURED_GATES.contains(&name.as_str()))
        .map(|(name, on)| {
            format!(
                "KubeletConfiguration featureGates: {name}={on} is not implemented (swiftlet does not read this gate; \
                 the feature behaves as swiftlet documents it)"
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_consistent() {
        let mut names: Vec<&str> = UNIMPLEMENTED.iter().map(|f| f.name).chain(IMPLEMENTED.iter().copied()).collect();
        let before = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), before, "a field is listed twice");
        for f in UNIMPLEMENTED {
            for text in f.in_effect.iter().chain(f.quiet) {
                assert!(serde_json::from_str::<Json>(text).is_ok(), "{}: {text}", f.name);
            }
        }
    }

    #[test]
    fn defaults_and_values_in_effect_are_quiet() {
        let f = unimplemented("cpuManagerPolicy").unwrap();
        assert!(is_in_effect(f, &json!("none")));
        assert!(is_in_effect(f, &json!("")));
        assert!(!is_in_effect(f, &json!("static")));
        let f = unimplemented("cpuManagerReconcilePeriod").unwrap();
        assert!(is_in_effect(f, &json!("0s")), "kubeadm's zero duration");
        assert!(is_in_effect(f, &json!("10s")));
        assert!(!is_in_effect(f, &json!("5s")));
        let f = unimplemented("hairpinMode").unwrap();
        assert!(is_in_effect(f, &json!("promiscuous-bridge")), "the kubelet's default");
        assert!(!is_in_effect(f, &json!("hairpin-veth")));
        let f = unimplemented("memorySwap").unwrap();
        assert!(is_in_effect(f, &json!({})));
        assert!(is_in_effect(f, &json!({"swapBehavior": "NoSwap"})));
        assert!(!is_in_effect(f, &json!({"swapBehavior": "LimitedSwap"})));
        assert_eq!(
            warning(unimplemented("cpuManagerReconcilePeriod").unwrap(), &json!("5s")),
            "KubeletConfiguration cpuManagerReconcilePeriod: \"5s\" is not implemented (swiftlet has no CPU manager); \
             in effect: \"10s\""
        );
    }

    #[test]
    fn gates_swiftlet_reads_are_quiet() {
        let gates = BTreeMap::from([("KubeletFineGrainedAuthz".to_owned(), false), ("MemoryQoS".to_owned(), true)]);
        let w = gate_warnings(&gates);
        assert_eq!(w.len(), 1);
        assert!(w[0].starts_with("KubeletConfiguration featureGates: MemoryQoS=true is not implemented"), "{w:?}");
    }
}
