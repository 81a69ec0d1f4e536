//! The memory.pressure signal's verdicts, as the eviction manager acts on
//! them: the node's condition (merged into the conditions the manager
//! publishes) and the eviction a firing asks for (taken by the manager's
//! next evaluation, which the report wakes); a pod's firing becomes a
//! Warning event on the pod. Pods stalled on their own limit are not node
//! pressure: they are never evicted for it.

use std::sync::{Arc, Weak};

use k8s_openapi::api::core::v1::ObjectReference;

use super::{EvictionPod, Shared, Wake};
use crate::{
    events::{EventRecorder, EventType},
    eviction::{
        pressure::{Firing, PressureConfig, Verdict},
        pressure_watch::PressureSink,
    },
    metrics::Metrics,
};

/// The event a pod gets when its memory.pressure stays above the threshold.
pub const POD_EVENT_REASON: &str = "MemoryPressureStall";

/// The node's signal as the manager last heard it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct NodePressure {
    pub condition: bool,
    /// A firing not yet acted on.
    pub firing: Option<Firing>,
    /// When the firing's figures were read: the stats age of its eviction.
    pub fired_at: Option<tokio::time::Instant>,
}

/// Reports the watcher's verdicts to the manager, the metrics and the pods.
pub(crate) struct PressureReporter {
    pub shared: Weak<Shared>,
    pub metrics: Arc<Metrics>,
    pub recorder: Arc<dyn EventRecorder>,
    pub cfg: PressureConfig,
}

impl PressureSink for PressureReporter {
    fn node(&self, avg10: f64, v: &Verdict) {
        self.metrics.pressure.set_avg10("node", avg10);
        let Some(shared) = self.shared.upgrade() else { return };
        let mut p = shared.pressure.lock();
        let changed = p.condition != v.condition || v.fire;
        p.condition = v.condition;
        if v.fire {
            self.metrics.pressure.fired("node");
            p.firing = Some(Firing {
                avg10,
                threshold_percent: self.cfg.threshold_percent,
                held_for: v.held_for,
                grace_period: self.cfg.grace_period,
            });
            p.fired_at = Some(tokio::time::Instant::now());
            tracing::info!(avg10, threshold = self.cfg.threshold_percent, held_for = ?v.held_for, "memory.pressure held above its threshold: one pod is evicted");
        }
        drop(p);
        if changed {
            let _ = shared.wake.send(Wake::Other);
        }
    }

    fn pod(&self, pod: &EvictionPod, avg10: f64, v: &Verdict) {
        if !v.fire {
            return;
        }
        self.metrics.pressure.fired("pod");
        let object = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(pod.namespace.clone()),
            name: Some(pod.name.clone()),
            uid: Some(pod.uid.clone()),
            ..Default::default()
        };
        let message = format!(
            "Tasks of the pod stalled on memory {avg10:.2}% of the time (some avg10 of its memory.pressure), above the threshold of {}% for {}s: the pod is short of memory within its own limits (not evicted: this is not node pressure)",
            self.cfg.threshold_percent,
            v.held_for.as_secs()
        );
        self.recorder.record(&object, EventType::Warning, POD_EVENT_REASON, &message);
    }

    fn pods_highest(&self, avg10: Option<f64>) {
        self.metrics.pressure.set_avg10("pod", avg10.unwrap_or(0.0));
    }
}
