//! PID exhaustion: a fork bomb in one pod. podPidsLimit caps every pod's
//! pids.max; the bomb's pod (the one with the most processes) is evicted
//! for PIDPressure, while a pod beside it keeps passing its probe with no
//! restart.
//!
//! pid.available is node-wide, and this machine is shared: other builds
//! move its task count by hundreds. A line set before the bomb grows (the
//! first version of this test: node tasks at start + 300) can be crossed by
//! that noise while the bomb and the steady pod are within a few processes
//! of each other, and then the ranking rightly picks either. So the order
//! is reversed: the bomb grows first until it sits at its pids.max (600
//! processes against the steady pod's one or two), and only then is the
//! threshold lowered live (the configuration file rewritten and reloaded,
//! as on SIGHUP) to a line 300 tasks *below* the node's count at that
//! moment. The crossing is then certain, happens at a moment the test
//! chooses, and the ranking cannot hesitate; the bomb's 600 processes take
//! the node 300 tasks back under the line, so other work would have to add
//! 300 tasks within the second the eviction takes to make the steady pod a
//! candidate. Once the bomb is evicted the threshold is put back, so what
//! follows is immune to the noise.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PodStatus;
use swiftlet::{cm::qos::QosClass, eviction::signal::NodeCondition};
use swiftlet_tests::agent::TestAgent;

const BUSYBOX: &str = "swiftlet.local/busybox:1.35";
/// pids.max of every pod.
const POD_PIDS: u64 = 600;
/// How far the live line sits below the node's task count once the bomb
/// is full-grown: half the bomb, so its eviction takes the node as far
/// back above the line.
const MARGIN: u64 = POD_PIDS / 2;
/// A pid.available threshold no node reaches (1 pid left).
const NEVER: &str = "\"1\"";

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

fn config(pid_available: &str) -> String {
    format!(
        "podPidsLimit: {POD_PIDS}\nevictionHard:\n  memory.available: 100Mi\n  pid.available: {pid_available}\nevictionPressureTransitionPeriod: 5s\n"
    )
}

/// Rewrites the agent's configuration with another pid.available line and
/// reloads it, as SIGHUP does in the binary.
fn set_pid_threshold(a: &TestAgent, pid_available: &str) {
    let file = a.config_file();
    let text = std::fs::read_to_string(&file).unwrap();
    let start = text.find("pid.available: ").expect("the pid.available line");
    let end = start + text[start..].find('\n').unwrap();
    std::fs::write(&file, format!("{}pid.available: {pid_available}{}", &text[..start], &text[end..])).unwrap();
    let diff = a.reload().expect("the configuration reloads");
    println!("reloaded: {diff:?}");
}

#[test]
fn a_fork_bomb_is_capped_and_its_pod_evicted_while_the_node_stays_responsive() {
    let limit = pid_limit();
    // Standalone: static pods are all there is, so they may be evicted.
    let a = TestAgent::start(&config(NEVER), &["--signal-source=cgroupfs", "--evict-static-pods"]);
    let steady = a.add_manifest("steady.yaml", &steady());
    a.wait_status(&steady, Duration::from_secs(60), "steady ready", ready_unrestarted);

    let bomb = a.add_manifest("bomb.yaml", &bomb());
    a.wait_status(&bomb, Duration::from_secs(60), "bomb started", |s| s.phase.as_deref() == Some("Running"));
    let bomb_uid = a.pod(&bomb).and_then(|p| p.metadata.uid).expect("bomb uid");
    let cgroup = a.agent.pod_cgroups.pod_cgroup(QosClass::BestEffort, &bomb_uid);
    let pids_max = std::fs::read_to_string(a.cgroupfs().controller_dir("pids", &cgroup).join("pids.max"))
        .expect("the bomb pod's pids.max");
    assert_eq!(pids_max.trim(), POD_PIDS.to_string(), "podPidsLimit is the bomb pod's pids.max");

    // The bomb grows to its cap, which holds; the steady pod stays ready.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut peak = 0;
    while peak < POD_PIDS {
        peak = peak.max(a.cgroupfs().pids_current(&cgroup).unwrap_or(0));
        let s = a.status(&steady).expect("steady is listed");
        assert!(ready_unrestarted(&s), "the steady pod stays ready with no restart: {s:?}\n{:#?}", a.events.all());
        assert!(Instant::now() < deadline, "the bomb did not reach its pids.max within 120s: peak {peak}");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    let capped = a.cgroupfs().pids_current(&cgroup).expect("the bomb's pids");
    assert_eq!(capped, POD_PIDS, "pids.max holds the bomb at its cap");
    assert!(a.status(&bomb).is_some_and(|s| s.reason.is_none()), "nothing evicted the bomb yet");

    // Now the line, below where the node already is.
    let tasks = node_tasks();
    let threshold = limit - (tasks - MARGIN);
    println!(
        "pid limit {limit}, {tasks} tasks (the bomb {capped}): pid.available < {threshold}, pressure above {} tasks",
        tasks - MARGIN
    );
    let mut conditions = a.agent.eviction.conditions();
    set_pid_threshold(&a, &format!("\"{threshold}\""));

    let deadline = Instant::now() + Duration::from_secs(60);
    let mut saw_pressure = false;
    let evicted = loop {
        saw_pressure |= conditions.borrow_and_update().contains(&NodeCondition::PidPressure);
        let s = a.status(&steady).expect("steady is listed");
        assert!(ready_unrestarted(&s), "the steady pod stays ready with no restart: {s:?}\n{:#?}", a.events.all());
        if let Some(s) = a.status(&bomb)
            && s.reason.as_deref() == Some("Evicted")
        {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the bomb was not evicted within 60s of the line ({} tasks on the node)\n{:#?}",
            node_tasks(),
            a.events.all()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    saw_pressure |= conditions.borrow_and_update().contains(&NodeCondition::PidPressure);
    // The line served its purpose: take it away before the noise can matter.
    set_pid_threshold(&a, NEVER);
    println!("bomb evicted: {:?}", evicted.message);
    assert!(saw_pressure, "the node reported PIDPressure");
    assert_eq!(evicted.phase.as_deref(), Some("Failed"));
    let message = evicted.message.as_deref().unwrap_or_default();
    assert!(
        message.starts_with("The node was low on resource: pids. Threshold quantity: ")
            && message.contains("Signal: pid.available."),
        "the kubelet's message, naming the resource: {message:?}"
    );
    let events = a.events.with_reason("Evicted");
    assert!(!events.is_empty());
    assert!(events.iter().all(|e| e.object == bomb), "only the bomb is evicted: {events:?}");
    // The bomb's processes are gone, and some time after the steady pod is
    // still ready, never restarted.
    let deadline = Instant::now() + Duration::from_secs(30);
    while a.cgroupfs().pids_current(&cgroup).unwrap_or(0) > 0 {
        assert!(Instant::now() < deadline, "the bomb's processes did not all end");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(5));
    let s = a.status(&steady).expect("steady");
    assert!(ready_unrestarted(&s), "steady after the eviction: {s:?}");
    assert_eq!(a.events.with_reason("Evicted").len(), events.len(), "nothing else evicted");
}
