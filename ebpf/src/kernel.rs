//! Reads of kernel structures at the offsets the agent found in BTF.
//!
//! Reads through plain numbers go through `bpf_probe_read_kernel`, so a
//! stale pointer yields an error, never a fault. The `btf_task_*` reads
//! take a tracepoint's BTF-typed task pointer and load directly: the
//! verifier checks them against the kernel's BTF and the JIT guards them
//! with an exception-table entry (a fault reads 0).

use aya_ebpf::{
    cty::c_void,
    helpers::{bpf_get_current_task, bpf_map_lookup_percpu_elem, bpf_probe_read_kernel},
};

use swiftlet_common::{MAX_CPUS_SUMMED, MAX_NUMA_NODES};

use crate::maps::{CPU_OFFSETS, PGDATS, SCRATCH, layout};

#[inline(always)]
pub fn read_u64(addr: u64) -> Option<u64> {
    // SAFETY: probe_read validates the address; a bad one returns an error.
    unsafe { bpf_probe_read_kernel(addr as *const u64).ok() }
}

#[inline(always)]
fn read_u32(addr: u64) -> Option<u32> {
    // SAFETY: as above.
    unsafe { bpf_probe_read_kernel(addr as *const u32).ok() }
}

#[inline(always)]
fn read_i8(addr: u64) -> Option<i8> {
    // SAFETY: as above.
    unsafe { bpf_probe_read_kernel(addr as *const i8).ok() }
}

#[inline(always)]
pub fn read_i64(addr: u64) -> Option<i64> {
    // SAFETY: as above.
    unsafe { bpf_probe_read_kernel(addr as *const i64).ok() }
}

/// A typed kernel pointer (a tp_btf or fentry argument) as a plain number.
/// The verifier keeps the pointer type through moves and arithmetic, and
/// global functions take scalars only; a read through the helper yields an
/// untyped copy. The programs never dereference these pointers directly.
#[inline(always)]
pub fn scalar(ptr: u64) -> u64 {
    let v = ptr;
    read_u64(&v as *const u64 as u64).unwrap_or(0)
}

/// The cgroup id (kernfs node id) of a css: `css->cgroup->kn->id`.
#[inline(always)]
pub fn css_cgroup_id(css: u64) -> Option<u64> {
    let cgrp = read_u64(css + layout!(css_cgroup) as u64)?;
    let kn = read_u64(cgrp + layout!(cgroup_kn) as u64)?;
    read_u64(kn + layout!(kn_id) as u64)
}

/// True when the css `below`'s cgroup lies under `above`'s, at any depth:
/// `cgroup->ancestors[level of above]` is `above`'s cgroup. One read
/// whatever the depth, where walking up the parents would be one per level.
#[inline(always)]
pub fn css_below(below: u64, above: u64) -> bool {
    let (Some(cgrp), Some(top)) =
        (read_u64(below + layout!(css_cgroup) as u64), read_u64(above + layout!(css_cgroup) as u64))
    else {
        return false;
    };
    let (Some(level), Some(top_level)) =
        (read_u32(cgrp + layout!(cgroup_level) as u64), read_u32(top + layout!(cgroup_level) as u64))
    else {
        return false;
    };
    if level <= top_level || layout!(cgroup_ancestors) == 0 {
        return false;
    }
    read_u64(cgrp + layout!(cgroup_ancestors) as u64 + 8 * top_level as u64) == Some(top)
}

/// The parent css, or 0 at the root.
#[inline(always)]
pub fn css_parent(css: u64) -> u64 {
    read_u64(css + layout!(css_parent) as u64).unwrap_or(0)
}

/// A memcg's page counter, in pages.
#[inline(always)]
pub fn memcg_usage_pages(memcg: u64) -> Option<i64> {
    read_i64(memcg + layout!(memcg_usage) as u64)
}

/// The memory cgroup of a task: `task->cgroups->subsys[memory_cgrp_id]`.
/// `struct mem_cgroup` starts with its css, so the css address is the memcg.
#[inline(always)]
pub fn task_memcg(task: u64) -> Option<u64> {
    let cset = read_u64(task + layout!(task_cgroups) as u64)?;
    let css = read_u64(cset + layout!(cset_memcg) as u64)?;
    if css == 0 { None } else { Some(css) }
}

#[inline(always)]
pub fn current_task() -> u64 {
    // SAFETY: the helper has no preconditions.
    unsafe { bpf_get_current_task() }
}

#[inline(always)]
pub fn task_pid(task: u64) -> Option<u32> {
    read_u32(task + layout!(task_pid) as u64)
}

#[inline(always)]
pub fn task_tgid(task: u64) -> Option<u32> {
    read_u32(task + layout!(task_tgid) as u64)
}

/// A task's pid and tgid, loaded straight through a BTF-typed `struct
/// task_struct *` (a tp_btf argument, kept as the register the context
/// gave): `LAYOUT` sits in a frozen read-only map, so the verifier knows
/// the offsets as constants and checks each load against the kernel's BTF,
/// and the JIT emits a plain load with an exception-table fixup. No helper
/// is called: on fork and exit, which leave the caches cold, the helper's
/// own code (`bpf_probe_read_kernel`, `copy_from_kernel_nofault`) was a
/// good part of what these programs cost.
#[inline(always)]
pub fn btf_task_pid_tgid(task: u64) -> (u32, u32) {
    let t = task as *const u8;
    let (pid_off, tgid_off) = (layout!(task_pid) as usize, layout!(task_tgid) as usize);
    // SAFETY: `task` is the tracepoint's task; the verifier checks these
    // loads against its BTF type and a fault yields 0.
    unsafe {
        (
            core::ptr::read_volatile(t.wrapping_add(pid_off) as *const u32),
            core::ptr::read_volatile(t.wrapping_add(tgid_off) as *const u32),
        )
    }
}

/// `task->cgroups->subsys[memory_cgrp_id]` through a BTF-typed task, as
/// [`btf_task_pid_tgid`]. The verifier types the result as a kernel pointer,
/// which global functions and comparisons with plain numbers do not take:
/// it goes through `scratch`, a map value the program owns (loads from a
/// map value are plain numbers), to come back as one. 0 when the memory
/// controller is not there.
#[inline(always)]
pub fn btf_task_memcg(task: u64, scratch: *mut u64) -> u64 {
    let t = task as *const u8;
    let (cgroups_off, memcg_off) = (layout!(task_cgroups) as usize, layout!(cset_memcg) as usize);
    // SAFETY: as above; `scratch` points into a map value.
    unsafe {
        let cset = core::ptr::read_volatile(t.wrapping_add(cgroups_off) as *const u64) as *const u8;
        let css = core::ptr::read_volatile(cset.wrapping_add(memcg_off) as *const u64);
        core::ptr::write_volatile(scratch, css);
        core::ptr::read_volatile(scratch)
    }
}

/// The memory cgroup whose `memory` page counter is at `counter`, or None
/// when `counter` is some other page counter (swap, v1 kmem/tcp/memsw, a
/// hugetlb cgroup's): the charge functions serve them all. The check is
/// structural: a memcg's counter has the parent memcg's counter as parent.
#[inline(always)]
pub fn memcg_of_counter(counter: u64) -> Option<u64> {
    let memcg = counter.wrapping_sub(layout!(memcg_memory) as u64);
    let parent_counter = read_u64(counter + layout!(pc_parent) as u64)?;
    let parent = css_parent(memcg);
    let expected = if parent == 0 { 0 } else { parent + layout!(memcg_memory) as u64 };
    if parent_counter == expected { Some(memcg) } else { None }
}

/// The memory cgroup a lruvec belongs to: `container_of(lruvec, struct
/// mem_cgroup_per_node, lruvec)->memcg`.
#[inline(always)]
pub fn lruvec_memcg(lruvec: u64) -> Option<u64> {
    let memcg = read_u64(lruvec.wrapping_sub(layout!(mz_lruvec) as u64) + layout!(mz_memcg) as u64)?;
    if memcg == 0 { None } else { Some(memcg) }
}

/// The node's usage (anon mapped + file pages) and inactive file pages:
/// the kernel's per-node statistics (`pgdat->vm_stat`) summed over its NUMA
/// nodes, each node's pgdat found through `memcg` (any memory cgroup) the
/// first time. The same figures as `vm_node_stat` and /proc/meminfo, which
/// are behind by the per-CPU diffs the kernel folds in at its stat
/// threshold; with `held_back`, those diffs are added (see
/// [`swiftlet_node_cpu_diffs`]), which makes the figure exact. None where
/// the layout is unknown (`nr_node_ids` 0) or a read failed.
///
/// Unrolled by hand for up to [`MAX_NUMA_NODES`] nodes: 6.1's verifier
/// refused the loop LLVM emitted here ("back-edge from insn 106 to 108").
/// `nr_node_ids` sits in read-only data, so the verifier walks only the
/// copies this machine's node count reaches.
#[inline(always)]
pub fn node_stats(memcg: u64, held_back: bool) -> Option<(i64, i64)> {
    let nodes = layout!(nr_node_ids);
    if nodes == 0 {
        return None;
    }
    let held_back = held_back && layout!(nr_cpu_ids) != 0;
    let vm_stat = layout!(pgdat_vm_stat) as u64;
    let item = |pgdat: u64, item: u32| read_i64(pgdat + vm_stat + 8 * item as u64);
    let mut sum = (0, 0);
    macro_rules! add_node {
        ($n:literal) => {
            if $n < nodes {
                let pgdat = node_pgdat($n, memcg);
                // A node whose pgdat no cgroup has used yet holds no user pages.
                if pgdat != 0 {
                    sum.0 += item(pgdat, layout!(nr_anon_mapped))? + item(pgdat, layout!(nr_file_pages))?;
                    sum.1 += item(pgdat, layout!(nr_inactive_file))?;
                    if held_back {
                        let diffs = swiftlet_node_cpu_diffs(pgdat);
                        sum.0 += i64::from((diffs >> 32) as u32 as i32);
                        sum.1 += i64::from(diffs as u32 as i32);
                    }
                }
            }
        };
    }
    add_node!(0);
    add_node!(1);
    add_node!(2);
    add_node!(3);
    add_node!(4);
    add_node!(5);
    add_node!(6);
    add_node!(7);
    const _: () = assert!(MAX_NUMA_NODES == 8, "one add_node! per node");
    Some(sum)
}

/// The pages every CPU holds back from one node's counters: the usage
/// (anon mapped + file) diffs in the high 32 bits and the inactive file
/// diffs in the low 32, each a signed sum over `nr_cpu_ids` CPUs of
/// `per_cpu_ptr(pgdat->per_cpu_nodestats, cpu)->vm_node_stat_diff[item]`.
/// The kernel adds a page to its CPU's diff first and folds the diff into
/// the node's counters only once it passes the stat threshold, or when the
/// CPU goes idle or runs its vmstat work: a task that allocates up to a
/// line and sleeps would otherwise cross it at that fold, outside its own
/// context. A global function, verified once for every caller.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn swiftlet_node_cpu_diffs(pgdat: u64) -> u64 {
    let cpus = layout!(nr_cpu_ids);
    let Some(per_cpu) = read_u64(pgdat + layout!(pgdat_per_cpu_nodestats) as u64) else { return 0 };
    let diff = per_cpu + layout!(pcp_node_stat_diff) as u64;
    let (anon, file, inactive) =
        (layout!(nr_anon_mapped) as u64, layout!(nr_file_pages) as u64, layout!(nr_inactive_file) as u64);
    let (mut usage, mut held_inactive) = (0i32, 0i32);
    let mut cpu = 0;
    while cpu < cpus && cpu < MAX_CPUS_SUMMED {
        if let Some(offset) = cpu_offset(cpu) {
            let base = diff.wrapping_add(offset);
            usage += i32::from(read_i8(base + anon).unwrap_or(0)) + i32::from(read_i8(base + file).unwrap_or(0));
            held_inactive += i32::from(read_i8(base + inactive).unwrap_or(0));
        }
        cpu += 1;
    }
    ((usage as u32 as u64) << 32) | held_inactive as u32 as u64
}

/// CPU `cpu`'s per-CPU offset, from the cache or found and cached: the
/// address `bpf_map_lookup_percpu_elem` gives for `SCRATCH`'s element on
/// that CPU, less the per-CPU pointer that element is reached through
/// (`((struct bpf_array *)&SCRATCH)->pptrs[0]`). Both pointers become
/// plain numbers through this CPU's `SCRATCH` word (storing a pointer in a
/// map is allowed to the privileged loader the agent is).
#[inline(always)]
fn cpu_offset(cpu: u32) -> Option<u64> {
    let cached = CPU_OFFSETS.get_ptr_mut(cpu)?;
    // SAFETY: an element of the cache; a racing writer stores the same value.
    let known = unsafe { core::ptr::read_volatile(cached) };
    if known != 0 {
        return Some(known);
    }
    let scratch = SCRATCH.get_ptr_mut(0)?;
    let map = (&raw const SCRATCH).cast::<c_void>().cast_mut();
    let key = 0u32;
    // SAFETY: the helper takes a map and a key on the stack; it returns the
    // element's address on `cpu`, or null past the possible CPUs.
    let element = unsafe { bpf_map_lookup_percpu_elem(map, (&raw const key).cast(), cpu) };
    if element.is_null() {
        return None;
    }
    // SAFETY: `scratch` is this CPU's element; the pointers written to it
    // are read back as numbers.
    let (map_address, element_address) = unsafe {
        core::ptr::write_volatile(scratch.cast::<*mut c_void>(), map);
        let map_address = core::ptr::read_volatile(scratch);
        core::ptr::write_volatile(scratch.cast::<*mut c_void>(), element);
        (map_address, core::ptr::read_volatile(scratch))
    };
    let per_cpu = read_u64(map_address + layout!(array_pptrs) as u64)?;
    let offset = element_address.wrapping_sub(per_cpu);
    // SAFETY: as above.
    unsafe { core::ptr::write_volatile(cached, offset) };
    Some(offset)
}

/// NUMA node `n`'s pgdat from the cache, or through `memcg->nodeinfo[n]->
/// lruvec.pgdat` (0 until that lruvec is first used), cached once found.
#[inline(always)]
fn node_pgdat(n: u32, memcg: u64) -> u64 {
    let Some(cached) = PGDATS.get_ptr_mut(n) else { return 0 };
    // SAFETY: an element of the cache; a racing writer stores the same value.
    let known = unsafe { core::ptr::read_volatile(cached) };
    if known != 0 || memcg == 0 {
        return known;
    }
    let Some(mz) = read_u64(memcg + layout!(memcg_nodeinfo) as u64 + 8 * n as u64) else { return 0 };
    if mz == 0 {
        return 0;
    }
    let pgdat = read_u64(mz + layout!(mz_lruvec) as u64 + layout!(lruvec_pgdat) as u64).unwrap_or(0);
    if pgdat != 0 {
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile(cached, pgdat) };
    }
    pgdat
}
