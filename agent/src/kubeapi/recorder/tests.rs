//! The correlator table-tested, and the recorder against an in-memory sink.

use serde_json::json;
use tokio_util::sync::CancellationToken;

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
    let e =
        build_event("n1", &node_ref("n1"), EventType::Normal, "NodeReady", "Node n1 status is now: NodeReady", at(0));
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
        if c.correlate(ev("web", "BackOff", "Back-off restarting failed container", i), at(i), t0) != Outcome::Skip {
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
    assert_ne!(c.correlate(ev("db", "BackOff", "Back-off restarting failed container", 1), at(1), t0), Outcome::Skip);
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
        let mut f = self.failures.lock();
        if *f > 0 {
            *f -= 1;
            return Err(SinkError::Retry("connection refused".into()));
        }
        let mut e = event.clone();
        e.metadata.resource_version = Some("1".into());
        self.created.lock().push(e.clone());
        Ok(e)
    }

    async fn patch(&self, _ns: &str, name: &str, patch: &Value) -> Result<Event, SinkError> {
        if self.missing {
            return Err(SinkError::NotFound);
        }
        self.patched.lock().push((name.into(), patch.clone()));
        let mut e = self.created.lock().iter().find(|e| e.metadata.name.as_deref() == Some(name)).cloned().unwrap();
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
    let stop = CancellationToken::new();
    let shutdown = stop.clone();
    let r = rec.clone();
    let s: Arc<dyn EventSink> = sink.clone();
    let task = tokio::spawn(async move { r.run(s, shutdown).await });
    rec.record(&pod_ref("web"), EventType::Normal, "Started", "Started container c");
    rec.record(&pod_ref("web"), EventType::Normal, "Started", "Started container c");
    // Two failed tries (10 s apart) before the first write lands.
    tokio::time::sleep(Duration::from_secs(25)).await;
    assert_eq!(sink.created.lock().len(), 1);
    assert_eq!(sink.patched.lock().len(), 1);
    assert_eq!(sink.patched.lock()[0].1["count"], 2);
    stop.cancel();
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
    let _stop = CancellationToken::new();
    let shutdown = _stop.clone();
    let r = rec.clone();
    let s: Arc<dyn EventSink> = sink.clone();
    tokio::spawn(async move { r.run(s, shutdown).await });
    rec.record(&pod_ref("web"), EventType::Warning, "Failed", "x");
    rec.record(&pod_ref("web"), EventType::Warning, "Failed", "x");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let created = sink.created.lock();
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
    let _stop = CancellationToken::new();
    let shutdown = _stop.clone();
    let r = rec.clone();
    let s: Arc<dyn EventSink> = sink.clone();
    tokio::spawn(async move { r.run(s, shutdown).await });
    for i in 0..5 {
        rec.record(&pod_ref(&format!("p{i}")), EventType::Normal, "Created", "c");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(sink.created.lock().len(), 2, "the burst");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(sink.created.lock().len(), 3, "then one per second");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(sink.created.lock().len(), 5);
}
