//! In-kernel eviction: at a hard-threshold crossing, kill the victim the
//! agent planned, right there, in the context of the event.
//!
//! What the kernel does, in order:
//! 1. Reads the line's plan as a seqlock reader (see `VictimPlan`), claims
//!    its generation with compare-and-swap (a generation is executed at
//!    most once) and checks it: fresh enough for its line, naming a
//!    registered pod slot that still holds the planned cgroup.
//! 2. Marks the victim doomed (its memcg, tied to its cgroup id and a
//!    deadline), then sends SIGKILL to the current task if it belongs to
//!    the victim (the usual case: the task whose allocation crossed the
//!    line). Any doomed task that charges memory afterwards is signalled as
//!    the current task. When the current task is not the victim's (the
//!    crossing was seen where the kernel folded its statistics, on the way
//!    to idle, or at another pod's allocation) and the kernel has
//!    `bpf_send_signal_task`, the plan's process is left for the calling
//!    program to signal ([`signal_pending_victim`]): only BTF-typed
//!    programs may call that kfunc, and the plan runs in others too.
//! 3. Reports a KernelKill record ahead of the crossing's own, which says
//!    what happened ([`KillOutcome`]) whether the plan ran or not, and, when
//!    the current task was the victim's but `bpf_send_signal` refused it,
//!    the helper's error. When it signalled the current task, both records
//!    wake the agent's reader only once that task has exited (`wakeup.rs`),
//!    so the reader does not take the victim's CPU before the victim meets
//!    its signal.
//!
//! The victim's other processes are the agent's: it kills the whole cgroup
//! (`cgroup.kill`, or freeze and signal on cgroup v1) as soon as it reads
//! the KernelKill record. The kernel does not look for them. Walking every
//! task on the node was most of the in-kernel kill's time, and from a
//! memory event's context the kernel queues only one signal per CPU anyway;
//! the css task iterator, which would reach exactly the victim's tasks, is
//! refused by the verifier outside LSM, iterator and sleepable programs.

use core::ffi::c_void;

use aya_ebpf::helpers::{bpf_ktime_get_ns, bpf_send_signal};
use swiftlet_common::{DOOMED_FOR_NS, EventKind, KillOutcome, MAX_PLANS, Signal, growth, slot_flags};

use crate::{
    kernel,
    maps::{PLANS, SIGNAL_TASK, control, slot},
    threshold::{atomic_cas_u64, bump, emit},
};

type Task = c_void;

// Kernel functions (kfuncs): the agent rewrites these call sites into
// kfunc calls, or into `r0 = 0` on kernels without them, before it loads
// the object; `SIGNAL_TASK` is 1 only where all three exist.
unsafe extern "C" {
    fn bpf_task_from_pid(pid: i32) -> *mut Task;
    fn bpf_send_signal_task(task: *mut Task, sig: i32, pid_type: u32, value: u64) -> i32;
    fn bpf_task_release(task: *mut Task);
}

const SIGKILL: u32 = 9;
/// `enum pid_type`'s PIDTYPE_TGID: the signal goes to the whole process.
const PIDTYPE_TGID: u32 = 1;
const EBUSY: i32 = 16;

/// True when `memcg` is `victim` or anywhere below it.
#[inline(always)]
pub fn in_subtree(memcg: u64, victim: u64) -> bool {
    if memcg == 0 || victim == 0 {
        return false;
    }
    memcg == victim || kernel::css_below(memcg, victim)
}

/// SIGKILL to the current task if it belongs to `victim`. Returns its tgid
/// when the signal was sent, and what the helper returned when it refused
/// (a negative errno): (0, 0) means the current task is not the victim's.
#[inline(always)]
pub fn kill_current_if_member(victim: u64) -> (u32, i32) {
    let cur = kernel::current_task();
    if !in_subtree(kernel::task_memcg(cur).unwrap_or(0), victim) {
        return (0, 0);
    }
    // SAFETY: the helper signals the current task's process.
    match unsafe { bpf_send_signal(SIGKILL) } {
        0 => (kernel::task_tgid(cur).unwrap_or(0), 0),
        refused => (0, refused as i32),
    }
}

/// Packs what [`swiftlet_execute_plan`] returns: the outcome in the low
/// byte, the executed generation (truncated) above it.
#[inline(always)]
const fn result(outcome: KillOutcome, generation: u32) -> u64 {
    outcome as u64 | (generation as u64) << 8
}

/// The outcome of a packed result.
#[inline(always)]
pub fn outcome_of(r: u64) -> u32 {
    (r & 0xff) as u32
}

/// The generation of a packed result.
#[inline(always)]
pub fn generation_of(r: u64) -> u32 {
    (r >> 8) as u32
}

/// Executes the plan for a crossing of `signal` on slot `trigger`, if the
/// agent made one and enabled kernel eviction, and, when the agent reclaims
/// page cache first, only if the memory that grew (`kind`, a [`growth`]
/// value) was anonymous. Returns the outcome and the
/// generation executed, packed (see [`result`]). A global function: the
/// verifier checks it once on its own rather than in every state of every
/// caller, which keeps the callers' loops within its budget.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn swiftlet_execute_plan(
    trigger: u32,
    signal: u32,
    crossing_ns: u64,
    crossing_value: u64,
    kind: u32,
) -> u64 {
    let Some(signal) = Signal::from_u32(signal) else { return result(KillOutcome::NotAttempted, 0) };
    let Some(ctl) = control() else { return result(KillOutcome::NotAttempted, 0) };
    // Checked first, so that any other outcome of a memory crossing in this
    // mode says the growth was anonymous. Page cache can be reclaimed: a
    // kill for it would take a pod the agent's reclaim may spare.
    // SAFETY: ctl points at the control map's single element.
    if signal == Signal::MemoryWorkingSet
        && kind != growth::ANON
        && unsafe { core::ptr::read_volatile(&(*ctl).reclaim_first) } != 0
    {
        let deferred =
            if kind == growth::FILE { KillOutcome::DeferredFileGrowth } else { KillOutcome::DeferredUnknownGrowth };
        return result(deferred, 0);
    }
    // SAFETY: ctl points at the control map's single element.
    if unsafe { core::ptr::read_volatile(&(*ctl).kernel_eviction) } == 0 {
        return result(KillOutcome::KernelEvictionOff, 0);
    }
    let mut being_written = false;
    let mut p = 0;
    while p < MAX_PLANS {
        if let Some(plan) = PLANS.get_ptr_mut(p) {
            // SAFETY: `plan` points into the plans array, which the agent
            // writes through its mapping as a seqlock: fields are read one by
            // one between two reads of `seq`, and the generation is claimed
            // atomically.
            unsafe {
                let seq = core::ptr::read_volatile(&(*plan).seq);
                let mine = core::ptr::read_volatile(&(*plan).trigger_slot) == trigger
                    && core::ptr::read_volatile(&(*plan).signal) == signal as u32;
                let generation = core::ptr::read_volatile(&(*plan).generation);
                let done = core::ptr::read_volatile(&(*plan).executed_generation);
                let victim_slot = core::ptr::read_volatile(&(*plan).victim_slot);
                let victim_tgid = core::ptr::read_volatile(&(*plan).victim_tgid);
                let victim_id = core::ptr::read_volatile(&(*plan).victim_cgroup_id);
                let planned_ns = core::ptr::read_volatile(&(*plan).planned_ns);
                let max_age_ns = core::ptr::read_volatile(&(*plan).max_age_ns);
                if seq & 1 != 0 || core::ptr::read_volatile(&(*plan).seq) != seq {
                    // Which line it is for is not known until it is whole.
                    being_written = true;
                } else if mine && generation != 0 {
                    if generation == done {
                        return result(KillOutcome::AlreadyExecuted, 0);
                    }
                    if max_age_ns != 0 && crossing_ns.saturating_sub(planned_ns) > max_age_ns {
                        return result(KillOutcome::PlanTooOld, 0);
                    }
                    if !atomic_cas_u64(&raw mut (*plan).executed_generation, done, generation) {
                        return result(KillOutcome::ClaimedElsewhere, 0);
                    }
                    return kill_victim(
                        trigger,
                        victim_slot,
                        victim_tgid,
                        victim_id,
                        generation as u32,
                        signal,
                        crossing_ns,
                        crossing_value,
                    );
                }
            }
        }
        p += 1;
    }
    result(if being_written { KillOutcome::PlanBeingWritten } else { KillOutcome::NoPlan }, 0)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn kill_victim(
    trigger: u32,
    victim_slot: u32,
    victim_tgid: u32,
    victim_id: u64,
    generation: u32,
    signal: Signal,
    crossing_ns: u64,
    crossing_value: u64,
) -> u64 {
    let Some(s) = slot(victim_slot) else { return result(KillOutcome::VictimGone, 0) };
    let Some(ctl) = control() else { return result(KillOutcome::NotAttempted, 0) };
    // SAFETY: s points into the slot array, ctl at the control block.
    let memcg = unsafe {
        let flags = core::ptr::read_volatile(&(*s).flags);
        let ok = core::ptr::read_volatile(&(*s).cgroup_id) == victim_id
            && flags & slot_flags::ACTIVE != 0
            && flags & slot_flags::POD != 0
            && flags & slot_flags::REMOVED == 0;
        if !ok {
            return result(KillOutcome::VictimGone, 0);
        }
        core::ptr::read_volatile(&(*s).memcg)
    };
    if memcg == 0 {
        // The pod never charged memory since registration: nothing of it
        // is known to the kernel, so the agent's path takes over.
        return result(KillOutcome::VictimMemcgUnknown, 0);
    }
    // The memcg is trusted only while its cgroup is still the planned one
    // (a freed `struct mem_cgroup` can be reused by a later cgroup).
    if kernel::css_cgroup_id(memcg) != Some(victim_id) {
        return result(KillOutcome::VictimGone, 0);
    }
    // SAFETY: no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: plain stores into the control block, the memcg last: readers
    // check it first and then the id and deadline stored before it.
    unsafe {
        core::ptr::write_volatile(&mut (*ctl).doomed_cgroup_id, victim_id);
        core::ptr::write_volatile(&mut (*ctl).doomed_until_ns, now + DOOMED_FOR_NS);
        core::ptr::write_volatile(&mut (*ctl).doomed_slot, victim_slot);
        core::ptr::write_volatile(&mut (*ctl).doomed_memcg, memcg);
        bump(&mut (*ctl).kernel_kills);
    }
    let (pid, signal_error) = kill_current_if_member(memcg);
    if pid != 0 {
        // The agent's reader would preempt the victim on this CPU before it
        // meets the signal; it is woken when the victim has exited.
        crate::wakeup::hold_until_exit_of(pid, now);
    } else if victim_tgid != 0 && SIGNAL_TASK.load() != 0 {
        // SAFETY: a plain store into the control block.
        unsafe { core::ptr::write_volatile(&mut (*ctl).signal_tgid, u64::from(victim_tgid)) };
        // No wake-up hold here, unlike the current task's kill: the signal
        // goes out as irq_work on a CPU that is often entering idle, and
        // holding the reader's wake-up was measured to delay the victim's
        // death several times over (the wake-up is what brings that CPU
        // back, as far as is known).
    }
    emit(
        EventKind::KernelKill,
        signal as u32,
        // SAFETY: no preconditions.
        unsafe { bpf_ktime_get_ns() },
        victim_id,
        victim_slot,
        trigger,
        crossing_ns,
        crossing_value,
        pid,
        generation,
        KillOutcome::Executed as u32,
        signal_error,
    );
    result(KillOutcome::Executed, generation)
}

/// The doomed victim's memcg, or 0. A mark is honoured only while it is
/// within its deadline and its memcg still belongs to the doomed cgroup;
/// otherwise it is cleared here (compare-and-swap, so a newer mark written
/// meanwhile stays). One load when nothing is doomed.
#[inline(always)]
pub fn doomed() -> u64 {
    let Some(ctl) = control() else { return 0 };
    // SAFETY: ctl points at the control block; fields are read one by one.
    unsafe {
        let memcg = core::ptr::read_volatile(&(*ctl).doomed_memcg);
        if memcg == 0 {
            return 0;
        }
        // A kill's wake-up hold, should its victim not have exited in time,
        // ends at the memory events that follow it.
        crate::wakeup::release_if_expired();
        let id = core::ptr::read_volatile(&(*ctl).doomed_cgroup_id);
        let until = core::ptr::read_volatile(&(*ctl).doomed_until_ns);
        if bpf_ktime_get_ns() <= until && kernel::css_cgroup_id(memcg) == Some(id) {
            return memcg;
        }
        atomic_cas_u64(&raw mut (*ctl).doomed_memcg, memcg, 0);
    }
    0
}

/// Clears the doomed mark if it is the cgroup `id`'s (which was removed).
#[inline(always)]
pub fn forget_doomed(id: u64) {
    let Some(ctl) = control() else { return };
    // SAFETY: as in `doomed`.
    unsafe {
        let memcg = core::ptr::read_volatile(&(*ctl).doomed_memcg);
        if memcg != 0 && core::ptr::read_volatile(&(*ctl).doomed_cgroup_id) == id {
            atomic_cas_u64(&raw mut (*ctl).doomed_memcg, memcg, 0);
        }
    }
}

/// Signals the process a plan executed from outside the victim's context
/// left pending (`Control::signal_tgid`), once: taken with compare-and-swap,
/// and only if that process still belongs to the doomed victim (its pid may
/// have been reused since the agent ranked the pods); put back if the
/// kernel can queue no signal on this CPU just now. For BTF-typed
/// programs only, which may call the kfuncs; elsewhere the process dies at
/// its next charge or by the agent's hand. One load when nothing is
/// pending.
#[inline(always)]
pub fn signal_pending_victim() {
    if SIGNAL_TASK.load() == 0 {
        return;
    }
    let Some(ctl) = control() else { return };
    // SAFETY: ctl points at the control block; the field is an aligned u64
    // taken atomically.
    let tgid = unsafe {
        let tgid = core::ptr::read_volatile(&(*ctl).signal_tgid);
        if tgid == 0 || !atomic_cas_u64(&raw mut (*ctl).signal_tgid, tgid, 0) {
            return;
        }
        tgid
    };
    let victim = doomed();
    if victim == 0 {
        return;
    }
    // SAFETY: the task is acquired by bpf_task_from_pid (or null), used
    // while held, and released; the kfuncs take it as a trusted pointer.
    unsafe {
        let task = bpf_task_from_pid(tgid as i32);
        if task.is_null() {
            return;
        }
        if in_subtree(kernel::task_memcg(task as u64).unwrap_or(0), victim)
            && bpf_send_signal_task(task, SIGKILL as i32, PIDTYPE_TGID, 0) == -EBUSY
        {
            // This CPU's one signal queued for later (interrupts are off)
            // is taken: left for the next program to try.
            atomic_cas_u64(&raw mut (*ctl).signal_tgid, 0, tgid);
        }
        bpf_task_release(task);
    }
}
