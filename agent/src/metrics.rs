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
pub struct ModeLabels {
    pub mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NameLabels {
    pub name: String,
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
        registry.register("swiftlet_signal_source_counter", "Signal source internals", signal_counters.clone());
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
        Metrics {
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
