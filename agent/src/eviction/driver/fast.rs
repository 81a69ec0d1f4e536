//! The fast path, on the signal source's reader thread: events are
//! forwarded to the manager's task, and an upward crossing of a hard line
//! the kernel did not act on kills the first victim of the plan the
//! manager published, there and then. Nothing is ranked or registered
//! here: a plan too old for its line (PID lines) is left to the manager,
//! which ranks again. With reclaim-first on, a memory crossing is killed
//! here only when the kernel knew the growth to be anonymous: page cache
//! is the manager's to reclaim first.

use std::sync::{Arc, Weak, atomic::Ordering};

use tracing::warn;

use super::{KillPath, PID_PLAN_MAX_AGE, Plan, PlannedVictim, Shared, Wake, reclaim::is_memory};
use crate::{
    eviction::signal::EvictionSignal,
    metrics::OutcomeLabels,
    signals::{Direction, EventSink, KillOutcome, SignalEvent, monotonic_ns},
};

/// Receives signal events on the source's reader thread.
pub(super) struct Sink(pub(super) Weak<Shared>);

impl EventSink for Sink {
    fn on_event(&self, event: SignalEvent) {
        let Some(shared) = self.0.upgrade() else { return };
        let _ = shared.events.send(event.clone());
        let wake = match event {
            SignalEvent::Crossing {
                target,
                signal,
                direction: Direction::Up,
                at_ns,
                kernel_generation,
                kernel_outcome,
                value,
                ..
            } => {
                let plan = shared.plan.lock().clone();
                match plan.lines.iter().find(|l| l.target == target && l.signal == signal) {
                    Some(line) => {
                        if kernel_outcome != KillOutcome::NotAttempted {
                            shared
                                .metrics
                                .kernel_plan_outcomes
                                .get_or_create(&OutcomeLabels { outcome: kernel_outcome.name().into() })
                                .inc();
                        }
                        let signal = line.eviction_signal;
                        let reclaim_first = is_memory(signal) && shared.reclaim_first.load(Ordering::Relaxed);
                        let anonymous = reclaim_first && anonymous_growth(kernel_outcome);
                        // When the kernel already killed at this crossing, the
                        // fast path stands down: one victim per crossing.
                        let killed = if kernel_generation == 0 && (!reclaim_first || anonymous) {
                            fast_kill(&shared, &plan, signal, at_ns)
                        } else {
                            None
                        };
                        Wake::Crossing { at_ns, value, signal, killed, decided_ns: monotonic_ns(), anonymous }
                    }
                    None => Wake::Other,
                }
            }
            SignalEvent::KernelKill {
                target,
                cgroup,
                cgroup_id,
                signal,
                crossing_ns,
                crossing_value,
                at_ns,
                signal_error,
                ..
            } => {
                if signal_error != 0 {
                    // The victim's allocating task was not signalled; the
                    // agent's cgroup kill that follows is what ends it.
                    warn!(
                        cgroup = cgroup.as_deref().unwrap_or("-"),
                        errno = -signal_error,
                        "the kernel executed the plan but could not signal the allocating task"
                    );
                }
                let line_signal = shared
                    .plan
                    .lock()
                    .lines
                    .iter()
                    .find(|l| l.target == target && l.signal == signal)
                    .map(|l| l.eviction_signal);
                match cgroup {
                    Some(cgroup) => Wake::KernelKill {
                        cgroup,
                        cgroup_id,
                        signal: line_signal,
                        value: crossing_value,
                        crossing_ns,
                        at_ns,
                    },
                    None => {
                        warn!(cgroup_id, "the kernel killed a cgroup the agent no longer knows");
                        Wake::Other
                    }
                }
            }
            SignalEvent::OomKill { cgroup, pid, .. } => {
                shared.metrics.record_oom_kill(cgroup.as_deref());
                warn!(pid, cgroup = cgroup.as_deref().unwrap_or("-"), "the kernel OOM killer chose a victim");
                Wake::Other
            }
            SignalEvent::CgroupRemoved { cgroup, .. } => Wake::CgroupRemoved(cgroup),
            SignalEvent::ProcessExit { .. } => return,
            SignalEvent::Crossing { .. } => Wake::Other,
        };
        let _ = shared.wake.send(wake);
    }
}

/// Whether the kernel, in reclaim-first mode, knew a memory crossing to be
/// anonymous growth: it checks the growth before anything else, so any
/// outcome but a deferral says so; `NotAttempted` (a source that never
/// asks the kernel) says nothing.
fn anonymous_growth(outcome: KillOutcome) -> bool {
    !outcome.deferred() && outcome != KillOutcome::NotAttempted
}

/// Kills the first victim of `signal`'s plan, when the plan is fresh
/// enough for the line and no victim of it is being evicted already (the
/// signal wavering at the line while a victim dies is the evaluation's to
/// judge, counting what the dying one gives back); the victim killed, if
/// any.
fn fast_kill(shared: &Arc<Shared>, plan: &Plan, signal: EvictionSignal, at_ns: u64) -> Option<PlannedVictim> {
    if signal == EvictionSignal::PidAvailable
        && at_ns.saturating_sub(plan.ranked_ns) > PID_PLAN_MAX_AGE.as_nanos() as u64
    {
        return None;
    }
    if shared.dying_for(signal) {
        return None;
    }
    for v in plan.victims.get(&signal).into_iter().flatten() {
        if !shared.claim(v, signal) {
            continue;
        }
        if shared.kill(v, KillPath::Agent, Some(at_ns), None) {
            return Some(v.clone());
        }
        // Gone since the plan was made: the next one.
        shared.in_flight.lock().remove(&v.uid);
    }
    None
}
