//! The eviction manager end to end on this machine: real cgroups, the real
//! signal source, real processes as pods, a kubepods cgroup limited to
//! allocatable. A BestEffort pod ramps memory past
//! allocatableMemory.available and must be killed before the kernel's OOM
//! killer fires, while a Guaranteed pod beside it keeps running.

use std::{
    collections::BTreeSet,
    io::BufRead,
    os::unix::process::ExitStatusExt,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use swiftlet::{
    eviction::{
        core::EvictionConfig,
        driver::{DriverConfig, EvictionContainer, EvictionManager, EvictionPod, KillPath},
        observe::NodeInfo,
        signal::{EvictionSignal, EvictionThreshold, NodeCondition, ThresholdValue},
    },
    metrics::Metrics,
    quantity::Quantity,
    signals::{self, SignalEvent, SourceChoice, ebpf::EbpfOptions, node},
};
use swiftlet_tests::{cgroup::TestCgroup, pods::FakePods, prereq, workload};
use tokio_util::sync::CancellationToken;

const MIB: u64 = 1 << 20;
const ALLOCATABLE: u64 = 1024 * MIB;

fn pod(uid: &str, cgroup: &str, memory_request: u64) -> EvictionPod {
    EvictionPod {
        uid: uid.into(),
        namespace: "default".into(),
        name: uid.into(),
        cgroup: cgroup.into(),
        termination_grace_secs: 30,
        memory_request,
        containers: vec![EvictionContainer { name: "main".into(), memory_request, cgroup: Some(cgroup.into()) }],
        ..Default::default()
    }
}

fn oom_kills(fs: &swiftlet::cgroups::CgroupFs, cg: &str) -> u64 {
    let dir = fs.memory_dir(cg);
    let text = std::fs::read_to_string(dir.join("memory.oom_control"))
        .or_else(|_| std::fs::read_to_string(dir.join("memory.events")))
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill ").and_then(|v| v.trim().parse().ok()))
        .expect("oom_kill counter")
}

/// Every set of conditions the manager publishes, in order.
fn record_conditions(
    rt: &tokio::runtime::Runtime,
    manager: &EvictionManager,
) -> Arc<Mutex<Vec<BTreeSet<NodeCondition>>>> {
    let seen = Arc::new(Mutex::new(vec![]));
    let mut rx = manager.conditions();
    let s = seen.clone();
    rt.spawn(async move {
        loop {
            s.lock().unwrap().push(rx.borrow_and_update().clone());
            if rx.changed().await.is_err() {
                break;
            }
        }
    });
    seen
}

fn race(choice: SourceChoice, poll: Duration, kernel_eviction: bool, sleepers_in_victim: usize) {
    prereq::require_root();
    prereq::require_btf();
    let tc = TestCgroup::new();
    let kubepods = tc.child("kubepods");
    // enforceNodeAllocatable=pods: the kernel OOM-kills at allocatable.
    tc.fs.set_memory_limit(&kubepods, Some(ALLOCATABLE)).unwrap();
    let besteffort_pod = tc.child("kubepods/besteffort/podhog");
    let guaranteed_pod = tc.child("kubepods/podsteady");

    let opened =
        signals::open(choice, tc.fs.clone(), &EbpfOptions { kernel_eviction, ..Default::default() }, poll).unwrap();
    assert_eq!(opened.source.mode().as_str(), if choice == SourceChoice::Ebpf { "ebpf" } else { "cgroupfs" });
    let pods = Arc::new(FakePods::new(vec![pod("hog", &besteffort_pod, 0), pod("steady", &guaranteed_pod, 128 * MIB)]));
    let threshold = EvictionThreshold {
        signal: EvictionSignal::AllocatableMemoryAvailable,
        value: ThresholdValue::Quantity(Quantity::from_units((256 * MIB) as i64)),
        grace_period: Duration::ZERO,
        min_reclaim: None,
    };
    let cfg = DriverConfig {
        eviction: EvictionConfig {
            thresholds: vec![threshold],
            pressure_transition_period: Duration::from_secs(2),
            max_pod_grace_period_secs: 0,
        },
        node: NodeInfo {
            memory_capacity: node::mem_total().unwrap(),
            allocatable_memory: ALLOCATABLE,
            pid_limit: node::pid_limit().unwrap(),
            kubepods_cgroup: kubepods.clone(),
        },
        nodefs_path: env!("CARGO_TARGET_TMPDIR").into(),
        imagefs_path: None,
        housekeeping_interval: Duration::from_secs(2),
        plan_interval: Duration::from_millis(200),
        kernel_eviction,
        reclaim_before_eviction: false,
    };
    let metrics = Arc::new(Metrics::new());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (manager, event_loop) = EvictionManager::new(
        cfg,
        opened.source.clone(),
        tc.fs.clone(),
        pods.clone(),
        pods.clone(),
        None,
        metrics.clone(),
    );
    let mut events = manager.events();
    let conditions = record_conditions(&rt, &manager);
    let stop_tx = CancellationToken::new();
    let stop_rx = stop_tx.clone();
    let task = rt.spawn(event_loop.run(stop_rx));

    let mut steady = workload::Steps::spawn(&tc.fs, &guaranteed_pod);
    steady.run("anon 64");
    // The plan must rank the hog first before it starts.
    let deadline = Instant::now() + Duration::from_secs(10);
    while manager.plan(EvictionSignal::AllocatableMemoryAvailable).first().map(|v| v.uid.as_str()) != Some("hog") {
        assert!(
            Instant::now() < deadline,
            "no victim plan: {:?}",
            manager.plan(EvictionSignal::AllocatableMemoryAvailable)
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // Other processes of the victim pod, which do not allocate: the kernel
    // must find and kill them too.
    let mut sleepers: Vec<std::process::Child> = (0..sleepers_in_victim)
        .map(|_| {
            let mut c = std::process::Command::new(workload::binary());
            c.arg("sleep");
            workload::in_cgroup(&mut c, &tc.fs, &besteffort_pod);
            c.spawn().unwrap()
        })
        .collect();
    let mut cmd = std::process::Command::new(workload::binary());
    cmd.args(["hog", "256", "2048"]).stdout(std::process::Stdio::null());
    workload::in_cgroup(&mut cmd, &tc.fs, &besteffort_pod);
    let started = Instant::now();
    let mut hog = cmd.spawn().unwrap();
    let status = hog.wait().unwrap();
    println!("[{}] hog ended after {:?}: {status}", opened.source.mode().as_str(), started.elapsed());
    assert_eq!(status.signal(), Some(libc::SIGKILL));

    let deadline = Instant::now() + Duration::from_secs(15);
    while pods.evictions().is_empty() {
        assert!(Instant::now() < deadline, "no eviction was recorded");
        std::thread::sleep(Duration::from_millis(20));
    }
    let ev = &pods.evictions()[0];
    println!("[{}] eviction: {} killed={:?}: {}", opened.source.mode().as_str(), ev.name, ev.killed, ev.message);
    assert_eq!(ev.uid, "hog");
    assert_eq!(ev.signal, EvictionSignal::AllocatableMemoryAvailable);
    assert_eq!(ev.killed, if kernel_eviction { KillPath::Kernel } else { KillPath::Agent });
    for s in &mut sleepers {
        let st = s.wait().unwrap();
        assert_eq!(st.signal(), Some(libc::SIGKILL), "every process of the victim pod dies");
    }
    assert_eq!(ev.grace_period_secs, 0);
    assert!(
        ev.message.starts_with("The node was low on resource: memory. Threshold quantity: 256Mi, available: "),
        "{}",
        ev.message
    );
    assert!(ev.message.contains("Signal: allocatableMemory.available."), "{}", ev.message);
    assert_eq!(pods.evictions().len(), 1, "one pod was enough: {:?}", pods.evictions());

    // The Guaranteed pod is untouched, and the kernel never had to OOM-kill.
    steady.run("anon 1");
    assert_eq!(oom_kills(&tc.fs, &kubepods), 0, "the kernel OOM killer fired in kubepods");
    let mut oom_events = vec![];
    while let Ok(e) = events.try_recv() {
        if matches!(e, SignalEvent::OomKill { .. }) {
            oom_events.push(e);
        }
    }
    assert!(oom_events.is_empty(), "OOM kill events: {oom_events:?}");
    assert!(
        conditions.lock().unwrap().iter().any(|c| c.contains(&NodeCondition::MemoryPressure)),
        "MemoryPressure was reported: {:?}",
        conditions.lock().unwrap()
    );
    // And cleared once the transition period (2 s) has passed without the
    // threshold met (housekeeping every 2 s notices).
    let deadline = Instant::now() + Duration::from_secs(10);
    while manager.conditions().borrow().contains(&NodeCondition::MemoryPressure) {
        assert!(Instant::now() < deadline, "MemoryPressure still reported 10 s after the eviction");
        std::thread::sleep(Duration::from_millis(50));
    }
    let exposition = metrics.encode();
    let evictions_line =
        exposition.lines().find(|l| l.starts_with("kubelet_evictions_total{")).unwrap_or_default().to_owned();
    println!("[{}] {evictions_line}", opened.source.mode().as_str());
    assert!(evictions_line.contains("eviction_signal=\"allocatableMemory.available\"} 1"), "{exposition}");
    for l in exposition.lines().filter(|l| l.starts_with("swiftlet_eviction_crossing_to_") && l.contains("_sum")) {
        println!("[{}] {l}", opened.source.mode().as_str());
    }
    if kernel_eviction {
        assert!(
            exposition
                .lines()
                .any(|l| l.starts_with("swiftlet_eviction_crossing_to_kill_seconds_count{path=\"kernel\"} 1")),
            "{exposition}"
        );
    }
    stop_tx.cancel();
    rt.block_on(task).unwrap();
}

#[test]
fn besteffort_hog_is_evicted_before_the_oom_killer_ebpf() {
    race(SourceChoice::Ebpf, Duration::from_secs(10), false, 2);
}

#[test]
fn besteffort_hog_is_evicted_before_the_oom_killer_cgroupfs_100ms() {
    race(SourceChoice::Cgroupfs, Duration::from_millis(100), false, 2);
}

/// Issue 11: the kernel kills the planned victim at the crossing.
#[test]
fn the_kernel_kills_the_planned_victim_at_the_crossing() {
    race(SourceChoice::Ebpf, Duration::from_secs(10), true, 3);
}

/// Issue 12: without eBPF, on cgroup v2, the memory.high tripwire and
/// memory.events wake the cgroupfs source, so even with the kubelet's 10 s
/// poll the hog is evicted before the OOM killer.
#[test]
#[ignore = "cgroup v2 only: runs in the kernel matrix (cargo xtask vmtest)"]
fn besteffort_hog_is_evicted_before_the_oom_killer_cgroupfs_v2_events() {
    let version = swiftlet::cgroups::CgroupFs::detect().map(|c| c.version());
    assert!(
        matches!(version, Ok(swiftlet::cgroups::Version::V2)),
        "this test needs cgroup v2 ({version:?}); run it in the kernel matrix (cargo xtask vmtest)"
    );
    race(SourceChoice::Cgroupfs, Duration::from_secs(10), false, 2);
}

/// PID pressure ranks pods by their tasks, threads included: one process
/// with 2,000 threads goes, not its neighbour with five processes (which
/// a ranking by processes would pick). The line is set just below where
/// the node already is, so the crossing comes at once whatever else the
/// machine runs.
#[test]
fn a_thread_bomb_is_evicted_before_a_pod_with_more_processes() {
    prereq::require_root();
    prereq::require_btf();
    const THREADS: u64 = 2000;
    let tc = TestCgroup::new();
    let kubepods = tc.child("kubepods");
    let bomb_pod = tc.child("kubepods/besteffort/podbomb");
    let neighbour_pod = tc.child("kubepods/besteffort/podneighbour");
    let mut neighbours: Vec<std::process::Child> = (0..5)
        .map(|_| {
            let mut c = std::process::Command::new(workload::binary());
            c.arg("sleep");
            workload::in_cgroup(&mut c, &tc.fs, &neighbour_pod);
            c.spawn().unwrap()
        })
        .collect();
    let mut c = std::process::Command::new(workload::binary());
    c.args(["threads", &THREADS.to_string()]).stdout(std::process::Stdio::piped());
    workload::in_cgroup(&mut c, &tc.fs, &bomb_pod);
    let mut bomb = c.spawn().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(bomb.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), format!("threads {THREADS}"), "the bomb started its threads");
    let tasks = tc.fs.pids_current(&bomb_pod).expect("the pids controller counts the bomb's tasks");
    assert!(tasks > THREADS, "{tasks} tasks in the bomb's pod");

    let opened = signals::open(
        SourceChoice::Ebpf,
        tc.fs.clone(),
        &EbpfOptions { kernel_eviction: true, ..Default::default() },
        Duration::from_secs(10),
    )
    .unwrap();
    let pid_limit = node::pid_limit().unwrap();
    let node_tasks = opened.source.snapshot().unwrap().node.tasks;
    // pid.available < limit − (tasks − 200): met now, by 200 tasks.
    let threshold = pid_limit - (node_tasks - 200);
    let pods = Arc::new(FakePods::new(vec![pod("bomb", &bomb_pod, 0), pod("neighbour", &neighbour_pod, 0)]));
    let cfg = DriverConfig {
        eviction: EvictionConfig {
            thresholds: vec![EvictionThreshold {
                signal: EvictionSignal::PidAvailable,
                value: ThresholdValue::Quantity(Quantity::from_units(threshold as i64)),
                grace_period: Duration::ZERO,
                min_reclaim: None,
            }],
            pressure_transition_period: Duration::from_secs(2),
            max_pod_grace_period_secs: 0,
        },
        node: NodeInfo {
            memory_capacity: node::mem_total().unwrap(),
            allocatable_memory: ALLOCATABLE,
            pid_limit,
            kubepods_cgroup: kubepods.clone(),
        },
        nodefs_path: env!("CARGO_TARGET_TMPDIR").into(),
        imagefs_path: None,
        housekeeping_interval: Duration::from_secs(2),
        plan_interval: Duration::from_millis(200),
        kernel_eviction: true,
        reclaim_before_eviction: false,
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_manager, event_loop) = EvictionManager::new(
        cfg,
        opened.source.clone(),
        tc.fs.clone(),
        pods.clone(),
        pods.clone(),
        None,
        Arc::new(Metrics::new()),
    );
    let stop_tx = CancellationToken::new();
    let stop_rx = stop_tx.clone();
    let task = rt.spawn(event_loop.run(stop_rx));
    let deadline = Instant::now() + Duration::from_secs(15);
    while pods.evictions().is_empty() {
        assert!(Instant::now() < deadline, "nothing was evicted within 15 s of a line 200 tasks below the node");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_secs(1));
    let evicted: Vec<String> = pods.evictions().iter().map(|e| e.uid.clone()).collect();
    for e in pods.evictions() {
        println!("evicted {} by {:?}: {}", e.uid, e.killed, e.message);
    }
    assert_eq!(evicted, ["bomb"], "the thread bomb alone");
    assert!(pods.evictions()[0].message.starts_with("The node was low on resource: pids."));
    assert_eq!(bomb.wait().unwrap().signal(), Some(libc::SIGKILL));
    for n in &mut neighbours {
        assert!(n.try_wait().unwrap().is_none(), "the neighbour's processes live on");
    }
    stop_tx.cancel();
    rt.block_on(task).unwrap();
    for mut n in neighbours {
        let _ = n.kill();
        let _ = n.wait();
    }
}
