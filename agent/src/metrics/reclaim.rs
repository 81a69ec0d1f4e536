//! Reclaim before evicting: `swiftlet_memory_reclaim` and
//! `swiftlet_memory_reclaimed_bytes`.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReclaimResultLabels {
    /// `done` (the kernel reclaimed what was asked), `short` (EAGAIN: less
    /// than asked) or `error` (the write failed).
    pub result: String,
}

pub struct ReclaimMetrics {
    /// swiftlet_memory_reclaim_total{result}: memory.reclaim writes.
    pub writes: Family<ReclaimResultLabels, Counter>,
    /// swiftlet_memory_reclaimed_bytes_total: page cache the writes gave
    /// back (the pods' file pages before − after).
    pub reclaimed_bytes: Counter,
}

impl ReclaimMetrics {
    pub(super) fn register(registry: &mut Registry) -> ReclaimMetrics {
        let m = ReclaimMetrics { writes: Family::default(), reclaimed_bytes: Counter::default() };
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
}
