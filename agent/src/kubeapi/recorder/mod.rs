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

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    hash::Hash,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use k8s_openapi::{
    api::core::v1::{Event, EventSource, ObjectReference},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use super::ratelimit::{RateLimiter, TokenBucket};
use crate::events::{EventRecorder, EventType};

const LRU_ENTRIES: usize = 4096;
const AGGREGATE_MAX_EVENTS: usize = 10;
const AGGREGATE_INTERVAL: Duration = Duration::from_secs(600);
const SPAM_BURST: u32 = 25;
const SPAM_QPS: f64 = 1.0 / 300.0;
const QUEUE: usize = 1000;
const MAX_TRIES: usize = 12;
const RETRY_SLEEP: Duration = Duration::from_secs(10);

/// A map that forgets its oldest entries beyond a bound.
struct Lru<K, V> {
    map: HashMap<K, V>,
    order: VecDeque<K>,
    cap: usize,
}

impl<K: Clone + Eq + Hash, V> Lru<K, V> {
    fn new(cap: usize) -> Self {
        Lru { map: HashMap::new(), order: VecDeque::new(), cap }
    }

    fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        self.map.get_mut(k)
    }

    fn insert(&mut self, k: K, v: V) {
        if self.map.insert(k.clone(), v).is_none() {
            self.order.push_back(k);
            while self.order.len() > self.cap {
                if let Some(old) = self.order.pop_front() {
                    self.map.remove(&old);
                }
            }
        }
    }
}

struct AggregateRecord {
    messages: BTreeSet<String>,
    last: Timestamp,
}

#[derive(Clone, Debug)]
struct Observation {
    count: i32,
    first: Option<Time>,
    name: String,
    resource_version: Option<String>,
}

/// What to do with an event.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Create {
        key: String,
        event: Event,
    },
    /// Increment an event already written: `patch` is the strategic merge
    /// patch (count, lastTimestamp, message); `event` the full event, to
    /// create if the old one is gone.
    Patch {
        key: String,
        event: Event,
        patch: Value,
    },
    /// Dropped by the spam filter.
    Skip,
}

fn join(parts: &[&str]) -> String {
    parts.join("\u{1}")
}

fn s(o: &Option<String>) -> &str {
    o.as_deref().unwrap_or("")
}

fn event_key(e: &Event) -> String {
    let (src, o) = (e.source.clone().unwrap_or_default(), &e.involved_object);
    join(&[
        s(&src.component),
        s(&src.host),
        s(&o.kind),
        s(&o.namespace),
        s(&o.name),
        s(&o.field_path),
        s(&o.uid),
        s(&o.api_version),
        s(&e.type_),
        s(&e.reason),
        s(&e.message),
    ])
}

fn spam_key(e: &Event) -> String {
    let (src, o) = (e.source.clone().unwrap_or_default(), &e.involved_object);
    join(&[
        s(&src.component),
        s(&src.host),
        s(&o.kind),
        s(&o.namespace),
        s(&o.name),
        s(&o.uid),
        s(&o.api_version),
        s(&e.type_),
        s(&e.reason),
        s(&e.message),
    ])
}

fn aggregate_key(e: &Event) -> String {
    let (src, o) = (e.source.clone().unwrap_or_default(), &e.involved_object);
    join(&[
        s(&src.component),
        s(&src.host),
        s(&o.kind),
        s(&o.namespace),
        s(&o.name),
        s(&o.uid),
        s(&o.api_version),
        s(&e.type_),
        s(&e.reason),
        s(&e.reporting_component),
        s(&e.reporting_instance),
    ])
}

/// client-go's EventCorrelator: aggregation, deduplication, spam filter.
pub struct Correlator {
    aggregates: Lru<String, AggregateRecord>,
    observed: Lru<String, Observation>,
    spam: Lru<String, TokenBucket>,
}

impl Default for Correlator {
    fn default() -> Self {
        Correlator { aggregates: Lru::new(LRU_ENTRIES), observed: Lru::new(LRU_ENTRIES), spam: Lru::new(LRU_ENTRIES) }
    }
}

fn event_name(object: &str, now: Timestamp) -> String {
    format!("{object}.{:x}", now.as_nanosecond())
}

impl Correlator {
    pub fn correlate(&mut self, event: Event, now: Timestamp, clock: Instant) -> Outcome {
        let now_time = Time(now);
        // Aggregation of similar events.
        let agg_key = aggregate_key(&event);
        let record = match self.aggregates.get_mut(&agg_key) {
            Some(r) if now.duration_since(r.last).unsigned_abs() <= AGGREGATE_INTERVAL => r,
            _ => {
                self.aggregates.insert(agg_key.clone(), AggregateRecord { messages: BTreeSet::new(), last: now });
                self.aggregates.get_mut(&agg_key).expect("just inserted")
            }
        };
        record.messages.insert(event.message.clone().unwrap_or_default());
        record.last = now;
        let (mut event, key) = if record.messages.len() < AGGREGATE_MAX_EVENTS {
            let key = event_key(&event);
            (event, key)
        } else {
            if let Some(first) = record.messages.iter().next().cloned() {
                record.messages.remove(&first);
            }
            let combined = Event {
                metadata: ObjectMeta {
                    name: Some(event_name(s(&event.involved_object.name), now)),
                    namespace: event.metadata.namespace.clone(),
                    ..Default::default()
                },
                count: Some(1),
                first_timestamp: Some(now_time.clone()),
                last_timestamp: Some(now_time.clone()),
                message: Some(format!("(combined from similar events): {}", s(&event.message))),
                ..event
            };
            (combined, agg_key)
        };
        // Deduplication.
        let outcome = match self.observed.get_mut(&key) {
            Some(seen) if seen.count > 0 => {
                event.metadata.name = Some(seen.name.clone());
                event.metadata.resource_version = seen.resource_version.clone();
                event.first_timestamp = seen.first.clone();
                event.count = Some(seen.count + 1);
                event.last_timestamp = Some(now_time.clone());
                let patch = json!({
                    "count": event.count,
                    "lastTimestamp": now_time,
                    "message": event.message,
                });
                seen.count += 1;
                Outcome::Patch { key, event, patch }
            }
            _ => {
                self.observed.insert(
                    key.clone(),
                    Observation {
                        count: event.count.unwrap_or(1),
                        first: event.first_timestamp.clone(),
                        name: event.metadata.name.clone().unwrap_or_default(),
                        resource_version: None,
                    },
                );
                Outcome::Create { key, event }
            }
        };
        // The spam filter, per object and event.
        let sk = match &outcome {
            Outcome::Create { event, .. } | Outcome::Patch { event, .. } => spam_key(event),
            Outcome::Skip => return Outcome::Skip,
        };
        let allowed = match self.spam.get_mut(&sk) {
            Some(b) => b.try_take(clock),
            None => {
                let mut b = TokenBucket::new(SPAM_QPS, SPAM_BURST, clock);
                let ok = b.try_take(clock);
                self.spam.insert(sk, b);
                ok
            }
        };
        if allowed { outcome } else { Outcome::Skip }
    }

    /// After a successful write: remember the object's name and version.
    pub fn written(&mut self, key: &str, event: &Event) {
        if let Some(o) = self.observed.get_mut(&key.to_owned()) {
            o.name = event.metadata.name.clone().unwrap_or_default();
            o.resource_version = event.metadata.resource_version.clone();
            o.count = event.count.unwrap_or(o.count).max(o.count);
            o.first = event.first_timestamp.clone().or(o.first.clone());
        }
    }
}

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
    pub async fn run(&self, sink: Arc<dyn EventSink>, mut shutdown: watch::Receiver<bool>) {
        let Some(mut rx) = self.rx.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            warn!("the event recorder runs only once");
            return;
        };
        loop {
            let outcome = tokio::select! {
                o = rx.recv() => match o { Some(o) => o, None => return },
                _ = shutdown.wait_for(|s| *s) => return,
            };
            tokio::select! {
                _ = self.write(&*sink, outcome) => {}
                _ = shutdown.wait_for(|s| *s) => return,
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
                        self.correlator.lock().unwrap_or_else(|p| p.into_inner()).written(key, &written);
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

impl EventRecorder for ApiEventRecorder {
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
        let now = Timestamp::now();
        let mut event = build_event(&self.node, object, event_type, reason, message, now);
        if !annotations.is_empty() {
            event.metadata.annotations = Some(annotations.clone());
        }
        let outcome = self.correlator.lock().unwrap_or_else(|p| p.into_inner()).correlate(event, now, Instant::now());
        if outcome == Outcome::Skip {
            debug!(reason, "event dropped by the spam filter");
            return;
        }
        if self.queue.try_send(outcome).is_err() {
            warn!(reason, "event queue full; event dropped");
        }
    }
}

/// Records every event with each recorder (the API server's and the log,
/// or a test's).
pub struct TeeRecorder(pub Vec<Arc<dyn EventRecorder>>);

impl EventRecorder for TeeRecorder {
    fn record(&self, object: &ObjectReference, event_type: EventType, reason: &str, message: &str) {
        for r in &self.0 {
            r.record(object, event_type, reason, message);
        }
    }

    fn record_annotated(
        &self,
        object: &ObjectReference,
        event_type: EventType,
        reason: &str,
        message: &str,
        annotations: &BTreeMap<String, String>,
    ) {
        for r in &self.0 {
            r.record_annotated(object, event_type, reason, message, annotations);
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

/// The reference the kubelet uses for its node's events (UID = name).
pub fn node_ref(node: &str) -> ObjectReference {
    ObjectReference { kind: Some("Node".into()), name: Some(node.into()), uid: Some(node.into()), ..Default::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_ref(name: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("Pod".into()),
            namespace: Some("default".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            api_version: Some("v1".into()),
            ..Default::default()
        }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn ev(name: &str, reason: &str, message: &str, secs: i64) -> Event {
        build_event("n1", &pod_ref(name), EventType::Normal, reason, message, at(secs))
    }

    #[test]
    fn builds_the_kubelets_event() {
        let e = build_event(
            "n1",
            &node_ref("n1"),
            EventType::Normal,
            "NodeReady",
            "Node n1 status is now: NodeReady",
            at(0),
        );
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"), "cluster-scoped objects' events go to default");
        assert!(e.metadata.name.as_deref().unwrap().starts_with("n1."));
        assert_eq!(e.source.as_ref().unwrap().component.as_deref(), Some("kubelet"));
        assert_eq!(e.source.as_ref().unwrap().host.as_deref(), Some("n1"));
        assert_eq!(e.involved_object.uid.as_deref(), Some("n1"));
        assert_eq!(e.count, Some(1));
        let p = build_event("n1", &pod_ref("web"), EventType::Warning, "BackOff", "x", at(0));
        assert_eq!(p.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(p.type_.as_deref(), Some("Warning"));
    }

    #[test]
    fn identical_events_become_count_patches() {
        let mut c = Correlator::default();
        let t0 = Instant::now();
        let first = c.correlate(ev("web", "Pulled", "pulled busybox", 0), at(0), t0);
        let Outcome::Create { key, event } = first else { panic!("{first:?}") };
        let mut written = event.clone();
        written.metadata.resource_version = Some("77".into());
        c.written(&key, &written);
        let second = c.correlate(ev("web", "Pulled", "pulled busybox", 5), at(5), t0);
        let Outcome::Patch { event, patch, .. } = second else { panic!("{second:?}") };
        assert_eq!(event.count, Some(2));
        assert_eq!(event.metadata.name, written.metadata.name, "the same object is patched");
        assert_eq!(event.metadata.resource_version.as_deref(), Some("77"));
        assert_eq!(event.first_timestamp, Some(Time(at(0))));
        assert_eq!(patch["count"], 2);
        assert_eq!(patch["lastTimestamp"], json!(Time(at(5))));
        let third = c.correlate(ev("web", "Pulled", "pulled busybox", 6), at(6), t0);
        assert!(matches!(third, Outcome::Patch { ref event, .. } if event.count == Some(3)));
        // Another object or message is another event.
        assert!(matches!(c.correlate(ev("db", "Pulled", "pulled busybox", 6), at(6), t0), Outcome::Create { .. }));
        assert!(matches!(c.correlate(ev("web", "Pulled", "pulled pause", 6), at(6), t0), Outcome::Create { .. }));
    }

    #[test]
    fn similar_events_are_combined_after_ten() {
        let mut c = Correlator::default();
        let t0 = Instant::now();
        let mut outcomes = vec![];
        for i in 0..12 {
            outcomes.push(c.correlate(ev("web", "Unhealthy", &format!("probe failed: {i}"), i), at(i), t0));
        }
        for o in &outcomes[..9] {
            assert!(
                matches!(o, Outcome::Create { event, .. } if !event.message.as_deref().unwrap().starts_with("(combined"))
            );
        }
        let Outcome::Create { event, .. } = &outcomes[9] else { panic!("{:?}", outcomes[9]) };
        assert_eq!(event.message.as_deref(), Some("(combined from similar events): probe failed: 9"));
        // Later similar ones update the combined event.
        let Outcome::Patch { event, .. } = &outcomes[10] else { panic!("{:?}", outcomes[10]) };
        assert_eq!(event.message.as_deref(), Some("(combined from similar events): probe failed: 10"));
        assert_eq!(event.count, Some(2));
        // After 10 quiet minutes the aggregation starts afresh.
        let fresh = c.correlate(ev("web", "Unhealthy", "probe failed: late", 2000), at(2000), t0);
        assert!(
            matches!(fresh, Outcome::Create { ref event, .. } if event.message.as_deref() == Some("probe failed: late"))
        );
    }

    #[test]
    fn spam_filter_allows_a_burst_then_one_per_five_minutes() {
        let mut c = Correlator::default();
        let t0 = Instant::now();
        let mut passed = 0;
        for i in 0..40 {
            if c.correlate(ev("web", "BackOff", "Back-off restarting failed container", i), at(i), t0) != Outcome::Skip
            {
                passed += 1;
            }
        }
        assert_eq!(passed, 25);
        assert_eq!(
            c.correlate(
                ev("web", "BackOff", "Back-off restarting failed container", 50),
                at(50),
                t0 + Duration::from_secs(100)
            ),
            Outcome::Skip
        );
        assert_ne!(
            c.correlate(
                ev("web", "BackOff", "Back-off restarting failed container", 400),
                at(400),
                t0 + Duration::from_secs(301)
            ),
            Outcome::Skip
        );
        // Other objects have their own budget.
        assert_ne!(
            c.correlate(ev("db", "BackOff", "Back-off restarting failed container", 1), at(1), t0),
            Outcome::Skip
        );
    }

    /// A sink in memory: fails the first `failures` writes, keeps the rest.
    struct MemorySink {
        failures: Mutex<usize>,
        created: Mutex<Vec<Event>>,
        patched: Mutex<Vec<(String, Value)>>,
        missing: bool,
    }

    #[async_trait]
    impl EventSink for MemorySink {
        async fn create(&self, event: &Event) -> Result<Event, SinkError> {
            let mut f = self.failures.lock().unwrap();
            if *f > 0 {
                *f -= 1;
                return Err(SinkError::Retry("connection refused".into()));
            }
            let mut e = event.clone();
            e.metadata.resource_version = Some("1".into());
            self.created.lock().unwrap().push(e.clone());
            Ok(e)
        }

        async fn patch(&self, _ns: &str, name: &str, patch: &Value) -> Result<Event, SinkError> {
            if self.missing {
                return Err(SinkError::NotFound);
            }
            self.patched.lock().unwrap().push((name.into(), patch.clone()));
            let mut e = self
                .created
                .lock()
                .unwrap()
                .iter()
                .find(|e| e.metadata.name.as_deref() == Some(name))
                .cloned()
                .unwrap();
            e.count = patch["count"].as_i64().map(|c| c as i32);
            Ok(e)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn writes_retry_and_dedup_through_the_sink() {
        let rec = Arc::new(ApiEventRecorder::new("n1", 50, 100));
        let sink = Arc::new(MemorySink {
            failures: Mutex::new(2),
            created: Mutex::default(),
            patched: Mutex::default(),
            missing: false,
        });
        let (stop, shutdown) = watch::channel(false);
        let r = rec.clone();
        let s: Arc<dyn EventSink> = sink.clone();
        let task = tokio::spawn(async move { r.run(s, shutdown).await });
        rec.record(&pod_ref("web"), EventType::Normal, "Started", "Started container c");
        rec.record(&pod_ref("web"), EventType::Normal, "Started", "Started container c");
        // Two failed tries (10 s apart) before the first write lands.
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert_eq!(sink.created.lock().unwrap().len(), 1);
        assert_eq!(sink.patched.lock().unwrap().len(), 1);
        assert_eq!(sink.patched.lock().unwrap()[0].1["count"], 2);
        stop.send(true).unwrap();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_vanished_event_is_created_again() {
        let rec = Arc::new(ApiEventRecorder::new("n1", 0, 1));
        let sink = Arc::new(MemorySink {
            failures: Mutex::new(0),
            created: Mutex::default(),
            patched: Mutex::default(),
            missing: true,
        });
        let (_stop, shutdown) = watch::channel(false);
        let r = rec.clone();
        let s: Arc<dyn EventSink> = sink.clone();
        tokio::spawn(async move { r.run(s, shutdown).await });
        rec.record(&pod_ref("web"), EventType::Warning, "Failed", "x");
        rec.record(&pod_ref("web"), EventType::Warning, "Failed", "x");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let created = sink.created.lock().unwrap();
        assert_eq!(created.len(), 2);
        assert_eq!(created[1].count, Some(2));
    }

    #[tokio::test(start_paused = true)]
    async fn event_qps_limits_writes() {
        let rec = Arc::new(ApiEventRecorder::new("n1", 1, 2));
        let sink = Arc::new(MemorySink {
            failures: Mutex::new(0),
            created: Mutex::default(),
            patched: Mutex::default(),
            missing: false,
        });
        let (_stop, shutdown) = watch::channel(false);
        let r = rec.clone();
        let s: Arc<dyn EventSink> = sink.clone();
        tokio::spawn(async move { r.run(s, shutdown).await });
        for i in 0..5 {
            rec.record(&pod_ref(&format!("p{i}")), EventType::Normal, "Created", "c");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(sink.created.lock().unwrap().len(), 2, "the burst");
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert_eq!(sink.created.lock().unwrap().len(), 3, "then one per second");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(sink.created.lock().unwrap().len(), 5);
    }
}
