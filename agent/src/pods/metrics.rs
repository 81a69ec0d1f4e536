//! The pod side's metrics, with the kubelet's names, help texts, labels
//! and buckets where they exist (pkg/kubelet/metrics): pod start, the pod
//! workers, the relist (the kubelet's PLEG) and the cgroup manager.

use std::time::{Duration, SystemTime};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::metrics::{OperationLabels, kubelet::default_histogram};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    pub probe_type: String,
    pub result: String,
    pub container: String,
    pub pod: String,
    pub namespace: String,
    pub pod_uid: String,
}

/// The kubelet's pod startup buckets (podStartupDurationBuckets).
pub const POD_START_BUCKETS: [f64; 25] = [
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0,
    600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

/// What a pod worker's round was for: the kubelet's sync types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncKind {
    /// The first sync of a new pod.
    Create,
    /// A sync after the pod's spec changed.
    Update,
    /// Any other sync (a runtime change, a probe, a back-off, the resync).
    Sync,
    /// Stopping the pod.
    Kill,
}

impl SyncKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SyncKind::Create => "create",
            SyncKind::Update => "update",
            SyncKind::Sync => "sync",
            SyncKind::Kill => "kill",
        }
    }
}

/// The cgroup manager's operations, as `operation_type` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupOperation {
    Create,
    Update,
    Destroy,
}

impl CgroupOperation {
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupOperation::Create => "create",
            CgroupOperation::Update => "update",
            CgroupOperation::Destroy => "destroy",
        }
    }
}

fn pod_start_histogram() -> Histogram {
    Histogram::new(POD_START_BUCKETS)
}

/// Clones share their values.
#[derive(Clone)]
pub struct PodMetrics {
    /// Static pod manifests rejected (swiftlet_static_pod_manifest_errors_total).
    pub manifest_errors: Counter,
    /// kubelet_pod_start_duration_seconds: from the first sight of a pod to
    /// all its containers running.
    pub pod_start_duration: Histogram,
    /// kubelet_pod_worker_duration_seconds{operation_type}: one round of a
    /// pod worker.
    pub pod_worker_duration: Family<OperationLabels, Histogram, fn() -> Histogram>,
    /// kubelet_pod_worker_start_duration_seconds: from the first sight of
    /// a pod to its worker starting.
    pub pod_worker_start_duration: Histogram,
    /// kubelet_pleg_relist_duration_seconds
    pub pleg_relist_duration: Histogram,
    /// kubelet_pleg_relist_interval_seconds
    pub pleg_relist_interval: Histogram,
    /// kubelet_pleg_last_seen_seconds
    pub pleg_last_seen: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// kubelet_pleg_discard_events (the kubelet's name has no `_total`;
    /// the relist loses no event, so it stays 0).
    pub pleg_discard_events: Counter,
    /// kubelet_cgroup_manager_duration_seconds{operation_type}
    pub cgroup_manager_duration: Family<OperationLabels, Histogram, fn() -> Histogram>,
    /// swiftlet_pod_workers: pod workers alive.
    pub pod_workers: Gauge,
    /// prober_probe_total (served on /metrics/probes).
    pub probes: Family<ProbeLabels, Counter>,
}

impl Default for PodMetrics {
    fn default() -> Self {
        PodMetrics {
            manifest_errors: Counter::default(),
            pod_start_duration: pod_start_histogram(),
            pod_worker_duration: Family::new_with_constructor(default_histogram),
            pod_worker_start_duration: default_histogram(),
            pleg_relist_duration: default_histogram(),
            pleg_relist_interval: default_histogram(),
            pleg_last_seen: Gauge::default(),
            pleg_discard_events: Counter::default(),
            cgroup_manager_duration: Family::new_with_constructor(default_histogram),
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
            "[ALPHA] Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
            self.pod_start_duration.clone(),
        );
        registry.register(
            "kubelet_pod_worker_duration_seconds",
            "[ALPHA] Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
            self.pod_worker_duration.clone(),
        );
        registry.register(
            "kubelet_pod_worker_start_duration_seconds",
            "[ALPHA] Duration in seconds from kubelet seeing a pod to starting a worker",
            self.pod_worker_start_duration.clone(),
        );
        registry.register(
            "kubelet_pleg_relist_duration_seconds",
            "[ALPHA] Duration in seconds for relisting pods in PLEG",
            self.pleg_relist_duration.clone(),
        );
        registry.register(
            "kubelet_pleg_relist_interval_seconds",
            "[ALPHA] Interval in seconds between relisting in PLEG",
            self.pleg_relist_interval.clone(),
        );
        registry.register(
            "kubelet_pleg_last_seen_seconds",
            "[ALPHA] Timestamp in seconds when PLEG was last seen active",
            self.pleg_last_seen.clone(),
        );
        registry.register(
            "kubelet_pleg_discard_events",
            "[ALPHA] The number of discard events in PLEG",
            self.pleg_discard_events.clone(),
        );
        registry.register(
            "kubelet_cgroup_manager_duration_seconds",
            "[ALPHA] Duration in seconds for cgroup manager operations. Broken down by method",
            self.cgroup_manager_duration.clone(),
        );
        // Not `…_count`: linters (promtool) reserve that suffix for
        // histograms and summaries.
        registry.register("swiftlet_pod_workers", "Number of pod workers", self.pod_workers.clone());
    }

    pub fn register_probes(&self, registry: &mut Registry) {
        registry.register(
            "prober_probe",
            "[ALPHA] Cumulative number of a liveness, readiness or startup probe for a container by result",
            self.probes.clone(),
        );
    }

    /// Records one relist that took `took`, `since_previous` after the
    /// previous one started (None for the first), as the kubelet's PLEG:
    /// the interval when a relist starts, the duration and the last-seen
    /// time when it ends.
    pub fn observe_relist(&self, took: Duration, since_previous: Option<Duration>, now: SystemTime) {
        if let Some(i) = since_previous {
            self.pleg_relist_interval.observe(i.as_secs_f64());
        }
        self.pleg_relist_duration.observe(took.as_secs_f64());
        let secs = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        self.pleg_last_seen.set(secs);
    }

    /// Records one round of a pod worker.
    pub fn observe_sync(&self, kind: SyncKind, took: Duration) {
        self.pod_worker_duration
            .get_or_create(&OperationLabels { operation_type: kind.as_str().into() })
            .observe(took.as_secs_f64());
    }

    /// Records one cgroup manager operation. The pod workers record their
    /// pod cgroups' creation, update and removal; this is also the hook
    /// for the container manager's own cgroups (the QoS and
    /// node-allocatable ones).
    pub fn observe_cgroup_operation(&self, op: CgroupOperation, took: Duration) {
        self.cgroup_manager_duration
            .get_or_create(&OperationLabels { operation_type: op.as_str().into() })
            .observe(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(m: &PodMetrics) -> String {
        let mut r = Registry::default();
        m.register(&mut r);
        crate::server::exposition::encode(&[&r])
    }

    #[test]
    fn relists_workers_and_cgroup_operations_fill_the_kubelets_histograms() {
        let m = PodMetrics::default();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        m.observe_relist(Duration::from_millis(3), None, now);
        m.observe_relist(Duration::from_millis(4), Some(Duration::from_millis(1003)), now);
        m.observe_sync(SyncKind::Create, Duration::from_millis(300));
        m.observe_sync(SyncKind::Sync, Duration::from_millis(2));
        m.observe_cgroup_operation(CgroupOperation::Create, Duration::from_millis(2));
        m.pod_start_duration.observe(2.5);
        let text = text(&m);
        for want in [
            "kubelet_pleg_relist_duration_seconds_count 2",
            // One interval: the first relist has no predecessor.
            "kubelet_pleg_relist_interval_seconds_count 1",
            "kubelet_pleg_relist_interval_seconds_bucket{le=\"2.5\"} 1",
            "kubelet_pleg_relist_interval_seconds_bucket{le=\"1\"} 0",
            "kubelet_pleg_last_seen_seconds 1700000000",
            "# TYPE kubelet_pleg_discard_events untyped",
            "kubelet_pleg_discard_events 0",
            "kubelet_pod_worker_duration_seconds_count{operation_type=\"create\"} 1",
            "kubelet_pod_worker_duration_seconds_bucket{operation_type=\"create\",le=\"0.25\"} 0",
            "kubelet_pod_worker_duration_seconds_bucket{operation_type=\"create\",le=\"0.5\"} 1",
            "kubelet_pod_worker_duration_seconds_count{operation_type=\"sync\"} 1",
            "kubelet_cgroup_manager_duration_seconds_bucket{operation_type=\"create\",le=\"0.005\"} 1",
            // The kubelet's pod startup buckets: 2 < 2.5 <= 3.
            "kubelet_pod_start_duration_seconds_bucket{le=\"2\"} 0",
            "kubelet_pod_start_duration_seconds_bucket{le=\"3\"} 1",
            "kubelet_pod_start_duration_seconds_bucket{le=\"3600\"} 1",
        ] {
            assert!(text.lines().any(|l| l == want), "{want:?} missing:\n{text}");
        }
    }
}
