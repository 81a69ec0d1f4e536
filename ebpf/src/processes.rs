//! Process counts per registered cgroup, and tasks on the node.
//!
//! A process is counted where it lives: at fork in the child's memory
//! cgroup, moved on migration (cgroup_attach_task fires after the move, so
//! the table of counted processes remembers where each one was), and taken
//! out at exit. The node slot counts every task, threads included, which is
//! what `sysinfo().procs` (the kubelet's pid.available input) reports.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use swiftlet_common::{EventKind, NODE_SLOT, Resolution, Signal};

use crate::{
    kernel,
    maps::{EXIT_HAS_GROUP_DEAD, LAYOUT, PROCS, WATCH_EXIT, control, slot},
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

#[inline(always)]
fn remember(tgid: u32, memcg: u64, r: &Resolution) {
    if r.present == 0 {
        let _ = PROCS.remove(&tgid);
    } else if PROCS.insert(&tgid, &memcg, 0).is_err() {
        if let Some(ctl) = control() {
            // SAFETY: ctl points at the control map's single element.
            bump(unsafe { &mut (*ctl).proc_table_full });
        }
    }
}

/// sched_process_fork(struct task_struct *parent, struct task_struct *child)
#[btf_tracepoint(function = "sched_process_fork")]
pub fn process_fork(ctx: BtfTracePointContext) -> i32 {
    if LAYOUT.load().valid == 0 {
        return 0;
    }
    let child = ctx.arg::<u64>(1);
    let (Some(pid), Some(tgid)) = (kernel::task_pid(child), kernel::task_tgid(child)) else {
        return 0;
    };
    count_node_task(1, pid);
    if pid != tgid {
        return 0; // a new thread, not a new process
    }
    let Some(memcg) = kernel::task_memcg(child) else { return 0 };
    let Some(r) = resolve(memcg) else { return 0 };
    if r.present != 0 {
        apply_count(r, Signal::Processes, 1, pid, true);
        remember(tgid, memcg, r);
    }
    0
}

/// sched_process_exit(struct task_struct *p[, bool group_dead])
#[btf_tracepoint(function = "sched_process_exit")]
pub fn process_exit(ctx: BtfTracePointContext) -> i32 {
    if LAYOUT.load().valid == 0 {
        return 0;
    }
    let task = ctx.arg::<u64>(0);
    let (Some(pid), Some(tgid)) = (kernel::task_pid(task), kernel::task_tgid(task)) else {
        return 0;
    };
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
    // SAFETY: read-only lookup.
    if unsafe { WATCH_EXIT.get(&tgid) }.is_some() {
        let _ = WATCH_EXIT.remove(&tgid);
        // SAFETY: no preconditions.
        let now = unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() };
        emit(EventKind::ProcessExit, 0, now, 0, u32::MAX, 0, 0, 0, tgid, 0);
    }
    // SAFETY: read-only lookup of a u64 value.
    let memcg = match unsafe { PROCS.get(&tgid) } {
        Some(m) => *m,
        None => match kernel::task_memcg(task) {
            Some(m) => m,
            None => return 0,
        },
    };
    let _ = PROCS.remove(&tgid);
    if let Some(r) = resolve(memcg) {
        apply_count(r, Signal::Processes, -1, pid, true);
    }
    0
}

/// cgroup_attach_task(struct cgroup *dst, const char *path,
///                    struct task_struct *task, bool threadgroup)
///
/// Fires after the move, once per hierarchy on cgroup v1; only a change of
/// memory cgroup matters here.
#[btf_tracepoint(function = "cgroup_attach_task")]
pub fn cgroup_attach(ctx: BtfTracePointContext) -> i32 {
    if LAYOUT.load().valid == 0 {
        return 0;
    }
    let task = ctx.arg::<u64>(2);
    let (Some(pid), Some(tgid)) = (kernel::task_pid(task), kernel::task_tgid(task)) else {
        return 0;
    };
    if pid != tgid {
        return 0;
    }
    let Some(new) = kernel::task_memcg(task) else { return 0 };
    // SAFETY: read-only lookup of a u64 value.
    let old = unsafe { PROCS.get(&tgid) }.copied();
    if old == Some(new) {
        return 0;
    }
    if let Some(old) = old {
        if let Some(r) = resolve(old) {
            apply_count(r, Signal::Processes, -1, pid, true);
        }
    }
    if let Some(r) = resolve(new) {
        if r.present != 0 {
            apply_count(r, Signal::Processes, 1, pid, true);
        }
        remember(tgid, new, r);
    }
    0
}
