//! client-go's EventCorrelator, pure: aggregation of similar events,
//! deduplication of identical ones into count patches, and the spam filter,
//! each keyed as client-go keys them. Aggregates and observations are
//! bounded by an LRU; the spam filter's buckets are forgotten once refilled.

use std::{
    collections::{BTreeSet, HashMap, VecDeque},
    hash::Hash,
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::core::v1::Event,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};
use serde_json::{Value, json};

use crate::flowcontrol::KeyedBucket;

const LRU_ENTRIES: usize = 4096;
const AGGREGATE_MAX_EVENTS: usize = 10;
const AGGREGATE_INTERVAL: Duration = Duration::from_secs(600);
const SPAM_BURST: u32 = 25;
const SPAM_QPS: f64 = 1.0 / 300.0;

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

/// A key of client-go's: the event's source and involved object (with its
/// field path or not), type and reason, then `tail`.
fn key(e: &Event, with_field_path: bool, tail: &[&Option<String>]) -> String {
    let src = e.source.as_ref();
    let o = &e.involved_object;
    let mut parts = vec![
        src.and_then(|s| s.component.as_deref()).unwrap_or(""),
        src.and_then(|s| s.host.as_deref()).unwrap_or(""),
        s(&o.kind),
        s(&o.namespace),
        s(&o.name),
    ];
    if with_field_path {
        parts.push(s(&o.field_path));
    }
    parts.extend([s(&o.uid), s(&o.api_version), s(&e.type_), s(&e.reason)]);
    parts.extend(tail.iter().map(|t| s(t)));
    join(&parts)
}

fn event_key(e: &Event) -> String {
    key(e, true, &[&e.message])
}

fn spam_key(e: &Event) -> String {
    key(e, false, &[&e.message])
}

fn aggregate_key(e: &Event) -> String {
    key(e, false, &[&e.reporting_component, &e.reporting_instance])
}

/// client-go's EventCorrelator: aggregation, deduplication, spam filter.
pub struct Correlator {
    aggregates: Lru<String, AggregateRecord>,
    observed: Lru<String, Observation>,
    spam: KeyedBucket<String>,
}

impl Default for Correlator {
    fn default() -> Self {
        Correlator {
            aggregates: Lru::new(LRU_ENTRIES),
            observed: Lru::new(LRU_ENTRIES),
            spam: KeyedBucket::new(SPAM_QPS, SPAM_BURST, LRU_ENTRIES),
        }
    }
}

/// A new event's name: the object's and the time in hex nanoseconds, as
/// client-go names them.
pub(super) fn event_name(object: &str, now: Timestamp) -> String {
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
        if self.spam.try_accept(&sk, clock) { outcome } else { Outcome::Skip }
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
