//! Process counts per registered cgroup, and tasks on the node.
//!
//! A process is counted where it lives: at fork in the child's memory
//! cgroup, moved on migration (cgroup_attach_task fires after the move, so
//! the table of counted processes remembers where each one was), and taken
//! out at exit. The node slot counts every task, threads included, which is
//! what `sysinfo().procs` (the kubelet's pid.available input) reports.
//!
//! The node slot's count is batched per CPU (`ProcCpu::node_tasks`, up to
//! ±NODE_TASK_BATCH tasks per CPU before they reach the slot and its
//! pid.available line); the agent adds the CPUs' pending deltas when it
//! reads the node, so its figure is exact.
//!
//! Cost: these run at every fork and exit on the machine, and fork and exit
//! leave the caches cold, so what they cost is mostly the cache lines they
//! touch and the calls they make (each call and return pays retpoline and
//! return-thunk mitigations). The common path: the task's pid, tgid and
//! memcg loaded straight through the tracepoint's BTF-typed task pointer
//! (no helper), this CPU's `ProcCpu` (the node delta and a one-entry
//! resolution cache, so no `RESOLVE` hash lookup while the CPU keeps
//! forking in the same cgroup), the control generation, an atomic add on
//! each registered slot with no call unless the slot has a process line
//! (`CgroupSlot::lines`), and one store or load in the process table. The
//! exit-watch table is looked up only while the agent watches something,
//! and an in-kernel kill's wake-up hold (`wakeup.rs`) costs a process's exit
//! one load while nothing is held.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use swiftlet_common::{EventKind, NODE_SLOT, NODE_TASK_BATCH, ProcCpu, Signal};

use crate::{
    kernel,
    maps::{EXIT_HAS_GROUP_DEAD, PROC_CPU, PROCS, WATCH_EXIT, control, counted_memcg, layout, slot},
    threshold::{apply_processes, atomic_add, bump, emit, evaluate, resolve},
};

/// Counts a task forked (+1) or exited (−1) on this CPU for the node. The
/// deltas gather in this CPU's `ProcCpu::node_tasks` and reach the node
/// slot, and its pid.available line, once they make up ±NODE_TASK_BATCH:
/// the slot's shared line is then written once per batch rather than at
/// every fork and exit (its transfer between CPUs was the largest single
/// cost left). The agent adds the CPUs' pending deltas when it reads the
/// node, so its figure stays exact; a crossing is seen at most
/// NODE_TASK_BATCH − 1 tasks per CPU late.
#[inline(always)]
fn count_node_task(cpu: *mut ProcCpu, delta: i64, pid: u32) {
    // SAFETY: this CPU's element. Only the fork and exit programs use this
    // field, and neither can run nested in the other on one CPU (both run
    // in task context with preemption disabled), so plain stores do.
    let pending = unsafe { (*cpu).node_tasks } + delta;
    if pending > -NODE_TASK_BATCH && pending < NODE_TASK_BATCH {
        unsafe { (*cpu).node_tasks = pending };
        return;
    }
    unsafe { (*cpu).node_tasks = 0 };
    if let Some(node) = slot(NODE_SLOT) {
        // SAFETY: `node` points into the slot array.
        let value = unsafe {
            atomic_add(&mut (*node).processes, pending);
            core::ptr::read_volatile(&(*node).processes).max(0) as u64
        };
        evaluate(NODE_SLOT, Signal::Processes, value, pid, true);
    }
}

/// Applies a process delta to the registered slots `memcg` counts towards.
/// Fork storms and their exits come from few cgroups, so each CPU keeps its
/// last resolution (`ProcCpu`): one compare with the control generation
/// instead of a lookup in the shared `RESOLVE` hash (hashing, the bucket
/// array and the element, lines that fork and exit had evicted).
#[inline(always)]
fn count_process(cpu: *mut ProcCpu, memcg: u64, delta: i64, pid: u32) -> bool {
    let Some(ctl) = control() else { return false };
    // SAFETY: ctl points at the control map's single element; `cpu` is this
    // CPU's element, used by these programs only (see count_node_task).
    unsafe {
        let generation = core::ptr::read_volatile(&(*ctl).generation);
        if (*cpu).memcg != memcg || (*cpu).generation != generation {
            let Some(r) = resolve(memcg) else { return false };
            (*cpu).present = r.present;
            (*cpu).slots = r.slots;
            (*cpu).generation = r.generation;
            (*cpu).memcg = memcg;
        }
        let present = (*cpu).present;
        if present != 0 {
            apply_processes(present, &(*cpu).slots, delta, pid);
        }
        present != 0
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
    let Some(cpu) = PROC_CPU.get_ptr_mut(0) else { return 0 };
    let child = ctx.arg::<u64>(1);
    let (pid, tgid) = kernel::btf_task_pid_tgid(child);
    count_node_task(cpu, 1, pid);
    if pid != tgid {
        return 0; // a new thread, not a new process
    }
    // SAFETY: `cpu` is this CPU's element.
    let memcg = kernel::btf_task_memcg(child, unsafe { &raw mut (*cpu).scratch });
    if memcg == 0 {
        return 0;
    }
    if count_process(cpu, memcg, 1, pid) {
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
    let Some(cpu) = PROC_CPU.get_ptr_mut(0) else { return 0 };
    let task = ctx.arg::<u64>(0);
    let (pid, tgid) = kernel::btf_task_pid_tgid(task);
    count_node_task(cpu, -1, pid);
    // The process ends with its last thread; before 6.13 the tracepoint does
    // not say which one that is, and the leader's exit stands in for it.
    let process_ends = if EXIT_HAS_GROUP_DEAD.load() != 0 { ctx.arg::<u64>(1) as u8 != 0 } else { pid == tgid };
    if !process_ends {
        return 0;
    }
    crate::wakeup::release_on_exit(tgid);
    report_watched_exit(tgid);
    // Counted at fork or migration: where it was counted. Otherwise (it was
    // there before the programs, and the agent's registration counted it)
    // where it lives. The entry is left as it is: the next process with this
    // tgid overwrites it at its fork, and a store here would pull the line
    // from the CPU that forked this process for nothing.
    let memcg = match counted_memcg(tgid) {
        // SAFETY: `cpu` is this CPU's element.
        0 => kernel::btf_task_memcg(task, unsafe { &raw mut (*cpu).scratch }),
        m => m,
    };
    if memcg != 0 {
        count_process(cpu, memcg, -1, pid);
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
    emit(EventKind::ProcessExit, 0, now, 0, u32::MAX, 0, 0, 0, tgid, 0, 0, 0);
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
    let Some(cpu) = PROC_CPU.get_ptr_mut(0) else { return 0 };
    let task = ctx.arg::<u64>(2);
    let (pid, tgid) = kernel::btf_task_pid_tgid(task);
    if pid != tgid {
        return 0;
    }
    // SAFETY: `cpu` is this CPU's element.
    let new = kernel::btf_task_memcg(task, unsafe { &raw mut (*cpu).scratch });
    if new == 0 {
        return 0;
    }
    let old = counted_memcg(tgid);
    if old == new {
        return 0;
    }
    if old != 0 {
        if let Some(r) = resolve(old) {
            apply_processes(r.present, &r.slots, -1, pid);
        }
    }
    // Not through this CPU's resolution cache: a migration is the one event
    // that meets two memcgs at once, and refilling the cache cost more than
    // the lookup it saves (measured with a process moved in and out of a pod).
    match resolve(new) {
        Some(r) if r.present != 0 => {
            apply_processes(r.present, &r.slots, 1, pid);
            remember(tgid, new);
        }
        _ => {
            if old != 0 {
                remember(tgid, 0);
            }
        }
    }
    0
}
