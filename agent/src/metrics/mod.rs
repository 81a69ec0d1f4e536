//! The agent's Prometheus registry (served on :10250/metrics): the
//! kubelet's metrics with the kubelet's names, labels and buckets
//! (`kubelet`, `rest_client`, `storage`), and swiftlet's own under
//! `swiftlet_`.

pub mod exposition;
pub mod kubelet;
pub mod pressure;
pub mod reclaim;
pub mod rest_client;
pub mod storage;

pub use self::kubelet::{ContainerStateLabels, KubeletMetrics, OperationLabels, snake_case};
use self::{rest_client::RestClientMetrics, storage::StorageMetrics};
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
    /// kubelet_eviction_stats_age_seconds{eviction_signal}: at each
    /// eviction, how old the observation behind it was (a kernel crossing's
    /// own timestamp, or the snapshot's).
    pub eviction_stats_age: Family<EvictionSignalLabels, Histogram>,
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
    /// Kernel OOM kills seen (oom:mark_victim), by where the victim was.
    pub oom_kills: Family<OomScopeLabels, Counter>,
    /// Evictions that found nothing evictable.
    pub evictions_without_victim: Counter,
    /// Upward crossings of the lines that kill, by what the kernel did
    /// with the victim plan.
    pub kernel_plan_outcomes: Family<OutcomeLabels, Counter>,
    /// The kubelet's runtime, relist and cgroup manager metrics.
    pub kubelet: KubeletMetrics,
    /// The volume manager's operations.
    pub storage: StorageMetrics,
    /// The memory.pressure eviction signal.
    pub pressure: pressure::PressureMetrics,
    /// Reclaim before evicting, and the stats age behind each eviction.
    pub reclaim: reclaim::ReclaimMetrics,
}

/// Where a kernel OOM kill's victim was.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OomScopeLabels {
    /// `pod`: in a pod's cgroup (registered with the signal source);
    /// `host`: anywhere else on the node (a system service, a process
    /// outside the pods: what the kernel reports as cgroup "-").
    pub scope: String,
}

/// The `scope` of an OOM kill whose victim's registered cgroup is `cgroup`.
pub fn oom_kill_scope(cgroup: Option<&str>) -> &'static str {
    match cgroup {
        Some(c) if !c.trim_matches('/').is_empty() => "pod",
        _ => "host",
    }
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
        let eviction_stats_age = Family::new_with_constructor(kubelet::default_histogram as fn() -> Histogram);
        registry.register(
            "kubelet_eviction_stats_age_seconds",
            "[ALPHA] Time between when stats are collected, and when pod is evicted based on those stats by eviction signal",
            eviction_stats_age.clone(),
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
        // Every series exists from the start: an alert on `increase()`
        // sees the first kill by each path, which a series born at 1 hides.
        for path in ["kernel", "agent", "graceful"] {
            drop(crossing_to_kill.get_or_create(&KillPathLabels { path: path.into() }));
        }
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
        let oom_kills: Family<OomScopeLabels, Counter> = Family::default();
        // Both series exist from the start, so a rate over either is defined.
        for scope in ["pod", "host"] {
            oom_kills.get_or_create(&OomScopeLabels { scope: scope.into() }).inc_by(0);
        }
        registry.register(
            "swiftlet_kernel_oom_kills",
            "Kernel OOM kills seen (oom:mark_victim), by where the victim was: scope=pod (a pod's cgroup) or host (outside the pods)",
            oom_kills.clone(),
        );
        let evictions_without_victim = Counter::default();
        registry.register(
            "swiftlet_evictions_without_victim",
            "Eviction decisions that found no evictable pod",
            evictions_without_victim.clone(),
        );
        let kernel_plan_outcomes: Family<OutcomeLabels, Counter> = Family::default();
        for outcome in
            swiftlet_common::KillOutcome::ALL.into_iter().filter(|o| *o != swiftlet_common::KillOutcome::NotAttempted)
        {
            kernel_plan_outcomes.get_or_create(&OutcomeLabels { outcome: outcome.name().into() }).inc_by(0);
        }
        registry.register(
            "swiftlet_kernel_plan_outcomes",
            "Crossings of the hard memory and PID lines, by what the kernel did with the victim plan (executed, or the check that refused it)",
            kernel_plan_outcomes.clone(),
        );
        let kubelet = KubeletMetrics::register(&mut registry);
        let reclaim = reclaim::ReclaimMetrics::register(&mut registry);
        let storage = StorageMetrics::default();
        storage.register(&mut registry);
        let pressure = pressure::PressureMetrics::default();
        pressure.register(&mut registry);
        RestClientMetrics::global().register(&mut registry);
        let build: Family<BuildLabels, Gauge> = Family::default();
        build.get_or_create(&BuildLabels::current()).set(1);
        registry.register(
            "kubernetes_build_info",
            "[ALPHA] A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running",
            build,
        );
        Metrics {
            kubelet,
            reclaim,
            eviction_stats_age,
            storage,
            pressure,
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

    /// Counts a kernel OOM kill whose victim's registered cgroup is
    /// `cgroup` (None: not in a registered cgroup).
    pub fn record_oom_kill(&self, cgroup: Option<&str>) {
        self.oom_kills.get_or_create(&OomScopeLabels { scope: oom_kill_scope(cgroup).into() }).inc();
    }

    /// The registry as prometheus-client writes it (OpenMetrics: every
    /// counter's samples end in `_total`), for tests that read figures.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// One eviction decided on figures `age_secs` old.
    pub fn observe_eviction_stats_age(&self, signal: &str, age_secs: f64) {
        self.eviction_stats_age
            .get_or_create(&EvictionSignalLabels { eviction_signal: signal.into() })
            .observe(age_secs);
    }

    /// The registry as /metrics serves it: the text format with the
    /// kubelet's names (`kubelet_evictions`).
    pub fn encode_text(&self) -> String {
        crate::metrics::exposition::encode(&[&self.registry])
    }
}

/// `kubernetes_build_info`'s labels, as the kubelet's (Go's fields hold
/// the Rust toolchain's where there is one).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub build_date: String,
    pub compiler: String,
    pub git_commit: String,
    pub git_tree_state: String,
    pub git_version: String,
    pub go_version: String,
    pub major: String,
    pub minor: String,
    pub platform: String,
}

impl BuildLabels {
    pub fn current() -> BuildLabels {
        BuildLabels {
            build_date: String::new(),
            compiler: "rustc".into(),
            git_commit: String::new(),
            git_tree_state: String::new(),
            git_version: crate::version::kubelet_version(),
            go_version: String::new(),
            major: crate::version::KUBERNETES_MAJOR.into(),
            minor: crate::version::KUBERNETES_MINOR.into(),
            platform: crate::version::platform(),
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_kills_outside_the_pods_are_told_apart() {
        assert_eq!(oom_kill_scope(None), "host");
        assert_eq!(oom_kill_scope(Some("")), "host");
        assert_eq!(oom_kill_scope(Some("/")), "host");
        assert_eq!(oom_kill_scope(Some("kubepods/besteffort/pod1234")), "pod");
        let m = Metrics::new();
        m.record_oom_kill(None);
        m.record_oom_kill(None);
        m.record_oom_kill(Some("kubepods/burstable/podabc/0123"));
        let text = m.encode_text();
        assert!(text.lines().any(|l| l == "swiftlet_kernel_oom_kills_total{scope=\"host\"} 2"), "{text}");
        assert!(text.lines().any(|l| l == "swiftlet_kernel_oom_kills_total{scope=\"pod\"} 1"), "{text}");
    }

    #[test]
    fn build_info_carries_the_kubelet_version() {
        let text = Metrics::new().encode_text();
        let line = text.lines().find(|l| l.starts_with("kubernetes_build_info{")).expect("kubernetes_build_info");
        assert!(line.contains(&format!("git_version=\"{}\"", crate::version::kubelet_version())), "{line}");
        assert!(line.contains("major=\"1\",minor=\"33\""), "{line}");
        assert!(line.ends_with("} 1"), "{line}");
    }
}
