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

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use k8s_openapi::{
    api::core::v1::{Container, Pod, PodStatus, Probe},
    jiff::Timestamp,
};
use tokio::{
    sync::{Notify, mpsc, watch},
    task::JoinHandle,
};
use tracing::{debug, info, warn};

use super::{
    backoff::{Backoff, BackoffPolicy},
    hosts,
    metrics::{CgroupOperation, SyncKind},
    observed::{self, ContainerRunState, ObservedPod},
    plan::{self, ProbeVerdict},
    probe::{self, ProbeType, Target, Tracker},
    pull::ImageEnsurer,
    spec::{self, ContainerStart, NodeSettings},
    status::{self, StatusInput, TerminalReason},
};
use crate::{
    cm::{
        hierarchy::{pod_cgroup_config, pod_hugetlb_limits},
        pod_cgroups::PodCgroups,
        qos::qos_class,
    },
    cri::{RuntimeService, api, error::reason},
    events::{EventRecorder, EventType, pod_ref},
    volumes::{VolumeManager, manager::FAILED_MOUNT},
};

/// The kubelet's minimum grace for a container stop after its preStop hook.
const MIN_GRACE: Duration = Duration::from_secs(2);
/// Retry period after a failed sync (the kubelet's workerBackOffPeriod).
const SYNC_RETRY: Duration = Duration::from_secs(10);
/// Volume set-up retries: 1 s doubling to 1 min.
const MOUNT_RETRY_FIRST: Duration = Duration::from_secs(1);
const MOUNT_RETRY_MAX: Duration = Duration::from_secs(60);
/// Log lines a FallbackToLogsOnError message takes at most.
const FALLBACK_LOG_LINES: usize = 80;
const MAX_MESSAGE_BYTES: usize = 4096;

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

#[derive(Default)]
struct ProbeResults {
    readiness: HashMap<String, bool>,
    not_started: HashMap<String, bool>,
    verdicts: HashMap<String, ProbeVerdict>,
}

pub struct Worker {
    deps: Arc<WorkerDeps>,
    sink: Arc<dyn WorkerSink>,
    pod: Pod,
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
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
        shutdown: watch::Receiver<bool>,
    ) -> WorkerHandle {
        let (tx, rx) = mpsc::unbounded_channel();
        let wake = Arc::new(Notify::new());
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let backoff = Backoff::new(deps.restart_backoff);
        let worker = Worker {
            deps,
            sink,
            pod,
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
        };
        let task = tokio::spawn(worker.run(rx, shutdown));
        WorkerHandle { tx, wake, task }
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>, mut shutdown: watch::Receiver<bool>) {
        let mut last_sync = Instant::now();
        if self.pod.metadata.deletion_timestamp.is_some() {
            self.lifecycle = Lifecycle::Terminating { grace: spec_grace(&self.pod), remove: false };
        }
        // What the next round is for (kubelet_pod_worker_duration_seconds).
        let mut kind = SyncKind::Create;
        loop {
            if *shutdown.borrow() {
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
                _ = shutdown.changed() => {}
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
                self.pod = *pod;
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
                    self.lifecycle = Lifecycle::Terminated;
                    // Nothing will run again: free the volumes (tmpfs, emptyDir).
                    if let Err(e) = self.deps.volumes.teardown(&self.uid).await {
                        warn!(pod = pod_name(&self.pod), "tearing down volumes: {e}");
                    }
                    self.finished = true;
                    self.refresh_status().await;
                    if self.pod.metadata.deletion_timestamp.is_some() {
                        self.sink.terminated(&self.pod);
                    }
                    if remove {
                        self.cleanup().await;
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

    fn pod_ip(&self, observed: &ObservedPod) -> Option<String> {
        if self.pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false) {
            return self.deps.settings.node_ip.clone();
        }
        observed.ready_sandbox().and_then(|s| s.ip.clone())
    }

    async fn sync(&mut self) -> crate::cri::Result<()> {
        // A pod whose containers finished for good (Succeeded, or Failed
        // under restartPolicy Never) is terminal, as the kubelet's pod
        // worker: garbage collection or disk reclaim may remove its dead
        // containers and sandbox, which must not read as "never ran" and
        // start it again. Its last status stands.
        if self.finished {
            return Ok(());
        }
        let rt = self.deps.runtime.clone();
        let mut observed = observed::observe(rt.as_ref(), &self.uid).await?;
        let verdicts = {
            let r = lock(&self.results);
            let mut v = r.verdicts.clone();
            // Containers still waiting for their startup probe (a sidecar
            // not started holds the next init container back).
            for (id, _) in r.not_started.iter().filter(|(_, waiting)| **waiting) {
                v.entry(id.clone()).or_insert(ProbeVerdict::NotStarted);
            }
            v
        };
        let actions = plan::compute(&self.pod, &observed, &verdicts);
        let acted = actions.kill_pod
            || actions.create_sandbox.is_some()
            || !actions.start.is_empty()
            || actions.next_init.is_some()
            || !actions.init_start.is_empty()
            || !actions.kill.is_empty();
        if actions.kill_pod {
            self.kill_pod(&observed, spec_grace(&self.pod)).await?;
            if actions.create_sandbox.is_none() && !observed.containers.is_empty() {
                // Nothing left to run and nothing to restart.
                self.finished = true;
            }
        }
        let mut sandbox_id = actions.sandbox_id.clone();
        let mut sandbox_ip = observed.ready_sandbox().and_then(|s| s.ip.clone());
        // Volumes before the sandbox and any container (the kubelet's
        // WaitForAttachAndMount); what is already running keeps running.
        let needs_volumes = actions.create_sandbox.is_some()
            || actions.next_init.is_some()
            || !actions.init_start.is_empty()
            || !actions.start.is_empty();
        let volumes_ready = if needs_volumes {
            self.mount_volumes().await
        } else {
            // Running containers (re-adopted after a restart, say): register
            // their volumes for updates; a failure here blocks nothing.
            if let Err(e) = self.deps.volumes.setup(&self.pod).await {
                debug!(pod = pod_name(&self.pod), "volumes of running containers: {e}");
            }
            true
        };
        if let Some(attempt) = actions.create_sandbox.filter(|_| volumes_ready) {
            match self.create_sandbox(attempt).await {
                Ok((id, ip)) => {
                    sandbox_id = Some(id);
                    sandbox_ip = ip;
                    self.finished = false;
                }
                Err(e) => {
                    self.next_wake = Some(Instant::now() + SYNC_RETRY);
                    self.report(&observed).await;
                    return Err(e);
                }
            }
        }
        for k in &actions.kill {
            let (c, init) = find_container(&self.pod, &k.name).map(|(c, i)| (c.clone(), i)).unzip();
            if let Some(probe) = k.probe {
                info!(pod = pod_name(&self.pod), container = k.name, "{probe} probe failed: restarting");
            }
            let grace = c
                .as_ref()
                .and_then(|c| match k.probe {
                    Some("Liveness") => c.liveness_probe.as_ref(),
                    Some("Startup") => c.startup_probe.as_ref(),
                    _ => None,
                })
                .and_then(|p| p.termination_grace_period_seconds)
                .map(|s| Duration::from_secs(s.max(0) as u64))
                .unwrap_or_else(|| spec_grace(&self.pod));
            if let (Some(c), Some(init)) = (&c, init) {
                self.deps.recorder.record(
                    &container_ref(&self.pod, c, init),
                    EventType::Normal,
                    reason::KILLING,
                    &k.message,
                );
            }
            self.stop_container(&k.id, c.as_ref(), grace, sandbox_ip.as_deref()).await;
            lock(&self.results).verdicts.remove(&k.id);
        }
        if let Some(sandbox_id) = sandbox_id.filter(|_| volumes_ready) {
            let sandbox_config = spec::sandbox_config(
                &self.pod,
                observed.sandboxes.first().map_or(0, |s| s.attempt),
                &self.deps.settings,
            );
            let pod_ip = if self.pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false) {
                self.deps.settings.node_ip.clone()
            } else {
                sandbox_ip.clone()
            };
            let mut names: Vec<String> =
                actions.next_init.iter().chain(&actions.init_start).chain(&actions.start).cloned().collect();
            names.extend(super::ephemeral::to_start(&self.pod, &observed));
            for name in names {
                self.start_container(&name, &sandbox_id, &sandbox_config, &observed, pod_ip.clone()).await;
            }
        }
        if acted || !super::ephemeral::to_start(&self.pod, &observed).is_empty() {
            observed = observed::observe(rt.as_ref(), &self.uid).await?;
        }
        self.reconcile_probes(&observed);
        self.report(&observed).await;
        Ok(())
    }

    /// Sets up the pod's volumes; on failure records FailedMount, shows
    /// ContainerCreating with the reason on the containers not running,
    /// and retries with a back-off. True when every volume is ready.
    async fn mount_volumes(&mut self) -> bool {
        match self.deps.volumes.setup(&self.pod).await {
            Ok(()) => {
                if self.mount_retry.take().is_some() {
                    self.waiting.retain(|_, (r, m)| !(r == reason::CONTAINER_CREATING && m.starts_with("MountVolume")));
                }
                true
            }
            Err(e) => {
                let message = e.to_string();
                warn!(pod = pod_name(&self.pod), "{message}");
                self.deps.recorder.record(&pod_ref(&self.pod), EventType::Warning, FAILED_MOUNT, &message);
                let names: Vec<String> = self
                    .pod
                    .spec
                    .iter()
                    .flat_map(|s| s.init_containers.iter().flatten().chain(s.containers.iter()))
                    .map(|c| c.name.clone())
                    .collect();
                for name in names {
                    self.waiting.insert(name, (reason::CONTAINER_CREATING.into(), message.clone()));
                }
                let delay = self.mount_retry.map_or(MOUNT_RETRY_FIRST, |d| (d * 2).min(MOUNT_RETRY_MAX));
                self.mount_retry = Some(delay);
                let at = Instant::now() + delay;
                self.next_wake = Some(self.next_wake.map_or(at, |w| w.min(at)));
                false
            }
        }
    }

    async fn create_sandbox(&mut self, attempt: u32) -> crate::cri::Result<(String, Option<String>)> {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let mut limits =
            pod_cgroup_config(&spec, self.deps.cpu_cfs_quota, self.deps.cpu_cfs_quota_period, self.deps.pod_pids_limit);
        limits.hugetlb = pod_hugetlb_limits(&spec, &self.deps.settings.features.hugepage_sizes);
        let qos = qos_class(&spec);
        let op = if self.deps.cgroups.fs().exists(&self.deps.cgroups.pod_cgroup(qos, &self.uid)) {
            CgroupOperation::Update
        } else {
            CgroupOperation::Create
        };
        let started = Instant::now();
        if let Err(e) = self.deps.cgroups.ensure_pod_cgroup(qos, &self.uid, &limits).await {
            warn!(pod = pod_name(&self.pod), "cannot set up the pod cgroup: {e}");
        }
        self.deps.metrics.observe_cgroup_operation(op, started.elapsed());
        let config = spec::sandbox_config(&self.pod, attempt, &self.deps.settings);
        let _ = std::fs::create_dir_all(&config.log_directory);
        if attempt > 0 {
            self.deps.recorder.record(
                &pod_ref(&self.pod),
                EventType::Normal,
                reason::SANDBOX_CHANGED,
                "Pod sandbox changed, it will be killed and re-created.",
            );
        }
        // The RuntimeClass's handler; a class that cannot be resolved fails
        // the sandbox as the runtime would fail an unknown handler.
        let handler = self.deps.runtime_classes.handler_for(&self.pod).await.map_err(|message| {
            crate::cri::CriError::Status { call: "RunPodSandbox", code: tonic::Code::NotFound, message }
        });
        let created = match handler {
            Ok(handler) => self.deps.runtime.run_pod_sandbox(config, &handler).await,
            Err(e) => Err(e),
        };
        let id = match created {
            Ok(id) => id,
            Err(e) => {
                let message = format!("Failed to create pod sandbox: {}", e.message());
                self.deps.recorder.record(
                    &pod_ref(&self.pod),
                    EventType::Warning,
                    reason::FAILED_CREATE_POD_SANDBOX,
                    &message,
                );
                // The containers wait on the sandbox, with the runtime's word.
                let names: Vec<String> = self
                    .pod
                    .spec
                    .iter()
                    .flat_map(|s| s.init_containers.iter().flatten().chain(s.containers.iter()))
                    .map(|c| c.name.clone())
                    .collect();
                for name in names {
                    self.waiting.insert(name, (reason::CONTAINER_CREATING.into(), message.clone()));
                }
                return Err(e);
            }
        };
        self.waiting
            .retain(|_, (r, m)| !(r == reason::CONTAINER_CREATING && m.starts_with("Failed to create pod sandbox")));
        let ip = self
            .deps
            .runtime
            .pod_sandbox_status(&id)
            .await
            .ok()
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .filter(|ip| !ip.is_empty());
        debug!(pod = pod_name(&self.pod), sandbox = id, attempt, "sandbox created");
        Ok((id, ip))
    }

    fn backoff_key(&self, c: &Container) -> String {
        format!("{}_{}", self.uid, c.name)
    }

    fn set_waiting(&mut self, c: &Container, init: bool, reason: &str, message: String, event: Option<(&str, &str)>) {
        if let Some((ev_reason, text)) = event {
            self.deps.recorder.record(&container_ref(&self.pod, c, init), EventType::Warning, ev_reason, text);
        }
        self.waiting.insert(c.name.clone(), (reason.to_owned(), message));
    }

    async fn start_container(
        &mut self,
        name: &str,
        sandbox_id: &str,
        sandbox_config: &api::PodSandboxConfig,
        observed: &ObservedPod,
        pod_ip: Option<String>,
    ) {
        let Some((c, init)) = find_container(&self.pod, name)
            .map(|(c, i)| (c.clone(), i))
            .or_else(|| super::ephemeral::find(&self.pod, name).map(|c| (c, false)))
        else {
            return;
        };
        let latest = observed.latest(name);
        // A container that exited, or that was created but never started
        // (a failed start), waits out the back-off before the next attempt.
        let failed = latest.and_then(|l| match l.state {
            ContainerRunState::Exited => Some(l.finished_at.max(l.created_at)),
            ContainerRunState::Created => Some(l.created_at),
            _ => None,
        });
        if let Some(failed_at) = failed {
            let key = self.backoff_key(&c);
            let failed_at = instant_of(failed_at);
            if let Some(wait) = self.backoff.remaining(&key, failed_at, Instant::now()) {
                let delay = self.backoff.delay(&key).unwrap_or_default();
                let message = format!(
                    "back-off {} restarting failed container={} pod={}",
                    humantime(delay),
                    c.name,
                    pod_name(&self.pod)
                );
                let event = format!("Back-off restarting failed container {} in pod {}", c.name, pod_name(&self.pod));
                self.set_waiting(&c, init, reason::CRASH_LOOP_BACK_OFF, message, Some((reason::BACK_OFF, &event)));
                self.next_wake = Some(self.next_wake.map_or(Instant::now() + wait, |w| w.min(Instant::now() + wait)));
                return;
            }
            self.backoff.next(&key, failed_at);
        }
        let restart_count = latest.map_or(0, |l| l.attempt + 1);
        let image = match self.deps.images.ensure(&self.pod, &c, sandbox_config).await {
            Ok(r) => r,
            Err(f) => {
                let reason = f.reason.clone();
                self.set_waiting(&c, init, &reason, f.message.clone(), None);
                // Image reasons come with their own back-off in the image
                // manager; look again soon.
                self.next_wake = Some(Instant::now() + Duration::from_secs(5));
                return;
            }
        };
        let pod_ips: Vec<String> = pod_ip.clone().into_iter().collect();
        let env_objects = self.deps.volumes.env_objects(&self.pod, &c).await;
        let mut start = ContainerStart {
            pod: &self.pod,
            container: &c,
            init,
            restart_count,
            image_ref: &image.image_ref,
            pod_ips: pod_ips.clone(),
            env_objects: &env_objects,
            mounts: &[],
            image_user: &image.user,
        };
        // The environment first: subPathExpr expands from it.
        let mounts = match spec::container_env(&start, &self.deps.settings) {
            Ok(env) => self.deps.volumes.container_mounts(&self.pod, &c, &env).await,
            Err(e) => Err(e.to_string()),
        };
        // Then the managed /etc/hosts, after the volumes as the kubelet.
        let mounts = mounts.and_then(|mut m| {
            if hosts::mounts_hosts_file(&c, &pod_ips) {
                m.push(self.write_hosts_file(&pod_ips)?);
            }
            Ok(m)
        });
        let config = match mounts {
            Ok(m) => {
                start.mounts = &m;
                spec::container_config(&start, &self.deps.settings).map_err(|e| e.to_string())
            }
            Err(e) => Err(e),
        };
        // Devices from the device plugins (Allocate, PreStartContainer).
        let config = match (config, &self.deps.devices) {
            (Ok(mut cfg), Some(devices)) => match devices.container_options(&self.pod, &c.name).await {
                Ok(Some(o)) => {
                    crate::deviceplugin::container::apply(&mut cfg, &o);
                    Ok(cfg)
                }
                Ok(None) => Ok(cfg),
                Err(e) => Err(e),
            },
            (config, _) => config,
        };
        // An ephemeral container's target process namespace.
        let config = config
            .and_then(|mut cfg| super::ephemeral::apply_target(&mut cfg, &self.pod, name, observed).map(|()| cfg));
        let config = match config {
            Ok(cfg) => cfg,
            Err(e) => {
                let text = format!("Error: {e}");
                self.set_waiting(&c, init, reason::CREATE_CONTAINER_CONFIG_ERROR, e, Some((reason::FAILED, &text)));
                self.next_wake = Some(Instant::now() + SYNC_RETRY);
                return;
            }
        };
        // The termination message file must exist before the runtime
        // bind-mounts it.
        let message_file = spec::termination_message_file(&self.deps.settings, &self.uid, &c.name, restart_count);
        if let Some(dir) = message_file.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if std::fs::write(&message_file, b"").is_ok() {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&message_file, std::fs::Permissions::from_mode(0o666));
        }
        let id = match self.deps.runtime.create_container(sandbox_id, config, sandbox_config.clone()).await {
            Ok(id) => id,
            Err(e) => {
                let text = format!("Error: {}", e.message());
                self.set_waiting(&c, init, reason::CREATE_CONTAINER_ERROR, e.message(), Some((reason::FAILED, &text)));
                self.next_wake = Some(Instant::now() + SYNC_RETRY);
                return;
            }
        };
        let cref = container_ref(&self.pod, &c, init);
        self.deps.recorder.record(&cref, EventType::Normal, reason::CREATED, &format!("Created container {}", c.name));
        if let Err(e) = self.deps.runtime.start_container(&id).await {
            let text = format!("Error: {}", e.message());
            self.set_waiting(&c, init, reason::RUN_CONTAINER_ERROR, e.message(), Some((reason::FAILED, &text)));
            self.next_wake = Some(Instant::now() + SYNC_RETRY);
            return;
        }
        self.deps.recorder.record(&cref, EventType::Normal, reason::STARTED, &format!("Started container {}", c.name));
        self.waiting.remove(&c.name);
        if c.startup_probe.is_some() {
            lock(&self.results).not_started.insert(id.clone(), true);
        }
        if let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            let ip = pod_ip.and_then(|ip| ip.parse::<IpAddr>().ok());
            let t = Target { container_id: &id, container: &c, pod_ip: ip };
            let outcome = probe::run_handler(self.deps.runtime.as_ref(), &t, hook, spec_grace(&self.pod)).await;
            if !outcome.ok() {
                let msg = match &outcome {
                    probe::Outcome::Failure(m) | probe::Outcome::Error(m) => m.clone(),
                    probe::Outcome::Success => String::new(),
                };
                let text = format!("PostStartHook failed: {msg}");
                self.deps.recorder.record(&cref, EventType::Warning, reason::FAILED_POST_START_HOOK, &text);
                self.stop_container(&id, Some(&c), spec_grace(&self.pod), None).await;
                self.waiting.insert(c.name.clone(), (reason::POST_START_HOOK_ERROR.into(), text));
            }
        }
    }

    /// Writes `<pod dir>/etc-hosts` (the kubelet's managed hosts file) and
    /// returns its mount.
    fn write_hosts_file(&self, pod_ips: &[String]) -> Result<api::Mount, String> {
        let node_hosts = std::fs::read_to_string(hosts::ETC_HOSTS).unwrap_or_default();
        let text = hosts::hosts_file(&self.pod, pod_ips, self.deps.settings.cluster_domain.as_deref(), &node_hosts);
        let path = self.deps.settings.pods_dir.join(&self.uid).join("etc-hosts");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        crate::host::write_atomic(&path, text.as_bytes(), 0o644)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok(api::Mount {
            container_path: hosts::ETC_HOSTS.into(),
            host_path: path.to_string_lossy().into_owned(),
            ..Default::default()
        })
    }

    /// preStop, then StopContainer with what remains of the grace period
    /// (whole seconds, as CRI takes it).
    async fn stop_container(&self, id: &str, c: Option<&Container>, grace: Duration, pod_ip: Option<&str>) {
        let started = Instant::now();
        let mut hook_ran = false;
        if let Some(c) = c
            && let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref())
            && !grace.is_zero()
        {
            let ip = pod_ip.or(self.deps.settings.node_ip.as_deref()).and_then(|ip| ip.parse().ok());
            let t = Target { container_id: id, container: c, pod_ip: ip };
            hook_ran = true;
            let outcome =
                tokio::time::timeout(grace, probe::run_handler(self.deps.runtime.as_ref(), &t, hook, grace)).await;
            if !matches!(outcome, Ok(probe::Outcome::Success)) {
                let why = match outcome {
                    Err(_) => "the preStop hook did not finish within the grace period".to_owned(),
                    Ok(probe::Outcome::Failure(m) | probe::Outcome::Error(m)) => m,
                    Ok(probe::Outcome::Success) => String::new(),
                };
                self.deps.recorder.record(
                    &container_ref(&self.pod, c, false),
                    EventType::Warning,
                    reason::FAILED_PRE_STOP_HOOK,
                    &format!("PreStopHook failed: {why}"),
                );
            }
        }
        let remaining = if grace.is_zero() {
            Duration::ZERO
        } else if hook_ran {
            let left = grace.saturating_sub(started.elapsed());
            Duration::from_secs(left.as_secs_f64().ceil() as u64).max(MIN_GRACE)
        } else {
            grace
        };
        if let Err(e) = self.deps.runtime.stop_container(id, remaining).await
            && !e.is_not_found()
        {
            warn!(pod = pod_name(&self.pod), container = id, "stopping container failed: {e}");
        }
    }

    /// Stops every running container (in parallel, each with its preStop
    /// hook; sidecars after the others, one by one in reverse order, with
    /// what is left of the grace period) and then every sandbox.
    async fn kill_pod(&self, observed: &ObservedPod, grace: Duration) -> crate::cri::Result<()> {
        let started = Instant::now();
        let running: Vec<&str> = observed.running().map(|c| c.name.as_str()).collect();
        let (first, sidecars) = super::sidecars::termination_order(&self.pod, &running);
        let in_group = |names: &[&str]| -> Vec<observed::ContainerState> {
            observed.running().filter(|c| names.contains(&c.name.as_str())).cloned().collect()
        };
        self.stop_containers(observed, &in_group(&first), grace).await;
        for name in sidecars {
            let left = grace.saturating_sub(started.elapsed()).max(MIN_GRACE.min(grace));
            self.stop_containers(observed, &in_group(&[name]), left).await;
        }
        for sb in observed.sandboxes.iter().filter(|s| s.ready) {
            if let Err(e) = self.deps.runtime.stop_pod_sandbox(&sb.id).await
                && !e.is_not_found()
            {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Stops `containers` in parallel, each with its preStop hook.
    async fn stop_containers(&self, observed: &ObservedPod, containers: &[observed::ContainerState], grace: Duration) {
        let ip = self.pod_ip(observed);
        let stops = containers.iter().map(|c| {
            let spec = find_container(&self.pod, &c.name).map(|(s, _)| s);
            if let Some((s, init)) = find_container(&self.pod, &c.name) {
                self.deps.recorder.record(
                    &container_ref(&self.pod, s, init),
                    EventType::Normal,
                    reason::KILLING,
                    &format!("Stopping container {}", c.name),
                );
            }
            // A container the spec no longer names keeps the grace it was
            // created with.
            let grace = if spec.is_some() {
                grace
            } else {
                c.grace_period_secs.map_or(grace, Duration::from_secs).min(grace.max(MIN_GRACE))
            };
            self.stop_container(&c.id, spec, grace, ip.as_deref())
        });
        futures::future::join_all(stops).await;
    }

    async fn terminate(&mut self, grace: Duration) -> crate::cri::Result<()> {
        for (_, t) in self.probes.drain() {
            t.abort();
        }
        let observed = observed::observe(self.deps.runtime.as_ref(), &self.uid).await?;
        self.kill_pod(&observed, grace).await
    }

    /// Removes what the pod left: sandboxes (and their containers), the
    /// pod cgroup, its directory and logs.
    async fn cleanup(&mut self) {
        if let Ok(observed) = observed::observe(self.deps.runtime.as_ref(), &self.uid).await {
            for sb in &observed.sandboxes {
                if let Err(e) = self.deps.runtime.remove_pod_sandbox(&sb.id).await
                    && !e.is_not_found()
                {
                    warn!(pod = pod_name(&self.pod), "removing sandbox {}: {e}", sb.id);
                }
            }
        }
        let spec = self.pod.spec.clone().unwrap_or_default();
        let started = Instant::now();
        if let Err(e) = self.deps.cgroups.remove_pod_cgroup(qos_class(&spec), &self.uid, Duration::from_secs(10)).await
        {
            debug!(pod = pod_name(&self.pod), "removing the pod cgroup: {e}");
        }
        self.deps.metrics.observe_cgroup_operation(CgroupOperation::Destroy, started.elapsed());
        // Unmounts the pod's volumes first; a directory with something
        // still mounted is left for the orphan sweep.
        if let Err(e) = self.deps.volumes.remove_pod_dir(&self.uid).await {
            warn!(pod = pod_name(&self.pod), "removing the pod directory: {e}");
        }
        let _ = std::fs::remove_dir_all(spec::pod_log_dir(&self.deps.settings, &spec::identity(&self.pod)));
    }

    async fn refresh_status(&mut self) {
        if let Ok(observed) = observed::observe(self.deps.runtime.as_ref(), &self.uid).await {
            self.report(&observed).await;
        }
    }

    /// The termination message of an exited container instance.
    fn read_message(&self, c: &observed::ContainerState) -> Option<String> {
        let path = spec::termination_message_file(&self.deps.settings, &self.uid, &c.name, c.attempt);
        let mut text = std::fs::read(&path)
            .ok()
            .map(|b| String::from_utf8_lossy(&b[..b.len().min(MAX_MESSAGE_BYTES)]).into_owned());
        let policy = find_container(&self.pod, &c.name).and_then(|(s, _)| s.termination_message_policy.clone());
        if text.as_deref().unwrap_or("").is_empty()
            && c.exit_code != 0
            && policy.as_deref() == Some("FallbackToLogsOnError")
        {
            let log = spec::pod_log_dir(&self.deps.settings, &spec::identity(&self.pod))
                .join(spec::container_log_path(&c.name, c.attempt));
            text = std::fs::read_to_string(log).ok().map(|s| tail_log_message(&s));
        }
        text.filter(|t| !t.is_empty())
    }

    async fn report(&mut self, observed: &ObservedPod) {
        for c in observed.containers.iter().filter(|c| c.state == ContainerRunState::Exited) {
            if !self.messages.contains_key(&c.id)
                && let Some(m) = self.read_message(c)
            {
                self.messages.insert(c.id.clone(), m);
            }
        }
        // Running containers no longer wait for anything.
        for c in observed.running() {
            if observed.latest(&c.name).map(|l| &l.id) == Some(&c.id) {
                self.waiting.remove(&c.name);
            }
        }
        let results = lock(&self.results);
        let host_ip = self.deps.settings.node_ip.clone();
        let input = StatusInput {
            pod: &self.pod,
            observed,
            waiting: &self.waiting,
            readiness: &results.readiness,
            not_started: &results.not_started,
            messages: &self.messages,
            previous: self.status.as_ref(),
            host_ip: host_ip.as_deref(),
            runtime_name: &self.deps.runtime_name,
            now: Timestamp::now(),
            terminal: self.finished || self.terminal.is_some(),
            terminal_reason: self.terminal.as_ref(),
        };
        let mut status = status::generate(&input);
        status.ephemeral_container_statuses = super::ephemeral::statuses(&input);
        drop(results);
        let running: Vec<(String, String)> = observed.running().map(|c| (c.name.clone(), c.id.clone())).collect();
        let active = self.lifecycle == Lifecycle::Running && !self.finished;
        self.sink.status(&self.pod, &status, &running, active);
        self.status = Some(status);
    }

    /// One probe task per probe of every running container; tasks of
    /// containers that stopped are ended.
    fn reconcile_probes(&mut self, observed: &ObservedPod) {
        let mut want: HashSet<(String, ProbeType)> = HashSet::new();
        let pod_ip = self.pod_ip(observed).and_then(|ip| ip.parse::<IpAddr>().ok());
        for c in observed.running() {
            let Some((spec, _)) = find_container(&self.pod, &c.name) else { continue };
            for (kind, p) in [
                (ProbeType::Startup, &spec.startup_probe),
                (ProbeType::Liveness, &spec.liveness_probe),
                (ProbeType::Readiness, &spec.readiness_probe),
            ] {
                let Some(p) = p else { continue };
                let key = (c.id.clone(), kind);
                want.insert(key.clone());
                if self.probes.contains_key(&key) {
                    continue;
                }
                if kind == ProbeType::Startup && !lock(&self.results).not_started.contains_key(&c.id) {
                    // Re-adopted after a restart: assume it started only if
                    // it has been running longer than the probe's budget.
                    let budget = p.initial_delay_seconds.unwrap_or(0) as u64
                        + p.period_seconds.unwrap_or(10) as u64 * p.failure_threshold.unwrap_or(3) as u64;
                    let running_for = instant_of(c.started_at).elapsed();
                    if running_for < Duration::from_secs(budget) {
                        lock(&self.results).not_started.insert(c.id.clone(), true);
                    } else {
                        continue;
                    }
                }
                let task = ProbeTask {
                    deps: self.deps.clone(),
                    pod: self.pod.clone(),
                    container: spec.clone(),
                    id: c.id.clone(),
                    kind,
                    probe: p.clone(),
                    pod_ip,
                    results: self.results.clone(),
                    wake: self.wake.clone(),
                };
                self.probes.insert(key, tokio::spawn(task.run()));
            }
        }
        self.probes.retain(|k, t| {
            let keep = want.contains(k);
            if !keep {
                t.abort();
            }
            keep
        });
        let live: HashSet<&String> = observed.running().map(|c| &c.id).collect();
        let mut r = lock(&self.results);
        r.readiness.retain(|id, _| live.contains(id));
        r.not_started.retain(|id, _| live.contains(id));
        r.verdicts.retain(|id, _| live.contains(id));
    }
}

/// The last lines of a CRI-format log, for FallbackToLogsOnError.
fn tail_log_message(log: &str) -> String {
    let lines: Vec<&str> = log
        .lines()
        .map(|l| {
            // <time> <stream> <P|F> <content>
            l.splitn(4, ' ').nth(3).unwrap_or("")
        })
        .collect();
    let start = lines.len().saturating_sub(FALLBACK_LOG_LINES);
    let mut text = lines[start..].join("\n");
    if text.len() > 2048 {
        let cut = text.len() - 2048;
        let cut = (cut..text.len()).find(|i| text.is_char_boundary(*i)).unwrap_or(text.len());
        text = text[cut..].to_owned();
    }
    text
}

fn humantime(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 && s.is_multiple_of(60) {
        format!("{}m0s", s / 60)
    } else if s >= 60 {
        format!("{}m{}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

struct ProbeTask {
    deps: Arc<WorkerDeps>,
    pod: Pod,
    container: Container,
    id: String,
    kind: ProbeType,
    probe: Probe,
    pod_ip: Option<IpAddr>,
    results: Arc<Mutex<ProbeResults>>,
    wake: Arc<Notify>,
}

impl ProbeTask {
    async fn run(self) {
        let initial = Duration::from_secs(self.probe.initial_delay_seconds.unwrap_or(0).max(0) as u64);
        let period = Duration::from_secs(self.probe.period_seconds.unwrap_or(10).max(1) as u64);
        tokio::time::sleep(initial).await;
        let mut tracker = Tracker::new(&self.probe);
        let target = Target { container_id: &self.id, container: &self.container, pod_ip: self.pod_ip };
        // Sidecars' events name them under spec.initContainers.
        let init = find_container(&self.pod, &self.container.name).is_some_and(|(_, init)| init);
        let cref = container_ref(&self.pod, &self.container, init);
        loop {
            let waiting_for_startup = self.kind != ProbeType::Startup
                && lock(&self.results).not_started.get(&self.id).copied().unwrap_or(false);
            if !waiting_for_startup {
                let outcome = probe::run(self.deps.runtime.as_ref(), &target, &self.probe).await;
                if let Some(f) = &self.deps.probe_results {
                    f(&self.pod, &self.container.name, self.kind, &outcome);
                }
                match &outcome {
                    probe::Outcome::Failure(m) => self.deps.recorder.record(
                        &cref,
                        EventType::Warning,
                        reason::UNHEALTHY,
                        &format!("{} probe failed: {m}", self.kind.as_str()),
                    ),
                    probe::Outcome::Error(m) => self.deps.recorder.record(
                        &cref,
                        EventType::Warning,
                        reason::UNHEALTHY,
                        &format!("{} probe errored: {m}", self.kind.as_str()),
                    ),
                    probe::Outcome::Success => {}
                }
                if let Some(v) = tracker.record(outcome.ok()) {
                    let mut r = lock(&self.results);
                    let stop = match (self.kind, v) {
                        (ProbeType::Readiness, v) => {
                            r.readiness.insert(self.id.clone(), v);
                            false
                        }
                        (ProbeType::Liveness, true) => false,
                        (ProbeType::Liveness, false) => {
                            r.verdicts.insert(self.id.clone(), ProbeVerdict::LivenessFailed);
                            true
                        }
                        (ProbeType::Startup, true) => {
                            r.not_started.remove(&self.id);
                            true
                        }
                        (ProbeType::Startup, false) => {
                            r.verdicts.insert(self.id.clone(), ProbeVerdict::StartupFailed);
                            true
                        }
                    };
                    drop(r);
                    self.wake.notify_one();
                    if stop {
                        return;
                    }
                }
            }
            tokio::time::sleep(period).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_takes_the_content_of_the_last_lines() {
        let log = (0..100)
            .map(|i| format!("2024-01-01T00:00:00.000000000Z stderr F line {i}"))
            .collect::<Vec<_>>()
            .join("\n");
        let t = tail_log_message(&log);
        assert!(t.starts_with("line 20\n"), "{t}");
        assert!(t.ends_with("line 99"));
    }

    #[test]
    fn durations_read_as_go_prints_them() {
        assert_eq!(humantime(Duration::from_secs(10)), "10s");
        assert_eq!(humantime(Duration::from_secs(80)), "1m20s");
        assert_eq!(humantime(Duration::from_secs(300)), "5m0s");
    }
}
