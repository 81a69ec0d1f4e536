//! The eviction race: a memory hog in a BestEffort pod ramps at a fixed
//! rate past a hard eviction threshold, with a Guaranteed pod beside it.
//! Every mode sees the same ramp; an independent observer (its own instance
//! of the kernel programs, on the same clock) records when the line was
//! crossed, when the hog died, and whether the kernel OOM killer fired; the
//! overshoot is the kernel's own peak of the cgroup's usage.
//!
//! Three benches:
//! - `eviction-race` (allocatable): `allocatableMemory.available<256Mi` with
//!   kubepods limited to 1 GiB (the kernel's OOM point);
//! - `eviction-race-node`: `memory.available` on the whole node, where
//!   earlyoom (which only watches MemAvailable) competes. A balloon locks
//!   most of RAM first so the ramp reaches the line in seconds. Each peer is
//!   timed from its own line: earlyoom from the moment MemAvailable crosses
//!   its `-M` (recorded by the bench, every 0.5 ms), swiftlet from
//!   memory.available's; both lines' crossings are reported side by side.
//!   `SWIFTLET_BENCH_NO_BALLOON=1` runs it without the balloon, for a smoke
//!   check on a shared machine: only the modes that stop at the line, and
//!   the hog stops 256 MiB past it;
//! - `eviction-busy`: the userspace kill with both cores kept busy, its
//!   reader thread in the normal scheduler and under SCHED_FIFO, side by
//!   side;
//! - `eviction-race-cache` (`cache.rs`): the allocatable race with a pod
//!   whose hot page cache crosses the line first, the hog starting later
//!   (cgroup v2 and a block-device filesystem: run in the VM).
//!
//! `SWIFTLET_BENCH_RACE_RUNS=F,S` sets the runs per rate of the swiftlet
//! modes (F) and of the others (S). `SWIFTLET_BENCH_RACE_RATES=256` and
//! `SWIFTLET_BENCH_RACE_MODES=kernel,ebpf` narrow a run to some rates and
//! modes (keys: [`Mode::key`]), for a before/after of one cell.

mod cache;
mod report;
mod run;

use std::time::Duration;

use anyhow::{Result, bail};
use swiftlet::signals::KillOutcome;

use super::{BenchResult, Ctx};
pub use cache::race_cache;
use run::{RunOptions, balloon, earlyoom_running, run_once};

const MIB: u64 = 1 << 20;
/// Allocatable scenario: the pods' allocatable memory, enforced on kubepods.
const ALLOCATABLE: u64 = 1024 * MIB;
/// Allocatable scenario: allocatableMemory.available<256Mi, a line at 768 MiB.
const ALLOCATABLE_THRESHOLD: u64 = 256 * MIB;
/// Node scenario: how far below the node's available memory at the start of
/// a run the line sits (how much the hog allocates before crossing); the
/// same distance below MemAvailable for earlyoom's -M.
const NODE_RAMP_TO_LINE: u64 = 768 * MIB;
/// Node scenario: what the balloon leaves available.
const NODE_HEADROOM: u64 = 3 * 1024 * MIB;
/// Runs per rate of the swiftlet modes (in-kernel and userspace kill), so
/// that their p99 is over at least 200 runs; the slow modes get 25.
const FAST_RUNS: usize = 200;
const SLOW_RUNS: usize = 25;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Allocatable,
    Node,
}

impl Scenario {
    fn label(self) -> &'static str {
        match self {
            Scenario::Allocatable => "allocatableMemory.available",
            Scenario::Node => "memory.available",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// swiftlet with the kernel killing the planned victim at the crossing.
    Kernel,
    /// swiftlet with eBPF signals (event-driven), killing from userspace;
    /// `realtime`: the reader thread under SCHED_FIFO (the default).
    Ebpf { realtime: bool },
    /// swiftlet polling cgroupfs at this interval (10 s is the kubelet's).
    Poll(Duration),
    /// earlyoom at the same ramp distance below MemAvailable (node scenario).
    Earlyoom,
    /// No agent: the kernel OOM killer alone.
    NoAgent,
    /// The in-kernel kill for anonymous growth, and for a crossing the
    /// kernel defers (page cache) the agent reclaims the pods' file-backed
    /// memory before it evicts anyone (`--memory-reclaim-before-eviction`).
    ReclaimFirst,
}

impl Mode {
    pub fn label(self) -> String {
        match self {
            Mode::Kernel => "swiftlet in-kernel kill".into(),
            Mode::Ebpf { realtime: true } => "swiftlet eBPF (userspace kill)".into(),
            Mode::Ebpf { realtime: false } => "swiftlet eBPF (userspace kill, normal scheduler)".into(),
            Mode::Poll(d) if d >= Duration::from_secs(1) => format!("cgroupfs poll {}s (kubelet)", d.as_secs()),
            Mode::Poll(d) => format!("cgroupfs poll {}ms", d.as_millis()),
            Mode::Earlyoom => "earlyoom".into(),
            Mode::NoAgent => "no agent (kernel OOM)".into(),
            Mode::ReclaimFirst => "swiftlet reclaim-first (in-kernel kill for anon)".into(),
        }
    }

    /// The mode's name in `SWIFTLET_BENCH_RACE_MODES`.
    pub fn key(self) -> String {
        match self {
            Mode::Kernel => "kernel".into(),
            Mode::Ebpf { realtime: true } => "ebpf".into(),
            Mode::Ebpf { realtime: false } => "ebpf-normal".into(),
            Mode::Poll(d) if d >= Duration::from_secs(1) => format!("poll-{}s", d.as_secs()),
            Mode::Poll(d) => format!("poll-{}ms", d.as_millis()),
            Mode::Earlyoom => "earlyoom".into(),
            Mode::NoAgent => "no-agent".into(),
            Mode::ReclaimFirst => "reclaim-first".into(),
        }
    }

    /// Whether the mode kills at or near the line (so a run without a
    /// balloon stays within the machine).
    fn stops_at_the_line(self) -> bool {
        matches!(self, Mode::Kernel | Mode::Ebpf { .. } | Mode::Earlyoom | Mode::ReclaimFirst)
            || matches!(self, Mode::Poll(d) if d < Duration::from_secs(1))
    }
}

#[derive(Clone, Debug)]
pub struct Run {
    pub scenario: Scenario,
    pub mode: Mode,
    pub rate: u64,
    /// From the mode's line crossed to the hog's exit, both kernel
    /// timestamps (earlyoom: from MemAvailable crossing its -M).
    pub crossing_to_dead_ms: Option<f64>,
    /// From the kernel's crossing timestamp to the agent's eviction
    /// decision (the agent's own histogram, one observation per run).
    pub crossing_to_decision_ms: Option<f64>,
    /// From the crossing to the agent's kill through the cgroup (its own
    /// histogram; userspace kills only).
    pub crossing_to_kill_ms: Option<f64>,
    /// Peak usage above the line, from the kernel's peak counter.
    pub overshoot_mib: Option<f64>,
    pub oom_killed: bool,
    /// (ms since the hog started, used MiB relative to the line)
    pub trace: Vec<(f64, f64)>,
    pub dead_ms: Option<f64>,
    /// When the bench's line (memory.available or allocatable) and, in the
    /// node scenario, the peer's line (MemAvailable) were crossed, in ms
    /// since the hog started.
    pub line_ms: Option<f64>,
    pub peer_line_ms: Option<f64>,
    /// The agent's own crossing of its line, from the observer's crossing
    /// (negative when the agent's instance crossed first).
    pub agent_crossing_ms: Option<f64>,
    /// The kernel's kill of the planned victim, from the observer's crossing,
    /// whether it signalled the allocating task itself and, if the kernel
    /// refused that signal, `bpf_send_signal`'s errno (negative).
    pub kernel_kill_ms: Option<f64>,
    pub kernel_kill_current: bool,
    pub kernel_kill_signal_error: i32,
    /// Who crossed the line and with what, in the observer's instance and
    /// the agent's: a late run's crossing says whether the two saw the
    /// same page.
    pub observer_crossing: Option<CrossingSeen>,
    pub agent_crossing: Option<CrossingSeen>,
    /// In-kernel runs: what the kernel did with the plan at the agent's
    /// crossing (None: the agent saw no crossing).
    pub kernel_outcome: Option<KillOutcome>,
    /// The cache race: what happened to the cache pod (None in the others).
    pub cache: Option<cache::CacheOutcome>,
}

/// One instance's first upward crossing of the line.
#[derive(Clone, Copy, Debug)]
pub struct CrossingSeen {
    /// The task whose action crossed (0: a kernel context, such as a fold).
    pub pid: u32,
    /// The value that crossed and the trigger, in bytes (the race's lines
    /// are memory lines).
    pub value: u64,
    pub threshold: u64,
}

impl std::fmt::Display for CrossingSeen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} at {:+} bytes past its trigger", self.pid, self.value as i64 - self.threshold as i64)
    }
}

impl Mode {
    /// Whether the agent hands its plan to the kernel (in-kernel kill).
    fn kernel_kills(self) -> bool {
        matches!(self, Mode::Kernel | Mode::ReclaimFirst)
    }
}

/// A figure in milliseconds for the progress lines and tables, "-" without one.
fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3} ms"))
}

fn modes(scenario: Scenario) -> Vec<Mode> {
    let mut m = vec![
        Mode::Kernel,
        Mode::Ebpf { realtime: true },
        Mode::Poll(Duration::from_millis(100)),
        Mode::Poll(Duration::from_secs(10)),
    ];
    if scenario == Scenario::Node {
        m.push(Mode::Earlyoom);
    }
    m.push(Mode::NoAgent);
    m
}

/// The allocatable scenario (no balloon: it can run beside other work).
pub fn race(ctx: &Ctx) -> Result<BenchResult> {
    race_scenario(ctx, Scenario::Allocatable)
}

/// The node scenario: a balloon locks most of RAM, so run it alone.
pub fn race_node(ctx: &Ctx) -> Result<BenchResult> {
    race_scenario(ctx, Scenario::Node)
}

/// Whom the kernel's kill signalled, for the progress lines.
fn kill_target(run: &Run) -> String {
    match (run.kernel_kill_ms, run.kernel_kill_current, run.kernel_kill_signal_error) {
        (None, ..) => String::new(),
        (Some(_), true, _) => " (the allocating task)".into(),
        (Some(_), false, 0) => " (not the allocating task's: no task signalled)".into(),
        (Some(_), false, errno) => format!(" (the allocating task, refused: bpf_send_signal returned {errno})"),
    }
}

fn progress(run: &Run) {
    eprintln!(
        "      crossing → dead {}, → decision {}, overshoot {}{}{}",
        ms(run.crossing_to_dead_ms),
        ms(run.crossing_to_decision_ms),
        run.overshoot_mib.map_or("-".into(), |o| format!("{o:.1} MiB")),
        if run.oom_killed { ", kernel OOM kill" } else { "" },
        if run.mode.kernel_kills() {
            format!(", kernel: {}", run::outcome_name(run.kernel_outcome))
        } else {
            String::new()
        }
    );
    if run.agent_crossing_ms.is_some() || run.kernel_kill_ms.is_some() {
        eprintln!(
            "      from the observer's crossing: the agent's crossing {}, the kernel's kill {}{}",
            ms(run.agent_crossing_ms),
            ms(run.kernel_kill_ms),
            kill_target(run)
        );
        let crossing = |c: Option<CrossingSeen>| c.map_or("-".into(), |c| c.to_string());
        eprintln!(
            "      crossed by: the observer's {}, the agent's {}",
            crossing(run.observer_crossing),
            crossing(run.agent_crossing)
        );
    }
    if run.peer_line_ms.is_some() {
        eprintln!(
            "      lines crossed: memory.available at {}, MemAvailable at {}",
            ms(run.line_ms),
            ms(run.peer_line_ms)
        );
    }
}

/// Runs per rate (fast modes, slow modes): `SWIFTLET_BENCH_RACE_RUNS=F,S`
/// when set (a shorter run on a machine that cannot stay quiet for an
/// hour), else the full counts, or a smoke run's.
fn run_counts(ctx: &Ctx) -> Result<(usize, usize)> {
    match std::env::var("SWIFTLET_BENCH_RACE_RUNS") {
        Ok(v) => {
            let parsed = v.split_once(',').and_then(|(f, s)| Some((f.trim().parse().ok()?, s.trim().parse().ok()?)));
            match parsed {
                Some((f, s)) if f > 0 && s > 0 => Ok((f, s)),
                _ => bail!("SWIFTLET_BENCH_RACE_RUNS={v:?}: expected two positive counts, fast and slow (e.g. 50,25)"),
            }
        }
        Err(_) => Ok((ctx.pick(FAST_RUNS, 2), ctx.pick(SLOW_RUNS, 1))),
    }
}

/// The rates and modes to run: all, or those `SWIFTLET_BENCH_RACE_RATES`
/// and `SWIFTLET_BENCH_RACE_MODES` name.
fn selection(scenario: Scenario, no_balloon: bool) -> Result<(Vec<u64>, Vec<Mode>)> {
    let all_modes: Vec<Mode> = modes(scenario).into_iter().filter(|m| !no_balloon || m.stops_at_the_line()).collect();
    let rates = match std::env::var("SWIFTLET_BENCH_RACE_RATES") {
        Ok(v) => {
            let rates: Vec<u64> = v.split(',').filter_map(|r| r.trim().parse().ok()).collect();
            if rates.is_empty() || rates.iter().any(|r| ![256, 1024].contains(r)) {
                bail!("SWIFTLET_BENCH_RACE_RATES={v:?}: expected rates among 256 and 1024 (MiB/s), comma-separated");
            }
            rates
        }
        Err(_) => vec![256, 1024],
    };
    let modes = match std::env::var("SWIFTLET_BENCH_RACE_MODES") {
        Ok(v) => {
            let keys: Vec<&str> = v.split(',').map(str::trim).collect();
            let known: Vec<String> = all_modes.iter().map(|m| m.key()).collect();
            if let Some(bad) = keys.iter().find(|k| !known.iter().any(|m| m == *k)) {
                bail!("SWIFTLET_BENCH_RACE_MODES={v:?}: no mode {bad:?} in this race (its modes: {known:?})");
            }
            all_modes.into_iter().filter(|m| keys.contains(&m.key().as_str())).collect()
        }
        Err(_) => all_modes,
    };
    Ok((rates, modes))
}

fn race_scenario(ctx: &Ctx, scenario: Scenario) -> Result<BenchResult> {
    let no_balloon = scenario == Scenario::Node && std::env::var_os("SWIFTLET_BENCH_NO_BALLOON").is_some();
    let (fast_runs, slow_runs) = run_counts(ctx)?;
    let (rates, modes) = selection(scenario, no_balloon)?;
    let opts = RunOptions {
        busy: false,
        max_mib: no_balloon.then_some((NODE_RAMP_TO_LINE + 256 * MIB) / MIB),
        ..Default::default()
    };
    let mut out = BenchResult {
        name: match scenario {
            Scenario::Allocatable => "eviction-race".into(),
            Scenario::Node => "eviction-race-node".into(),
        },
        title: report::title(scenario, fast_runs, slow_runs, no_balloon),
        ..Default::default()
    };
    let _balloon = match scenario {
        Scenario::Node => {
            if earlyoom_running() {
                bail!(
                    "an earlyoom not started by the bench is running; stop it first (it would kill during the node scenario)"
                );
            }
            if no_balloon { None } else { Some(balloon()?) }
        }
        Scenario::Allocatable => None,
    };
    if scenario == Scenario::Node {
        // The balloon has just pushed most of the page cache out and the
        // kernel is still reclaiming behind it: the first ramp after it once
        // met the OOM killer before either instance saw the line. One run,
        // not counted, lets memory settle; what it saw is printed.
        let warm = run_once(scenario, Mode::Kernel, 256, opts)?;
        eprintln!(
            "    warm-up run after the balloon (not counted): crossing → dead {}, kernel OOM kill: {}",
            ms(warm.crossing_to_dead_ms),
            if warm.oom_killed { "yes" } else { "no" }
        );
    }
    let mut runs = vec![];
    // Modes interleaved round by round, so drift hits them alike; the fast
    // modes run several times a round to reach their count.
    let per_round = fast_runs.div_ceil(slow_runs);
    for &rate in &rates {
        for round in 0..slow_runs {
            for &mode in &modes {
                let fast = matches!(mode, Mode::Kernel | Mode::Ebpf { .. });
                let done = runs.iter().filter(|r: &&Run| r.mode == mode && r.rate == rate).count();
                let repeats = if fast { per_round.min(fast_runs.saturating_sub(done)) } else { 1 };
                for _ in 0..repeats {
                    eprintln!(
                        "    race {}: {} at {rate} MiB/s, round {}/{slow_runs}",
                        scenario.label(),
                        mode.label(),
                        round + 1
                    );
                    let run = run_once(scenario, mode, rate, opts)?;
                    progress(&run);
                    runs.push(run);
                }
            }
        }
    }
    report::report(ctx, scenario, &modes, &runs, &mut out)?;
    report::summarize(scenario, &runs, &mut out);
    Ok(out)
}

/// The userspace kill with both cores busy: the reader thread (which kills
/// at the crossing) in the normal scheduler, then under SCHED_FIFO (the
/// agent's default), interleaved run by run on the allocatable ramp at
/// 256 MiB/s.
pub fn busy(ctx: &Ctx) -> Result<BenchResult> {
    let (n, _) = run_counts(ctx)?;
    let modes = [Mode::Ebpf { realtime: false }, Mode::Ebpf { realtime: true }];
    let opts = RunOptions { busy: true, ..Default::default() };
    let mut runs = vec![];
    for i in 0..n {
        for mode in modes {
            eprintln!("    busy cores: {} run {}/{n}", mode.label(), i + 1);
            let run = run_once(Scenario::Allocatable, mode, 256, opts)?;
            progress(&run);
            runs.push(run);
        }
    }
    Ok(report::busy(&modes, &runs, n))
}
