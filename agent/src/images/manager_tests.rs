//! The image manager against the in-memory runtime: reasons, events,
//! back-off, pull concurrency and throttling, the pod workers' seam.

use std::sync::Mutex as StdMutex;

use k8s_openapi::{api::core::v1::PodSpec, apimachinery::pkg::apis::meta::v1::ObjectMeta};

use super::*;
use crate::cri::fake::{FakeRuntime, Fault, Method};

#[derive(Default)]
struct Events(StdMutex<Vec<(String, EventType, String, String)>>);

impl EventRecorder for Events {
    fn record(&self, object: &ObjectReference, t: EventType, reason: &str, message: &str) {
        self.0.lock().unwrap().push((
            object.field_path.clone().unwrap_or_default(),
            t,
            reason.to_owned(),
            message.to_owned(),
        ));
    }
}

impl Events {
    fn reasons(&self) -> Vec<String> {
        self.0.lock().unwrap().iter().map(|e| e.2.clone()).collect()
    }
    fn last(&self) -> (String, EventType, String, String) {
        self.0.lock().unwrap().last().cloned().unwrap()
    }
    fn clear(&self) {
        self.0.lock().unwrap().clear();
    }
}

fn container(name: &str, image: &str, policy: Option<&str>) -> Container {
    Container {
        name: name.into(),
        image: Some(image.into()),
        image_pull_policy: policy.map(str::to_owned),
        ..Default::default()
    }
}

fn pod(uid: &str, containers: Vec<Container>, init: Vec<Container>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers,
            init_containers: if init.is_empty() { None } else { Some(init) },
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn setup(cfg: ImageManagerConfig) -> (Arc<FakeRuntime>, Arc<Events>, ImageManager) {
    let rt = Arc::new(FakeRuntime::new());
    let ev = Arc::new(Events::default());
    let m = ImageManager::new(rt.clone(), ev.clone(), cfg);
    (rt, ev, m)
}

fn unthrottled() -> ImageManagerConfig {
    ImageManagerConfig { registry_pull_qps: 0, ..Default::default() }
}

#[tokio::test]
async fn the_six_reasons_and_their_events() {
    use ImageErrorReason::*;
    let (rt, ev, m) = setup(unthrottled());
    rt.add_image("busybox:1.36", 100);
    rt.make_pullable("nginx:1.27", 200);
    rt.set_pull_error(
        "127.0.0.1:9/app:1",
        tonic::Code::Unknown,
        "failed to pull and unpack image \"127.0.0.1:9/app:1\": failed to resolve reference \"127.0.0.1:9/app:1\": failed to do request: Head \"http://127.0.0.1:9/v2/app/manifests/1\": dial tcp 127.0.0.1:9: connect: connection refused",
    );
    rt.fail(
        Fault::new(
            Method::ImageStatus,
            tonic::Code::Unknown,
            "can not resolve \"sha256:ab\" locally: ambiguous digest string",
        )
        .on("sha256:ab"),
    );

    // (image, policy, expected reason or None for success, last event reason)
    let cases: Vec<(&str, Option<&str>, Option<ImageErrorReason>, &str)> = vec![
        ("Busybox", None, Some(InvalidImageName), event::INSPECT_FAILED),
        ("busybox:", None, Some(InvalidImageName), event::INSPECT_FAILED),
        ("sha256:ab", None, Some(ImageInspectError), event::INSPECT_FAILED),
        ("nginx:1.27", Some("Never"), Some(ErrImageNeverPull), event::ERR_IMAGE_NEVER_PULL),
        ("busybox:1.36", Some("Never"), None, event::PULLED),
        ("busybox:1.36", None, None, event::PULLED),
        ("nope:1", None, Some(ErrImagePull), event::FAILED),
        ("127.0.0.1:9/app:1", None, Some(RegistryUnavailable), event::FAILED),
        ("nginx:1.27", None, None, event::PULLED),
    ];
    for (i, (image, policy, want, last_event)) in cases.into_iter().enumerate() {
        rt.clear_calls();
        ev.clear();
        let c = container("app", image, policy);
        let p = pod(&format!("uid-{i}"), vec![c.clone()], vec![]);
        let got = m.ensure_image(&p, &c, None).await;
        assert_eq!(got.as_ref().err().map(|e| e.reason), want, "{image}: {got:?}");
        let (field, _, reason, _) = ev.last();
        assert_eq!((field.as_str(), reason.as_str()), ("spec.containers{app}", last_event), "{image}");
        if want == Some(InvalidImageName) {
            assert!(rt.calls().is_empty(), "{image}: no runtime call for a bad name");
        }
        if matches!(want, Some(ErrImagePull | RegistryUnavailable)) || (want.is_none() && image == "nginx:1.27") {
            assert_eq!(ev.reasons()[0], event::PULLING);
            assert_eq!(rt.count(Method::PullImage), 1, "{image}");
        } else {
            assert_eq!(rt.count(Method::PullImage), 0, "{image}");
        }
    }
}

#[tokio::test]
async fn messages_as_the_kubelet() {
    let (rt, ev, m) = setup(unthrottled());
    rt.add_image("busybox:1.36", 1234);
    let c = container("app", "Busybox", None);
    let e = m.ensure_image(&pod("u", vec![c.clone()], vec![]), &c, None).await.unwrap_err();
    assert_eq!(
        e.message,
        "Failed to apply default image tag \"Busybox\": couldn't parse image name \"Busybox\": invalid reference format: repository name (library/Busybox) must be lowercase"
    );
    let c = container("app", "busybox:1.36", None);
    m.ensure_image(&pod("u", vec![c.clone()], vec![]), &c, None).await.unwrap();
    assert_eq!(ev.last().3, "Container image \"busybox:1.36\" already present on machine");
    let c = container("app", "nginx", Some("Never"));
    let e = m.ensure_image(&pod("u", vec![c.clone()], vec![]), &c, None).await.unwrap_err();
    assert_eq!(e.message, "Container image \"nginx\" is not present with pull policy of Never");
    rt.make_pullable("nginx", 5000);
    let c = container("app", "nginx", None);
    let r = m.ensure_image(&pod("u", vec![c.clone()], vec![]), &c, None).await.unwrap();
    assert!(r.as_str().starts_with("sha256:"));
    let (_, t, reason, msg) = ev.last();
    assert_eq!((t, reason.as_str()), (EventType::Normal, event::PULLED));
    assert!(msg.starts_with("Successfully pulled image \"nginx\" in "), "{msg}");
    assert!(msg.ends_with("including waiting). Image size: 5000 bytes."), "{msg}");
    rt.fail(Fault::new(Method::ImageStatus, tonic::Code::Internal, "boom").on("x:1"));
    let c = container("app", "x:1", None);
    let e = m.ensure_image(&pod("u", vec![c.clone()], vec![]), &c, None).await.unwrap_err();
    assert_eq!(e.message, "Failed to inspect image \"x:1\": rpc error: code = Internal desc = boom");
}

#[tokio::test(start_paused = true)]
async fn back_off_per_pod_and_image() {
    let (rt, ev, m) = setup(unthrottled());
    let c = container("app", "missing:1", None);
    let p = pod("u1", vec![c.clone()], vec![]);
    // (advance before the attempt in seconds, expected reason, pulled?)
    let steps = [
        (0, ImageErrorReason::ErrImagePull, true),
        (5, ImageErrorReason::ImagePullBackOff, false),
        (5, ImageErrorReason::ErrImagePull, true), // 10 s after the failure
        (19, ImageErrorReason::ImagePullBackOff, false),
        (1, ImageErrorReason::ErrImagePull, true), // 20 s
        (39, ImageErrorReason::ImagePullBackOff, false),
        (1, ImageErrorReason::ErrImagePull, true), // 40 s
    ];
    for (i, (advance, want, pulled)) in steps.into_iter().enumerate() {
        tokio::time::advance(Duration::from_secs(advance)).await;
        let before = rt.count(Method::PullImage);
        let e = m.ensure_image(&p, &c, None).await.unwrap_err();
        assert_eq!(e.reason, want, "step {i}");
        assert_eq!(rt.count(Method::PullImage) - before, pulled as usize, "step {i}");
        if want == ImageErrorReason::ImagePullBackOff {
            assert_eq!(ev.last().2, event::BACK_OFF);
            assert!(
                e.message.starts_with("Back-off pulling image \"missing:1\": ErrImagePull: failed to pull"),
                "{}",
                e.message
            );
        }
    }
    assert!(m.retry_at(&p, &c).is_some());
    // Another pod pulling the same image has its own back-off.
    let p2 = pod("u2", vec![c.clone()], vec![]);
    assert_eq!(m.ensure_image(&p2, &c, None).await.unwrap_err().reason, ImageErrorReason::ErrImagePull);
    // Once the image can be pulled, the next try after the back-off works.
    rt.make_pullable("missing:1", 1);
    assert_eq!(m.ensure_image(&p, &c, None).await.unwrap_err().reason, ImageErrorReason::ImagePullBackOff);
    tokio::time::advance(Duration::from_secs(80)).await;
    m.ensure_image(&p, &c, None).await.unwrap();
}

#[tokio::test]
async fn init_containers_get_their_field_path() {
    let (rt, ev, m) = setup(unthrottled());
    rt.add_image("busybox:1.36", 1);
    let init = container("setup", "busybox:1.36", None);
    let p = pod("u", vec![container("app", "busybox:1.36", None)], vec![init.clone()]);
    m.ensure_image(&p, &init, None).await.unwrap();
    assert_eq!(ev.last().0, "spec.initContainers{setup}");
}

async fn concurrency(cfg: ImageManagerConfig) -> usize {
    let (rt, _ev, m) = setup(cfg);
    rt.set_latency(Method::PullImage, Duration::from_secs(2));
    let images = ["a:1", "b:1", "c:1", "d:1"];
    for i in images {
        rt.make_pullable(i, 1);
    }
    let m = Arc::new(m);
    let tasks: Vec<_> = images
        .iter()
        .enumerate()
        .map(|(n, i)| {
            let m = m.clone();
            let c = container("app", i, None);
            let p = pod(&format!("u{n}"), vec![c.clone()], vec![]);
            tokio::spawn(async move { m.ensure_image(&p, &c, None).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    rt.max_in_flight(Method::PullImage)
}

#[tokio::test(start_paused = true)]
async fn serialized_or_parallel_pulls() {
    assert_eq!(concurrency(unthrottled()).await, 1);
    let parallel = |n| ImageManagerConfig {
        serialize_image_pulls: false,
        max_parallel_image_pulls: n,
        registry_pull_qps: 0,
        ..Default::default()
    };
    assert_eq!(concurrency(parallel(Some(2))).await, 2);
    assert_eq!(concurrency(parallel(None)).await, 4);
}

#[tokio::test(start_paused = true)]
async fn registry_qps_limits_pulls() {
    let cfg = ImageManagerConfig { registry_pull_qps: 1, registry_burst: 1, ..Default::default() };
    let (rt, _ev, m) = setup(cfg);
    rt.make_pullable("a:1", 1);
    rt.make_pullable("b:1", 1);
    let a = container("app", "a:1", None);
    let b = container("app", "b:1", None);
    m.ensure_image(&pod("u1", vec![a.clone()], vec![]), &a, None).await.unwrap();
    let e = m.ensure_image(&pod("u2", vec![b.clone()], vec![]), &b, None).await.unwrap_err();
    assert_eq!((e.reason, e.message.as_str()), (ImageErrorReason::ErrImagePull, "pull QPS exceeded"));
    assert_eq!(rt.count(Method::PullImage), 1, "the throttled pull never reached the runtime");
}

#[tokio::test]
async fn serves_the_pod_workers_seam() {
    use crate::pods::pull::ImageEnsurer;
    let (rt, _ev, m) = setup(unthrottled());
    rt.add_image("busybox:1.36", 1);
    let ensurer: Arc<dyn ImageEnsurer> = Arc::new(m);
    let ok = container("app", "busybox:1.36", None);
    let got = ensurer.ensure(&pod("u", vec![ok.clone()], vec![]), &ok, &Default::default()).await.unwrap();
    assert!(got.image_ref.starts_with("sha256:"));
    assert_eq!(got.user.uid, Some(0), "an image without a user runs as root");
    let bad = container("app", "Busybox", None);
    let e = ensurer.ensure(&pod("u", vec![bad.clone()], vec![]), &bad, &Default::default()).await.unwrap_err();
    assert_eq!(e.reason, "InvalidImageName");
}

#[test]
fn go_durations() {
    let ms = Duration::from_millis;
    let cases = [
        (ms(0), "0s"),
        (ms(850), "850ms"),
        (ms(1000), "1s"),
        (ms(1500), "1.5s"),
        (ms(1234), "1.234s"),
        (ms(123_250), "2m3.25s"),
        (ms(3_605_000), "1h0m5s"),
        (Duration::from_micros(1999), "1ms"),
    ];
    for (d, want) in cases {
        assert_eq!(go_duration(d), want);
    }
}
