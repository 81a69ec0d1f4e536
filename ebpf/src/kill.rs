//! In-kernel eviction: at a hard-threshold crossing, kill the victim the
//! agent planned, right there, in the context of the event.
//!
//! What the kernel does, in order:
//! 1. Claims the plan's generation with compare-and-swap, so a generation
//!    is executed at most once, and checks the victim: a registered pod slot
//!    still holding the planned cgroup, never anything else.
//! 2. Sends SIGKILL to the current task if it belongs to the victim (the
//!    usual case: the task whose allocation crossed the line). This helper
//!    exists on every kernel we support.
//! 3. With kfuncs (6.13+): walks every process and signals the victim's.
//!    From the memcg event's context the kernel queues one signal per CPU and
//!    answers -EBUSY after that, so the walk stops at the first refusal and
//!    the victim is marked doomed: the walk is repeated at every task exit
//!    (a context where signals go out at once), and any doomed task that
//!    charges memory is signalled as the current task, until the agent,
//!    which kills the survivors through the cgroup, clears the mark.
//! 4. Reports a KernelKill record ahead of the crossing's own.

use core::{ffi::c_void, mem::MaybeUninit, ptr::null_mut};

use aya_ebpf::helpers::{bpf_ktime_get_ns, bpf_send_signal};
use swiftlet_common::{EventKind, MAX_PLANS, Signal, slot_flags};

use crate::{
    kernel,
    maps::{KFUNC_KILL, PLANS, control, layout, slot},
    threshold::{atomic_cas_u64, bump, emit},
};

type Task = c_void;

// Kernel functions; the agent rewrites these call sites into kfunc calls
// (or into `r0 = 0` on kernels without them) before loading the object.
unsafe extern "C" {
    fn bpf_task_acquire(task: *mut Task) -> *mut Task;
    fn bpf_task_release(task: *mut Task);
    fn bpf_send_signal_task(task: *mut Task, sig: i32, pid_type: u32, value: u64) -> i64;
    fn bpf_iter_task_new(it: *mut [u64; 3], task: *mut Task, flags: u32) -> i64;
    fn bpf_iter_task_next(it: *mut [u64; 3]) -> *mut Task;
    fn bpf_iter_task_destroy(it: *mut [u64; 3]);
}

const SIGKILL: u32 = 9;
const PIDTYPE_TGID: u32 = 1;
/// BPF_TASK_ITER_ALL_PROCS: one entry per process.
const ITER_ALL_PROCS: u32 = 0;
const PF_EXITING: u32 = 0x4;

/// True when `memcg` is `victim` or below it (containers, and cgroups
/// nested in them, up to four levels). Unrolled: the verifier explores it
/// inside the task walk.
#[inline(always)]
pub fn in_subtree(memcg: u64, victim: u64) -> bool {
    if memcg == 0 || victim == 0 {
        return false;
    }
    let m0 = memcg;
    if m0 == victim {
        return true;
    }
    let m1 = kernel::css_parent(m0);
    if m1 == victim {
        return true;
    }
    let m2 = if m1 != 0 { kernel::css_parent(m1) } else { 0 };
    if m2 == victim {
        return true;
    }
    let m3 = if m2 != 0 { kernel::css_parent(m2) } else { 0 };
    if m3 == victim {
        return true;
    }
    let m4 = if m3 != 0 { kernel::css_parent(m3) } else { 0 };
    m4 == victim
}

/// SIGKILL to the current task if it belongs to `victim`; its tgid when sent.
#[inline(always)]
pub fn kill_current_if_member(victim: u64) -> u32 {
    let cur = kernel::current_task();
    if !in_subtree(kernel::task_memcg(cur).unwrap_or(0), victim) {
        return 0;
    }
    // SAFETY: the helper signals the current task's process.
    if unsafe { bpf_send_signal(SIGKILL) } == 0 { kernel::task_tgid(cur).unwrap_or(0) } else { 0 }
}

/// Signals every live process of `victim`'s subtree; stops at the first
/// refusal (see the module comment).
///
/// A global function (external linkage, scalar arguments): the verifier
/// checks it once on its own rather than again in every state of every
/// caller, which keeps the callers' loops within its budget.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn swiftlet_kill_pass(victim: u64) -> u32 {
    if KFUNC_KILL.load() == 0 || victim == 0 {
        return 0;
    }
    let flags_off = layout!(task_flags) as u64;
    let mut it = MaybeUninit::<[u64; 3]>::uninit();
    // SAFETY: the iterator lives on the stack between new and destroy, as
    // the kfunc contract requires; the tasks it yields are RCU pointers,
    // acquired before signalling and released after.
    unsafe {
        bpf_iter_task_new(it.as_mut_ptr(), null_mut(), ITER_ALL_PROCS);
        loop {
            let t = bpf_iter_task_next(it.as_mut_ptr());
            if t.is_null() {
                break;
            }
            let addr = t as u64;
            let flags: u32 = aya_ebpf::helpers::bpf_probe_read_kernel((addr + flags_off) as *const u32).unwrap_or(0);
            if flags & PF_EXITING != 0 {
                continue;
            }
            if !in_subtree(kernel::task_memcg(addr).unwrap_or(0), victim) {
                continue;
            }
            let r = bpf_task_acquire(t);
            if r.is_null() {
                continue;
            }
            let rc = bpf_send_signal_task(r, SIGKILL as i32, PIDTYPE_TGID, 0) as i32;
            bpf_task_release(r);
            if rc != 0 {
                break;
            }
        }
        bpf_iter_task_destroy(it.as_mut_ptr());
    }
    0
}

/// Executes the plan for a crossing of `signal` on slot `trigger`, if the
/// agent made one and enabled kernel eviction. Returns the generation
/// executed (truncated), or 0. A global function, as `swiftlet_kill_pass`.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn swiftlet_execute_plan(trigger: u32, signal: u32, crossing_ns: u64, crossing_value: u64) -> u32 {
    let Some(signal) = Signal::from_u32(signal) else { return 0 };
    let Some(ctl) = control() else { return 0 };
    // SAFETY: ctl points at the control map's single element.
    if unsafe { core::ptr::read_volatile(&(*ctl).kernel_eviction) } == 0 {
        return 0;
    }
    let mut p = 0;
    while p < MAX_PLANS {
        if let Some(plan) = PLANS.get_ptr_mut(p) {
            // SAFETY: plan points into the plans array; fields are read one
            // by one and the generation is claimed atomically.
            unsafe {
                let generation = core::ptr::read_volatile(&(*plan).generation);
                let done = core::ptr::read_volatile(&(*plan).executed_generation);
                if generation != 0
                    && generation != done
                    && core::ptr::read_volatile(&(*plan).trigger_slot) == trigger
                    && core::ptr::read_volatile(&(*plan).signal) == signal as u32
                    && atomic_cas_u64(&raw mut (*plan).executed_generation, done, generation)
                {
                    let victim_slot = core::ptr::read_volatile(&(*plan).victim_slot);
                    let victim_id = core::ptr::read_volatile(&(*plan).victim_cgroup_id);
                    return kill_victim(
                        trigger,
                        victim_slot,
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
    0
}

#[inline(always)]
fn kill_victim(
    trigger: u32,
    victim_slot: u32,
    victim_id: u64,
    generation: u32,
    signal: Signal,
    crossing_ns: u64,
    crossing_value: u64,
) -> u32 {
    let Some(s) = slot(victim_slot) else { return 0 };
    let Some(ctl) = control() else { return 0 };
    // SAFETY: s points into the slot array, ctl at the control block.
    let memcg = unsafe {
        let flags = core::ptr::read_volatile(&(*s).flags);
        let ok = core::ptr::read_volatile(&(*s).cgroup_id) == victim_id
            && flags & slot_flags::ACTIVE != 0
            && flags & slot_flags::POD != 0
            && flags & slot_flags::REMOVED == 0;
        if !ok {
            return 0;
        }
        core::ptr::read_volatile(&(*s).memcg)
    };
    if memcg == 0 {
        // The pod never charged memory since registration: nothing of it
        // is known to the kernel, so the agent's path takes over.
        return 0;
    }
    // SAFETY: plain stores into the control block; the agent clears them.
    unsafe {
        core::ptr::write_volatile(&mut (*ctl).doomed_slot, victim_slot);
        core::ptr::write_volatile(&mut (*ctl).doomed_memcg, memcg);
        bump(&mut (*ctl).kernel_kills);
    }
    let pid = kill_current_if_member(memcg);
    swiftlet_kill_pass(memcg);
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
    );
    generation
}

/// The doomed victim's memcg, or 0.
#[inline(always)]
pub fn doomed() -> u64 {
    match control() {
        // SAFETY: ctl points at the control block.
        Some(ctl) => unsafe { core::ptr::read_volatile(&(*ctl).doomed_memcg) },
        None => 0,
    }
}
