//! Finds, in the running kernel's BTF, the offsets and enum values the
//! kernel programs need ([`KernelLayout`]), and the kernel symbols they read
//! (from /proc/kallsyms).

use std::{collections::HashMap, fs, sync::OnceLock};

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
        ..charge_layout(btf).unwrap_or_default()
    })
}

/// What the page-counter hooks need ([`KernelLayout::charge_valid`] set);
/// an error names what this kernel lacks, and the hooks stay unused.
/// `vm_node_stat` is filled in separately (it needs /proc/kallsyms).
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

/// Addresses of kernel symbols from /proc/kallsyms (root sees them unless
/// `kernel.kptr_restrict` is 2). Read once per process: on an emulated CPU
/// the kernel takes seconds to produce the file.
pub fn kernel_symbol(name: &str) -> Option<u64> {
    static WANTED: OnceLock<HashMap<String, u64>> = OnceLock::new();
    WANTED
        .get_or_init(|| match fs::read_to_string("/proc/kallsyms") {
            Ok(text) => parse_kallsyms(&text, KERNEL_SYMBOLS),
            Err(_) => HashMap::new(),
        })
        .get(name)
        .copied()
}

/// The symbols [`kernel_symbol`] can answer for.
pub const KERNEL_SYMBOLS: &[&str] = &["vm_node_stat"];

/// Finds `wanted` data or text symbols of the kernel proper (not modules,
/// whose lines end in `[module]`); zero addresses (hidden by kptr_restrict)
/// are left out. Searches the whole text for each name (std's substring
/// search) rather than splitting 100k+ lines.
pub fn parse_kallsyms(text: &str, wanted: &[&str]) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for name in wanted {
        let needle = format!(" {name}\n");
        let mut from = 0;
        while let Some(at) = text[from..].find(&needle).map(|i| i + from) {
            from = at + needle.len();
            let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
            let mut it = text[line_start..at].split_whitespace();
            let (Some(addr), Some(_kind), None) = (it.next(), it.next(), it.next()) else { continue };
            if let Ok(a) = u64::from_str_radix(addr, 16)
                && a != 0
            {
                out.insert((*name).to_owned(), a);
                break;
            }
        }
    }
    out
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
    fn kallsyms() {
        let text =
            "ffffffff81000000 T _text\nffffffff8f4093c0 D vm_node_stat\nffffffffc0001000 t vm_node_stat\t[mod]\n";
        let m = parse_kallsyms(text, &["vm_node_stat", "nope"]);
        assert_eq!(m.get("vm_node_stat"), Some(&0xffffffff8f4093c0));
        assert_eq!(m.len(), 1);
        // Hidden by kptr_restrict: all zeros, which is no address at all.
        let hidden = "0000000000000000 D vm_node_stat\n";
        assert!(parse_kallsyms(hidden, &["vm_node_stat"]).is_empty());
        assert!(parse_kallsyms("garbage\n\n", &["vm_node_stat"]).is_empty());
        // The first line, and a module's symbol of the same name only.
        assert_eq!(parse_kallsyms("ffffffff81000010 D vm_node_stat\n", &["vm_node_stat"]).len(), 1);
        assert!(parse_kallsyms("ffffffffc0001000 t vm_node_stat\t[mod]\n", &["vm_node_stat"]).is_empty());
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
        // Every kernel we support has the page-counter layout too.
        assert_eq!(l.charge_valid, 1, "{:?}", charge_layout(&btf).err());
        assert!(l.memcg_memory > 0 && l.memcg_memory < l.memcg_usage + 1 && l.mz_memcg != l.mz_lruvec);
    }
}
