//! Memory on kernels without the memcg statistics tracepoints (Debian's 6.1
//! and 6.12 among them): hooks on the memory controller's own functions.
//!
//! - Usage: fexit on `page_counter_try_charge`, `page_counter_charge` and
//!   `page_counter_uncharge`. These live in mm/page_counter.c and are only
//!   called from other files, so no call can be inlined past the hook. Each
//!   call names the leaf's counter; after it returns, every registered
//!   ancestor's counter is read directly, as the tracepoint path does. The
//!   memory controller charges in per-CPU batches of 64 pages, so this fires
//!   once per batch, not once per page, and is exact to that batching,
//!   which is also what `memory.current` shows.
//! - Inactive file pages: the deltas of the LRU list sizes, from fentry on
//!   `mem_cgroup_update_lru_size` (classic LRU) or, when the multi-gen LRU
//!   is on (6.12's default), on `__mod_lruvec_state` filtered to
//!   NR_INACTIVE_FILE: MGLRU moves pages between generations without the
//!   former, while every LRU size update, MGLRU's included, goes through
//!   `__update_lru_size`, which calls the latter from other files.
//! - The node: the kernel's per-node statistics, read at every charge
//!   event.

use aya_ebpf::{
    macros::{fentry, fexit},
    programs::{FEntryContext, FExitContext},
};

use swiftlet_common::growth;

use crate::{
    kernel, kill,
    maps::layout,
    memory::{node_from_kernel, update_chain},
    threshold::{PID_CURRENT, resolve},
};

/// A page counter moved: bring the memcg's registered slots and the node up
/// to date.
#[inline(always)]
fn counter_moved(counter: u64) -> i32 {
    if layout!(valid) == 0 || layout!(charge_valid) == 0 {
        return 0;
    }
    let doomed = kill::doomed();
    if doomed != 0 {
        kill::kill_current_if_member(doomed);
    }
    let Some(memcg) = kernel::memcg_of_counter(counter) else { return 0 };
    // A page counter does not say what was charged: a crossing seen here
    // is of unknown growth (reclaim-first leaves it to the agent).
    node_from_kernel(memcg, PID_CURRENT, growth::UNKNOWN);
    let Some(r) = resolve(memcg) else { return 0 };
    update_chain(r, 0, PID_CURRENT, growth::UNKNOWN);
    0
}

/// page_counter_try_charge(struct page_counter *counter, unsigned long nr_pages,
///                         struct page_counter **fail)
#[fexit(function = "page_counter_try_charge")]
pub fn memcg_try_charge(ctx: FExitContext) -> i32 {
    counter_moved(kernel::scalar(ctx.arg::<u64>(0)))
}

/// page_counter_charge(struct page_counter *counter, unsigned long nr_pages):
/// charges past the limit (dying tasks, __GFP_NOFAIL).
#[fexit(function = "page_counter_charge")]
pub fn memcg_charge(ctx: FExitContext) -> i32 {
    counter_moved(kernel::scalar(ctx.arg::<u64>(0)))
}

/// page_counter_uncharge(struct page_counter *counter, unsigned long nr_pages)
#[fexit(function = "page_counter_uncharge")]
pub fn memcg_uncharge(ctx: FExitContext) -> i32 {
    counter_moved(kernel::scalar(ctx.arg::<u64>(0)))
}

/// Inactive file pages of a lruvec changed by `delta`.
#[inline(always)]
fn inactive_moved(lruvec: u64, delta: i64) -> i32 {
    if delta == 0 {
        return 0;
    }
    let Some(memcg) = kernel::lruvec_memcg(lruvec) else { return 0 };
    let Some(r) = resolve(memcg) else { return 0 };
    // Inactive file pages made active: page-cache growth.
    update_chain(r, delta, PID_CURRENT, growth::FILE);
    0
}

/// mem_cgroup_update_lru_size(struct lruvec *lruvec, enum lru_list lru,
///                            int zid, int nr_pages)
#[fentry(function = "mem_cgroup_update_lru_size")]
pub fn lru_size(ctx: FEntryContext) -> i32 {
    if layout!(valid) == 0 || layout!(charge_valid) == 0 || ctx.arg::<u64>(1) as u32 != layout!(lru_inactive_file) {
        return 0;
    }
    inactive_moved(kernel::scalar(ctx.arg::<u64>(0)), ctx.arg::<u64>(3) as i32 as i64)
}

/// __mod_lruvec_state(struct lruvec *lruvec, enum node_stat_item idx, int val)
#[fentry(function = "__mod_lruvec_state")]
pub fn lruvec_state(ctx: FEntryContext) -> i32 {
    if layout!(valid) == 0 || layout!(charge_valid) == 0 || ctx.arg::<u64>(1) as u32 != layout!(nr_inactive_file) {
        return 0;
    }
    inactive_moved(kernel::scalar(ctx.arg::<u64>(0)), ctx.arg::<u64>(2) as i32 as i64)
}
