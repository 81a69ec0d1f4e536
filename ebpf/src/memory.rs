//! Memory working set, from every memcg statistics update.
//!
//! `mod_memcg_lruvec_state` fires on each change of a memcg's per-node
//! statistics, in the context that caused it. We act on three items only:
//! anon and file pages (which move whenever user memory is charged or freed)
//! and inactive file pages (the part of usage the working set leaves out).
//! For registered cgroups, usage is read from the memcg's own page counter,
//! which is exactly what `memory.usage_in_bytes`/`memory.current` report,
//! kernel memory included; inactive_file is kept from the deltas. The node
//! is read from the kernel's per-node statistics once a CPU has seen a batch
//! of pages (from its own deltas only where their layout is unknown), and
//! near its line at every page, with the pages each CPU holds back from
//! those statistics; where those cannot be read, also at every CPU's idle
//! entry, where the kernel folds its per-CPU statistics without a memory
//! event.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use swiftlet_common::{NODE_SLOT, Resolution, Signal, growth};

use crate::{
    kernel, kill,
    maps::{NODE_LINE_SLACK, NODE_MEMORY_BATCH, NODE_PENDING, layout, slot},
    threshold::{PID_CURRENT, atomic_add, for_each_present, resolve, swiftlet_evaluate},
};

#[btf_tracepoint(function = "mod_memcg_lruvec_state")]
pub fn memcg_lruvec_state(ctx: BtfTracePointContext) -> i32 {
    // The tracepoint passes (struct mem_cgroup *memcg, int item, int val).
    let item = ctx.arg::<u64>(1) as u32;
    let inactive_file = item == layout!(nr_inactive_file);
    if !(inactive_file || item == layout!(nr_anon_mapped) || item == layout!(nr_file_pages)) || layout!(valid) == 0 {
        return 0;
    }
    // A victim being killed: whichever of its tasks charges memory next is
    // signalled right away (one cheap load when nothing is doomed).
    let doomed = kill::doomed();
    if doomed != 0 {
        kill::kill_current_if_member(doomed);
    }
    let delta = ctx.arg::<u64>(2) as i32 as i64;
    let memcg = kernel::scalar(ctx.arg::<u64>(0));
    // What a crossing seen here is made of: reclaim-first leaves page cache
    // (file pages, or inactive file pages made active) to the agent.
    let kind = if item == layout!(nr_anon_mapped) { growth::ANON } else { growth::FILE };
    node_delta(memcg, inactive_file, delta, kind);
    if let Some(r) = resolve(memcg) {
        update_chain(r, if inactive_file { delta } else { 0 }, PID_CURRENT, kind);
    }
    // A crossing above may have doomed a pod other than the current task's
    // (another pod allocated while the victim slept).
    kill::signal_pending_victim();
    0
}

/// The node: anon + file pages, as v1's root memory.usage_in_bytes counts
/// them, minus inactive file pages. Deltas gather per CPU; once they make up
/// `NODE_MEMORY_BATCH` pages, by default a charge batch (64) as the kernel's
/// own counters do, the node slot is brought up to date and its threshold
/// evaluated, so that the slot's shared cache line is not written by every
/// CPU on every page. Near the node's memory line, where a batch held back
/// on each CPU would make the crossing late (64 pages per CPU is 1 ms of a
/// 256 MiB/s ramp), every page is added at once. A crossing is put down
/// to `kind`, the item of the update that brought the batch in (near the
/// line, the page that crossed it).
///
/// The slot takes the kernel's per-node statistics (see
/// [`kernel::node_stats`]) when their layout is known: every instance of
/// these programs, the agent's and any observer's, then holds the same
/// figure, with no drift from a seed read while pages moved or from events
/// the kernel dropped. Otherwise the deltas are added to the seed the agent
/// wrote.
#[inline(always)]
fn node_delta(memcg: u64, inactive_file: bool, delta: i64, kind: u32) {
    let Some(pending) = NODE_PENDING.get_ptr_mut(0) else { return };
    let Some(node) = slot(NODE_SLOT) else { return };
    // SAFETY: this CPU's element. Only this program uses it, and the kernel
    // never runs a program nested in itself on one CPU (an interrupt's
    // event is counted as a miss instead), so plain loads and stores do.
    let (usage, inactive) = unsafe {
        if inactive_file {
            (*pending).inactive_file_pages += delta;
        } else {
            (*pending).usage_pages += delta;
        }
        let (u, i) = ((*pending).usage_pages, (*pending).inactive_file_pages);
        let batch = NODE_MEMORY_BATCH.load() as u64;
        // The working set's own pending (u − i) counts too: page cache
        // reclaimed on this CPU while anonymous memory grows keeps each
        // count short of a batch while the working set moves by both.
        if u.unsigned_abs() < batch
            && i.unsigned_abs() < batch
            && (u - i).unsigned_abs() < batch
            && !near_line(node, u - i)
        {
            return;
        }
        (*pending).usage_pages = 0;
        (*pending).inactive_file_pages = 0;
        (u, i)
    };
    if layout!(nr_node_ids) != 0 {
        node_from_kernel(memcg, PID_CURRENT, kind);
        return;
    }
    // SAFETY: `node` points into the slot array.
    let ws = unsafe {
        if usage != 0 {
            atomic_add(&mut (*node).usage_pages, usage);
        }
        if inactive != 0 {
            atomic_add(&mut (*node).inactive_file_pages, inactive);
        }
        (*node).working_set_pages()
    };
    swiftlet_evaluate(NODE_SLOT, Signal::MemoryWorkingSet as u32, ws, PID_CURRENT, kind);
}

/// `power/cpu_idle`'s state when a CPU leaves idle.
const PWR_EVENT_EXIT: u32 = u32::MAX;

/// The node's line crossed by a fold of the kernel's own statistics. Each
/// CPU holds back up to a stat threshold of every per-node counter, and the
/// kernel folds what it holds into the node's counters when the CPU goes
/// idle with its tick stopped (`quiet_vmstat`) and from its periodic vmstat
/// work, with no memory event at all. A task that allocated up to the line
/// and went to sleep (a ramp between bursts) then crosses it in the
/// kernel's figure at that fold, which the other programs would see only
/// at the node's next memory event, after any reader of the node in
/// between (the refresh). The idle entry right after the fold reads the
/// node again, near the line only (far from it, a few loads and no
/// write). The victim is asleep then, so its planned process is signalled
/// here where the kernel allows it (`kill::signal_pending_victim`);
/// elsewhere it dies at its next charge or by the agent's hand.
///
/// Where the pages the CPUs hold back can be read (`nr_cpu_ids`), the
/// node's figure near the line counts them already and a fold does not move
/// it: the line is crossed at the page that crosses it, by the charging
/// task's own program. The node is then not read here: an idle CPU reading
/// it would see that page as soon as it is counted, and could take the
/// crossing from the charging CPU before that CPU's program gets to it,
/// leaving the victim, which is running, to be signalled from outside.
/// Only a victim left pending elsewhere (by the refresh) is signalled.
#[btf_tracepoint(function = "cpu_idle")]
pub fn node_fold(ctx: BtfTracePointContext) -> i32 {
    // The tracepoint passes (unsigned int state, unsigned int cpu_id).
    if ctx.arg::<u64>(0) as u32 == PWR_EVENT_EXIT || layout!(valid) == 0 || layout!(nr_node_ids) == 0 {
        return 0;
    }
    if layout!(nr_cpu_ids) != 0 {
        kill::signal_pending_victim();
        return 0;
    }
    let Some(node) = slot(NODE_SLOT) else { return 0 };
    if !near_line(node, 0) {
        return 0;
    }
    // The idle task's memory cgroup (the root) leads to the pgdats; they
    // are cached already, since the slot was brought near the line.
    let memcg = kernel::task_memcg(kernel::current_task()).unwrap_or(0);
    node_from_kernel(memcg, 0, growth::UNKNOWN);
    kill::signal_pending_victim();
    0
}

/// True when the node has a memory line and its working set, with `pending`
/// pages of this CPU, is within `NODE_LINE_SLACK` (a batch and the kernel's
/// own counter lag on every CPU) of the trigger or past it. Far from the
/// line this is two loads of lines no CPU writes often: the slot's counters
/// (once per batch) and its thresholds (when the agent moves the line).
#[inline(always)]
fn near_line(node: *mut swiftlet_common::CgroupSlot, pending: i64) -> bool {
    let signal = Signal::MemoryWorkingSet;
    // SAFETY: `node` points into the slot array; plain reads of its fields.
    unsafe {
        if core::ptr::read_volatile(&(*node).lines) & signal.bit() == 0 {
            return false;
        }
        let trigger = core::ptr::read_volatile(&(*node).thresholds[signal as usize].trigger) as i64;
        let ws = core::ptr::read_volatile(&(*node).usage_pages)
            - core::ptr::read_volatile(&(*node).inactive_file_pages)
            + pending;
        trigger != 0 && ws + NODE_LINE_SLACK.load() as i64 >= trigger
    }
}

/// The node's usage (anon + file pages) and inactive file pages from the
/// kernel's per-node statistics (pgdats found through `memcg`, any memory
/// cgroup), and its threshold evaluated with `kind` (a [`growth`] value);
/// a no-op where their layout is unknown. Near the line, the pages every
/// CPU holds back from those statistics are counted too: the line is then
/// crossed at the page that crosses it, in the context of the task that
/// charged it, and not at a later fold of that CPU's statistics, where the
/// task may be asleep (see [`node_fold`]). Far from it, the kernel's
/// counters alone do: they are behind by less than the line's slack.
#[inline(always)]
pub fn node_from_kernel(memcg: u64, pid: u32, kind: u32) {
    let Some(node) = slot(NODE_SLOT) else { return };
    let Some((usage, inactive)) = kernel::node_stats(memcg, near_line(node, 0)) else { return };
    // SAFETY: `node` points into the slot array.
    let ws = unsafe {
        core::ptr::write_volatile(&mut (*node).usage_pages, usage);
        core::ptr::write_volatile(&mut (*node).inactive_file_pages, inactive);
        (*node).working_set_pages()
    };
    swiftlet_evaluate(NODE_SLOT, Signal::MemoryWorkingSet as u32, ws, pid, kind);
}

/// Brings one registered slot up to date: its page counter read directly
/// (what `memory.current` / `memory.usage_in_bytes` report), `inactive_delta`
/// added to its inactive file pages, and its memory threshold evaluated
/// with `kind` (a [`growth`] value). Shared by every memory strategy; a
/// global function, verified once (see `swiftlet_resolve`).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn swiftlet_memory_slot(index: u32, memcg: u64, inactive_delta: i64, pid: u32, kind: u32) -> u32 {
    let Some(s) = slot(index) else { return 0 };
    let usage = kernel::memcg_usage_pages(memcg);
    // The page counter moves in charge batches (64 pages per CPU) while the
    // statistics fire for every page: when neither it nor inactive_file
    // moved, the working set and its threshold's side are what they were,
    // and the update and the evaluation are skipped. (Threshold changes are
    // re-evaluated by the agent's refresh, not here.)
    // SAFETY: `s` points into the slot array; plain reads of its fields.
    let unchanged = unsafe {
        inactive_delta == 0
            && core::ptr::read_volatile(&(*s).memcg) == memcg
            && usage.is_some_and(|u| u == core::ptr::read_volatile(&(*s).usage_pages))
    };
    if unchanged {
        return 0;
    }
    // SAFETY: `s` points into the slot array.
    let ws = unsafe {
        if inactive_delta != 0 {
            atomic_add(&mut (*s).inactive_file_pages, inactive_delta);
        }
        if let Some(usage) = usage {
            core::ptr::write_volatile(&mut (*s).usage_pages, usage);
        }
        core::ptr::write_volatile(&mut (*s).memcg, memcg);
        (*s).working_set_pages()
    };
    swiftlet_evaluate(index, Signal::MemoryWorkingSet as u32, ws, pid, kind)
}

/// [`swiftlet_memory_slot`] for every registered slot of a resolution.
#[inline(always)]
pub fn update_chain(r: &Resolution, inactive_delta: i64, pid: u32, kind: u32) {
    for_each_present(r.present, |i| {
        swiftlet_memory_slot(r.slots[i], r.memcg[i], inactive_delta, pid, kind);
    });
}
