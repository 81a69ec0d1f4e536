//! The kubelet's volume metrics: `storage_operation_duration_seconds` and
//! `storage_operation_errors_total` (pkg/volume/util), recorded by the
//! volume manager around each set-up and tear-down, and
//! `volume_manager_total_volumes` (pkg/kubelet/volumemanager/metrics),
//! read at scrape time from whoever knows the desired and actual volumes.

use std::{fmt, sync::Arc, time::Duration};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{MetricType, counter::Counter, family::Family, gauge::ConstGauge, histogram::Histogram},
    registry::Registry,
};

/// The kubelet's storage operation buckets.
pub const STORAGE_BUCKETS: [f64; 13] = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub volume_plugin: String,
    pub operation_name: String,
    pub status: String,
    pub migrated: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub volume_plugin: String,
    pub operation_name: String,
}

/// The volume operations the agent times, with the kubelet's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeOperation {
    /// MountVolume.SetUp
    Mount,
    /// UnmountVolume.TearDown
    Unmount,
}

impl VolumeOperation {
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeOperation::Mount => "volume_mount",
            VolumeOperation::Unmount => "volume_unmount",
        }
    }
}

fn storage_histogram() -> Histogram {
    Histogram::new(STORAGE_BUCKETS)
}

/// Clones share their values.
#[derive(Clone)]
pub struct StorageMetrics {
    pub operation_duration: Family<OperationLabels, Histogram, fn() -> Histogram>,
    pub operation_errors: Family<ErrorLabels, Counter>,
}

impl Default for StorageMetrics {
    fn default() -> Self {
        StorageMetrics {
            operation_duration: Family::new_with_constructor(storage_histogram),
            operation_errors: Family::default(),
        }
    }
}

impl StorageMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "storage_operation_duration_seconds",
            "[ALPHA] Storage operation duration",
            self.operation_duration.clone(),
        );
        registry.register(
            "storage_operation_errors",
            "[ALPHA] Storage operation errors (Deprecated since 1.21.0)",
            self.operation_errors.clone(),
        );
    }

    /// One operation of `plugin` (`kubernetes.io/configmap`, ...) that took
    /// `took` and failed or not. Nothing here is a migrated in-tree plugin.
    pub fn observe(&self, plugin: &str, op: VolumeOperation, took: Duration, failed: bool) {
        let status = if failed { "fail-unknown" } else { "success" };
        self.operation_duration
            .get_or_create(&OperationLabels {
                volume_plugin: plugin.into(),
                operation_name: op.as_str().into(),
                status: status.into(),
                migrated: "false".into(),
            })
            .observe(took.as_secs_f64());
        if failed {
            self.operation_errors
                .get_or_create(&ErrorLabels { volume_plugin: plugin.into(), operation_name: op.as_str().into() })
                .inc();
        }
    }
}

/// One row of `volume_manager_total_volumes`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct VolumeCount {
    pub plugin_name: String,
    /// `desired_state_of_world` or `actual_state_of_world`.
    pub state: &'static str,
    pub count: u64,
}

/// One claim's usage, for `kubelet_volume_stats_*`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimStatsRow {
    pub namespace: String,
    pub persistentvolumeclaim: String,
    /// The pod and its volume that mount the claim.
    pub pod_uid: String,
    pub volume: String,
    /// When it was read.
    pub time: Option<k8s_openapi::jiff::Timestamp>,
    pub capacity_bytes: Option<i64>,
    pub available_bytes: Option<i64>,
    pub used_bytes: Option<i64>,
    pub inodes: Option<i64>,
    pub inodes_free: Option<i64>,
    pub inodes_used: Option<i64>,
    /// The driver's volume condition, when it reports one.
    pub abnormal: Option<bool>,
}

/// Whoever knows which volumes pods want and which are set up.
pub trait VolumeStates: Send + Sync {
    fn volume_counts(&self) -> Vec<VolumeCount>;

    /// The mounted claims' usage as last read, per pod volume.
    fn claim_stats(&self) -> Vec<ClaimStatsRow> {
        vec![]
    }
}

/// The kubelet's `kubelet_volume_stats_*` gauges: name, help, value.
type StatsGauge = (&'static str, &'static str, fn(&ClaimStatsRow) -> Option<i64>);
const CLAIM_GAUGES: [StatsGauge; 7] = [
    ("kubelet_volume_stats_capacity_bytes", "Capacity in bytes of the volume", |r| r.capacity_bytes),
    ("kubelet_volume_stats_available_bytes", "Number of available bytes in the volume", |r| r.available_bytes),
    ("kubelet_volume_stats_used_bytes", "Number of used bytes in the volume", |r| r.used_bytes),
    ("kubelet_volume_stats_inodes", "Maximum number of inodes in the volume", |r| r.inodes),
    ("kubelet_volume_stats_inodes_free", "Number of free inodes in the volume", |r| r.inodes_free),
    ("kubelet_volume_stats_inodes_used", "Number of used inodes in the volume", |r| r.inodes_used),
    (
        "kubelet_volume_stats_health_status_abnormal",
        "Abnormal volume health status. The count is either 1 or 0. 1 indicates the volume is unhealthy, 0 indicates volume is healthy",
        |r| r.abnormal.map(i64::from),
    ),
];

/// `volume_manager_total_volumes{plugin_name,state}`, read at scrape time.
pub struct VolumeManagerCollector(pub Arc<dyn VolumeStates>);

impl fmt::Debug for VolumeManagerCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("VolumeManagerCollector")
    }
}

impl Collector for VolumeManagerCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let mut me = enc.encode_descriptor(
            "volume_manager_total_volumes",
            "Number of volumes in Volume Manager",
            None,
            MetricType::Gauge,
        )?;
        for c in self.0.volume_counts() {
            let labels = [("plugin_name", c.plugin_name.as_str()), ("state", c.state)];
            ConstGauge::new(c.count as f64).encode(me.encode_family(&labels)?)?;
        }
        // A claim mounted by several pods is one series.
        let mut seen = std::collections::BTreeSet::new();
        let mut rows = self.0.claim_stats();
        rows.retain(|r| seen.insert((r.namespace.clone(), r.persistentvolumeclaim.clone())));
        if rows.is_empty() {
            return Ok(());
        }
        for (name, help, value) in CLAIM_GAUGES {
            let mut g = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for r in &rows {
                let Some(v) = value(r) else { continue };
                let labels =
                    [("namespace", r.namespace.as_str()), ("persistentvolumeclaim", r.persistentvolumeclaim.as_str())];
                ConstGauge::new(v as f64).encode(g.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl VolumeStates for Fixed {
        fn volume_counts(&self) -> Vec<VolumeCount> {
            vec![
                VolumeCount {
                    plugin_name: "kubernetes.io/empty-dir".into(),
                    state: "desired_state_of_world",
                    count: 2,
                },
                VolumeCount { plugin_name: "kubernetes.io/empty-dir".into(), state: "actual_state_of_world", count: 1 },
            ]
        }

        fn claim_stats(&self) -> Vec<ClaimStatsRow> {
            vec![ClaimStatsRow {
                namespace: "ns".into(),
                persistentvolumeclaim: "data".into(),
                pod_uid: "u".into(),
                volume: "v".into(),
                time: None,
                capacity_bytes: Some(1024),
                available_bytes: Some(512),
                used_bytes: Some(512),
                inodes: Some(10),
                inodes_free: Some(9),
                inodes_used: Some(1),
                abnormal: None,
            }]
        }
    }

    #[test]
    fn operations_and_volume_counts_have_the_kubelets_labels() {
        let m = StorageMetrics::default();
        let mut r = Registry::default();
        m.register(&mut r);
        r.register_collector(Box::new(VolumeManagerCollector(Arc::new(Fixed))));
        m.observe("kubernetes.io/configmap", VolumeOperation::Mount, Duration::from_millis(30), false);
        m.observe("kubernetes.io/secret", VolumeOperation::Mount, Duration::from_millis(30), true);
        let text = crate::metrics::exposition::encode(&[&r]);
        for want in [
            "storage_operation_duration_seconds_count{volume_plugin=\"kubernetes.io/configmap\",operation_name=\"volume_mount\",status=\"success\",migrated=\"false\"} 1",
            "storage_operation_duration_seconds_count{volume_plugin=\"kubernetes.io/secret\",operation_name=\"volume_mount\",status=\"fail-unknown\",migrated=\"false\"} 1",
            "storage_operation_errors_total{volume_plugin=\"kubernetes.io/secret\",operation_name=\"volume_mount\"} 1",
            "volume_manager_total_volumes{plugin_name=\"kubernetes.io/empty-dir\",state=\"desired_state_of_world\"} 2",
            "volume_manager_total_volumes{plugin_name=\"kubernetes.io/empty-dir\",state=\"actual_state_of_world\"} 1",
            "kubelet_volume_stats_capacity_bytes{namespace=\"ns\",persistentvolumeclaim=\"data\"} 1024",
            "kubelet_volume_stats_inodes_used{namespace=\"ns\",persistentvolumeclaim=\"data\"} 1",
        ] {
            assert!(text.lines().any(|l| l == want), "{want:?} missing:\n{text}");
        }
        assert!(!text.contains("kubelet_volume_stats_health_status_abnormal{"), "no condition, no series:\n{text}");
    }
}
