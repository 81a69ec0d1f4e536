//! The eviction manager's edge. One path per step:
//!
//! - **observe**: a snapshot of the signal source and statfs, into
//!   observations and candidates ([`manager`]);
//! - **decide**: the pure [`core`](super::core) state machine, which also
//!   describes each victim (message and annotations);
//! - **kill**: one function ([`Shared::kill`]) ends a victim's processes
//!   through its cgroup and records the crossing → kill time, whoever
//!   decided (the kernel at the crossing, the fast path on the reader
//!   thread, or the evaluation);
//! - **record**: one function ([`manager::Manager::record`]) counts the
//!   eviction and hands the pod manager the request built from the
//!   victim's description.
//!
//! The hard thresholds are programmed into the signal source as lines, and
//! the pods are ranked for each line ahead of time (the *plan*), on the
//! manager's task. At a crossing, the kernel executes the plan if it can;
//! otherwise the source's reader thread kills the plan's first victim
//! ([`fast`]) and forwards the rest. Everything else (conditions, soft
//! thresholds, disk reclaim, further victims) runs on the manager's task,
//! after every event and every housekeeping period as a safety net.

mod edge;
mod fast;
mod manager;
mod pressure;
mod reclaim;
#[cfg(test)]
mod reclaim_tests;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    future::Future,
    path::PathBuf,
    pin::Pin,
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

pub use edge::{CgroupReader, Killer, ReclaimWrite, Reclaimer};
use tokio::sync::{broadcast, mpsc, watch};

use super::{core::EvictionConfig, observe::NodeInfo, signal::EvictionSignal, signal::NodeCondition};
use crate::{
    cgroups::CgroupFs,
    metrics::{KillPathLabels, Metrics},
    signals::{EventSink, SignalEvent, SignalSource, monotonic_ns},
};

/// How old a PID line's plan may be when the line is crossed: a fork bomb
/// doubles in milliseconds, so an older ranking can name the wrong pod,
/// and the pods are ranked again instead (by the evaluation). Memory moves
/// slowly enough for a plan of any age.
pub const PID_PLAN_MAX_AGE: Duration = Duration::from_millis(100);

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
    /// Critical pods are never evicted: static and mirror pods, and those
    /// at or above system-cluster-critical priority (the kubelet's
    /// IsCriticalPod).
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

/// Lists the pods that may be evicted. The plan asks every second, so each
/// pod is shared, not copied.
pub trait PodProvider: Send + Sync {
    fn eviction_pods(&self) -> Vec<Arc<EvictionPod>>;
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
    /// The kubelet's annotations on the Evicted event: offending_containers,
    /// offending_containers_usage, starved_resource.
    pub annotations: BTreeMap<String, String>,
    pub killed: KillPath,
}

pub trait PodEvictor: Send + Sync {
    fn evict(&self, request: EvictionRequest);
    /// Whether the pod's end is reported: its terminal status handed to
    /// the status manager, or the pod gone. A victim counts as being
    /// evicted until then (the kubelet's wait for the pod's cleanup), so
    /// the next one is ranked on what is left and pods fail in the order
    /// they were chosen.
    fn termination_reported(&self, uid: &str) -> bool;
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
    /// A directory on the runtime's image filesystem (ImageFsInfo's
    /// mountpoint) when it is not nodefs; None when the images live on
    /// nodefs.
    pub imagefs_path: Option<PathBuf>,
    /// The safety-net re-evaluation period (the kubelet's 10 s).
    pub housekeeping_interval: Duration,
    /// How often the victim plan and cgroup registrations are refreshed.
    pub plan_interval: Duration,
    /// Hand the top of the plan to the kernel, which kills at the crossing
    /// (`--kernel-eviction`); otherwise the agent's fast path kills.
    pub kernel_eviction: bool,
    /// `--memory-reclaim-before-eviction`: when a memory line is crossed,
    /// reclaim the pods' page cache (`memory.reclaim`) before evicting, and
    /// keep in-kernel kills for anonymous growth. Only where the cgroups
    /// can do it (v2 with `memory.reclaim`); elsewhere it is logged at
    /// start and the manager behaves as with it off.
    pub reclaim_before_eviction: bool,
}

/// One planned victim: enough to kill it without asking anyone. It shares
/// the pod manager's description of the pod, so the plan made every second
/// copies no pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedVictim(Arc<EvictionPod>);

impl PlannedVictim {
    pub fn new(pod: &Arc<EvictionPod>) -> PlannedVictim {
        PlannedVictim(Arc::clone(pod))
    }
}

impl std::ops::Deref for PlannedVictim {
    type Target = EvictionPod;

    fn deref(&self) -> &EvictionPod {
        &self.0
    }
}

/// The ranked victims of every kernel line, as the manager last made them.
#[derive(Clone, Debug, Default)]
pub(crate) struct Plan {
    pub lines: Vec<super::observe::KernelLine>,
    pub victims: HashMap<EvictionSignal, Vec<PlannedVictim>>,
    /// CLOCK_MONOTONIC ns when the pods were ranked (the kernel's clock,
    /// which crossings carry).
    pub ranked_ns: u64,
}

/// A pod being evicted. It counts as reclaimed (and stays registered)
/// until its cgroup has no processes left, even after the pod manager has
/// dropped it: its memory is freed only as its processes finish exiting.
#[derive(Clone, Debug)]
pub(crate) struct InFlight {
    pub since: tokio::time::Instant,
    pub victim: PlannedVictim,
    /// The signal it is evicted for.
    pub signal: EvictionSignal,
}

/// What the reader thread forwards to the manager's task.
#[derive(Debug)]
pub(crate) enum Wake {
    /// A hard line was crossed. `value` is what crossed it (used amount,
    /// in the signal's unit); `killed` the victim the fast path killed, at
    /// `decided_ns`; `anonymous` when the kernel knew the growth was
    /// anonymous memory (reclaim-first only).
    Crossing {
        at_ns: u64,
        value: u64,
        signal: EvictionSignal,
        killed: Option<PlannedVictim>,
        decided_ns: u64,
        anonymous: bool,
    },
    /// The kernel killed a planned victim (`cgroup`, with its kernel id).
    KernelKill {
        cgroup: String,
        cgroup_id: u64,
        signal: Option<EvictionSignal>,
        value: u64,
        crossing_ns: u64,
        at_ns: u64,
    },
    /// A registered cgroup was removed.
    CgroupRemoved(String),
    /// Anything else worth an evaluation.
    Other,
}

/// What the reader thread's fast path and the manager's task share.
pub(crate) struct Shared {
    killer: Arc<dyn Killer>,
    metrics: Arc<Metrics>,
    plan: Mutex<Arc<Plan>>,
    in_flight: Mutex<HashMap<String, InFlight>>,
    events: broadcast::Sender<SignalEvent>,
    wake: mpsc::UnboundedSender<Wake>,
    /// The memory.pressure signal's node verdict.
    pressure: Mutex<pressure::NodePressure>,
    /// Page cache is reclaimed before evicting for memory: the fast path
    /// kills at a memory crossing only for anonymous growth.
    reclaim_first: AtomicBool,
}

impl Shared {
    /// Marks `v` as being evicted for `signal`; false when it already was,
    /// by anyone.
    fn claim(&self, v: &PlannedVictim, signal: EvictionSignal) -> bool {
        let mut in_flight = self.in_flight.lock();
        if in_flight.contains_key(&v.uid) {
            return false;
        }
        in_flight.insert(v.uid.clone(), InFlight { since: tokio::time::Instant::now(), victim: v.clone(), signal });
        true
    }

    fn is_in_flight(&self, uid: &str) -> bool {
        self.in_flight.lock().contains_key(uid)
    }

    /// Whether a victim evicted for `signal` is still dying. A crossing
    /// then (the signal wavering at the line meanwhile) is left to the
    /// evaluation, which counts what the dying victim gives back.
    fn dying_for(&self, signal: EvictionSignal) -> bool {
        self.in_flight.lock().values().any(|f| f.signal == signal)
    }

    /// The one place that kills: every process of `v`'s cgroup, then the
    /// crossing → kill time under `path`, with `killed_ns` when the kill
    /// happened elsewhere (the kernel's own timestamp) or now. The caller
    /// has claimed `v`. For the kernel's kill this ends the survivors: the
    /// tasks it could not reach from the crossing's context.
    fn kill(&self, v: &PlannedVictim, path: KillPath, crossing_ns: Option<u64>, killed_ns: Option<u64>) -> bool {
        // After a kernel kill the victim is already dying: what is left is
        // its survivors.
        let killed = match path {
            KillPath::Kernel => self.killer.kill_survivors(&v.cgroup),
            _ => self.killer.kill_all(&v.cgroup),
        };
        let ok = match killed {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(pod = v.name, path = path.as_str(), "kill through the cgroup failed: {e}");
                false
            }
        };
        if let Some(at) = crossing_ns
            && (ok || path == KillPath::Kernel)
        {
            let killed = killed_ns.unwrap_or_else(monotonic_ns);
            self.metrics
                .crossing_to_kill
                .get_or_create(&KillPathLabels { path: path.as_str().into() })
                .observe(killed.saturating_sub(at) as f64 / 1e9);
        }
        ok
    }
}

/// Handle to the running eviction manager.
#[derive(Clone)]
pub struct EvictionManager {
    shared: Arc<Shared>,
    manager: Arc<manager::Manager>,
}

/// The edges the manager works through.
pub struct Edges {
    pub source: Arc<dyn SignalSource>,
    pub cgroups: Arc<dyn CgroupReader>,
    pub killer: Arc<dyn Killer>,
    pub pods: Arc<dyn PodProvider>,
    pub evictor: Arc<dyn PodEvictor>,
    pub reclaimer: Option<Arc<dyn NodeReclaimer>>,
    /// memory.reclaim on pod cgroups, for `reclaim_before_eviction`.
    pub cache_reclaimer: Arc<dyn Reclaimer>,
}

impl EvictionManager {
    /// Builds the manager on cgroupfs and subscribes it to the signal
    /// source. Spawn [`EvictionLoop::run`] to start it.
    pub fn new(
        cfg: DriverConfig,
        source: Arc<dyn SignalSource>,
        cgroupfs: CgroupFs,
        pods: Arc<dyn PodProvider>,
        evictor: Arc<dyn PodEvictor>,
        reclaimer: Option<Arc<dyn NodeReclaimer>>,
        metrics: Arc<Metrics>,
    ) -> (EvictionManager, EvictionLoop) {
        let fs = Arc::new(cgroupfs);
        EvictionManager::build(
            cfg,
            Edges { source, cgroups: fs.clone(), killer: fs.clone(), pods, evictor, reclaimer, cache_reclaimer: fs },
            metrics,
        )
    }

    /// [`EvictionManager::new`] on any edges.
    pub fn build(cfg: DriverConfig, edges: Edges, metrics: Arc<Metrics>) -> (EvictionManager, EvictionLoop) {
        let (wake, wake_rx) = mpsc::unbounded_channel();
        let (events, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared {
            killer: edges.killer.clone(),
            metrics: metrics.clone(),
            plan: Mutex::new(Arc::new(Plan::default())),
            in_flight: Mutex::new(HashMap::new()),
            events,
            wake,
            pressure: Mutex::default(),
            reclaim_first: AtomicBool::new(false),
        });
        metrics
            .signal_source
            .get_or_create(&crate::metrics::ModeLabels { mode: edges.source.mode().as_str().into() })
            .set(1);
        metrics.set_signal_strategies(&edges.source.strategies());
        let sink: Arc<dyn EventSink> = Arc::new(fast::Sink(Arc::downgrade(&shared)));
        edges.source.subscribe(sink);
        let manager = Arc::new(manager::Manager::new(cfg, edges, metrics, shared.clone()));
        (EvictionManager { shared, manager: manager.clone() }, EvictionLoop { manager, wake_rx })
    }

    /// Signal events as they arrive (for /debug/events and tests).
    pub fn events(&self) -> broadcast::Receiver<SignalEvent> {
        self.shared.events.subscribe()
    }

    /// The node pressure conditions currently reported.
    pub fn conditions(&self) -> watch::Receiver<BTreeSet<NodeCondition>> {
        self.manager.conditions()
    }

    /// The current victim plan for a hard signal.
    pub fn plan(&self, signal: EvictionSignal) -> Vec<PlannedVictim> {
        self.shared.plan.lock().victims.get(&signal).cloned().unwrap_or_default()
    }

    /// Measures pods' disk usage when disk pressure needs a ranking.
    pub fn set_disk_meter(&self, meter: Arc<dyn DiskUsageMeter>) {
        self.manager.set_disk_meter(meter);
    }

    /// Where the memory.pressure signal's watcher reports: the node's
    /// verdicts drive the condition and evictions here, a pod's firing a
    /// Warning event through `recorder`.
    pub fn pressure_sink(
        &self,
        cfg: crate::eviction::pressure::PressureConfig,
        recorder: Arc<dyn crate::events::EventRecorder>,
    ) -> Arc<dyn crate::eviction::pressure_watch::PressureSink> {
        Arc::new(pressure::PressureReporter {
            shared: Arc::downgrade(&self.shared),
            metrics: self.shared.metrics.clone(),
            recorder,
            cfg,
        })
    }

    /// Asks for an evaluation now (e.g. after pods changed).
    pub fn poke(&self) {
        let _ = self.shared.wake.send(Wake::Other);
    }

    /// Replaces the thresholds and periods (config reload); the kernel lines
    /// are reprogrammed at once.
    pub fn reconfigure(&self, eviction: EvictionConfig) {
        self.manager.reconfigure(eviction);
        self.poke();
    }
}

/// The manager's event loop, to spawn on tokio.
pub struct EvictionLoop {
    manager: Arc<manager::Manager>,
    wake_rx: mpsc::UnboundedReceiver<Wake>,
}

impl EvictionLoop {
    /// Runs until `shutdown` becomes true.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let m = self.manager.clone();
        m.start();
        let (housekeeping, plan_every) = m.periods();
        let mut housekeeping = tokio::time::interval(housekeeping);
        let mut plan_tick = tokio::time::interval(plan_every);
        let mut state = super::core::State::default();
        let mut deadline: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                w = self.wake_rx.recv() => {
                    let Some(w) = w else { break };
                    let crossing = m.on_wake(&mut state, w);
                    deadline = m.evaluate(&mut state, crossing).await;
                }
                _ = housekeeping.tick() => deadline = m.evaluate(&mut state, None).await,
                _ = plan_tick.tick() => m.rank(),
                _ = async { match deadline { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } } => {
                    deadline = m.evaluate(&mut state, None).await;
                }
                _ = shutdown.cancelled() => break,
            }
        }
        tracing::debug!("eviction manager stopped");
    }
}
