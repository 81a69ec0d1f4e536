//! The manager's task: registrations and kernel lines, the ranking of the
//! pods for each line (the plan), and each step of an eviction: observe,
//! decide (the pure core), reclaim page cache first for memory when asked
//! ([`super::reclaim`]), kill (through [`Shared::kill`]) and record.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use parking_lot::Mutex;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::{
    DiskUsageMeter, DriverConfig, Edges, EvictionPod, EvictionRequest, KillPath, PID_PLAN_MAX_AGE, Plan, PlannedVictim,
    Shared, Wake,
    reclaim::{CacheReclaim, is_memory},
};
use crate::{
    eviction::{
        core::{self, Action, Evaluation, EvictionConfig, Observation, Observations, State, Victim},
        observe::{FsFigures, KernelLine, kernel_lines, observe},
        pressure,
        ranking::{self, Candidate, ContainerRef, Usage},
        signal::{EvictionSignal, EvictionThreshold, NodeCondition, ThresholdValue},
    },
    metrics::{ConditionLabels, EvictionSignalLabels, Metrics, SignalLabels, ThresholdLabels},
    quantity::Quantity,
    signals::{CgroupKind, KernelVictim, Snapshot, monotonic_ns, node},
};

/// How long a victim counts as being evicted at most, should its cgroup
/// never empty.
const IN_FLIGHT_FOR: Duration = Duration::from_secs(300);

/// How long a victim whose processes are gone is waited for until its
/// terminal status is reported (the kubelet's podCleanupTimeout).
const POD_CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// How many `memory.reclaim` rounds an evaluation makes before it evicts
/// (reclaim-first), each on a fresh observation.
const RECLAIM_ROUNDS: usize = 3;

pub(super) struct Manager {
    cfg: Mutex<DriverConfig>,
    edges: Edges,
    metrics: Arc<Metrics>,
    shared: Arc<Shared>,
    lines: Mutex<Vec<KernelLine>>,
    disk_meter: Mutex<Option<Arc<dyn DiskUsageMeter>>>,
    registered: Mutex<HashSet<String>>,
    conditions: watch::Sender<BTreeSet<NodeCondition>>,
    cache: CacheReclaim,
}

impl Manager {
    pub(super) fn new(cfg: DriverConfig, edges: Edges, metrics: Arc<Metrics>, shared: Arc<Shared>) -> Manager {
        let cache = CacheReclaim::new(edges.cache_reclaimer.clone(), metrics.clone());
        Manager {
            cache,
            cfg: Mutex::new(cfg),
            edges,
            metrics,
            shared,
            lines: Mutex::new(vec![]),
            disk_meter: Mutex::new(None),
            registered: Mutex::new(HashSet::new()),
            conditions: watch::channel(BTreeSet::new()).0,
        }
    }

    fn cfg(&self) -> DriverConfig {
        self.cfg.lock().clone()
    }

    pub(super) fn conditions(&self) -> watch::Receiver<BTreeSet<NodeCondition>> {
        self.conditions.subscribe()
    }

    pub(super) fn set_disk_meter(&self, meter: Arc<dyn DiskUsageMeter>) {
        *self.disk_meter.lock() = Some(meter);
    }

    pub(super) fn reconfigure(&self, eviction: EvictionConfig) {
        self.cfg.lock().eviction = eviction;
        self.program_lines();
    }

    /// (housekeeping, plan) periods.
    pub(super) fn periods(&self) -> (Duration, Duration) {
        let c = self.cfg.lock();
        (c.housekeeping_interval, c.plan_interval)
    }

    /// Registers the pods, programs the lines and makes the first plan.
    pub(super) fn start(&self) {
        // kubepods' line needs kubepods registered.
        self.sync_registrations();
        let cfg = self.cfg();
        self.cache.start(cfg.reclaim_before_eviction, &cfg.node.kubepods_cgroup, &self.shared, &*self.edges.source);
        self.program_lines();
        self.rank();
    }

    /// Handles what the reader thread forwarded; returns the crossing's
    /// timestamp when it was one (for the crossing → decision time).
    pub(super) fn on_wake(&self, state: &mut State, wake: Wake) -> Option<u64> {
        match wake {
            Wake::Crossing { at_ns, value, signal, killed, decided_ns, anonymous } => {
                state.crossed(signal, tokio::time::Instant::now().into_std());
                if anonymous {
                    self.cache.anonymous_crossing();
                }
                if let Some(v) = killed {
                    // The reader thread's kill did not wait for the tasks to
                    // stop: one forked while it ran is signalled now.
                    let _ = self.shared.killer.kill_survivors(&v.cgroup);
                    self.record_kill(&v, signal, KillPath::Agent, value, decided_ns.saturating_sub(at_ns));
                }
                Some(at_ns)
            }
            Wake::KernelKill { cgroup, cgroup_id, signal, value, crossing_ns, at_ns } => {
                match self.victim_of(&cgroup) {
                    Some(v) => {
                        let claimed = self.shared.claim(&v, signal.unwrap_or(EvictionSignal::MemoryAvailable));
                        // Survivors (tasks the kernel could not signal from
                        // the crossing's context) go through the cgroup.
                        self.shared.kill(&v, KillPath::Kernel, Some(crossing_ns), Some(at_ns));
                        self.edges.source.kernel_kill_finished(cgroup_id);
                        match (claimed, signal) {
                            (true, Some(signal)) => {
                                self.record_kill(&v, signal, KillPath::Kernel, value, at_ns.saturating_sub(crossing_ns))
                            }
                            (true, None) => warn!(pod = v.name, "the kernel killed for a line the agent no longer has"),
                            (false, _) => {}
                        }
                    }
                    None => {
                        warn!(
                            cgroup,
                            "the kernel killed a victim the agent no longer plans for; killing through the cgroup"
                        );
                        let _ = self.shared.killer.kill_survivors(&cgroup);
                        self.edges.source.kernel_kill_finished(cgroup_id);
                    }
                }
                None
            }
            Wake::CgroupRemoved(cgroup) => {
                self.edges.source.unregister(&cgroup);
                self.registered.lock().remove(&cgroup);
                None
            }
            Wake::Other => None,
        }
    }

    /// The planned (or in-flight) victim whose pod cgroup is `cgroup`.
    fn victim_of(&self, cgroup: &str) -> Option<PlannedVictim> {
        let planned = self.shared.plan.lock().victims.values().flatten().find(|v| v.cgroup == cgroup).cloned();
        planned.or_else(|| {
            self.shared.in_flight.lock().values().find(|f| f.victim.cgroup == cgroup).map(|f| f.victim.clone())
        })
    }

    /// Records a victim killed at a crossing (by the kernel or the fast
    /// path). `used` is the value that crossed the line: the message
    /// reports what the decision saw, not what is left after the kill;
    /// `age_ns` how old the crossing was when the kill was decided.
    fn record_kill(&self, v: &PlannedVictim, signal: EvictionSignal, killed: KillPath, used: u64, age_ns: u64) {
        let cfg = self.cfg();
        let threshold = cfg.eviction.thresholds.iter().find(|t| t.signal == signal && t.is_hard()).cloned().unwrap_or(
            EvictionThreshold {
                signal,
                value: ThresholdValue::Quantity(Quantity::ZERO),
                grace_period: Duration::ZERO,
                min_reclaim: None,
            },
        );
        let capacity = line_capacity(&cfg, signal);
        let observed = Observation { available: capacity as i64 - used as i64, capacity };
        let candidate = match self.edges.pods.eviction_pods().into_iter().find(|p| p.uid == v.uid) {
            Some(p) => candidate(&p, &Snapshot::empty(), None),
            None => Candidate {
                uid: v.uid.clone(),
                namespace: v.namespace.clone(),
                name: v.name.clone(),
                ..Default::default()
            },
        };
        let meter = |cg: &str| self.edges.cgroups.working_set(cg);
        info!(pod = format!("{}/{}", v.namespace, v.name), %signal, killed_by = killed.as_str(), "evicted at the crossing");
        let age = Duration::from_nanos(age_ns);
        self.record(core::victim(&cfg.eviction, &threshold, &observed, &candidate, &meter), signal, killed, age);
    }

    /// The one place an eviction is recorded: counted, logged, and handed
    /// to the pod manager as the request the victim's description makes.
    /// `stats_age` is how old the observation behind the decision was.
    fn record(&self, v: Victim, signal: EvictionSignal, killed: KillPath, stats_age: Duration) {
        self.record_as(v, signal, signal.name(), killed, stats_age);
    }

    /// [`Manager::record`] counted and logged under `name` (a signal of
    /// swiftlet's own, which the pod side treats as `signal`).
    fn record_as(&self, v: Victim, signal: EvictionSignal, name: &str, killed: KillPath, stats_age: Duration) {
        self.metrics.kubelet_evictions.get_or_create(&EvictionSignalLabels { eviction_signal: name.into() }).inc();
        self.metrics.observe_eviction_stats_age(name, stats_age.as_secs_f64());
        info!(
            pod = format!("{}/{}", v.namespace, v.name),
            signal = name,
            killed_by = killed.as_str(),
            "evicting: {}",
            v.message
        );
        self.edges.evictor.evict(EvictionRequest {
            uid: v.uid,
            namespace: v.namespace,
            name: v.name,
            signal,
            grace_period_secs: v.grace_period_secs,
            message: v.message,
            annotations: v.annotations,
            killed,
        });
    }

    /// One full evaluation: observe, decide, kill, record; then the plan
    /// is made again from the same snapshot. Returns when to evaluate again
    /// for soft grace periods.
    pub(super) async fn evaluate(&self, state: &mut State, crossing_ns: Option<u64>) -> Option<tokio::time::Instant> {
        let cfg = self.cfg();
        let pods = self.sync_registrations();
        let mut snapshot = match self.edges.source.snapshot() {
            Ok(s) => s,
            Err(e) => {
                warn!("eviction: cannot read signals: {e}");
                return None;
            }
        };
        let reclaim_first = self.cache.on(&self.shared);
        let anonymous = reclaim_first && self.cache.growth_was_anonymous(&cfg.node.kubepods_cgroup);
        let mut obs = self.observe(&snapshot, &cfg);
        let tasks = needs_tasks(&cfg).then_some(&*self.edges.cgroups);
        let candidates = self.candidates(&pods, &snapshot, tasks);
        let meter = |cg: &str| self.edges.cgroups.working_set(cg);
        let now = || tokio::time::Instant::now().into_std();
        let mut eval = state.evaluate(&cfg.eviction, now(), &obs, &candidates, false, &meter);
        if let Action::ReclaimNodeResources(t) = &eval.action {
            // The condition first, as the kubelet: reclaim can take a while.
            self.publish(&obs, &eval);
            info!(signal = %t.signal, "disk pressure: reclaiming dead containers and unused images first");
            if let Some(r) = &self.edges.reclaimer {
                r.reclaim(t.signal).await;
            }
            let after = self.edges.source.snapshot().unwrap_or_else(|_| snapshot.clone());
            let obs = self.observe(&after, &cfg);
            let candidates = self.with_disk_usage(candidates.clone()).await;
            eval = state.evaluate(&cfg.eviction, now(), &obs, &candidates, true, &meter);
        }
        // How old the figures behind an eviction are: the kernel event's
        // age when a crossing woke this evaluation, else the snapshot's.
        let mut observed = ObservedAt::from(crossing_ns, &snapshot);
        if let Action::Evict(ev) = &eval.action
            && reclaim_first
            && !anonymous
            && is_memory(ev.threshold.signal)
            && let Some(o) = obs.get(&ev.threshold.signal)
        {
            // The condition first, as for disk: the pressure is real.
            self.publish(&obs, &eval);
            let (threshold, mut observation) = (ev.threshold.clone(), *o);
            // A few rounds: the kernel takes inactive pages first and
            // deactivates active ones as it goes, so one write may bring
            // the working set down by less than asked while there is cache
            // left to give.
            for _ in 0..RECLAIM_ROUNDS {
                if !self.cache.reclaim(&threshold, &observation, &pods) {
                    break;
                }
                // Observe again: evict only if reclaim was not enough.
                snapshot = self.edges.source.snapshot().unwrap_or_else(|_| snapshot.clone());
                self.cache.rebase(&cfg.node.kubepods_cgroup);
                obs = self.observe(&snapshot, &cfg);
                let candidates = self.candidates(&pods, &snapshot, tasks);
                eval = state.evaluate(&cfg.eviction, now(), &obs, &candidates, false, &meter);
                observed = ObservedAt::from(None, &snapshot);
                match (&eval.action, obs.get(&threshold.signal)) {
                    (Action::Evict(ev), Some(o)) if ev.threshold.signal == threshold.signal => observation = *o,
                    _ => break,
                }
            }
        }
        if let Some(at) = crossing_ns {
            self.metrics.crossing_to_decision.observe(monotonic_ns().saturating_sub(at) as f64 / 1e9);
        }
        self.publish(&obs, &eval);
        if let Action::Evict(ev) = eval.action {
            match ev.victim {
                None => {
                    self.metrics.evictions_without_victim.inc();
                    warn!(signal = %ev.threshold.signal, "eviction threshold met but no pod can be evicted");
                }
                Some(v) => {
                    if let Some(p) = pods.iter().find(|p| p.uid == v.uid)
                        && let planned = PlannedVictim::new(p)
                        && self.shared.claim(&planned, ev.threshold.signal)
                    {
                        let killed = if ev.threshold.is_hard() {
                            self.shared.kill(&planned, KillPath::Agent, crossing_ns, None);
                            KillPath::Agent
                        } else {
                            KillPath::Graceful
                        };
                        self.record(v, ev.threshold.signal, killed, observed.age());
                    }
                }
            }
        }
        self.evict_for_pressure(&cfg, &pods, &candidates, &meter);
        self.rank_from(&pods, &snapshot);
        eval.next_deadline.map(tokio::time::Instant::from_std)
    }

    /// The memory.pressure signal fired: one pod, ranked as for memory,
    /// unless one is still being evicted (see `pressure::victim`).
    fn evict_for_pressure(
        &self,
        cfg: &DriverConfig,
        pods: &[Arc<EvictionPod>],
        candidates: &[Candidate],
        meter: &dyn core::ContainerMemory,
    ) {
        let (firing, fired_at) = {
            let mut p = self.shared.pressure.lock();
            (p.firing.take(), p.fired_at.take())
        };
        let Some(firing) = firing else { return };
        let stats_age = fired_at.map(|t| t.elapsed()).unwrap_or_default();
        let Some(v) = pressure::victim(&cfg.eviction, &firing, candidates, meter) else {
            debug!("memory.pressure fired: no pod to evict now (one is still being evicted, or none can be)");
            return;
        };
        let Some(p) = pods.iter().find(|p| p.uid == v.uid) else { return };
        let planned = PlannedVictim::new(p);
        if !self.shared.claim(&planned, EvictionSignal::MemoryAvailable) {
            return;
        }
        let killed = if firing.grace_period.is_zero() {
            self.shared.kill(&planned, KillPath::Agent, None, None);
            KillPath::Agent
        } else {
            KillPath::Graceful
        };
        self.record_as(v, EvictionSignal::MemoryAvailable, pressure::SIGNAL_NAME, killed, stats_age);
    }

    /// Ranks the pods for every kernel line (the plan): published for the
    /// fast path, and its first victims handed to the kernel.
    pub(super) fn rank(&self) {
        let pods = self.sync_registrations();
        match self.edges.source.snapshot() {
            Ok(snapshot) => self.rank_from(&pods, &snapshot),
            Err(e) => debug!("no plan this time: cannot read signals: {e}"),
        }
    }

    fn rank_from(&self, pods: &[Arc<EvictionPod>], snapshot: &Snapshot) {
        let cfg = self.cfg();
        // Only pods under kubepods are ever planned: the kernel kills what
        // the plan names, so nothing else may get there.
        let kubepods = format!("{}/", cfg.node.kubepods_cgroup);
        let lines = self.lines.lock().clone();
        let tasks = lines.iter().any(|l| l.eviction_signal == EvictionSignal::PidAvailable);
        let reader = tasks.then_some(&*self.edges.cgroups);
        // The ranking reads no names: the pods are copied nowhere.
        let candidates: Vec<(Candidate, &Arc<EvictionPod>)> = pods
            .iter()
            .filter(|p| p.cgroup.starts_with(&kubepods) && !p.critical)
            .map(|p| (ranking_candidate(p, snapshot, reader), p))
            .collect();
        let ranked_ns = monotonic_ns();
        let mut victims = HashMap::new();
        for line in &lines {
            let signal = line.eviction_signal;
            let (order, max_age): (fn(&Candidate, &Candidate) -> std::cmp::Ordering, _) = match signal {
                EvictionSignal::PidAvailable => (ranking::by_tasks, Some(PID_PLAN_MAX_AGE)),
                _ => (ranking::by_memory, None),
            };
            let mut ranked: Vec<&(Candidate, &Arc<EvictionPod>)> = candidates.iter().collect();
            ranked.sort_by(|a, b| order(&a.0, &b.0));
            let list: Vec<PlannedVictim> = ranked.iter().map(|(_, p)| PlannedVictim::new(p)).collect();
            // The kernel gets the first victim, unless one evicted for this
            // signal is still dying (see `Shared::dying_for`).
            let dying = self.shared.dying_for(signal);
            let victim = list.first().filter(|_| cfg.kernel_eviction && !dying).map(|v| KernelVictim {
                cgroup: &v.cgroup,
                tgid: self.edges.cgroups.largest_process(&v.cgroup).unwrap_or(0),
                planned_ns: ranked_ns,
                max_age,
            });
            if let Err(e) = self.edges.source.set_kernel_victim(&line.target, line.signal, victim) {
                debug!("cannot hand the {signal} victim to the kernel: {e}");
            }
            victims.insert(signal, list);
        }
        *self.shared.plan.lock() = Arc::new(Plan { lines, victims, ranked_ns });
    }

    fn observe(&self, snapshot: &Snapshot, cfg: &DriverConfig) -> Observations {
        let nodefs = node::statfs(&cfg.nodefs_path).ok();
        let imagefs = match &cfg.imagefs_path {
            Some(p) => node::statfs(p).ok(),
            None => nodefs,
        };
        observe(snapshot, &cfg.node, FsFigures { nodefs, imagefs })
    }

    /// Candidates for every pod, plus the in-flight victims the pod manager
    /// no longer lists, whose memory is still on its way out.
    fn candidates(
        &self,
        pods: &[Arc<EvictionPod>],
        snapshot: &Snapshot,
        tasks: Option<&dyn super::CgroupReader>,
    ) -> Vec<Candidate> {
        let mut out: Vec<Candidate> = pods
            .iter()
            .map(|p| Candidate { in_flight: self.shared.is_in_flight(&p.uid), ..candidate(p, snapshot, tasks) })
            .collect();
        for (uid, f) in self.shared.in_flight.lock().iter() {
            if pods.iter().any(|p| &p.uid == uid) {
                continue;
            }
            let usage = snapshot.cgroups.get(&f.victim.cgroup).copied().unwrap_or_default();
            out.push(Candidate {
                uid: uid.clone(),
                namespace: f.victim.namespace.clone(),
                name: f.victim.name.clone(),
                memory: Usage { request: 0, usage: usage.working_set_bytes },
                tasks: tasks.and_then(|r| r.tasks(&f.victim.cgroup)).unwrap_or(usage.processes),
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
    fn sync_registrations(&self) -> Vec<Arc<EvictionPod>> {
        let pods = self.edges.pods.eviction_pods();
        let kubepods = self.cfg.lock().node.kubepods_cgroup.clone();
        // The pod manager is asked without the in-flight lock held: it
        // takes its own, and evictions reach it from under neither.
        let unreported: HashSet<String> = {
            let uids: Vec<String> = self.shared.in_flight.lock().keys().cloned().collect();
            uids.into_iter().filter(|uid| !self.edges.evictor.termination_reported(uid)).collect()
        };
        let released = {
            let mut in_flight = self.shared.in_flight.lock();
            let before = in_flight.len();
            in_flight.retain(|uid, f| {
                let listed = pods.iter().any(|p| &p.uid == uid);
                let dying = listed || self.edges.cgroups.has_processes(&f.victim.cgroup);
                let awaiting_report = unreported.contains(uid) && f.since.elapsed() < POD_CLEANUP_TIMEOUT;
                (dying || awaiting_report) && f.since.elapsed() < IN_FLIGHT_FOR
            });
            before - in_flight.len()
        };
        if released > 0 {
            // The next victim, if one is still needed, is due now rather
            // than at the next housekeeping pass.
            let _ = self.shared.wake.send(Wake::Other);
        }
        // Runs every plan interval: the common case, nothing to change,
        // allocates nothing per pod.
        let in_flight: Vec<String> = self.shared.in_flight.lock().values().map(|f| f.victim.cgroup.clone()).collect();
        let mut want: HashSet<&str> = pods.iter().map(|p| p.cgroup.as_str()).collect();
        want.extend(in_flight.iter().map(String::as_str));
        want.insert(kubepods.as_str());
        let mut registered = self.registered.lock();
        for cg in want.iter().filter(|cg| !registered.contains(**cg)).copied().collect::<Vec<_>>() {
            let kind = if cg == kubepods { CgroupKind::Kubepods } else { CgroupKind::Pod };
            match self.edges.source.register(cg, kind) {
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
                self.edges.source.unregister(cg);
            }
            keep
        });
        pods
    }

    fn program_lines(&self) {
        let cfg = self.cfg();
        let lines = kernel_lines(&cfg.eviction.thresholds, &cfg.node);
        let old = std::mem::replace(&mut *self.lines.lock(), lines.clone());
        for l in &old {
            if !lines.iter().any(|n| n.target == l.target && n.signal == l.signal) {
                let _ = self.edges.source.set_threshold(&l.target, l.signal, None);
                let _ = self.edges.source.set_kernel_victim(&l.target, l.signal, None);
            }
        }
        for l in &lines {
            if let Err(e) = self.edges.source.set_threshold(&l.target, l.signal, Some(l.threshold)) {
                warn!("cannot program the {} line: {e}", l.eviction_signal);
            }
        }
        for t in &cfg.eviction.thresholds {
            if !matches!(
                t.signal,
                EvictionSignal::MemoryAvailable
                    | EvictionSignal::AllocatableMemoryAvailable
                    | EvictionSignal::PidAvailable
            ) {
                continue;
            }
            self.metrics
                .threshold
                .get_or_create(&ThresholdLabels {
                    signal: t.signal.name().into(),
                    kind: if t.is_hard() { "hard" } else { "soft" }.into(),
                })
                .set(t.value.resolve(line_capacity(&cfg, t.signal)) as i64);
        }
    }

    /// The candidates with their measured disk bytes and inodes, for the
    /// disk-pressure ranking.
    async fn with_disk_usage(&self, mut candidates: Vec<Candidate>) -> Vec<Candidate> {
        let Some(meter) = self.disk_meter.lock().clone() else { return candidates };
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
        // The memory.pressure signal's condition joins the thresholds'.
        let mut conditions = eval.conditions.clone();
        if self.shared.pressure.lock().condition {
            conditions.insert(NodeCondition::MemoryContention);
        }
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
                .set(i64::from(conditions.contains(&c)));
        }
        for (name, v) in self.edges.source.counters() {
            self.metrics.signal_counters.get_or_create(&crate::metrics::NameLabels { name: name.into() }).set(v as i64);
        }
        self.conditions.send_if_modified(|c| {
            if *c != conditions {
                info!(conditions = ?conditions.iter().map(|c| c.type_name()).collect::<Vec<_>>(), "node pressure conditions changed");
                *c = conditions.clone();
                true
            } else {
                false
            }
        });
    }
}

/// When the observation behind an evaluation was made.
#[derive(Clone, Copy)]
enum ObservedAt {
    /// A kernel crossing (CLOCK_MONOTONIC ns, the kernel's timestamp).
    Crossing(u64),
    /// A snapshot of the signal source.
    Snapshot(std::time::Instant),
}

impl ObservedAt {
    fn from(crossing_ns: Option<u64>, snapshot: &Snapshot) -> ObservedAt {
        crossing_ns.map_or(ObservedAt::Snapshot(snapshot.taken_at), ObservedAt::Crossing)
    }

    fn age(self) -> Duration {
        match self {
            ObservedAt::Crossing(at) => Duration::from_nanos(monotonic_ns().saturating_sub(at)),
            ObservedAt::Snapshot(at) => at.elapsed(),
        }
    }
}

/// Whether any threshold is on pid.available, which ranks pods by tasks.
fn needs_tasks(cfg: &DriverConfig) -> bool {
    cfg.eviction.thresholds.iter().any(|t| t.signal == EvictionSignal::PidAvailable)
}

/// What a line's percentages are of, and what its used amount is taken from.
fn line_capacity(cfg: &DriverConfig, signal: EvictionSignal) -> u64 {
    match signal {
        EvictionSignal::MemoryAvailable => cfg.node.memory_capacity,
        EvictionSignal::AllocatableMemoryAvailable => cfg.node.allocatable_memory,
        EvictionSignal::PidAvailable => cfg.node.pid_limit,
        _ => 0,
    }
}

/// What the memory and PID rankings compare: the pod's priority, memory
/// and tasks (threads from `tasks` when given, else its processes),
/// without its names.
fn ranking_candidate(p: &EvictionPod, snapshot: &Snapshot, tasks: Option<&dyn super::CgroupReader>) -> Candidate {
    let usage = snapshot.cgroups.get(&p.cgroup).copied().unwrap_or_default();
    Candidate {
        priority: p.priority,
        evictable: !p.critical,
        memory: Usage { request: p.memory_request, usage: usage.working_set_bytes },
        tasks: tasks.and_then(|r| r.tasks(&p.cgroup)).unwrap_or(usage.processes),
        ..Default::default()
    }
}

/// A pod as the decision sees it, from a snapshot: what the rankings
/// compare (`ranking_candidate`) plus its names, disk use and containers
/// (for messages).
fn candidate(p: &EvictionPod, snapshot: &Snapshot, tasks: Option<&dyn super::CgroupReader>) -> Candidate {
    let inodes = snapshot.cgroups.get(&p.cgroup).and_then(|u| u.inodes);
    Candidate {
        uid: p.uid.clone(),
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        termination_grace_secs: p.termination_grace_secs,
        disk: Usage { request: p.ephemeral_storage_request, usage: p.disk_usage.unwrap_or(0) },
        inodes: p.inodes_used.or(inodes.map(|i| i.max(0) as u64)).unwrap_or(0),
        containers: p
            .containers
            .iter()
            .map(|c| ContainerRef { name: c.name.clone(), memory_request: c.memory_request, cgroup: c.cgroup.clone() })
            .collect(),
        in_flight: false,
        ..ranking_candidate(p, snapshot, tasks)
    }
}
