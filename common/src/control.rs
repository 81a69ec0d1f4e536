//! The control block both sides share (one array element), and the
//! constants that bound what it holds.

/// Global state shared by agent and kernel: array map of one element.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Control {
    /// Bumped whenever registrations or the cgroup tree change, to invalidate
    /// every cached [`Resolution`](crate::Resolution).
    pub generation: u64,
    /// Events the ring buffer had no room for.
    pub ring_drops: u64,
    /// Entries the agent may have in the exit-watch table: raised by the
    /// agent before it adds one, lowered by the kernel when it reports one,
    /// so the kernel skips the table's lookup at every exit while it is 0.
    pub exit_watches: u64,
    /// Processes the kernel could not remember for a later migration: their
    /// tgid is beyond the process table (sized to `pid_max` at load, which
    /// was raised since).
    pub proc_table_full: u64,
    /// Kernel kills performed (in-kernel eviction).
    pub kernel_kills: u64,
    /// Set to 1 by the agent to let the kernel kill planned victims.
    pub kernel_eviction: u32,
    /// One past the highest slot index in use (bounds the refresh loop).
    pub slot_high_water: u32,
    /// The memcg (kernel address) of a victim the kernel is killing: its
    /// tasks are signalled whenever they charge memory, until the agent
    /// clears it after finishing the eviction, the cgroup is removed, or
    /// `doomed_until_ns` passes. 0 = none. Written last by the kernel (after
    /// the id and the deadline), and a reader trusts it only while the
    /// memcg's cgroup id is still `doomed_cgroup_id`: a `struct mem_cgroup`
    /// freed and reused by a later cgroup never inherits the mark.
    pub doomed_memcg: u64,
    /// The doomed victim's slot.
    pub doomed_slot: u32,
    /// How the attached programs keep memory ([`memory_strategy`]), set by
    /// the agent after attaching, for whoever reads the block (`bpftool map
    /// dump`); no program depends on it.
    pub memory_strategy: u32,
    /// The doomed victim's cgroup id (see `doomed_memcg`).
    pub doomed_cgroup_id: u64,
    /// CLOCK_MONOTONIC ns after which the doomed mark is void
    /// ([`DOOMED_FOR_NS`] after the kill), should the agent never clear it.
    pub doomed_until_ns: u64,
    /// Runs of the refresh program for this instance (the agent's own
    /// getpgid calls, recognised by its pid namespace, tgid and
    /// [`REFRESH_TAG_SHIFT`] tag).
    pub refresh_runs: u64,
    /// Set to 1 by the agent when it reclaims page cache before evicting
    /// (`--memory-reclaim-before-eviction`): a memory crossing whose growth
    /// was not anonymous ([`growth`](crate::growth)) is then left to the
    /// agent (`KillOutcome::DeferredFileGrowth`,
    /// `KillOutcome::DeferredUnknownGrowth`, in [`crate::KillOutcome`]).
    pub reclaim_first: u32,
    /// The process the kernel just killed as the task that crossed a line,
    /// while `wake_held_until_ns` is set (see there).
    pub wake_held_tgid: u32,
    /// CLOCK_MONOTONIC ns until which records are committed without waking
    /// the agent's reader ([`WAKE_HOLD_NS`] after an in-kernel kill of the
    /// current task), 0 when they wake it. Woken at once, the reader (under
    /// SCHED_FIFO) preempted the victim on its own CPU on its way out of the
    /// page fault, and the victim met its SIGKILL only after the reader had
    /// handled the records: 0.1 ms more to every kill. The victim's exit
    /// (`wake_held_tgid`'s) ends the hold and wakes the reader; so does the
    /// first program to run after the deadline.
    pub wake_held_until_ns: u64,
    /// The planned process of a victim just doomed from outside its context
    /// (`VictimPlan::victim_tgid`), until a program that may call
    /// `bpf_send_signal_task` takes it (compare-and-swap to 0) and signals
    /// it; 0 when there is none.
    pub signal_tgid: u64,
}

/// How long a doomed mark holds at most: the agent clears it within
/// milliseconds of the kill; this only bounds a mark the agent never
/// cleared (it was stopped, or the event was lost).
pub const DOOMED_FOR_NS: u64 = 5_000_000_000;

/// How long the agent's reader is left asleep after an in-kernel kill of
/// the task that crossed the line, at most (`Control::wake_held_until_ns`):
/// the victim exits within about 50 µs on an idle CPU, and its exit wakes the
/// reader before this; on a busy CPU, where the victim waits its turn, the
/// agent's own kill of the pod is not held back longer than this.
pub const WAKE_HOLD_NS: u64 = 1_000_000;

/// The refresh program's trigger is getpgid(2) with `(tag << REFRESH_TAG_SHIFT)
/// | first_slot`: each loaded instance has its own tag (a load-time
/// constant), so one instance's snapshot never runs another's refresh in
/// the same process (the eviction race's observer beside the agent).
pub const REFRESH_TAG_SHIFT: u32 = 16;
/// Tags are 1..=REFRESH_TAG_MAX (15 bits: the argument is a positive pid_t).
pub const REFRESH_TAG_MAX: u32 = 0x7fff;

/// Values of [`Control::memory_strategy`].
pub mod memory_strategy {
    /// The memcg statistics tracepoint: node figures read from the kernel's
    /// per-node statistics every batch of pages per CPU, or kept from the
    /// deltas where their layout is unknown.
    pub const STAT_EVENTS: u32 = 1;
    /// Page-counter charge/uncharge hooks: node figures read from the
    /// kernel's per-node statistics.
    pub const PAGE_COUNTER: u32 = 2;
}
