//! `cargo xtask test`: every check CI runs, in order, with a summary.
//! Each step runs even when an earlier one failed, so one run shows every
//! problem; the exit status is non-zero if any step failed.

use std::{process::Command, time::Instant};

use anyhow::{Result, bail};

use crate::{
    cmd::{self, note, step},
    containerd::Containerd,
    setup, vm,
};

#[derive(clap::Args)]
pub struct Args {
    /// Skip the module-graph check, `cargo fmt --check` and clippy.
    #[arg(long)]
    no_lint: bool,
    /// Only unit tests (no root, no containerd).
    #[arg(long)]
    unit_only: bool,
    /// The kernel matrix on every VM kernel, and the node VM's end-to-end
    /// checks on every kernel and driver (`cargo xtask vmtest` also runs
    /// the matrix's host column).
    #[arg(long, conflicts_with = "no_vm")]
    vm: bool,
    /// Skip the VMs: the kernel matrix (by default on one kernel) and the
    /// node VM's end-to-end checks (by default 6.12 with the systemd driver).
    #[arg(long)]
    no_vm: bool,
    /// Skip the benchmark smoke run (`bench --quick` on the dev build).
    #[arg(long)]
    no_bench: bool,
    /// Passed to the integration test harness (test name filters).
    filters: Vec<String>,
}

/// The integration test targets every older containerd runs.
const SMOKE_TARGETS: [&str; 3] = ["pods", "streaming", "pod_eviction"];

pub fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    if !args.unit_only {
        setup::require_root("the integration tests")?;
    }
    let tc = setup::all()?;
    setup::build_ebpf(&tc)?;
    let path = tc.path_env();
    let cargo = |a: &[&str]| {
        let mut c = Command::new("cargo");
        c.current_dir(cmd::workspace_root()).env("PATH", &path).args(a);
        c
    };
    let mut results: Vec<(&str, bool, f64)> = vec![];
    if !args.no_lint {
        step("module graph: no import cycle between the agent's top-level modules");
        let t = Instant::now();
        let ok = succeeded(crate::modgraph::check_tree());
        results.push(("module graph (no import cycle)", ok, t.elapsed().as_secs_f64()));
    }
    // Stages whose containerd did not start, added to the results after
    // the last stage run through `stage` (which holds them meanwhile).
    let mut not_started: Vec<(&str, bool, f64)> = vec![];
    let mut stage = |name: &'static str, c: &mut Command| {
        step(name);
        let t = Instant::now();
        let ok = succeeded(cmd::run(c));
        results.push((name, ok, t.elapsed().as_secs_f64()));
    };

    if !args.no_lint {
        stage("cargo fmt --check", &mut cargo(&["fmt", "--all", "--check"]));
        stage(
            "cargo clippy -D warnings",
            &mut cargo(&["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]),
        );
    }
    // The eBPF crate builds for bpfel (above); its host build would write a
    // second target/debug/swiftlet over the agent's.
    stage(
        "build (workspace, all targets)",
        &mut cargo(&["build", "--workspace", "--exclude", "swiftlet-ebpf", "--all-targets"]),
    );
    stage(
        "unit tests",
        &mut cargo(&["test", "--workspace", "--exclude", "swiftlet-tests", "--exclude", "swiftlet-ebpf"]),
    );
    if !args.unit_only {
        match Containerd::start(cmd::workspace_root(), "test") {
            Ok(ctd) => {
                // Every test binary runs, so the summary shows every failure.
                let mut c = cargo(&["test", "-p", "swiftlet-tests", "--no-fail-fast", "--", "--test-threads=1"]);
                c.args(&args.filters);
                c.env("SWIFTLET_TEST_CRI_ENDPOINT", ctd.endpoint());
                // Tests that restart the runtime start their own from this one's configuration.
                c.env("SWIFTLET_TEST_CONTAINERD_CONFIG", ctd.disk_dir.join("config.toml"));
                // ... with the same version's binaries.
                c.env("PATH", ctd.path_env(&path));
                match setup::ensure_kubectl() {
                    Ok(k) => {
                        c.env("SWIFTLET_TEST_KUBECTL", k);
                    }
                    Err(e) => eprintln!("\x1b[1;31merror:\x1b[0m kubectl for the API server tests: {e:#}"),
                }
                stage("integration tests (root, real kernel, real containerd)", &mut c);
                drop(ctd);
            }
            Err(e) => {
                eprintln!("\x1b[1;31merror:\x1b[0m cannot start containerd for the integration tests: {e:#}");
                not_started.push(("integration tests (containerd did not start)", false, 0.0));
            }
        }
    }

    // The older containerds nodes still run: a smoke subset each (pod
    // lifecycle, streaming, the in-kernel eviction), on the binaries and
    // config of that version.
    if !args.unit_only && args.filters.is_empty() {
        for version in crate::containerd::SMOKE_VERSIONS {
            let name = match version {
                crate::containerd::Version::V1_7 => "containerd 1.7 smoke (pods, streaming, eviction)",
                _ => "containerd 1.6 smoke (pods, streaming, eviction)",
            };
            match Containerd::start_version(cmd::workspace_root(), "smoke", version) {
                Ok(ctd) => {
                    let mut args = vec!["test", "-p", "swiftlet-tests", "--no-fail-fast"];
                    for t in SMOKE_TARGETS {
                        args.extend(["--test", t]);
                    }
                    args.extend(["--", "--test-threads=1"]);
                    let mut c = cargo(&args);
                    c.env("SWIFTLET_TEST_CRI_ENDPOINT", ctd.endpoint());
                    c.env("SWIFTLET_TEST_CONTAINERD_CONFIG", ctd.disk_dir.join("config.toml"));
                    c.env("PATH", ctd.path_env(&path));
                    if let Ok(k) = setup::ensure_kubectl() {
                        c.env("SWIFTLET_TEST_KUBECTL", k);
                    }
                    stage(name, &mut c);
                    drop(ctd);
                }
                Err(e) => {
                    eprintln!("\x1b[1;31merror:\x1b[0m cannot start containerd {}: {e:#}", version.name());
                    not_started.push((name, false, 0.0));
                }
            }
        }
    }

    results.append(&mut not_started);

    // The kernel matrix in qemu: one kernel by default (it fits CI's budget),
    // every kernel with --vm. Name filters narrow it as they narrow the
    // integration tests.
    let vm_checks_match =
        args.filters.is_empty() || vm::CHECKS.iter().any(|c| args.filters.iter().any(|f| c.test.contains(f.as_str())));
    if !args.unit_only && !args.no_vm && !vm_checks_match {
        note("kernel matrix: no check matches the filters; skipped");
    }
    if !args.unit_only && !args.no_vm && vm_checks_match {
        let kernels: Vec<String> = if args.vm {
            vm::KERNELS.iter().map(|k| k.name.to_owned()).collect()
        } else {
            vec![vm::CI_KERNEL.to_owned()]
        };
        step(format!("kernel matrix in qemu: {}", kernels.join(", ")));
        let t = Instant::now();
        let ok = match vm::run_matrix(&tc, &kernels, &args.filters) {
            Ok(columns) => {
                vm::print_matrix(&columns, &args.filters);
                !columns
                    .iter()
                    .any(|c| c.outcomes.values().any(|o| matches!(o, vm::Outcome::Fail(_) | vm::Outcome::NotRun)))
            }
            Err(e) => {
                eprintln!("\x1b[1;31merror:\x1b[0m {e:#}");
                false
            }
        };
        results.push(("kernel matrix (qemu)", ok, t.elapsed().as_secs_f64()));
    }

    // The production node: the end-to-end checks in the node VM (systemd
    // as PID 1, cgroup v2, containerd), on the configuration kubeadm sets
    // up by default; `cargo xtask vmtest --e2e` runs every kernel and driver.
    let e2e_checks_match = args.filters.is_empty()
        || vm::E2E_CHECKS.iter().any(|c| args.filters.iter().any(|f| c.test.contains(f.as_str())));
    if !args.unit_only && !args.no_vm && e2e_checks_match {
        let (kernel, driver) = vm::CI_PLAN;
        let (kernels, drivers) =
            if args.vm { (vec![], vec![]) } else { (vec![kernel.to_owned()], vec![driver.to_owned()]) };
        step(if args.vm {
            "node VM end-to-end checks: every kernel and driver".to_owned()
        } else {
            format!("node VM end-to-end checks: kernel {kernel}, {driver} cgroup driver")
        });
        let t = Instant::now();
        let ok = match vm::run_e2e(&tc, &kernels, &drivers, &args.filters) {
            Ok(columns) => {
                vm::print_e2e(&columns, &args.filters);
                !columns.iter().any(vm::E2eColumn::failed)
            }
            Err(e) => {
                eprintln!("\x1b[1;31merror:\x1b[0m {e:#}");
                false
            }
        };
        results.push((
            if args.vm {
                "node VM end-to-end (every kernel and driver)"
            } else {
                "node VM end-to-end (6.12, systemd driver)"
            },
            ok,
            t.elapsed().as_secs_f64(),
        ));
    }

    // CI's smoke run of the benchmark harness: every bench, --quick, on the
    // dev build just made; figures go to target/bench-quick and nothing is
    // asserted (targets belong to the full release run, not to CI).
    if !args.unit_only && !args.no_bench && args.filters.is_empty() {
        step("benchmarks --quick (smoke run on the dev build, nothing asserted)");
        let t = Instant::now();
        let smoke = crate::bench::Args::smoke(cmd::workspace_root().join("target/bench-quick"));
        let ok = succeeded(crate::bench::run_prepared(&tc, smoke));
        results.push(("benchmarks --quick (smoke, dev build)", ok, t.elapsed().as_secs_f64()));
    }

    step("summary");
    for (name, ok, secs) in &results {
        note(format!("{:<4} {name:<58} {secs:>6.1}s", if *ok { "ok" } else { "FAIL" }));
    }
    note(format!("total {:.1}s", started.elapsed().as_secs_f64()));
    if results.iter().any(|(_, ok, _)| !ok) {
        bail!("some checks failed (see above)");
    }
    Ok(())
}

/// Whether a stage succeeded; its error, if any, is printed where it failed
/// so the run goes on to the next stage.
fn succeeded(r: Result<()>) -> bool {
    match r {
        Ok(()) => true,
        Err(e) => {
            eprintln!("\x1b[1;31merror:\x1b[0m {e:#}");
            false
        }
    }
}
