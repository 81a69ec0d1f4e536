//! The slot array: one registered cgroup per slot, its counters kept by
//! the kernel and its thresholds written by the agent, and the per-CPU
//! state the counting programs keep beside it.

/// Capacity of the slot array: 110 pods with a few containers each, plus the
/// node, kubepods and QoS cgroups, with room to spare for churn.
pub const MAX_SLOTS: u32 = 2048;

/// Entries of the kernel's process table (indexed by tgid) when the agent
/// cannot read `pid_max`: the kernel's default. The agent sizes the table to
/// `pid_max` at load.
pub const PROC_TABLE_DEFAULT: u32 = 32768;

/// The largest `pid_max` a 64-bit kernel allows (PID_MAX_LIMIT): the process
/// table is never sized beyond it.
pub const PROC_TABLE_LIMIT: u32 = 4 * 1024 * 1024;

/// How many slots one run of the refresh program covers (the agent runs it
/// once per batch up to the highest slot in use).
pub const REFRESH_BATCH: u32 = 64;

/// The slot that holds node-wide figures.
pub const NODE_SLOT: u32 = 0;

/// How deep below the root the kernel looks for registered ancestors of a
/// cgroup (itself included): kubepods → QoS → pod → container is four,
/// below a cgroup root of a few levels, with room for nesting.
pub const MAX_WALK: usize = 16;

/// The eviction signals the kernel evaluates. The values index the
/// per-slot threshold arrays.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Signal {
    /// Working set (usage − inactive_file), in pages.
    MemoryWorkingSet = 0,
    /// Processes in the cgroup (for the node: tasks, as `sysinfo.procs`).
    Processes = 1,
    /// Inodes created minus inodes freed by the cgroup's tasks.
    Inodes = 2,
}

/// Number of [`Signal`] variants.
pub const NUM_SIGNALS: usize = 3;

impl Signal {
    pub const ALL: [Signal; NUM_SIGNALS] = [Signal::MemoryWorkingSet, Signal::Processes, Signal::Inodes];

    pub const fn from_u32(v: u32) -> Option<Signal> {
        match v {
            0 => Some(Signal::MemoryWorkingSet),
            1 => Some(Signal::Processes),
            2 => Some(Signal::Inodes),
            _ => None,
        }
    }

    /// Bit of this signal in [`CgroupSlot::above`].
    pub const fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// Slot flags, written by the agent.
pub mod slot_flags {
    /// The slot is in use.
    pub const ACTIVE: u32 = 1 << 0;
    /// The slot is the node.
    pub const NODE: u32 = 1 << 1;
    /// The slot is the pods' root cgroup (`kubepods`).
    pub const KUBEPODS: u32 = 1 << 2;
    /// The slot is a pod cgroup.
    pub const POD: u32 = 1 << 3;
    /// The slot is a container cgroup.
    pub const CONTAINER: u32 = 1 << 4;
    /// The kernel saw the cgroup removed; the agent frees the slot.
    pub const REMOVED: u32 = 1 << 5;
}

/// A threshold on one signal of one slot, in the signal's unit.
///
/// The kernel raises a crossing when the value reaches `trigger` and clears
/// it when the value falls below `rearm` (hysteresis: `rearm <= trigger`), so
/// each crossing produces one event however often the value moves around the
/// line. `trigger == 0` disables the threshold.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Threshold {
    pub trigger: u64,
    pub rearm: u64,
}

/// One registered cgroup, as kept in the mmap-able slot array.
///
/// Counters are signed because the kernel applies deltas and a cgroup
/// registered while busy may see a decrement for something it was never
/// credited with; readers clamp at zero.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct CgroupSlot {
    /// Cgroup id: the kernfs id of the memory cgroup's directory, which is
    /// its inode number (v1: under the memory hierarchy; v2: the cgroup).
    /// Written by the agent.
    pub cgroup_id: u64,
    /// [`slot_flags`], written by the agent (the kernel may add REMOVED).
    pub flags: u32,
    /// Bit per [`Signal`]: set while the value is at or above its trigger.
    /// Flipped by the kernel with compare-and-swap.
    pub above: u32,
    /// Bumped by the agent each time the slot is (re)assigned, so a reader
    /// can tell a reused slot from the one it knew.
    pub epoch: u64,
    /// Memory usage in pages: the memcg page counter (hierarchical, what
    /// `memory.usage_in_bytes` / `memory.current` show). For the node slot:
    /// anon + file pages of the whole machine.
    pub usage_pages: i64,
    /// Inactive file pages in the subtree.
    pub inactive_file_pages: i64,
    /// Live processes in the subtree (node slot: tasks).
    pub processes: i64,
    /// Inodes created minus freed by the subtree's tasks.
    pub inodes: i64,
    /// Bit per [`Signal`]: set while the slot has a line (a non-zero
    /// trigger) on that signal. Written by the agent with the threshold. The
    /// kernel's counting reads it from the line it has just updated and
    /// skips the evaluation, and the thresholds' own cache line, for signals
    /// without one (most: process lines are on the node only). Was
    /// `_reserved`, an unused timestamp.
    pub lines: u32,
    pub _pad: u32,
    /// Thresholds, indexed by [`Signal`]. Written by the agent.
    pub thresholds: [Threshold; NUM_SIGNALS],
    /// Kernel address of the cgroup's `struct mem_cgroup`, learnt from its
    /// first memory event, so the refresh program can re-read the page
    /// counter when usage drops without a statistics event (uncharges come
    /// after the last one). 0 until then.
    pub memcg: u64,
}

impl CgroupSlot {
    pub const EMPTY: CgroupSlot = CgroupSlot {
        cgroup_id: 0,
        flags: 0,
        above: 0,
        epoch: 0,
        usage_pages: 0,
        inactive_file_pages: 0,
        processes: 0,
        inodes: 0,
        lines: 0,
        _pad: 0,
        thresholds: [Threshold { trigger: 0, rearm: 0 }; NUM_SIGNALS],
        memcg: 0,
    };

    /// Working set in pages: usage − inactive_file, as the kubelet defines it.
    pub const fn working_set_pages(&self) -> u64 {
        let ws = self.usage_pages - self.inactive_file_pages;
        if ws < 0 { 0 } else { ws as u64 }
    }
}

/// Which registered slots a memory cgroup counts towards, cached by the kernel
/// per memcg: entry `i` is its `i`-th ancestor (0 = itself), used when bit
/// `i` of `present` is set. `memcg` holds the kernel address of each
/// ancestor's `struct mem_cgroup`, so the kernel can read its page counter
/// directly. (Positions by depth rather than a packed list: a packed list's
/// length would be a different exact value on every path through the walk,
/// which older verifiers explore one by one.)
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Resolution {
    /// [`Control::generation`](crate::Control::generation) when this was
    /// computed; stale when different.
    pub generation: u64,
    /// Bit per depth: the ancestor there is registered.
    pub present: u32,
    pub _pad: u32,
    pub slots: [u32; MAX_WALK],
    pub memcg: [u64; MAX_WALK],
}

/// Per-CPU state of the process programs (fork, exit): what each CPU
/// keeps to itself so that the common path touches no line another CPU
/// writes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcCpu {
    /// Node tasks forked (+) or exited (−) on this CPU and not yet added to
    /// the node slot: added once they reach ±[`NODE_TASK_BATCH`]. A reader
    /// that wants the exact count adds every CPU's value to the slot's.
    pub node_tasks: i64,
    /// The last memcg this CPU resolved, and the
    /// [`Control::generation`](crate::Control::generation) of that
    /// resolution: the process programs take `present` and `slots` from here
    /// rather than from the shared `RESOLVE` hash while both match.
    pub memcg: u64,
    pub generation: u64,
    /// Where a kernel pointer the program read is stored and loaded back, to
    /// turn it into a plain number for the verifier.
    pub scratch: u64,
    pub present: u32,
    /// `memcg`'s registered slots by depth, as in [`Resolution`]. The
    /// fields are ordered so that a shallow resolution (a pod and its
    /// parents) is read from the element's first cache line only.
    pub slots: [u32; MAX_WALK],
    pub _pad: u32,
}

/// How many tasks a CPU may fork or exit before the node slot (and its
/// pid.available line) sees them: the node's task count lags the truth by
/// less than this per CPU (see [`ProcCpu::node_tasks`]).
pub const NODE_TASK_BATCH: i64 = 16;

/// Per-CPU memory deltas for the node slot not yet added to it (statistics
/// tracepoint strategy). A reader that wants the exact node figures adds
/// every CPU's values to the slot's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NodePending {
    pub usage_pages: i64,
    pub inactive_file_pages: i64,
}

/// MEMCG_CHARGE_BATCH: how many pages a CPU holds back from the node slot
/// (and its memory.available line) by default, as the kernel holds them
/// back from its own counters. The programs take the value actually used
/// from the `NODE_MEMORY_BATCH` global set at load.
pub const NODE_MEMORY_BATCH: u32 = 64;
