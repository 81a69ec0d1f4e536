//! Portability: the feature probes pick the most exact hooks the
//! running kernel offers, every memory strategy it supports keeps the
//! working set exact, and on cgroup v2 the cgroupfs fallback is woken by the
//! kernel and the cgroup files read and act as the agent expects.
//!
//! The cgroup v2 tests are `#[ignore]`d because this host is cgroup v1
//! (hybrid); `cargo xtask vmtest` runs them with `--include-ignored` on
//! Debian's 6.1 and 6.12 kernels, where the hierarchy is v2.

use std::{
    os::unix::process::ExitStatusExt,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use swiftlet::{
    cgroups::{CgroupFs, Version},
    metrics::Metrics,
    signals::{
        CgroupKind, Direction, SignalEvent, SignalSource, Target, Threshold,
        btf::Btf,
        cgroupfs::CgroupfsSource,
        ebpf::{EbpfOptions, EbpfSource},
        page_size,
        probe::{self, InactiveHook, MemoryStrategy},
    },
};
use swiftlet_common::Signal;
use swiftlet_tests::{cgroup::TestCgroup, prereq, workload};

const MIB: u64 = 1 << 20;

fn btf() -> Btf {
    prereq::require_btf();
    Btf::from_sys_fs().expect("kernel BTF")
}

/// The loader attaches the first strategy the probes rank highest on this
/// kernel, and the metric names it.
#[test]
fn strategy_probe_picks_the_most_exact_hooks() {
    prereq::require_root();
    let tc = TestCgroup::new();
    // What loading costs, by phase (on an emulated CPU it is seconds).
    let t = Instant::now();
    let btf = btf();
    let parse_btf = t.elapsed();
    let layout = swiftlet::signals::layout::kernel_layout(&btf)
        .unwrap_or_else(|e| panic!("this kernel's BTF must give the programs' layout: {e}"));
    let t = Instant::now();
    let src = EbpfSource::load(tc.fs.clone(), &EbpfOptions::default())
        .unwrap_or_else(|e| panic!("the eBPF programs must load and attach on this kernel: {e}"));
    println!(
        "load: parsing BTF {:.2}s, whole load {:.2}s; node statistics over {} NUMA node(s) (0: from deltas)",
        parse_btf.as_secs_f64(),
        t.elapsed().as_secs_f64(),
        layout.nr_node_ids
    );
    let s = src.strategies();
    for (signal, strategy) in s.pairs() {
        println!("STRATEGY {signal}={strategy}");
    }
    for p in &s.passed_over {
        println!("passed over: {p}");
    }
    let verified = src.verified_instructions();
    println!(
        "verifier: {} instructions processed in all ({verified:?})",
        verified.iter().map(|(_, n)| *n as u64).sum::<u64>()
    );
    let expected = if btf.tracepoint_args("mod_memcg_lruvec_state").is_some() {
        MemoryStrategy::StatTracepoint
    } else if probe::lru_gen_enabled() {
        MemoryStrategy::PageCounter(InactiveHook::ModLruvecState)
    } else {
        MemoryStrategy::PageCounter(InactiveHook::UpdateLruSize)
    };
    assert_eq!(s.memory, expected, "memory strategy; passed over: {:?}", s.passed_over);
    let oom = match btf.tracepoint_arg_is_pointer("mark_victim", 0) {
        Some(true) => "tp_btf:mark_victim(task)",
        Some(false) => "tp_btf:mark_victim(pid)+process table",
        None => panic!("this kernel has no BTF tracepoint mark_victim"),
    };
    assert_eq!(s.oom, oom);
    // A victim doomed outside its context is signalled by the kernel where
    // it has the kfunc that can (6.13 and later).
    let kill = if btf.has_func("bpf_send_signal_task") { probe::KILL_SIGNAL_TASK } else { probe::KILL_HELPER };
    assert_eq!(s.kill, kill, "passed over: {:?}", s.passed_over);
    // Where the node comes from the kernel's per-node statistics, it is read
    // again where the kernel folds its per-CPU statistics (idle entry).
    let programs: Vec<String> = src.program_stats().into_iter().map(|(name, ..)| name).collect();
    assert_eq!(
        programs.iter().any(|p| p == "node_fold"),
        layout.nr_node_ids != 0,
        "node_fold attached exactly where the node's statistics are the kernel's ({} NUMA nodes); attached: {programs:?}; passed over: {:?}",
        layout.nr_node_ids,
        s.passed_over
    );

    let metrics = Metrics::new();
    metrics.set_signal_strategies(&s.pairs());
    let text = metrics.encode();
    let line = format!("swiftlet_signal_strategy{{signal=\"memory\",strategy=\"{}\"}} 1", s.memory.name());
    assert!(text.contains(&line), "{line} missing from:\n{text}");
}

/// The tolerance between the kernel's working set and cgroupfs: both read
/// the same page counter, but memory.stat's inactive_file is flushed
/// lazily, up to MEMCG_CHARGE_BATCH (64) pages per CPU behind; twice that
/// covers a flush racing the read.
fn tolerance_bytes() -> u64 {
    let cpus = std::thread::available_parallelism().map(|n| n.get() as u64).unwrap_or(2);
    2 * 64 * cpus * page_size()
}

/// Steps through anonymous memory and page cache, comparing the source's
/// working set with cgroupfs `usage − inactive_file` after each.
fn working_set_steps(src: &dyn SignalSource, tc: &TestCgroup, label: &str) {
    let cg = tc.child(&format!("ws-{}", label.replace([':', '+', '/'], "-")));
    src.register(&cg, CgroupKind::Pod).unwrap();
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("kws-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut w = workload::Steps::spawn(&tc.fs, &cg);
    let tol = tolerance_bytes();
    for step in [
        "anon 48".to_owned(),
        format!("cache 32 {}", dir.display()),
        "anon 16".into(),
        "free-anon".into(),
        "uncache".into(),
    ] {
        w.run(&step);
        let ours = src.snapshot().unwrap().cgroups[&cg];
        let usage = tc.fs.memory_usage(&cg).unwrap();
        let inactive = tc.fs.memory_stat(&cg).unwrap().inactive_file;
        let truth = usage.saturating_sub(inactive);
        let diff = ours.working_set_bytes.abs_diff(truth);
        println!(
            "{label}: after `{step}`: working set {} KiB, cgroupfs {} KiB (usage {} KiB, inactive_file {} KiB), diff {} KiB, tolerance {} KiB",
            ours.working_set_bytes / 1024,
            truth / 1024,
            usage / 1024,
            inactive / 1024,
            diff / 1024,
            tol / 1024
        );
        assert!(diff <= tol, "{label}: working set off by {diff} bytes after `{step}` (tolerance {tol})");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Each memory strategy this kernel supports, forced one after the other,
/// keeps the working set within the batching tolerance of cgroupfs. The
/// ones the kernel refuses (fentry where BPF trampolines are not allowed,
/// mem_cgroup_update_lru_size under the multi-gen LRU) are named.
#[test]
fn every_memory_strategy_this_kernel_supports_tracks_cgroupfs() {
    prereq::require_root();
    prereq::require_btf();
    let tc = TestCgroup::new();
    let mut tested = vec![];
    for strategy in MemoryStrategy::ALL {
        let opts = EbpfOptions { memory_strategy: Some(strategy), ..Default::default() };
        match EbpfSource::load(tc.fs.clone(), &opts) {
            Ok(src) => {
                assert_eq!(src.strategies().memory, strategy);
                working_set_steps(&src, &tc, strategy.name());
                tested.push(strategy.name());
            }
            Err(e) => println!("{strategy}: not available here: {}", first_line(&e.to_string())),
        }
    }
    println!("strategies tested: {tested:?}");
    assert!(!tested.is_empty(), "no memory strategy loads on this kernel");
}

fn first_line(s: &str) -> &str {
    s.split(". Verifier output").next().unwrap_or(s)
}

fn require_v2(tc: &TestCgroup) {
    assert_eq!(
        tc.fs.version(),
        Version::V2,
        "this test needs a cgroup v2 hierarchy with the memory controller; run it in the kernel matrix (cargo xtask vmtest)"
    );
}

/// Without eBPF, on cgroup v2, the memory.high tripwire at the line wakes
/// the cgroupfs source: with a 30 s poll the crossing arrives in seconds.
#[test]
#[ignore = "cgroup v2 only: runs in the kernel matrix (cargo xtask vmtest)"]
fn v2_events_report_a_crossing_long_before_the_poll() {
    prereq::require_root();
    let tc = TestCgroup::new();
    require_v2(&tc);
    let cg = tc.child("events");
    let src = CgroupfsSource::start(tc.fs.clone(), Duration::from_secs(30));
    println!("STRATEGY fallback={}", src.strategy());
    assert!(src.strategy().contains("memory.high"), "{}", src.strategy());
    let events = Arc::new(Mutex::new(Vec::new()));
    let e = events.clone();
    src.subscribe(Arc::new(move |ev: SignalEvent| e.lock().unwrap().push((ev, Instant::now()))));
    src.register(&cg, CgroupKind::Pod).unwrap();
    let target = Target::Cgroup(cg.clone());
    let trigger = 48 * MIB;
    src.set_threshold(&target, Signal::MemoryWorkingSet, Some(Threshold { trigger, rearm: 40 * MIB })).unwrap();
    let high = tc.fs.memory_dir(&cg).join("memory.high");
    assert_eq!(std::fs::read_to_string(&high).unwrap().trim(), trigger.to_string(), "the tripwire is set");

    let mut cmd = Command::new(workload::binary());
    cmd.args(["hog", "64", "96"]).stdout(Stdio::null());
    workload::in_cgroup(&mut cmd, &tc.fs, &cg);
    let started = Instant::now();
    let mut hog = cmd.spawn().unwrap();
    let deadline = started + Duration::from_secs(20);
    let (value, at) = loop {
        let found = events.lock().unwrap().iter().find_map(|(ev, at)| match ev {
            SignalEvent::Crossing { target: t, direction: Direction::Up, value, .. } if *t == target => {
                Some((*value, *at))
            }
            _ => None,
        });
        if let Some(f) = found {
            break f;
        }
        assert!(Instant::now() < deadline, "no crossing within 20 s (the poll is every 30 s)");
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = hog.kill();
    let _ = hog.wait();
    let counters = src.counters();
    println!(
        "crossing at {} MiB, {:.2}s after the hog started; counters {counters:?}",
        value / MIB,
        (at - started).as_secs_f64()
    );
    assert!(value >= trigger);
    let wakeups = counters.iter().find(|(n, _)| *n == "wakeups").map_or(0, |c| c.1);
    assert!(wakeups >= 1, "a kernel notification, not the poll, reported it: {counters:?}");
    drop(src);
    assert_eq!(std::fs::read_to_string(&high).unwrap().trim(), "max", "the tripwire is removed with the source");
}

/// cgroup v2 for real: memory.current and memory.stat, pids.current,
/// memory.max and pids.max, and cgroup.kill killing a whole subtree.
#[test]
#[ignore = "cgroup v2 only: runs in the kernel matrix (cargo xtask vmtest)"]
fn cgroup_v2_readings_limits_and_kill() {
    prereq::require_root();
    let tc = TestCgroup::new();
    require_v2(&tc);
    // Killed processes count in pids.current until reaped; orphans (the
    // workload's children) come to us to reap, whatever PID 1 does.
    // SAFETY: prctl with an integer argument.
    assert_eq!(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) }, 0);
    let fs: &CgroupFs = &tc.fs;
    let cg = tc.child("v2");
    // v2 has no processes in inner cgroups: the pod's processes live in
    // leaves (containers), as a runtime puts them.
    let main = tc.child("v2/main");
    let nested = tc.child("v2/nested");
    fs.set_memory_limit(&cg, Some(256 * MIB)).unwrap();
    assert_eq!(std::fs::read_to_string(fs.memory_dir(&cg).join("memory.max")).unwrap().trim(), "268435456");
    assert_eq!(fs.memory_limit(&cg).unwrap(), Some(256 * MIB));
    fs.set_pids_max(&cg, Some(64)).unwrap();
    assert_eq!(std::fs::read_to_string(fs.controller_dir("pids", &cg).join("pids.max")).unwrap().trim(), "64");

    let mut w = workload::Steps::spawn(fs, &main);
    w.run("anon 32");
    let usage = fs.memory_usage(&cg).unwrap();
    let stat = fs.memory_stat(&cg).unwrap();
    println!(
        "memory.current {} KiB, anon {} KiB, inactive_file {} KiB",
        usage / 1024,
        stat.anon / 1024,
        stat.inactive_file / 1024
    );
    assert!((32 * MIB..64 * MIB).contains(&usage), "memory.current {usage}");
    assert!(stat.anon >= 30 * MIB, "memory.stat anon {}", stat.anon);
    assert!(fs.working_set(&cg).unwrap() >= 30 * MIB);

    w.run("fork 5");
    let mut sleeper = Command::new(workload::binary());
    sleeper.arg("sleep");
    workload::in_cgroup(&mut sleeper, fs, &nested);
    let mut sleeper = sleeper.spawn().unwrap();
    assert_eq!(fs.pids_current(&cg).unwrap(), 7, "pids.current counts the subtree");
    assert_eq!(fs.procs_recursive(&cg).unwrap().len(), 7);
    assert!(fs.procs(&cg).unwrap().is_empty(), "no process in the inner cgroup");
    assert_eq!(fs.procs(&nested).unwrap(), vec![sleeper.id()]);

    // cgroup.kill: every process of the subtree, at once.
    fs.kill_all(&cg).unwrap();
    let status = sleeper.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "the nested process was killed");
    drop(w);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fs.procs_recursive(&cg).unwrap().is_empty() || fs.pids_current(&cg).unwrap() != 0 {
        assert!(
            Instant::now() < deadline,
            "processes left after cgroup.kill: {:?}, pids.current {:?}",
            fs.procs_recursive(&cg),
            fs.pids_current(&cg)
        );
        // SAFETY: reaping any exited child (the orphans), without blocking.
        while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
        std::thread::sleep(Duration::from_millis(20));
    }
    fs.remove(&cg, Duration::from_secs(10)).unwrap();
    assert!(!fs.exists(&cg) && !fs.exists(&main) && !fs.exists(&nested));
}
