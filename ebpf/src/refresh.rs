//! Re-reads every registered cgroup's page counter on the agent's request.
//!
//! Freed memory is uncharged after the last statistics event of the free
//! (the TLB flush batches it), so a cgroup that shrinks and then goes quiet
//! would keep its old usage. The agent calls getppid(2) before it reads the
//! slots; this program, filtered to the agent's own tgid, brings every slot
//! up to date and re-evaluates its memory threshold. One syscall refreshes
//! all pods.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::tracepoint,
    programs::TracePointContext,
};
use swiftlet_common::{MAX_SLOTS, Signal, memory_strategy, slot_flags};

use crate::{
    kernel,
    maps::{AGENT_TGID, control, slot},
    threshold::evaluate,
};

#[tracepoint]
pub fn refresh(_ctx: TracePointContext) -> u32 {
    if (bpf_get_current_pid_tgid() >> 32) as u32 != AGENT_TGID.load() {
        return 0;
    }
    let Some(ctl) = control() else { return 0 };
    // SAFETY: ctl points at the control map's single element.
    let high = unsafe { core::ptr::read_volatile(&(*ctl).slot_high_water) };
    // SAFETY: no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: as above.
    if unsafe { core::ptr::read_volatile(&(*ctl).memory_strategy) } == memory_strategy::PAGE_COUNTER {
        crate::charge::node_from_vmstat(now, 0, false);
    }
    let mut i: u32 = 1;
    while i < MAX_SLOTS {
        if i >= high {
            break;
        }
        if let Some(s) = slot(i) {
            // SAFETY: `s` points into the slot array.
            unsafe {
                let flags = core::ptr::read_volatile(&(*s).flags);
                let memcg = core::ptr::read_volatile(&(*s).memcg);
                if flags & slot_flags::ACTIVE != 0 && flags & slot_flags::REMOVED == 0 && memcg != 0 {
                    if let Some(usage) = kernel::memcg_usage_pages(memcg) {
                        core::ptr::write_volatile(&mut (*s).usage_pages, usage);
                        let ws = (*s).working_set_pages();
                        evaluate(i, s, Signal::MemoryWorkingSet, ws, now, 0, false);
                    }
                }
            }
        }
        i += 1;
    }
    0
}
