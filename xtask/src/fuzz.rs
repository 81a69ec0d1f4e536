//! `cargo xtask fuzz --time N`: the parsers' property tests
//! (`agent/tests/bad_input.rs`, tests named `fuzz_*`: quantities, eviction
//! thresholds, KubeletConfiguration, static pod manifests) run round after
//! round, each with a fresh random seed and `--cases` cases per target,
//! until N seconds are used. Inputs are mutations of the seeds kept in
//! `tests/fixtures/fuzz/<target>/` and arbitrary text. A failure stops the
//! run with the seed that reproduces it; proptest also records the shrunk
//! case under `agent/tests/bad_input.proptest-regressions`, which is kept in the repo and
//! replayed first by every later run.
//!
//! proptest rather than cargo-fuzz: libFuzzer needs the nightly and
//! sanitizer runtimes per target, and these parsers are pure safe Rust,
//! where the bugs to find are panics and wrong round trips, not memory
//! errors.

use std::{
    process::Command,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Result, bail};

use crate::{
    cmd::{self, note, step},
    setup,
};

#[derive(clap::Args)]
pub struct Args {
    /// Seconds to fuzz for (no new round starts once they are used).
    #[arg(long, default_value_t = 60)]
    time: u64,
    /// Cases per target per round.
    #[arg(long, default_value_t = 1000)]
    cases: u32,
    /// Only the targets whose name contains this (e.g. `quantity`).
    target: Option<String>,
}

pub fn run(args: Args) -> Result<()> {
    let tc = setup::ensure_ebpf_toolchain()?;
    setup::build_ebpf(&tc)?;
    let path = tc.path_env();
    let filter = format!("fuzz_{}", args.target.as_deref().unwrap_or(""));
    let cargo = || {
        let mut c = Command::new("cargo");
        c.current_dir(cmd::workspace_root()).env("PATH", &path).args(["test", "-p", "swiftlet", "--test", "bad_input"]);
        c
    };
    step("building the fuzz targets");
    cmd::run(cargo().arg("--no-run"))?;
    let budget = Duration::from_secs(args.time);
    let started = Instant::now();
    let mut rounds = 0u32;
    let mut longest = Duration::ZERO;
    let clock = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or_default();
    loop {
        // splitmix64 of the clock and the round: a new seed every round.
        let mut z = clock ^ u64::from(std::process::id()) ^ (u64::from(rounds) << 32);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        let seed = z ^ (z >> 31);
        step(format!("round {}: {} cases per target, seed {seed}", rounds + 1, args.cases));
        let t = Instant::now();
        let mut c = cargo();
        c.args(["--", &filter, "--test-threads=2"])
            .env("PROPTEST_CASES", args.cases.to_string())
            .env("PROPTEST_RNG_SEED", seed.to_string())
            .env("RUST_BACKTRACE", "1");
        if let Err(e) = cmd::run(&mut c) {
            bail!(
                "{e:#}\nreproduce with: PROPTEST_CASES={} PROPTEST_RNG_SEED={seed} cargo test -p swiftlet --test bad_input -- {filter}",
                args.cases
            );
        }
        rounds += 1;
        longest = longest.max(t.elapsed());
        if started.elapsed() + longest > budget {
            break;
        }
    }
    note(format!(
        "{rounds} rounds of {} cases per target in {:.0}s: no panic, every round trip held",
        args.cases,
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}
