//! An EventRecorder that keeps what it is given, for assertions.

use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use swiftlet::events::{EventRecorder, EventType};

#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    pub object: ObjectReference,
    pub event_type: EventType,
    pub reason: String,
    pub message: String,
}

#[derive(Default)]
pub struct RecordedEvents(Mutex<Vec<Recorded>>);

impl RecordedEvents {
    pub fn all(&self) -> Vec<Recorded> {
        self.0.lock().unwrap().clone()
    }

    pub fn reasons(&self) -> Vec<String> {
        self.all().into_iter().map(|e| e.reason).collect()
    }

    pub fn clear(&self) {
        self.0.lock().unwrap().clear();
    }
}

impl EventRecorder for RecordedEvents {
    fn record(&self, object: &ObjectReference, event_type: EventType, reason: &str, message: &str) {
        self.0.lock().unwrap().push(Recorded {
            object: object.clone(),
            event_type,
            reason: reason.to_owned(),
            message: message.to_owned(),
        });
    }
}
