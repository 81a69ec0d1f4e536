//! PID exhaustion: a fork bomb in one pod. podPidsLimit caps every pod's
//! pids.max, and a pid.available hard threshold set a few hundred tasks
//! above the node's count at the start makes the bomb's tasks cross it:
//! the bomb's pod (the one with the most processes) is evicted, while a
//! pod beside it keeps passing its probe with no restart.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PodStatus;
use swiftlet::cm::qos::QosClass;
use swiftlet_tests::agent::TestAgent;

const BUSYBOX: &str = "swiftlet.local/busybox:1.35";
/// pids.max of every pod.
const POD_PIDS: u64 = 600;
/// How far above the node's tasks at the start the threshold sits: well
/// above what other work on the machine adds, well below the bomb.
const MARGIN: u64 = 300;

fn node_tasks() -> u64 {
    let s = std::fs::read_to_string("/proc/loadavg").expect("/proc/loadavg");
    s.split_whitespace().nth(3).and_then(|f| f.split('/').nth(1)).and_then(|n| n.parse().ok()).expect("tasks")
}

fn pid_limit() -> u64 {
    let read = |p: &str| std::fs::read_to_string(p).ok().and_then(|s| s.trim().parse::<u64>().ok());
    let pid_max = read("/proc/sys/kernel/pid_max").expect("kernel.pid_max");
    read("/proc/sys/kernel/threads-max").map_or(pid_max, |t| t.min(pid_max))
}

/// The bomb: PID 1 becomes a `sleep` that never reaps, and a shell starts
/// sleepers until fork fails. Whatever the shell does then, the pids stay
/// taken (sleepers, or zombies nobody reaps).
fn bomb() -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: bomb\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: bomb\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"sh -c 'while :; do sleep 1000 & done' & exec sleep 3600\"]\n"
    )
}

fn steady() -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: steady\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: steady\n    image: {BUSYBOX}\n    command: [\"sleep\", \"3600\"]\n    readinessProbe:\n      exec: {{command: [\"sh\", \"-c\", \"ls / | grep -q bin\"]}}\n      periodSeconds: 1\n      failureThreshold: 1\n"
    )
}

fn ready_unrestarted(s: &PodStatus) -> bool {
    s.phase.as_deref() == Some("Running")
        && s.container_statuses.as_ref().is_some_and(|cs| cs.len() == 1 && cs[0].ready && cs[0].restart_count == 0)
}

#[test]
#[ignore = "node-wide signal: run it alone with `cargo test -p swiftlet-tests --test pid_exhaustion -- --ignored` against a test containerd (SWIFTLET_TEST_CRI_ENDPOINT); other work on the machine moving the task count by a few hundred crosses the line before the bomb does"]
fn a_fork_bomb_is_capped_and_its_pod_evicted_while_the_node_stays_responsive() {
    let limit = pid_limit();
    let threshold = limit - (node_tasks() + MARGIN);
    let config = format!(
        "podPidsLimit: {POD_PIDS}\nevictionHard:\n  memory.available: 100Mi\n  pid.available: \"{threshold}\"\nevictionPressureTransitionPeriod: 5s\n"
    );
    println!("pid limit {limit}, pid.available < {threshold}: pressure above {} tasks", limit - threshold);
    let a = TestAgent::start(&config, &["--signal-source=cgroupfs"]);
    let steady = a.add_manifest("steady.yaml", &steady());
    a.wait_status(&steady, Duration::from_secs(60), "steady ready", ready_unrestarted);

    let bomb = a.add_manifest("bomb.yaml", &bomb());
    a.wait_status(&bomb, Duration::from_secs(60), "bomb started", |s| {
        s.phase.as_deref() == Some("Running") || s.reason.as_deref() == Some("Evicted")
    });
    let bomb_uid = a.pod(&bomb).and_then(|p| p.metadata.uid).expect("bomb uid");
    let cgroup = a.agent.pod_cgroups.pod_cgroup(QosClass::BestEffort, &bomb_uid);
    let pids_max_file = a.cgroupfs().controller_dir("pids", &cgroup).join("pids.max");
    let mut pids_max = None;

    // While the bomb grows and until it is evicted: it never passes its
    // pids.max, and the steady pod stays ready without a restart.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut peak = 0;
    let evicted = loop {
        if let Ok(n) = a.cgroupfs().pids_current(&cgroup) {
            peak = peak.max(n);
        }
        if pids_max.is_none() {
            pids_max = std::fs::read_to_string(&pids_max_file).ok().map(|m| m.trim().to_owned());
        }
        let s = a.status(&steady).expect("steady is listed");
        assert!(ready_unrestarted(&s), "the steady pod stays ready with no restart: {s:?}\n{:#?}", a.events.all());
        if let Some(s) = a.status(&bomb)
            && s.reason.as_deref() == Some("Evicted")
        {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the bomb was not evicted within 120s (peak {peak} pids, {} tasks on the node)\n{:#?}",
            node_tasks(),
            a.events.all()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    println!("bomb peaked at {peak} pids; evicted: {:?}", evicted.message);
    assert_eq!(pids_max, Some(POD_PIDS.to_string()), "podPidsLimit is the bomb pod's pids.max");
    assert!(peak <= POD_PIDS, "pids.max held: peak {peak}");
    assert!(peak >= MARGIN, "the bomb grew past the margin before its eviction: peak {peak}");
    assert_eq!(evicted.phase.as_deref(), Some("Failed"));
    assert!(
        evicted.message.as_deref().is_some_and(|m| m.contains("pids")),
        "the message names the resource: {:?}",
        evicted.message
    );
    let events = a.events.with_reason("Evicted");
    assert!(events.iter().all(|e| e.object == bomb), "only the bomb is evicted: {events:?}");
    assert!(!events.is_empty());
    // Some time after: the steady pod is still ready, never restarted.
    std::thread::sleep(Duration::from_secs(5));
    let s = a.status(&steady).expect("steady");
    assert!(ready_unrestarted(&s), "steady after the eviction: {s:?}");
}
