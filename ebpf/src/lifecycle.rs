//! Cgroup creation and removal, and the kernel OOM killer's choices.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};
use swiftlet_common::{EventKind, slot_flags};

use crate::{
    kernel,
    maps::{CGROUP_SLOT, MARK_VICTIM_PID_ONLY, control, counted_memcg, layout, slot},
    threshold::{bump, emit},
};

/// Offsets in the cgroup_mkdir/cgroup_rmdir tracepoint record: `int root`
/// (the hierarchy id) and `u64 id`. Stable since the tracepoints' creation.
const CGROUP_EV_ROOT: usize = 8;
const CGROUP_EV_ID: usize = 16;

/// Any change in the memory hierarchy may reuse a `struct mem_cgroup`
/// address, so every cached resolution must be recomputed.
#[inline(always)]
fn memory_tree_changed(ctx: &TracePointContext) -> Option<u64> {
    // SAFETY: offsets within the tracepoint record.
    let root: i32 = unsafe { ctx.read_at(CGROUP_EV_ROOT) }.ok()?;
    if root as u32 != layout!(memory_hierarchy_id) {
        return None;
    }
    let ctl = control()?;
    // SAFETY: ctl points at the control map's single element.
    bump(unsafe { &mut (*ctl).generation });
    // SAFETY: as above.
    unsafe { ctx.read_at(CGROUP_EV_ID) }.ok()
}

#[tracepoint]
pub fn cgroup_mkdir(ctx: TracePointContext) -> u32 {
    let _ = memory_tree_changed(&ctx);
    0
}

#[tracepoint]
pub fn cgroup_rmdir(ctx: TracePointContext) -> u32 {
    let Some(id) = memory_tree_changed(&ctx) else { return 0 };
    // A removed victim's mark goes with it: its memcg may be reused.
    crate::kill::forget_doomed(id);
    // SAFETY: read-only lookup of a u32 value.
    let Some(index) = (unsafe { CGROUP_SLOT.get(&id) }).copied() else { return 0 };
    if let Some(s) = slot(index) {
        // SAFETY: `s` points into the slot array.
        unsafe { (*s).flags |= slot_flags::REMOVED };
    }
    aya_log_ebpf::debug!(&ctx, "registered cgroup {} (slot {}) removed", id, index);
    // SAFETY: no preconditions.
    emit(EventKind::CgroupRemoved, 0, unsafe { bpf_ktime_get_ns() }, id, index, 0, 0, 0, 0, 0, 0, 0);
    0
}

/// mark_victim(struct task_struct *task, uid_t uid), or mark_victim(int pid)
/// on older kernels, where the victim's memory cgroup comes from the table of
/// processes counted in registered cgroups (victims elsewhere report none).
#[btf_tracepoint(function = "mark_victim")]
pub fn oom_mark_victim(ctx: BtfTracePointContext) -> i32 {
    let (memcg, pid) = if MARK_VICTIM_PID_ONLY.load() != 0 {
        let pid = ctx.arg::<u64>(0) as u32;
        (counted_memcg(pid), pid)
    } else {
        let task = ctx.arg::<u64>(0);
        (kernel::task_memcg(task).unwrap_or(0), kernel::task_pid(task).unwrap_or(0))
    };
    let cgroup_id = if memcg != 0 { kernel::css_cgroup_id(memcg).unwrap_or(0) } else { 0 };
    // SAFETY: read-only lookup of a u32 value.
    let index = unsafe { CGROUP_SLOT.get(&cgroup_id) }.copied().unwrap_or(u32::MAX);
    // SAFETY: no preconditions.
    emit(EventKind::OomVictim, 0, unsafe { bpf_ktime_get_ns() }, cgroup_id, index, 0, 0, 0, pid, 0, 0, 0);
    0
}
