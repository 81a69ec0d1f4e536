//! Resolving a memory cgroup to its registered slots, applying deltas, and
//! raising one event per threshold crossing.

use core::intrinsics::{AtomicOrdering::Relaxed, atomic_cxchg, atomic_xadd};

use aya_ebpf::{bindings::BPF_RB_FORCE_WAKEUP, helpers::bpf_ktime_get_ns};
use swiftlet_common::{
    CgroupSlot, DIRECTION_DOWN, DIRECTION_UP, Event, EventKind, MAX_CHAIN, MAX_WALK, Resolution, Signal,
};

use crate::{
    kernel,
    maps::{CGROUP_SLOT, EVENTS, RESOLVE, control, slot},
};

/// aya-log needs a context only for the program it reports from; the
/// records carry no per-program data here.
pub struct LogCtx;
impl aya_ebpf::EbpfContext for LogCtx {
    fn as_ptr(&self) -> *mut core::ffi::c_void {
        core::ptr::null_mut()
    }
}
pub static LOG_CTX: LogCtx = LogCtx;

/// Adds `delta` to a counter another CPU may be updating at the same time.
#[inline(always)]
pub fn atomic_add(counter: *mut i64, delta: i64) {
    // SAFETY: `counter` points into a map value, which lives as long as the
    // map and is suitably aligned for i64. (core's atomic types have no
    // read-modify-write operations on the BPF target; the intrinsics lower to
    // the BPF atomic instructions.)
    unsafe { atomic_xadd::<i64, i64, { Relaxed }>(counter, delta) };
}

#[inline(always)]
pub fn bump(counter: *mut u64) {
    // SAFETY: as in `atomic_add`.
    unsafe { atomic_xadd::<u64, u64, { Relaxed }>(counter, 1) };
}

/// Compare-and-swap on a u64 in a map value; true when it swapped.
#[inline(always)]
pub fn atomic_cas_u64(ptr: *mut u64, current: u64, new: u64) -> bool {
    // SAFETY: `ptr` points into a map value, suitably aligned.
    unsafe { atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(ptr, current, new) }.1
}

/// The registered slots that `memcg` counts towards, leaf first, cached per
/// memcg and recomputed when the control generation moved on.
#[inline(always)]
pub fn resolve(memcg: u64) -> Option<Resolution> {
    let ctl = control()?;
    // SAFETY: ctl points at the control map's single element.
    let generation = unsafe { core::ptr::read_volatile(&(*ctl).generation) };
    // SAFETY: the value is only read, and a concurrent recompute writes a
    // whole new value (map update), never a partial one we could observe.
    if let Some(r) = unsafe { RESOLVE.get(&memcg) } {
        if r.generation == generation {
            return Some(*r);
        }
    }
    let mut r = Resolution { generation, len: 0, _pad: 0, slots: [0; MAX_CHAIN], memcg: [0; MAX_CHAIN] };
    let mut css = memcg;
    let mut i = 0;
    while i < MAX_WALK {
        if css == 0 {
            break;
        }
        if let Some(id) = kernel::css_cgroup_id(css) {
            // SAFETY: read-only lookup of a u32 value.
            if let Some(s) = unsafe { CGROUP_SLOT.get(&id) } {
                let len = r.len as usize;
                if len < MAX_CHAIN {
                    r.slots[len] = *s;
                    r.memcg[len] = css;
                    r.len += 1;
                } else {
                    // SAFETY: ctl is valid (see above).
                    bump(unsafe { &mut (*ctl).chain_overflows });
                    aya_log_ebpf::warn!(&LOG_CTX, "cgroup {} has more than {} registered ancestors", id, MAX_CHAIN);
                }
            }
        }
        css = kernel::css_parent(css);
        i += 1;
    }
    let _ = RESOLVE.insert(&memcg, &r, 0);
    Some(r)
}

/// Sends one record; counts a drop when the ring is full.
#[inline(always)]
pub fn emit(ev: &Event) {
    if EVENTS.output::<Event>(ev, BPF_RB_FORCE_WAKEUP as u64).is_err() {
        if let Some(ctl) = control() {
            // SAFETY: ctl points at the control map's single element.
            bump(unsafe { &mut (*ctl).ring_drops });
        }
    }
}

/// Compares `value` with the slot's threshold for `signal` and, on a change
/// of side, flips the slot's `above` bit with compare-and-swap so that
/// exactly one CPU reports the crossing. Returns true on an upward crossing.
#[inline(always)]
///
/// With `may_kill`, an upward crossing executes the agent's victim plan for
/// this slot and signal, if any (programs of tracepoint type, which cannot
/// use the kill kfuncs, pass false).
pub fn evaluate(
    index: u32,
    s: *mut CgroupSlot,
    signal: Signal,
    value: u64,
    now: u64,
    pid: u32,
    may_kill: bool,
) -> bool {
    // SAFETY: `s` points into the slot array; fields are read individually
    // and may be changed concurrently by the agent, which is harmless.
    let (trigger, rearm, cgroup_id) = unsafe {
        let t = &(*s).thresholds[signal as usize];
        (
            core::ptr::read_volatile(&t.trigger),
            core::ptr::read_volatile(&t.rearm),
            core::ptr::read_volatile(&(*s).cgroup_id),
        )
    };
    if trigger == 0 {
        return false;
    }
    let bit = signal.bit();
    // SAFETY: `above` is an aligned u32 field of a map value.
    let above = unsafe { &raw mut (*s).above };
    // A plain volatile load: BPF before ISA v4 has no atomic load, and the
    // compare-and-exchange below catches any race.
    let current = unsafe { core::ptr::read_volatile(above) };
    let (new, direction) = if value >= trigger && current & bit == 0 {
        (current | bit, DIRECTION_UP)
    } else if value < rearm && current & bit != 0 {
        (current & !bit, DIRECTION_DOWN)
    } else {
        return false;
    };
    // SAFETY: as above.
    if !unsafe { atomic_cxchg::<u32, { Relaxed }, { Relaxed }>(above, current, new) }.1 {
        // Another CPU flipped a bit of this slot first; it reports its own
        // crossing, and ours is re-evaluated on the next update.
        return false;
    }
    let generation = if may_kill && direction == DIRECTION_UP {
        crate::kill::swiftlet_execute_plan(index, signal as u32, now, value)
    } else {
        0
    };
    emit(&Event {
        kind: EventKind::Crossing as u32,
        signal: signal as u32,
        ts_ns: now,
        cgroup_id,
        slot: index,
        direction,
        value,
        threshold: trigger,
        pid,
        aux: generation,
    });
    direction == DIRECTION_UP
}

/// Applies a process or inode delta to every slot of a resolution and to
/// their thresholds.
#[inline(always)]
pub fn apply_count(r: &Resolution, signal: Signal, delta: i64, pid: u32, may_kill: bool) {
    // SAFETY: the helper has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let mut i = 0;
    while i < MAX_CHAIN {
        if i >= r.len as usize {
            break;
        }
        let index = r.slots[i];
        if let Some(s) = slot(index) {
            // SAFETY: `s` points into the slot array.
            let counter = unsafe {
                match signal {
                    Signal::Processes => &mut (*s).processes,
                    _ => &mut (*s).inodes,
                }
            };
            atomic_add(counter, delta);
            // SAFETY: as above.
            let value = unsafe { core::ptr::read_volatile(counter) }.max(0) as u64;
            unsafe { core::ptr::write_volatile(&mut (*s).updated_ns, now) };
            evaluate(index, s, signal, value, now, pid, may_kill);
        }
        i += 1;
    }
}
