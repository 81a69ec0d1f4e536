//! Kubernetes events (Pulling, Started, Killing, Evicted, NodeReady, ...),
//! recorded by every manager through one small trait. The API-backed
//! recorder deduplicates and rate-limits; the default one only logs.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

pub trait EventRecorder: Send + Sync {
    /// Records `reason` (CamelCase, e.g. "Evicted") about `object`.
    fn record(&self, object: &ObjectReference, event_type: EventType, reason: &str, message: &str);

    /// [`EventRecorder::record`] with annotations on the event, as the
    /// kubelet's AnnotatedEventf (the Evicted event names the starved
    /// resource and the offending containers). Recorders that keep no
    /// annotations record the event alone.
    fn record_annotated(
        &self,
        object: &ObjectReference,
        event_type: EventType,
        reason: &str,
        message: &str,
        annotations: &BTreeMap<String, String>,
    ) {
        let _ = annotations;
        self.record(object, event_type, reason, message);
    }
}

/// Logs events (standalone mode, and tests).
pub struct LogRecorder;

impl EventRecorder for LogRecorder {
    fn record(&self, object: &ObjectReference, event_type: EventType, reason: &str, message: &str) {
        self.record_annotated(object, event_type, reason, message, &BTreeMap::new());
    }

    fn record_annotated(
        &self,
        object: &ObjectReference,
        event_type: EventType,
        reason: &str,
        message: &str,
        annotations: &BTreeMap<String, String>,
    ) {
        tracing::info!(
            kind = object.kind.as_deref().unwrap_or(""),
            namespace = object.namespace.as_deref().unwrap_or(""),
            name = object.name.as_deref().unwrap_or(""),
            r#type = event_type.as_str(),
            reason,
            annotations = ?annotations,
            "event: {message}"
        );
    }
}

/// A reference to a pod for events.
pub fn pod_ref(pod: &k8s_openapi::api::core::v1::Pod) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: pod.metadata.name.clone(),
        namespace: pod.metadata.namespace.clone(),
        uid: pod.metadata.uid.clone(),
        resource_version: pod.metadata.resource_version.clone(),
        ..Default::default()
    }
}
