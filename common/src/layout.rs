//! The running kernel's layout, handed to the programs at load.

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
