//! `cargo xtask test`: every check CI runs, in order, with a summary.
//! Each step runs even when an earlier one failed, so one run shows every
//! problem; the exit status is non-zero if any step failed.

use std::{process::Command, time::Instant};

use anyhow::{Result, bail};

use crate::{
    cmd::{self, note, step},
    containerd::Containerd,
    setup,
};

#[derive(clap::Args)]
pub struct Args {
    /// Skip `cargo fmt --check` and clippy.
    #[arg(long)]
    no_lint: bool,
    /// Only unit tests (no root, no containerd).
    #[arg(long)]
    unit_only: bool,
    /// Passed to the integration test harness (test name filters).
    filters: Vec<String>,
}

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
    let mut stage = |name: &'static str, c: &mut Command| {
        step(name);
        let t = Instant::now();
        let ok = match cmd::run(c) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("\x1b[1;31merror:\x1b[0m {e:#}");
                false
            }
        };
        results.push((name, ok, t.elapsed().as_secs_f64()));
    };

    if !args.no_lint {
        stage("cargo fmt --check", &mut cargo(&["fmt", "--all", "--check"]));
        stage(
            "cargo clippy -D warnings",
            &mut cargo(&["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]),
        );
    }
    stage("build (workspace, all targets)", &mut cargo(&["build", "--workspace", "--all-targets"]));
    stage(
        "unit tests",
        &mut cargo(&["test", "--workspace", "--exclude", "swiftlet-tests", "--exclude", "swiftlet-ebpf"]),
    );
    if !args.unit_only {
        match Containerd::start(cmd::workspace_root(), "test") {
            Ok(ctd) => {
                let mut c = cargo(&["test", "-p", "swiftlet-tests", "--", "--test-threads=1"]);
                c.args(&args.filters);
                c.env("SWIFTLET_TEST_CRI_ENDPOINT", ctd.endpoint());
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
                results.push(("integration tests (containerd did not start)", false, 0.0));
            }
        }
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
