//! Resolving a memory cgroup to its registered slots, applying deltas, and
//! raising one event per threshold crossing.

use core::intrinsics::{AtomicOrdering::Relaxed, atomic_cxchg, atomic_xadd};

use aya_ebpf::helpers::bpf_ktime_get_ns;
use swiftlet_common::{DIRECTION_DOWN, DIRECTION_UP, Event, EventKind, MAX_WALK, Resolution, Signal, growth};

use crate::{
    kernel,
    maps::{CGROUP_SLOT, EVENTS, RESOLVE, control, slot},
};

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

/// What a resolution starts from before the walk fills it in.
static EMPTY_RESOLUTION: Resolution =
    Resolution { generation: 0, present: 0, _pad: 0, slots: [0; MAX_WALK], memcg: [0; MAX_WALK] };

/// Makes sure `RESOLVE` holds a current resolution of `memcg`: the
/// registered slots it counts towards, by depth, recomputed when the
/// control generation moved on. Returns 1 when it does.
///
/// A global function (external linkage, scalar arguments): the verifier
/// checks it once, not in every state of every caller, which keeps the
/// programs cheap to verify on older kernels and on emulated CPUs. The walk
/// writes straight into the map value (stack contents would be tracked per
/// path, and every found/not-found choice would double the paths), and
/// stores the generation last, so a reader never takes a half-built entry
/// for a current one. Two CPUs building the same entry write the same.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn swiftlet_resolve(memcg: u64) -> u32 {
    let Some(ctl) = control() else { return 0 };
    // SAFETY: ctl points at the control map's single element.
    let generation = unsafe { core::ptr::read_volatile(&(*ctl).generation) };
    // SAFETY: a read-only lookup.
    if let Some(r) = unsafe { RESOLVE.get(&memcg) } {
        if r.generation == generation {
            return 1;
        }
    }
    if RESOLVE.insert(&memcg, &EMPTY_RESOLUTION, 0).is_err() {
        return 0;
    }
    let Some(r) = RESOLVE.get_ptr_mut(&memcg) else { return 0 };
    let mut present: u32 = 0;
    let mut css = memcg;
    let mut i = 0;
    while i < MAX_WALK {
        if css == 0 {
            break;
        }
        if let Some(id) = kernel::css_cgroup_id(css) {
            // SAFETY: read-only lookup of a u32 value.
            if let Some(s) = unsafe { CGROUP_SLOT.get(&id) } {
                // SAFETY: `r` points at the map value; `i` < MAX_WALK.
                unsafe {
                    (*r).slots[i] = *s;
                    (*r).memcg[i] = css;
                }
                present |= 1 << i;
            }
        }
        css = kernel::css_parent(css);
        i += 1;
    }
    // SAFETY: as above.
    unsafe {
        core::ptr::write_volatile(&mut (*r).present, present);
        core::ptr::write_volatile(&mut (*r).generation, generation);
    }
    1
}

/// The registered slots that `memcg` counts towards: a pointer into the
/// `RESOLVE` map (no copy on the stack, which older verifiers limit to 512
/// bytes across calls). The common case is one lookup of a current entry;
/// otherwise the entry is (re)built and taken again, once more if another
/// CPU replaced it between the build and the lookup.
#[inline(always)]
pub fn resolve(memcg: u64) -> Option<&'static Resolution> {
    let generation = control().map(|c| unsafe { core::ptr::read_volatile(&(*c).generation) })?;
    // SAFETY: read-only; a concurrent rebuild replaces the whole element.
    if let Some(r) = unsafe { RESOLVE.get(&memcg) } {
        if r.generation == generation {
            return Some(r);
        }
    }
    if swiftlet_resolve(memcg) == 0 {
        return None;
    }
    // SAFETY: as above.
    let r = unsafe { RESOLVE.get(&memcg) }?;
    if r.generation == generation {
        return Some(r);
    }
    if swiftlet_resolve(memcg) == 0 {
        return None;
    }
    // SAFETY: as above.
    unsafe { RESOLVE.get(&memcg) }
}

/// Sends one record, written straight into the ring buffer; counts a drop
/// when the ring is full.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn emit(
    kind: EventKind,
    signal: u32,
    ts_ns: u64,
    cgroup_id: u64,
    slot_index: u32,
    direction: u32,
    value: u64,
    threshold: u64,
    pid: u32,
    aux: u32,
    outcome: u32,
    signal_error: i32,
) {
    match EVENTS.reserve::<Event>(0) {
        Some(mut entry) => {
            let e = entry.as_mut_ptr();
            // SAFETY: `e` points at the reserved record, all of which is
            // written before it is submitted.
            unsafe {
                (*e).kind = kind as u32;
                (*e).signal = signal;
                (*e).ts_ns = ts_ns;
                (*e).cgroup_id = cgroup_id;
                (*e).slot = slot_index;
                (*e).direction = direction;
                (*e).value = value;
                (*e).threshold = threshold;
                (*e).pid = pid;
                (*e).aux = aux;
                (*e).outcome = outcome;
                (*e).signal_error = signal_error;
            }
            entry.submit(crate::wakeup::commit_flags());
        }
        None => {
            if let Some(ctl) = control() {
                // SAFETY: ctl points at the control map's single element.
                bump(unsafe { &mut (*ctl).ring_drops });
            }
        }
    }
}

/// `pid` of an evaluation: the current task's, looked up only when there is
/// a crossing to report (a helper call saved on every other update).
pub const PID_CURRENT: u32 = u32::MAX;

/// Compares `value` with slot `index`'s threshold for `signal` and, on a
/// change of side, flips the slot's `above` bit with compare-and-swap so
/// that exactly one CPU reports the crossing. Returns 1 on an upward
/// crossing.
///
/// Unless `kind` is `growth::NO_KILL`, an upward crossing executes the
/// agent's victim plan for this slot and signal, if any, and the crossing's
/// record says what came of it (the lines that kill are the node's and
/// kubepods'); `kind` says what grew, as far as the caller knows (see
/// `swiftlet_execute_plan`). A global function, as `swiftlet_resolve`.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn swiftlet_evaluate(index: u32, signal: u32, value: u64, pid: u32, kind: u32) -> u32 {
    let Some(signal) = Signal::from_u32(signal) else { return 0 };
    let Some(s) = slot(index) else { return 0 };
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
        return 0;
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
        return 0;
    };
    // SAFETY: as above.
    if !unsafe { atomic_cxchg::<u32, { Relaxed }, { Relaxed }>(above, current, new) }.1 {
        // Another CPU flipped a bit of this slot first; it reports its own
        // crossing, and ours is re-evaluated on the next update.
        return 0;
    }
    // SAFETY: no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let pid = if pid == PID_CURRENT { kernel::task_pid(kernel::current_task()).unwrap_or(0) } else { pid };
    let executed = if kind != growth::NO_KILL && direction == DIRECTION_UP {
        crate::kill::swiftlet_execute_plan(index, signal as u32, now, value, kind)
    } else {
        0
    };
    emit(
        EventKind::Crossing,
        signal as u32,
        now,
        cgroup_id,
        index,
        direction,
        value,
        trigger,
        pid,
        crate::kill::generation_of(executed),
        crate::kill::outcome_of(executed),
        0,
    );
    u32::from(direction == DIRECTION_UP)
}

#[inline(always)]
pub fn evaluate(index: u32, signal: Signal, value: u64, pid: u32, may_kill: bool) -> bool {
    let kind = if may_kill { growth::UNKNOWN } else { growth::NO_KILL };
    swiftlet_evaluate(index, signal as u32, value, pid, kind) == 1
}

/// Applies a process or inode delta to slot `index` and evaluates its
/// threshold. A global function, as `swiftlet_resolve`.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn swiftlet_count_slot(index: u32, signal: u32, delta: i64, pid: u32, may_kill: u32) -> u32 {
    let Some(s) = slot(index) else { return 0 };
    // SAFETY: `s` points into the slot array.
    let counter =
        unsafe { if signal == Signal::Processes as u32 { &raw mut (*s).processes } else { &raw mut (*s).inodes } };
    atomic_add(counter, delta);
    // Most slots have no line for this signal (the agent sets process lines
    // on the node only): the evaluation is then skipped (see
    // `CgroupSlot::lines`).
    // SAFETY: as above.
    if unsafe { core::ptr::read_volatile(&(*s).lines) } & 1u32.wrapping_shl(signal) == 0 {
        return 0;
    }
    // SAFETY: as above.
    let value = unsafe { core::ptr::read_volatile(counter) }.max(0) as u64;
    swiftlet_evaluate(index, signal, value, pid, may_kill)
}

/// Calls `f` with each depth whose bit is set in `present` (a resolution's
/// registered ancestors), lowest first. The loop is bounded by `MAX_WALK`
/// and ends at the highest set bit, a shape the verifier follows; inlined,
/// the closure costs nothing over writing the loop at each use.
#[inline(always)]
pub fn for_each_present(present: u32, mut f: impl FnMut(usize)) {
    let mut i = 0;
    while i < MAX_WALK {
        if present >> i == 0 {
            break;
        }
        if present & (1 << i) != 0 {
            f(i);
        }
        i += 1;
    }
}

/// Applies a process or inode delta to every slot of a resolution.
#[inline(always)]
pub fn apply_count(r: &Resolution, signal: Signal, delta: i64, pid: u32, may_kill: bool) {
    for_each_present(r.present, |i| {
        swiftlet_count_slot(r.slots[i], signal as u32, delta, pid, u32::from(may_kill));
    });
}

/// Applies a process delta to the registered slots `slots` at the depths
/// set in `present` (a copy of a resolution), as `swiftlet_count_slot` does
/// but inline: the add and the check of `CgroupSlot::lines` cost less than
/// the call (with return thunks) and the global function's cold code, which
/// fork and exit paid at every event; the evaluation, for a slot with a
/// line, stays a call.
#[inline(always)]
pub fn apply_processes(present: u32, slots: &[u32; MAX_WALK], delta: i64, pid: u32) {
    let bit = Signal::Processes.bit();
    for_each_present(present, |i| {
        let index = slots[i];
        if let Some(s) = slot(index) {
            // SAFETY: `s` points into the slot array.
            unsafe {
                let counter = &raw mut (*s).processes;
                atomic_add(counter, delta);
                if core::ptr::read_volatile(&(*s).lines) & bit != 0 {
                    let value = core::ptr::read_volatile(counter).max(0) as u64;
                    swiftlet_evaluate(index, Signal::Processes as u32, value, pid, 1);
                }
            }
        }
    });
}
