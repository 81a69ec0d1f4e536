//! `cargo xtask bench`: builds the benchmark runner in release mode and runs
//! it; the runner writes target/bench/report.md, results.json and plots.

use std::process::Command;

use anyhow::Result;

use crate::{
    cmd::{self, step},
    containerd::Containerd,
    setup,
};

#[derive(clap::Args)]
pub struct Args {
    /// Short runs for smoke checks (finishes in under 3 minutes).
    #[arg(long)]
    quick: bool,
    /// Benchmarks to run (default: all); `--list` shows them.
    names: Vec<String>,
    /// List the benchmarks and exit.
    #[arg(long)]
    list: bool,
}

pub fn run(args: Args) -> Result<()> {
    setup::require_root("the benchmarks")?;
    let tc = setup::all()?;
    setup::ensure_apt(setup::APT_BENCH)?;
    setup::build_ebpf(&tc)?;
    let root = cmd::workspace_root();
    step("building the benchmark runner (release)");
    cmd::run(Command::new("cargo").current_dir(root).env("PATH", tc.path_env()).args([
        "build",
        "--release",
        "-p",
        "swiftlet-tests",
        "-p",
        "swiftlet",
        "--bins",
    ]))?;
    // The pod benches run pods on our own containerd.
    let containerd = Containerd::start(root, "bench")?;
    let mut c = Command::new(root.join("target/release/swiftlet-bench"));
    c.arg("--out").arg(root.join("target/bench")).env("SWIFTLET_TEST_CRI_ENDPOINT", containerd.endpoint());
    if args.quick {
        c.arg("--quick");
    }
    if args.list {
        c.arg("--list");
    }
    c.args(&args.names);
    step("running benchmarks");
    let result = cmd::run(&mut c);
    drop(containerd);
    result?;
    // The kernel matrix's other rows: the same bench in each VM kernel.
    if !args.list && (args.names.is_empty() || args.names.iter().any(|n| n == "kernel-matrix")) {
        crate::vm::bench(
            &root.join("target/release/swiftlet-bench"),
            &root.join("target/release/swiftlet-workload"),
            args.quick,
        )?;
    }
    Ok(())
}
