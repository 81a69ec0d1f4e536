//! The pod side's metrics, with the kubelet's names where they exist.

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
pub struct ProbeLabels {
    pub probe_type: String,
    pub result: String,
    pub container: String,
    pub pod: String,
    pub namespace: String,
    pub pod_uid: String,
}

#[derive(Clone)]
pub struct PodMetrics {
    /// Static pod manifests rejected (swiftlet_static_pod_manifest_errors_total).
    pub manifest_errors: Counter,
    /// kubelet_pod_start_duration_seconds: from the first sight of a pod to
    /// all its containers running.
    pub pod_start_duration: Histogram,
    /// swiftlet_pod_workers: pod workers alive.
    pub pod_workers: Gauge,
    /// prober_probe_total (served on /metrics/probes).
    pub probes: Family<ProbeLabels, Counter>,
}

impl Default for PodMetrics {
    fn default() -> Self {
        PodMetrics {
            manifest_errors: Counter::default(),
            // The kubelet's buckets: 0.5 s to ~2 h.
            pod_start_duration: Histogram::new(exponential_buckets(0.5, 2.0, 14)),
            pod_workers: Gauge::default(),
            probes: Family::default(),
        }
    }
}

impl PodMetrics {
    /// Registers the agent-wide metrics (everything but the probe counter,
    /// which /metrics/probes serves from its own registry).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "swiftlet_static_pod_manifest_errors",
            "Static pod manifests rejected (bad syntax or invalid pod)",
            self.manifest_errors.clone(),
        );
        registry.register(
            "kubelet_pod_start_duration_seconds",
            "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
            self.pod_start_duration.clone(),
        );
        // Not `…_count`: linters (promtool) reserve that suffix for
        // histograms and summaries.
        registry.register("swiftlet_pod_workers", "Number of pod workers", self.pod_workers.clone());
    }

    pub fn register_probes(&self, registry: &mut Registry) {
        registry.register(
            "prober_probe",
            "Cumulative number of a liveness, readiness or startup probe for a container by result.",
            self.probes.clone(),
        );
    }
}
