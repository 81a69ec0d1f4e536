//! Maps and load-time constants shared by all programs.

use aya_ebpf::{
    Global,
    bindings::BPF_F_MMAPABLE,
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use swiftlet_common::{
    CgroupSlot, Control, EVENTS_RING_BYTES, KernelLayout, MAX_SLOTS, NodePending, ProcCpu, Resolution, VictimPlan,
};

/// Kernel offsets and enum values from the running kernel's BTF.
#[unsafe(no_mangle)]
pub static LAYOUT: Global<KernelLayout> = Global::new(KernelLayout {
    css_cgroup: 0,
    css_parent: 0,
    cgroup_kn: 0,
    kn_id: 0,
    memcg_usage: 0,
    task_cgroups: 0,
    cset_memcg: 0,
    task_pid: 0,
    task_tgid: 0,
    nr_inactive_file: 0,
    nr_anon_mapped: 0,
    nr_file_pages: 0,
    memory_hierarchy_id: 0,
    task_flags: 0,
    valid: 0,
    memcg_memory: 0,
    pc_parent: 0,
    mz_lruvec: 0,
    mz_memcg: 0,
    lru_inactive_file: 0,
    charge_valid: 0,
    memcg_nodeinfo: 0,
    lruvec_pgdat: 0,
    pgdat_vm_stat: 0,
    nr_node_ids: 0,
    cgroup_level: 0,
    cgroup_ancestors: 0,
    pgdat_per_cpu_nodestats: 0,
    pcp_node_stat_diff: 0,
    nr_cpu_ids: 0,
    array_pptrs: 0,
});

/// One field of [`LAYOUT`], read on its own: `LAYOUT.load()` copies the
/// whole struct (two dozen loads) at every use, and these run on every
/// event.
macro_rules! layout {
    ($field:ident) => {
        // SAFETY: `Global<T>` holds nothing but a `T` (its size is asserted
        // below), so a pointer to it is a pointer to the layout.
        unsafe {
            core::ptr::read_volatile(
                &raw const (*(&raw const $crate::maps::LAYOUT).cast::<swiftlet_common::KernelLayout>()).$field,
            )
        }
    };
}
pub(crate) use layout;

const _: () = assert!(core::mem::size_of::<Global<KernelLayout>>() == core::mem::size_of::<KernelLayout>());

/// 1 when `sched_process_exit` passes `group_dead` (kernel 6.13 and later).
#[unsafe(no_mangle)]
pub static EXIT_HAS_GROUP_DEAD: Global<u32> = Global::new(0);

/// 1 when `mark_victim` passes only the victim's pid (kernels before the
/// tracepoint took the task itself, such as 6.1 and 6.12).
#[unsafe(no_mangle)]
pub static MARK_VICTIM_PID_ONLY: Global<u32> = Global::new(0);

/// 1 when the kernel has the kfuncs that signal a task other than the
/// current one (`bpf_task_from_pid`, `bpf_send_signal_task`,
/// `bpf_task_release`: 6.13 and later); the agent patches their calls in
/// (or out, as `r0 = 0`) before loading the object.
#[unsafe(no_mangle)]
pub static SIGNAL_TASK: Global<u32> = Global::new(0);

/// The agent's tgid as its own pid namespace numbers it, and that
/// namespace (the device and inode of its nsfs file): only the agent's own
/// trigger syscalls run the refresh, wherever its pid namespace is.
#[unsafe(no_mangle)]
pub static AGENT_TGID: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub static AGENT_PIDNS_DEV: Global<u64> = Global::new(0);
#[unsafe(no_mangle)]
pub static AGENT_PIDNS_INO: Global<u64> = Global::new(0);

/// This instance's refresh tag (see `swiftlet_common::REFRESH_TAG_SHIFT`).
#[unsafe(no_mangle)]
pub static REFRESH_TAG: Global<u32> = Global::new(0);

/// Registered cgroups, indexed by slot. Mapped into the agent's memory.
#[map]
pub static SLOTS: Array<CgroupSlot> = Array::with_max_entries(MAX_SLOTS, BPF_F_MMAPABLE);

/// Cgroup id → slot, for registered cgroups (not the node). Agent-owned.
#[map]
pub static CGROUP_SLOT: HashMap<u64, u32> = HashMap::with_max_entries(MAX_SLOTS, 0);

/// `struct mem_cgroup *` → the registered slots it counts towards. Entries
/// from an older [`Control::generation`] are recomputed on use.
#[map]
pub static RESOLVE: LruHashMap<u64, Resolution> = LruHashMap::with_max_entries(8192, 0);

/// Processes counted in some registered slot, indexed by tgid → the memcg
/// they were counted under (0: not counted), so a migration can take them
/// out of the right place. An array rather than a hash: an update at every
/// fork and exit is then a plain store, with no bucket lock, no element to
/// allocate or free and no chain to walk (the hash's cache misses were most
/// of the programs' cost). The agent sizes it to `pid_max` at load (8 bytes
/// per possible pid: 256 KiB at the kernel's default 32768, 32 MiB at the
/// 4194304 limit); a tgid beyond it is counted in `proc_table_full`.
#[map]
pub static PROCS: Array<u64> = Array::with_max_entries(swiftlet_common::PROC_TABLE_DEFAULT, 0);

/// Per-CPU memory deltas for the node slot not yet added to it (statistics
/// tracepoint strategy): flushed once they reach `NODE_MEMORY_BATCH` pages,
/// so the node's figures stay as exact as the kernel's and its shared cache
/// line is written once per batch rather than once per page. Read by the
/// agent for the exact node figures.
#[map]
pub static NODE_PENDING: PerCpuArray<NodePending> = PerCpuArray::with_max_entries(1, 0);

/// The pages a CPU gathers before it adds them to the node slot: the
/// kernel's charge batch by default; 1 for an observer that must see the
/// node's line crossed at the very page (the eviction race).
#[unsafe(no_mangle)]
pub static NODE_MEMORY_BATCH: Global<u32> = Global::new(swiftlet_common::NODE_MEMORY_BATCH);

/// 0 for an observer whose records must not wake its reader: every record
/// is then committed without a wake-up, and the reader drains the ring on
/// a timer. A wake-up is an irq_work raised by a self-IPI on the CPU of the
/// event, which in a VM is an exit to the host, right where the observer
/// times the task that crossed the line.
#[unsafe(no_mangle)]
pub static RECORDS_WAKE_READER: Global<u32> = Global::new(1);

/// How close to the node's memory line (in pages) every page is added to the
/// node at once: the agent sets, for every possible CPU, a batch plus six
/// of the kernel's own stat thresholds, the most the node's figure as one
/// CPU sees it can lag behind the kernel's as read at every page.
#[unsafe(no_mangle)]
pub static NODE_LINE_SLACK: Global<u64> = Global::new(0);

/// A word per CPU through which a pointer becomes a plain number (the
/// verifier types what it loads from a map value as a number).
#[map]
pub static SCRATCH: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Each CPU's per-CPU offset (what `per_cpu_ptr` adds to a per-CPU
/// pointer), found once per CPU through `SCRATCH` (see
/// `kernel::cpu_offset`); 0 until then.
#[map]
pub static CPU_OFFSETS: Array<u64> = Array::with_max_entries(swiftlet_common::MAX_CPUS_SUMMED, 0);

/// Each NUMA node's `struct pglist_data`, found once through the first
/// memory cgroup whose lruvec on that node is in use (the kernel sets
/// `lruvec->pgdat` on first use) and kept: a node's pgdat never moves.
#[map]
pub static PGDATS: Array<u64> = Array::with_max_entries(swiftlet_common::MAX_NUMA_NODES, 0);

/// The process programs' per-CPU state: the node's pending task delta and
/// a one-entry resolution cache (see [`ProcCpu`]). Read by the agent for
/// the exact node task count.
#[map]
pub static PROC_CPU: PerCpuArray<ProcCpu> = PerCpuArray::with_max_entries(1, 0);

/// Processes (by tgid) whose exit the agent wants reported. Agent-owned.
#[map]
pub static WATCH_EXIT: HashMap<u32, u32> = HashMap::with_max_entries(1024, 0);

/// Global control block (one element). Mapped into the agent's memory.
#[map]
pub static CONTROL: Array<Control> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// Victim plans, one per kernel line. Mapped into the agent, which writes
/// them (see `VictimPlan` for how a plan is never read half-written).
#[map]
pub static PLANS: Array<VictimPlan> = Array::with_max_entries(swiftlet_common::MAX_PLANS, BPF_F_MMAPABLE);

/// Crossings, OOM kills, removals and kernel kills, for the agent.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_RING_BYTES, 0);

#[inline(always)]
pub fn control() -> Option<*mut Control> {
    CONTROL.get_ptr_mut(0)
}

/// The memcg process `tgid` was counted under, or 0.
#[inline(always)]
pub fn counted_memcg(tgid: u32) -> u64 {
    match PROCS.get_ptr(tgid) {
        // SAFETY: a pointer into the array.
        Some(p) => unsafe { core::ptr::read_volatile(p) },
        None => 0,
    }
}

#[inline(always)]
pub fn slot(index: u32) -> Option<*mut CgroupSlot> {
    SLOTS.get_ptr_mut(index)
}
