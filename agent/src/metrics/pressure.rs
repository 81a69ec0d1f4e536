//! The memory-pressure eviction signal's metrics: the latest `some avg10`
//! of `memory.pressure` per scope (`node`, and for `pod` the highest of
//! the pods'), and how often the signal fired per scope (an eviction for
//! the node, a warning event for a pod).

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::OomScopeLabels as ScopeLabels;

#[derive(Clone, Debug, Default)]
pub struct PressureMetrics {
    pub avg10: Family<ScopeLabels, Gauge<f64, AtomicU64>>,
    pub firings: Family<ScopeLabels, Counter>,
}

impl PressureMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "swiftlet_memory_pressure_avg10",
            "Latest some avg10 of memory.pressure (percent) read by the memory.pressure eviction signal, by scope (node; pod: the highest of the pods)",
            self.avg10.clone(),
        );
        registry.register(
            "swiftlet_memory_pressure_firings",
            "Times memory.pressure stayed above its threshold for the grace period, by scope (node: an eviction; pod: a warning event)",
            self.firings.clone(),
        );
    }

    pub fn set_avg10(&self, scope: &str, avg10: f64) {
        self.avg10.get_or_create(&ScopeLabels { scope: scope.into() }).set(avg10);
    }

    pub fn fired(&self, scope: &str) {
        self.firings.get_or_create(&ScopeLabels { scope: scope.into() }).inc();
    }
}
