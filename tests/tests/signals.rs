//! The signal pipeline against the running kernel: the real eBPF programs,
//! real cgroups (created by the test under its own parent) and real
//! processes. Needs root and kernel BTF.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use swiftlet::signals::{
    CgroupKind, Direction, SignalEvent, SignalSource, SourceChoice, SourceMode, Target, Threshold,
    ebpf::{EbpfOptions, EbpfSource},
    open, page_size,
};
use swiftlet_common::Signal;
use swiftlet_tests::{cgroup::TestCgroup, prereq, workload::Steps};

const MIB: u64 = 1 << 20;

fn load_ebpf(fs: &swiftlet::cgroups::CgroupFs) -> Arc<EbpfSource> {
    prereq::require_root();
    prereq::require_btf();
    let src = EbpfSource::load(fs.clone(), &EbpfOptions::default())
        .unwrap_or_else(|e| panic!("the eBPF programs must load and attach on this kernel: {e}"));
    println!("eBPF programs attached: {:?}", src.strategies());
    Arc::new(src)
}

/// Collects events from a source.
fn collect(src: &dyn SignalSource) -> Arc<Mutex<Vec<SignalEvent>>> {
    let events = Arc::new(Mutex::new(Vec::new()));
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
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A fresh anonymous private mapping of `len` bytes, readable and
/// writable, for the caller to touch and unmap (malloc would hand back
/// pages it already touched, which fault nothing).
fn anonymous_mapping(len: usize) -> *mut u8 {
    // SAFETY: a new anonymous mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap");
    p.cast()
}

fn processes(src: &dyn SignalSource, cgroup: &str) -> u64 {
    src.snapshot().unwrap().cgroups[cgroup].processes
}

#[test]
fn process_counts_follow_forks_and_exits() {
    let tc = TestCgroup::new();
    let src = load_ebpf(&tc.fs);
    let cg = tc.child("procs");
    src.register(&cg, CgroupKind::Pod).unwrap();
    assert_eq!(processes(&*src, &cg), 0, "an empty cgroup has no processes");

    let mut w = Steps::spawn(&tc.fs, &cg);
    w.run("fork 0"); // the workload is up and answering
    assert_eq!(processes(&*src, &cg), 1, "the workload moved itself in before exec");
    for n in [5u64, 12] {
        w.run(&format!("fork {n}"));
    }
    let counted = processes(&*src, &cg);
    let truth = tc.fs.procs_recursive(&cg).unwrap().len() as u64;
    println!("forked 17 children: eBPF counts {counted}, cgroup.procs lists {truth}");
    assert_eq!(counted, 18);
    assert_eq!(truth, 18);
    w.run("reap");
    assert_eq!(processes(&*src, &cg), 1, "reaped children are gone");
    drop(w);
    wait_for("the workload's exit to be counted", Duration::from_secs(5), || {
        (processes(&*src, &cg) == 0).then_some(())
    });
    // The node counts every task, including ours.
    assert!(src.snapshot().unwrap().node.tasks > 18);
}

/// The tolerance between the kernel-side working set and cgroupfs: both read
/// the same page counter, but memory.stat's inactive_file is flushed lazily,
/// up to MEMCG_CHARGE_BATCH (64) pages per CPU behind; twice that covers a
/// flush racing the read.
fn tolerance_bytes() -> u64 {
    let cpus = std::thread::available_parallelism().map(|n| n.get() as u64).unwrap_or(2);
    2 * 64 * cpus * page_size()
}

/// Drives allocation steps and compares the source's working set with
/// cgroupfs `usage − inactive_file` after each.
fn working_set_tracks_cgroupfs(src: &dyn SignalSource, tc: &TestCgroup, poll: &dyn Fn()) {
    let cg = tc.child("memory");
    src.register(&cg, CgroupKind::Pod).unwrap();
    let cache_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ws-{}", std::process::id()));
    std::fs::create_dir_all(&cache_dir).unwrap();
    let mut w = Steps::spawn(&tc.fs, &cg);
    let tol = tolerance_bytes();
    let steps = [
        "anon 64".to_owned(),
        format!("cache 48 {}", cache_dir.display()),
        "anon 32".to_owned(),
        "free-anon".to_owned(),
        "uncache".to_owned(),
    ];
    for step in &steps {
        w.run(step);
        poll();
        let ours = src.snapshot().unwrap().cgroups[&cg];
        let usage = tc.fs.memory_usage(&cg).unwrap();
        let inactive = tc.fs.memory_stat(&cg).unwrap().inactive_file;
        let truth = usage.saturating_sub(inactive);
        let diff = ours.working_set_bytes.abs_diff(truth);
        println!(
            "{:>10} after `{step}`: working set {} KiB, cgroupfs {} KiB (usage {} KiB, inactive_file {} KiB), diff {} KiB, tolerance {} KiB",
            format!("{:?}", src.mode()),
            ours.working_set_bytes / 1024,
            truth / 1024,
            usage / 1024,
            inactive / 1024,
            diff / 1024,
            tol / 1024
        );
        assert!(diff <= tol, "working set off by {diff} bytes after `{step}` (tolerance {tol})");
    }
    let _ = std::fs::remove_dir_all(&cache_dir);
}

#[test]
fn ebpf_working_set_matches_cgroupfs() {
    let tc = TestCgroup::new();
    let src = load_ebpf(&tc.fs);
    working_set_tracks_cgroupfs(&*src, &tc, &|| {});
}

/// The node's memory deltas wait per CPU for a charge batch by default; an
/// observer loaded with a batch of one (the eviction race's) adds every page
/// to the node slot at once and holds nothing back.
#[test]
fn a_node_memory_batch_of_one_holds_nothing_back() {
    let tc = TestCgroup::new();
    let batched = load_ebpf(&tc.fs);
    let exact = EbpfSource::load(tc.fs.clone(), &EbpfOptions { node_memory_batch: Some(1), ..Default::default() })
        .unwrap_or_else(|e| panic!("the eBPF programs must load with a node memory batch of 1: {e}"));
    let cg = tc.child("node-batch");
    let mut w = Steps::spawn(&tc.fs, &cg);
    let cpus = std::thread::available_parallelism().map(|n| n.get() as i64).unwrap_or(2);
    let most = i64::from(swiftlet_common::NODE_MEMORY_BATCH) * cpus;
    for step in ["anon 16", "free-anon", "anon 8"] {
        w.run(step);
        let (b, e) = (batched.pending_node_memory(), exact.pending_node_memory());
        println!("after `{step}`: pending with the default batch {b:?}, with a batch of one {e:?}");
        assert_eq!((e.usage_pages, e.inactive_file_pages), (0, 0), "a batch of one holds nothing back");
        assert!(
            b.usage_pages.abs() < most && b.inactive_file_pages.abs() < most,
            "the default batch holds back less than {most} pages"
        );
    }
    // Two instances hold the same node figure (the race compares the
    // agent's crossing with an observer's): both read the kernel's global
    // counters, or both complete their deltas. What the machine allocates
    // between the two reads is the only difference.
    let (b, e) = (batched.snapshot().unwrap().node, exact.snapshot().unwrap().node);
    let diff = b.working_set_bytes.abs_diff(e.working_set_bytes);
    println!(
        "node working set: {} KiB with the default batch, {} KiB with a batch of one, diff {} KiB",
        b.working_set_bytes / 1024,
        e.working_set_bytes / 1024,
        diff / 1024
    );
    assert!(diff <= 2 * MIB, "two instances disagree on the node's working set by {diff} bytes");
}

/// The kernel's node statistics (anon mapped, file and inactive file pages,
/// as /proc/vmstat shows them), summed over NUMA nodes.
fn proc_vmstat_node_pages() -> (i64, i64) {
    let text = std::fs::read_to_string("/proc/vmstat").expect("read /proc/vmstat");
    let field = |name: &str| -> i64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("/proc/vmstat has no {name}"))
    };
    (field("nr_anon_pages") + field("nr_file_pages"), field("nr_inactive_file"))
}

/// Where BTF gives the path to the kernel's per-node statistics, the node
/// slot holds exactly what /proc/vmstat reports (both read the counters the
/// kernel folds its per-CPU diffs into): no seed, no drift, and every
/// instance of the programs agrees. Memory moves all the time, so the
/// snapshot is taken between two identical readings of /proc/vmstat.
#[test]
fn the_node_slot_holds_the_kernels_own_node_statistics() {
    let tc = TestCgroup::new();
    let btf = swiftlet::signals::btf::Btf::from_sys_fs().unwrap_or_else(|e| panic!("this test needs kernel BTF: {e}"));
    let layout = swiftlet::signals::layout::kernel_layout(&btf).unwrap();
    assert_ne!(
        layout.nr_node_ids,
        0,
        "this kernel's BTF lacks the path to its node statistics (mem_cgroup.nodeinfo, lruvec.pgdat, pglist_data.vm_stat): {:?}",
        swiftlet::signals::layout::node_stat_layout(&btf).err()
    );
    let src = load_ebpf(&tc.fs);
    let page = page_size() as i64;
    for attempt in 1..=500 {
        let before = proc_vmstat_node_pages();
        let node = src.snapshot().unwrap().node;
        let after = proc_vmstat_node_pages();
        if before != after {
            continue;
        }
        let slot = (node.usage_bytes as i64 / page, node.inactive_file_bytes as i64 / page);
        println!("attempt {attempt}: node slot {slot:?} pages, /proc/vmstat {before:?}");
        assert_eq!(slot, before, "the node slot (usage, inactive file) against /proc/vmstat");
        return;
    }
    panic!("/proc/vmstat changed across every one of 500 snapshots: the machine is too busy to compare");
}

/// Far from the node's memory line, pages reach the node slot a batch per
/// CPU at a time; within a batch per CPU of the line, every page at once, so
/// the line is crossed at the page that crosses it, not when each CPU's
/// batch happens to fill. A large batch (1024 pages) makes the zone wide
/// enough (8 MiB on 2 CPUs) that the machine's own churn stays inside it.
#[test]
fn near_the_node_line_no_cpu_holds_pages_back() {
    let tc = TestCgroup::new();
    prereq::require_root();
    prereq::require_btf();
    let src = EbpfSource::load(tc.fs.clone(), &EbpfOptions { node_memory_batch: Some(1024), ..Default::default() })
        .unwrap_or_else(|e| panic!("the eBPF programs must load with a node memory batch of 1024: {e}"));
    let page = page_size();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    // Touches 64 fresh pages on every CPU in turn and keeps them, so each
    // CPU counts them; returns the mappings to unmap once read.
    let touch_on_every_cpu = || {
        let mut mapped = vec![];
        // SAFETY: reads this thread's CPU mask into a zeroed cpu_set_t.
        let original = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set), 0, "read CPU mask");
            set
        };
        for cpu in 0..cpus {
            // SAFETY: a cpu_set_t for this thread only, filled by the libc macros.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                assert_eq!(libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set), 0, "pin to CPU {cpu}");
            }
            // A fresh mapping each time (see `anonymous_mapping`).
            let len = 64 * page as usize;
            let p = anonymous_mapping(len);
            // SAFETY: touched within its length; the caller unmaps it.
            unsafe {
                for off in (0..len).step_by(page as usize) {
                    p.add(off).write_volatile(1);
                }
            }
            mapped.push((p.cast::<libc::c_void>(), len));
        }
        // SAFETY: the mask read above, restored.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&original), &original) };
        mapped
    };
    let used = src.snapshot().unwrap().node.working_set_bytes;
    let far = Threshold { trigger: used + 4096 * MIB, rearm: used };
    src.set_threshold(&Target::Node, Signal::MemoryWorkingSet, Some(far)).unwrap();
    let unmap = |mapped: Vec<(*mut libc::c_void, usize)>| {
        for (p, len) in mapped {
            // SAFETY: a mapping made above, unmapped once.
            unsafe { libc::munmap(p, len) };
        }
    };
    let mapped = touch_on_every_cpu();
    let held_far = src.pending_node_memory();
    unmap(mapped);
    // Halfway into the zone: 4 MiB above what the node uses.
    let used = src.snapshot().unwrap().node.working_set_bytes;
    let near = Threshold { trigger: used + 4 * MIB, rearm: used.saturating_sub(64 * MIB) };
    src.set_threshold(&Target::Node, Signal::MemoryWorkingSet, Some(near)).unwrap();
    let mapped = touch_on_every_cpu();
    let held_near = src.pending_node_memory();
    unmap(mapped);
    println!("held back with the line 4 GiB away: {held_far:?}; 4 MiB away: {held_near:?}");
    assert!(
        held_far.usage_pages != 0 || held_far.inactive_file_pages != 0,
        "far from the line, each CPU holds the 64 pages it just counted (a batch is 1024)"
    );
    assert_eq!(
        (held_near.usage_pages, held_near.inactive_file_pages),
        (0, 0),
        "near the line, every CPU adds each page to the node at once"
    );
}

/// The kernel holds back up to a stat threshold of pages per CPU from the
/// node's counters and folds them in when a CPU passes that threshold, goes
/// idle or runs its vmstat work. Near the node's line the programs count
/// what every CPU holds back, so the line is crossed at the page that
/// crosses it, by the task that charged that page, even when the task then
/// sleeps with its last pages still held back on its CPU (a ramp between
/// bursts): not at the idle CPU's fold, outside any task's context (pid 0),
/// where a sleeping victim can only be signalled from an interrupt.
#[test]
fn the_node_line_is_crossed_by_the_task_whose_page_crosses_it() {
    let tc = TestCgroup::new();
    let src = load_ebpf(&tc.fs);
    let btf = swiftlet::signals::btf::Btf::from_sys_fs().unwrap_or_else(|e| panic!("this test needs kernel BTF: {e}"));
    let layout = swiftlet::signals::layout::kernel_layout(&btf).unwrap();
    assert_ne!(
        layout.nr_cpu_ids,
        0,
        "the pages each CPU holds back from the node's statistics cannot be read: {:?}",
        swiftlet::signals::layout::held_back_layout(&btf, swiftlet::signals::layout::nr_cpu_ids()).err()
    );
    let events = collect(&*src);
    let page = page_size() as usize;
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u32;
    let node_crossing = |events: &Mutex<Vec<SignalEvent>>| {
        events.lock().unwrap().iter().find_map(|ev| match ev {
            SignalEvent::Crossing { target: Target::Node, direction: Direction::Up, pid, value, threshold, .. } => {
                Some((*pid, *value, *threshold))
            }
            _ => None,
        })
    };
    // The machine's other tasks allocate too, and one of them may cross
    // first; such an attempt says nothing, and another is made.
    for attempt in 1..=5 {
        events.lock().unwrap().clear();
        let used = src.snapshot().unwrap().node.working_set_bytes;
        let line = Threshold { trigger: used + 4 * MIB, rearm: used.saturating_sub(64 * MIB) };
        src.set_threshold(&Target::Node, Signal::MemoryWorkingSet, Some(line)).unwrap();
        let len = 16 * MIB as usize;
        let map = anonymous_mapping(len);
        // SAFETY: the mapping just made, of that length; base pages only, so
        // that each touch below is one page of the node's statistics. It is
        // touched within its length and unmapped below.
        unsafe { libc::madvise(map.cast(), len, libc::MADV_NOHUGEPAGE) };
        // Bursts of 8 pages, fewer than any CPU's stat threshold, each
        // followed by a sleep in which this CPU may go idle and fold.
        let mut touched = 0;
        while touched < len && node_crossing(&events).is_none() {
            for _ in 0..8 {
                // SAFETY: within the mapping.
                unsafe { map.add(touched).write_volatile(1) };
                touched += page;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let crossing = wait_for("the node's upward crossing", Duration::from_secs(5), || node_crossing(&events));
        // SAFETY: the mapping made above, unmapped once.
        unsafe { libc::munmap(map.cast(), len) };
        src.set_threshold(&Target::Node, Signal::MemoryWorkingSet, None).unwrap();
        let (pid, value, threshold) = crossing;
        println!(
            "attempt {attempt}: crossed at {} KiB over a {} KiB line by pid {pid} (this thread: {tid}) after {} KiB touched",
            value / 1024,
            threshold / 1024,
            touched / 1024
        );
        assert_ne!(pid, 0, "the line was crossed at a fold, outside the context of the task that charged the page");
        if pid == tid {
            return;
        }
    }
    panic!("in 5 attempts another task's page crossed the node's line first: the machine is too busy for this test");
}

#[test]
fn auto_mode_falls_back_to_cgroupfs_when_ebpf_cannot_load() {
    let tc = TestCgroup::new();
    let opened = open(
        SourceChoice::Auto,
        tc.fs.clone(),
        &EbpfOptions { force_load_failure: true, ..Default::default() },
        Duration::from_millis(100),
    )
    .unwrap();
    assert_eq!(opened.source.mode(), SourceMode::Cgroupfs);
    assert!(opened.fallback_reason.unwrap().contains("forced"));
    working_set_tracks_cgroupfs(&*opened.source, &tc, &|| {});
    // In explicit eBPF mode the same failure is an error, not a fallback.
    let forced = open(
        SourceChoice::Ebpf,
        tc.fs.clone(),
        &EbpfOptions { force_load_failure: true, ..Default::default() },
        Duration::from_secs(10),
    );
    assert!(forced.is_err());
}

#[test]
fn inode_counts_follow_creates_and_unlinks() {
    let tc = TestCgroup::new();
    let src = load_ebpf(&tc.fs);
    assert_ne!(src.strategies().inodes, "none", "inode tracking needs the ext4 tracepoints, which this kernel lacks");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("inodes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cg = tc.child("inodes");
    src.register(&cg, CgroupKind::Pod).unwrap();
    let mut w = Steps::spawn(&tc.fs, &cg);
    let inodes = |src: &EbpfSource| src.snapshot().unwrap().cgroups[&cg].inodes.unwrap();
    w.run(&format!("files 250 {}", dir.display()));
    println!("created 250 files: eBPF counts {} inodes", inodes(&src));
    assert_eq!(inodes(&src), 250);
    w.run("unlink");
    println!("unlinked them: eBPF counts {} inodes", inodes(&src));
    assert_eq!(inodes(&src), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_crossing_produces_exactly_one_event() {
    let tc = TestCgroup::new();
    let src = load_ebpf(&tc.fs);
    let events = collect(&*src);
    let cg = tc.child("crossing");
    src.register(&cg, CgroupKind::Pod).unwrap();
    let mut w = Steps::spawn(&tc.fs, &cg);
    w.run("anon 48");
    let before = src.snapshot().unwrap().cgroups[&cg].working_set_bytes;
    assert!(before >= 48 * MIB);
    // A line below the current value: crossed at once, with no further
    // allocation (setting a line has the kernel evaluate it right away).
    let target = Target::Cgroup(cg.clone());
    src.set_threshold(&target, Signal::MemoryWorkingSet, Some(Threshold { trigger: 32 * MIB, rearm: 24 * MIB }))
        .unwrap();
    let crossings = wait_for("the crossing event", Duration::from_secs(5), || {
        let ev = events.lock().unwrap();
        let c: Vec<SignalEvent> = ev
            .iter()
            .filter(|e| matches!(e, SignalEvent::Crossing { target: t, .. } if *t == target))
            .cloned()
            .collect();
        (!c.is_empty()).then_some(c)
    });
    // More allocation above the line must not produce more events.
    w.run("anon 16");
    std::thread::sleep(Duration::from_millis(200));
    let all: Vec<SignalEvent> = events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| matches!(e, SignalEvent::Crossing { target: t, .. } if *t == target))
        .cloned()
        .collect();
    assert_eq!(all.len(), 1, "expected one crossing, got {all:?}");
    let SignalEvent::Crossing { direction, value, threshold, at_ns, received_ns, pid, .. } = crossings[0].clone()
    else {
        unreachable!()
    };
    println!(
        "crossing: value {} KiB over {} KiB, kernel→agent {} µs, by pid {pid}",
        value / 1024,
        threshold / 1024,
        (received_ns - at_ns) / 1000
    );
    assert_eq!(direction, Direction::Up);
    assert!(value >= threshold && threshold >= 32 * MIB);
    assert!(at_ns < received_ns, "the kernel's timestamp precedes receipt");
    assert_eq!(pid, 0, "the line was evaluated when it was set, not by an allocation");

    // Freeing memory below the re-arm level produces the one downward event.
    w.run("free-anon");
    wait_for("the downward crossing", Duration::from_secs(5), || {
        events
            .lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, SignalEvent::Crossing { direction: Direction::Down, target: t, .. } if *t == target))
            .then_some(())
    });

    // Allocating past the line again: one more upward crossing, raised by
    // the allocating task itself.
    w.run("anon 48");
    let again = wait_for("the second upward crossing", Duration::from_secs(5), || {
        let ev = events.lock().unwrap();
        let ups: Vec<SignalEvent> = ev
            .iter()
            .filter(|e| matches!(e, SignalEvent::Crossing { direction: Direction::Up, target: t, .. } if *t == target))
            .cloned()
            .collect();
        (ups.len() == 2).then(|| ups[1].clone())
    });
    let SignalEvent::Crossing { pid, value, threshold, .. } = again else { unreachable!() };
    assert!(value >= threshold);
    assert_eq!(pid, w.pid(), "the crossing names the allocating task");
}

#[test]
fn oom_kill_in_a_test_cgroup_is_reported() {
    let tc = TestCgroup::new();
    let src = load_ebpf(&tc.fs);
    let events = collect(&*src);
    let cg = tc.child("oom");
    tc.fs.set_memory_limit(&cg, Some(32 * MIB)).unwrap();
    src.register(&cg, CgroupKind::Pod).unwrap();
    let id = src.cgroup_id_of(&cg).unwrap();
    let mut cmd = std::process::Command::new(swiftlet_tests::workload::binary());
    cmd.args(["hog", "1024", "256"]).stdout(std::process::Stdio::null());
    swiftlet_tests::workload::in_cgroup(&mut cmd, &tc.fs, &cg);
    let mut child = cmd.spawn().unwrap();
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "the OOM killer ends the hog");
    let ev = wait_for("the mark_victim event", Duration::from_secs(5), || {
        events
            .lock()
            .unwrap()
            .iter()
            .find(|e| matches!(e, SignalEvent::OomKill { cgroup_id, .. } if *cgroup_id == id))
            .cloned()
    });
    println!("OOM event: {ev:?}");
    let SignalEvent::OomKill { cgroup, pid, .. } = ev else { unreachable!() };
    assert_eq!(cgroup.as_deref(), Some(cg.as_str()));
    assert_eq!(pid, child.id());
}
