//! The kernel-matrix bench: on whatever kernel it runs (this
//! host, or a Debian kernel in qemu, where `cargo xtask bench` boots it), a
//! BestEffort hog ramps past allocatableMemory.available while each signal
//! mode is driving the eviction manager, and the bench measures
//!
//! - crossing → decision: the line crossed (an independent observer's
//!   kernel timestamp) to the eviction manager's `evict()` call, the moment
//!   the pod is marked Evicted;
//! - crossing → dead: to the hog's `sched_process_exit`, on the same clock.
//!
//! Under TCG emulation timings are not real time, so each mode is reported
//! as a ratio against the cgroupfs-poll mode measured in the same run: how
//! many times sooner it decides and kills.

use std::{
    process::{Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use swiftlet::{
    cgroups::Version,
    eviction::{
        core::EvictionConfig,
        driver::{DriverConfig, EvictionContainer, EvictionManager, EvictionPod, EvictionRequest, PodEvictor},
        observe::NodeInfo,
        signal::{EvictionSignal, EvictionThreshold, ThresholdValue},
    },
    metrics::Metrics,
    quantity::Quantity,
    signals::{
        CgroupKind, Direction, SignalEvent, SignalSource, Target, Threshold,
        cgroupfs::CgroupfsSource,
        ebpf::{EbpfOptions, EbpfSource},
        monotonic_ns, node,
    },
};
use swiftlet_common::Signal;
use tokio_util::sync::CancellationToken;

use super::{BenchResult, Ctx, Figure, Table};
use crate::{cgroup::TestCgroup, pods::FakePods, workload};

const MIB: u64 = 1 << 20;
/// kubepods' limit (the kernel's OOM point): small, so an emulated CPU
/// reaches it in seconds.
const ALLOCATABLE: u64 = 512 * MIB;
/// allocatableMemory.available<128Mi: a line at 384 MiB.
const THRESHOLD: u64 = 128 * MIB;
const RAMP_MIB_S: u64 = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Kernel,
    Ebpf,
    /// cgroup v2 notifications (memory.events, memory.high, PSI) with the
    /// kubelet's 10 s poll behind them.
    Events,
    /// The baseline: cgroupfs polled every 100 ms.
    Poll,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Kernel => "in-kernel kill",
            Mode::Ebpf => "eBPF, userspace kill",
            Mode::Events => "cgroupfs v2 events + poll 10s",
            Mode::Poll => "cgroupfs poll 100ms",
        }
    }
}

/// Records when the eviction manager decided.
struct TimedEvictor {
    pods: Arc<FakePods>,
    first_ns: AtomicU64,
}

impl PodEvictor for TimedEvictor {
    fn evict(&self, request: EvictionRequest) {
        let _ = self.first_ns.compare_exchange(0, monotonic_ns(), Ordering::SeqCst, Ordering::SeqCst);
        self.pods.evict(request);
    }

    fn termination_reported(&self, uid: &str) -> bool {
        self.pods.termination_reported(uid)
    }
}

struct Run {
    decision_ms: Option<f64>,
    dead_ms: Option<f64>,
    oom: bool,
}

fn pod(uid: &str, cgroup: &str, request: u64) -> EvictionPod {
    EvictionPod {
        uid: uid.into(),
        namespace: "bench".into(),
        name: uid.into(),
        cgroup: cgroup.into(),
        memory_request: request,
        containers: vec![EvictionContainer { name: uid.into(), memory_request: request, cgroup: Some(cgroup.into()) }],
        ..Default::default()
    }
}

/// What the observer saw in one run: the line crossed, the hog's exit (both
/// kernel ns), and the memory cgroups of the kernel OOM killer's victims.
type Seen = (Option<u64>, Option<u64>, Vec<u64>);

/// The observer: its own instance of the kernel programs, reporting the line
/// crossing on kubepods and the hog's exit.
struct Observer {
    src: Arc<EbpfSource>,
    seen: Arc<Mutex<Seen>>,
    hog: Arc<AtomicU64>,
}

impl Observer {
    fn new(tc: &TestCgroup) -> Result<Observer> {
        let src = Arc::new(EbpfSource::load(tc.fs.clone(), &EbpfOptions::default()).context("observer")?);
        let seen = Arc::new(Mutex::new((None, None, vec![])));
        let hog = Arc::new(AtomicU64::new(0));
        let (s, h) = (seen.clone(), hog.clone());
        src.subscribe(Arc::new(move |e: SignalEvent| {
            let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
            match e {
                SignalEvent::Crossing { direction: Direction::Up, target: Target::Cgroup(_), at_ns, .. }
                    if s.0.is_none() =>
                {
                    s.0 = Some(at_ns)
                }
                SignalEvent::ProcessExit { pid, at_ns, .. } if u64::from(pid) == h.load(Ordering::SeqCst) => {
                    s.1 = Some(at_ns)
                }
                SignalEvent::OomKill { cgroup_id, .. } => s.2.push(cgroup_id),
                _ => {}
            }
        }));
        Ok(Observer { src, seen, hog })
    }
}

fn run_once(obs: &Observer, mode: Mode, agent: &Arc<EbpfSource>) -> Result<Run> {
    let tc = TestCgroup::new();
    let kubepods = tc.child("kubepods");
    tc.fs.set_memory_limit(&kubepods, Some(ALLOCATABLE))?;
    let hog_pod = tc.child("kubepods/besteffort/podhog");
    let steady_pod = tc.child("kubepods/podsteady");
    let line = ALLOCATABLE - THRESHOLD;
    *obs.seen.lock().unwrap_or_else(|p| p.into_inner()) = (None, None, vec![]);
    obs.src.register(&kubepods, CgroupKind::Kubepods)?;
    obs.src.set_threshold(
        &Target::Cgroup(kubepods.clone()),
        Signal::MemoryWorkingSet,
        Some(Threshold { trigger: line + 1, rearm: line - 64 * MIB }),
    )?;
    let mut steady = workload::Steps::spawn(&tc.fs, &steady_pod);
    steady.run("anon 16");

    let pods = Arc::new(FakePods::new(vec![pod("hog", &hog_pod, 0), pod("steady", &steady_pod, 64 * MIB)]));
    let evictor = Arc::new(TimedEvictor { pods: pods.clone(), first_ns: AtomicU64::new(0) });
    let (source, interval): (Arc<dyn SignalSource>, Duration) = match mode {
        Mode::Kernel | Mode::Ebpf => {
            agent.set_kernel_eviction(mode == Mode::Kernel);
            (agent.clone(), Duration::from_secs(10))
        }
        Mode::Events => {
            (Arc::new(CgroupfsSource::start(tc.fs.clone(), Duration::from_secs(10))), Duration::from_secs(10))
        }
        Mode::Poll => {
            (Arc::new(CgroupfsSource::start(tc.fs.clone(), Duration::from_millis(100))), Duration::from_millis(100))
        }
    };
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
        housekeeping_interval: interval,
        plan_interval: Duration::from_millis(200),
        kernel_eviction: mode == Mode::Kernel,
        reclaim_before_eviction: false,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let stop_tx = CancellationToken::new();
    let stop_rx = stop_tx.clone();
    let (manager, event_loop) = EvictionManager::new(
        cfg,
        source.clone(),
        tc.fs.clone(),
        pods.clone(),
        evictor.clone(),
        None,
        Arc::new(Metrics::new()),
    );
    let task = rt.spawn(event_loop.run(stop_rx));
    let deadline = Instant::now() + Duration::from_secs(60);
    while manager.plan(EvictionSignal::AllocatableMemoryAvailable).first().map(|v| v.uid.as_str()) != Some("hog") {
        if Instant::now() > deadline {
            bail!("{}: the agent made no victim plan", mode.label());
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    let mut cmd = Command::new(workload::binary());
    cmd.args(["hog", &RAMP_MIB_S.to_string(), "2048"]).stdout(Stdio::null());
    workload::in_cgroup(&mut cmd, &tc.fs, &hog_pod);
    let mut hog = cmd.spawn()?;
    obs.hog.store(u64::from(hog.id()), Ordering::SeqCst);
    obs.src.watch_exit(hog.id())?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while hog.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = hog.kill();
            hog.wait()?;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // The decision may follow the kill (kernel and fast paths finish on the
    // event loop).
    let deadline = Instant::now() + Duration::from_secs(20);
    while evictor.first_ns.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    stop_tx.cancel();
    let _ = rt.block_on(task);
    for cg in [&hog_pod, &steady_pod, &kubepods] {
        source.unregister(cg);
    }
    obs.src.unregister(&kubepods);
    let (crossing, dead, oom_victims) = obs.seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    // Only this run's tree counts: other work on the machine OOM-kills too.
    let oom_event = oom_victims.iter().any(|id| tc.holds_cgroup_id(*id));
    let decided = evictor.first_ns.load(Ordering::SeqCst);
    let since = |t: u64| crossing.filter(|c| t >= *c).map(|c| (t - c) as f64 / 1e6);
    Ok(Run {
        decision_ms: (decided != 0).then(|| since(decided)).flatten(),
        dead_ms: dead.and_then(since),
        oom: oom_event,
    })
}

pub fn kernels(ctx: &Ctx) -> Result<BenchResult> {
    let runs = ctx.pick(10, 2);
    let tc = TestCgroup::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned();
    let v2 = tc.fs.version() == Version::V2;
    let obs = Observer::new(&tc)?;
    let agent = Arc::new(EbpfSource::load(tc.fs.clone(), &EbpfOptions::default()).context("agent's eBPF source")?);
    let strategy = agent.strategies().memory.name();
    let mut modes = vec![Mode::Kernel, Mode::Ebpf];
    if v2 {
        modes.push(Mode::Events);
    }
    modes.push(Mode::Poll);
    let mut results: Vec<(Mode, Vec<Run>)> = modes.iter().map(|m| (*m, vec![])).collect();
    for i in 0..runs {
        // Modes interleaved run by run, so drift hits them alike.
        for (mode, out) in results.iter_mut() {
            eprintln!("    {kernel}: {} run {}/{runs}", mode.label(), i + 1);
            out.push(run_once(&obs, *mode, &agent)?);
        }
    }
    let p50 = |v: Vec<f64>| Figure::distribution("", "ms", &v).p50;
    let baseline = results.iter().find(|(m, _)| *m == Mode::Poll).map(|(_, r)| {
        (p50(r.iter().filter_map(|r| r.decision_ms).collect()), p50(r.iter().filter_map(|r| r.dead_ms).collect()))
    });
    let mut out = BenchResult {
        name: "kernel-matrix".into(),
        title: format!(
            "Kernel {kernel} (cgroup {}; memory strategy {strategy}). A BestEffort hog ramps at {RAMP_MIB_S} MiB/s \
             past allocatableMemory.available<{}Mi with kubepods limited to {} MiB; {runs} runs per mode, interleaved. \
             Crossing: an independent observer's kernel timestamp; decision: the eviction manager's evict() call; \
             dead: the hog's sched_process_exit, which the kernel reaches after freeing the hog's memory (hundreds \
             of MiB: milliseconds on hardware, around a second under emulation, which pulls the dead ratios of a VM \
             towards 1). Ratios: the cgroupfs-poll-100ms p50 divided by the mode's p50 (how many times sooner), \
             measured in the same run, so they hold under emulation.",
            if v2 { "v2" } else { "v1" },
            THRESHOLD / MIB,
            ALLOCATABLE / MIB
        ),
        ..Default::default()
    };
    let mut table = Table {
        header: [
            "kernel",
            "mode",
            "crossing→decision p50 (ms)",
            "× sooner than poll",
            "crossing→dead p50 (ms)",
            "× sooner than poll",
            "kernel OOM kills",
        ]
        .map(String::from)
        .to_vec(),
        rows: vec![],
    };
    for (mode, r) in &results {
        let decision: Vec<f64> = r.iter().filter_map(|r| r.decision_ms).collect();
        let dead: Vec<f64> = r.iter().filter_map(|r| r.dead_ms).collect();
        let fd = Figure::distribution(format!("{kernel}: {}: crossing → decision", mode.label()), "ms", &decision);
        let fk = Figure::distribution(format!("{kernel}: {}: crossing → dead", mode.label()), "ms", &dead);
        let ratio = |base: Option<f64>, v: Option<f64>| match (base, v) {
            (Some(b), Some(v)) if v > 0.0 => Some(b / v),
            _ => None,
        };
        let rd = ratio(baseline.and_then(|b| b.0), fd.p50);
        let rk = ratio(baseline.and_then(|b| b.1), fk.p50);
        let fmt = |v: Option<f64>| v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into());
        let ooms = r.iter().filter(|r| r.oom).count();
        table.rows.push(vec![
            kernel.clone(),
            mode.label().into(),
            fmt(fd.p50),
            fmt(rd),
            fmt(fk.p50),
            fmt(rk),
            format!("{ooms}/{}", r.len()),
        ]);
        out.figures.push(fd);
        out.figures.push(fk);
        if let Some(v) = rd {
            out.figures.push(Figure::value(
                format!("{kernel}: {}: decision, × sooner than poll", mode.label()),
                "×",
                runs,
                v,
            ));
        }
        if let Some(v) = rk {
            out.figures.push(Figure::value(
                format!("{kernel}: {}: dead, × sooner than poll", mode.label()),
                "×",
                runs,
                v,
            ));
        }
    }
    out.tables.push(table);
    Ok(out)
}
