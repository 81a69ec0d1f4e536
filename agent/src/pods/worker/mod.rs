//! One worker per pod (the kubelet's pod worker + SyncPod): it reads what
//! the runtime holds for the pod, plans with [`plan::compute`], executes
//! the plan through CRI (sandbox, init containers in order, containers,
//! kills), runs the pod's probes, and reports the status it computes. It
//! wakes on spec updates, on runtime changes (the relister), on probe
//! results, when a back-off ends, and every syncFrequency.
//!
//! Termination (deletion, eviction, removal of a static pod) runs preStop
//! hooks and stops containers within the grace period, then the sandbox.
//! A stopping agent leaves pods running: a restarted agent re-adopts them
//! from the runtime's state (the labels carry the pod's identity and every
//! container's restart count), so nothing restarts.

mod containers;
mod probes;
mod report;
mod resize;
mod stop;
mod sync;

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use k8s_openapi::api::core::v1::{Container, Pod, PodStatus};
use parking_lot::Mutex;
use tokio::{
    sync::{Notify, mpsc},
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use self::probes::ProbeResults;

use super::{
    metrics::SyncKind,
    probe::{self, ProbeType},
    pull::ImageEnsurer,
    spec::NodeSettings,
    status::TerminalReason,
};
use crate::flowcontrol::{Backoff, BackoffPolicy};
use crate::{
    cm::pod_cgroups::PodCgroups,
    cri::RuntimeService,
    events::{EventRecorder, pod_ref},
    volumes::VolumeManager,
};

/// Retry period after a failed sync (the kubelet's workerBackOffPeriod).
const SYNC_RETRY: Duration = Duration::from_secs(10);
const TEARDOWN_RETRY_FIRST: Duration = Duration::from_secs(1);
const TEARDOWN_RETRY_MAX: Duration = Duration::from_secs(30);

/// Sees every probe result (for prober_probe_total): pod, container, type.
pub type ProbeObserver = Arc<dyn Fn(&Pod, &str, ProbeType, &probe::Outcome) + Send + Sync>;

/// What every worker shares.
pub struct WorkerDeps {
    pub runtime: Arc<dyn RuntimeService>,
    pub images: Arc<dyn ImageEnsurer>,
    pub cgroups: PodCgroups,
    pub settings: NodeSettings,
    pub recorder: Arc<dyn EventRecorder>,
    /// For container ids in status (`containerd://...`).
    pub runtime_name: String,
    pub cpu_cfs_quota: bool,
    pub cpu_cfs_quota_period: Duration,
    pub pod_pids_limit: i64,
    /// syncFrequency.
    pub resync: Duration,
    /// CrashLoopBackOff: 10 s doubling to 5 min, or to
    /// crashLoopBackOff.maxContainerRestartPeriod.
    pub restart_backoff: BackoffPolicy,
    pub probe_results: Option<ProbeObserver>,
    /// Pod volumes: set up before containers start, torn down after.
    pub volumes: Arc<VolumeManager>,
    /// Device plugin devices: reserved at admission, given to containers
    /// at creation (None: no device manager).
    pub devices: Option<Arc<dyn crate::deviceplugin::PodDeviceAllocator>>,
    /// runtimeClassName → the runtime handler for RunPodSandbox.
    pub runtime_classes: super::runtime_class::RuntimeClasses,
    /// Pod worker rounds and pod cgroup operations are timed here.
    pub metrics: super::metrics::PodMetrics,
    /// The resources each pod was admitted with (in-place resize).
    pub allocations: Arc<super::resize::Allocator>,
}

/// Where a worker reports to (the pod manager).
pub trait WorkerSink: Send + Sync {
    /// The pod's current status and its running containers (name, id).
    fn status(&self, pod: &Pod, status: &PodStatus, containers: &[(String, String)], active: bool);
    /// Every container of a pod being deleted has stopped for good.
    fn terminated(&self, pod: &Pod);
    /// The pod left every source and the worker cleaned up after it.
    fn removed(&self, pod: &Pod);
}

#[derive(Debug)]
pub enum Msg {
    /// A new version of the pod from its source.
    Update(Box<Pod>),
    /// The pod left every source: stop it and clean up.
    Remove,
    /// Evict: kill within `grace`, then stay Failed with `reason`.
    Evict { grace: Duration, reason: TerminalReason },
}

#[derive(Clone, Debug, PartialEq)]
enum Lifecycle {
    Running,
    Terminating {
        grace: Duration,
        remove: bool,
    },
    /// Stopped for good; waits for removal.
    Terminated,
}

/// The handle the manager keeps.
pub struct WorkerHandle {
    pub tx: mpsc::UnboundedSender<Msg>,
    pub wake: Arc<Notify>,
    pub task: JoinHandle<()>,
}

pub struct Worker {
    deps: Arc<WorkerDeps>,
    sink: Arc<dyn WorkerSink>,
    /// The pod as it runs: the source's, with the allocated resources.
    pod: Pod,
    /// The pod as its source has it (the resources a resize asks for).
    desired: Pod,
    /// The resources the pod was admitted with (None until its first round).
    allocation: Option<super::resize::checkpoint::PodAllocation>,
    resize: super::resize::status::ResizeState,
    /// What each container (by id) runs with, as last applied.
    actuated: HashMap<String, crate::cri::api::LinuxContainerResources>,
    /// What the pod cgroup was last set to.
    pod_limits: Option<crate::cm::hierarchy::CgroupLimits>,
    uid: String,
    lifecycle: Lifecycle,
    /// The pod will not run again (its containers finished for good).
    finished: bool,
    terminal: Option<TerminalReason>,
    waiting: HashMap<String, (String, String)>,
    backoff: Backoff,
    messages: HashMap<String, String>,
    status: Option<PodStatus>,
    results: Arc<Mutex<ProbeResults>>,
    probes: HashMap<(String, ProbeType), JoinHandle<()>>,
    wake: Arc<Notify>,
    next_wake: Option<Instant>,
    /// The delay before the next volume set-up attempt after a failure.
    mount_retry: Option<Duration>,
    /// The back-off of a volume teardown that failed (a CSI driver away).
    teardown_retry: Option<Duration>,
    /// The volumes of a finished pod are torn down.
    volumes_released: bool,
}

fn pod_name(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or(""),
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.uid.as_deref().unwrap_or("")
    )
}

fn spec_grace(pod: &Pod) -> Duration {
    let secs = pod
        .metadata
        .deletion_grace_period_seconds
        .or(pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
        .unwrap_or(30);
    Duration::from_secs(secs.max(0) as u64)
}

/// A wall-clock CRI timestamp (ns) as an Instant on the monotonic clock.
fn instant_of(ns: i64) -> Instant {
    let now_ns = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64);
    let ago = Duration::from_nanos(now_ns.saturating_sub(ns).max(0) as u64);
    Instant::now().checked_sub(ago).unwrap_or_else(Instant::now)
}

/// A spec update makes the next round an update (unless it stops the pod).
fn update_kind(m: &Msg, kind: SyncKind) -> SyncKind {
    match m {
        Msg::Update(_) if kind == SyncKind::Sync => SyncKind::Update,
        _ => kind,
    }
}

fn find_container<'a>(pod: &'a Pod, name: &str) -> Option<(&'a Container, bool)> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .map(|c| (c, false))
        .chain(spec.init_containers.iter().flatten().map(|c| (c, true)))
        .find(|(c, _)| c.name == name)
}

fn container_ref(pod: &Pod, c: &Container, init: bool) -> k8s_openapi::api::core::v1::ObjectReference {
    let mut r = pod_ref(pod);
    let list = if init {
        "initContainers"
    } else if super::ephemeral::find(pod, &c.name).is_some() {
        "ephemeralContainers"
    } else {
        "containers"
    };
    r.field_path = Some(format!("spec.{list}{{{}}}", c.name));
    r
}

impl Worker {
    pub fn spawn(
        deps: Arc<WorkerDeps>,
        sink: Arc<dyn WorkerSink>,
        pod: Pod,
        shutdown: CancellationToken,
    ) -> WorkerHandle {
        let (tx, rx) = mpsc::unbounded_channel();
        let wake = Arc::new(Notify::new());
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let backoff = Backoff::new(deps.restart_backoff);
        let worker = Worker {
            deps,
            sink,
            desired: pod.clone(),
            pod,
            allocation: None,
            resize: Default::default(),
            actuated: HashMap::new(),
            pod_limits: None,
            uid,
            lifecycle: Lifecycle::Running,
            finished: false,
            terminal: None,
            waiting: HashMap::new(),
            backoff,
            messages: HashMap::new(),
            status: None,
            results: Arc::new(Mutex::new(ProbeResults::default())),
            probes: HashMap::new(),
            wake: wake.clone(),
            next_wake: None,
            mount_retry: None,
            teardown_retry: None,
            volumes_released: false,
        };
        let task = tokio::spawn(worker.run(rx, shutdown));
        WorkerHandle { tx, wake, task }
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>, shutdown: CancellationToken) {
        let mut last_sync = Instant::now();
        if self.pod.metadata.deletion_timestamp.is_some() {
            self.lifecycle = Lifecycle::Terminating { grace: spec_grace(&self.pod), remove: false };
        }
        // What the next round is for (kubelet_pod_worker_duration_seconds).
        let mut kind = SyncKind::Create;
        loop {
            if shutdown.is_cancelled() {
                break;
            }
            if matches!(self.lifecycle, Lifecycle::Terminating { .. }) {
                kind = SyncKind::Kill;
            }
            let started = Instant::now();
            let done = self.step().await;
            if kind != SyncKind::Sync || self.lifecycle == Lifecycle::Running {
                self.deps.metrics.observe_sync(kind, started.elapsed());
            }
            kind = SyncKind::Sync;
            last_sync = if done { last_sync } else { Instant::now() };
            if done {
                break;
            }
            let resync_at = last_sync + self.deps.resync;
            let until = self.next_wake.map_or(resync_at, |w| w.min(resync_at));
            tokio::select! {
                m = rx.recv() => match m {
                    Some(m) => {
                        kind = update_kind(&m, kind);
                        self.handle(m);
                    }
                    None => break,
                },
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep_until(until.into()) => {}
                _ = shutdown.cancelled() => {}
            }
            while let Ok(m) = rx.try_recv() {
                kind = update_kind(&m, kind);
                self.handle(m);
            }
        }
        for (_, t) in self.probes.drain() {
            t.abort();
        }
    }

    fn handle(&mut self, m: Msg) {
        match m {
            Msg::Update(pod) => {
                let deleting = pod.metadata.deletion_timestamp.is_some();
                self.desired = *pod;
                self.pod = match &self.allocation {
                    Some(a) => super::resize::admission::with_allocation(&self.desired, a),
                    None => self.desired.clone(),
                };
                if deleting && self.lifecycle == Lifecycle::Running {
                    self.lifecycle = Lifecycle::Terminating { grace: spec_grace(&self.pod), remove: false };
                }
            }
            Msg::Remove => {
                self.lifecycle = match &self.lifecycle {
                    Lifecycle::Terminating { grace, .. } => Lifecycle::Terminating { grace: *grace, remove: true },
                    _ if self.lifecycle == Lifecycle::Terminated => {
                        Lifecycle::Terminating { grace: Duration::ZERO, remove: true }
                    }
                    _ => Lifecycle::Terminating { grace: spec_grace(&self.pod), remove: true },
                };
            }
            Msg::Evict { grace, reason } => {
                self.terminal = Some(reason);
                let remove = matches!(self.lifecycle, Lifecycle::Terminating { remove: true, .. });
                if self.lifecycle != Lifecycle::Terminated || remove {
                    self.lifecycle = Lifecycle::Terminating { grace, remove };
                }
            }
        }
    }

    /// One round; true when the worker is done.
    async fn step(&mut self) -> bool {
        self.next_wake = None;
        match self.lifecycle.clone() {
            Lifecycle::Running => {
                if let Err(e) = self.sync().await {
                    warn!(pod = pod_name(&self.pod), "sync failed, retrying in {SYNC_RETRY:?}: {e}");
                    self.next_wake = Some(Instant::now() + SYNC_RETRY);
                }
                false
            }
            Lifecycle::Terminating { grace, remove } => match self.terminate(grace).await {
                Ok(()) => {
                    // Nothing will run again: free the volumes (tmpfs,
                    // emptyDir, CSI volumes through their drivers). Until
                    // they are gone the pod stays terminating and is not
                    // removed from the API (the kubelet's
                    // podResourcesAreReclaimed): a volume still mounted
                    // here must not be attached elsewhere.
                    if let Err(e) = self.deps.volumes.teardown(&self.uid).await {
                        warn!(pod = pod_name(&self.pod), "tearing down volumes, retrying: {e}");
                        let delay =
                            self.teardown_retry.map_or(TEARDOWN_RETRY_FIRST, |d| (d * 2).min(TEARDOWN_RETRY_MAX));
                        self.teardown_retry = Some(delay);
                        self.next_wake = Some(Instant::now() + delay);
                        return false;
                    }
                    self.teardown_retry = None;
                    self.lifecycle = Lifecycle::Terminated;
                    self.finished = true;
                    self.deps.allocations.deactivate(&self.uid);
                    self.refresh_status().await;
                    if self.pod.metadata.deletion_timestamp.is_some() {
                        self.sink.terminated(&self.pod);
                    }
                    if remove {
                        self.cleanup().await;
                        self.deps.allocations.remove(&self.uid);
                        self.sink.removed(&self.pod);
                        return true;
                    }
                    false
                }
                Err(e) => {
                    warn!(pod = pod_name(&self.pod), "stopping the pod failed, retrying: {e}");
                    self.next_wake = Some(Instant::now() + Duration::from_secs(2));
                    false
                }
            },
            Lifecycle::Terminated => {
                self.refresh_status().await;
                false
            }
        }
    }
}
