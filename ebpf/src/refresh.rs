//! Re-reads registered cgroups' page counters on the agent's request.
//!
//! Freed memory is uncharged after the last statistics event of the free
//! (the TLB flush batches it), so a cgroup that shrinks and then goes quiet
//! would keep its old usage. Before it reads the slots, the agent calls
//! getpgid(2) with the first slot of a batch and this instance's tag as
//! argument; this program, filtered to the agent's own tgid (in its own pid
//! namespace) and that tag, brings those [`REFRESH_BATCH`] slots up
//! to date and re-evaluates their memory thresholds. One syscall refreshes
//! 64 cgroups: a loop short enough for the verifiers of older kernels (6.1
//! gives up on long jump sequences) and cheap to verify on slow CPUs.

use aya_ebpf::{
    bindings::bpf_pidns_info, helpers::bpf_get_ns_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};
use swiftlet_common::{REFRESH_BATCH, REFRESH_TAG_MAX, REFRESH_TAG_SHIFT, Signal, growth, slot_flags};

use crate::{
    kernel,
    maps::{AGENT_PIDNS_DEV, AGENT_PIDNS_INO, AGENT_TGID, REFRESH_TAG, control, slot},
    threshold::{bump, evaluate},
};

/// Offset of the first argument in a `syscalls/sys_enter_*` record.
const SYS_ENTER_ARG0: usize = 16;

/// True when the current task belongs to the agent: its tgid as the
/// agent's own pid namespace numbers it (the agent may run in a container,
/// where `getpid()` is not the kernel's global tgid).
#[inline(always)]
fn from_agent() -> bool {
    let mut ns = bpf_pidns_info { pid: 0, tgid: 0 };
    // SAFETY: `ns` is a writable struct of the size passed.
    let rc = unsafe {
        bpf_get_ns_current_pid_tgid(
            AGENT_PIDNS_DEV.load(),
            AGENT_PIDNS_INO.load(),
            &mut ns,
            core::mem::size_of::<bpf_pidns_info>() as u32,
        )
    };
    rc == 0 && ns.tgid == AGENT_TGID.load()
}

#[tracepoint]
pub fn refresh(ctx: TracePointContext) -> u32 {
    // SAFETY: an offset within the tracepoint record.
    let arg = unsafe { ctx.read_at::<u64>(SYS_ENTER_ARG0) }.unwrap_or(0) as u32;
    if (arg >> REFRESH_TAG_SHIFT) & REFRESH_TAG_MAX != REFRESH_TAG.load() || !from_agent() {
        return 0;
    }
    let Some(ctl) = control() else { return 0 };
    // SAFETY: ctl points at the control map's single element.
    unsafe { bump(&mut (*ctl).refresh_runs) };
    crate::wakeup::release_if_expired();
    let start = arg & ((1 << REFRESH_TAG_SHIFT) - 1);
    // SAFETY: as above.
    let high = unsafe { core::ptr::read_volatile(&(*ctl).slot_high_water) };
    if start == 0 {
        // The node, from the kernel's per-node statistics when their layout
        // is known (with either memory strategy); a no-op otherwise. The
        // agent's own memory cgroup leads to the pgdats not yet cached. A
        // crossing seen here executes the victim plan as any other: the
        // agent is never the victim's, so the victim is doomed and dies at
        // its next charge, or by the agent's hand.
        let memcg = kernel::task_memcg(kernel::current_task()).unwrap_or(0);
        crate::memory::node_from_kernel(memcg, 0, growth::UNKNOWN);
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
                        // kubepods' line kills as the node's does.
                        let kills = flags & slot_flags::KUBEPODS != 0;
                        evaluate(i, Signal::MemoryWorkingSet, ws, 0, kills);
                    }
                }
            }
        }
    }
    0
}
