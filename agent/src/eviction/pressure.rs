//! swiftlet's memory-pressure eviction signal, as a pure state machine:
//! the `some avg10` of a `memory.pressure` file (percent of the last 10 s
//! in which some task stalled on memory) against a threshold, held for a
//! grace period. No I/O and no clock: the caller passes each reading and
//! `now`, so every rule is table-tested.
//!
//! For the node: held above the threshold for the grace period, the
//! signal *fires* (one pod is evicted) and the node condition is set; while
//! the pressure stays, it fires again after each further grace period (the
//! previous victim's memory has had that long to come back); the condition
//! clears once the pressure has been below the threshold for the pressure
//! transition period. For a pod the same machine says when to warn.
//!
//! avg10 lags: it decays over tens of seconds after the stalls stop (a
//! victim's death included). So avg10 above the threshold only starts the
//! clock; to fire, the share of the grace period actually spent stalled,
//! from the `total` counter at both ends, must be above the threshold too.
//! Without that, the lag alone would evict a second pod after the first
//! had already ended the pressure.

use std::time::{Duration, Instant};

use super::{
    core::{self, ContainerMemory, EvictionConfig, Observation, Victim},
    ranking::{self, Candidate},
    signal::{EvictionSignal, EvictionThreshold, ThresholdValue},
};
use crate::quantity::Quantity;

/// The signal's name in messages, events and metrics.
pub const SIGNAL_NAME: &str = "memory.pressure";

/// While the pressure is above the threshold, it is read again this often
/// even without a trigger: the kernel's trigger says when stalls pile up,
/// not when they stop, and the average decays over seconds.
pub const RECHECK_WHILE_ABOVE: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PressureConfig {
    /// `some avg10` percent (0–100) above which memory counts as contended.
    pub threshold_percent: f64,
    /// How long it must stay above before the signal fires.
    pub grace_period: Duration,
    /// How long the condition is held after the pressure fell back
    /// (evictionPressureTransitionPeriod).
    pub transition_period: Duration,
}

/// One reading of a pressure file's `some` line.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Reading {
    pub avg10: f64,
    /// Cumulative stall, µs.
    pub total_us: u64,
}

/// One scope's memory (the node's, or a pod's).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PressureState {
    /// Since when the readings have been above the threshold, with the
    /// stall total then (restarted at each firing, and when a grace period
    /// ended without enough stall in it).
    above_since: Option<(Instant, u64)>,
    /// The last reading above the threshold while the condition held.
    condition_last_observed: Option<Instant>,
}

/// What one reading means.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    /// The reading is above the threshold.
    pub above: bool,
    /// Held above for the grace period now: evict (node) or warn (pod).
    pub fire: bool,
    /// The node condition holds (fired, and not yet clear for the
    /// transition period).
    pub condition: bool,
    /// How long the readings have been above the threshold.
    pub held_for: Duration,
    /// When to read again without a trigger: the end of the grace period,
    /// a recheck while above, or the end of the transition period.
    pub next_check: Option<Instant>,
}

impl PressureState {
    pub fn observe(&mut self, cfg: &PressureConfig, now: Instant, reading: Reading) -> Verdict {
        let above = reading.avg10 > cfg.threshold_percent;
        let (held_for, stalled_us) = if above {
            let (since, total) = *self.above_since.get_or_insert((now, reading.total_us));
            (now.saturating_duration_since(since), reading.total_us.saturating_sub(total))
        } else {
            self.above_since = None;
            (Duration::ZERO, 0)
        };
        let grace_over = above && held_for >= cfg.grace_period;
        // The share of the grace period spent stalled, as avg10 would show
        // it without its lag.
        let share = if held_for.is_zero() { 100.0 } else { stalled_us as f64 * 100.0 / held_for.as_micros() as f64 };
        let fire = grace_over && (cfg.grace_period.is_zero() || share > cfg.threshold_percent);
        if grace_over {
            // The next firing needs a whole grace period more (measured
            // afresh when this one had too little stall in it).
            self.above_since = Some((now, reading.total_us));
        }
        if fire || (above && self.condition_last_observed.is_some()) {
            self.condition_last_observed = Some(now);
        }
        if !above
            && self
                .condition_last_observed
                .is_some_and(|last| now.saturating_duration_since(last) >= cfg.transition_period)
        {
            self.condition_last_observed = None;
        }
        let condition = self.condition_last_observed.is_some();
        let next_check = if above {
            let grace_ends = self.above_since.map(|(s, _)| s + cfg.grace_period).unwrap_or(now);
            Some(grace_ends.min(now + RECHECK_WHILE_ABOVE).max(now))
        } else {
            self.condition_last_observed.map(|last| last + cfg.transition_period)
        };
        Verdict { above, fire, condition, held_for, next_check }
    }
}

/// The node's signal fired: what the eviction it asks for reports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Firing {
    pub avg10: f64,
    pub threshold_percent: f64,
    /// How long the pressure had been above the threshold.
    pub held_for: Duration,
    /// The signal's grace period: a soft eviction when non-zero (the pod's
    /// own grace period, capped by evictionMaxPodGracePeriod), a hard one
    /// (killed at once) when zero.
    pub grace_period: Duration,
}

/// The one pod to evict for a firing: the first by the kubelet's memory
/// ranking among the evictable pods that hold memory, described as any
/// memory eviction is (its containers over their requests named) but with
/// the signal's own message. None while a pod is still being evicted (its
/// memory is on its way back; the signal fires again if the pressure
/// stays) or when nothing can be evicted.
pub fn victim(
    cfg: &EvictionConfig,
    firing: &Firing,
    candidates: &[Candidate],
    containers: &dyn ContainerMemory,
) -> Option<Victim> {
    if candidates.iter().any(|c| c.in_flight) {
        return None;
    }
    let mut ranked: Vec<&Candidate> = candidates.iter().filter(|c| c.evictable && c.memory.usage > 0).collect();
    ranked.sort_by(|a, b| ranking::by_memory(a, b));
    let c = ranked.first()?;
    // Described as a memory eviction (grace period, offending containers,
    // annotations); the message's first sentences are the signal's.
    let as_memory = EvictionThreshold {
        signal: EvictionSignal::MemoryAvailable,
        value: ThresholdValue::Quantity(Quantity::ZERO),
        grace_period: firing.grace_period,
        min_reclaim: None,
    };
    let mut v = core::victim(cfg, &as_memory, &Observation { available: 0, capacity: 0 }, c, containers);
    let containers_part = v.message.split_once("Signal: memory.available. ").map_or("", |(_, rest)| rest);
    v.message = format!(
        "The node was low on resource: memory. Tasks stalled on memory {:.2}% of the time (some avg10 of memory.pressure), \
         above the threshold of {}% for {}s. Signal: {SIGNAL_NAME}. {containers_part}",
        firing.avg10,
        firing.threshold_percent,
        firing.held_for.as_secs()
    );
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: PressureConfig = PressureConfig {
        threshold_percent: 20.0,
        grace_period: Duration::from_secs(5),
        transition_period: Duration::from_secs(30),
    };

    /// (seconds since start, avg10, stalling since the previous step, want
    /// fire, want condition)
    type Step = (u64, f64, bool, bool, bool);

    fn run(cfg: &PressureConfig, steps: &[Step]) {
        let t0 = Instant::now();
        let mut s = PressureState::default();
        let (mut total_us, mut last) = (0u64, 0u64);
        for &(at, avg10, stalling, fire, condition) in steps {
            if stalling {
                total_us += (at - last) * 1_000_000;
            }
            last = at;
            let v = s.observe(cfg, t0 + Duration::from_secs(at), Reading { avg10, total_us });
            assert_eq!((v.fire, v.condition), (fire, condition), "at {at}s with avg10 {avg10}: {v:?}");
        }
    }

    #[test]
    fn the_state_machine_on_a_fake_clock() {
        const T: bool = true;
        const F: bool = false;
        let cases: &[(&str, PressureConfig, &[Step])] = &[
            ("idle: nothing", CFG, &[(0, 0.0, F, F, F), (10, 19.9, T, F, F), (20, 20.0, T, F, F)]),
            (
                "above for less than the grace period: nothing",
                CFG,
                &[(0, 50.0, T, F, F), (4, 50.0, T, F, F), (5, 10.0, T, F, F), (9, 50.0, T, F, F)],
            ),
            (
                "held for the grace period: fires and sets the condition",
                CFG,
                &[(0, 25.0, T, F, F), (3, 90.0, T, F, F), (5, 30.0, T, T, T)],
            ),
            (
                "still above: fires again after each further grace period",
                CFG,
                &[(0, 25.0, T, F, F), (5, 25.0, T, T, T), (8, 25.0, T, F, T), (10, 25.0, T, T, T)],
            ),
            (
                "avg10 lagging after the stalls stopped: no second firing",
                CFG,
                &[
                    (0, 60.0, T, F, F),
                    (5, 60.0, T, T, T),
                    (7, 50.0, F, F, T),
                    (10, 40.0, F, F, T),
                    (15, 30.0, F, F, T),
                    // Stalling again: the clock restarted at 15.
                    (20, 30.0, T, T, T),
                ],
            ),
            (
                "the condition clears a transition period after the pressure fell",
                CFG,
                &[
                    (0, 25.0, T, F, F),
                    (5, 25.0, T, T, T),
                    (6, 25.0, T, F, T),
                    (7, 5.0, F, F, T),
                    (35, 5.0, F, F, T),
                    (36, 5.0, F, F, F),
                ],
            ),
            (
                "pressure back within the transition period keeps the condition",
                CFG,
                &[(0, 25.0, T, F, F), (5, 25.0, T, T, T), (8, 25.0, T, F, T), (37, 1.0, F, F, T), (38, 1.0, F, F, F)],
            ),
            (
                "no grace period: fires at the first reading above",
                PressureConfig { grace_period: Duration::ZERO, ..CFG },
                &[(0, 10.0, F, F, F), (1, 21.0, T, T, T), (2, 21.0, T, T, T)],
            ),
            (
                "no transition period: clears at the first reading below",
                PressureConfig { transition_period: Duration::ZERO, ..CFG },
                &[(0, 25.0, T, F, F), (5, 25.0, T, T, T), (6, 1.0, F, F, F)],
            ),
        ];
        for (name, cfg, steps) in cases {
            eprintln!("case: {name}");
            run(cfg, steps);
        }
    }

    #[test]
    fn the_victim_is_the_first_by_memory_and_the_message_names_the_signal() {
        use crate::eviction::ranking::{ContainerRef, Usage};
        let cfg = EvictionConfig {
            thresholds: vec![],
            pressure_transition_period: Duration::from_secs(30),
            max_pod_grace_period_secs: 10,
        };
        let pod = |name: &str, request: u64, usage: u64| Candidate {
            uid: name.into(),
            namespace: "default".into(),
            name: name.into(),
            evictable: true,
            termination_grace_secs: 30,
            memory: Usage { request, usage },
            containers: vec![ContainerRef { name: "app".into(), memory_request: request, cgroup: Some(name.into()) }],
            ..Default::default()
        };
        let firing = Firing {
            avg10: 42.5,
            threshold_percent: 20.0,
            held_for: Duration::from_secs(12),
            grace_period: Duration::from_secs(10),
        };
        let meter = |cg: &str| Some(if cg == "hog" { 900 << 20 } else { 1 << 20 });
        let pods = [pod("within", 100 << 20, 50 << 20), pod("hog", 100 << 20, 900 << 20), pod("empty", 0, 0)];
        let v = victim(&cfg, &firing, &pods, &meter).unwrap();
        assert_eq!(v.name, "hog", "over its request first");
        assert_eq!(v.grace_period_secs, 10, "soft: the pod's own, capped by evictionMaxPodGracePeriod");
        assert!(
            v.message.starts_with(
                "The node was low on resource: memory. Tasks stalled on memory 42.50% of the time \
                 (some avg10 of memory.pressure), above the threshold of 20% for 12s. Signal: memory.pressure. \
                 Container app was using 900Mi, request is 100Mi"
            ),
            "{}",
            v.message
        );
        assert_eq!(v.annotations["starved_resource"], "memory");
        assert_eq!(v.annotations["offending_containers"], "app");
        let hard = victim(&cfg, &Firing { grace_period: Duration::ZERO, ..firing }, &pods, &meter).unwrap();
        assert_eq!(hard.grace_period_secs, 0, "no grace period: killed at once");
        // A pod still being evicted: wait for its memory.
        let mut dying = pods.clone();
        dying[0].in_flight = true;
        assert_eq!(victim(&cfg, &firing, &dying, &meter), None);
        // Nothing evictable.
        let critical = [Candidate { evictable: false, ..pod("dns", 0, 1 << 20) }];
        assert_eq!(victim(&cfg, &firing, &critical, &meter), None);
    }

    #[test]
    fn when_to_read_again() {
        let t0 = Instant::now();
        let s = |secs| t0 + Duration::from_secs(secs);
        let mut st = PressureState::default();
        let r = |avg10, secs: u64| Reading { avg10, total_us: secs * 1_000_000 };
        assert_eq!(st.observe(&CFG, s(0), r(1.0, 0)).next_check, None, "idle: only triggers wake it");
        let v = st.observe(&CFG, s(10), r(30.0, 10));
        assert_eq!(v.next_check, Some(s(10) + RECHECK_WHILE_ABOVE), "above: read again soon");
        let v = st.observe(&CFG, s(14) + Duration::from_millis(500), r(30.0, 14));
        assert_eq!(v.next_check, Some(s(15)), "the grace period's end");
        assert_eq!(v.held_for, Duration::from_millis(4500));
        let v = st.observe(&CFG, s(15), r(30.0, 15));
        assert!(v.fire);
        let v = st.observe(&CFG, s(16), r(2.0, 15));
        assert_eq!(v.next_check, Some(s(45)), "the transition period's end");
    }
}
