//! swiftlet's own Prometheus metrics (served on :10250/metrics), with the
//! kubelet's well-known names where one exists.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabels {
    pub signal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionSignalLabels {
    pub eviction_signal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ThresholdLabels {
    pub signal: String,
    /// "hard" or "soft".
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConditionLabels {
    pub condition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KillPathLabels {
    /// "kernel" (killed by BPF), "agent" (the userspace fast path) or
    /// "graceful" (soft eviction through the runtime).
    pub path: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `executed`, or the check that refused the plan (`no_plan`,
    /// `victim_gone`, `plan_too_old`, ...).
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    pub mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NameLabels {
    pub name: String,
}

/// `operation_type`: the CRI call in the kubelet's snake_case
/// (`list_containers`, `pull_image`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub operation_type: String,
}

/// `container_state`: created, running, exited or unknown.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerStateLabels {
    pub container_state: String,
}

/// The kubelet's runtime metrics (served on /metrics beside swiftlet's
/// own), with the kubelet's names, labels and buckets: the runtime client
/// records its calls; running pods and containers are set from the runtime
/// by the stats collector. (The pod side's are in `pods::metrics`.)
pub struct KubeletMetrics {
    /// kubelet_runtime_operations_total{operation_type}
    pub runtime_operations: Family<OperationLabels, Counter>,
    /// kubelet_runtime_operations_errors_total{operation_type}
    pub runtime_operations_errors: Family<OperationLabels, Counter>,
    /// kubelet_runtime_operations_duration_seconds{operation_type}
    pub runtime_operations_duration: Family<OperationLabels, Histogram>,
    /// kubelet_running_pods: pods with a running sandbox.
    pub running_pods: Gauge,
    /// kubelet_running_containers{container_state}
    pub running_containers: Family<ContainerStateLabels, Gauge>,
}

fn runtime_histogram() -> Histogram {
    // The kubelet's ExponentialBuckets(.005, 2.5, 14).
    Histogram::new(exponential_buckets(0.005, 2.5, 14))
}

impl KubeletMetrics {
    fn register(registry: &mut Registry) -> KubeletMetrics {
        let m = KubeletMetrics {
            runtime_operations: Family::default(),
            runtime_operations_errors: Family::default(),
            runtime_operations_duration: Family::new_with_constructor(runtime_histogram as fn() -> Histogram),
            running_pods: Gauge::default(),
            running_containers: Family::default(),
        };
        registry.register(
            "kubelet_runtime_operations",
            "[ALPHA] Cumulative number of runtime operations by operation type",
            m.runtime_operations.clone(),
        );
        registry.register(
            "kubelet_runtime_operations_errors",
            "[ALPHA] Cumulative number of runtime operation errors by operation type",
            m.runtime_operations_errors.clone(),
        );
        registry.register(
            "kubelet_runtime_operations_duration_seconds",
            "[ALPHA] Duration in seconds of runtime operations. Broken down by operation type",
            m.runtime_operations_duration.clone(),
        );
        registry.register(
            "kubelet_running_pods",
            "[ALPHA] Number of pods that have a running pod sandbox",
            m.running_pods.clone(),
        );
        registry.register(
            "kubelet_running_containers",
            "[ALPHA] Number of containers currently running",
            m.running_containers.clone(),
        );
        m
    }

    /// Records one CRI call: `method` as the client names it (`ListContainers`).
    pub fn observe_runtime_call(&self, method: &str, seconds: f64, failed: bool) {
        let l = OperationLabels { operation_type: snake_case(method) };
        self.runtime_operations.get_or_create(&l).inc();
        self.runtime_operations_duration.get_or_create(&l).observe(seconds);
        if failed {
            self.runtime_operations_errors.get_or_create(&l).inc();
        }
    }
}

/// `ListPodSandbox` → `list_podsandbox`, as the kubelet's instrumented
/// runtime service names its operations.
pub fn snake_case(method: &str) -> String {
    let mut out = String::with_capacity(method.len() + 4);
    for (i, ch) in method.chars().enumerate() {
        if ch.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(ch.to_ascii_lowercase());
        } else {
            out.push(ch);
        }
    }
    // The kubelet's names for the sandbox calls run "pod" and "sandbox" together.
    out.replace("pod_sandbox", "podsandbox")
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StrategyLabels {
    /// memory, processes, inodes, oom or kill.
    pub signal: String,
    /// The hooks in use, e.g. `tp_btf:mod_memcg_lruvec_state`.
    pub strategy: String,
}

/// Every metric the agent exports, registered once.
pub struct Metrics {
    pub registry: Registry,
    /// kubelet_evictions{eviction_signal}: pods evicted, by signal (the
    /// kubelet's name and label).
    pub kubelet_evictions: Family<EvictionSignalLabels, Counter>,
    /// Available amount per eviction signal, in its unit.
    pub signal_available: Family<SignalLabels, Gauge<i64>>,
    /// Configured thresholds, resolved to the signal's unit.
    pub threshold: Family<ThresholdLabels, Gauge<i64>>,
    /// 1 while the node condition holds.
    pub node_condition: Family<ConditionLabels, Gauge>,
    /// From the kernel's crossing timestamp to the eviction decision.
    pub crossing_to_decision: Histogram,
    /// From the kernel's crossing timestamp to the victim's processes killed.
    pub crossing_to_kill: Family<KillPathLabels, Histogram>,
    /// 1 for the signal source in use (ebpf or cgroupfs).
    pub signal_source: Family<ModeLabels, Gauge>,
    /// Signal-source internals (ring drops, vanished cgroups, ...).
    pub signal_counters: Family<NameLabels, Gauge<i64>>,
    /// 1 for the strategy each signal is obtained with (feature probes).
    pub signal_strategy: Family<StrategyLabels, Gauge>,
    /// Kernel OOM kills seen (oom:mark_victim).
    pub oom_kills: Counter,
    /// Evictions that found nothing evictable.
    pub evictions_without_victim: Counter,
    /// Upward crossings of the lines that kill, by what the kernel did
    /// with the victim plan.
    pub kernel_plan_outcomes: Family<OutcomeLabels, Counter>,
    /// The kubelet's runtime metrics.
    pub kubelet: KubeletMetrics,
}

fn latency_histogram() -> Histogram {
    // 1 µs to ~16 s.
    Histogram::new(exponential_buckets(1e-6, 2.0, 25))
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let kubelet_evictions = Family::default();
        registry.register(
            "kubelet_evictions",
            "Cumulative number of pod evictions by eviction signal",
            kubelet_evictions.clone(),
        );
        let signal_available = Family::default();
        registry.register(
            "swiftlet_eviction_signal_available",
            "Available amount of each eviction signal (bytes, inodes or pids)",
            signal_available.clone(),
        );
        let threshold = Family::default();
        registry.register(
            "swiftlet_eviction_threshold",
            "Eviction thresholds resolved to the signal's unit",
            threshold.clone(),
        );
        let node_condition = Family::default();
        registry.register(
            "swiftlet_node_condition",
            "1 while the node pressure condition is reported",
            node_condition.clone(),
        );
        let crossing_to_decision = latency_histogram();
        registry.register(
            "swiftlet_eviction_crossing_to_decision_seconds",
            "Time from the kernel seeing a threshold crossed to the eviction decision",
            crossing_to_decision.clone(),
        );
        let crossing_to_kill = Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        registry.register(
            "swiftlet_eviction_crossing_to_kill_seconds",
            "Time from the kernel seeing a threshold crossed to the victim's processes killed",
            crossing_to_kill.clone(),
        );
        let signal_source = Family::default();
        registry.register(
            "swiftlet_signal_source",
            "Where eviction signals come from (1 for the mode in use)",
            signal_source.clone(),
        );
        let signal_counters = Family::default();
        // Not "_counter": linters reject a type's name inside a metric's.
        registry.register(
            "swiftlet_signal_source_stat",
            "Signal source internals (ring drops, vanished cgroups, ...)",
            signal_counters.clone(),
        );
        let signal_strategy = Family::default();
        registry.register(
            "swiftlet_signal_strategy",
            "How each eviction signal is obtained, as chosen by the kernel feature probes (1 for the strategy in use)",
            signal_strategy.clone(),
        );
        let oom_kills = Counter::default();
        registry.register("swiftlet_kernel_oom_kills", "Kernel OOM kills seen (oom:mark_victim)", oom_kills.clone());
        let evictions_without_victim = Counter::default();
        registry.register(
            "swiftlet_evictions_without_victim",
            "Eviction decisions that found no evictable pod",
            evictions_without_victim.clone(),
        );
        let kernel_plan_outcomes = Family::default();
        registry.register(
            "swiftlet_kernel_plan_outcomes",
            "Crossings of the hard memory and PID lines, by what the kernel did with the victim plan (executed, or the check that refused it)",
            kernel_plan_outcomes.clone(),
        );
        let kubelet = KubeletMetrics::register(&mut registry);
        Metrics {
            kubelet,
            registry,
            kubelet_evictions,
            signal_available,
            threshold,
            node_condition,
            crossing_to_decision,
            crossing_to_kill,
            signal_source,
            signal_counters,
            signal_strategy,
            oom_kills,
            evictions_without_victim,
            kernel_plan_outcomes,
        }
    }

    /// Records the signal source's strategies ([`crate::signals::SignalSource::strategies`]).
    pub fn set_signal_strategies(&self, pairs: &[(&'static str, String)]) {
        for (signal, strategy) in pairs {
            self.signal_strategy
                .get_or_create(&StrategyLabels { signal: (*signal).to_owned(), strategy: strategy.clone() })
                .set(1);
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod kubelet_metrics_tests {
    use super::*;

    #[test]
    fn runtime_operation_names_are_the_kubelets() {
        for (method, want) in [
            ("ListPodSandbox", "list_podsandbox"),
            ("RunPodSandbox", "run_podsandbox"),
            ("PodSandboxStatus", "podsandbox_status"),
            ("ListContainers", "list_containers"),
            ("ImageFsInfo", "image_fs_info"),
            ("ExecSync", "exec_sync"),
            ("Version", "version"),
        ] {
            assert_eq!(snake_case(method), want);
        }
        let m = Metrics::new();
        m.kubelet.observe_runtime_call("ListContainers", 0.002, false);
        m.kubelet.observe_runtime_call("ListContainers", 0.5, true);
        let text = m.encode();
        assert!(text.contains("kubelet_runtime_operations_total{operation_type=\"list_containers\"} 2"), "{text}");
        assert!(
            text.contains("kubelet_runtime_operations_errors_total{operation_type=\"list_containers\"} 1"),
            "{text}"
        );
    }
}
