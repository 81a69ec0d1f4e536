//! The pod manager and its workers against the in-memory runtime: what
//! reaches the runtime, the status and the events, for the failure paths a
//! real containerd rarely produces on demand.

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::core::v1::{Container, ObjectReference, Pod, PodSpec, PodStatus},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::{
    admission::Capacity,
    manager::PodManager,
    metrics::PodMetrics,
    source::{PodSink, PodSnapshot, PodView, SourceKind, StatusReporter},
    spec::NodeSettings,
    worker::WorkerDeps,
};
use crate::flowcontrol::BackoffPolicy;
use crate::{
    cgroups::{CgroupFs, Version},
    cm::{
        naming::{CgroupDriver, CgroupNaming},
        pod_cgroups::PodCgroups,
    },
    cri::{
        api,
        fake::{Behavior, FakeRuntime, Fault, Method},
        labels,
    },
    events::{EventRecorder, EventType},
    eviction::driver::{EvictionRequest, KillPath, PodEvictor, PodProvider},
    images::{ImageManager, ImageManagerConfig},
    volumes::{NoApiServer, VolumeConfig, VolumeManager},
};

const IMAGE: &str = "swiftlet.local/busybox:1.35";

#[derive(Default)]
struct Recorder(Mutex<Vec<(String, String)>>);

impl EventRecorder for Recorder {
    fn record(&self, _: &ObjectReference, _: EventType, reason: &str, message: &str) {
        self.0.lock().push((reason.into(), message.into()));
    }
}

#[derive(Default)]
struct Reporter {
    terminated: Mutex<Vec<String>>,
}

impl StatusReporter for Reporter {
    fn report(&self, _: &Pod, _: &PodStatus) {}

    fn terminated(&self, pod: &Pod) {
        self.terminated.lock().push(pod.metadata.name.clone().unwrap_or_default());
    }
}

struct Harness {
    rt: Arc<FakeRuntime>,
    manager: PodManager,
    events: Arc<Recorder>,
    reporter: Arc<Reporter>,
    /// Stands in for the cgroup tree (and holds the pods' directories).
    dir: tempfile::TempDir,
    _stop: CancellationToken,
}

fn harness(pods_capacity: i64) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    rt.add_image(IMAGE, 1 << 20);
    let events = Arc::new(Recorder::default());
    let naming = CgroupNaming::new(CgroupDriver::Cgroupfs, "/");
    // A directory tree stands in for cgroupfs: the workers only write to it.
    let cgroups = PodCgroups::new(CgroupFs::with_layout(dir.path(), Version::V2), naming.clone());
    let deps = Arc::new(WorkerDeps {
        runtime: rt.clone(),
        images: Arc::new(ImageManager::new(rt.clone(), events.clone(), ImageManagerConfig::default())),
        cgroups,
        settings: NodeSettings {
            node_name: "n".into(),
            node_ip: Some("10.0.0.1".into()),
            pod_logs_dir: dir.path().join("logs"),
            pods_dir: dir.path().join("pods"),
            memory_capacity: 8 << 30,
            cpu_cfs_quota: true,
            cpu_cfs_quota_period: Duration::from_millis(100),
            naming,
            host_dns: Default::default(),
            cluster_dns: vec![],
            cluster_domain: None,
            allocatable_cpu_milli: 4000,
            allocatable_memory: 8 << 30,
            allocatable_ephemeral_storage: 10 << 30,
            features: Default::default(),
        },
        recorder: events.clone(),
        runtime_name: "containerd".into(),
        cpu_cfs_quota: true,
        cpu_cfs_quota_period: Duration::from_millis(100),
        pod_pids_limit: -1,
        resync: Duration::from_secs(60),
        restart_backoff: BackoffPolicy { initial: Duration::from_millis(200), max: Duration::from_millis(200) },
        probe_results: None,
        volumes: Arc::new(VolumeManager::new(
            VolumeConfig {
                pods_dir: dir.path().join("pods"),
                allocatable_memory: 8 << 30,
                downward: Default::default(),
                refresh_period: Duration::from_secs(60),
                sweep_period: Duration::from_secs(60),
                node_name: "node-a".into(),
                node_labels: Default::default(),
                stats_period: Duration::from_secs(60),
            },
            Arc::new(NoApiServer),
            events.clone(),
        )),
        devices: None,
        runtime_classes: Default::default(),
        metrics: PodMetrics::default(),
        allocations: Arc::new(crate::pods::resize::Allocator::in_memory()),
    });
    let stop = CancellationToken::new();
    let shutdown = stop.clone();
    let capacity = Capacity { pods: pods_capacity, cpu_milli: 4000, memory: 8 << 30, hugepages: vec![] };
    let manager = PodManager::new(deps, HashSet::from([SourceKind::Api]), capacity, PodMetrics::default(), shutdown);
    let reporter = Arc::new(Reporter::default());
    manager.set_reporter(reporter.clone());
    tokio::spawn(manager.clone().run(Duration::from_millis(100)));
    Harness { rt, manager, events, reporter, dir, _stop: stop }
}

fn pod(name: &str, containers: &[&str]) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(format!("uid-{name}"));
    p.spec = Some(PodSpec {
        host_network: Some(true),
        containers: containers
            .iter()
            .map(|c| Container { name: c.to_string(), image: Some(IMAGE.into()), ..Default::default() })
            .collect(),
        ..Default::default()
    });
    p
}

impl Harness {
    fn set(&self, pods: Vec<Pod>) {
        self.manager.set(PodSnapshot { source: SourceKind::Api, pods });
    }

    fn status(&self, name: &str) -> Option<PodStatus> {
        self.manager.pods().into_iter().find(|p| p.metadata.name.as_deref() == Some(name)).and_then(|p| p.status)
    }

    async fn wait(&self, name: &str, what: &str, check: impl Fn(&PodStatus) -> bool) -> PodStatus {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(s) = self.status(name)
                && check(&s)
            {
                return s;
            }
            if Instant::now() > deadline {
                let events = self.events.0.lock().clone();
                let s = self.status(name).map(|s| serde_json::to_string(&s).unwrap_or_default());
                panic!("{name}: {what} did not happen: {s:?}\nevents: {events:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn has_event(&self, reason: &str) -> bool {
        self.events.0.lock().iter().any(|(r, _)| r == reason)
    }
}

fn waiting(s: &PodStatus, c: usize) -> Option<(String, String)> {
    let w = s.container_statuses.as_ref()?.get(c)?.state.as_ref()?.waiting.as_ref()?;
    Some((w.reason.clone().unwrap_or_default(), w.message.clone().unwrap_or_default()))
}

fn running(s: &PodStatus, c: usize) -> bool {
    s.container_statuses
        .as_ref()
        .and_then(|l| l.get(c))
        .and_then(|c| c.state.as_ref())
        .is_some_and(|st| st.running.is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_failures_become_the_kubelets_reasons_and_recover() {
    let h = harness(10);
    h.rt.fail(Fault::new(Method::CreateContainer, tonic::Code::Unknown, "no space left on device").on("c").once());
    h.set(vec![pod("p", &["c"])]);
    // CreateContainer failed once: CreateContainerError, then the retry works.
    let s = h.wait("p", "running after the retry", |s| running(s, 0)).await;
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert!(h.events.0.lock().iter().any(|(r, m)| r == "Failed" && m.contains("no space left on device")));

    // As containerd fails a start: the container is left exited, code 128.
    h.rt.script("d", [Behavior::FailStart { message: "exec format error".into() }]);
    h.set(vec![pod("p", &["c"]), pod("q", &["d"])]);
    let s = h.wait("q", "RunContainerError", |s| waiting(s, 0).is_some_and(|(r, _)| r == "RunContainerError")).await;
    assert!(waiting(&s, 0).unwrap().1.contains("exec format error"));
    // As upstream: the failed instance is the last state, and a pod whose
    // containers will be restarted is Running.
    assert_eq!(s.phase.as_deref(), Some("Running"));
    let last = s.container_statuses.as_ref().unwrap()[0].last_state.clone().and_then(|l| l.terminated).unwrap();
    assert_eq!((last.exit_code, last.reason.as_deref()), (128, Some("StartError")));
    // Further attempts wait out the back-off instead of spinning.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let attempts = h.rt.count_on(Method::StartContainer, "d");
    assert!(attempts <= 3, "{attempts} starts in ~0.5 s with a 200 ms back-off");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_reasons_reach_the_status() {
    let h = harness(10);
    let mut p = pod("never", &["c"]);
    let c = &mut p.spec.as_mut().unwrap().containers[0];
    c.image = Some("swiftlet.local/absent:1".into());
    c.image_pull_policy = Some("Never".into());
    let mut bad = pod("bad", &["c"]);
    bad.spec.as_mut().unwrap().containers[0].image = Some("Not A Name".into());
    h.set(vec![p, bad]);
    let s =
        h.wait("never", "ErrImageNeverPull", |s| waiting(s, 0).is_some_and(|(r, _)| r == "ErrImageNeverPull")).await;
    assert_eq!(
        waiting(&s, 0).unwrap().1,
        "Container image \"swiftlet.local/absent:1\" is not present with pull policy of Never"
    );
    h.wait("bad", "InvalidImageName", |s| waiting(s, 0).is_some_and(|(r, _)| r == "InvalidImageName")).await;
    assert_eq!(h.rt.count(Method::PullImage), 0, "neither case may pull");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_rejects_over_the_pod_capacity() {
    let h = harness(1);
    h.set(vec![pod("first", &["c"])]);
    h.wait("first", "running", |s| running(s, 0)).await;
    h.set(vec![pod("first", &["c"]), pod("second", &["c"])]);
    let s = h.wait("second", "rejected", |s| s.phase.as_deref() == Some("Failed")).await;
    assert_eq!(s.reason.as_deref(), Some("OutOfpods"));
    assert_eq!(
        s.message.as_deref(),
        Some("Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 1, capacity: 1")
    );
    assert!(h.has_event("OutOfpods"));
    assert_eq!(h.rt.count_on(Method::RunPodSandbox, "second"), 0, "a rejected pod never reaches the runtime");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_stops_the_pod_and_marks_it_evicted() {
    let h = harness(10);
    h.set(vec![pod("victim", &["c"])]);
    h.wait("victim", "running", |s| running(s, 0)).await;
    let listed = h.manager.eviction_pods();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].cgroup, "kubepods/besteffort/poduid-victim");
    assert!(
        listed[0].containers[0].cgroup.as_deref().is_some_and(|c| c.starts_with("kubepods/besteffort/poduid-victim/"))
    );
    h.manager.evict(EvictionRequest {
        uid: "uid-victim".into(),
        namespace: "default".into(),
        name: "victim".into(),
        signal: crate::eviction::signal::EvictionSignal::MemoryAvailable,
        grace_period_secs: 0,
        message: "The node was low on resource: memory.".into(),
        annotations: Default::default(),
        killed: KillPath::Agent,
    });
    let s = h.wait("victim", "Evicted", |s| s.reason.as_deref() == Some("Evicted")).await;
    assert_eq!(s.phase.as_deref(), Some("Failed"));
    assert!(s.conditions.as_ref().unwrap().iter().any(|c| c.type_ == "DisruptionTarget" && c.status == "True"));
    assert!(h.manager.eviction_pods().is_empty(), "an evicted pod is no longer a candidate");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(h.rt.count(Method::StartContainer), 1, "never restarted");
    assert!(h.has_event("Evicted"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_honours_the_grace_period_then_reports_terminated() {
    let h = harness(10);
    h.rt.script("c", [Behavior::Run { stop_exit_code: 0 }]);
    h.set(vec![pod("gone", &["c"])]);
    h.wait("gone", "running", |s| running(s, 0)).await;
    let mut deleting = pod("gone", &["c"]);
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    deleting.metadata.deletion_grace_period_seconds = Some(7);
    h.set(vec![deleting]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.reporter.terminated.lock().is_empty() {
        assert!(Instant::now() < deadline, "terminated was not reported");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ids = h.rt.container_ids();
    assert_eq!(h.rt.stop_timeouts(&ids[0]), vec![Duration::from_secs(7)], "stopped with the deletion's grace period");
    assert!(h.has_event("Killing"));
    // The API server then deletes it: the worker cleans up.
    h.set(vec![]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !h.rt.sandbox_ids().is_empty() {
        assert!(Instant::now() < deadline, "the sandbox was not removed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_stopped_once_every_source_has_spoken() {
    let h = harness(10);
    // A sandbox of ours for a pod nobody wants any more (deleted while the
    // agent was down).
    let mut config = super::spec::sandbox_config(
        &pod("ghost", &["c"]),
        0,
        &NodeSettings {
            node_name: "n".into(),
            node_ip: None,
            pod_logs_dir: "/tmp/logs".into(),
            pods_dir: "/tmp/pods".into(),
            memory_capacity: 1 << 30,
            cpu_cfs_quota: true,
            cpu_cfs_quota_period: Duration::from_millis(100),
            naming: CgroupNaming::new(CgroupDriver::Cgroupfs, "/"),
            host_dns: api::DnsConfig::default(),
            cluster_dns: vec![],
            cluster_domain: None,
            allocatable_cpu_milli: 0,
            allocatable_memory: 0,
            allocatable_ephemeral_storage: 0,
            features: Default::default(),
        },
    );
    config.labels.insert(labels::MANAGED_BY.into(), "true".into());
    use crate::cri::RuntimeService;
    let ghost = h.rt.run_pod_sandbox(config, "").await.unwrap();
    // A sandbox that is not ours is never touched.
    let foreign = api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: "x".into(),
            uid: "x".into(),
            namespace: "x".into(),
            attempt: 0,
        }),
        ..Default::default()
    };
    let foreign = h.rt.run_pod_sandbox(foreign, "").await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(h.rt.sandbox_ids().contains(&ghost), "nothing is removed before the sources have spoken");
    h.set(vec![]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.rt.sandbox_ids().contains(&ghost) {
        assert!(Instant::now() < deadline, "the orphan was not removed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(h.rt.sandbox_ids().contains(&foreign));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sandbox_runs_without_its_pod_cgroup_and_the_pod_recovers() {
    let h = harness(10);
    // A file where the BestEffort pod's cgroup goes: it cannot be created.
    let besteffort = h.dir.path().join("kubepods/besteffort");
    std::fs::create_dir_all(&besteffort).unwrap();
    let blocker = besteffort.join("poduid-p");
    std::fs::write(&blocker, "").unwrap();
    h.set(vec![pod("p", &["c"])]);
    let s = h
        .wait("p", "ContainerCreating for its cgroup", |s| {
            waiting(s, 0)
                .is_some_and(|(r, m)| r == "ContainerCreating" && m.starts_with("unable to ensure pod container"))
        })
        .await;
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    assert!(h.has_event("FailedCreatePodContainer"), "{:?}", h.events.0.lock());
    assert_eq!(h.rt.count(Method::RunPodSandbox), 0, "a sandbox started without its pod cgroup");
    // The cause goes: the next attempt (after the worker's back-off) runs it.
    std::fs::remove_file(&blocker).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !h.status("p").is_some_and(|s| running(&s, 0)) {
        assert!(Instant::now() < deadline, "the pod did not recover: {:?}", h.status("p"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(h.dir.path().join("kubepods/besteffort/poduid-p").is_dir());
    assert_eq!(h.rt.count(Method::RunPodSandbox), 1);
}
