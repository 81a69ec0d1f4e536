//! The in-kernel kill can never hit the wrong process: the real programs,
//! real cgroups and real processes, no agent (each test drives the signal
//! source itself, so nothing but the kernel kills).
//!
//! - A doomed mark whose cgroup is removed goes with it: a later cgroup
//!   (which may reuse the kernel's `struct mem_cgroup`) keeps its processes.
//! - The allocating task is killed however deep below the pod it runs.
//! - A victim asleep when another pod crosses the line is signalled by the
//!   kernel where it has `bpf_send_signal_task`, and left alone elsewhere.
//! - The reader is woken for a kernel kill only once the victim has exited.
//! - The refresh program knows the agent inside a pid namespace.
//! - One kill ends a fork storm: on cgroup v1 the cgroup is frozen, and
//!   its tasks read, only once it reads FROZEN; eviction's kill, which
//!   signals through pidfds without the freezer, ends one too.
//! - With reclaim-first on, a crossing by page-cache growth is left to the
//!   agent; anonymous growth is still killed in the kernel (where the
//!   memcg statistics tracepoint tells them apart).

use std::{
    os::unix::process::{CommandExt, ExitStatusExt},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use swiftlet::{
    cgroups::{CgroupFs, Version},
    signals::{
        CgroupKind, Direction, KernelVictim, KillOutcome, Signal, SignalEvent, SignalSource, Target, Threshold,
        ebpf::{EbpfOptions, EbpfSource},
        monotonic_ns,
    },
};
use swiftlet_tests::{cgroup::TestCgroup, prereq, tmpfs::SmallFs, workload};

const MIB: u64 = 1 << 20;

fn load(tc: &TestCgroup) -> Arc<EbpfSource> {
    prereq::require_root();
    prereq::require_btf();
    let opts = EbpfOptions { kernel_eviction: true, ..Default::default() };
    Arc::new(EbpfSource::load(tc.fs.clone(), &opts).expect("the kernel programs load"))
}

fn collect(src: &dyn SignalSource) -> Arc<Mutex<Vec<SignalEvent>>> {
    let events = Arc::new(Mutex::new(vec![]));
    let e = events.clone();
    src.subscribe(Arc::new(move |ev: SignalEvent| e.lock().unwrap().push(ev)));
    events
}

fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A kubepods line 4 MiB above what kubepods uses now, with `victim` as
/// its plan.
fn arm(src: &EbpfSource, kubepods: &str, victim: &str) {
    arm_with_process(src, kubepods, victim, 0);
}

/// [`arm`], the plan naming `tgid` as the victim's largest process.
fn arm_with_process(src: &EbpfSource, kubepods: &str, victim: &str, tgid: u32) {
    src.set_kernel_victim(
        &Target::Cgroup(kubepods.into()),
        Signal::MemoryWorkingSet,
        Some(KernelVictim { cgroup: victim, tgid, planned_ns: monotonic_ns(), max_age: None }),
    )
    .unwrap();
    let used = src.snapshot().unwrap().cgroups[kubepods].working_set_bytes;
    src.set_threshold(
        &Target::Cgroup(kubepods.into()),
        Signal::MemoryWorkingSet,
        Some(Threshold { trigger: used + 4 * MIB, rearm: used + 2 * MIB }),
    )
    .unwrap();
}

/// Allocates 16 MiB in `cgroup` (crossing the line); how the process
/// ended, or None when it was still alive 5 s later (then it is killed).
fn allocate(tc: &TestCgroup, cgroup: &str) -> Option<std::process::ExitStatus> {
    let mut c = Command::new(workload::binary());
    c.args(["hog", "512", "16"]).stdout(Stdio::null());
    workload::in_cgroup(&mut c, &tc.fs, cgroup);
    let mut child = c.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// The kernel's kill records: the victim, the task signalled as the
/// allocating one, and the signal helper's error if it refused.
fn kernel_kills(events: &Mutex<Vec<SignalEvent>>) -> Vec<(Option<String>, u32, i32)> {
    events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            SignalEvent::KernelKill { cgroup, pid, signal_error, .. } => Some((cgroup.clone(), *pid, *signal_error)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_doomed_mark_dies_with_its_cgroup() {
    let tc = TestCgroup::new();
    let src = load(&tc);
    let events = collect(&*src);
    let kubepods = tc.child("kubepods");
    let first = tc.child("kubepods/podfirst");
    src.register(&kubepods, CgroupKind::Kubepods).unwrap();
    src.register(&first, CgroupKind::Pod).unwrap();
    // The pod charges memory once, so the kernel knows its memcg.
    let mut warm = workload::Steps::spawn(&tc.fs, &first);
    warm.run("anon 1");
    let first_id = src.cgroup_id_of(&first).unwrap();
    arm(&src, &kubepods, &first);

    // The allocation crosses; the kernel kills the allocating task and
    // dooms the pod. The agent's part (clearing the mark) never comes.
    let status = allocate(&tc, &first);
    assert_eq!(status.and_then(|s| s.signal()), Some(libc::SIGKILL), "the kernel killed the allocating task");
    // The kill record reaches the reader thread in its own time.
    wait_for("the kernel's kill record", Duration::from_secs(5), || (!kernel_kills(&events).is_empty()).then_some(()));
    assert_eq!(kernel_kills(&events).len(), 1, "{:?}", events.lock().unwrap());
    assert_eq!(src.doomed(), Some(first_id), "the pod is doomed until someone clears the mark");
    drop(warm);

    // The pod goes; its mark goes with it.
    src.unregister(&first);
    tc.fs.remove(&first, Duration::from_secs(10)).unwrap();
    // Well before the mark's own deadline (5 s): the removal cleared it.
    wait_for("the doomed mark cleared at rmdir", Duration::from_secs(1), || src.doomed().is_none().then_some(()));

    // A new pod in its place (its memcg may be the freed one) keeps its
    // processes while they charge memory.
    let second = tc.child("kubepods/podsecond");
    let mut survivor = workload::Steps::spawn(&tc.fs, &second);
    for _ in 0..8 {
        survivor.run("anon 4");
    }
    survivor.run("free-anon");
    assert_eq!(kernel_kills(&events).len(), 1, "nothing else was killed");
}

#[test]
fn the_allocating_task_is_killed_at_any_depth_below_the_pod() {
    let tc = TestCgroup::new();
    let src = load(&tc);
    let events = collect(&*src);
    let kubepods = tc.child("kubepods");
    let pod = tc.child("kubepods/poddeep");
    let mut deep = "kubepods/poddeep".to_owned();
    for level in 1..=6 {
        deep = format!("{deep}/l{level}");
        tc.child(&deep);
    }
    let deep = format!("{}/{deep}", tc.root);
    src.register(&kubepods, CgroupKind::Kubepods).unwrap();
    src.register(&pod, CgroupKind::Pod).unwrap();
    // In the leaf (cgroup v2 keeps processes out of inner cgroups): its
    // charges reach the pod, whose memcg the kernel then knows.
    let mut warm = workload::Steps::spawn(&tc.fs, &deep);
    warm.run("anon 1");
    arm(&src, &kubepods, &pod);

    let status = allocate(&tc, &deep);
    assert_eq!(status.and_then(|s| s.signal()), Some(libc::SIGKILL), "six levels below the pod: killed by the kernel");
    wait_for("the kernel's kill record", Duration::from_secs(5), || (!kernel_kills(&events).is_empty()).then_some(()));
    let kills = kernel_kills(&events);
    assert_eq!(kills.len(), 1, "{:?}", events.lock().unwrap());
    assert_eq!(kills[0].0.as_deref(), Some(pod.as_str()));
    assert_eq!(kills[0].2, 0, "the signal helper accepted the allocating task");
    assert_ne!(kills[0].1, 0, "signalled as the allocating task");
    let outcome = wait_for("the crossing's record", Duration::from_secs(5), || {
        events.lock().unwrap().iter().find_map(|e| match e {
            SignalEvent::Crossing { direction: Direction::Up, kernel_outcome, .. } => Some(*kernel_outcome),
            _ => None,
        })
    });
    assert_eq!(outcome, KillOutcome::Executed);
}

/// Another pod's allocation crosses kubepods' line while the planned victim
/// sleeps: the kernel dooms the victim, and where it has
/// `bpf_send_signal_task` it signals the plan's process right then (no
/// agent runs here to do it). Elsewhere the sleeper lives on until its next
/// charge or the agent's kill.
#[test]
fn a_sleeping_victim_is_signalled_where_the_kernel_can() {
    let tc = TestCgroup::new();
    let src = load(&tc);
    let events = collect(&*src);
    let kubepods = tc.child("kubepods");
    let victim = tc.child("kubepods/podvictim");
    let other = tc.child("kubepods/podother");
    src.register(&kubepods, CgroupKind::Kubepods).unwrap();
    src.register(&victim, CgroupKind::Pod).unwrap();
    src.register(&other, CgroupKind::Pod).unwrap();
    // The victim charges memory once (the kernel learns its memcg), then
    // waits on its stdin.
    let mut sleeper = workload::Steps::spawn(&tc.fs, &victim);
    sleeper.run("anon 1");
    arm_with_process(&src, &kubepods, &victim, sleeper.pid());
    let can = swiftlet::signals::btf::Btf::from_sys_fs().expect("kernel BTF").has_func("bpf_send_signal_task");
    let kill_strategy = src.strategies().kill;
    assert_eq!(
        kill_strategy.contains("kfunc:bpf_send_signal_task"),
        can,
        "the kill strategy says what this kernel can do: {kill_strategy}"
    );

    // The other pod allocates 16 MiB and holds it.
    let mut c = Command::new(workload::binary());
    c.args(["hog", "512", "16"]).stdout(Stdio::null());
    workload::in_cgroup(&mut c, &tc.fs, &other);
    let mut hog = c.spawn().unwrap();
    wait_for("the kernel's kill record", Duration::from_secs(5), || (!kernel_kills(&events).is_empty()).then_some(()));
    let hog_status = hog.try_wait().unwrap();
    let _ = hog.kill();
    let _ = hog.wait();
    assert_eq!(hog_status, None, "the allocating pod is not the victim");
    assert_eq!(kernel_kills(&events), [(Some(victim.clone()), 0, 0)], "the victim doomed; no current task signalled");
    if can {
        let how = wait_for("the sleeping victim to die", Duration::from_secs(2), || sleeper.try_wait());
        assert_eq!(how.signal(), Some(libc::SIGKILL), "the kernel's SIGKILL: {how:?}");
    } else {
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(sleeper.try_wait(), None, "nothing here may signal another task: the sleeper lives");
    }
    drop(sleeper);
    src.unregister(&victim);
    src.unregister(&other);
}

/// The reader is woken for a kernel kill only once the killed task has
/// exited: woken at the kill, on the victim's CPU, it would run before the
/// victim met its signal (under SCHED_FIFO, always). Three rounds, each
/// with a pod of its own.
#[test]
fn the_reader_is_woken_for_a_kernel_kill_once_the_victim_has_exited() {
    let tc = TestCgroup::new();
    prereq::require_root();
    prereq::require_btf();
    // As the agent runs it (`--eviction-realtime-priority`'s default).
    let opts = EbpfOptions { kernel_eviction: true, reader_priority: Some(10), ..Default::default() };
    let src = Arc::new(EbpfSource::load(tc.fs.clone(), &opts).expect("the kernel programs load"));
    let events = collect(&*src);
    let kubepods = tc.child("kubepods");
    src.register(&kubepods, CgroupKind::Kubepods).unwrap();
    for round in 0..3 {
        let pod = tc.child(&format!("kubepods/podwake{round}"));
        src.register(&pod, CgroupKind::Pod).unwrap();
        let mut warm = workload::Steps::spawn(&tc.fs, &pod);
        warm.run("anon 1");
        arm(&src, &kubepods, &pod);
        let from = events.lock().unwrap().len();
        // Slow enough (4 MiB to the line at 64 MiB/s) for the exit watch to
        // be in place before the crossing.
        let mut c = Command::new(workload::binary());
        c.args(["hog", "64", "16"]).stdout(Stdio::null());
        workload::in_cgroup(&mut c, &tc.fs, &pod);
        let mut hog = c.spawn().unwrap();
        src.watch_exit(hog.id()).unwrap();
        let status = hog.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "round {round}: killed by the kernel");
        let (kill_pid, signal_error, kill_received) =
            wait_for("the kernel's kill record", Duration::from_secs(5), || {
                events.lock().unwrap()[from..].iter().find_map(|e| match e {
                    SignalEvent::KernelKill { pid, signal_error, received_ns, .. } => {
                        Some((*pid, *signal_error, *received_ns))
                    }
                    _ => None,
                })
            });
        let exited = wait_for("the victim's exit record", Duration::from_secs(5), || {
            events.lock().unwrap()[from..].iter().find_map(|e| match e {
                SignalEvent::ProcessExit { pid, at_ns, .. } if *pid == hog.id() => Some(*at_ns),
                _ => None,
            })
        });
        assert_eq!((kill_pid, signal_error), (hog.id(), 0), "round {round}: signalled as the allocating task");
        assert!(
            kill_received >= exited,
            "round {round}: the reader took the kill record {} µs before the victim exited",
            (exited - kill_received) / 1000
        );
        drop(warm);
        src.unregister(&pod);
        src.set_kernel_victim(&Target::Cgroup(kubepods.clone()), Signal::MemoryWorkingSet, None).unwrap();
        tc.fs.remove(&pod, Duration::from_secs(10)).unwrap();
    }
}

/// The outcome of the first upward crossing recorded after `from` events.
fn crossing_outcome(events: &Mutex<Vec<SignalEvent>>, from: usize) -> KillOutcome {
    wait_for("the crossing's record", Duration::from_secs(5), || {
        events.lock().unwrap()[from..].iter().find_map(|e| match e {
            SignalEvent::Crossing { direction: Direction::Up, kernel_outcome, .. } => Some(*kernel_outcome),
            _ => None,
        })
    })
}

/// Reclaim-first: what crossed the line decides whether the kernel kills.
/// tmpfs pages are counted as file pages (NR_FILE_PAGES), as page cache
/// is: the kernel defers the crossing to the agent (which, finding no
/// page cache to reclaim, evicts). Anonymous pages are killed at the
/// crossing as before. The page-counter strategy cannot tell them apart:
/// every memory crossing is deferred there.
#[test]
fn with_reclaim_first_only_anonymous_growth_is_killed_in_the_kernel() {
    let tc = TestCgroup::new();
    let src = load(&tc);
    src.set_reclaim_first(true);
    let events = collect(&*src);
    let kubepods = tc.child("kubepods");
    let pod = tc.child("kubepods/podcache");
    src.register(&kubepods, CgroupKind::Kubepods).unwrap();
    src.register(&pod, CgroupKind::Pod).unwrap();
    let stat_events = SignalSource::strategies(&*src)
        .iter()
        .any(|(signal, strategy)| *signal == "memory" && strategy.contains("mod_memcg_lruvec_state"));
    let mut cache = workload::Steps::spawn(&tc.fs, &pod);
    cache.run("anon 1");
    let shm = SmallFs::mount(64 * MIB, 1024);

    arm(&src, &kubepods, &pod);
    let from = events.lock().unwrap().len();
    cache.run(&format!("cache 16 {}", shm.path().display()));
    let outcome = crossing_outcome(&events, from);
    if stat_events {
        assert_eq!(outcome, KillOutcome::DeferredFileGrowth);
    } else {
        // A page counter says nothing of what was charged (an LRU-size
        // hook, which sees file pages only, may see the crossing first).
        assert!(outcome.deferred(), "{outcome:?}");
    }
    // Alive: it answers.
    cache.run("uncache");
    assert!(kernel_kills(&events).is_empty(), "nothing killed for file pages: {:?}", events.lock().unwrap());

    // Below the line again, re-armed, then anonymous memory crosses it.
    let from = events.lock().unwrap().len();
    arm(&src, &kubepods, &pod);
    let status = allocate(&tc, &pod);
    if stat_events {
        assert_eq!(status.and_then(|s| s.signal()), Some(libc::SIGKILL), "anonymous growth: killed at the crossing");
        assert_eq!(crossing_outcome(&events, from), KillOutcome::Executed);
    } else {
        let outcome = crossing_outcome(&events, from);
        assert!(outcome.deferred(), "{outcome:?}");
        assert!(kernel_kills(&events).is_empty(), "the page-counter strategy leaves every crossing to the agent");
    }
    drop(cache);
}

/// The part run inside a new pid namespace (as PID 1 there), by the test
/// below: the refresh must run for this process and execute its line.
#[test]
#[ignore = "run by the_refresh_knows_the_agent_in_a_pid_namespace, inside a new pid namespace"]
fn refresh_inside_a_pid_namespace() {
    assert_eq!(std::process::id(), 1, "this part runs as PID 1 of a new pid namespace");
    let tc = TestCgroup::new();
    let src = load(&tc);
    let events = collect(&*src);
    let cg = tc.child("idle");
    src.register(&cg, CgroupKind::Pod).unwrap();
    let mut w = workload::Steps::spawn(&tc.fs, &cg);
    w.run("anon 16");
    let before = src.refresh_runs();
    src.snapshot().unwrap();
    assert!(src.refresh_runs() > before, "a snapshot runs this instance's refresh");
    // A line below what the idle cgroup holds: only the refresh (run by
    // set_threshold) can see it crossed, the cgroup charges nothing more.
    src.set_threshold(
        &Target::Cgroup(cg.clone()),
        Signal::MemoryWorkingSet,
        Some(Threshold { trigger: MIB, rearm: 0 }),
    )
    .unwrap();
    wait_for("the refresh's crossing", Duration::from_secs(5), || {
        events
            .lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, SignalEvent::Crossing { direction: Direction::Up, pid: 0, .. }))
            .then_some(())
    });
    println!("PIDNS_REFRESH_OK");
}

#[test]
fn the_refresh_knows_the_agent_in_a_pid_namespace() {
    prereq::require_root();
    let exe = std::env::current_exe().unwrap();
    // `sh` forks the test binary into the namespace this unshare made for
    // sh's children. (The command after it keeps a shell such as busybox's
    // from exec'ing it in place: sh itself stays in the old namespace, where
    // its threads could not be made.)
    let mut c = Command::new("sh");
    c.args(["-c", "\"$0\" --exact refresh_inside_a_pid_namespace --ignored --nocapture; exit $?"]).arg(&exe);
    // SAFETY: unshare(2) only, between fork and exec.
    unsafe {
        c.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWPID) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = c.output().expect("run the inner test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("PIDNS_REFRESH_OK"),
        "inside a pid namespace: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn one_kill_ends_a_fork_storm() {
    fork_storms_end_at_one_kill(|fs, cg| {
        fs.kill_all(cg).unwrap();
    });
}

#[test]
fn one_eviction_kill_ends_a_fork_storm_without_the_freezer() {
    fork_storms_end_at_one_kill(|fs, cg| {
        let signalled = fs.kill_listed(cg).unwrap();
        // On v1 the count is the processes the pidfds signalled: at least
        // the 200 the storm had when the kill began.
        assert!(fs.version() == Version::V2 || signalled >= 200, "{cg}: {signalled} signalled");
    });
}

/// Ten rounds of a fork storm in a cgroup of its own, each ended by one
/// call of `kill`, then every process gone within 5 s.
fn fork_storms_end_at_one_kill(kill: impl Fn(&CgroupFs, &str)) {
    prereq::require_root();
    let tc = TestCgroup::new();
    for round in 0..10 {
        let cg = tc.child(&format!("storm{round}"));
        let mut c = Command::new(workload::binary());
        // 1 + 30 + 900 processes, the last 900 forked by 30 at once.
        c.args(["forkstorm", "30", "2"]);
        workload::in_cgroup(&mut c, &tc.fs, &cg);
        let mut storm = c.spawn().unwrap();
        wait_for("the storm under way", Duration::from_secs(10), || {
            (tc.fs.procs_recursive(&cg).map_or(0, |p| p.len()) >= 200).then_some(())
        });
        kill(&tc.fs, &cg);
        let _ = storm.wait();
        wait_for(&format!("round {round}: every process gone after one kill"), Duration::from_secs(5), || {
            tc.fs.procs_recursive(&cg).is_ok_and(|p| p.is_empty()).then_some(())
        });
    }
}
