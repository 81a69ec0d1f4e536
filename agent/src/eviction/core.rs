//! The eviction decision, as a pure state machine: observations and pods
//! in, node conditions and an action out. No I/O and no clock: the caller
//! passes `now`, so every rule is table-tested.
//!
//! It follows the kubelet's `synchronize`: thresholds met now (plus those
//! met before that have not yet recovered their minimum reclaim) drive the
//! node conditions, held for the pressure transition period; soft
//! thresholds act only after their grace period; memory is handled first;
//! disk pressure reclaims node-level resources before evicting. Unlike the
//! kubelet, which evicts one pod per 10 s round, it picks in one go as many
//! pods as the projection says are needed to get back above threshold +
//! minimum reclaim, and no more.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::{Duration, Instant},
};

use super::{
    ranking::{self, Candidate},
    signal::{EvictionSignal, EvictionThreshold, NodeCondition},
};
use crate::quantity::format_bytes;

/// Reads a container's memory working set, for the messages of the pods
/// evicted (the only ones whose containers are measured). None when the
/// container's cgroup cannot be read.
pub trait ContainerMemory {
    fn working_set(&self, container_cgroup: &str) -> Option<u64>;
}

impl<F: Fn(&str) -> Option<u64>> ContainerMemory for F {
    fn working_set(&self, container_cgroup: &str) -> Option<u64> {
        self(container_cgroup)
    }
}

/// What a signal looks like now: how much is available and of what total
/// (the base for percentage thresholds). Available may be negative when
/// usage exceeds capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    pub available: i64,
    pub capacity: u64,
}

pub type Observations = BTreeMap<EvictionSignal, Observation>;

/// The eviction manager's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct EvictionConfig {
    pub thresholds: Vec<EvictionThreshold>,
    /// How long a node condition stays true after its signal recovered.
    pub pressure_transition_period: Duration,
    /// evictionMaxPodGracePeriod: caps the pod's own grace period in soft
    /// evictions; 0 means the pod's own.
    pub max_pod_grace_period_secs: u64,
}

/// A threshold's identity: a signal has at most one hard and one soft.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ThresholdKey {
    pub signal: EvictionSignal,
    pub hard: bool,
}

impl ThresholdKey {
    fn of(t: &EvictionThreshold) -> ThresholdKey {
        ThresholdKey { signal: t.signal, hard: t.is_hard() }
    }
}

/// A pod chosen for eviction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Victim {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// 0 for hard thresholds (kill now).
    pub grace_period_secs: u64,
    /// The status message (phase Failed, reason Evicted).
    pub message: String,
    /// The kubelet's annotations on the evicted pod's status:
    /// offending_containers, offending_containers_usage, starved_resource.
    pub annotations: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Eviction {
    pub threshold: EvictionThreshold,
    pub observed: Observation,
    /// The threshold in the signal's unit.
    pub threshold_value: u64,
    /// Empty when nothing evictable is left (reported, not an error).
    pub victims: Vec<Victim>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    None,
    /// Disk pressure: delete dead containers and unused images, then
    /// evaluate again with `node_reclaim_attempted`.
    ReclaimNodeResources(EvictionThreshold),
    Evict(Eviction),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    /// Conditions to report (including those held by the transition period).
    pub conditions: BTreeSet<NodeCondition>,
    /// Thresholds met with their grace periods satisfied.
    pub met: Vec<EvictionThreshold>,
    /// The earliest time a soft threshold's grace period ends, so the
    /// caller can evaluate again then.
    pub next_deadline: Option<Instant>,
    pub action: Action,
}

/// What the manager remembers between evaluations.
#[derive(Clone, Debug, Default)]
pub struct State {
    first_observed: HashMap<ThresholdKey, Instant>,
    condition_last_observed: HashMap<NodeCondition, Instant>,
    /// Thresholds acted on, kept until their minimum reclaim is recovered.
    met: Vec<ThresholdKey>,
}

/// The threshold in the signal's unit.
pub fn threshold_value(t: &EvictionThreshold, obs: &Observation) -> u64 {
    t.value.resolve(obs.capacity)
}

fn min_reclaim_value(t: &EvictionThreshold, obs: &Observation) -> u64 {
    t.min_reclaim.as_ref().map_or(0, |m| m.resolve(obs.capacity))
}

/// `available < threshold` (+ minimum reclaim while recovering).
fn is_met(t: &EvictionThreshold, obs: &Observation, with_min_reclaim: bool) -> bool {
    let mut line = threshold_value(t, obs) as i128;
    if with_min_reclaim {
        line += min_reclaim_value(t, obs) as i128;
    }
    (obs.available as i128) < line
}

/// Memory first, then the rest in signal order (the kubelet's
/// byEvictionPriority).
fn eviction_priority(s: EvictionSignal) -> u8 {
    match s {
        EvictionSignal::MemoryAvailable | EvictionSignal::AllocatableMemoryAvailable => 0,
        _ => 1,
    }
}

impl State {
    /// The kernel saw a hard threshold of `signal` crossed at `now`: its
    /// condition holds from then for the transition period, even when the
    /// kill at the crossing brought the signal back before the next
    /// evaluation could observe it (the decision itself stays on what is
    /// observed then).
    pub fn crossed(&mut self, signal: EvictionSignal, now: Instant) {
        self.condition_last_observed.insert(signal.condition(), now);
    }

    pub fn evaluate(
        &mut self,
        cfg: &EvictionConfig,
        now: Instant,
        obs: &Observations,
        candidates: &[Candidate],
        node_reclaim_attempted: bool,
        containers: &dyn ContainerMemory,
    ) -> Evaluation {
        // Thresholds met now, regardless of grace period...
        let mut current: Vec<&EvictionThreshold> =
            cfg.thresholds.iter().filter(|t| obs.get(&t.signal).is_some_and(|o| is_met(t, o, false))).collect();
        // ...plus those acted on before that have not recovered their
        // minimum reclaim yet.
        for t in &cfg.thresholds {
            let key = ThresholdKey::of(t);
            if self.met.contains(&key)
                && !current.iter().any(|c| ThresholdKey::of(c) == key)
                && obs.get(&t.signal).is_some_and(|o| is_met(t, o, true))
            {
                current.push(t);
            }
        }

        let current_keys: BTreeSet<ThresholdKey> = current.iter().map(|t| ThresholdKey::of(t)).collect();
        self.first_observed.retain(|k, _| current_keys.contains(k));
        for k in &current_keys {
            self.first_observed.entry(*k).or_insert(now);
        }

        for t in &current {
            self.condition_last_observed.insert(t.signal.condition(), now);
        }
        self.condition_last_observed
            .retain(|_, last| now.saturating_duration_since(*last) < cfg.pressure_transition_period);
        let mut conditions: BTreeSet<NodeCondition> = self.condition_last_observed.keys().copied().collect();
        // A condition observed right now holds even with a zero transition period.
        conditions.extend(current.iter().map(|t| t.signal.condition()));

        let mut next_deadline: Option<Instant> = None;
        let mut met: Vec<EvictionThreshold> = vec![];
        for t in &current {
            let since = self.first_observed[&ThresholdKey::of(t)];
            let due = since + t.grace_period;
            if due <= now {
                met.push((*t).clone());
            } else {
                next_deadline = Some(next_deadline.map_or(due, |d: Instant| d.min(due)));
            }
        }
        met.sort_by_key(|t| (eviction_priority(t.signal), t.signal, !t.is_hard()));
        self.met = met.iter().map(ThresholdKey::of).collect();

        let action = match met.first() {
            None => Action::None,
            Some(t) => decide(cfg, t, &obs[&t.signal], candidates, node_reclaim_attempted, containers),
        };
        Evaluation { conditions, met, next_deadline, action }
    }
}

fn decide(
    cfg: &EvictionConfig,
    t: &EvictionThreshold,
    obs: &Observation,
    candidates: &[Candidate],
    node_reclaim_attempted: bool,
    containers: &dyn ContainerMemory,
) -> Action {
    let disk = t.signal.condition() == NodeCondition::DiskPressure;
    if disk && !node_reclaim_attempted {
        return Action::ReclaimNodeResources(t.clone());
    }
    let value = threshold_value(t, obs);
    let usage: fn(&Candidate) -> u64 = match t.signal {
        EvictionSignal::MemoryAvailable | EvictionSignal::AllocatableMemoryAvailable => |c| c.memory.usage,
        EvictionSignal::PidAvailable => |c| c.tasks,
        EvictionSignal::NodeFsInodesFree | EvictionSignal::ImageFsInodesFree => |c| c.inodes,
        EvictionSignal::NodeFsAvailable | EvictionSignal::ImageFsAvailable => |c| c.disk.usage,
    };
    let order: fn(&Candidate, &Candidate) -> std::cmp::Ordering = match t.signal {
        EvictionSignal::MemoryAvailable | EvictionSignal::AllocatableMemoryAvailable => ranking::by_memory,
        EvictionSignal::PidAvailable => ranking::by_tasks,
        EvictionSignal::NodeFsInodesFree | EvictionSignal::ImageFsInodesFree => ranking::by_inodes,
        EvictionSignal::NodeFsAvailable | EvictionSignal::ImageFsAvailable => ranking::by_disk,
    };
    // How much must come back: up to the line plus the minimum reclaim.
    let need = (value as i128 + min_reclaim_value(t, obs) as i128 - obs.available as i128).max(1);
    let mut reclaimed: i128 = candidates.iter().filter(|c| c.in_flight).map(|c| usage(c) as i128).sum();
    let mut ranked: Vec<&Candidate> = candidates.iter().filter(|c| c.evictable && !c.in_flight).collect();
    ranked.sort_by(|a, b| order(a, b));
    let mut victims = vec![];
    for c in ranked {
        if reclaimed >= need {
            break;
        }
        reclaimed += usage(c) as i128;
        victims.push(victim(cfg, t, obs, c, containers));
    }
    if victims.is_empty() && reclaimed >= need {
        // Pods already being evicted will bring the signal back.
        return Action::None;
    }
    Action::Evict(Eviction { threshold: t.clone(), observed: *obs, threshold_value: value, victims })
}

/// The pod `c` as a victim of `t`: its grace period, and the kubelet's
/// message and annotations (naming the containers over their memory
/// request, read through `containers`). The one place an eviction is
/// described, for the decision here and for the kills at a crossing.
pub fn victim(
    cfg: &EvictionConfig,
    t: &EvictionThreshold,
    obs: &Observation,
    c: &Candidate,
    containers: &dyn ContainerMemory,
) -> Victim {
    let grace_period_secs = if t.is_hard() {
        0
    } else if cfg.max_pod_grace_period_secs > 0 {
        c.termination_grace_secs.min(cfg.max_pod_grace_period_secs)
    } else {
        c.termination_grace_secs
    };
    let (message, annotations) = message(t, obs, threshold_value(t, obs), c, containers);
    Victim {
        uid: c.uid.clone(),
        namespace: c.namespace.clone(),
        name: c.name.clone(),
        grace_period_secs,
        message,
        annotations,
    }
}

fn format_amount(signal: EvictionSignal, v: i128) -> String {
    match signal.resource() {
        "memory" | "ephemeral-storage" => {
            let s = format_bytes(v.unsigned_abs().min(u64::MAX as u128) as u64);
            if v < 0 { format!("-{s}") } else { s }
        }
        _ => v.to_string(),
    }
}

/// The kubelet's eviction message, with the signal named, and its
/// annotations on the Evicted event.
fn message(
    t: &EvictionThreshold,
    obs: &Observation,
    value: u64,
    c: &Candidate,
    containers: &dyn ContainerMemory,
) -> (String, BTreeMap<String, String>) {
    let resource = t.signal.resource();
    let mut msg = format!(
        "The node was low on resource: {resource}. Threshold quantity: {}, available: {}. Signal: {}. ",
        format_amount(t.signal, value as i128),
        format_amount(t.signal, obs.available as i128),
        t.signal
    );
    let mut annotations = BTreeMap::new();
    if resource == "memory" {
        let offending: Vec<(&str, ranking::Usage)> = c
            .containers
            .iter()
            .map(|k| {
                let usage = k.cgroup.as_deref().and_then(|cg| containers.working_set(cg)).unwrap_or(0);
                (k.name.as_str(), ranking::Usage { request: k.memory_request, usage })
            })
            .filter(|(_, u)| u.exceeds_request())
            .collect();
        for (name, u) in &offending {
            msg.push_str(&format!(
                "Container {name} was using {}, request is {}, has larger consumption of {resource}. ",
                format_bytes(u.usage),
                format_bytes(u.request)
            ));
        }
        annotations.insert(
            "offending_containers".into(),
            offending.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(","),
        );
        annotations.insert(
            "offending_containers_usage".into(),
            offending.iter().map(|(_, u)| format_bytes(u.usage)).collect::<Vec<_>>().join(","),
        );
    }
    annotations.insert("starved_resource".into(), resource.into());
    (msg, annotations)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        eviction::{
            ranking::{ContainerRef, Usage},
            signal::ThresholdValue,
        },
        quantity::Quantity,
    };

    const MI: u64 = 1 << 20;

    fn hard(signal: EvictionSignal, value: ThresholdValue) -> EvictionThreshold {
        EvictionThreshold { signal, value, grace_period: Duration::ZERO, min_reclaim: None }
    }

    fn mi(n: u64) -> ThresholdValue {
        ThresholdValue::Quantity(Quantity::from_units((n * MI) as i64))
    }

    fn cfg(thresholds: Vec<EvictionThreshold>) -> EvictionConfig {
        EvictionConfig {
            thresholds,
            pressure_transition_period: Duration::from_secs(300),
            max_pod_grace_period_secs: 0,
        }
    }

    fn mem(available_mi: i64) -> Observations {
        [(EvictionSignal::MemoryAvailable, Observation { available: available_mi * MI as i64, capacity: 4096 * MI })]
            .into()
    }

    fn pod(name: &str, priority: i32, request_mi: u64, usage_mi: u64) -> Candidate {
        Candidate {
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            name: name.into(),
            priority,
            evictable: true,
            termination_grace_secs: 30,
            memory: Usage { request: request_mi * MI, usage: usage_mi * MI },
            containers: vec![ContainerRef {
                name: "c".into(),
                memory_request: request_mi * MI,
                cgroup: Some(format!("{usage_mi}")),
            }],
            ..Default::default()
        }
    }

    /// Container cgroups in these tests are named after their usage in MiB.
    fn usage(cgroup: &str) -> Option<u64> {
        cgroup.parse::<u64>().ok().map(|mi| mi * MI)
    }

    fn victims(e: &Evaluation) -> Vec<String> {
        match &e.action {
            Action::Evict(ev) => ev.victims.iter().map(|v| v.name.clone()).collect(),
            _ => vec![],
        }
    }

    #[test]
    fn hard_threshold_table() {
        let t0 = Instant::now();
        // (available MiB, expected condition, expected victims)
        let cases: &[(i64, bool, &[&str])] = &[
            (600, false, &[]),
            (500, false, &[]),                   // at the line: not below it
            (499, true, &["hog"]),               // 1 MiB short: the top-ranked pod only
            (100, true, &["hog"]),               // hog's 600 MiB covers 400 MiB of need
            (-200, true, &["hog", "burstable"]), // 700 needed: hog 600 + burstable 300
        ];
        for (avail, pressure, want) in cases {
            let mut st = State::default();
            let pods = [pod("hog", 0, 0, 600), pod("burstable", 0, 100, 300), pod("guaranteed", 0, 500, 500)];
            let e = st.evaluate(
                &cfg(vec![hard(EvictionSignal::MemoryAvailable, mi(500))]),
                t0,
                &mem(*avail),
                &pods,
                false,
                &usage,
            );
            assert_eq!(e.conditions.contains(&NodeCondition::MemoryPressure), *pressure, "available {avail}Mi");
            assert_eq!(victims(&e), *want, "available {avail}Mi");
        }
    }

    #[test]
    fn percentages_resolve_against_capacity() {
        let t = hard(EvictionSignal::MemoryAvailable, ThresholdValue::Percentage(0.10));
        let mut st = State::default();
        // capacity 4096Mi → line at 409.6Mi
        let e = st.evaluate(&cfg(vec![t.clone()]), Instant::now(), &mem(410), &[pod("a", 0, 0, 10)], false, &usage);
        assert_eq!(e.action, Action::None);
        let e = st.evaluate(&cfg(vec![t]), Instant::now(), &mem(409), &[pod("a", 0, 0, 10)], false, &usage);
        assert_eq!(victims(&e), ["a"]);
    }

    #[test]
    fn soft_threshold_waits_for_grace_and_caps_pod_grace() {
        let soft = EvictionThreshold {
            signal: EvictionSignal::MemoryAvailable,
            value: mi(1000),
            grace_period: Duration::from_secs(30),
            min_reclaim: None,
        };
        let mut c = cfg(vec![soft]);
        c.max_pod_grace_period_secs = 10;
        let mut st = State::default();
        let t0 = Instant::now();
        let pods = [pod("hog", 0, 0, 600)];
        let e = st.evaluate(&c, t0, &mem(900), &pods, false, &usage);
        assert!(e.conditions.contains(&NodeCondition::MemoryPressure), "the condition does not wait for grace");
        assert_eq!(e.action, Action::None);
        assert_eq!(e.next_deadline, Some(t0 + Duration::from_secs(30)));
        let e = st.evaluate(&c, t0 + Duration::from_secs(29), &mem(900), &pods, false, &usage);
        assert_eq!(e.action, Action::None);
        let e = st.evaluate(&c, t0 + Duration::from_secs(30), &mem(900), &pods, false, &usage);
        let Action::Evict(ev) = e.action else { panic!("expected an eviction") };
        assert_eq!(ev.victims[0].grace_period_secs, 10, "min(pod's 30s, max 10s)");
        // Recovering resets the grace clock.
        let mut st = State::default();
        st.evaluate(&c, t0, &mem(900), &pods, false, &usage);
        st.evaluate(&c, t0 + Duration::from_secs(20), &mem(1500), &pods, false, &usage);
        let e = st.evaluate(&c, t0 + Duration::from_secs(31), &mem(900), &pods, false, &usage);
        assert_eq!(e.action, Action::None, "grace restarts after the signal recovered");
    }

    #[test]
    fn min_reclaim_keeps_the_threshold_met_until_recovered() {
        let mut t = hard(EvictionSignal::MemoryAvailable, mi(500));
        t.min_reclaim = Some(mi(200));
        let c = cfg(vec![t]);
        let mut st = State::default();
        let now = Instant::now();
        let pods = [pod("a", 0, 0, 100), pod("b", 0, 0, 100), pod("c", 0, 0, 100)];
        // 50 below the line + 200 reclaim = 250 needed: three pods of 100.
        let e = st.evaluate(&c, now, &mem(450), &pods, false, &usage);
        assert_eq!(victims(&e).len(), 3);
        // Back above the line but not above line + reclaim: still met.
        let e = st.evaluate(&c, now, &mem(600), &[pod("d", 0, 0, 300)], false, &usage);
        assert_eq!(victims(&e), ["d"]);
        // Above line + reclaim: recovered.
        let e = st.evaluate(&c, now, &mem(701), &[pod("d", 0, 0, 300)], false, &usage);
        assert_eq!(e.action, Action::None);
        assert!(e.met.is_empty());
    }

    #[test]
    fn transition_period_holds_the_condition() {
        let c = cfg(vec![hard(EvictionSignal::MemoryAvailable, mi(500))]);
        let mut st = State::default();
        let t0 = Instant::now();
        st.evaluate(&c, t0, &mem(100), &[], false, &usage);
        for (secs, held) in [(1, true), (299, true), (300, false), (1000, false)] {
            let e = st.evaluate(&c, t0 + Duration::from_secs(secs), &mem(3000), &[], false, &usage);
            assert_eq!(e.conditions.contains(&NodeCondition::MemoryPressure), held, "{secs}s after recovery");
        }
    }

    #[test]
    fn a_crossing_holds_the_condition_though_the_kill_ended_the_pressure() {
        let c = cfg(vec![hard(EvictionSignal::MemoryAvailable, mi(500))]);
        let mut st = State::default();
        let t0 = Instant::now();
        st.crossed(EvictionSignal::MemoryAvailable, t0);
        // By the evaluation, the victim is dead and memory is back.
        for (secs, held) in [(0, true), (299, true), (300, false)] {
            let e = st.evaluate(&c, t0 + Duration::from_secs(secs), &mem(3000), &[], false, &usage);
            assert_eq!(e.conditions.contains(&NodeCondition::MemoryPressure), held, "{secs}s after the crossing");
            assert_eq!(e.action, Action::None, "nothing more to evict");
        }
    }

    #[test]
    fn in_flight_evictions_count_and_are_not_picked_again() {
        let c = cfg(vec![hard(EvictionSignal::MemoryAvailable, mi(500))]);
        let mut hog = pod("hog", 0, 0, 600);
        hog.in_flight = true;
        let e =
            State::default().evaluate(&c, Instant::now(), &mem(400), &[hog.clone(), pod("b", 0, 0, 50)], false, &usage);
        assert_eq!(e.action, Action::None, "the hog being killed already covers the need");
        let e = State::default().evaluate(&c, Instant::now(), &mem(-400), &[hog, pod("b", 0, 0, 50)], false, &usage);
        assert_eq!(victims(&e), ["b"]);
    }

    #[test]
    fn critical_pods_are_never_evicted() {
        let c = cfg(vec![hard(EvictionSignal::MemoryAvailable, mi(500))]);
        let mut crit = pod("crit", 2_000_001_000, 0, 2000);
        crit.evictable = false;
        let e = State::default().evaluate(&c, Instant::now(), &mem(0), &[crit], false, &usage);
        let Action::Evict(ev) = e.action else { panic!("the threshold is met") };
        assert!(ev.victims.is_empty());
    }

    #[test]
    fn memory_goes_before_disk_and_disk_reclaims_node_resources_first() {
        let disk = hard(EvictionSignal::NodeFsAvailable, ThresholdValue::Percentage(0.10));
        let memt = hard(EvictionSignal::MemoryAvailable, mi(500));
        let c = cfg(vec![disk.clone(), memt]);
        let mut obs = mem(100);
        obs.insert(EvictionSignal::NodeFsAvailable, Observation { available: 5, capacity: 100 });
        let e = State::default().evaluate(&c, Instant::now(), &obs, &[pod("a", 0, 0, 600)], false, &usage);
        assert!(matches!(&e.action, Action::Evict(ev) if ev.threshold.signal == EvictionSignal::MemoryAvailable));
        assert!(
            e.conditions.contains(&NodeCondition::DiskPressure)
                && e.conditions.contains(&NodeCondition::MemoryPressure)
        );

        let c = cfg(vec![disk.clone()]);
        let mut st = State::default();
        let mut p = pod("writer", 0, 0, 0);
        p.disk = Usage { request: 0, usage: 50 };
        let e = st.evaluate(&c, Instant::now(), &obs, std::slice::from_ref(&p), false, &usage);
        assert_eq!(e.action, Action::ReclaimNodeResources(disk));
        let e = st.evaluate(&c, Instant::now(), &obs, &[p], true, &usage);
        assert_eq!(victims(&e), ["writer"]);
    }

    #[test]
    fn pid_pressure_picks_by_priority_then_processes() {
        let c = cfg(vec![hard(EvictionSignal::PidAvailable, ThresholdValue::Quantity(Quantity::from_units(1000)))]);
        let obs: Observations =
            [(EvictionSignal::PidAvailable, Observation { available: 900, capacity: 32768 })].into();
        let mut bomb = pod("bomb", 0, 0, 0);
        bomb.tasks = 5000;
        let mut quiet = pod("quiet", 0, 0, 0);
        quiet.tasks = 3;
        let e = State::default().evaluate(&c, Instant::now(), &obs, &[quiet, bomb], false, &usage);
        assert_eq!(victims(&e), ["bomb"]);
        assert!(e.conditions.contains(&NodeCondition::PidPressure));
    }

    #[test]
    fn message_names_signal_threshold_and_usage() {
        let t = hard(EvictionSignal::AllocatableMemoryAvailable, mi(500));
        let obs = Observation { available: 421_844 * 1024, capacity: 1 << 30 };
        let v = victim(&cfg(vec![t.clone()]), &t, &obs, &pod("hog", 0, 0, 600), &usage);
        assert_eq!(
            v.message,
            "The node was low on resource: memory. Threshold quantity: 500Mi, available: 421844Ki. \
             Signal: allocatableMemory.available. Container c was using 600Mi, request is 0, has larger consumption of memory. "
        );
        assert_eq!(v.annotations["offending_containers"], "c");
        assert_eq!(v.annotations["offending_containers_usage"], "600Mi");
        assert_eq!(v.annotations["starved_resource"], "memory");
        assert_eq!(v.grace_period_secs, 0);
        let obs = Observation { available: -(5 * MI as i64), capacity: 1 };
        let v = victim(&cfg(vec![t.clone()]), &t, &obs, &pod("x", 0, 0, 0), &usage);
        assert!(v.message.contains("available: -5Mi."), "{}", v.message);
        // A container within its request is not an offender; a container
        // whose cgroup cannot be read counts as using nothing.
        let unread = |_: &str| None;
        let v = victim(&cfg(vec![t.clone()]), &t, &obs, &pod("y", 0, 100, 50), &unread);
        assert_eq!(
            (v.annotations["offending_containers"].as_str(), v.annotations["offending_containers_usage"].as_str()),
            ("", "")
        );
        // PIDs name the resource, with the annotations the kubelet always sets.
        let t = hard(EvictionSignal::PidAvailable, ThresholdValue::Quantity(Quantity::from_units(1000)));
        let v = victim(
            &cfg(vec![t.clone()]),
            &t,
            &Observation { available: 10, capacity: 32768 },
            &pod("b", 0, 0, 0),
            &usage,
        );
        assert!(v.message.starts_with("The node was low on resource: pids. Threshold quantity: 1000, available: 10."));
        assert_eq!(v.annotations["starved_resource"], "pids");
    }
}
