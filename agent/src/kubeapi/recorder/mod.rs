//! An `EventRecorder` that writes core/v1 Events to the API server as the
//! kubelet's recorder does (client-go's EventCorrelator + broadcaster):
//!
//! - aggregation: after 10 events from the same source about the same
//!   object with the same type and reason but different messages within
//!   10 minutes, further ones are combined into one event "(combined from
//!   similar events): <message>";
//! - deduplication: an identical event increments `count` and moves
//!   `lastTimestamp` on the event already written (a patch), instead of a
//!   new object;
//! - a spam filter per object and event: 25 at once, then one per 5 min;
//! - writes wait for eventRecordQPS/eventBurst; the queue holds 1000 events
//!   and drops when full; a write is retried up to 12 times, 10 s apart.
//!
//! The decisions are in [`Correlator`], pure and table-tested; the sink is
//! a small trait so tests run without a server.

mod correlator;
#[cfg(test)]
mod tests;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use k8s_openapi::{
    api::core::v1::{Event, EventSource, ObjectReference},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::ratelimit::RateLimiter;
use crate::events::{AnnotatedEventRecorder, EventRecord, EventRecorder, EventType};

use self::correlator::event_name;
pub use self::correlator::{Correlator, Outcome};

const QUEUE: usize = 1000;
const MAX_TRIES: usize = 12;
const RETRY_SLEEP: Duration = Duration::from_secs(10);

/// Why a write failed: `Final` errors are not retried (the server refused
/// the event), `Retry` ones are (the server is unreachable).
#[derive(Debug)]
pub enum SinkError {
    NotFound,
    Final(String),
    Retry(String),
}

/// Where events go (the API server, or a test's memory).
#[async_trait]
pub trait EventSink: Send + Sync {
    async fn create(&self, event: &Event) -> Result<Event, SinkError>;
    async fn patch(&self, namespace: &str, name: &str, patch: &Value) -> Result<Event, SinkError>;
}

/// The Event the kubelet builds for `record`.
pub fn build_event(
    node: &str,
    object: &ObjectReference,
    event_type: EventType,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> Event {
    let namespace = object.namespace.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| "default".into());
    Event {
        metadata: ObjectMeta {
            name: Some(event_name(object.name.as_deref().unwrap_or(""), now)),
            namespace: Some(namespace),
            ..Default::default()
        },
        involved_object: object.clone(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        source: Some(EventSource { component: Some("kubelet".into()), host: Some(node.into()) }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        type_: Some(event_type.as_str().into()),
        reporting_component: Some("kubelet".into()),
        reporting_instance: Some(node.into()),
        ..Default::default()
    }
}

/// The recorder: `record` correlates at once and queues the write; `run`
/// writes the queue to a sink.
pub struct ApiEventRecorder {
    node: String,
    correlator: Arc<Mutex<Correlator>>,
    queue: mpsc::Sender<Outcome>,
    rx: Mutex<Option<mpsc::Receiver<Outcome>>>,
    limiter: Arc<RateLimiter>,
}

impl ApiEventRecorder {
    pub fn new(node: &str, qps: u32, burst: u32) -> ApiEventRecorder {
        let (queue, rx) = mpsc::channel(QUEUE);
        ApiEventRecorder {
            node: node.into(),
            correlator: Arc::new(Mutex::new(Correlator::default())),
            queue,
            rx: Mutex::new(Some(rx)),
            limiter: Arc::new(RateLimiter::new(f64::from(qps), burst)),
        }
    }

    /// Writes queued events until `shutdown`; call once.
    pub async fn run(&self, sink: Arc<dyn EventSink>, shutdown: CancellationToken) {
        let Some(mut rx) = self.rx.lock().take() else {
            warn!("the event recorder runs only once");
            return;
        };
        loop {
            let outcome = tokio::select! {
                o = rx.recv() => match o { Some(o) => o, None => return },
                _ = shutdown.cancelled() => return,
            };
            tokio::select! {
                _ = self.write(&*sink, outcome) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }

    async fn write(&self, sink: &dyn EventSink, outcome: Outcome) {
        for attempt in 1..=MAX_TRIES {
            self.limiter.acquire().await;
            let result = match &outcome {
                Outcome::Create { event, .. } => sink.create(event).await,
                Outcome::Patch { event, patch, .. } => {
                    let ns = event.metadata.namespace.as_deref().unwrap_or("default");
                    match sink.patch(ns, event.metadata.name.as_deref().unwrap_or(""), patch).await {
                        // The old event is gone (TTL): write it anew.
                        Err(SinkError::NotFound) => {
                            let mut fresh = event.clone();
                            fresh.metadata.resource_version = None;
                            sink.create(&fresh).await
                        }
                        other => other,
                    }
                }
                Outcome::Skip => return,
            };
            match result {
                Ok(written) => {
                    if let Outcome::Create { key, .. } | Outcome::Patch { key, .. } = &outcome {
                        self.correlator.lock().written(key, &written);
                    }
                    return;
                }
                Err(SinkError::Final(e)) | Err(SinkError::Retry(e)) if attempt == MAX_TRIES => {
                    warn!("cannot write event (giving up after {attempt} tries): {e}");
                    return;
                }
                Err(SinkError::Final(e)) => {
                    warn!("the API server refused an event: {e}");
                    return;
                }
                Err(SinkError::NotFound) => return,
                Err(SinkError::Retry(e)) => {
                    debug!("cannot write event (try {attempt}): {e}");
                    tokio::time::sleep(RETRY_SLEEP).await;
                }
            }
        }
    }
}

impl AnnotatedEventRecorder for ApiEventRecorder {
    fn record_event(&self, e: &EventRecord<'_>) {
        let now = Timestamp::now();
        let mut event = build_event(&self.node, e.object, e.event_type, e.reason, e.message, now);
        if !e.annotations.is_empty() {
            event.metadata.annotations = Some(e.annotations.clone());
        }
        let outcome = self.correlator.lock().correlate(event, now, Instant::now());
        if outcome == Outcome::Skip {
            debug!(reason = e.reason, "event dropped by the spam filter");
            return;
        }
        if self.queue.try_send(outcome).is_err() {
            warn!(reason = e.reason, "event queue full; event dropped");
        }
    }
}

/// Records every event with each recorder (the API server's and the log,
/// or a test's).
pub struct TeeRecorder(pub Vec<Arc<dyn EventRecorder>>);

impl AnnotatedEventRecorder for TeeRecorder {
    fn record_event(&self, e: &EventRecord<'_>) {
        for r in &self.0 {
            r.record_annotated(e.object, e.event_type, e.reason, e.message, e.annotations);
        }
    }
}

/// Events through kube's client.
pub struct KubeEventSink(pub kube::Client);

fn sink_error(e: kube::Error) -> SinkError {
    match e {
        kube::Error::Api(s) if s.code == 404 => SinkError::NotFound,
        kube::Error::Api(s) if s.code == 409 || s.code == 422 || s.code == 400 || s.code == 403 => {
            SinkError::Final(s.message)
        }
        other => SinkError::Retry(other.to_string()),
    }
}

#[async_trait]
impl EventSink for KubeEventSink {
    async fn create(&self, event: &Event) -> Result<Event, SinkError> {
        let ns = event.metadata.namespace.as_deref().unwrap_or("default");
        let api: kube::Api<Event> = kube::Api::namespaced(self.0.clone(), ns);
        api.create(&kube::api::PostParams::default(), event).await.map_err(sink_error)
    }

    async fn patch(&self, namespace: &str, name: &str, patch: &Value) -> Result<Event, SinkError> {
        let api: kube::Api<Event> = kube::Api::namespaced(self.0.clone(), namespace);
        api.patch(name, &kube::api::PatchParams::default(), &kube::api::Patch::Strategic(patch))
            .await
            .map_err(sink_error)
    }
}

pub use crate::events::node_ref;
