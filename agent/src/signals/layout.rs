//! Finds, in the running kernel's BTF, the offsets and enum values the
//! kernel programs need ([`KernelLayout`]), and which attach points exist.

use std::fs;

use swiftlet_common::KernelLayout;

use super::btf::{Btf, BtfError};

/// Reads the layout from BTF. `memory_hierarchy_id` comes from
/// /proc/cgroups (0 when the memory controller is on cgroup v2).
pub fn kernel_layout(btf: &Btf) -> Result<KernelLayout, BtfError> {
    // The programs treat a `struct mem_cgroup *` as its css pointer.
    let css_in_memcg = btf.member_offset("mem_cgroup", "css")?;
    if css_in_memcg != 0 {
        return Err(BtfError::Malformed("mem_cgroup.css is not the first member"));
    }
    let memory_cgrp_id = btf.enum_value("cgroup_subsys_id", "memory_cgrp_id")? as u32;
    let subsys = btf.member_offset("css_set", "subsys")?;
    let as_u32 = |v: i64| v as u32;
    Ok(KernelLayout {
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
        valid: 1,
        _pad: 0,
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
        assert_ne!(l.nr_inactive_file, l.nr_anon_mapped);
    }
}
