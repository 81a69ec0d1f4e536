//! Re-reads registered cgroups' page counters on the agent's request.
//!
//! Freed memory is uncharged after the last statistics event of the free
//! (the TLB flush batches it), so a cgroup that shrinks and then goes quiet
//! would keep its old usage. Before it reads the slots, the agent calls
//! getpgid(2) with the first slot of a batch as argument; this program,
//! filtered to the agent's own tgid, brings those [`REFRESH_BATCH`] slots up
//! to date and re-evaluates their memory thresholds. One syscall refreshes
//! 64 cgroups: a loop short enough for the verifiers of older kernels (6.1
//! gives up on long jump sequences) and cheap to verify on slow CPUs.

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext};
use swiftlet_common::{REFRESH_BATCH, Signal, slot_flags};

use crate::{
    kernel,
    maps::{AGENT_TGID, control, slot},
    threshold::evaluate,
};

/// Offset of the first argument in a `syscalls/sys_enter_*` record.
const SYS_ENTER_ARG0: usize = 16;

#[tracepoint]
pub fn refresh(ctx: TracePointContext) -> u32 {
    if (bpf_get_current_pid_tgid() >> 32) as u32 != AGENT_TGID.load() {
        return 0;
    }
    let Some(ctl) = control() else { return 0 };
    // SAFETY: an offset within the tracepoint record.
    let start = unsafe { ctx.read_at::<u64>(SYS_ENTER_ARG0) }.unwrap_or(0) as u32;
    // SAFETY: ctl points at the control map's single element.
    let high = unsafe { core::ptr::read_volatile(&(*ctl).slot_high_water) };
    if start == 0 {
        // The node, from the kernel's per-node statistics when their layout
        // is known (with either memory strategy); a no-op otherwise. The
        // agent's own memory cgroup leads to the pgdats not yet cached.
        let memcg = kernel::task_memcg(kernel::current_task()).unwrap_or(0);
        crate::memory::node_from_kernel(memcg, 0, false);
    }
    let mut n: u32 = 0;
    while n < REFRESH_BATCH {
        // Slot 0 is the node, refreshed above.
        let i = start + n;
        n += 1;
        if i == 0 {
            continue;
        }
        if i >= high {
            break;
        }
        if let Some(s) = slot(i) {
            // SAFETY: `s` points into the slot array.
            unsafe {
                let flags = core::ptr::read_volatile(&(*s).flags);
                let memcg = core::ptr::read_volatile(&(*s).memcg);
                if flags & (slot_flags::ACTIVE | slot_flags::REMOVED) == slot_flags::ACTIVE && memcg != 0 {
                    if let Some(usage) = kernel::memcg_usage_pages(memcg) {
                        core::ptr::write_volatile(&mut (*s).usage_pages, usage);
                        let ws = (*s).working_set_pages();
                        evaluate(i, Signal::MemoryWorkingSet, ws, 0, false);
                    }
                }
            }
        }
    }
    0
}
