//! `cargo xtask bench`: builds the benchmark runner in release mode and runs
//! it; the runner writes target/bench/report.md, results.json and plots.
//! `cargo xtask test` runs it too, as a smoke check: `--quick` on the dev
//! build it has just made, into target/bench-quick, with nothing asserted.

use std::{path::PathBuf, process::Command};

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
    /// Use the dev-profile binaries instead of a release build (a smoke
    /// check of the harness: the figures are not representative).
    #[arg(long)]
    debug: bool,
    /// Where the report, results.json and plots go (default target/bench).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run the named benchmarks (default: eviction-race) inside these VM
    /// kernels (6.1, 6.12; cgroup v2, fentry) instead of on this host,
    /// reported as `<bench>@<kernel>`. Times under emulation are not real
    /// time: read the ratios between modes of the same run.
    #[arg(long = "vm", value_name = "KERNEL")]
    vm: Vec<String>,
}

impl Args {
    /// What `cargo xtask test` runs: every bench, quick, on the dev build.
    pub fn smoke(out: PathBuf) -> Args {
        Args { quick: true, names: vec![], list: false, debug: true, out: Some(out), vm: vec![] }
    }
}

pub fn run(args: Args) -> Result<()> {
    setup::require_root("the benchmarks")?;
    let tc = setup::all()?;
    setup::build_ebpf(&tc)?;
    run_prepared(&tc, args)
}

/// [`run`] once the toolchain is set up and the eBPF object built (as
/// `cargo xtask test` has done before its smoke run).
pub fn run_prepared(tc: &setup::EbpfToolchain, args: Args) -> Result<()> {
    setup::ensure_apt(setup::APT_BENCH)?;
    let root = cmd::workspace_root();
    let profile = if args.debug { "debug" } else { "release" };
    step(format!("building the benchmark runner ({profile})"));
    let mut build = Command::new("cargo");
    // The commit every result names (SWIFTLET_COMMIT, read at compile time).
    let commit = cmd::output(Command::new("git").current_dir(root).args(["describe", "--always", "--dirty"]))
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into());
    build.current_dir(root).env("PATH", tc.path_env()).env("SWIFTLET_COMMIT", &commit).arg("build");
    if !args.debug {
        build.arg("--release");
    }
    cmd::run(build.args(["-p", "swiftlet-tests", "-p", "swiftlet", "--bins"]))?;
    let bin = root.join("target").join(profile);
    let out = args.out.unwrap_or_else(|| root.join("target/bench"));
    if !args.vm.is_empty() && !args.list {
        let names = if args.names.is_empty() { vec!["eviction-race".to_owned()] } else { args.names.clone() };
        step(format!("running {} inside the VM kernels {}", names.join(", "), args.vm.join(", ")));
        return crate::vm::bench(
            &bin.join("swiftlet-bench"),
            &bin.join("swiftlet-workload"),
            &out,
            args.quick,
            &args.vm,
            &names,
        );
    }
    // The cache race needs cgroup v2 and a disk of its own: named without
    // --vm (or in a full run of every bench), it runs in its VM kernel and
    // the other benches here.
    let mut names = args.names.clone();
    let cache_named = names.iter().any(|n| n == crate::vm::CACHE_BENCH);
    if !args.list && (cache_named || (names.is_empty() && !args.quick)) {
        step(format!("running {} inside the VM kernel {}", crate::vm::CACHE_BENCH, crate::vm::CACHE_BENCH_KERNEL));
        crate::vm::bench(
            &bin.join("swiftlet-bench"),
            &bin.join("swiftlet-workload"),
            &out,
            args.quick,
            &[crate::vm::CACHE_BENCH_KERNEL.to_owned()],
            &[crate::vm::CACHE_BENCH.to_owned()],
        )?;
        names.retain(|n| n != crate::vm::CACHE_BENCH);
        if cache_named && names.is_empty() {
            return Ok(());
        }
    }
    // The pod benches run pods on our own containerd.
    let containerd = Containerd::start(root, "bench")?;
    let mut c = Command::new(bin.join("swiftlet-bench"));
    c.arg("--out").arg(&out).env("SWIFTLET_TEST_CRI_ENDPOINT", containerd.endpoint());
    if args.quick {
        c.arg("--quick");
    }
    if args.list {
        c.arg("--list");
    }
    c.args(&names);
    step("running benchmarks");
    let result = cmd::run(&mut c);
    drop(containerd);
    result?;
    // The kernel matrix's other rows: the same bench in each VM kernel (a
    // quick run boots them only when kernel-matrix is named).
    let named = names.iter().any(|n| n == "kernel-matrix");
    if !args.list && (named || (names.is_empty() && !args.quick)) {
        let names = ["kernel-matrix".to_owned()];
        crate::vm::bench(&bin.join("swiftlet-bench"), &bin.join("swiftlet-workload"), &out, args.quick, &[], &names)?;
    }
    Ok(())
}
