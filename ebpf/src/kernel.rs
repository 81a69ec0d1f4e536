//! Reads of kernel structures at the offsets the agent found in BTF.
//!
//! Every read goes through `bpf_probe_read_kernel`, so a stale pointer yields
//! an error, never a fault.

use aya_ebpf::helpers::{bpf_get_current_task, bpf_probe_read_kernel};

use crate::maps::LAYOUT;

#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    // SAFETY: probe_read validates the address; a bad one returns an error.
    unsafe { bpf_probe_read_kernel(addr as *const u64).ok() }
}

#[inline(always)]
fn read_u32(addr: u64) -> Option<u32> {
    // SAFETY: as above.
    unsafe { bpf_probe_read_kernel(addr as *const u32).ok() }
}

#[inline(always)]
pub fn read_i64(addr: u64) -> Option<i64> {
    // SAFETY: as above.
    unsafe { bpf_probe_read_kernel(addr as *const i64).ok() }
}

/// The cgroup id (kernfs node id) of a css: `css->cgroup->kn->id`.
#[inline(always)]
pub fn css_cgroup_id(css: u64) -> Option<u64> {
    let l = LAYOUT.load();
    let cgrp = read_u64(css + l.css_cgroup as u64)?;
    let kn = read_u64(cgrp + l.cgroup_kn as u64)?;
    read_u64(kn + l.kn_id as u64)
}

/// The parent css, or 0 at the root.
#[inline(always)]
pub fn css_parent(css: u64) -> u64 {
    read_u64(css + LAYOUT.load().css_parent as u64).unwrap_or(0)
}

/// A memcg's page counter, in pages.
#[inline(always)]
pub fn memcg_usage_pages(memcg: u64) -> Option<i64> {
    read_i64(memcg + LAYOUT.load().memcg_usage as u64)
}

/// The memory cgroup of a task: `task->cgroups->subsys[memory_cgrp_id]`.
/// `struct mem_cgroup` starts with its css, so the css address is the memcg.
#[inline(always)]
pub fn task_memcg(task: u64) -> Option<u64> {
    let l = LAYOUT.load();
    let cset = read_u64(task + l.task_cgroups as u64)?;
    let css = read_u64(cset + l.cset_memcg as u64)?;
    if css == 0 { None } else { Some(css) }
}

#[inline(always)]
pub fn current_task() -> u64 {
    // SAFETY: the helper has no preconditions.
    unsafe { bpf_get_current_task() }
}

#[inline(always)]
pub fn task_pid(task: u64) -> Option<u32> {
    read_u32(task + LAYOUT.load().task_pid as u64)
}

#[inline(always)]
pub fn task_tgid(task: u64) -> Option<u32> {
    read_u32(task + LAYOUT.load().task_tgid as u64)
}
