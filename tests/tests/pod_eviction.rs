//! Eviction end to end with real containers: the pods are limited to
//! 1 GiB (enforceNodeAllocatable: [pods]) and evictionHard
//! memory.available<512Mi makes allocatableMemory.available cross when the
//! pods use 512 MiB. A BestEffort container ramps its memory past that; it
//! must be killed at the crossing (by the kernel program, or by the agent
//! when kernel eviction is off), before the kernel OOM killer acts at
//! 1 GiB, and its pod must end Failed/Evicted while a Guaranteed pod
//! beside it keeps running.

use std::time::Duration;

use k8s_openapi::api::core::v1::PodStatus;
use swiftlet_tests::agent::TestAgent;

const BUSYBOX: &str = "swiftlet.local/busybox:1.35";
const PODS_MIB: u64 = 1024;

fn config() -> String {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let total_mib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .expect("MemTotal")
        / 1024;
    assert!(total_mib > 2 * PODS_MIB, "this test needs more than {} MiB of memory", 2 * PODS_MIB);
    format!(
        "enforceNodeAllocatable: [pods]\nsystemReserved:\n  memory: {}Mi\nevictionHard:\n  memory.available: 512Mi\nevictionPressureTransitionPeriod: 5s",
        total_mib - PODS_MIB
    )
}

fn hog() -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: hog\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: hog\n    image: {BUSYBOX}\n    command: [\"awk\", \"BEGIN {{ for (n = 1; n <= 900; n++) {{ a[n] = sprintf(\\\"%1048576s\\\", \\\"\\\"); if (n % 32 == 0) system(\\\"sleep 0.25\\\") }} system(\\\"sleep 3600\\\") }}\"]\n"
    )
}

fn steady() -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: steady\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: steady\n    image: {BUSYBOX}\n    command: [\"awk\", \"BEGIN {{ for (n = 1; n <= 64; n++) a[n] = sprintf(\\\"%1048576s\\\", \\\"\\\"); system(\\\"sleep 3600\\\") }}\"]\n    resources:\n      requests: {{cpu: 100m, memory: 256Mi}}\n      limits: {{cpu: 100m, memory: 256Mi}}\n"
    )
}

fn oom_kills(a: &TestAgent) -> u64 {
    let kubepods = a.agent.pod_cgroups.naming().kubepods();
    let dir = a.cgroupfs().memory_dir(&kubepods);
    let text = std::fs::read_to_string(dir.join("memory.oom_control"))
        .or_else(|_| std::fs::read_to_string(dir.join("memory.events")))
        .expect("the kubepods cgroup's OOM counter");
    text.lines().find_map(|l| l.strip_prefix("oom_kill ").and_then(|v| v.trim().parse().ok())).expect("oom_kill line")
}

fn evicts_the_best_effort_pod(kernel_eviction: bool, killed_by: &str) {
    let flag = format!("--kernel-eviction={kernel_eviction}");
    // Standalone: static pods are all there is, so they may be evicted.
    let a = TestAgent::start(&config(), &["--signal-source=ebpf", &flag, "--evict-static-pods"]);
    let steady = a.add_manifest("steady.yaml", &steady());
    a.wait_status(&steady, Duration::from_secs(60), "steady Running", |s| s.phase.as_deref() == Some("Running"));
    let hog = a.add_manifest("hog.yaml", &hog());
    let s: PodStatus =
        a.wait_status(&hog, Duration::from_secs(120), "Evicted", |s| s.reason.as_deref() == Some("Evicted"));
    assert_eq!(s.phase.as_deref(), Some("Failed"));
    let message = s.message.clone().unwrap_or_default();
    assert!(
        message.starts_with("The node was low on resource: memory. Threshold quantity: 512Mi")
            && message.contains("Signal: allocatableMemory.available"),
        "{message}"
    );
    assert!(message.contains("Container hog was using"), "{message}");
    let disruption = s.conditions.as_ref().unwrap().iter().find(|c| c.type_ == "DisruptionTarget").cloned();
    assert_eq!(disruption.map(|c| (c.status, c.reason)), Some(("True".into(), Some("TerminationByKubelet".into()))));
    let hog_state = &s.container_statuses.as_ref().unwrap()[0];
    let t = hog_state.state.as_ref().and_then(|st| st.terminated.as_ref()).expect("the hog is terminated");
    assert_eq!(t.exit_code, 137, "killed with SIGKILL");
    assert_eq!(oom_kills(&a), 0, "the kernel OOM killer must not have fired");

    // The evicted pod stays down; the Guaranteed one never noticed.
    std::thread::sleep(Duration::from_secs(3));
    let s = a.status(&hog).unwrap();
    assert_eq!(s.reason.as_deref(), Some("Evicted"));
    assert_eq!(s.container_statuses.as_ref().unwrap()[0].restart_count, 0, "an evicted pod is not restarted");
    let st = a.status(&steady).unwrap();
    assert_eq!(st.phase.as_deref(), Some("Running"));
    assert_eq!(st.container_statuses.as_ref().unwrap()[0].restart_count, 0);

    let evicted = a.events.with_reason("Evicted");
    assert!(evicted.iter().any(|e| e.object == hog), "an Evicted event for the pod: {:?}", a.events.all());
    let metrics = a.agent.metrics.encode();
    assert!(
        metrics.contains("kubelet_evictions_total{eviction_signal=\"allocatableMemory.available\"} 1"),
        "{metrics}"
    );
    let killed = format!("swiftlet_eviction_crossing_to_kill_seconds_count{{path=\"{killed_by}\"}} 1");
    assert!(metrics.contains(&killed), "expected {killed} in\n{metrics}");
}

#[test]
fn the_kernel_kills_the_planned_victim_at_the_crossing() {
    evicts_the_best_effort_pod(true, "kernel");
}

#[test]
fn the_agent_kills_at_the_crossing_when_kernel_eviction_is_off() {
    evicts_the_best_effort_pod(false, "agent");
}
