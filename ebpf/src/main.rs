//! swiftlet's kernel side: keeps the eviction signals of every registered
//! cgroup current in BPF maps and reports threshold crossings over a ring
//! buffer the moment they happen.
//!
//! Programs (the agent probes the kernel and attaches, per signal, the most
//! exact set it supports; kprobes are not available everywhere we run):
//! - `memcg_lruvec_state` (tp_btf memcg/mod_memcg_lruvec_state): memory, on
//!   kernels with the memcg tracepoints.
//! - `memcg_try_charge`, `memcg_charge`, `memcg_uncharge` (fexit on the page
//!   counter) with `lru_size` or `lruvec_state` (fentry): memory, on kernels
//!   without them (see `charge.rs`).
//! - `node_fold` (tp_btf power/cpu_idle): the node's memory near its line,
//!   re-read where the kernel folds its per-CPU statistics (with the
//!   kernel's per-node statistics only).
//! - `process_fork`, `process_exit`, `cgroup_attach` (tp_btf): processes.
//! - `inode_alloc`, `inode_free` (ext4 tracepoints): inodes.
//! - `cgroup_mkdir`, `cgroup_rmdir` (tracepoints): cgroup lifecycle.
//! - `oom_mark_victim` (tp_btf oom/mark_victim): kernel OOM kills.
//! - `refresh` (syscalls/sys_enter_getpgid, from the agent only): re-reads
//!   the slots' page counters before the agent takes a snapshot.

#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

#[cfg(target_arch = "bpf")]
mod charge;
#[cfg(target_arch = "bpf")]
mod inodes;
#[cfg(target_arch = "bpf")]
mod kernel;
#[cfg(target_arch = "bpf")]
mod kill;
#[cfg(target_arch = "bpf")]
mod lifecycle;
#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod memory;
#[cfg(target_arch = "bpf")]
mod processes;
#[cfg(target_arch = "bpf")]
mod refresh;
#[cfg(target_arch = "bpf")]
mod threshold;
#[cfg(target_arch = "bpf")]
mod wakeup;

/// kfuncs and several helpers are only for GPL-compatible programs.
#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier proves programs cannot reach a panic; this is never run.
    loop {}
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}
