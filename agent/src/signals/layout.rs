//! Finds, in the running kernel's BTF, the offsets and enum values the
//! kernel programs need ([`KernelLayout`]).

use std::fs;

use swiftlet_common::{KernelLayout, MAX_CPUS_SUMMED, MAX_NUMA_NODES};

use super::btf::{Btf, BtfError};

/// Reads the layout from BTF. `memory_hierarchy_id` comes from
/// /proc/cgroups (0 when the memory controller is on cgroup v2).
pub fn kernel_layout(btf: &Btf) -> Result<KernelLayout, BtfError> {
    kernel_layout_explained(btf).map(|(layout, _)| layout)
}

/// As [`kernel_layout`], with the reason the pages each CPU holds back
/// cannot be read where the node's statistics can (the loader warns of it).
pub fn kernel_layout_explained(btf: &Btf) -> Result<(KernelLayout, Option<HeldBackUnavailable>), BtfError> {
    // The programs treat a `struct mem_cgroup *` as its css pointer.
    let css_in_memcg = btf.member_offset("mem_cgroup", "css")?;
    if css_in_memcg != 0 {
        return Err(BtfError::Malformed("mem_cgroup.css is not the first member"));
    }
    let memory_cgrp_id = btf.enum_value("cgroup_subsys_id", "memory_cgrp_id")? as u32;
    let subsys = btf.member_offset("css_set", "subsys")?;
    let as_u32 = |v: i64| v as u32;
    let mut layout = KernelLayout {
        css_cgroup: btf.member_offset("cgroup_subsys_state", "cgroup")?,
        css_parent: btf.member_offset("cgroup_subsys_state", "parent")?,
        cgroup_kn: btf.member_offset("cgroup", "kn")?,
        kn_id: btf.member_offset("kernfs_node", "id")?,
        memcg_usage: btf.member_offset("mem_cgroup", "memory.usage")?,
        task_cgroups: btf.member_offset("task_struct", "cgroups")?,
        cset_memcg: subsys + 8 * memory_cgrp_id,
        task_pid: btf.member_offset("task_struct", "pid")?,
        task_tgid: btf.member_offset("task_struct", "tgid")?,
        nr_inactive_file: as_u32(btf.enum_value("node_stat_item", "NR_INACTIVE_FILE")?),
        nr_anon_mapped: as_u32(btf.enum_value("node_stat_item", "NR_ANON_MAPPED")?),
        nr_file_pages: as_u32(btf.enum_value("node_stat_item", "NR_FILE_PAGES")?),
        memory_hierarchy_id: memory_hierarchy_id().unwrap_or(0),
        task_flags: btf.member_offset("task_struct", "flags")?,
        cgroup_level: btf.member_offset("cgroup", "level")?,
        cgroup_ancestors: btf.member_offset("cgroup", "ancestors")?,
        valid: 1,
        ..charge_layout(btf).unwrap_or_default()
    };
    let mut held_back_missing = None;
    if let (Ok(n), Some(nodes)) = (node_stat_layout(btf), nr_node_ids()) {
        layout.memcg_nodeinfo = n.memcg_nodeinfo;
        layout.mz_lruvec = n.mz_lruvec;
        layout.lruvec_pgdat = n.lruvec_pgdat;
        layout.pgdat_vm_stat = n.pgdat_vm_stat;
        layout.nr_node_ids = if nodes <= MAX_NUMA_NODES { nodes } else { 0 };
        match held_back_layout(btf, nr_cpu_ids()) {
            Ok(h) => {
                layout.pgdat_per_cpu_nodestats = h.pgdat_per_cpu_nodestats;
                layout.pcp_node_stat_diff = h.pcp_node_stat_diff;
                layout.nr_cpu_ids = h.nr_cpu_ids;
                layout.array_pptrs = h.array_pptrs;
            }
            Err(why) if layout.nr_node_ids != 0 => held_back_missing = Some(why),
            Err(_) => {}
        }
    }
    Ok((layout, held_back_missing))
}

/// Why the pages each CPU holds back from the node's statistics cannot be
/// read, and the node's figure near its line is the kernel's counters alone.
#[derive(Debug, PartialEq, Eq)]
pub enum HeldBackUnavailable {
    Btf(String),
    /// /sys/devices/system/cpu/possible unreadable, or more CPUs than the
    /// programs sum.
    Cpus(Option<u32>),
}

impl std::fmt::Display for HeldBackUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeldBackUnavailable::Btf(e) => write!(f, "BTF: {e}"),
            HeldBackUnavailable::Cpus(None) => f.write_str("/sys/devices/system/cpu/possible is unreadable"),
            HeldBackUnavailable::Cpus(Some(n)) => {
                write!(f, "{n} possible CPUs, more than the {MAX_CPUS_SUMMED} summed")
            }
        }
    }
}

/// The path to the pages each CPU holds back from a node's statistics
/// (`per_cpu_ptr(pgdat->per_cpu_nodestats, cpu)->vm_node_stat_diff`), for
/// CPUs `0..cpus`, and where a per-CPU array map keeps its per-CPU
/// pointers, through which the programs find each CPU's per-CPU offset.
pub fn held_back_layout(btf: &Btf, cpus: Option<u32>) -> Result<KernelLayout, HeldBackUnavailable> {
    let btf_err = |e: BtfError| HeldBackUnavailable::Btf(e.to_string());
    Ok(KernelLayout {
        pgdat_per_cpu_nodestats: btf.member_offset("pglist_data", "per_cpu_nodestats").map_err(btf_err)?,
        pcp_node_stat_diff: btf.member_offset("per_cpu_nodestat", "vm_node_stat_diff").map_err(btf_err)?,
        array_pptrs: btf.member_offset("bpf_array", "pptrs").map_err(btf_err)?,
        nr_cpu_ids: cpus.filter(|n| (1..=MAX_CPUS_SUMMED).contains(n)).ok_or(HeldBackUnavailable::Cpus(cpus))?,
        ..KernelLayout::default()
    })
}

/// The kernel's `nr_cpu_ids`: one past the highest possible CPU.
pub fn nr_cpu_ids() -> Option<u32> {
    parse_node_list(&fs::read_to_string("/sys/devices/system/cpu/possible").ok()?).map(|max| max + 1)
}

/// The path from a memory cgroup to the kernel's per-node statistics
/// (`memcg->nodeinfo[n]->lruvec.pgdat->vm_stat`); `nr_node_ids` is left 0
/// for the caller.
pub fn node_stat_layout(btf: &Btf) -> Result<KernelLayout, BtfError> {
    Ok(KernelLayout {
        memcg_nodeinfo: btf.member_offset("mem_cgroup", "nodeinfo")?,
        mz_lruvec: btf.member_offset("mem_cgroup_per_node", "lruvec")?,
        lruvec_pgdat: btf.member_offset("lruvec", "pgdat")?,
        pgdat_vm_stat: btf.member_offset("pglist_data", "vm_stat")?,
        ..KernelLayout::default()
    })
}

/// The kernel's `nr_node_ids`: one past the highest possible NUMA node in
/// /sys/devices/system/node/possible, or 1 on a kernel built without NUMA
/// (no such file, and `nodeinfo` has one entry).
pub fn nr_node_ids() -> Option<u32> {
    match fs::read_to_string("/sys/devices/system/node/possible") {
        Ok(s) => parse_node_list(&s).map(|max| max + 1),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(1),
        Err(_) => None,
    }
}

/// The highest id of a sysfs node or CPU list ("0", "0-3", "0,2-5").
fn parse_node_list(s: &str) -> Option<u32> {
    let mut highest = None;
    for range in s.trim().split(',') {
        let last: u32 = range.rsplit('-').next()?.trim().parse().ok()?;
        highest = highest.max(Some(last));
    }
    highest
}

/// What the page-counter hooks need ([`KernelLayout::charge_valid`] set);
/// an error names what this kernel lacks, and the hooks stay unused.
pub fn charge_layout(btf: &Btf) -> Result<KernelLayout, BtfError> {
    let memcg_memory = btf.member_offset("mem_cgroup", "memory")?;
    let pc_usage = btf.member_offset("page_counter", "usage")?;
    if memcg_memory + pc_usage != btf.member_offset("mem_cgroup", "memory.usage")? {
        return Err(BtfError::Malformed("mem_cgroup.memory.usage is not where its parts say"));
    }
    Ok(KernelLayout {
        memcg_memory,
        pc_parent: btf.member_offset("page_counter", "parent")?,
        mz_lruvec: btf.member_offset("mem_cgroup_per_node", "lruvec")?,
        mz_memcg: btf.member_offset("mem_cgroup_per_node", "memcg")?,
        lru_inactive_file: btf.enum_value("lru_list", "LRU_INACTIVE_FILE")? as u32,
        charge_valid: 1,
        ..KernelLayout::default()
    })
}

/// The hierarchy id of the memory controller from /proc/cgroups.
pub fn memory_hierarchy_id() -> Option<u32> {
    parse_proc_cgroups(&fs::read_to_string("/proc/cgroups").ok()?)
}

fn parse_proc_cgroups(s: &str) -> Option<u32> {
    s.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next()? == "memory").then_some(())?;
        it.next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_cgroups() {
        let s = "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpu\t1\t1\t1\nmemory\t4\t5\t1\n";
        assert_eq!(parse_proc_cgroups(s), Some(4));
        assert_eq!(parse_proc_cgroups("memory\t0\t90\t1\n"), Some(0));
        assert_eq!(parse_proc_cgroups("cpu 1 1 1\n"), None);
    }

    #[test]
    fn node_lists() {
        let table: [(&str, Option<u32>); 6] =
            [("0\n", Some(0)), ("0-3\n", Some(3)), ("0,2-5", Some(5)), ("4,0-1", Some(4)), ("", None), ("0-x", None)];
        for (list, want) in table {
            assert_eq!(parse_node_list(list), want, "{list:?}");
        }
    }

    #[test]
    fn held_back_pages_need_a_cpu_count_the_programs_sum() {
        let btf = Btf::from_sys_fs().unwrap_or_else(|e| panic!("this test needs kernel BTF: {e}"));
        let table: [(Option<u32>, Result<u32, HeldBackUnavailable>); 5] = [
            (Some(2), Ok(2)),
            (Some(MAX_CPUS_SUMMED), Ok(MAX_CPUS_SUMMED)),
            (Some(MAX_CPUS_SUMMED + 1), Err(HeldBackUnavailable::Cpus(Some(MAX_CPUS_SUMMED + 1)))),
            (Some(0), Err(HeldBackUnavailable::Cpus(Some(0)))),
            (None, Err(HeldBackUnavailable::Cpus(None))),
        ];
        for (cpus, want) in table {
            let got = held_back_layout(&btf, cpus);
            assert_eq!(got.as_ref().map(|l| l.nr_cpu_ids), want.as_ref().map(|n| *n), "{cpus:?}");
            if let Ok(l) = got {
                // `vm_node_stat_diff` follows the one-byte `stat_threshold`;
                // `pptrs` follows the map's own struct.
                assert!(l.pgdat_per_cpu_nodestats > 0 && l.pcp_node_stat_diff == 1 && l.array_pptrs > 0, "{l:?}");
            }
        }
    }

    /// The running kernel's BTF yields a complete layout (this reads
    /// /sys/kernel/btf/vmlinux, which every supported kernel has).
    #[test]
    fn layout_from_running_kernel() {
        let btf = match Btf::from_sys_fs() {
            Ok(b) => b,
            Err(e) => panic!("this test needs kernel BTF at /sys/kernel/btf/vmlinux: {e}"),
        };
        let l = kernel_layout(&btf).unwrap();
        assert_eq!(l.valid, 1);
        assert!(l.memcg_usage > 0 && l.task_cgroups > 0 && l.kn_id > 0);
        assert!(l.cgroup_ancestors > l.cgroup_level, "{l:?}");
        assert_ne!(l.nr_inactive_file, l.nr_anon_mapped);
        // Every kernel we support has the page-counter layout too.
        assert_eq!(l.charge_valid, 1, "{:?}", charge_layout(&btf).err());
        assert!(l.memcg_memory > 0 && l.memcg_memory < l.memcg_usage + 1 && l.mz_memcg != l.mz_lruvec);
        // And the path to the per-node statistics.
        assert!(l.nr_node_ids >= 1, "{:?}", node_stat_layout(&btf).err());
        assert!(l.memcg_nodeinfo > l.memcg_usage && l.pgdat_vm_stat > 0, "{l:?}");
        // And the pages each CPU holds back from them.
        assert!(l.nr_cpu_ids >= 1 && l.array_pptrs > 0, "{:?}", held_back_layout(&btf, nr_cpu_ids()).err());
    }
}
