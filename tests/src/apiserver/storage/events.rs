//! Events, as client-go's recorder writes them for the controllers:
//! core/v1 Events on the object (in its namespace; "default" for
//! cluster-scoped objects), with the same event again counted on the one
//! object rather than written anew. The controllers resync often, so a
//! repeat within [`REPEAT_AFTER`] is dropped (the real recorder's spam
//! filter does the same job).

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use super::objects::{name, namespace, s, uid};
use crate::apiserver::{
    resources::EVENTS,
    store::{Store, now_rfc3339},
};

pub const NORMAL: &str = "Normal";
pub const WARNING: &str = "Warning";

/// The same event is counted again at most this often.
const REPEAT_AFTER: Duration = Duration::from_secs(5);

/// (object uid, type, reason, message)
type Key = (String, String, String, String);

#[derive(Default)]
pub struct Recorder {
    /// The Event object written for each key, and when it was last counted.
    seen: Mutex<HashMap<Key, (String, String, Instant)>>,
}

impl Recorder {
    /// Records an event about `obj` (a stored object) from `component`.
    pub fn record(&self, store: &Store, obj: &Value, kind: &str, reason: &str, message: &str, component: &str) {
        let key = (uid(obj).to_owned(), kind.to_owned(), reason.to_owned(), message.to_owned());
        let ns = match namespace(obj) {
            "" => "default",
            n => n,
        };
        let previous = {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            // Forget what is long past, so the map stays small.
            seen.retain(|_, (_, _, at)| at.elapsed() < Duration::from_secs(600));
            match seen.get_mut(&key) {
                Some((_, _, at)) if at.elapsed() < REPEAT_AFTER => return,
                Some((event, event_ns, at)) => {
                    *at = Instant::now();
                    Some((event.clone(), event_ns.clone()))
                }
                None => None,
            }
        };
        let now = now_rfc3339();
        if let Some((event, event_ns)) = previous
            && let Ok(mut e) = store.get(&EVENTS, &event_ns, &event)
        {
            e["count"] = (e["count"].as_i64().unwrap_or(1) + 1).into();
            e["lastTimestamp"] = now.clone().into();
            if store.update(&EVENTS, &event_ns, &event, e, |_, _| {}).is_ok() {
                return;
            }
        }
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos() as u64;
        let event_name = format!("{}.{nanos:x}", name(obj));
        let event = json!({
            "metadata": {"name": event_name, "namespace": ns},
            "involvedObject": {
                "kind": s(obj, "/kind"),
                "namespace": namespace(obj),
                "name": name(obj),
                "uid": uid(obj),
                "apiVersion": s(obj, "/apiVersion"),
                "resourceVersion": s(obj, "/metadata/resourceVersion"),
            },
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": component,
            "reportingInstance": "",
        });
        match store.create(&EVENTS, ns, event) {
            Ok(_) => {
                self.seen
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key, (event_name, ns.to_owned(), Instant::now()));
            }
            Err(e) => tracing::debug!(reason, error = %e.message, "cannot record an event"),
        }
    }
}
