//! One run of the eviction race: fresh cgroups, the observer, the mode's
//! agent (or peer, or nothing), the hog, and what the kernel saw.

use std::{
    io::BufRead,
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use swiftlet::{
    eviction::{
        core::EvictionConfig,
        driver::{DriverConfig, EvictionContainer, EvictionManager, EvictionPod, PlannedVictim},
        observe::NodeInfo,
        signal::{EvictionSignal, EvictionThreshold, ThresholdValue},
    },
    metrics::Metrics,
    quantity::Quantity,
    signals::{
        self, CgroupKind, Direction, KillOutcome, SignalEvent, SignalSource, SourceChoice, Target, Threshold,
        ebpf::{EbpfOptions, EbpfSource},
        monotonic_ns, node,
    },
};
use swiftlet_common::Signal;
use tokio_util::sync::CancellationToken;

use super::{
    ALLOCATABLE, ALLOCATABLE_THRESHOLD, CrossingSeen, MIB, Mode, NODE_HEADROOM, NODE_RAMP_TO_LINE, Run, Scenario,
    cache::{self, CacheLoad},
};
use crate::{cgroup::TestCgroup, pods::FakePods, workload};

/// A process killed (and reaped) when dropped.
pub(super) struct Reaped(pub(super) Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The node scenario's balloon: most of RAM locked by one process.
pub(super) fn balloon() -> Result<Reaped> {
    let available = mem_available()?;
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

fn mem_available() -> Result<u64> {
    node::parse_meminfo(&std::fs::read_to_string("/proc/meminfo")?, "MemAvailable").context("MemAvailable")
}

pub(super) fn earlyoom_running() -> bool {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "earlyoom"))
}

/// The kernel's own peak of a cgroup's memory usage (v1
/// memory.max_usage_in_bytes, v2 memory.peak), reset first where the
/// kernel allows it (v1: a write of 0). The race's cgroups are made fresh
/// for each run, so the peak is the run's either way.
fn reset_peak(tc: &TestCgroup, cg: &str) {
    let _ = std::fs::write(tc.fs.memory_dir(cg).join("memory.max_usage_in_bytes"), "0");
}

fn peak(tc: &TestCgroup, cg: &str) -> Option<u64> {
    let dir = tc.fs.memory_dir(cg);
    ["memory.max_usage_in_bytes", "memory.peak"]
        .iter()
        .find_map(|f| std::fs::read_to_string(dir.join(f)).ok())
        .and_then(|s| s.trim().parse().ok())
}

/// Watches MemAvailable (what earlyoom reads) every 0.5 ms and records the
/// first moment (CLOCK_MONOTONIC) it falls below `line`: the peer's own
/// line, timed by the bench rather than the peer.
struct MemAvailableWatch {
    stop: Arc<AtomicBool>,
    crossed: Arc<Mutex<Option<u64>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MemAvailableWatch {
    fn start(line: u64) -> MemAvailableWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let crossed = Arc::new(Mutex::new(None));
        let (s, c) = (stop.clone(), crossed.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Ok(a) = mem_available()
                    && a < line
                {
                    *c.lock().unwrap() = Some(monotonic_ns());
                    return;
                }
                std::thread::sleep(Duration::from_micros(500));
            }
        });
        MemAvailableWatch { stop, crossed, thread: Some(thread) }
    }

    fn finish(mut self) -> Option<u64> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        *self.crossed.lock().unwrap()
    }
}

/// Options of a run beyond its scenario, mode and rate.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RunOptions {
    /// Both cores kept busy by spinning threads during the ramp.
    pub busy: bool,
    /// How far the hog grows if nothing kills it (MiB); None: to the OOM point.
    pub max_mib: Option<u64>,
    /// A cache pod re-reading its files before the hog starts (the cache race).
    pub cache: Option<CacheLoad>,
}

pub(super) fn run_once(scenario: Scenario, mode: Mode, rate: u64, opts: RunOptions) -> Result<Run> {
    let tc = TestCgroup::new();
    let kubepods = tc.child("kubepods");
    let hog_pod = tc.child("kubepods/besteffort/podhog");
    let steady_pod = tc.child("kubepods/podsteady");
    reset_peak(&tc, &kubepods);
    reset_peak(&tc, &hog_pod);
    let capacity = node::mem_total()?;

    // The observer adds every page to the node at once: with the agent's
    // per-CPU batching it would see the node's line crossed up to a batch
    // per CPU late, or after the agent had already killed. Its records
    // never wake its reader (which drains them every few ms, under
    // SCHED_IDLE): a wake-up is a self-IPI on the hog's CPU at the very
    // crossing it times, in a VM an exit to the host.
    let observer_opts =
        EbpfOptions { node_memory_batch: Some(1), reader_idle: true, records_wait: true, ..Default::default() };
    let observer = Arc::new(EbpfSource::load(tc.fs.clone(), &observer_opts).context("observer")?);
    observer.register(&kubepods, CgroupKind::Kubepods)?;
    // The line, as "used" bytes of the observed target, and the threshold.
    let (target, line_used, threshold) = match scenario {
        Scenario::Allocatable => {
            tc.fs.set_memory_limit(&kubepods, Some(ALLOCATABLE))?;
            if opts.cache.is_some() {
                cache::hold_memory_high(&tc.fs, &kubepods)?;
            }
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
    // The observer's first upward crossing: the task that made it and the
    // value it crossed with (bytes: the race's lines are memory lines).
    let observer_crossing = Arc::new(Mutex::new(None::<CrossingSeen>));
    // Every crossing of the line either way: (up, kernel timestamp).
    let line_events = Arc::new(Mutex::new(Vec::<(bool, u64)>::new()));
    let hog_pid = Arc::new(Mutex::new(0u32));
    {
        let (seen, hog_pid, target, line_events, observer_crossing) =
            (seen.clone(), hog_pid.clone(), target.clone(), line_events.clone(), observer_crossing.clone());
        observer.subscribe(Arc::new(move |e: SignalEvent| {
            if let SignalEvent::Crossing { direction, target: t, at_ns, .. } = &e
                && *t == target
            {
                line_events.lock().unwrap().push((*direction == Direction::Up, *at_ns));
            }
            let mut s = seen.lock().unwrap();
            match e {
                SignalEvent::Crossing { direction: Direction::Up, target: t, at_ns, pid, value, threshold, .. }
                    if t == target && s.0.is_none() =>
                {
                    s.0 = Some(at_ns);
                    *observer_crossing.lock().unwrap() = Some(CrossingSeen { pid, value, threshold });
                }
                SignalEvent::ProcessExit { pid, at_ns, .. } if pid == *hog_pid.lock().unwrap() => s.1 = Some(at_ns),
                SignalEvent::OomKill { cgroup_id, .. } => s.2.push(cgroup_id),
                _ => {}
            }
        }));
    }

    let mut steady = workload::Steps::spawn(&tc.fs, &steady_pod);
    steady.run("anon 32");

    let cache_pod = opts.cache.map(|_| tc.child("kubepods/burstable/podcache"));
    let hog_entry = EvictionPod {
        uid: "hog".into(),
        namespace: "bench".into(),
        name: "hog".into(),
        cgroup: hog_pod.clone(),
        containers: vec![EvictionContainer { name: "hog".into(), memory_request: 0, cgroup: Some(hog_pod.clone()) }],
        ..Default::default()
    };
    let mut pod_list = vec![EvictionPod {
        uid: "steady".into(),
        namespace: "bench".into(),
        name: "steady".into(),
        cgroup: steady_pod.clone(),
        memory_request: 64 * MIB,
        ..Default::default()
    }];
    // In the cache race the hog's pod is scheduled later, with the hog.
    match (opts.cache, &cache_pod) {
        (Some(load), Some(pod)) => pod_list.push(cache::cache_pod(pod, load)),
        _ => pod_list.insert(0, hog_entry.clone()),
    }
    let pods = Arc::new(FakePods::new(pod_list));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let stop_tx = CancellationToken::new();
    let stop_rx = stop_tx.clone();
    let mut agent = None;
    let mut agent_events = None;
    let mut earlyoom = None;
    let metrics = Arc::new(Metrics::new());
    // The peer's own line, in its own figure: MemAvailable the same ramp
    // distance below what it was at the start (node scenario only).
    let peer_line =
        (scenario == Scenario::Node).then(mem_available).transpose()?.map(|a| a.saturating_sub(NODE_RAMP_TO_LINE));
    match mode {
        Mode::NoAgent => {}
        Mode::Earlyoom => {
            let line_kib = peer_line.context("earlyoom runs in the node scenario only")? / 1024;
            let child = Command::new("earlyoom")
                .args(["-M", &format!("{line_kib},{line_kib}"), "-r", "0", "--prefer", "^swiftlet-worklo"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("cannot start earlyoom (Debian package earlyoom; `cargo xtask bench` installs it)")?;
            std::thread::sleep(Duration::from_millis(300));
            earlyoom = Some(Reaped(child));
        }
        Mode::Kernel | Mode::Ebpf { .. } | Mode::Poll(_) | Mode::ReclaimFirst => {
            let (choice, interval) = match mode {
                Mode::Poll(d) => (SourceChoice::Cgroupfs, d),
                _ => (SourceChoice::Ebpf, Duration::from_secs(10)),
            };
            let reader_priority = match mode {
                Mode::Ebpf { realtime: false } => None,
                // The agent's default (--eviction-realtime-priority).
                _ => Some(10),
            };
            let opts = EbpfOptions { kernel_eviction: mode.kernel_kills(), reader_priority, ..Default::default() };
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
                kernel_eviction: mode.kernel_kills(),
                reclaim_before_eviction: mode == Mode::ReclaimFirst,
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
            // The hog's pod first; in the cache race (no hog yet) any plan.
            let ready = |plan: Vec<PlannedVictim>| match cache_pod {
                None => plan.first().is_some_and(|v| v.uid == "hog"),
                Some(_) => !plan.is_empty(),
            };
            while !ready(manager.plan(signal)) {
                if Instant::now() > deadline {
                    bail!("the agent made no victim plan");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            agent = Some((manager, task, opened));
        }
    }

    let max = opts.max_mib.unwrap_or(match scenario {
        Scenario::Allocatable => 2048,
        Scenario::Node => 4096 + NODE_HEADROOM / MIB,
    });
    // The cache race: the cache pod's reader runs until its hot page cache
    // crosses the line, then a while longer before the hog starts.
    let cache_phase = match (opts.cache, &cache_pod) {
        (Some(load), Some(pod)) => Some(cache::cache_phase(&tc.fs, pod, load, &line_events)?),
        _ => None,
    };
    if cache_phase.is_some() {
        pods.pods.lock().unwrap().push(hog_entry);
        if let Some((manager, _, _)) = &agent {
            let signal = EvictionSignal::AllocatableMemoryAvailable;
            let deadline = Instant::now() + Duration::from_secs(10);
            while !manager.plan(signal).iter().any(|v| v.uid == "hog") {
                if Instant::now() > deadline {
                    bail!("the agent did not plan for the hog's pod");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    let mut cmd = Command::new(workload::binary());
    cmd.args(["hog", &rate.to_string(), &max.to_string()]).stdout(Stdio::null());
    workload::in_cgroup(&mut cmd, &tc.fs, &hog_pod);
    let spinners = opts.busy.then(crate::bench::signals::Spinners::start);
    let watch = peer_line.map(MemAvailableWatch::start);
    let start_ns = monotonic_ns();
    let start = Instant::now();
    let mut hog = cmd.spawn()?;
    *hog_pid.lock().unwrap() = hog.id();
    observer.watch_exit(hog.id())?;
    let mut trace = vec![];
    // Without a kill the hog holds `max` and the run has no figure: wait as
    // long as growing to it takes, and a little more.
    let give_up = Duration::from_secs_f64(max as f64 / rate as f64) + Duration::from_secs(5);
    loop {
        if hog.try_wait()?.is_some() {
            break;
        }
        if start.elapsed() > give_up.min(Duration::from_secs(30)) {
            let _ = hog.kill();
            hog.wait()?;
            break;
        }
        if let Ok(s) = observer.snapshot() {
            trace.push((start.elapsed().as_secs_f64() * 1e3, (used_of(&s) as f64 - line_used as f64) / MIB as f64));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    drop(spinners);
    std::thread::sleep(Duration::from_millis(100));
    let peer_crossing = watch.and_then(MemAvailableWatch::finish);
    drop(earlyoom);
    stop_tx.cancel();
    if let Some((_, task, _)) = agent.take() {
        let _ = rt.block_on(task);
    }
    let (crossing, dead, oom_victims) = seen.lock().unwrap().clone();
    // What the agent's own instance saw, for runs that need explaining.
    let (mut agent_crossing_ns, mut agent_crossing, mut kernel_kill, mut kernel_outcome) = (None, None, None, None);
    if let Some(rx) = agent_events.as_mut() {
        loop {
            let e = match rx.try_recv() {
                Ok(e) => e,
                Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => continue,
                Err(_) => break,
            };
            match e {
                SignalEvent::Crossing {
                    direction: Direction::Up,
                    target: t,
                    at_ns,
                    kernel_outcome: o,
                    pid,
                    value,
                    threshold,
                    ..
                } if t == target && agent_crossing_ns.is_none() => {
                    agent_crossing_ns = Some(at_ns);
                    agent_crossing = Some(CrossingSeen { pid, value, threshold });
                    kernel_outcome = Some(o);
                }
                SignalEvent::KernelKill { at_ns, pid, signal_error, .. } if kernel_kill.is_none() => {
                    kernel_kill = Some((at_ns, pid, signal_error))
                }
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
    // Overshoot from the kernel's peak: kubepods against its line; for the
    // node, the hog against the ramp the line allowed it.
    let overshoot_mib = match scenario {
        Scenario::Allocatable => peak(&tc, &kubepods).map(|p| p as f64 - line_used as f64),
        Scenario::Node => peak(&tc, &hog_pod).map(|p| p as f64 - NODE_RAMP_TO_LINE as f64),
    }
    .map(|b| (b / MIB as f64).max(0.0));
    let exposition = metrics.encode();
    let metric =
        |name: &str| exposition.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<f64>().ok()));
    let per_run = |sum: &str, count: &str| match (metric(sum), metric(count)) {
        (Some(sum), Some(count)) if count >= 1.0 => Some(sum / count * 1e3),
        _ => None,
    };
    // The mode's own line: earlyoom's is MemAvailable's; in the cache race,
    // the line as the hog meets it (the cache may have crossed it before).
    let line_crossing = if mode == Mode::Earlyoom {
        peer_crossing
    } else if cache_phase.is_some() {
        cache::crossing_for_hog(&line_events.lock().unwrap(), start_ns)
    } else {
        crossing
    };
    let cache = cache_phase.map(|phase| phase.finish(&pods.evictions(), &line_events.lock().unwrap(), start_ns));
    Ok(Run {
        crossing_to_decision_ms: per_run(
            "swiftlet_eviction_crossing_to_decision_seconds_sum ",
            "swiftlet_eviction_crossing_to_decision_seconds_count ",
        ),
        crossing_to_kill_ms: per_run(
            "swiftlet_eviction_crossing_to_kill_seconds_sum{path=\"agent\"} ",
            "swiftlet_eviction_crossing_to_kill_seconds_count{path=\"agent\"} ",
        ),
        scenario,
        mode,
        rate,
        crossing_to_dead_ms: match (line_crossing, dead) {
            (Some(c), Some(d)) if d >= c => Some((d - c) as f64 / 1e6),
            _ => None,
        },
        overshoot_mib,
        oom_killed: oom_event || oom_counter > 0,
        trace,
        dead_ms: dead.map(|ns| ns.saturating_sub(start_ns) as f64 / 1e6),
        line_ms: crossing.map(|ns| ns.saturating_sub(start_ns) as f64 / 1e6),
        peer_line_ms: peer_crossing.map(|ns| ns.saturating_sub(start_ns) as f64 / 1e6),
        agent_crossing_ms: agent_crossing_ns.and_then(since_crossing),
        kernel_kill_ms: kernel_kill.and_then(|(ns, ..)| since_crossing(ns)),
        kernel_kill_current: kernel_kill.is_some_and(|(_, pid, _)| pid != 0),
        kernel_kill_signal_error: kernel_kill.map_or(0, |(.., errno)| errno),
        observer_crossing: *observer_crossing.lock().unwrap(),
        agent_crossing,
        kernel_outcome: if mode.kernel_kills() { kernel_outcome } else { None },
        cache,
    })
}

/// What a run's kernel outcome is called in reports.
pub(super) fn outcome_name(o: Option<KillOutcome>) -> &'static str {
    o.map_or("no crossing seen", KillOutcome::name)
}
