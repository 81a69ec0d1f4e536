//! Kubernetes events (Pulling, Started, Killing, Evicted, NodeReady, ...),
//! recorded by every manager through one small trait. The API-backed
//! recorder deduplicates and rate-limits; the default one only logs.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;

/// The reference the kubelet uses for its node's events (UID = name).
pub fn node_ref(node: &str) -> ObjectReference {
    ObjectReference { kind: Some("Node".into()), name: Some(node.into()), uid: Some(node.into()), ..Default::default() }
}

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

/// One event as an [`AnnotatedEventRecorder`] receives it; `annotations` is
/// empty for [`EventRecorder::record`].
#[derive(Clone, Copy, Debug)]
pub struct EventRecord<'a> {
    pub object: &'a ObjectReference,
    pub event_type: EventType,
    pub reason: &'a str,
    pub message: &'a str,
    pub annotations: &'a BTreeMap<String, String>,
}

/// A recorder that keeps annotations writes this one method and gets both
/// of [`EventRecorder`]'s from the blanket impl below, so that `record`
/// cannot drift from `record_annotated` in any of them. A recorder that
/// drops annotations implements [`EventRecorder::record`] alone instead.
pub trait AnnotatedEventRecorder: Send + Sync {
    fn record_event(&self, event: &EventRecord<'_>);
}

impl<T: AnnotatedEventRecorder> EventRecorder for T {
    fn record(&self, object: &ObjectReference, event_type: EventType, reason: &str, message: &str) {
        self.record_event(&EventRecord { object, event_type, reason, message, annotations: &BTreeMap::new() });
    }

    fn record_annotated(&self, o: &ObjectReference, t: EventType, r: &str, m: &str, a: &BTreeMap<String, String>) {
        self.record_event(&EventRecord { object: o, event_type: t, reason: r, message: m, annotations: a });
    }
}

/// Logs events (standalone mode, and tests).
pub struct LogRecorder;

impl AnnotatedEventRecorder for LogRecorder {
    fn record_event(&self, e: &EventRecord<'_>) {
        tracing::info!(
            kind = e.object.kind.as_deref().unwrap_or(""),
            namespace = e.object.namespace.as_deref().unwrap_or(""),
            name = e.object.name.as_deref().unwrap_or(""),
            r#type = e.event_type.as_str(),
            reason = e.reason,
            annotations = ?e.annotations,
            "event: {}",
            e.message
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
