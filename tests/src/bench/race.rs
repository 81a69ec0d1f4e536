//! The eviction race (issue 9): a memory hog in a BestEffort pod ramps at a
//! fixed rate toward the pods' allocatable limit, with a Guaranteed pod
//! beside it. Every mode sees the same ramp; an independent observer (its
//! own instance of the kernel programs, on the same clock) records when the
//! line was crossed, when the hog died, how far memory overshot the line,
//! and whether the kernel OOM killer fired.

use std::{
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
/// The pods' allocatable memory, enforced on kubepods.
const ALLOCATABLE: u64 = 1024 * MIB;
/// allocatableMemory.available<256Mi: the line sits at 768 MiB of working set.
const THRESHOLD: u64 = 256 * MIB;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// swiftlet with the kernel killing the planned victim at the crossing.
    Kernel,
    /// swiftlet with eBPF signals (event-driven), killing from userspace.
    Ebpf,
    /// swiftlet polling cgroupfs at this interval (10 s is the kubelet's).
    Poll(Duration),
    /// No agent: the kernel OOM killer alone.
    NoAgent,
}

impl Mode {
    pub fn label(self) -> String {
        match self {
            Mode::Kernel => "swiftlet in-kernel kill".into(),
            Mode::Ebpf => "swiftlet eBPF".into(),
            Mode::Poll(d) if d >= Duration::from_secs(1) => format!("cgroupfs poll {}s", d.as_secs()),
            Mode::Poll(d) => format!("cgroupfs poll {}ms", d.as_millis()),
            Mode::NoAgent => "no agent (kernel OOM)".into(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Run {
    pub mode: Mode,
    pub rate: u64,
    /// From the line crossed to the hog's exit, both kernel timestamps.
    pub crossing_to_dead_ms: Option<f64>,
    /// Peak working set above the line.
    pub overshoot_mib: f64,
    pub oom_killed: bool,
    pub evicted: bool,
    /// (ms since the hog started, kubepods working set MiB)
    pub trace: Vec<(f64, f64)>,
    /// ms since start of crossing and death.
    pub crossing_ms: Option<f64>,
    pub dead_ms: Option<f64>,
}

fn line_bytes() -> u64 {
    ALLOCATABLE - THRESHOLD
}

fn run_once(mode: Mode, rate: u64) -> Result<Run> {
    let tc = TestCgroup::new();
    let kubepods = tc.child("kubepods");
    tc.fs.set_memory_limit(&kubepods, Some(ALLOCATABLE))?;
    let hog_pod = tc.child("kubepods/besteffort/podhog");
    let steady_pod = tc.child("kubepods/podsteady");

    // The observer: its own programs, a line at the same place.
    let observer = Arc::new(EbpfSource::load(tc.fs.clone(), &EbpfOptions::default()).context("observer")?);
    observer.register(&kubepods, CgroupKind::Kubepods)?;
    observer.set_threshold(
        &Target::Cgroup(kubepods.clone()),
        Signal::MemoryWorkingSet,
        Some(Threshold { trigger: line_bytes() + 1, rearm: line_bytes() - 64 * MIB }),
    )?;
    let seen = Arc::new(Mutex::new((None::<u64>, None::<u64>, false)));
    let hog_pid = Arc::new(Mutex::new(0u32));
    {
        let (seen, hog_pid, kubepods) = (seen.clone(), hog_pid.clone(), kubepods.clone());
        observer.subscribe(Arc::new(move |e: SignalEvent| {
            let mut s = seen.lock().unwrap();
            match e {
                SignalEvent::Crossing { direction: Direction::Up, target: Target::Cgroup(c), at_ns, .. }
                    if c == kubepods && s.0.is_none() =>
                {
                    s.0 = Some(at_ns)
                }
                SignalEvent::ProcessExit { pid, at_ns, .. } if pid == *hog_pid.lock().unwrap() => s.1 = Some(at_ns),
                SignalEvent::OomKill { .. } => s.2 = true,
                _ => {}
            }
        }));
    }

    let mut steady = workload::Steps::spawn(&tc.fs, &steady_pod);
    steady.run("anon 32");

    // The agent under test.
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
    if mode != Mode::NoAgent {
        let (choice, interval) = match mode {
            Mode::Ebpf | Mode::Kernel => (SourceChoice::Ebpf, Duration::from_secs(10)),
            Mode::Poll(d) => (SourceChoice::Cgroupfs, d),
            Mode::NoAgent => unreachable!(),
        };
        let opts = EbpfOptions { kernel_eviction: mode == Mode::Kernel, ..Default::default() };
        let opened = signals::open(choice, tc.fs.clone(), &opts, interval)?;
        let cfg = DriverConfig {
            eviction: EvictionConfig {
                thresholds: vec![EvictionThreshold {
                    signal: EvictionSignal::AllocatableMemoryAvailable,
                    value: ThresholdValue::Quantity(Quantity::from_units(THRESHOLD as i64)),
                    grace_period: Duration::ZERO,
                    min_reclaim: None,
                }],
                pressure_transition_period: Duration::from_secs(30),
                max_pod_grace_period_secs: 0,
            },
            node: NodeInfo {
                memory_capacity: node::mem_total()?,
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
            Arc::new(Metrics::new()),
        );
        let task = rt.spawn(event_loop.run(stop_rx));
        let deadline = Instant::now() + Duration::from_secs(10);
        while manager.plan(EvictionSignal::AllocatableMemoryAvailable).first().map(|v| v.uid.as_str()) != Some("hog") {
            if Instant::now() > deadline {
                bail!("the agent made no victim plan");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        agent = Some((manager, task, opened));
    }

    let mut cmd = std::process::Command::new(workload::binary());
    cmd.args(["hog", &rate.to_string(), "2048"]).stdout(std::process::Stdio::null());
    workload::in_cgroup(&mut cmd, &tc.fs, &hog_pod);
    let start_ns = monotonic_ns();
    let start = Instant::now();
    let mut hog = cmd.spawn()?;
    *hog_pid.lock().unwrap() = hog.id();
    observer.watch_exit(hog.id())?;
    let mut trace = vec![];
    let status = loop {
        if let Some(s) = hog.try_wait()? {
            break s;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = hog.kill();
            break hog.wait()?;
        }
        if let Ok(s) = observer.snapshot() {
            let ws = s.cgroups.get(&kubepods).map_or(0, |c| c.working_set_bytes);
            trace.push((start.elapsed().as_secs_f64() * 1e3, ws as f64 / MIB as f64));
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let _ = status;
    std::thread::sleep(Duration::from_millis(100));
    stop_tx.send(true).ok();
    if let Some((_, task, _)) = agent.take() {
        let _ = rt.block_on(task);
    }
    let (crossing, dead, oom_event) = *seen.lock().unwrap();
    let oom_counter = std::fs::read_to_string(tc.fs.memory_dir(&kubepods).join("memory.oom_control"))
        .or_else(|_| std::fs::read_to_string(tc.fs.memory_dir(&kubepods).join("memory.events")))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill ").and_then(|v| v.trim().parse::<u64>().ok()))
        .unwrap_or(0);
    let peak = trace.iter().map(|p| p.1).fold(0.0, f64::max);
    let ms = |ns: u64| ns.saturating_sub(start_ns) as f64 / 1e6;
    Ok(Run {
        mode,
        rate,
        crossing_to_dead_ms: match (crossing, dead) {
            (Some(c), Some(d)) if d >= c => Some((d - c) as f64 / 1e6),
            _ => None,
        },
        overshoot_mib: (peak - line_bytes() as f64 / MIB as f64).max(0.0),
        oom_killed: oom_event || oom_counter > 0,
        evicted: !pods.evictions().is_empty(),
        trace,
        crossing_ms: crossing.map(ms),
        dead_ms: dead.map(ms),
    })
}

pub fn race(ctx: &Ctx) -> Result<BenchResult> {
    let runs_per_cell = ctx.pick(20, 2);
    let modes =
        [Mode::Ebpf, Mode::Poll(Duration::from_millis(100)), Mode::Poll(Duration::from_secs(10)), Mode::NoAgent];
    let rates = [256u64, 1024];
    let mut all: Vec<Run> = vec![];
    for rate in rates {
        for i in 0..runs_per_cell {
            // Modes interleaved run by run, so drift hits them alike.
            for mode in modes {
                eprintln!("    race: {} at {rate} MiB/s, run {}/{runs_per_cell}", mode.label(), i + 1);
                all.push(run_once(mode, rate)?);
            }
        }
    }
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
            "evicted by agent",
        ]
        .map(String::from)
        .to_vec(),
        rows: vec![],
    };
    let mut figures = vec![];
    let mut bars = vec![];
    for rate in rates {
        let mut group = vec![];
        let mut p50_of = std::collections::HashMap::new();
        for mode in modes {
            let cell: Vec<&Run> = all.iter().filter(|r| r.mode == mode && r.rate == rate).collect();
            let lat: Vec<f64> = cell.iter().filter_map(|r| r.crossing_to_dead_ms).collect();
            let over: Vec<f64> = cell.iter().map(|r| r.overshoot_mib).collect();
            let f = Figure::distribution(format!("{} at {rate} MiB/s: crossing → dead", mode.label()), "ms", &lat);
            let fmt = |v: Option<f64>| v.map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into());
            table.rows.push(vec![
                format!("{rate} MiB/s"),
                mode.label(),
                cell.len().to_string(),
                fmt(f.p50),
                fmt(f.p99),
                fmt(f.max),
                format!("{:.1}", median(&over)),
                format!("{:.1}", over.iter().copied().fold(0.0, f64::max)),
                cell.iter().filter(|r| r.oom_killed).count().to_string(),
                cell.iter().filter(|r| r.evicted).count().to_string(),
            ]);
            if let Some(p) = f.p50 {
                group.push((mode.label(), p));
                p50_of.insert(mode.label(), p);
            }
            figures.push(f);
            figures.push(Figure::value(
                format!("{} at {rate} MiB/s: kernel OOM kills", mode.label()),
                "runs",
                cell.len(),
                cell.iter().filter(|r| r.oom_killed).count() as f64,
            ));
        }
        let ebpf = p50_of.get(&Mode::Ebpf.label()).copied();
        for other in
            [Mode::Kernel, Mode::Poll(Duration::from_secs(10)), Mode::Poll(Duration::from_millis(100)), Mode::NoAgent]
        {
            if let (Some(a), Some(b)) = (ebpf, p50_of.get(&other.label())) {
                figures.push(Figure::value(
                    format!("{} / swiftlet eBPF at {rate} MiB/s (p50 crossing → dead)", other.label()),
                    "×",
                    runs_per_cell,
                    b / a,
                ));
            }
        }
        bars.push((format!("{rate} MiB/s"), group));

        // Memory over time: the first run of each mode at this rate.
        let mut series = vec![];
        let mut markers = vec![];
        for (i, mode) in modes.iter().enumerate() {
            if let Some(r) = all.iter().find(|r| r.mode == *mode && r.rate == rate) {
                series.push(svg::Series { name: mode.label(), points: r.trace.clone() });
                if let Some(d) = r.dead_ms {
                    let y = r.trace.iter().rev().find(|p| p.0 <= d).map_or(0.0, |p| p.1);
                    markers.push(svg::Marker {
                        label: if r.oom_killed { "OOM".into() } else { "killed".into() },
                        x: d,
                        y,
                        series: i,
                    });
                }
            }
        }
        let plot = format!("eviction-race-memory-{rate}.svg");
        std::fs::write(
            ctx.out.join(&plot),
            svg::line_chart(
                &format!("kubepods working set during a {rate} MiB/s ramp"),
                "ms since the hog started",
                "MiB",
                &series,
                &[
                    ("eviction line (allocatable − 256Mi)".into(), line_bytes() as f64 / MIB as f64),
                    ("kubepods limit (kernel OOM)".into(), ALLOCATABLE as f64 / MIB as f64),
                ],
                &markers,
            ),
        )?;
    }
    let bar_plot = "eviction-race-latency.svg";
    std::fs::write(ctx.out.join(bar_plot), svg::log_bars("Crossing → victim dead, p50 (log scale)", "ms", &bars))?;
    Ok(BenchResult {
        name: "eviction-race".into(),
        title: format!(
            "A BestEffort hog ramps toward kubepods' enforced allocatable ({} MiB) with a Guaranteed pod beside it; \
             hard threshold allocatableMemory.available<256Mi (line at {} MiB). Crossing and death are kernel \
             timestamps from an independent observer (its own programs: the line crossing event and \
             sched_process_exit of the hog). Modes run interleaved, {runs_per_cell} runs per cell.",
            ALLOCATABLE / MIB,
            line_bytes() / MIB
        ),
        figures,
        tables: vec![table],
        plots: vec!["eviction-race-memory-256.svg".into(), "eviction-race-memory-1024.svg".into(), bar_plot.into()],
        notes: vec![],
    })
}
