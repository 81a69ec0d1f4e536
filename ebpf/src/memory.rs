//! Memory working set, from every memcg statistics update.
//!
//! `mod_memcg_lruvec_state` fires on each change of a memcg's per-node
//! statistics, in the context that caused it. We act on three items only:
//! anon and file pages (which move whenever user memory is charged or freed)
//! and inactive file pages (the part of usage the working set leaves out).
//! For registered cgroups, usage is read from the memcg's own page counter,
//! which is exactly what `memory.usage_in_bytes`/`memory.current` report,
//! kernel memory included; inactive_file is kept from the deltas.

use aya_ebpf::{helpers::bpf_ktime_get_ns, macros::btf_tracepoint, programs::BtfTracePointContext};
use swiftlet_common::{MAX_CHAIN, NODE_SLOT, Resolution, Signal};

use crate::{
    kernel, kill,
    maps::{LAYOUT, slot},
    threshold::{atomic_add, evaluate, resolve},
};

#[btf_tracepoint(function = "mod_memcg_lruvec_state")]
pub fn memcg_lruvec_state(ctx: BtfTracePointContext) -> i32 {
    let l = LAYOUT.load();
    // The tracepoint passes (struct mem_cgroup *memcg, int item, int val).
    let item = ctx.arg::<u64>(1) as u32;
    let inactive_file = item == l.nr_inactive_file;
    if !(inactive_file || item == l.nr_anon_mapped || item == l.nr_file_pages) || l.valid == 0 {
        return 0;
    }
    // A victim being killed: whichever of its tasks charges memory next is
    // signalled right away (one cheap load when nothing is doomed).
    let doomed = kill::doomed();
    if doomed != 0 {
        kill::kill_current_if_member(doomed);
    }
    let delta = ctx.arg::<u64>(2) as i32 as i64;
    let memcg = ctx.arg::<u64>(0);
    // SAFETY: no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let pid = kernel::task_pid(kernel::current_task()).unwrap_or(0);

    // The node: root-hierarchy anon + file pages, as v1's root
    // memory.usage_in_bytes counts them, minus inactive file pages.
    if let Some(node) = slot(NODE_SLOT) {
        // SAFETY: `node` points into the slot array.
        unsafe {
            if inactive_file {
                atomic_add(&mut (*node).inactive_file_pages, delta);
            } else {
                atomic_add(&mut (*node).usage_pages, delta);
            }
            core::ptr::write_volatile(&mut (*node).updated_ns, now);
            let ws = (*node).working_set_pages();
            evaluate(NODE_SLOT, node, Signal::MemoryWorkingSet, ws, now, pid, true);
        }
    }

    let Some(r) = resolve(memcg) else { return 0 };
    update_chain(&r, inactive_file, delta, now, pid);
    0
}

/// Brings every registered slot of a resolution up to date: its page
/// counter read directly (what `memory.current` / `memory.usage_in_bytes`
/// report), with `inactive`, `delta` added to its inactive file pages, and
/// its memory threshold evaluated. Shared by every memory strategy.
///
/// `inactive` is a flag rather than "delta != 0" on purpose: the verifier
/// learns a flag's value at the first branch, but would split its states on
/// a signed delta's "!= 0" in every iteration of the loop.
#[inline(always)]
pub fn update_chain(r: &Resolution, inactive: bool, delta: i64, now: u64, pid: u32) {
    let mut i = 0;
    while i < MAX_CHAIN {
        if i >= r.len as usize {
            break;
        }
        let index = r.slots[i];
        if let Some(s) = slot(index) {
            // SAFETY: `s` points into the slot array.
            unsafe {
                if inactive {
                    atomic_add(&mut (*s).inactive_file_pages, delta);
                }
                if let Some(usage) = kernel::memcg_usage_pages(r.memcg[i]) {
                    core::ptr::write_volatile(&mut (*s).usage_pages, usage);
                }
                core::ptr::write_volatile(&mut (*s).memcg, r.memcg[i]);
                core::ptr::write_volatile(&mut (*s).updated_ns, now);
                let ws = (*s).working_set_pages();
                evaluate(index, s, Signal::MemoryWorkingSet, ws, now, pid, true);
            }
        }
        i += 1;
    }
}
