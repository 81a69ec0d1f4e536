//! `cargo xtask vmtest`: swiftlet on Debian's LTS kernels, in qemu under
//! TCG (KVM does not work on these machines).
//!
//! - The kernel matrix (`matrix`): the signal, eviction and kill tests on
//!   Debian's 6.1 and 6.12 cloud kernels, each booted from an initramfs
//!   holding the test binaries, and on this host.
//! - The node VM (`--e2e`, `e2e`): a Debian 12 disk (`node`) booted with
//!   systemd as PID 1, cgroup v2 only and containerd, as kubeadm sets a
//!   node up; swiftlet runs from the project's systemd unit and the
//!   end-to-end checks drive it as a cluster would.

mod bench;
mod cache_disk;
mod e2e;
mod initramfs;
mod kernel;
mod matrix;
mod node;
mod qemu;

use anyhow::Result;
pub use bench::bench;
pub use cache_disk::{BENCH as CACHE_BENCH, KERNEL as CACHE_BENCH_KERNEL};
pub use e2e::{CI_PLAN, E2E_CHECKS, E2eColumn, print_e2e, run_e2e};
pub use kernel::{CI_KERNEL, KERNELS};
pub use matrix::{CHECKS, Outcome, print_matrix, run_matrix};

#[derive(clap::Args, Clone)]
pub struct Args {
    /// Kernels to run (6.1, 6.12; the matrix also knows `host`); default: all.
    #[arg(long = "kernel")]
    pub kernels: Vec<String>,
    /// The end-to-end checks on the node VM (systemd as PID 1, cgroup v2,
    /// containerd, swiftlet from its systemd unit) instead of the kernel
    /// matrix.
    #[arg(long)]
    pub e2e: bool,
    /// With --e2e, the cgroup drivers to run (systemd, cgroupfs); default:
    /// systemd on every kernel, and cgroupfs on 6.12.
    #[arg(long = "driver", requires = "e2e")]
    pub drivers: Vec<String>,
    /// Only the checks whose test name contains one of these.
    pub filters: Vec<String>,
}

/// `cargo xtask vmtest`.
pub fn run(args: Args) -> Result<()> {
    if args.e2e { e2e::run(args) } else { matrix::run(args) }
}
