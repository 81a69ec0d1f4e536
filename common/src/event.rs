//! The ring buffer's records.

/// Ring-buffer size in bytes (a power of two, multiple of the page size).
pub const EVENTS_RING_BYTES: u32 = 256 * 1024;

/// What a ring-buffer record reports.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A threshold was crossed (direction in [`Event::direction`]).
    Crossing = 1,
    /// The kernel OOM killer chose a victim (oom:mark_victim).
    OomVictim = 2,
    /// A registered cgroup was removed.
    CgroupRemoved = 3,
    /// The kernel killed a planned victim at a crossing (sent before the
    /// crossing's own record, which then carries the plan generation in
    /// `aux`, so the agent's fast path knows the kernel acted).
    KernelKill = 4,
    /// A process the agent asked to watch has exited (benchmarks and the
    /// eviction path's "victim dead" time, on the kernel's clock).
    ProcessExit = 5,
}

impl EventKind {
    pub const fn from_u32(v: u32) -> Option<EventKind> {
        match v {
            1 => Some(EventKind::Crossing),
            2 => Some(EventKind::OomVictim),
            3 => Some(EventKind::CgroupRemoved),
            4 => Some(EventKind::KernelKill),
            5 => Some(EventKind::ProcessExit),
            _ => None,
        }
    }
}

/// Crossing directions.
pub const DIRECTION_UP: u32 = 1;
pub const DIRECTION_DOWN: u32 = 2;

/// One ring-buffer record.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Event {
    /// [`EventKind`].
    pub kind: u32,
    /// [`Signal`](crate::Signal) for crossings; 0 otherwise.
    pub signal: u32,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) when the kernel saw it.
    pub ts_ns: u64,
    /// Cgroup id of the slot (crossing, removal, kill) or of the OOM victim's
    /// memory cgroup.
    pub cgroup_id: u64,
    /// Slot index, or `u32::MAX` when the cgroup has none.
    pub slot: u32,
    /// [`DIRECTION_UP`] or [`DIRECTION_DOWN`] for crossings; for kernel
    /// kills, the slot whose crossing triggered the kill.
    pub direction: u32,
    /// The value that crossed (signal unit); for kernel kills, the
    /// crossing's timestamp.
    pub value: u64,
    /// The trigger it crossed; for kernel kills, the value that crossed.
    pub threshold: u64,
    /// The task involved: the one whose action crossed, the OOM victim, or
    /// the task the kernel killed.
    pub pid: u32,
    /// For kernel kills, and crossings that triggered one: the plan
    /// generation executed (truncated).
    pub aux: u32,
    /// For upward crossings: what the kernel did with the plan
    /// ([`KillOutcome`](crate::KillOutcome)).
    pub outcome: u32,
    /// For kernel kills whose current task was the victim's but was not
    /// signalled: what `bpf_send_signal` returned (a negative errno, such as
    /// `-EBUSY` while this CPU's deferred signal is still queued, or
    /// `-EPERM` for a task already exiting). 0 otherwise.
    pub signal_error: i32,
}
