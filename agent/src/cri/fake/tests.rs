//! The fake runtime itself: scripted exits on the tokio clock, faults,
//! images and pulls, sandboxes and containers, latency and concurrency.

use super::*;
use crate::cri::{ImageService, RuntimeService};

fn sandbox_config(name: &str, uid: &str) -> api::PodSandboxConfig {
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.into(),
            uid: uid.into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        labels: crate::cri::labels::sandbox_labels(
            &crate::cri::labels::PodIdentity { uid: uid.into(), namespace: "default".into(), name: name.into() },
            &Default::default(),
        ),
        ..Default::default()
    }
}

fn container_config(name: &str, image: &str) -> api::ContainerConfig {
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata { name: name.into(), attempt: 0 }),
        image: Some(api::ImageSpec { image: image.into(), ..Default::default() }),
        ..Default::default()
    }
}

#[tokio::test(start_paused = true)]
async fn scripted_exits_follow_the_tokio_clock() {
    let rt = FakeRuntime::new();
    rt.add_image("busybox:1.36", 100);
    rt.script("app", [Behavior::Exit { code: 3, after: Duration::from_secs(5) }, Behavior::run()]);
    rt.script("hog", [Behavior::OomKill { after: Duration::from_secs(1) }]);
    let sb = rt.run_pod_sandbox(sandbox_config("p", "u1"), "").await.unwrap();
    let cfg = sandbox_config("p", "u1");
    let app = rt.create_container(&sb, container_config("app", "busybox:1.36"), cfg.clone()).await.unwrap();
    let hog =
        rt.create_container(&sb, container_config("hog", "docker.io/library/busybox:1.36"), cfg.clone()).await.unwrap();
    rt.start_container(&app).await.unwrap();
    rt.start_container(&hog).await.unwrap();
    let st = rt.container_status(&app).await.unwrap();
    assert_eq!(st.state, api::ContainerState::ContainerRunning as i32);
    tokio::time::advance(Duration::from_secs(2)).await;
    let hs = rt.container_status(&hog).await.unwrap();
    assert_eq!(
        (hs.state, hs.exit_code, hs.reason.as_str()),
        (api::ContainerState::ContainerExited as i32, 137, "OOMKilled")
    );
    assert_eq!(rt.container_status(&app).await.unwrap().state, api::ContainerState::ContainerRunning as i32);
    tokio::time::advance(Duration::from_secs(4)).await;
    let st = rt.container_status(&app).await.unwrap();
    assert_eq!((st.exit_code, st.reason.as_str()), (3, "Error"));
    assert_eq!(st.finished_at - st.started_at, 5_000_000_000);
    // The second container named "app" takes the next behaviour: it runs.
    let app2 = rt.create_container(&sb, container_config("app", "busybox:1.36"), cfg).await.unwrap();
    rt.start_container(&app2).await.unwrap();
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert_eq!(rt.container_status(&app2).await.unwrap().state, api::ContainerState::ContainerRunning as i32);
    rt.stop_container(&app2, Duration::from_secs(30)).await.unwrap();
    let st = rt.container_status(&app2).await.unwrap();
    assert_eq!((st.exit_code, st.reason.as_str()), (137, "Error"));
    assert_eq!(rt.stop_timeouts(&app2), vec![Duration::from_secs(30)]);
}

#[tokio::test]
async fn faults_fire_as_scripted_and_calls_are_logged() {
    let rt = FakeRuntime::new();
    rt.add_image("busybox", 1);
    rt.fail(Fault::new(Method::StartContainer, tonic::Code::Unavailable, "restarting").on("app").once());
    rt.fail(Fault::new(Method::ImageStatus, tonic::Code::Internal, "broken").on("docker.io/library/busybox:latest"));
    let sb = rt.run_pod_sandbox(sandbox_config("p", "u1"), "").await.unwrap();
    let c = rt.create_container(&sb, container_config("app", "busybox"), sandbox_config("p", "u1")).await.unwrap();
    let e = rt.start_container(&c).await.unwrap_err();
    assert_eq!(e.code(), Some(tonic::Code::Unavailable));
    rt.start_container(&c).await.unwrap();
    // Matched through normalization, and every time.
    for _ in 0..2 {
        assert_eq!(rt.image_status("busybox").await.unwrap_err().code(), Some(tonic::Code::Internal));
    }
    assert_eq!(rt.count(Method::StartContainer), 2);
    assert_eq!(rt.count_on(Method::CreateContainer, "app"), 1);
    assert_eq!(rt.calls()[0], Call { method: Method::RunPodSandbox, target: "p".into() });
}

#[tokio::test]
async fn images_pulls_and_lookups() {
    let rt = FakeRuntime::new();
    rt.make_pullable("nginx:1.27", 10);
    rt.set_pull_error("quay.io/x/y:1", tonic::Code::Unknown, "RegistryUnavailable: down");
    assert_eq!(rt.image_status("nginx:1.27").await.unwrap(), None);
    let id = rt.pull_image("nginx:1.27", None, None).await.unwrap();
    let img = rt.image_status("docker.io/library/nginx:1.27").await.unwrap().unwrap();
    assert_eq!(img.id, id);
    assert_eq!(rt.image_status(&id).await.unwrap().unwrap().id, id);
    assert_eq!(rt.image_status(&id[..12]).await.unwrap().unwrap().id, id);
    assert!(rt.pull_image("quay.io/x/y:1", None, None).await.unwrap_err().message().starts_with("RegistryUnavailable"));
    let e = rt.pull_image("nope", None, None).await.unwrap_err();
    assert!(e.message().contains("docker.io/library/nope:latest"), "{e}");
    rt.remove_image(&id).await.unwrap();
    rt.remove_image(&id).await.unwrap();
    assert!(!rt.has_image("nginx:1.27"));
    // Two ids sharing a prefix make that prefix ambiguous.
    rt.add_image_with_id("a:1", &format!("sha256:ab{}", "0".repeat(62)), 1);
    rt.add_image_with_id("b:1", &format!("sha256:ab{}", "1".repeat(62)), 1);
    assert!(rt.image_status("sha256:ab").await.unwrap_err().message().contains("ambiguous"));
}

#[tokio::test]
async fn sandboxes_and_containers() {
    let rt = FakeRuntime::new();
    rt.add_image("busybox", 1);
    let sb = rt.run_pod_sandbox(sandbox_config("p", "u1"), "").await.unwrap();
    // No image: NotFound, as containerd.
    let e = rt.create_container(&sb, container_config("x", "nope"), sandbox_config("p", "u1")).await.unwrap_err();
    assert!(e.is_not_found(), "{e}");
    let c = rt.create_container(&sb, container_config("app", "busybox"), sandbox_config("p", "u1")).await.unwrap();
    rt.start_container(&c).await.unwrap();
    let running = api::ContainerFilter {
        state: Some(api::ContainerStateValue { state: api::ContainerState::ContainerRunning as i32 }),
        ..Default::default()
    };
    assert_eq!(rt.list_containers(Some(running.clone())).await.unwrap().len(), 1);
    assert!(rt.remove_pod_sandbox(&sb).await.is_err(), "a ready sandbox is not removed");
    rt.stop_pod_sandbox(&sb).await.unwrap();
    assert_eq!(rt.list_containers(Some(running)).await.unwrap().len(), 0);
    assert!(!crate::cri::sandbox_ready(rt.pod_sandbox_status(&sb).await.unwrap().state));
    rt.remove_pod_sandbox(&sb).await.unwrap();
    assert!(rt.list_containers(None).await.unwrap().is_empty());
    assert!(rt.pod_sandbox_status(&sb).await.unwrap_err().is_not_found());
}

#[tokio::test]
async fn start_failures_leave_a_start_error() {
    let rt = FakeRuntime::new();
    rt.add_image("busybox", 1);
    rt.script("bad", [Behavior::FailStart { message: "exec: \"nope\": not found".into() }]);
    let sb = rt.run_pod_sandbox(sandbox_config("p", "u1"), "").await.unwrap();
    let c = rt.create_container(&sb, container_config("bad", "busybox"), sandbox_config("p", "u1")).await.unwrap();
    assert!(rt.start_container(&c).await.is_err());
    let st = rt.container_status(&c).await.unwrap();
    assert_eq!((st.exit_code, st.reason.as_str()), (128, "StartError"));
}

#[tokio::test(start_paused = true)]
async fn latency_and_concurrency_are_measured() {
    let rt = Arc::new(FakeRuntime::new());
    rt.make_pullable("a", 1);
    rt.make_pullable("b", 1);
    rt.set_latency(Method::PullImage, Duration::from_secs(1));
    let (x, y) = tokio::join!(rt.pull_image("a", None, None), rt.pull_image("b", None, None));
    x.unwrap();
    y.unwrap();
    assert_eq!(rt.max_in_flight(Method::PullImage), 2);
}

#[tokio::test]
async fn container_stats_report_what_was_canned_and_only_for_running_containers() {
    let rt = FakeRuntime::new();
    rt.add_image("busybox:1.36", 100);
    let sb = rt.run_pod_sandbox(sandbox_config("p", "u1"), "").await.unwrap();
    let cfg = sandbox_config("p", "u1");
    let measured = rt.create_container(&sb, container_config("measured", "busybox:1.36"), cfg.clone()).await.unwrap();
    let bare = rt.create_container(&sb, container_config("bare", "busybox:1.36"), cfg.clone()).await.unwrap();
    let created = rt.create_container(&sb, container_config("created", "busybox:1.36"), cfg).await.unwrap();
    rt.start_container(&measured).await.unwrap();
    rt.start_container(&bare).await.unwrap();
    rt.set_writable_layer(&measured, 4096, 3);
    rt.set_stats(&measured, 7, 8);
    rt.set_writable_layer(&created, 1, 1);

    let stats = rt.list_container_stats(None).await.unwrap();
    let by_id = |id: &str| stats.iter().find(|s| s.attributes.as_ref().is_some_and(|a| a.id == id));
    assert_eq!(stats.len(), 2, "only running containers have stats: {stats:?}");
    assert!(by_id(&created).is_none());
    let m = by_id(&measured).unwrap();
    let layer = m.writable_layer.as_ref().expect("the canned writable layer");
    assert_eq!(layer.used_bytes.as_ref().map(|v| v.value), Some(4096));
    assert_eq!(layer.inodes_used.as_ref().map(|v| v.value), Some(3));
    // Canning the layer and then CPU and memory keeps both.
    assert_eq!(m.cpu.as_ref().and_then(|c| c.usage_core_nano_seconds.as_ref()).map(|v| v.value), Some(7));
    assert_eq!(m.memory.as_ref().and_then(|c| c.working_set_bytes.as_ref()).map(|v| v.value), Some(8));
    assert!(by_id(&bare).unwrap().writable_layer.is_none(), "no layer unless canned");
}
