//! The eviction race (issue 9): a memory hog in a BestEffort pod ramps at a
//! fixed rate past a hard eviction threshold, with a Guaranteed pod beside
//! it. Every mode sees the same ramp; an independent observer (its own
//! instance of the kernel programs, on the same clock) records when the line
//! was crossed, when the hog died, how far memory overshot the line, and
//! whether the kernel OOM killer fired.
//!
//! Two scenarios:
//! - allocatable: `allocatableMemory.available<256Mi` with kubepods limited
//!   to 1 GiB (the kernel's OOM point), as a node with enforced allocatable;
//! - node: `memory.available` on the whole node, where earlyoom (which only
//!   watches MemAvailable) can compete. A balloon locks most of RAM first so
//!   the ramp reaches the line in seconds, and is released afterwards.

use std::{
    io::BufRead,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use swiftlet::{
    eviction::{
        core::EvictionConfig,
        driver::{DriverConfig, EvictionContainer, EvictionManager, EvictionPod},
        observe::NodeInfo,
        signal::{EvictionSignal, EvictionThreshold, ThresholdValue},
    },
    metrics::Metrics,
    quantity::Quantity,
    signals::{
        self, CgroupKind, Direction, SignalEvent, SignalSource, SourceChoice, Target, Threshold,
        ebpf::{EbpfOptions, EbpfSource},
        monotonic_ns, node,
    },
};
use swiftlet_common::Signal;

use super::{BenchResult, Ctx, Figure, Table, median, svg};
use crate::{cgroup::TestCgroup, pods::FakePods, workload};

const MIB: u64 = 1 << 20;
/// Allocatable scenario: the pods' allocatable memory, enforced on kubepods.
const ALLOCATABLE: u64 = 1024 * MIB;
/// Allocatable scenario: allocatableMemory.available<256Mi, a line at 768 MiB.
const ALLOCATABLE_THRESHOLD: u64 = 256 * MIB;
/// Node scenario: how far below the node's available memory at the start of
/// a run the line sits (how much the hog allocates before crossing).
const NODE_RAMP_TO_LINE: u64 = 768 * MIB;
/// Node scenario: what the balloon leaves available.
const NODE_HEADROOM: u64 = 3 * 1024 * MIB;

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
    /// swiftlet with eBPF signals (event-driven), killing from userspace.
    Ebpf,
    /// swiftlet polling cgroupfs at this interval (10 s is the kubelet's).
    Poll(Duration),
    /// earlyoom at the equivalent MemAvailable threshold (node scenario).
    Earlyoom,
    /// No agent: the kernel OOM killer alone.
    NoAgent,
}

impl Mode {
    pub fn label(self) -> String {
        match self {
            Mode::Kernel => "swiftlet in-kernel kill".into(),
            Mode::Ebpf => "swiftlet eBPF (userspace kill)".into(),
            Mode::Poll(d) if d >= Duration::from_secs(1) => format!("cgroupfs poll {}s (kubelet)", d.as_secs()),
            Mode::Poll(d) => format!("cgroupfs poll {}ms", d.as_millis()),
            Mode::Earlyoom => "earlyoom".into(),
            Mode::NoAgent => "no agent (kernel OOM)".into(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Run {
    pub scenario: Scenario,
    pub mode: Mode,
    pub rate: u64,
    /// From the line crossed to the hog's exit, both kernel timestamps.
    pub crossing_to_dead_ms: Option<f64>,
    /// From the kernel's crossing timestamp to the agent's eviction
    /// decision (the agent's own histogram, one observation per run).
    pub crossing_to_decision_ms: Option<f64>,
    /// Peak usage above the line.
    pub overshoot_mib: f64,
    pub oom_killed: bool,
    /// (ms since the hog started, used MiB relative to the line)
    pub trace: Vec<(f64, f64)>,
    pub dead_ms: Option<f64>,
    /// The agent's own crossing of its line, from the observer's crossing
    /// (negative when the agent's instance crossed first).
    pub agent_crossing_ms: Option<f64>,
    /// The kernel's kill of the planned victim, from the observer's crossing,
    /// and whether it signalled the allocating task itself.
    pub kernel_kill_ms: Option<f64>,
    pub kernel_kill_current: bool,
}

/// A process killed (and reaped) when dropped.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The node scenario's balloon: most of RAM locked by one process.
fn balloon() -> Result<Reaped> {
    let available =
        node::parse_meminfo(&std::fs::read_to_string("/proc/meminfo")?, "MemAvailable").context("MemAvailable")?;
    if available < NODE_HEADROOM + 1024 * MIB {
        bail!("only {} MiB available: the node scenario needs more than 4 GiB", available / MIB);
    }
    let size = (available - NODE_HEADROOM) / MIB;
    eprintln!("    locking {size} MiB in a balloon (released at the end)");
    let mut child =
        Command::new(workload::binary()).args(["balloon", &size.to_string()]).stdout(Stdio::piped()).spawn()?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().context("balloon stdout")?).read_line(&mut line)?;
    if line.trim() != "ready" {
        let _ = child.kill();
        bail!("the balloon could not lock memory");
    }
    Ok(Reaped(child))
}

/// A figure in milliseconds for the progress lines and tables, "-" without one.
fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3} ms"))
}

fn earlyoom_running() -> bool {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "earlyoom"))
}

fn run_once(scenario: Scenario, mode: Mode, rate: u64) -> Result<Run> {
    let tc = TestCgroup::new();
    let kubepods = tc.child("kubepods");
    let hog_pod = tc.child("kubepods/besteffort/podhog");
    let steady_pod = tc.child("kubepods/podsteady");
    let capacity = node::mem_total()?;

    // The observer adds every page to the node at once: with the agent's
    // per-CPU batching it would see the node's line crossed up to a batch
    // per CPU late, or after the agent had already killed.
    let observer_opts = EbpfOptions { node_memory_batch: Some(1), ..Default::default() };
    let observer = Arc::new(EbpfSource::load(tc.fs.clone(), &observer_opts).context("observer")?);
    observer.register(&kubepods, CgroupKind::Kubepods)?;
    // The line, as "used" bytes of the observed target, and the threshold.
    let (target, line_used, threshold) = match scenario {
        Scenario::Allocatable => {
            tc.fs.set_memory_limit(&kubepods, Some(ALLOCATABLE))?;
            (Target::Cgroup(kubepods.clone()), ALLOCATABLE - ALLOCATABLE_THRESHOLD, ALLOCATABLE_THRESHOLD)
        }
        Scenario::Node => {
            let used = observer.snapshot()?.node.working_set_bytes;
            let available = capacity - used;
            let threshold = available.saturating_sub(NODE_RAMP_TO_LINE);
            (Target::Node, capacity - threshold, threshold)
        }
    };
    let used_of = |s: &signals::Snapshot| match &target {
        Target::Node => s.node.working_set_bytes,
        Target::Cgroup(c) => s.cgroups.get(c).map_or(0, |u| u.working_set_bytes),
    };
    observer.set_threshold(
        &target,
        Signal::MemoryWorkingSet,
        Some(Threshold { trigger: line_used + 1, rearm: line_used.saturating_sub(64 * MIB) }),
    )?;
    let seen = Arc::new(Mutex::new((None::<u64>, None::<u64>, Vec::<u64>::new())));
    let hog_pid = Arc::new(Mutex::new(0u32));
    {
        let (seen, hog_pid, target) = (seen.clone(), hog_pid.clone(), target.clone());
        observer.subscribe(Arc::new(move |e: SignalEvent| {
            let mut s = seen.lock().unwrap();
            match e {
                SignalEvent::Crossing { direction: Direction::Up, target: t, at_ns, .. }
                    if t == target && s.0.is_none() =>
                {
                    s.0 = Some(at_ns)
                }
                SignalEvent::ProcessExit { pid, at_ns, .. } if pid == *hog_pid.lock().unwrap() => s.1 = Some(at_ns),
                SignalEvent::OomKill { cgroup_id, .. } => s.2.push(cgroup_id),
                _ => {}
            }
        }));
    }

    let mut steady = workload::Steps::spawn(&tc.fs, &steady_pod);
    steady.run("anon 32");

    let pods = Arc::new(FakePods::new(vec![
        EvictionPod {
            uid: "hog".into(),
            namespace: "bench".into(),
            name: "hog".into(),
            cgroup: hog_pod.clone(),
            containers: vec![EvictionContainer {
                name: "hog".into(),
                memory_request: 0,
                cgroup: Some(hog_pod.clone()),
            }],
            ..Default::default()
        },
        EvictionPod {
            uid: "steady".into(),
            namespace: "bench".into(),
            name: "steady".into(),
            cgroup: steady_pod.clone(),
            memory_request: 64 * MIB,
            ..Default::default()
        },
    ]));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut agent = None;
    let mut agent_events = None;
    let mut earlyoom = None;
    let metrics = Arc::new(Metrics::new());
    match mode {
        Mode::NoAgent => {}
        Mode::Earlyoom => {
            // earlyoom watches MemAvailable, which differs from the kubelet's
            // memory.available by the reclaimable memory it counts; shift its
            // line by that difference so both fire at the same ramp point.
            let mem_available = node::parse_meminfo(&std::fs::read_to_string("/proc/meminfo")?, "MemAvailable")
                .context("MemAvailable")?;
            let ours = capacity - used_of(&observer.snapshot()?);
            let line_kib = ((threshold as i64 + mem_available as i64 - ours as i64).max(0) as u64) / 1024;
            let child = Command::new("earlyoom")
                .args(["-M", &format!("{line_kib},{line_kib}"), "-r", "0", "--prefer", "^swiftlet-worklo"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("cannot start earlyoom (Debian package earlyoom; `cargo xtask bench` installs it)")?;
            std::thread::sleep(Duration::from_millis(300));
            earlyoom = Some(Reaped(child));
        }
        Mode::Kernel | Mode::Ebpf | Mode::Poll(_) => {
            let (choice, interval) = match mode {
                Mode::Poll(d) => (SourceChoice::Cgroupfs, d),
                _ => (SourceChoice::Ebpf, Duration::from_secs(10)),
            };
            let opts = EbpfOptions { kernel_eviction: mode == Mode::Kernel, ..Default::default() };
            let opened = signals::open(choice, tc.fs.clone(), &opts, interval)?;
            let signal = match scenario {
                Scenario::Allocatable => EvictionSignal::AllocatableMemoryAvailable,
                Scenario::Node => EvictionSignal::MemoryAvailable,
            };
            let cfg = DriverConfig {
                eviction: EvictionConfig {
                    thresholds: vec![EvictionThreshold {
                        signal,
                        value: ThresholdValue::Quantity(Quantity::from_units(threshold as i64)),
                        grace_period: Duration::ZERO,
                        min_reclaim: None,
                    }],
                    pressure_transition_period: Duration::from_secs(30),
                    max_pod_grace_period_secs: 0,
                },
                node: NodeInfo {
                    memory_capacity: capacity,
                    allocatable_memory: ALLOCATABLE,
                    pid_limit: node::pid_limit()?,
                    kubepods_cgroup: kubepods.clone(),
                },
                nodefs_path: std::env::temp_dir(),
                imagefs_path: None,
                // The kubelet's housekeeping period, or the poll interval.
                housekeeping_interval: interval,
                plan_interval: Duration::from_millis(200),
                kernel_eviction: mode == Mode::Kernel,
            };
            let (manager, event_loop) = EvictionManager::new(
                cfg,
                opened.source.clone(),
                tc.fs.clone(),
                pods.clone(),
                pods.clone(),
                None,
                metrics.clone(),
            );
            agent_events = Some(manager.events());
            let task = rt.spawn(event_loop.run(stop_rx));
            let deadline = Instant::now() + Duration::from_secs(10);
            while manager.plan(signal).first().map(|v| v.uid.as_str()) != Some("hog") {
                if Instant::now() > deadline {
                    bail!("the agent made no victim plan");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            agent = Some((manager, task, opened));
        }
    }

    let max = match scenario {
        Scenario::Allocatable => 2048,
        Scenario::Node => 4096 + NODE_HEADROOM / MIB,
    };
    let mut cmd = Command::new(workload::binary());
    cmd.args(["hog", &rate.to_string(), &max.to_string()]).stdout(Stdio::null());
    workload::in_cgroup(&mut cmd, &tc.fs, &hog_pod);
    let start_ns = monotonic_ns();
    let start = Instant::now();
    let mut hog = cmd.spawn()?;
    *hog_pid.lock().unwrap() = hog.id();
    observer.watch_exit(hog.id())?;
    let mut trace = vec![];
    loop {
        if hog.try_wait()?.is_some() {
            break;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = hog.kill();
            hog.wait()?;
            break;
        }
        if let Ok(s) = observer.snapshot() {
            trace.push((start.elapsed().as_secs_f64() * 1e3, (used_of(&s) as f64 - line_used as f64) / MIB as f64));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(100));
    drop(earlyoom);
    stop_tx.send(true).ok();
    if let Some((_, task, _)) = agent.take() {
        let _ = rt.block_on(task);
    }
    let (crossing, dead, oom_victims) = seen.lock().unwrap().clone();
    // What the agent's own instance saw, for runs that need explaining.
    let (mut agent_crossing_ns, mut kernel_kill) = (None, None);
    if let Some(rx) = agent_events.as_mut() {
        loop {
            let e = match rx.try_recv() {
                Ok(e) => e,
                Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => continue,
                Err(_) => break,
            };
            match e {
                SignalEvent::Crossing { direction: Direction::Up, target: t, at_ns, .. }
                    if t == target && agent_crossing_ns.is_none() =>
                {
                    agent_crossing_ns = Some(at_ns)
                }
                SignalEvent::KernelKill { at_ns, pid, .. } if kernel_kill.is_none() => kernel_kill = Some((at_ns, pid)),
                _ => {}
            }
        }
    }
    let since_crossing = |ns: u64| crossing.map(|c| (ns as f64 - c as f64) / 1e6);
    // Only victims in this run's tree count: other work on the machine has
    // OOM kills of its own. A node-wide OOM picks the hog first while it
    // lives (oom_score_adj 1000), so a kill the ramp causes lands here.
    let oom_event = oom_victims.iter().any(|id| tc.holds_cgroup_id(*id));
    let oom_counter = std::fs::read_to_string(tc.fs.memory_dir(&kubepods).join("memory.oom_control"))
        .or_else(|_| std::fs::read_to_string(tc.fs.memory_dir(&kubepods).join("memory.events")))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill ").and_then(|v| v.trim().parse::<u64>().ok()))
        .unwrap_or(0);
    let peak = trace.iter().map(|p| p.1).fold(0.0, f64::max);
    let exposition = metrics.encode();
    let metric =
        |name: &str| exposition.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<f64>().ok()));
    let decision = match (
        metric("swiftlet_eviction_crossing_to_decision_seconds_sum "),
        metric("swiftlet_eviction_crossing_to_decision_seconds_count "),
    ) {
        (Some(sum), Some(count)) if count >= 1.0 => Some(sum / count * 1e3),
        _ => None,
    };
    Ok(Run {
        crossing_to_decision_ms: decision,
        scenario,
        mode,
        rate,
        crossing_to_dead_ms: match (crossing, dead) {
            (Some(c), Some(d)) if d >= c => Some((d - c) as f64 / 1e6),
            _ => None,
        },
        overshoot_mib: peak.max(0.0),
        oom_killed: oom_event || oom_counter > 0,
        trace,
        dead_ms: dead.map(|ns| ns.saturating_sub(start_ns) as f64 / 1e6),
        agent_crossing_ms: agent_crossing_ns.and_then(since_crossing),
        kernel_kill_ms: kernel_kill.and_then(|(ns, _)| since_crossing(ns)),
        kernel_kill_current: kernel_kill.is_some_and(|(_, pid)| pid != 0),
    })
}

fn modes(scenario: Scenario) -> Vec<Mode> {
    let mut m =
        vec![Mode::Kernel, Mode::Ebpf, Mode::Poll(Duration::from_millis(100)), Mode::Poll(Duration::from_secs(10))];
    if scenario == Scenario::Node {
        m.push(Mode::Earlyoom);
    }
    m.push(Mode::NoAgent);
    m
}

fn report(ctx: &Ctx, scenario: Scenario, runs: &[Run], runs_per_cell: usize, out: &mut BenchResult) -> Result<()> {
    let rates = [256u64, 1024];
    let mut table = Table {
        header: [
            "rate",
            "mode",
            "runs",
            "crossing→dead p50 (ms)",
            "p99 (ms)",
            "max (ms)",
            "overshoot p50 (MiB)",
            "overshoot max (MiB)",
            "kernel OOM kills",
        ]
        .map(String::from)
        .to_vec(),
        rows: vec![],
    };
    let mut bars = vec![];
    for rate in rates {
        let mut group = vec![];
        let mut p50_of = std::collections::HashMap::new();
        for mode in modes(scenario) {
            let cell: Vec<&Run> = runs.iter().filter(|r| r.mode == mode && r.rate == rate).collect();
            if cell.is_empty() {
                continue;
            }
            let lat: Vec<f64> = cell.iter().filter_map(|r| r.crossing_to_dead_ms).collect();
            let over: Vec<f64> = cell.iter().map(|r| r.overshoot_mib).collect();
            let name = format!("{}: {} at {rate} MiB/s", scenario.label(), mode.label());
            let f = Figure::distribution(format!("{name}: crossing → dead"), "ms", &lat);
            let fmt = |v: Option<f64>| v.map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into());
            let ooms = cell.iter().filter(|r| r.oom_killed).count();
            table.rows.push(vec![
                format!("{rate} MiB/s"),
                mode.label(),
                cell.len().to_string(),
                fmt(f.p50),
                fmt(f.p99),
                fmt(f.max),
                format!("{:.1}", median(&over)),
                format!("{:.1}", over.iter().copied().fold(0.0, f64::max)),
                ooms.to_string(),
            ]);
            if let Some(p) = f.p50 {
                group.push((mode.label(), p));
                p50_of.insert(mode, p);
            }
            out.figures.push(f);
            out.figures.push(Figure::value(format!("{name}: kernel OOM kills"), "runs", cell.len(), ooms as f64));
        }
        // Ratios against the event-driven userspace path and the kernel path,
        // measured side by side in this run.
        for base in [Mode::Kernel, Mode::Ebpf] {
            for other in modes(scenario).into_iter().filter(|m| *m != base && *m != Mode::Kernel) {
                if let (Some(a), Some(b)) = (p50_of.get(&base), p50_of.get(&other)) {
                    out.figures.push(Figure::value(
                        format!("{}: {} / {} at {rate} MiB/s (p50)", scenario.label(), other.label(), base.label()),
                        "×",
                        runs_per_cell,
                        b / a,
                    ));
                }
            }
        }
        bars.push((format!("{rate} MiB/s"), group));

        let mut series = vec![];
        let mut markers = vec![];
        for (i, mode) in modes(scenario).into_iter().enumerate() {
            if let Some(r) = runs.iter().find(|r| r.mode == mode && r.rate == rate) {
                series.push(svg::Series { name: mode.label(), points: r.trace.clone() });
                if let Some(d) = r.dead_ms {
                    let y = r.trace.iter().rev().find(|p| p.0 <= d).map_or(0.0, |p| p.1);
                    markers.push(svg::Marker {
                        label: if r.oom_killed { "OOM".into() } else { "dead".into() },
                        x: d,
                        y,
                        series: i,
                    });
                }
            }
        }
        let plot = format!("eviction-race-{}-{rate}.svg", scenario.label().replace('.', "-"));
        let mut hlines = vec![(format!("eviction line ({} threshold)", scenario.label()), 0.0)];
        if scenario == Scenario::Allocatable {
            hlines.push(("kubepods limit (kernel OOM)".into(), ALLOCATABLE_THRESHOLD as f64 / MIB as f64));
        }
        std::fs::write(
            ctx.out.join(&plot),
            svg::line_chart(
                &format!("{}: a {rate} MiB/s ramp, one run per mode", scenario.label()),
                "ms since the hog started",
                "MiB above the eviction line",
                &series,
                &hlines,
                &markers,
            ),
        )?;
        out.plots.push(plot);
    }
    let bar_plot = format!("eviction-race-{}-latency.svg", scenario.label().replace('.', "-"));
    std::fs::write(
        ctx.out.join(&bar_plot),
        svg::log_bars(&format!("{}: crossing → victim dead, p50 (log scale)", scenario.label()), "ms", &bars),
    )?;
    out.plots.push(bar_plot);
    out.tables.push(table);
    Ok(())
}

/// The allocatable scenario (no balloon: it can run beside other work).
pub fn race(ctx: &Ctx) -> Result<BenchResult> {
    race_scenario(ctx, Scenario::Allocatable)
}

/// The node scenario: a balloon locks most of RAM, so run it alone.
pub fn race_node(ctx: &Ctx) -> Result<BenchResult> {
    race_scenario(ctx, Scenario::Node)
}

fn race_scenario(ctx: &Ctx, scenario: Scenario) -> Result<BenchResult> {
    let runs_per_cell = ctx.pick(25, 1);
    // The in-kernel kill runs twice per round: 100 runs over both rates.
    let kernel_repeats = ctx.pick(2, 1);
    let mut out = BenchResult {
        name: match scenario {
            Scenario::Allocatable => "eviction-race".into(),
            Scenario::Node => "eviction-race-node".into(),
        },
        title: match scenario {
            Scenario::Allocatable => format!(
                "A BestEffort hog (oom_score_adj 1000) ramps past allocatableMemory.available<256Mi with kubepods \
                 limited to {} MiB (the kernel OOM-kills at the limit) and a Guaranteed pod beside it. Crossing and \
                 death are kernel timestamps from an independent observer (its own programs: the line crossing \
                 event and the hog's sched_process_exit). Modes run interleaved, {runs_per_cell} runs per cell \
                 ({} for the in-kernel kill).",
                ALLOCATABLE / MIB,
                runs_per_cell * kernel_repeats
            ),
            Scenario::Node => format!(
                "The same race on the node-level memory.available, where earlyoom (which only watches \
                 MemAvailable) competes: the threshold sits {} MiB below what was available at the start of each \
                 run; a balloon locks all but {} MiB of RAM, and one uncounted run lets memory settle behind it; \
                 earlyoom runs with -M at the same point (shifted by MemAvailable − memory.available). Modes \
                 interleaved, {runs_per_cell} runs per cell ({} for the \
                 in-kernel kill).",
                NODE_RAMP_TO_LINE / MIB,
                NODE_HEADROOM / MIB,
                runs_per_cell * kernel_repeats
            ),
        },
        ..Default::default()
    };
    let _balloon = match scenario {
        Scenario::Node => {
            if earlyoom_running() {
                bail!(
                    "an earlyoom not started by the bench is running; stop it first (it would kill during the node scenario)"
                );
            }
            Some(balloon()?)
        }
        Scenario::Allocatable => None,
    };
    if scenario == Scenario::Node {
        // The balloon has just pushed most of the page cache out and the
        // kernel is still reclaiming behind it: the first ramp after it once
        // met the OOM killer before either instance saw the line. One run,
        // not counted, lets memory settle; what it saw is printed.
        let warm = run_once(scenario, Mode::Kernel, 256)?;
        eprintln!(
            "    warm-up run after the balloon (not counted): crossing → dead {}, kernel OOM kill: {}",
            ms(warm.crossing_to_dead_ms),
            if warm.oom_killed { "yes" } else { "no" }
        );
    }
    let mut runs = vec![];
    for rate in [256u64, 1024] {
        for i in 0..runs_per_cell {
            // Modes interleaved run by run, so drift hits them alike.
            for mode in modes(scenario) {
                let repeats = if mode == Mode::Kernel { kernel_repeats } else { 1 };
                for _ in 0..repeats {
                    eprintln!(
                        "    race {}: {} at {rate} MiB/s, run {}/{runs_per_cell}",
                        scenario.label(),
                        mode.label(),
                        i + 1
                    );
                    let run = run_once(scenario, mode, rate)?;
                    eprintln!(
                        "      crossing → dead {}, → decision {}, overshoot {:.1} MiB{}",
                        ms(run.crossing_to_dead_ms),
                        ms(run.crossing_to_decision_ms),
                        run.overshoot_mib,
                        if run.oom_killed { ", kernel OOM kill" } else { "" }
                    );
                    if run.agent_crossing_ms.is_some() || run.kernel_kill_ms.is_some() {
                        eprintln!(
                            "      from the observer's crossing: the agent's crossing {}, the kernel's kill {}{}",
                            ms(run.agent_crossing_ms),
                            ms(run.kernel_kill_ms),
                            if run.kernel_kill_current { " (the allocating task)" } else { "" }
                        );
                    }
                    runs.push(run);
                }
            }
        }
    }
    report(ctx, scenario, &runs, runs_per_cell, &mut out)?;
    summarize(scenario, &runs, &mut out);
    Ok(out)
}

/// Every run of a mode in a scenario, both rates: the headline figures and
/// the project's targets next to them.
fn summarize(scenario: Scenario, all: &[Run], out: &mut BenchResult) {
    let label = scenario.label();
    let dead = |mode: Mode| -> Vec<f64> {
        all.iter().filter(|r| r.mode == mode).filter_map(|r| r.crossing_to_dead_ms).collect()
    };
    let decision = |mode: Mode| -> Vec<f64> {
        all.iter().filter(|r| r.mode == mode).filter_map(|r| r.crossing_to_decision_ms).collect()
    };
    let ooms = |mode: Mode| all.iter().filter(|r| r.mode == mode && r.oom_killed).count();
    let kernel = Figure::distribution(
        format!("{label}, all runs: swiftlet in-kernel kill: crossing → dead"),
        "ms",
        &dead(Mode::Kernel),
    );
    let agent = Figure::distribution(
        format!("{label}, all runs: swiftlet userspace kill: crossing → dead"),
        "ms",
        &dead(Mode::Ebpf),
    );
    let agent_decision = Figure::distribution(
        format!("{label}, all runs: swiftlet userspace kill: crossing → decision"),
        "ms",
        &decision(Mode::Ebpf),
    );
    let kubelet = Figure::distribution(
        format!("{label}, all runs: cgroupfs poll 10s (kubelet): crossing → dead"),
        "ms",
        &dead(Mode::Poll(Duration::from_secs(10))),
    );
    let ratio = |a: &Figure, b: &Figure| match (a.p50, b.p50) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.0}×", a / b),
        _ => "-".into(),
    };
    let mut rows = vec![
        vec!["in-kernel kill: crossing → dead p99 ≤ 100 µs".into(), ms(kernel.p99), kernel.samples.to_string()],
        vec!["userspace fast path: crossing → dead p99 ≤ 5 ms".into(), ms(agent.p99), agent.samples.to_string()],
        vec![
            "userspace fast path: crossing → decision p99".into(),
            ms(agent_decision.p99),
            agent_decision.samples.to_string(),
        ],
        vec![
            "zero kernel OOM kills with the in-kernel kill".into(),
            ooms(Mode::Kernel).to_string(),
            kernel.samples.to_string(),
        ],
        vec![
            "zero kernel OOM kills with the userspace kill".into(),
            ooms(Mode::Ebpf).to_string(),
            agent.samples.to_string(),
        ],
        vec![
            "kubelet-style 10 s poll / userspace kill (p50) ≥ 100×".into(),
            ratio(&kubelet, &agent),
            kubelet.samples.to_string(),
        ],
    ];
    let mut figures = vec![kernel, agent, agent_decision, kubelet];
    if scenario == Scenario::Node {
        let earlyoom =
            Figure::distribution(format!("{label}, all runs: earlyoom: crossing → dead"), "ms", &dead(Mode::Earlyoom));
        rows.push(vec![
            "earlyoom / userspace kill (p50) ≥ 10×".into(),
            ratio(&earlyoom, &figures[1]),
            earlyoom.samples.to_string(),
        ]);
        rows.push(vec![
            "earlyoom / in-kernel kill (p50) ≥ 1000×".into(),
            ratio(&earlyoom, &figures[0]),
            earlyoom.samples.to_string(),
        ]);
        figures.push(earlyoom);
    }
    out.tables.push(Table { header: ["target", "measured", "runs"].map(String::from).to_vec(), rows });
    out.figures.extend(figures);
}
