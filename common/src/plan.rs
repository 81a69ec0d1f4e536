//! In-kernel eviction: the victim plans the agent writes, what the kernel
//! did with them, and what grew at the crossing that ran one.

/// What moved when a memory line was crossed, as the program that saw the
/// crossing knows it; passed down to the plan's execution. A page-cache
/// crossing can be undone by reclaim, an anonymous one only by a kill.
pub mod growth {
    /// The evaluation may not execute a plan (a pod's own line, a downward
    /// crossing).
    pub const NO_KILL: u32 = 0;
    /// The program cannot tell (the charge path, the refresh program, the
    /// counted signals).
    pub const UNKNOWN: u32 = 1;
    /// Anonymous pages (NR_ANON_MAPPED).
    pub const ANON: u32 = 2;
    /// Page cache (NR_FILE_PAGES, or inactive file pages made active).
    pub const FILE: u32 = 3;
}

/// How many victim plans there can be: one per kernel line (node memory,
/// kubepods memory, node PIDs) with room to spare.
pub const MAX_PLANS: u32 = 4;

/// The agent's pre-ranked victim for one kernel line: the pod eviction
/// ranking would pick next. The kernel executes it at the crossing; ranking
/// stays in the agent, where it is pure and tested.
///
/// The array is mapped into the agent, which writes a plan as a seqlock:
/// `seq` made odd, the fields, `seq` made even again (each step a store
/// the next cannot pass). The kernel reads `seq`, the fields, and `seq`
/// again, and refuses a plan whose `seq` was odd or changed
/// ([`KillOutcome::PlanBeingWritten`]): it never acts on half of one plan
/// and half of another. `executed_generation` is the kernel's alone.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VictimPlan {
    /// Odd while the agent writes the plan.
    pub seq: u64,
    /// Plan generation, bumped by the agent for every new plan; 0 = no plan.
    pub generation: u64,
    /// The generation the kernel last executed (written by the kernel, with
    /// compare-and-swap, so a generation is executed at most once).
    pub executed_generation: u64,
    /// The slot whose crossing triggers the plan (the node or kubepods).
    pub trigger_slot: u32,
    /// The [`Signal`](crate::Signal) whose crossing triggers the plan.
    pub signal: u32,
    /// The victim pod's slot.
    pub victim_slot: u32,
    /// The victim's process with the most resident memory when the agent
    /// ranked the pods, 0 if none: where the kernel has
    /// `bpf_send_signal_task`, it signals this process when the crossing is
    /// seen outside the victim's own context (a victim asleep while the
    /// kernel folds its statistics, or another pod's allocation).
    pub victim_tgid: u32,
    /// The victim pod's cgroup id; the kernel checks the slot still holds it.
    pub victim_cgroup_id: u64,
    /// CLOCK_MONOTONIC ns when the agent ranked the pods for this plan.
    pub planned_ns: u64,
    /// How old the plan may be when the line is crossed; 0 = any age.
    /// Process counts move faster than memory (a fork bomb doubles in
    /// milliseconds), so PID plans carry a short one and an older plan is
    /// left to the agent, which ranks again ([`KillOutcome::PlanTooOld`]).
    pub max_age_ns: u64,
}

/// What the kernel did with the victim plan at an upward crossing, carried
/// in the crossing's record ([`Event::outcome`](crate::Event::outcome)), so
/// that every crossing says whether the kernel killed and, if not, which
/// check refused.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KillOutcome {
    /// Not a case for the plan: a downward crossing, or a slot with no line
    /// that kills (the refresh of a pod's own line, inodes).
    NotAttempted = 0,
    /// The plan was executed: the victim is doomed (and the current task
    /// signalled if it is the victim's); a KernelKill record precedes.
    Executed = 1,
    /// The agent has kernel eviction off.
    KernelEvictionOff = 2,
    /// No plan names this line.
    NoPlan = 3,
    /// This line's plan was executed already; the agent has not written
    /// the next one yet.
    AlreadyExecuted = 4,
    /// The agent was writing a plan while the kernel read it.
    PlanBeingWritten = 5,
    /// Another CPU claimed the same generation first.
    ClaimedElsewhere = 6,
    /// The victim's slot no longer holds the planned pod (unregistered,
    /// removed, reused).
    VictimGone = 7,
    /// The victim has not charged memory since it was registered: the
    /// kernel does not know its memory cgroup.
    VictimMemcgUnknown = 8,
    /// The plan is older than its `max_age_ns`.
    PlanTooOld = 9,
    /// Reclaim-first is on and page cache crossed the memory line: the
    /// kernel does not kill, the agent reclaims first.
    DeferredFileGrowth = 10,
    /// Reclaim-first is on and the program that saw the memory crossing
    /// cannot tell what grew: the kernel does not kill, the agent decides.
    DeferredUnknownGrowth = 11,
}

impl KillOutcome {
    pub const ALL: [KillOutcome; 12] = [
        KillOutcome::NotAttempted,
        KillOutcome::Executed,
        KillOutcome::KernelEvictionOff,
        KillOutcome::NoPlan,
        KillOutcome::AlreadyExecuted,
        KillOutcome::PlanBeingWritten,
        KillOutcome::ClaimedElsewhere,
        KillOutcome::VictimGone,
        KillOutcome::VictimMemcgUnknown,
        KillOutcome::PlanTooOld,
        KillOutcome::DeferredFileGrowth,
        KillOutcome::DeferredUnknownGrowth,
    ];

    pub const fn from_u32(v: u32) -> Option<KillOutcome> {
        match v {
            0 => Some(KillOutcome::NotAttempted),
            1 => Some(KillOutcome::Executed),
            2 => Some(KillOutcome::KernelEvictionOff),
            3 => Some(KillOutcome::NoPlan),
            4 => Some(KillOutcome::AlreadyExecuted),
            5 => Some(KillOutcome::PlanBeingWritten),
            6 => Some(KillOutcome::ClaimedElsewhere),
            7 => Some(KillOutcome::VictimGone),
            8 => Some(KillOutcome::VictimMemcgUnknown),
            9 => Some(KillOutcome::PlanTooOld),
            10 => Some(KillOutcome::DeferredFileGrowth),
            11 => Some(KillOutcome::DeferredUnknownGrowth),
            _ => None,
        }
    }

    /// The label in metrics and bench reports.
    pub const fn name(self) -> &'static str {
        match self {
            KillOutcome::NotAttempted => "not_attempted",
            KillOutcome::Executed => "executed",
            KillOutcome::KernelEvictionOff => "kernel_eviction_off",
            KillOutcome::NoPlan => "no_plan",
            KillOutcome::AlreadyExecuted => "already_executed",
            KillOutcome::PlanBeingWritten => "plan_being_written",
            KillOutcome::ClaimedElsewhere => "claimed_elsewhere",
            KillOutcome::VictimGone => "victim_gone",
            KillOutcome::VictimMemcgUnknown => "victim_memcg_unknown",
            KillOutcome::PlanTooOld => "plan_too_old",
            KillOutcome::DeferredFileGrowth => "deferred_file_growth",
            KillOutcome::DeferredUnknownGrowth => "deferred_unknown_growth",
        }
    }

    /// The kernel left a memory crossing to the agent because reclaim-first
    /// is on and the growth was not known to be anonymous.
    pub const fn deferred(self) -> bool {
        matches!(self, KillOutcome::DeferredFileGrowth | KillOutcome::DeferredUnknownGrowth)
    }
}
