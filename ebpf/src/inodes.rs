//! Inodes created and freed by each registered cgroup's tasks, from the
//! filesystem's own allocation tracepoints (ext4 here; the agent attaches
//! what the kernel has and says which).

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use swiftlet_common::Signal;

use crate::{
    kernel,
    maps::layout,
    threshold::{apply_count, resolve},
};

#[inline(always)]
fn count_current(delta: i64) {
    if layout!(valid) == 0 {
        return;
    }
    let task = kernel::current_task();
    let Some(memcg) = kernel::task_memcg(task) else { return };
    let Some(r) = resolve(memcg) else { return };
    if r.present != 0 {
        apply_count(r, Signal::Inodes, delta, kernel::task_pid(task).unwrap_or(0), false);
    }
}

#[tracepoint]
pub fn inode_alloc(_ctx: TracePointContext) -> u32 {
    count_current(1);
    0
}

#[tracepoint]
pub fn inode_free(_ctx: TracePointContext) -> u32 {
    count_current(-1);
    0
}
