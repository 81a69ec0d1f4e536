//! When the agent's ring buffer reader is woken.
//!
//! Every record wakes it at once, except for a short hold after an
//! in-kernel kill of the task that crossed the line (`Control::
//! wake_held_until_ns`). The reader runs under SCHED_FIFO, and the wake-up
//! lands on the CPU of the event, which is the victim's: woken there, the
//! reader preempted the victim on its way out of the page fault, and the
//! victim met its SIGKILL only once the reader had handled the records
//! (0.1 ms). During the hold, records are committed without a wake-up; the
//! victim's exit ends it and wakes the reader, or, should the victim not
//! exit in time, the first program to run after the deadline does.
//!
//! The hold is ended by compare-and-swap on the deadline, so exactly one
//! program wakes the reader for it.
//!
//! An observer's records never wake its reader (`RECORDS_WAKE_READER`).

use aya_ebpf::{
    bindings::{BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::bpf_ktime_get_ns,
};
use swiftlet_common::WAKE_HOLD_NS;

use crate::{
    maps::{EVENTS, RECORDS_WAKE_READER, control},
    threshold::atomic_cas_u64,
};

/// Holds the reader's wake-ups until `tgid` exits, for [`WAKE_HOLD_NS`] at
/// most. The process is stored before the deadline that makes it valid.
#[inline(always)]
pub fn hold_until_exit_of(tgid: u32, now: u64) {
    let Some(ctl) = control() else { return };
    // SAFETY: ctl points at the control map's single element.
    unsafe {
        core::ptr::write_volatile(&mut (*ctl).wake_held_tgid, tgid);
        core::ptr::write_volatile(&mut (*ctl).wake_held_until_ns, now + WAKE_HOLD_NS);
    }
}

/// The flags to commit a record with: no wake-up during a hold; once its
/// deadline has passed, the record that ends it forces one.
#[inline(always)]
pub fn commit_flags() -> u64 {
    if RECORDS_WAKE_READER.load() == 0 {
        return BPF_RB_NO_WAKEUP as u64;
    }
    let Some(ctl) = control() else { return BPF_RB_FORCE_WAKEUP as u64 };
    // SAFETY: ctl points at the control map's single element.
    let until = unsafe { core::ptr::read_volatile(&(*ctl).wake_held_until_ns) };
    // SAFETY: no preconditions.
    if until != 0 && unsafe { bpf_ktime_get_ns() } <= until {
        return BPF_RB_NO_WAKEUP as u64;
    }
    if until != 0 {
        // SAFETY: as above.
        atomic_cas_u64(unsafe { &raw mut (*ctl).wake_held_until_ns }, until, 0);
    }
    BPF_RB_FORCE_WAKEUP as u64
}

/// Ends the hold and wakes the reader when `tgid` is the held victim (a
/// process's exit); one load when nothing is held.
#[inline(always)]
pub fn release_on_exit(tgid: u32) {
    let Some(ctl) = control() else { return };
    // SAFETY: ctl points at the control map's single element.
    let until = unsafe { core::ptr::read_volatile(&(*ctl).wake_held_until_ns) };
    if until == 0 {
        return;
    }
    // SAFETY: as above.
    let held = unsafe { core::ptr::read_volatile(&(*ctl).wake_held_tgid) };
    // SAFETY: no preconditions.
    if held == tgid || unsafe { bpf_ktime_get_ns() } > until {
        release(until);
    }
}

/// Ends a hold whose deadline has passed and wakes the reader; one load
/// when nothing is held.
#[inline(always)]
pub fn release_if_expired() {
    let Some(ctl) = control() else { return };
    // SAFETY: ctl points at the control map's single element.
    let until = unsafe { core::ptr::read_volatile(&(*ctl).wake_held_until_ns) };
    // SAFETY: no preconditions.
    if until != 0 && unsafe { bpf_ktime_get_ns() } > until {
        release(until);
    }
}

/// Ends the hold set to `until` (unless another program just did, or a new
/// one replaced it) and wakes the reader: an empty record, discarded with a
/// forced wake-up, which the reader skips.
#[inline(always)]
fn release(until: u64) {
    let Some(ctl) = control() else { return };
    // SAFETY: ctl points at the control map's single element.
    if !atomic_cas_u64(unsafe { &raw mut (*ctl).wake_held_until_ns }, until, 0) {
        return;
    }
    if let Some(entry) = EVENTS.reserve::<u64>(0) {
        entry.discard(BPF_RB_FORCE_WAKEUP as u64);
    }
}
