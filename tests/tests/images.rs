//! The image manager and image GC on the real containerd (`cargo xtask
//! test` starts it): each of the six reasons as it is produced here, real
//! pulls from a registry the test runs on 127.0.0.1, and image GC removing
//! an unused image but not one in use. Needs root.
//!
//! How each reason arises on containerd 1.6 (see `swiftlet::images`):
//! InvalidImageName from the reference grammar with no runtime call;
//! ErrImageNeverPull from policy Never and an absent image; ErrImagePull
//! from the test registry answering 404; ImagePullBackOff from retrying
//! within the back-off; RegistryUnavailable from pulling from a closed
//! port (connection refused); ImageInspectError from ImageStatus of
//! `sha256:<p>` when two image ids start with `<p>` (containerd: "ambiguous
//! digest string").

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::{Container, ObjectReference, Pod, PodSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use swiftlet::{
    cri::{CriClient, ImageService, api},
    images::{
        ImageErrorReason, ImageGc, ImageGcError, ImageGcPolicy, ImageManager, ImageManagerConfig,
        collector::event as gc_event, manager::event,
    },
    signals::node::statfs,
};
use swiftlet_tests::{
    cgroup::TestCgroup,
    recorder::RecordedEvents,
    registry::{Registry, closed_port},
    sandbox::{BUSYBOX_IMAGE, ImageGuard, PAUSE_IMAGE, PodOptions, TestPod, client},
};

/// The CRI ImageService, counting calls (to prove none was made).
struct Counting {
    inner: Arc<CriClient>,
    calls: AtomicUsize,
}

#[async_trait::async_trait]
impl ImageService for Counting {
    async fn list_images(&self) -> swiftlet::cri::Result<Vec<api::Image>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.list_images().await
    }
    async fn image_status(&self, image: &str) -> swiftlet::cri::Result<Option<api::Image>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.image_status(image).await
    }
    async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        sb: Option<api::PodSandboxConfig>,
    ) -> swiftlet::cri::Result<String> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.pull_image(image, auth, sb).await
    }
    async fn remove_image(&self, image: &str) -> swiftlet::cri::Result<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.remove_image(image).await
    }
    async fn image_fs_info(&self) -> swiftlet::cri::Result<Vec<api::FilesystemUsage>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.image_fs_info().await
    }
}

fn pod_with(image: &str, policy: Option<&str>) -> (Pod, Container) {
    let c = Container {
        name: "app".into(),
        image: Some(image.into()),
        image_pull_policy: policy.map(str::to_owned),
        ..Default::default()
    };
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("images".into()),
            namespace: Some("swiftlet-test".into()),
            uid: Some(format!("images-{}", std::process::id())),
            ..Default::default()
        },
        spec: Some(PodSpec { containers: vec![c.clone()], ..Default::default() }),
        ..Default::default()
    };
    (pod, c)
}

/// Back-off shortened through the manager's config, as a test may.
fn config() -> ImageManagerConfig {
    ImageManagerConfig {
        registry_pull_qps: 0,
        backoff_initial: Duration::from_secs(1),
        backoff_max: Duration::from_secs(4),
        ..Default::default()
    }
}

struct Setup {
    cri: Arc<CriClient>,
    counting: Arc<Counting>,
    events: Arc<RecordedEvents>,
    images: ImageManager,
}

async fn setup() -> Setup {
    let cri = client().await;
    let counting = Arc::new(Counting { inner: cri.clone(), calls: AtomicUsize::new(0) });
    let events = Arc::new(RecordedEvents::default());
    let images = ImageManager::new(counting.clone(), events.clone(), config());
    Setup { cri, counting, events, images }
}

#[tokio::test]
async fn invalid_image_name_is_never_sent_to_the_runtime() {
    let s = setup().await;
    for name in ["Busybox", "busybox:", "swiftlet.local/busybox::1", "busy box"] {
        let (pod, c) = pod_with(name, None);
        let e = s.images.ensure_image(&pod, &c, None).await.unwrap_err();
        assert_eq!(e.reason, ImageErrorReason::InvalidImageName, "{name}: {e}");
        assert!(e.message.contains(&format!("couldn't parse image name {name:?}")), "{}", e.message);
    }
    assert_eq!(s.counting.calls.load(Ordering::SeqCst), 0, "no CRI call for an invalid name");
    let ev = s.events.all();
    assert_eq!(ev.len(), 4);
    assert!(ev.iter().all(|e| e.reason == event::INSPECT_FAILED));
    assert_eq!(ev[0].object.field_path.as_deref(), Some("spec.containers{app}"));
}

#[tokio::test]
async fn pull_policy_never_uses_only_present_images() {
    let s = setup().await;
    let (pod, c) = pod_with(BUSYBOX_IMAGE, Some("Never"));
    let r = s.images.ensure_image(&pod, &c, None).await.unwrap();
    let status = s.cri.image_status(BUSYBOX_IMAGE).await.unwrap().expect("busybox is imported by xtask");
    assert_eq!(r.as_str(), status.id);
    assert_eq!(s.events.reasons(), [event::PULLED]);
    assert!(s.events.all()[0].message.contains("already present on machine"));

    let absent = format!("127.0.0.1:{}/absent:1", closed_port());
    let (pod, c) = pod_with(&absent, Some("Never"));
    let e = s.images.ensure_image(&pod, &c, None).await.unwrap_err();
    assert_eq!(e.reason, ImageErrorReason::ErrImageNeverPull);
    assert_eq!(e.message, format!("Container image {absent:?} is not present with pull policy of Never"));
    assert_eq!(s.events.reasons().last().map(String::as_str), Some(event::ERR_IMAGE_NEVER_PULL));
}

#[tokio::test]
async fn pulls_then_err_image_pull_then_back_off() {
    let s = setup().await;
    let registry = Registry::start();
    let img = registry.add_image("swiftlet-test/app", "1", "");
    let _cleanup = ImageGuard(vec![img.id.clone()]);

    // A real pull, reported as the kubelet does.
    let (pod, c) = pod_with(&img.reference, None);
    let r = s.images.ensure_image(&pod, &c, None).await.unwrap();
    assert_eq!(r.as_str(), img.id);
    assert_eq!(s.events.reasons(), [event::PULLING, event::PULLED]);
    let pulled = &s.events.all()[1].message;
    assert!(pulled.starts_with(&format!("Successfully pulled image {:?} in ", img.reference)), "{pulled}");
    let present = s.cri.image_status(&img.reference).await.unwrap().expect("pulled");
    assert!(pulled.ends_with(&format!("Image size: {} bytes.", present.size)), "{pulled}");
    // IfNotPresent (defaulted from the tag): no second pull.
    let before = registry.requests().len();
    s.images.ensure_image(&pod, &c, None).await.unwrap();
    assert_eq!(registry.requests().len(), before);

    // A registry that answers, without the image: ErrImagePull, then the
    // back-off holds further pulls without asking the registry.
    s.events.clear();
    let missing = format!("{}/swiftlet-test/missing:1", registry.host());
    let (pod, c) = pod_with(&missing, None);
    let e = s.images.ensure_image(&pod, &c, None).await.unwrap_err();
    assert_eq!(e.reason, ImageErrorReason::ErrImagePull, "{e}");
    assert!(e.message.contains("not found"), "{}", e.message);
    assert_eq!(s.events.reasons(), [event::PULLING, event::FAILED]);
    let asked = registry.requests().len();
    let e = s.images.ensure_image(&pod, &c, None).await.unwrap_err();
    assert_eq!(e.reason, ImageErrorReason::ImagePullBackOff);
    assert!(e.message.starts_with(&format!("Back-off pulling image {missing:?}: ErrImagePull: ")), "{}", e.message);
    assert_eq!(registry.requests().len(), asked, "no pull during the back-off");
    assert_eq!(s.events.reasons().last().map(String::as_str), Some(event::BACK_OFF));
    // After the (shortened) back-off the pull is tried again, and the
    // back-off doubles.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let e = s.images.ensure_image(&pod, &c, None).await.unwrap_err();
    assert_eq!(e.reason, ImageErrorReason::ErrImagePull);
    assert!(registry.requests().len() > asked);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let e = s.images.ensure_image(&pod, &c, None).await.unwrap_err();
    assert_eq!(e.reason, ImageErrorReason::ImagePullBackOff, "2 s after the second failure");
}

#[tokio::test]
async fn registry_unavailable_when_nothing_listens() {
    let s = setup().await;
    let image = format!("127.0.0.1:{}/swiftlet-test/app:1", closed_port());
    let (pod, c) = pod_with(&image, None);
    let e = s.images.ensure_image(&pod, &c, None).await.unwrap_err();
    assert_eq!(e.reason, ImageErrorReason::RegistryUnavailable, "{e}");
    assert!(e.message.starts_with(&format!("image pull failed for {image} because the registry is unavailable: ")));
    assert!(e.message.contains("connection refused"), "{}", e.message);
    assert_eq!(s.events.reasons(), [event::PULLING, event::FAILED]);
    // It backs off like any failed pull.
    let e = s.images.ensure_image(&pod, &c, None).await.unwrap_err();
    assert_eq!(e.reason, ImageErrorReason::ImagePullBackOff);
    assert!(e.message.contains("RegistryUnavailable: image pull failed"), "{}", e.message);
}

#[tokio::test]
async fn image_inspect_error_when_image_status_fails() {
    let s = setup().await;
    let registry = Registry::start();
    // Two images whose ids share a prefix: `sha256:<prefix>` is then an
    // ambiguous short id to containerd.
    let prefix = "ab";
    let a = registry.add_image("swiftlet-test/ambiguous-a", "1", prefix);
    let b = registry.add_image("swiftlet-test/ambiguous-b", "1", prefix);
    let _cleanup = ImageGuard(vec![a.id.clone(), b.id.clone()]);
    for i in [&a, &b] {
        s.cri.pull_image(&i.reference, None, None).await.unwrap_or_else(|e| panic!("pull {}: {e}", i.reference));
    }
    let image = format!("sha256:{prefix}");
    let (pod, c) = pod_with(&image, None);
    let e = s.images.ensure_image(&pod, &c, None).await.unwrap_err();
    assert_eq!(e.reason, ImageErrorReason::ImageInspectError, "{e}");
    assert!(e.message.starts_with(&format!("Failed to inspect image {image:?}: rpc error: code = Unknown desc = ")));
    assert!(e.message.contains("ambiguous digest string"), "{}", e.message);
    assert_eq!(s.events.reasons(), [event::INSPECT_FAILED]);
}

#[tokio::test]
async fn image_gc_removes_unused_images_but_not_those_in_use() {
    let cri = client().await;
    let registry = Registry::start();
    let old = registry.add_image("swiftlet-test/gc-old", "1", "");
    let young = registry.add_image("swiftlet-test/gc-young", "1", "");
    let _cleanup = ImageGuard(vec![old.id.clone(), young.id.clone()]);
    cri.pull_image(&old.reference, None, None).await.unwrap();

    // busybox in use by a running container, pause by its sandbox (pinned
    // by name: containerd 1.6 does not pin its sandbox image).
    let tc = TestCgroup::new();
    let logs = tempfile::tempdir().unwrap();
    let pod = TestPod::start(
        cri.clone(),
        PodOptions { name: "imagegc", logs_root: logs.path(), cgroup: &tc, foreign: false },
    )
    .await;
    pod.container("sleeper", 0, "sleep 3600", true).await;

    // The image filesystem as containerd reports it, measured here the
    // same way, so the thresholds put usage over the high one (with room
    // for other writers on this disk).
    let fs = cri.image_fs_info().await.unwrap();
    let mountpoint = fs[0].fs_id.as_ref().unwrap().mountpoint.clone();
    let st = statfs(std::path::Path::new(&mountpoint)).unwrap();
    let usage = 100 - (st.available_bytes * 100 / st.capacity_bytes) as u8;
    assert!(usage >= 1, "the image filesystem {mountpoint} is {usage}% used; this test needs at least 1%");
    let high = usage.saturating_sub(5).max(1);
    let policy = ImageGcPolicy {
        high_threshold_percent: high,
        low_threshold_percent: high - 1,
        min_age: Duration::from_secs(60),
        max_age: Duration::ZERO,
        pinned_images: vec![PAUSE_IMAGE.into()],
    };
    let events = Arc::new(RecordedEvents::default());
    let node = ObjectReference { kind: Some("Node".into()), name: Some("test-node".into()), ..Default::default() };
    let gc = ImageGc::new(cri.clone(), cri.clone(), policy, events.clone(), node);
    // The first detection dates what is present to the beginning of time;
    // an image pulled after it is younger than the minimum age.
    gc.detect().await.unwrap();
    cri.pull_image(&young.reference, None, None).await.unwrap();

    let e = gc.garbage_collect().await.unwrap_err();
    // Freeing 1% of a real disk needs more than a test image: the kubelet's
    // error and event, after removing what was eligible.
    let ImageGcError::NotEnough { wanted, freed } = e else { panic!("unexpected error: {e}") };
    assert!(wanted > 0);
    assert!(freed >= old.size, "freed {freed} bytes, the old image alone is {}", old.size);
    assert_eq!(events.reasons(), [gc_event::FREE_DISK_SPACE_FAILED]);
    assert!(cri.image_status(&old.reference).await.unwrap().is_none(), "the old unused image is removed");
    assert!(cri.image_status(&young.reference).await.unwrap().is_some(), "younger than imageMinimumGCAge");
    assert!(cri.image_status(BUSYBOX_IMAGE).await.unwrap().is_some(), "in use by a running container");
    assert!(cri.image_status(PAUSE_IMAGE).await.unwrap().is_some(), "the pinned sandbox image");
    drop(pod);
    drop(tc);
}
