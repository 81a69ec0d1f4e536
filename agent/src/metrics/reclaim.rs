//! Reclaim before evicting and the age of the figures behind each
//! eviction: `kubelet_eviction_stats_age_seconds` (the kubelet's name,
//! help, label and buckets), `swiftlet_memory_reclaim` and
//! `swiftlet_memory_reclaimed_bytes`.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

use super::{EvictionSignalLabels, kubelet::default_histogram};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReclaimResultLabels {
    /// `done` (the kernel reclaimed what was asked), `short` (EAGAIN: less
    /// than asked) or `error` (the write failed).
    pub result: String,
}

pub struct ReclaimMetrics {
    /// kubelet_eviction_stats_age_seconds{eviction_signal}: at each
    /// eviction, how old the observation behind it was (a kernel crossing's
    /// own timestamp, or the snapshot's).
    pub stats_age: Family<EvictionSignalLabels, Histogram>,
    /// swiftlet_memory_reclaim_total{result}: memory.reclaim writes.
    pub writes: Family<ReclaimResultLabels, Counter>,
    /// swiftlet_memory_reclaimed_bytes_total: page cache the writes gave
    /// back (the pods' file pages before − after).
    pub reclaimed_bytes: Counter,
}

impl ReclaimMetrics {
    pub(super) fn register(registry: &mut Registry) -> ReclaimMetrics {
        let m = ReclaimMetrics {
            stats_age: Family::new_with_constructor(default_histogram as fn() -> Histogram),
            writes: Family::default(),
            reclaimed_bytes: Counter::default(),
        };
        registry.register(
            "kubelet_eviction_stats_age_seconds",
            "[ALPHA] Time between when stats are collected, and when pod is evicted based on those stats by eviction signal",
            m.stats_age.clone(),
        );
        registry.register(
            "swiftlet_memory_reclaim",
            "memory.reclaim writes made before evicting for memory (--memory-reclaim-before-eviction), by result: done, short (the kernel reclaimed less than asked) or error",
            m.writes.clone(),
        );
        registry.register(
            "swiftlet_memory_reclaimed_bytes",
            "Page cache given back by memory.reclaim writes made before evicting for memory",
            m.reclaimed_bytes.clone(),
        );
        m
    }

    /// One eviction decided on figures `age_secs` old.
    pub fn observe_stats_age(&self, signal: &str, age_secs: f64) {
        self.stats_age.get_or_create(&EvictionSignalLabels { eviction_signal: signal.into() }).observe(age_secs);
    }
}
