//! The eviction manager's edge: it programs the hard thresholds into the
//! signal source, keeps a pre-ranked victim plan, kills on the source's
//! reader thread the moment a hard line is crossed (the fast path), and
//! runs the full evaluation (conditions, soft thresholds, disk reclaim,
//! further victims) on tokio, after every event and every housekeeping
//! period as a safety net.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    future::Future,
    path::PathBuf,
    pin::Pin,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::sync::{broadcast, mpsc, watch};
use tracing::{debug, info, warn};

use super::{
    core::{Action, Evaluation, EvictionConfig, Observations, State, message},
    observe::{FsFigures, KernelLine, NodeInfo, kernel_lines, observe},
    ranking::{self, Candidate, ContainerUsage, Usage},
    signal::{EvictionSignal, NodeCondition},
};
use crate::{
    cgroups::CgroupFs,
    metrics::{ConditionLabels, EvictionSignalLabels, KillPathLabels, Metrics, SignalLabels, ThresholdLabels},
    signals::{CgroupKind, Direction, EventSink, SignalEvent, SignalSource, Snapshot, monotonic_ns, node},
};

/// A container of a pod, for eviction messages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EvictionContainer {
    pub name: String,
    pub memory_request: u64,
    /// Its cgroup (relative path), to read its memory when a message
    /// needs it; None when unknown.
    pub cgroup: Option<String>,
}

/// A running pod as the pod manager describes it to eviction.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EvictionPod {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// The pod cgroup (relative path, as `CgroupFs` takes it).
    pub cgroup: String,
    pub priority: i32,
    /// Critical pods (priority at or above system-cluster-critical, and
    /// mirror pods) are never evicted.
    pub critical: bool,
    pub termination_grace_secs: u64,
    pub memory_request: u64,
    pub ephemeral_storage_request: u64,
    pub containers: Vec<EvictionContainer>,
    /// Bytes of ephemeral storage in use (writable layers, logs, emptyDir),
    /// when the pod manager measures it.
    pub disk_usage: Option<u64>,
    pub inodes_used: Option<u64>,
}

/// Lists the pods that may be evicted.
pub trait PodProvider: Send + Sync {
    fn eviction_pods(&self) -> Vec<EvictionPod>;
}

/// How the victim's processes were ended before the runtime was told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillPath {
    /// By the kernel program, at the crossing.
    Kernel,
    /// By the agent, through the cgroup (the userspace fast path).
    Agent,
    /// Not yet: a soft eviction stops the pod gracefully through the runtime.
    Graceful,
}

impl KillPath {
    pub fn as_str(self) -> &'static str {
        match self {
            KillPath::Kernel => "kernel",
            KillPath::Agent => "agent",
            KillPath::Graceful => "graceful",
        }
    }
}

/// A pod to finish evicting: stop its sandbox (its processes may be dead
/// already), set phase Failed / reason Evicted / message, emit the event,
/// and never restart it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictionRequest {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub signal: EvictionSignal,
    pub grace_period_secs: u64,
    pub message: String,
    pub annotations: std::collections::BTreeMap<String, String>,
    pub killed: KillPath,
}

pub trait PodEvictor: Send + Sync {
    fn evict(&self, request: EvictionRequest);
}

/// Reclaims node-level resources (dead containers, unused images) before
/// any pod is evicted for disk pressure.
pub trait NodeReclaimer: Send + Sync {
    fn reclaim<'a>(&'a self, signal: EvictionSignal) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>>;
}

/// A pod's local ephemeral storage on nodefs: writable layers, logs and
/// disk-backed volumes (the kubelet's fsStatsRoot + fsStatsLogs +
/// fsStatsLocalVolumeSource when the images share nodefs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodDiskUsage {
    pub bytes: u64,
    pub inodes: u64,
}

/// Measures the pods' disk usage for the disk-pressure ranking. Walking
/// volumes and logs is too costly for every housekeeping pass, so it runs
/// only when disk pressure survives node-level reclaim and pods must be
/// ranked; without a meter every pod counts as using nothing.
pub trait DiskUsageMeter: Send + Sync {
    fn measure<'a>(
        &'a self,
        uids: &'a [String],
    ) -> Pin<Box<dyn Future<Output = HashMap<String, PodDiskUsage>> + Send + 'a>>;
}

#[derive(Clone, Debug)]
pub struct DriverConfig {
    pub eviction: EvictionConfig,
    pub node: NodeInfo,
    /// The kubelet root dir: nodefs is its filesystem.
    pub nodefs_path: PathBuf,
    /// The runtime's image filesystem; None when it is nodefs.
    pub imagefs_path: Option<PathBuf>,
    /// The safety-net re-evaluation period (the kubelet's 10 s).
    pub housekeeping_interval: Duration,
    /// How often the victim plan and cgroup registrations are refreshed.
    pub plan_interval: Duration,
    /// Hand the top of the plan to the kernel, which kills at the crossing
    /// (`--kernel-eviction`); otherwise the agent's fast path kills.
    pub kernel_eviction: bool,
}

/// One planned victim: enough to kill it without asking anyone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedVictim {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub cgroup: String,
}

enum Wake {
    /// `value` is what crossed the line (used amount, in the signal's unit).
    Crossing {
        at_ns: u64,
        value: u64,
        signal: Option<EvictionSignal>,
        fast_kill: Option<PlannedVictim>,
    },
    /// The kernel killed a planned victim; the agent finishes the eviction.
    KernelKill {
        victim: PlannedVictim,
        signal: EvictionSignal,
        value: u64,
    },
    Other,
}

struct Inner {
    cfg: Mutex<DriverConfig>,
    source: Arc<dyn SignalSource>,
    cgroupfs: CgroupFs,
    pods: Arc<dyn PodProvider>,
    evictor: Arc<dyn PodEvictor>,
    reclaimer: Option<Arc<dyn NodeReclaimer>>,
    disk_meter: Mutex<Option<Arc<dyn DiskUsageMeter>>>,
    metrics: Arc<Metrics>,
    lines: Mutex<Vec<KernelLine>>,
    /// Ranked victims per hard signal, refreshed every plan interval.
    plan: Mutex<HashMap<EvictionSignal, Vec<PlannedVictim>>>,
    /// Pods being evicted, by uid, with when it started. They count as
    /// reclaimed (and stay registered) until their cgroup has no processes
    /// left, even after the pod manager has dropped them: their memory is
    /// freed only as their processes finish exiting.
    in_flight: Mutex<HashMap<String, (Instant, PlannedVictim)>>,
    registered: Mutex<HashSet<String>>,
    events: broadcast::Sender<SignalEvent>,
    wake: mpsc::UnboundedSender<Wake>,
    conditions: watch::Sender<BTreeSet<NodeCondition>>,
}

/// Handle to the running eviction manager.
#[derive(Clone)]
pub struct EvictionManager {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl EvictionManager {
    /// Builds the manager and subscribes it to the signal source. Call
    /// [`EvictionManager::run`] to start it.
    pub fn new(
        cfg: DriverConfig,
        source: Arc<dyn SignalSource>,
        cgroupfs: CgroupFs,
        pods: Arc<dyn PodProvider>,
        evictor: Arc<dyn PodEvictor>,
        reclaimer: Option<Arc<dyn NodeReclaimer>>,
        metrics: Arc<Metrics>,
    ) -> (EvictionManager, EvictionLoop) {
        let (wake, wake_rx) = mpsc::unbounded_channel();
        let (events, _) = broadcast::channel(1024);
        let (conditions, _) = watch::channel(BTreeSet::new());
        let inner = Arc::new(Inner {
            cfg: Mutex::new(cfg),
            source,
            cgroupfs,
            pods,
            evictor,
            reclaimer,
            disk_meter: Mutex::new(None),
            metrics,
            lines: Mutex::new(vec![]),
            plan: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(HashMap::new()),
            registered: Mutex::new(HashSet::new()),
            events,
            wake,
            conditions,
        });
        inner
            .metrics
            .signal_source
            .get_or_create(&crate::metrics::ModeLabels { mode: inner.source.mode().as_str().into() })
            .set(1);
        inner.metrics.set_signal_strategies(&inner.source.strategies());
        let sink: Arc<dyn EventSink> = Arc::new(Sink(Arc::downgrade(&inner)));
        inner.source.subscribe(sink);
        (EvictionManager { inner: inner.clone() }, EvictionLoop { inner, wake_rx })
    }

    /// Signal events as they arrive (for /debug/events and tests).
    pub fn events(&self) -> broadcast::Receiver<SignalEvent> {
        self.inner.events.subscribe()
    }

    /// The node pressure conditions currently reported.
    pub fn conditions(&self) -> watch::Receiver<BTreeSet<NodeCondition>> {
        self.inner.conditions.subscribe()
    }

    /// The current victim plan for a hard signal.
    pub fn plan(&self, signal: EvictionSignal) -> Vec<PlannedVictim> {
        lock(&self.inner.plan).get(&signal).cloned().unwrap_or_default()
    }

    /// Measures pods' disk usage when disk pressure needs a ranking.
    pub fn set_disk_meter(&self, meter: Arc<dyn DiskUsageMeter>) {
        *lock(&self.inner.disk_meter) = Some(meter);
    }

    /// Asks for an evaluation now (e.g. after pods changed).
    pub fn poke(&self) {
        let _ = self.inner.wake.send(Wake::Other);
    }

    /// Replaces the thresholds and periods (config reload); the kernel lines
    /// are reprogrammed at once.
    pub fn reconfigure(&self, eviction: EvictionConfig) {
        lock(&self.inner.cfg).eviction = eviction;
        self.inner.program_lines();
        self.poke();
    }
}

/// The manager's event loop, to spawn on tokio.
pub struct EvictionLoop {
    inner: Arc<Inner>,
    wake_rx: mpsc::UnboundedReceiver<Wake>,
}

impl EvictionLoop {
    /// Runs until `shutdown` becomes true.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let inner = self.inner.clone();
        inner.sync_registrations();
        inner.program_lines();
        let (housekeeping, plan_every) = {
            let c = lock(&inner.cfg);
            (c.housekeeping_interval, c.plan_interval)
        };
        let mut housekeeping = tokio::time::interval(housekeeping);
        let mut plan_tick = tokio::time::interval(plan_every);
        let mut state = State::default();
        let mut deadline: Option<Instant> = None;
        loop {
            let sleep_until = deadline.map(tokio::time::Instant::from_std);
            tokio::select! {
                w = self.wake_rx.recv() => {
                    let Some(w) = w else { break };
                    let crossing = match w {
                        Wake::Crossing { at_ns, value, signal, fast_kill } => {
                            if let Some(v) = fast_kill {
                                inner.finish_fast_kill(&v, signal, KillPath::Agent, value);
                            }
                            Some(at_ns)
                        }
                        Wake::KernelKill { victim, signal, value } => {
                            // Survivors (tasks the kernel could not signal
                            // from the event's context) go through the cgroup.
                            if let Err(e) = inner.cgroupfs.kill_all(&victim.cgroup) {
                                debug!(pod = victim.name, "killing survivors through the cgroup: {e}");
                            }
                            inner.source.kernel_kill_finished();
                            inner.finish_fast_kill(&victim, Some(signal), KillPath::Kernel, value);
                            None
                        }
                        Wake::Other => None,
                    };
                    deadline = inner.evaluate(&mut state, crossing).await;
                }
                _ = housekeeping.tick() => deadline = inner.evaluate(&mut state, None).await,
                _ = plan_tick.tick() => inner.refresh_plan(),
                _ = async { match sleep_until { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } } => {
                    deadline = inner.evaluate(&mut state, None).await;
                }
                _ = shutdown.changed() => if *shutdown.borrow() { break },
            }
        }
        debug!("eviction manager stopped");
    }
}

/// Receives signal events on the source's reader thread.
struct Sink(std::sync::Weak<Inner>);

impl EventSink for Sink {
    fn on_event(&self, event: SignalEvent) {
        let Some(inner) = self.0.upgrade() else { return };
        let _ = inner.events.send(event.clone());
        match event {
            SignalEvent::Crossing {
                target, signal, direction: Direction::Up, at_ns, kernel_generation, value, ..
            } => {
                let line = lock(&inner.lines).iter().find(|l| l.target == target && l.signal == signal).cloned();
                // When the kernel already killed at this crossing, the fast
                // path stands down: one victim per crossing.
                let fast_kill = match &line {
                    Some(l) if kernel_generation == 0 => {
                        // Process counts move fast (a fork bomb doubles in
                        // milliseconds), so a plan up to a plan interval old
                        // can name the wrong pod: rank again on the spot.
                        if l.eviction_signal == EvictionSignal::PidAvailable {
                            inner.refresh_plan();
                        }
                        inner.fast_kill(l.eviction_signal, at_ns)
                    }
                    _ => None,
                };
                let _ = inner.wake.send(Wake::Crossing {
                    at_ns,
                    value,
                    signal: line.map(|l| l.eviction_signal),
                    fast_kill,
                });
            }
            SignalEvent::KernelKill {
                target,
                cgroup: Some(cgroup),
                signal,
                crossing_ns,
                crossing_value,
                at_ns,
                ..
            } => {
                inner
                    .metrics
                    .crossing_to_kill
                    .get_or_create(&KillPathLabels { path: KillPath::Kernel.as_str().into() })
                    .observe(at_ns.saturating_sub(crossing_ns) as f64 / 1e9);
                let line_signal = lock(&inner.lines)
                    .iter()
                    .find(|l| l.target == target && l.signal == signal)
                    .map(|l| l.eviction_signal);
                let victim = lock(&inner.plan).values().flatten().find(|v| v.cgroup == cgroup).cloned();
                match (victim, line_signal) {
                    (Some(victim), Some(signal)) => {
                        lock(&inner.in_flight).insert(victim.uid.clone(), (Instant::now(), victim.clone()));
                        let _ = inner.wake.send(Wake::KernelKill { victim, signal, value: crossing_value });
                    }
                    _ => {
                        warn!(
                            cgroup,
                            "the kernel killed a victim the agent no longer plans for; killing through the cgroup"
                        );
                        let _ = inner.cgroupfs.kill_all(&cgroup);
                        inner.source.kernel_kill_finished();
                        let _ = inner.wake.send(Wake::Other);
                    }
                }
            }
            SignalEvent::OomKill { cgroup, pid, .. } => {
                inner.metrics.record_oom_kill(cgroup.as_deref());
                warn!(pid, cgroup = cgroup.as_deref().unwrap_or("-"), "the kernel OOM killer chose a victim");
                let _ = inner.wake.send(Wake::Other);
            }
            SignalEvent::CgroupRemoved { cgroup, .. } => {
                inner.source.unregister(&cgroup);
                lock(&inner.registered).remove(&cgroup);
            }
            SignalEvent::ProcessExit { .. } => {}
            SignalEvent::KernelKill { .. } | SignalEvent::Crossing { .. } => {
                let _ = inner.wake.send(Wake::Other);
            }
        }
    }
}

impl Inner {
    /// The fast path: a hard line was crossed; kill the planned victim's
    /// processes through its cgroup right here, on the reader thread, before
    /// anything else. Everything else (runtime, status, event) follows on
    /// the event loop.
    fn fast_kill(&self, signal: EvictionSignal, at_ns: u64) -> Option<PlannedVictim> {
        let plan = lock(&self.plan).get(&signal).cloned().unwrap_or_default();
        for v in plan {
            if lock(&self.in_flight).contains_key(&v.uid) {
                continue;
            }
            match self.cgroupfs.kill_all(&v.cgroup) {
                Ok(_) => {
                    let killed_ns = monotonic_ns();
                    lock(&self.in_flight).insert(v.uid.clone(), (Instant::now(), v.clone()));
                    self.metrics
                        .crossing_to_kill
                        .get_or_create(&KillPathLabels { path: KillPath::Agent.as_str().into() })
                        .observe(killed_ns.saturating_sub(at_ns) as f64 / 1e9);
                    return Some(v);
                }
                // Gone since the plan was made: try the next one.
                Err(e) => debug!(pod = v.name, "fast path could not kill {}: {e}", v.cgroup),
            }
        }
        None
    }

    /// `used` is the value that crossed the kernel line: the message reports
    /// what the decision saw, not what is left after the kill.
    fn finish_fast_kill(&self, v: &PlannedVictim, signal: Option<EvictionSignal>, killed: KillPath, used: u64) {
        let Some(signal) = signal else { return };
        info!(pod = format!("{}/{}", v.namespace, v.name), %signal, killed_by = killed.as_str(), "evicted at the crossing");
        // The message needs current figures; build it from a fresh snapshot.
        let (message, annotations) = self.message_for(&v.uid, signal, used);
        self.metrics
            .kubelet_evictions
            .get_or_create(&EvictionSignalLabels { eviction_signal: signal.name().into() })
            .inc();
        self.evictor.evict(EvictionRequest {
            uid: v.uid.clone(),
            namespace: v.namespace.clone(),
            name: v.name.clone(),
            signal,
            grace_period_secs: 0,
            message,
            annotations,
            killed,
        });
    }

    fn message_for(
        &self,
        uid: &str,
        signal: EvictionSignal,
        used: u64,
    ) -> (String, std::collections::BTreeMap<String, String>) {
        let cfg = lock(&self.cfg).clone();
        let snapshot = self.source.snapshot().ok();
        let obs = snapshot.as_ref().map(|s| {
            let mut o = self.observe(s, &cfg);
            if let Some(at) = o.get_mut(&signal) {
                at.available = at.capacity as i64 - used as i64;
            }
            o
        });
        let threshold = cfg.eviction.thresholds.iter().find(|t| t.signal == signal && t.is_hard()).cloned();
        let pod = self.pods.eviction_pods().into_iter().find(|p| p.uid == uid);
        match (threshold, obs.and_then(|o| o.get(&signal).copied()), pod, snapshot) {
            (Some(t), Some(o), Some(p), Some(s)) => {
                let c = self.candidate(&p, &s, true);
                message(&t, &o, t.value.resolve(o.capacity), &c)
            }
            _ => {
                (format!("The node was low on resource: {}. Signal: {signal}. ", signal.resource()), Default::default())
            }
        }
    }

    fn observe(&self, snapshot: &Snapshot, cfg: &DriverConfig) -> Observations {
        let nodefs = node::statfs(&cfg.nodefs_path).ok();
        let imagefs = match &cfg.imagefs_path {
            Some(p) => node::statfs(p).ok(),
            None => nodefs,
        };
        observe(snapshot, &cfg.node, FsFigures { nodefs, imagefs })
    }

    fn candidate(&self, p: &EvictionPod, snapshot: &Snapshot, with_containers: bool) -> Candidate {
        let usage = snapshot.cgroups.get(&p.cgroup).copied().unwrap_or_default();
        let containers = if with_containers {
            p.containers
                .iter()
                .map(|c| ContainerUsage {
                    name: c.name.clone(),
                    memory: Usage {
                        request: c.memory_request,
                        usage: c.cgroup.as_deref().and_then(|cg| self.cgroupfs.working_set(cg).ok()).unwrap_or(0),
                    },
                })
                .collect()
        } else {
            vec![]
        };
        Candidate {
            uid: p.uid.clone(),
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            priority: p.priority,
            evictable: !p.critical,
            termination_grace_secs: p.termination_grace_secs,
            memory: Usage { request: p.memory_request, usage: usage.working_set_bytes },
            processes: usage.processes,
            disk: Usage { request: p.ephemeral_storage_request, usage: p.disk_usage.unwrap_or(0) },
            inodes: p.inodes_used.or(usage.inodes.map(|i| i.max(0) as u64)).unwrap_or(0),
            containers,
            in_flight: lock(&self.in_flight).contains_key(&p.uid),
        }
    }

    /// Candidates for every pod, plus the in-flight victims the pod manager
    /// no longer lists, whose memory is still on its way out.
    fn candidates(&self, pods: &[EvictionPod], snapshot: &Snapshot) -> Vec<Candidate> {
        let mut out: Vec<Candidate> = pods.iter().map(|p| self.candidate(p, snapshot, false)).collect();
        for (uid, (_, v)) in lock(&self.in_flight).iter() {
            if pods.iter().any(|p| &p.uid == uid) {
                continue;
            }
            let usage = snapshot.cgroups.get(&v.cgroup).copied().unwrap_or_default();
            out.push(Candidate {
                uid: uid.clone(),
                namespace: v.namespace.clone(),
                name: v.name.clone(),
                memory: Usage { request: 0, usage: usage.working_set_bytes },
                processes: usage.processes,
                inodes: usage.inodes.map_or(0, |i| i.max(0) as u64),
                in_flight: true,
                ..Default::default()
            });
        }
        out
    }

    /// Registers new pod cgroups with the signal source and drops gone
    /// ones; forgets in-flight victims whose processes are all gone;
    /// returns the pods.
    fn sync_registrations(&self) -> Vec<EvictionPod> {
        let pods = self.pods.eviction_pods();
        let kubepods = lock(&self.cfg).node.kubepods_cgroup.clone();
        lock(&self.in_flight).retain(|uid, (since, v)| {
            let listed = pods.iter().any(|p| &p.uid == uid);
            let alive = self.cgroupfs.procs_recursive(&v.cgroup).is_ok_and(|p| !p.is_empty());
            (listed || alive) && since.elapsed() < Duration::from_secs(300)
        });
        // Runs every plan interval: the common case, nothing to change,
        // allocates nothing per pod.
        let in_flight: Vec<String> = lock(&self.in_flight).values().map(|(_, v)| v.cgroup.clone()).collect();
        let mut want: HashSet<&str> = pods.iter().map(|p| p.cgroup.as_str()).collect();
        want.extend(in_flight.iter().map(String::as_str));
        want.insert(kubepods.as_str());
        let mut registered = lock(&self.registered);
        for cg in want.iter().filter(|cg| !registered.contains(**cg)).copied().collect::<Vec<_>>() {
            let kind = if cg == kubepods { CgroupKind::Kubepods } else { CgroupKind::Pod };
            match self.source.register(cg, kind) {
                Ok(()) => {
                    registered.insert(cg.to_owned());
                }
                // A pod whose cgroup is not created yet: next time.
                Err(e) => debug!("cannot register {cg} yet: {e}"),
            }
        }
        registered.retain(|cg| {
            let keep = want.contains(cg.as_str());
            if !keep {
                self.source.unregister(cg);
            }
            keep
        });
        pods
    }

    fn program_lines(&self) {
        let cfg = lock(&self.cfg).clone();
        let lines = kernel_lines(&cfg.eviction.thresholds, &cfg.node);
        let old = std::mem::replace(&mut *lock(&self.lines), lines.clone());
        for l in &old {
            if !lines.iter().any(|n| n.target == l.target && n.signal == l.signal) {
                let _ = self.source.set_threshold(&l.target, l.signal, None);
            }
        }
        for l in &lines {
            if let Err(e) = self.source.set_threshold(&l.target, l.signal, Some(l.threshold)) {
                warn!("cannot program the {} line: {e}", l.eviction_signal);
            }
        }
        for t in &cfg.eviction.thresholds {
            let capacity = match t.signal {
                EvictionSignal::MemoryAvailable => cfg.node.memory_capacity,
                EvictionSignal::AllocatableMemoryAvailable => cfg.node.allocatable_memory,
                EvictionSignal::PidAvailable => cfg.node.pid_limit,
                _ => continue,
            };
            self.metrics
                .threshold
                .get_or_create(&ThresholdLabels {
                    signal: t.signal.name().into(),
                    kind: if t.is_hard() { "hard" } else { "soft" }.into(),
                })
                .set(t.value.resolve(capacity) as i64);
        }
    }

    /// Ranks the pods for every hard signal so the fast path (and the
    /// kernel) can act without asking anyone.
    fn refresh_plan(&self) {
        let pods = self.sync_registrations();
        let Ok(snapshot) = self.source.snapshot() else { return };
        // Only pods under kubepods are ever planned: the kernel kills what
        // the plan names, so nothing else may get there.
        let kubepods = format!("{}/", lock(&self.cfg).node.kubepods_cgroup);
        let pods: Vec<EvictionPod> = pods.into_iter().filter(|p| p.cgroup.starts_with(&kubepods)).collect();
        let candidates: Vec<Candidate> = pods.iter().map(|p| self.candidate(p, &snapshot, false)).collect();
        let by_uid: HashMap<&str, &EvictionPod> = pods.iter().map(|p| (p.uid.as_str(), p)).collect();
        let lines = lock(&self.lines).clone();
        let kernel_eviction = lock(&self.cfg).kernel_eviction;
        let mut plan = HashMap::new();
        for line in &lines {
            let signal = line.eviction_signal;
            let order = match signal {
                EvictionSignal::PidAvailable => ranking::by_processes,
                _ => ranking::by_memory,
            };
            let mut ranked: Vec<&Candidate> = candidates.iter().filter(|c| c.evictable).collect();
            ranked.sort_by(|a, b| order(a, b));
            plan.insert(
                signal,
                ranked
                    .into_iter()
                    .filter_map(|c| by_uid.get(c.uid.as_str()))
                    .map(|p| PlannedVictim {
                        uid: p.uid.clone(),
                        namespace: p.namespace.clone(),
                        name: p.name.clone(),
                        cgroup: p.cgroup.clone(),
                    })
                    .collect::<Vec<_>>(),
            );
            // The kernel gets the first victim not already being evicted.
            let in_flight = lock(&self.in_flight);
            let first = plan[&signal].iter().find(|v| !in_flight.contains_key(&v.uid)).map(|v| v.cgroup.clone());
            drop(in_flight);
            let victim = if kernel_eviction { first } else { None };
            if let Err(e) = self.source.set_kernel_victim(&line.target, line.signal, victim.as_deref()) {
                debug!("cannot hand the {signal} victim to the kernel: {e}");
            }
        }
        *lock(&self.plan) = plan;
    }

    /// One full evaluation; returns when to evaluate again for soft grace
    /// periods.
    async fn evaluate(&self, state: &mut State, crossing_at_ns: Option<u64>) -> Option<Instant> {
        let cfg = lock(&self.cfg).clone();
        let pods = self.sync_registrations();
        let snapshot = match self.source.snapshot() {
            Ok(s) => s,
            Err(e) => {
                warn!("eviction: cannot read signals: {e}");
                return None;
            }
        };
        let obs = self.observe(&snapshot, &cfg);
        let candidates = self.candidates(&pods, &snapshot);
        let mut eval = state.evaluate(&cfg.eviction, Instant::now(), &obs, &candidates, false);
        if let Action::ReclaimNodeResources(t) = &eval.action {
            // The condition first, as the kubelet: reclaim can take a while.
            self.publish(&obs, &eval);
            info!(signal = %t.signal, "disk pressure: reclaiming dead containers and unused images first");
            if let Some(r) = &self.reclaimer {
                r.reclaim(t.signal).await;
            }
            let after = self.source.snapshot().unwrap_or_else(|_| snapshot.clone());
            let obs = self.observe(&after, &cfg);
            let candidates = self.with_disk_usage(candidates.clone()).await;
            eval = state.evaluate(&cfg.eviction, Instant::now(), &obs, &candidates, true);
        }
        if let Some(at) = crossing_at_ns {
            self.metrics.crossing_to_decision.observe(monotonic_ns().saturating_sub(at) as f64 / 1e9);
        }
        self.publish(&obs, &eval);
        if let Action::Evict(ev) = &eval.action {
            if ev.victims.is_empty() {
                self.metrics.evictions_without_victim.inc();
                warn!(signal = %ev.threshold.signal, "eviction threshold met but no pod can be evicted");
            }
            for v in &ev.victims {
                let Some(p) = pods.iter().find(|p| p.uid == v.uid) else { continue };
                // Messages name the offending containers, so read their usage
                // now, for the victims only.
                let c = self.candidate(p, &snapshot, true);
                let (message, annotations) = message(&ev.threshold, &ev.observed, ev.threshold_value, &c);
                let killed = if ev.threshold.is_hard() {
                    if let Err(e) = self.cgroupfs.kill_all(&p.cgroup) {
                        debug!(pod = p.name, "kill through the cgroup failed, the runtime stops it: {e}");
                    }
                    if let Some(at) = crossing_at_ns {
                        self.metrics
                            .crossing_to_kill
                            .get_or_create(&KillPathLabels { path: KillPath::Agent.as_str().into() })
                            .observe(monotonic_ns().saturating_sub(at) as f64 / 1e9);
                    }
                    KillPath::Agent
                } else {
                    KillPath::Graceful
                };
                let planned = PlannedVictim {
                    uid: v.uid.clone(),
                    namespace: v.namespace.clone(),
                    name: v.name.clone(),
                    cgroup: p.cgroup.clone(),
                };
                lock(&self.in_flight).insert(v.uid.clone(), (Instant::now(), planned));
                self.metrics
                    .kubelet_evictions
                    .get_or_create(&EvictionSignalLabels { eviction_signal: ev.threshold.signal.name().into() })
                    .inc();
                info!(pod = format!("{}/{}", v.namespace, v.name), signal = %ev.threshold.signal, "evicting: {message}");
                self.evictor.evict(EvictionRequest {
                    uid: v.uid.clone(),
                    namespace: v.namespace.clone(),
                    name: v.name.clone(),
                    signal: ev.threshold.signal,
                    grace_period_secs: v.grace_period_secs,
                    message,
                    annotations,
                    killed,
                });
            }
        }
        self.refresh_plan();
        eval.next_deadline
    }

    /// The candidates with their measured disk bytes and inodes, for the
    /// disk-pressure ranking.
    async fn with_disk_usage(&self, mut candidates: Vec<Candidate>) -> Vec<Candidate> {
        let Some(meter) = lock(&self.disk_meter).clone() else { return candidates };
        let uids: Vec<String> = candidates.iter().map(|c| c.uid.clone()).collect();
        let usage = meter.measure(&uids).await;
        for c in &mut candidates {
            if let Some(u) = usage.get(&c.uid) {
                c.disk.usage = u.bytes;
                c.inodes = u.inodes;
            }
        }
        debug!(?usage, "pods' disk usage for the disk-pressure ranking");
        candidates
    }

    fn publish(&self, obs: &Observations, eval: &Evaluation) {
        for (signal, o) in obs {
            self.metrics
                .signal_available
                .get_or_create(&SignalLabels { signal: signal.name().into() })
                .set(o.available);
        }
        for c in NodeCondition::ALL {
            self.metrics
                .node_condition
                .get_or_create(&ConditionLabels { condition: c.type_name().into() })
                .set(i64::from(eval.conditions.contains(&c)));
        }
        for (name, v) in self.source.counters() {
            self.metrics.signal_counters.get_or_create(&crate::metrics::NameLabels { name: name.into() }).set(v as i64);
        }
        self.conditions.send_if_modified(|c| {
            if *c != eval.conditions {
                info!(conditions = ?eval.conditions.iter().map(|c| c.type_name()).collect::<Vec<_>>(), "node pressure conditions changed");
                *c = eval.conditions.clone();
                true
            } else {
                false
            }
        });
    }
}
