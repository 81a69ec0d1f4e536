//! The eviction decision, as a pure state machine: observations and pods
//! in, node conditions and an action out. No I/O and no clock: the caller
//! passes `now`, so every rule is table-tested.
//!
//! It follows the kubelet's `synchronize`: thresholds met now (plus those
//! met before that have not yet recovered their minimum reclaim) drive the
//! node conditions, held for the pressure transition period; soft
//! thresholds act only after their grace period; memory is handled first;
//! disk pressure reclaims node-level resources before evicting. As the
//! kubelet, it evicts one pod per round and starts no round while an
//! earlier victim is being cleaned up; unlike the kubelet, whose rounds
//! are 10 s apart, the next round comes as soon as that cleanup ends or a
//! signal event arrives.

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
    /// The round's one victim; None when nothing evictable is left
    /// (reported, not an error).
    pub victim: Option<Victim>,
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
    // As the kubelet: one pod per round, and no round while an earlier
    // victim is still being cleaned up (its processes exiting, its end not
    // yet reported). The next is then ranked on what the last one gave
    // back, and pods fail in the order they were ranked.
    if candidates.iter().any(|c| c.in_flight) {
        return Action::None;
    }
    // A pod that holds none of the starved resource gives nothing back
    // (a disk-pressure ranking on runtime stats a few seconds old can see
    // only zeros): it is never a victim.
    let first = candidates.iter().filter(|c| c.evictable && usage(c) > 0).min_by(|a, b| order(a, b));
    let victim = first.map(|c| victim(cfg, t, obs, c, containers));
    Action::Evict(Eviction { threshold: t.clone(), observed: *obs, threshold_value: value, victim })
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
mod tests;
