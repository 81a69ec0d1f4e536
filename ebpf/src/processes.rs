//! Process counts per registered cgroup, and tasks on the node.
//!
//! A process is counted where it lives: at fork in the child's memory
//! cgroup, moved on migration (cgroup_attach_task fires after the move, so
//! the table of counted processes remembers where each one was), and taken
//! out at exit. The node slot counts every task, threads included, which is
//! what `sysinfo().procs` (the kubelet's pid.available input) reports.
//!
//! Cost: these run at every fork and exit on the machine, so the common
//! path is array stores and loads (the process table, the slots), one
//! lookup of the memcg's cached resolution and a few kernel reads; the
//! exit-watch table is looked up only while the agent watches something.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use swiftlet_common::{EventKind, NODE_SLOT, Signal};

use crate::{
    kernel,
    maps::{EXIT_HAS_GROUP_DEAD, PROCS, WATCH_EXIT, control, counted_memcg, layout, slot},
    threshold::{apply_count, atomic_add, bump, emit, evaluate, resolve},
};

#[inline(always)]
fn count_node_task(delta: i64, pid: u32) {
    if let Some(node) = slot(NODE_SLOT) {
        // SAFETY: `node` points into the slot array.
        let value = unsafe {
            atomic_add(&mut (*node).processes, delta);
            core::ptr::read_volatile(&(*node).processes).max(0) as u64
        };
        evaluate(NODE_SLOT, Signal::Processes, value, pid, true);
    }
}

/// Records where process `tgid` is counted: `memcg`, or nowhere (0).
#[inline(always)]
fn remember(tgid: u32, memcg: u64) {
    match PROCS.get_ptr_mut(tgid) {
        // SAFETY: a pointer into the array; one task's events are serialized.
        Some(p) => unsafe { core::ptr::write_volatile(p, memcg) },
        None => {
            if memcg != 0 {
                if let Some(ctl) = control() {
                    // SAFETY: ctl points at the control map's single element.
                    bump(unsafe { &mut (*ctl).proc_table_full });
                }
            }
        }
    }
}

/// sched_process_fork(struct task_struct *parent, struct task_struct *child)
#[btf_tracepoint(function = "sched_process_fork")]
pub fn process_fork(ctx: BtfTracePointContext) -> i32 {
    if layout!(valid) == 0 {
        return 0;
    }
    let child = ctx.arg::<u64>(1);
    let Some((pid, tgid)) = kernel::task_pid_tgid(child) else { return 0 };
    count_node_task(1, pid);
    if pid != tgid {
        return 0; // a new thread, not a new process
    }
    let Some(memcg) = kernel::task_memcg(child) else { return 0 };
    let Some(r) = resolve(memcg) else { return 0 };
    if r.present != 0 {
        apply_count(r, Signal::Processes, 1, pid, true);
        remember(tgid, memcg);
    } else if counted_memcg(tgid) != 0 {
        // A stale entry of an earlier process with this tgid.
        remember(tgid, 0);
    }
    0
}

/// sched_process_exit(struct task_struct *p[, bool group_dead])
#[btf_tracepoint(function = "sched_process_exit")]
pub fn process_exit(ctx: BtfTracePointContext) -> i32 {
    if layout!(valid) == 0 {
        return 0;
    }
    let task = ctx.arg::<u64>(0);
    let Some((pid, tgid)) = kernel::task_pid_tgid(task) else { return 0 };
    count_node_task(-1, pid);
    // An exit is a context where signals go out at once: finish killing a
    // doomed victim whose first signal went out from an event context.
    let doomed = crate::kill::doomed();
    if doomed != 0 {
        crate::kill::swiftlet_kill_pass(doomed);
    }
    // The process ends with its last thread; before 6.13 the tracepoint does
    // not say which one that is, and the leader's exit stands in for it.
    let process_ends = if EXIT_HAS_GROUP_DEAD.load() != 0 { ctx.arg::<u64>(1) as u8 != 0 } else { pid == tgid };
    if !process_ends {
        return 0;
    }
    report_watched_exit(tgid);
    // Counted at fork or migration: where it was counted. Otherwise (it was
    // there before the programs, and the agent's registration counted it)
    // where it lives. The entry is left as it is: the next process with this
    // tgid overwrites it at its fork, and a store here would pull the line
    // from the CPU that forked this process for nothing.
    let memcg = match counted_memcg(tgid) {
        0 => match kernel::task_memcg(task) {
            Some(m) => m,
            None => return 0,
        },
        m => m,
    };
    if let Some(r) = resolve(memcg) {
        apply_count(r, Signal::Processes, -1, pid, true);
    }
    0
}

/// Reports the exit of a process the agent watches. The table is looked up
/// only while the agent says it may hold entries; the one CPU whose removal
/// succeeds reports.
#[inline(always)]
fn report_watched_exit(tgid: u32) {
    let Some(ctl) = control() else { return };
    // SAFETY: ctl points at the control map's single element.
    let watches = unsafe { &raw mut (*ctl).exit_watches };
    // SAFETY: as above.
    if unsafe { core::ptr::read_volatile(watches) } == 0 {
        return;
    }
    // SAFETY: read-only lookup.
    if unsafe { WATCH_EXIT.get(&tgid) }.is_none() || WATCH_EXIT.remove(&tgid).is_err() {
        return;
    }
    // SAFETY: as above.
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(watches, u64::MAX)
    };
    // SAFETY: no preconditions.
    let now = unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() };
    emit(EventKind::ProcessExit, 0, now, 0, u32::MAX, 0, 0, 0, tgid, 0);
}

/// cgroup_attach_task(struct cgroup *dst, const char *path,
///                    struct task_struct *task, bool threadgroup)
///
/// Fires after the move, once per hierarchy on cgroup v1; only a change of
/// memory cgroup matters here.
#[btf_tracepoint(function = "cgroup_attach_task")]
pub fn cgroup_attach(ctx: BtfTracePointContext) -> i32 {
    if layout!(valid) == 0 {
        return 0;
    }
    let task = ctx.arg::<u64>(2);
    let Some((pid, tgid)) = kernel::task_pid_tgid(task) else { return 0 };
    if pid != tgid {
        return 0;
    }
    let Some(new) = kernel::task_memcg(task) else { return 0 };
    let old = counted_memcg(tgid);
    if old == new {
        return 0;
    }
    if old != 0 {
        if let Some(r) = resolve(old) {
            apply_count(r, Signal::Processes, -1, pid, true);
        }
    }
    if let Some(r) = resolve(new) {
        if r.present != 0 {
            apply_count(r, Signal::Processes, 1, pid, true);
            remember(tgid, new);
        } else if old != 0 {
            remember(tgid, 0);
        }
    }
    0
}
