//! The pod manager: merges the sources' snapshots into the pods this node
//! should run, admits new pods, keeps one worker per pod, relists the
//! runtime every second to wake the workers whose pods changed (the
//! kubelet's generic PLEG), stops what runs in the runtime without a pod
//! (once every source has spoken, so a restart never kills a pod whose
//! source is still loading), and answers for the pods: their status
//! (`PodView`), and to the eviction manager (`PodProvider`, `PodEvictor`).

mod eviction;
mod reconcile;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::{Arc, Weak},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use parking_lot::{Mutex, RwLock};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::{
    admission::{self, Capacity},
    manifest::CONFIG_MIRROR,
    metrics::PodMetrics,
    source::{PodSink, PodSnapshot, PodView, SourceKind, StatusReporter},
    status::TerminalReason,
    worker::{Msg, WorkerDeps, WorkerHandle, WorkerSink},
};
use crate::{
    cm::hierarchy::burstable_cpu_request,
    eviction::{driver::EvictionPod, signal::NodeCondition},
};

/// How long a removed pod's remains are not taken for an orphan's.
const TOMBSTONE_TTL: Duration = Duration::from_secs(10);

struct Entry {
    pod: Pod,
    status: Option<PodStatus>,
    /// Running containers (name, id).
    running: Vec<(String, String)>,
    /// Admitted and still meant to run (not finished, not terminating).
    active: bool,
    handle: Option<WorkerHandle>,
    /// Found in the runtime with no pod: being stopped and removed.
    orphan: bool,
    evicted: bool,
    first_seen: Instant,
    /// From first sight to all containers running, once it happened.
    started_after: Option<Duration>,
    /// The cpu request (milli) this pod adds to the Burstable QoS cgroup's
    /// shares (0 unless Burstable), computed when `pod` is set.
    burstable_cpu_milli: i64,
    /// What eviction ranks this pod by, built from `pod` and `running`
    /// when first asked after either changed: the plan is refreshed every
    /// second, and the requests, priority and QoS behind it parse
    /// quantities.
    eviction: Option<Arc<EvictionPod>>,
    /// The spec as the pod runs (its allocated resources, which differ
    /// from `pod`'s while a resize is pending), as its worker last
    /// reported: eviction ranks and plans by it.
    allocated: Option<k8s_openapi::api::core::v1::PodSpec>,
}

struct Inner {
    deps: Arc<WorkerDeps>,
    reporter: RwLock<Arc<dyn StatusReporter>>,
    capacity: Mutex<Capacity>,
    metrics: PodMetrics,
    expected: HashSet<SourceKind>,
    sources: Mutex<BTreeMap<SourceKind, Vec<Pod>>>,
    pods: Mutex<HashMap<String, Entry>>,
    shutdown: CancellationToken,
    last_relist: Mutex<Option<Instant>>,
    /// Pods removed lately: a relist listed before their cleanup finished
    /// must not mistake their remains for orphans.
    tombstones: Mutex<HashMap<String, Instant>>,
    /// Set while the node shuts down: new pods are refused with it.
    refuse_new: Mutex<Option<admission::Rejection>>,
    /// What the host offers pods (sysctls, AppArmor, runtime features).
    host: RwLock<admission::HostSupport>,
    /// The node's pressure conditions, for the eviction admit handler.
    pressure: Mutex<Option<watch::Receiver<BTreeSet<NodeCondition>>>>,
    /// --evict-static-pods: static pods may be evicted (see
    /// [`PodManager::set_evict_static_pods`]).
    evict_static: std::sync::atomic::AtomicBool,
    this: Weak<Inner>,
}

/// Handle to the pod manager.
#[derive(Clone)]
pub struct PodManager {
    inner: Arc<Inner>,
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

fn is_mirror(pod: &Pod) -> bool {
    pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(CONFIG_MIRROR))
}

impl PodManager {
    pub fn new(
        deps: Arc<WorkerDeps>,
        expected: HashSet<SourceKind>,
        capacity: Capacity,
        metrics: PodMetrics,
        shutdown: CancellationToken,
    ) -> PodManager {
        let inner = Arc::new_cyclic(|this| Inner {
            deps,
            reporter: RwLock::new(Arc::new(super::source::NoStatusReporter)),
            capacity: Mutex::new(capacity),
            metrics,
            expected,
            sources: Mutex::new(BTreeMap::new()),
            pods: Mutex::new(HashMap::new()),
            shutdown,
            last_relist: Mutex::new(None),
            tombstones: Mutex::new(HashMap::new()),
            refuse_new: Mutex::new(None),
            host: RwLock::new(admission::HostSupport::default()),
            pressure: Mutex::new(None),
            evict_static: std::sync::atomic::AtomicBool::new(false),
            this: this.clone(),
        });
        PodManager { inner }
    }

    /// What new pods are admitted against (node allocatable), when a
    /// reload changed it.
    pub fn set_capacity(&self, capacity: Capacity) {
        *self.inner.capacity.lock() = capacity;
    }

    /// Where status changes go (the API server's status manager).
    pub fn set_reporter(&self, reporter: Arc<dyn StatusReporter>) {
        *self.inner.reporter.write() = reporter;
    }

    /// How long a pod took from first sight to all its containers running
    /// (kubelet_pod_start_duration_seconds, per pod).
    pub fn start_duration(&self, uid: &str) -> Option<Duration> {
        self.inner.pods.lock().get(uid).and_then(|e| e.started_after)
    }

    /// When the runtime was last relisted (healthz: the sync loop is alive).
    pub fn last_relist(&self) -> Option<Instant> {
        *self.inner.last_relist.lock()
    }

    /// Relists the runtime every `period` until shutdown.
    pub async fn run(self, period: Duration) {
        let shutdown = self.inner.shutdown.clone();
        let mut previous: HashMap<String, Vec<(String, i32)>> = HashMap::new();
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_start: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.cancelled() => break,
            }
            let started = Instant::now();
            let since_previous = last_start.map(|t| started.saturating_duration_since(t));
            last_start = Some(started);
            match self.inner.relist(&mut previous).await {
                Ok(()) => *self.inner.last_relist.lock() = Some(Instant::now()),
                Err(e) => debug!("relist: {e}"),
            }
            self.inner.update_qos_cgroups().await;
            self.inner.metrics.observe_relist(started.elapsed(), since_previous, std::time::SystemTime::now());
        }
        let workers: Vec<_> =
            self.inner.pods.lock().values_mut().filter_map(|e| e.handle.take()).map(|h| h.task).collect();
        for t in workers {
            let _ = t.await;
        }
    }
}

/// Hooks for the node shutdown manager and the volume manager.
impl PodManager {
    /// Whether the pod manager knows the pod (running, stopping, or kept
    /// after it finished).
    pub fn knows(&self, uid: &str) -> bool {
        self.inner.pods.lock().contains_key(uid)
    }

    /// The pods that still run or may run: (uid, pod), orphans excluded.
    pub fn running_pods(&self) -> Vec<(String, Pod)> {
        self.inner
            .pods
            .lock()
            .iter()
            .filter(|(_, e)| !e.orphan && e.handle.is_some() && (e.active || !e.running.is_empty()))
            .map(|(uid, e)| (uid.clone(), e.pod.clone()))
            .collect()
    }

    /// Stops a pod for good within `grace` and leaves it Failed with
    /// `reason` (node shutdown); false for an unknown pod.
    pub fn terminate_pod(&self, uid: &str, grace: Duration, reason: TerminalReason) -> bool {
        let mut pods = self.inner.pods.lock();
        let Some(e) = pods.get_mut(uid) else { return false };
        e.active = false;
        e.evicted = true;
        match &e.handle {
            Some(h) => h.tx.send(Msg::Evict { grace, reason }).is_ok(),
            None => false,
        }
    }

    /// Containers of the pod still running, as its worker last saw them.
    pub fn running_containers(&self, uid: &str) -> usize {
        self.inner.pods.lock().get(uid).map_or(0, |e| e.running.len())
    }

    /// Whether the pod's worker has finished stopping it (or it is gone).
    pub fn is_stopped(&self, uid: &str) -> bool {
        self.inner.pods.lock().get(uid).is_none_or(|e| {
            e.handle.is_none()
                || (!e.active
                    && e.running.is_empty()
                    && e.status
                        .as_ref()
                        .and_then(|s| s.phase.as_deref())
                        .is_some_and(|p| p == "Failed" || p == "Succeeded"))
        })
    }

    /// What the host offers pods, for admission (before pods arrive).
    pub fn set_host_support(&self, host: admission::HostSupport) {
        *self.inner.host.write() = host;
    }

    /// Refuses every new pod with `rejection` from now on (None: admit again).
    pub fn refuse_new_pods(&self, rejection: Option<admission::Rejection>) {
        *self.inner.refuse_new.lock() = rejection;
    }

    /// The node's pressure conditions: while they hold, admission refuses
    /// what the kubelet's eviction admit handler refuses.
    pub fn set_node_conditions(&self, conditions: watch::Receiver<BTreeSet<NodeCondition>>) {
        *self.inner.pressure.lock() = Some(conditions);
    }

    /// Lets eviction take static pods below system-cluster-critical
    /// (`--evict-static-pods`, for standalone nodes); by default they are
    /// critical and never evicted, as with the kubelet.
    pub fn set_evict_static_pods(&self, on: bool) {
        self.inner.evict_static.store(on, std::sync::atomic::Ordering::Relaxed);
        for e in self.inner.pods.lock().values_mut() {
            e.eviction = None;
        }
    }
}

impl Inner {
    fn sink(&self) -> Arc<dyn WorkerSink> {
        Arc::new(Sink(self.this.clone()))
    }

    fn reporter(&self) -> Arc<dyn StatusReporter> {
        self.reporter.read().clone()
    }

    /// The Burstable QoS cgroup's cpu shares follow the cpu requests of the
    /// Burstable pods that run or may run (the kubelet's QoS container
    /// manager); the cgroup is written only when the sum changes.
    async fn update_qos_cgroups(&self) {
        let total: i64 = self
            .pods
            .lock()
            .values()
            .filter(|e| !e.orphan && e.handle.is_some() && (e.active || !e.running.is_empty()))
            .map(|e| e.burstable_cpu_milli)
            .sum();
        if let Err(e) = self.deps.cgroups.update_burstable_cpu_shares(total).await {
            warn!("updating the Burstable QoS cgroup's cpu shares: {e}");
        }
    }

    fn sources_ready(&self) -> bool {
        let s = self.sources.lock();
        self.expected.iter().all(|k| s.contains_key(k))
    }
}

/// fields): a worker is only told about changes the kubelet acts on.
fn same_spec(a: &Pod, b: &Pod) -> bool {
    a.spec == b.spec
        && a.metadata.deletion_timestamp == b.metadata.deletion_timestamp
        && a.metadata.deletion_grace_period_seconds == b.metadata.deletion_grace_period_seconds
        && a.metadata.labels == b.metadata.labels
        && a.metadata.name == b.metadata.name
        && gate_conditions(a) == gate_conditions(b)
}

/// The status of each readiness gate's condition (set through the API by
/// others): a change makes the worker compute Ready again.
fn gate_conditions(p: &Pod) -> Vec<(String, String)> {
    let gates: Vec<&str> =
        p.spec.iter().flat_map(|s| s.readiness_gates.iter().flatten()).map(|g| g.condition_type.as_str()).collect();
    crate::pods::conditions::foreign(p)
        .into_iter()
        .filter(|c| gates.contains(&c.type_.as_str()))
        .map(|c| (c.type_, c.status))
        .collect()
}

impl Entry {
    fn new(pod: Pod, handle: Option<WorkerHandle>) -> Entry {
        Entry {
            burstable_cpu_milli: pod.spec.as_ref().map_or(0, burstable_cpu_request),
            pod,
            status: None,
            running: vec![],
            active: true,
            handle,
            orphan: false,
            evicted: false,
            first_seen: Instant::now(),
            started_after: None,
            eviction: None,
            allocated: None,
        }
    }
}

struct Sink(Weak<Inner>);

impl WorkerSink for Sink {
    fn status(&self, pod: &Pod, status: &PodStatus, containers: &[(String, String)], active: bool) {
        let Some(inner) = self.0.upgrade() else { return };
        let changed = {
            let mut pods = inner.pods.lock();
            let Some(e) = pods.get_mut(&uid(pod)) else { return };
            if e.running != containers {
                e.running = containers.to_vec();
                e.eviction = None;
            }
            // A resize applied: eviction's requests and the in-kernel plan
            // are rebuilt from the new allocation.
            if e.allocated.as_ref() != pod.spec.as_ref() {
                e.allocated = pod.spec.clone();
                e.eviction = None;
            }
            e.active = active && !e.orphan;
            let all_running = status.container_statuses.as_ref().is_some_and(|cs| {
                !cs.is_empty() && cs.iter().all(|c| c.state.as_ref().and_then(|s| s.running.as_ref()).is_some())
            });
            if all_running && e.started_after.is_none() {
                let took = e.first_seen.elapsed();
                e.started_after = Some(took);
                inner.metrics.pod_start_duration.observe(took.as_secs_f64());
            }
            if e.orphan || e.status.as_ref() == Some(status) {
                false
            } else {
                e.status = Some(status.clone());
                true
            }
        };
        if changed {
            inner.reporter().report(pod, status);
        }
    }

    fn terminated(&self, pod: &Pod) {
        if let Some(inner) = self.0.upgrade() {
            inner.reporter().terminated(pod);
        }
    }

    fn removed(&self, pod: &Pod) {
        let Some(inner) = self.0.upgrade() else { return };
        let id = uid(pod);
        inner.tombstones.lock().insert(id.clone(), Instant::now());
        inner.pods.lock().remove(&id);
        if let Some(devices) = &inner.deps.devices {
            devices.pod_removed(&id);
        }
        debug!(uid = id, "pod removed");
        // The pod may be wanted again (a manifest restored meanwhile).
        inner.reconcile();
    }
}

impl PodSink for PodManager {
    fn set(&self, snapshot: PodSnapshot) {
        self.inner.sources.lock().insert(snapshot.source, snapshot.pods);
        self.inner.reconcile();
    }
}

impl PodView for PodManager {
    fn pods(&self) -> Vec<Pod> {
        let pods = self.inner.pods.lock();
        let mut out: Vec<Pod> = pods
            .values()
            .filter(|e| !e.orphan)
            .map(|e| {
                let mut p = e.pod.clone();
                p.status = e.status.clone();
                p
            })
            .collect();
        out.sort_by(|a, b| (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name)));
        out
    }
}

/// The volume manager's orphan sweep asks the pod manager which pods exist.
impl crate::volumes::PodsInUse for PodManager {
    fn sources_ready(&self) -> bool {
        crate::gc::ActivePods::all_sources_ready(self)
    }

    fn in_use(&self, uid: &str) -> bool {
        self.knows(uid)
    }
}
