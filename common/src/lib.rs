//! Types shared by swiftlet's kernel programs (`swiftlet-ebpf`) and its agent.
//!
//! Everything here is `#[repr(C)]` plain data with no logic: it is the layout
//! of BPF map values, ring-buffer records and load-time constants. The kernel
//! side and the agent must agree on it byte for byte, so each type has a size
//! assertion at the bottom of this file.
//!
//! # Cgroup slots
//! The agent registers each cgroup it cares about (the node, `kubepods`, the
//! QoS cgroups, every pod and container) into a slot of the mmap-able
//! [`CgroupSlot`] array. The kernel keeps the slot's counters current; the
//! agent reads them through the mapping with no syscall per pod, and writes
//! thresholds into the same slot. Slot [`NODE_SLOT`] is the node as a whole.

#![no_std]

#[cfg(feature = "build")]
extern crate std;

#[cfg(feature = "build")]
pub mod build;

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

/// Ring-buffer size in bytes (a power of two, multiple of the page size).
pub const EVENTS_RING_BYTES: u32 = 256 * 1024;

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
    /// [`Control::generation`] when this was computed; stale when different.
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
    /// The last memcg this CPU resolved, and the [`Control::generation`] of
    /// that resolution: the process programs take `present` and `slots`
    /// from here rather than from the shared `RESOLVE` hash while both match.
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

/// Global state shared by agent and kernel: array map of one element.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Control {
    /// Bumped whenever registrations or the cgroup tree change, to invalidate
    /// every cached [`Resolution`].
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
    /// was not anonymous ([`growth`]) is then left to the agent
    /// ([`KillOutcome::DeferredFileGrowth`], [`KillOutcome::DeferredUnknownGrowth`]).
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

/// What moved when a memory line was crossed, as the program that saw the
/// crossing knows it; passed down to the plan's execution. A page-cache
/// crossing can be undone by reclaim, an anonymous one only by a kill.
pub mod growth {
    /// The evaluation may not execute a plan (a pod's own line, a downward
    /// crossing).
    pub const NO_KILL: u32 = 0;
    /// The program cannot tell (the charge path, the refresh program, the
    /// counted signals).
    pub const UNKNOWN: u32 = 1;
    /// Anonymous pages (NR_ANON_MAPPED).
    pub const ANON: u32 = 2;
    /// Page cache (NR_FILE_PAGES, or inactive file pages made active).
    pub const FILE: u32 = 3;
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

/// How many victim plans there can be: one per kernel line (node memory,
/// kubepods memory, node PIDs) with room to spare.
pub const MAX_PLANS: u32 = 4;

/// The agent's pre-ranked victim for one kernel line: the pod eviction
/// ranking would pick next. The kernel executes it at the crossing; ranking
/// stays in the agent, where it is pure and tested.
///
/// The array is mapped into the agent, which writes a plan as a seqlock:
/// `seq` made odd, the fields, `seq` made even again (each step a store
/// the next cannot pass). The kernel reads `seq`, the fields, and `seq`
/// again, and refuses a plan whose `seq` was odd or changed
/// ([`KillOutcome::PlanBeingWritten`]): it never acts on half of one plan
/// and half of another. `executed_generation` is the kernel's alone.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VictimPlan {
    /// Odd while the agent writes the plan.
    pub seq: u64,
    /// Plan generation, bumped by the agent for every new plan; 0 = no plan.
    pub generation: u64,
    /// The generation the kernel last executed (written by the kernel, with
    /// compare-and-swap, so a generation is executed at most once).
    pub executed_generation: u64,
    /// The slot whose crossing triggers the plan (the node or kubepods).
    pub trigger_slot: u32,
    /// The [`Signal`] whose crossing triggers the plan.
    pub signal: u32,
    /// The victim pod's slot.
    pub victim_slot: u32,
    /// The victim's process with the most resident memory when the agent
    /// ranked the pods, 0 if none: where the kernel has
    /// `bpf_send_signal_task`, it signals this process when the crossing is
    /// seen outside the victim's own context (a victim asleep while the
    /// kernel folds its statistics, or another pod's allocation).
    pub victim_tgid: u32,
    /// The victim pod's cgroup id; the kernel checks the slot still holds it.
    pub victim_cgroup_id: u64,
    /// CLOCK_MONOTONIC ns when the agent ranked the pods for this plan.
    pub planned_ns: u64,
    /// How old the plan may be when the line is crossed; 0 = any age.
    /// Process counts move faster than memory (a fork bomb doubles in
    /// milliseconds), so PID plans carry a short one and an older plan is
    /// left to the agent, which ranks again ([`KillOutcome::PlanTooOld`]).
    pub max_age_ns: u64,
}

/// What the kernel did with the victim plan at an upward crossing, carried
/// in the crossing's record ([`Event::outcome`]), so that every crossing says
/// whether the kernel killed and, if not, which check refused.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KillOutcome {
    /// Not a case for the plan: a downward crossing, or a slot with no line
    /// that kills (the refresh of a pod's own line, inodes).
    NotAttempted = 0,
    /// The plan was executed: the victim is doomed (and the current task
    /// signalled if it is the victim's); a KernelKill record precedes.
    Executed = 1,
    /// The agent has kernel eviction off.
    KernelEvictionOff = 2,
    /// No plan names this line.
    NoPlan = 3,
    /// This line's plan was executed already; the agent has not written
    /// the next one yet.
    AlreadyExecuted = 4,
    /// The agent was writing a plan while the kernel read it.
    PlanBeingWritten = 5,
    /// Another CPU claimed the same generation first.
    ClaimedElsewhere = 6,
    /// The victim's slot no longer holds the planned pod (unregistered,
    /// removed, reused).
    VictimGone = 7,
    /// The victim has not charged memory since it was registered: the
    /// kernel does not know its memory cgroup.
    VictimMemcgUnknown = 8,
    /// The plan is older than its `max_age_ns`.
    PlanTooOld = 9,
    /// Reclaim-first is on and page cache crossed the memory line: the
    /// kernel does not kill, the agent reclaims first.
    DeferredFileGrowth = 10,
    /// Reclaim-first is on and the program that saw the memory crossing
    /// cannot tell what grew: the kernel does not kill, the agent decides.
    DeferredUnknownGrowth = 11,
}

impl KillOutcome {
    pub const ALL: [KillOutcome; 12] = [
        KillOutcome::NotAttempted,
        KillOutcome::Executed,
        KillOutcome::KernelEvictionOff,
        KillOutcome::NoPlan,
        KillOutcome::AlreadyExecuted,
        KillOutcome::PlanBeingWritten,
        KillOutcome::ClaimedElsewhere,
        KillOutcome::VictimGone,
        KillOutcome::VictimMemcgUnknown,
        KillOutcome::PlanTooOld,
        KillOutcome::DeferredFileGrowth,
        KillOutcome::DeferredUnknownGrowth,
    ];

    pub const fn from_u32(v: u32) -> Option<KillOutcome> {
        match v {
            0 => Some(KillOutcome::NotAttempted),
            1 => Some(KillOutcome::Executed),
            2 => Some(KillOutcome::KernelEvictionOff),
            3 => Some(KillOutcome::NoPlan),
            4 => Some(KillOutcome::AlreadyExecuted),
            5 => Some(KillOutcome::PlanBeingWritten),
            6 => Some(KillOutcome::ClaimedElsewhere),
            7 => Some(KillOutcome::VictimGone),
            8 => Some(KillOutcome::VictimMemcgUnknown),
            9 => Some(KillOutcome::PlanTooOld),
            10 => Some(KillOutcome::DeferredFileGrowth),
            11 => Some(KillOutcome::DeferredUnknownGrowth),
            _ => None,
        }
    }

    /// The label in metrics and bench reports.
    pub const fn name(self) -> &'static str {
        match self {
            KillOutcome::NotAttempted => "not_attempted",
            KillOutcome::Executed => "executed",
            KillOutcome::KernelEvictionOff => "kernel_eviction_off",
            KillOutcome::NoPlan => "no_plan",
            KillOutcome::AlreadyExecuted => "already_executed",
            KillOutcome::PlanBeingWritten => "plan_being_written",
            KillOutcome::ClaimedElsewhere => "claimed_elsewhere",
            KillOutcome::VictimGone => "victim_gone",
            KillOutcome::VictimMemcgUnknown => "victim_memcg_unknown",
            KillOutcome::PlanTooOld => "plan_too_old",
            KillOutcome::DeferredFileGrowth => "deferred_file_growth",
            KillOutcome::DeferredUnknownGrowth => "deferred_unknown_growth",
        }
    }

    /// The kernel left a memory crossing to the agent because reclaim-first
    /// is on and the growth was not known to be anonymous.
    pub const fn deferred(self) -> bool {
        matches!(self, KillOutcome::DeferredFileGrowth | KillOutcome::DeferredUnknownGrowth)
    }
}

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
    /// [`Signal`] for crossings; 0 otherwise.
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
    /// ([`KillOutcome`]).
    pub outcome: u32,
    pub _pad: u32,
}

/// Kernel struct offsets and enum values, found by the agent in the running
/// kernel's BTF and handed to the programs as load-time constants. Rust eBPF
/// has no CO-RE field relocations, so this is how the programs stay portable
/// across kernel versions.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelLayout {
    /// `struct cgroup_subsys_state` → `cgroup` (the css's cgroup).
    pub css_cgroup: u32,
    /// `struct cgroup_subsys_state` → `parent`.
    pub css_parent: u32,
    /// `struct cgroup` → `kn`.
    pub cgroup_kn: u32,
    /// `struct kernfs_node` → `id`.
    pub kn_id: u32,
    /// `struct mem_cgroup` → `memory.usage` (page counter, in pages).
    pub memcg_usage: u32,
    /// `struct task_struct` → `cgroups`.
    pub task_cgroups: u32,
    /// `struct css_set` → `subsys[memory_cgrp_id]`.
    pub cset_memcg: u32,
    /// `struct task_struct` → `pid`.
    pub task_pid: u32,
    /// `struct task_struct` → `tgid`.
    pub task_tgid: u32,
    /// `enum node_stat_item` values.
    pub nr_inactive_file: u32,
    pub nr_anon_mapped: u32,
    pub nr_file_pages: u32,
    /// Cgroup v1 hierarchy id of the memory controller; 0 on cgroup v2.
    pub memory_hierarchy_id: u32,
    /// `struct task_struct` → `flags` (PF_EXITING is skipped when killing).
    pub task_flags: u32,
    /// 1 when the layout was filled in (a zeroed layout disables the programs
    /// that need it).
    pub valid: u32,
    /// `struct mem_cgroup` → `memory` (the page counter itself; the charge
    /// hooks get its address).
    pub memcg_memory: u32,
    /// `struct page_counter` → `parent`.
    pub pc_parent: u32,
    /// `struct mem_cgroup_per_node` → `lruvec` and → `memcg`: a lruvec's
    /// memory cgroup.
    pub mz_lruvec: u32,
    pub mz_memcg: u32,
    /// `enum lru_list` value of LRU_INACTIVE_FILE.
    pub lru_inactive_file: u32,
    /// 1 when the page-counter fields above were found (the charge hooks do
    /// nothing otherwise).
    pub charge_valid: u32,
    /// The path to the node's statistics from any memory cgroup:
    /// `struct mem_cgroup` → `nodeinfo` (one pointer per NUMA node),
    /// `struct lruvec` → `pgdat`, and `struct pglist_data` → `vm_stat`
    /// (the counters `vm_node_stat` sums, folded from the same per-CPU
    /// diffs at the same moment).
    pub memcg_nodeinfo: u32,
    pub lruvec_pgdat: u32,
    pub pgdat_vm_stat: u32,
    /// The kernel's `nr_node_ids`; 0 when the path above is unknown or the
    /// node has more than [`MAX_NUMA_NODES`] nodes, and the node's figures
    /// are then kept from the deltas.
    pub nr_node_ids: u32,
    /// `struct cgroup` → `level` and → `ancestors` (a cgroup's ancestors
    /// by level, itself included): whether a cgroup lies anywhere below
    /// another is one read, at any depth.
    pub cgroup_level: u32,
    pub cgroup_ancestors: u32,
    /// The path to the pages each CPU holds back from the node's counters:
    /// `struct pglist_data` → `per_cpu_nodestats` (a per-CPU pointer) and
    /// `struct per_cpu_nodestat` → `vm_node_stat_diff` (one `s8` per
    /// `node_stat_item`).
    pub pgdat_per_cpu_nodestats: u32,
    pub pcp_node_stat_diff: u32,
    /// One past the highest possible CPU; 0 when the diffs above cannot be
    /// read, and the node's figure is then the kernel's counters alone,
    /// behind by what the CPUs hold.
    pub nr_cpu_ids: u32,
    /// `struct bpf_array` → `pptrs`: where a per-CPU array map keeps its
    /// elements' per-CPU pointers. With the address `bpf_map_lookup_percpu_elem`
    /// gives for CPU n, that yields CPU n's per-CPU offset, the one thing
    /// `per_cpu_ptr` adds, which no BTF carries.
    pub array_pptrs: u32,
}

/// The most NUMA nodes whose statistics the programs sum.
pub const MAX_NUMA_NODES: u32 = 8;

/// The most CPUs whose held-back node statistics the programs sum near the
/// node's memory line (every page there reads each CPU's diffs); on a
/// larger machine the node's figure is the kernel's counters alone.
pub const MAX_CPUS_SUMMED: u32 = 512;

// Layout checks: the kernel side and the agent compile these types separately.
const _: () = assert!(core::mem::size_of::<CgroupSlot>() == 128);
const _: () = assert!(core::mem::offset_of!(ProcCpu, slots) == 36);
const _: () = assert!(core::mem::size_of::<Resolution>() == 208);
const _: () = assert!(core::mem::size_of::<Control>() == 112);
const _: () = assert!(core::mem::size_of::<VictimPlan>() == 64);
const _: () = assert!(core::mem::size_of::<Event>() == 64);
const _: () = assert!(core::mem::size_of::<KernelLayout>() == 124);

#[cfg(feature = "user")]
mod user {
    use super::*;
    // Each of these is repr(C) plain integers (arrays of them, or of each
    // other), so any bit pattern is a valid value and copying bytes is a
    // copy of the value.
    // SAFETY: `CgroupSlot` is repr(C) plain integers: any bit pattern is a value.
    unsafe impl aya::Pod for CgroupSlot {}
    // SAFETY: `Resolution` is repr(C) plain integers: any bit pattern is a value.
    unsafe impl aya::Pod for Resolution {}
    // SAFETY: `Control` is repr(C) plain integers: any bit pattern is a value.
    unsafe impl aya::Pod for Control {}
    // SAFETY: `VictimPlan` is repr(C) plain integers: any bit pattern is a value.
    unsafe impl aya::Pod for VictimPlan {}
    // SAFETY: `Event` is repr(C) plain integers: any bit pattern is a value.
    unsafe impl aya::Pod for Event {}
    // SAFETY: `KernelLayout` is repr(C) plain integers: any bit pattern is a value.
    unsafe impl aya::Pod for KernelLayout {}
    // SAFETY: `Threshold` is repr(C) plain integers: any bit pattern is a value.
    unsafe impl aya::Pod for Threshold {}
    // SAFETY: `ProcCpu` is repr(C) plain integers: any bit pattern is a value.
    unsafe impl aya::Pod for ProcCpu {}
    // SAFETY: `NodePending` is repr(C) plain integers: any bit pattern is a value.
    unsafe impl aya::Pod for NodePending {}
}
