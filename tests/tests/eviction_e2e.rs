//! The kubelet's node e2e eviction tests (`test/e2e_node/eviction_test.go`),
//! case by case, on the real binary as a node of the fake API server with
//! real containers: MemoryAllocatableEviction, PriorityMemoryEvictionOrdering,
//! PriorityPidEvictionOrdering, InodeEviction, LocalStorageEviction,
//! LocalStorageSoftEviction and LocalStorageCapacityIsolation. Each checks
//! what upstream's `runEvictionTest` checks (see `swiftlet_tests::e2e`).
//!
//! Differences, for a machine shared with other work and for speed: the
//! memory cases watch allocatable (kubepods limited to 1 GiB) rather than
//! the whole node's memory; the disk cases run on a small tmpfs of their
//! own that holds the root dir, the logs and a containerd's root; the
//! lines of the PID and disk cases are set live (the configuration
//! reloaded, as on SIGHUP) once the pods run, relative to where the node
//! is then; the transition period is 5 s and the soft grace period 5 s.

use std::time::Duration;

use serde_json::json;
use swiftlet_tests::{
    containerd::TestContainerd,
    e2e::{E2eNode, EvictSpec, Expect, MI, memory_hog, shell, sleeper, wait},
    tmpfs::SmallFs,
};

const TRANSITION: Duration = Duration::from_secs(5);
const TRANSITION_YAML: &str = "evictionPressureTransitionPeriod: 5s\n";

fn mem_total_mib() -> u64 {
    swiftlet::signals::node::mem_total().expect("MemTotal") / MI
}

/// The pods may use 1 GiB (enforced on kubepods); memory.available<512Mi
/// gives them allocatableMemory.available<512Mi: the line at 512 MiB.
fn pods_memory_config() -> String {
    let total = mem_total_mib();
    assert!(total > 3 * 1024, "these tests need more than 3 GiB of memory");
    format!(
        "enforceNodeAllocatable: [pods]\nsystemReserved:\n  memory: {}Mi\nevictionHard:\n  memory.available: 512Mi\n{TRANSITION_YAML}",
        total - 1024
    )
}

/// Rewrites the `key: value` line of the node's configuration and reloads it.
fn set_config(node: &E2eNode, key: &str, value: &str) {
    let path = node.agent.config_path();
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text.find(&format!("{key}: ")).unwrap_or_else(|| panic!("no {key} in\n{text}"));
    let end = start + text[start..].find('\n').unwrap();
    std::fs::write(&path, format!("{}{key}: {value}{}", &text[..start], &text[end..])).unwrap();
    let before = node.agent.log_text().matches("configuration reloaded").count();
    node.agent.signal(libc::SIGHUP);
    wait("the configuration reloaded", Duration::from_secs(10), || {
        (node.agent.log_text().matches("configuration reloaded").count() > before).then_some(())
    });
}

fn with_priority(mut pod: serde_json::Value, priority: i32) -> serde_json::Value {
    pod["priority"] = priority.into();
    pod
}

#[test]
fn memory_allocatable_eviction() {
    let mut node = E2eNode::start("mem-alloc", &pods_memory_config(), &["--signal-source=ebpf".into()]);
    let specs = [
        EvictSpec { name: "memory-hog-pod", eviction_priority: 1, pod: memory_hog("memory-hog", 32, 0.25, 900) },
        EvictSpec { name: "innocent-pod", eviction_priority: 0, pod: sleeper("innocent") },
    ];
    let expect = Expect { condition: Some("MemoryPressure"), starved_resource: Some("memory") };
    node.run_eviction_test(&specs, expect, Duration::from_secs(60), TRANSITION, |_| {}, |_| {});
}

#[test]
fn priority_memory_eviction_ordering() {
    let mut node = E2eNode::start("mem-prio", &pods_memory_config(), &["--signal-source=ebpf".into()]);
    let mut guaranteed = memory_hog("guaranteed-pod", 50, 0.25, 100);
    guaranteed["containers"][0]["resources"] = json!({
        "requests": {"cpu": "100m", "memory": "300Mi"},
        "limits": {"cpu": "100m", "memory": "300Mi"},
    });
    let specs = [
        // The low-priority hog grows twice as fast: it crosses the line
        // first, is evicted, and the high-priority one grows on until it
        // crosses it alone.
        EvictSpec { name: "memory-hog-pod", eviction_priority: 2, pod: memory_hog("memory-hog", 32, 0.25, 900) },
        EvictSpec {
            name: "high-priority-memory-hog-pod",
            eviction_priority: 1,
            pod: with_priority(memory_hog("high-priority-memory-hog", 16, 0.25, 900), 999_999_999),
        },
        EvictSpec { name: "guaranteed-pod", eviction_priority: 0, pod: guaranteed },
        EvictSpec {
            name: "critical-pod",
            eviction_priority: 0,
            pod: with_priority(memory_hog("critical-pod", 50, 0.25, 50), i32::MAX),
        },
    ];
    let expect = Expect { condition: Some("MemoryPressure"), starved_resource: Some("memory") };
    node.run_eviction_test(&specs, expect, Duration::from_secs(60), TRANSITION, |_| {}, |_| {});
}

/// The node's tasks, threads included (/proc/loadavg), as pid.available
/// counts them.
fn node_tasks() -> u64 {
    let s = std::fs::read_to_string("/proc/loadavg").unwrap();
    s.split_whitespace().nth(3).and_then(|f| f.split('/').nth(1)).and_then(|n| n.parse().ok()).expect("tasks")
}

fn pid_limit() -> u64 {
    swiftlet::signals::node::pid_limit().expect("pid_max")
}

#[test]
fn priority_pid_eviction_ordering() {
    const POD_PIDS: u64 = 400;
    let config = format!(
        "podPidsLimit: {POD_PIDS}\nevictionHard:\n  memory.available: 100Mi\n  pid.available: \"1\"\n{TRANSITION_YAML}"
    );
    let mut node = E2eNode::start("pid-prio", &config, &["--signal-source=ebpf".into()]);
    // PID 1 sleeps and never reaps; a shell starts sleepers until fork fails.
    let bomb = |c: &str| shell(c, "sh -c 'while :; do sleep 1000 & done' & exec sleep 3600");
    // As upstream, the innocent pod shares the high priority: among those,
    // the bomb holds the most tasks.
    let specs = [
        EvictSpec { name: "fork-bomb-container-with-low-priority-pod", eviction_priority: 2, pod: bomb("low") },
        EvictSpec { name: "innocent-pod", eviction_priority: 0, pod: with_priority(sleeper("innocent"), 999_999_999) },
        EvictSpec {
            name: "fork-bomb-container-with-high-priority-pod",
            eviction_priority: 1,
            pod: with_priority(bomb("high"), 999_999_999),
        },
    ];
    let expect = Expect { condition: Some("PIDPressure"), starved_resource: Some("pids") };
    let bombs = [specs[0].name, specs[2].name];
    let pressure = move |node: &mut E2eNode| {
        // Both bombs at their cap; then a line 700 tasks below the node:
        // one bomb (400) is not enough, both are (the node's other work
        // would have to add 100 tasks in the meantime to need a third).
        let fs = swiftlet::cgroups::CgroupFs::detect().unwrap();
        for b in bombs {
            let uid = node.pod(b).unwrap()["metadata"]["uid"].as_str().unwrap().to_owned();
            let cgroup = format!("{}/kubepods/besteffort/pod{uid}", node.agent.cgroup.root);
            wait(&format!("{b} at its pids.max"), Duration::from_secs(60), || {
                (fs.pids_current(&cgroup).unwrap_or(0) >= POD_PIDS).then_some(())
            });
        }
        let tasks = node_tasks();
        set_config(node, "  pid.available", &format!("\"{}\"", pid_limit() - (tasks - 700)));
    };
    // The line served its purpose: away with it before the node's own
    // noise can matter.
    let relief = |node: &mut E2eNode| set_config(node, "  pid.available", "\"1\"");
    node.run_eviction_test(&specs, expect, Duration::from_secs(60), TRANSITION, pressure, relief);
}

/// A node whose root dir, logs and containerd root share one small tmpfs
/// (bytes and inodes), with the disk line set live by `pressure`.
struct DiskNode {
    node: E2eNode,
    // Dropped after the node: the containerd, then the disk.
    _ctd: TestContainerd,
    disk: SmallFs,
}

fn disk_node(tag: &str, size: u64, inodes: u64, config: &str) -> DiskNode {
    let disk = SmallFs::mount(size, inodes);
    let root = disk.path().join("root");
    let logs = disk.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let ctd = TestContainerd::start_with_root(tag, Some(&disk.path().join("containerd")));
    let config = format!("podLogsDir: {}\n{config}", logs.display());
    let node = E2eNode::start(
        tag,
        &config,
        &[format!("--container-runtime-endpoint={}", ctd.endpoint()), format!("--root-dir={}", root.display())],
    );
    DiskNode { node, _ctd: ctd, disk }
}

#[test]
fn inode_eviction() {
    let config = format!(
        "evictionHard:\n  memory.available: 100Mi\n  nodefs.available: \"1%\"\n  nodefs.inodesFree: \"1\"\n{TRANSITION_YAML}"
    );
    let mut d = disk_node("inode", 256 * MI, 40_000, &config);
    // 100 files every 0.1 s, in the container's writable layer or in an emptyDir.
    let files = |dir: &str| {
        format!(
            "sleep 2; i=0; while :; do for j in $(seq 100); do touch {dir}/f$i-$j; done; i=$((i+1)); sleep 0.1; done"
        )
    };
    let mut volume_hog = shell("volume-inode-hog", &files("/scratch"));
    volume_hog["containers"][0]["volumeMounts"] = json!([{"name": "scratch", "mountPath": "/scratch"}]);
    volume_hog["volumes"] = json!([{"name": "scratch", "emptyDir": {}}]);
    let specs = [
        EvictSpec {
            name: "container-inode-hog-pod",
            eviction_priority: 1,
            pod: shell("container-inode-hog", &files("/tmp")),
        },
        EvictSpec { name: "volume-inode-hog-pod", eviction_priority: 1, pod: volume_hog },
        EvictSpec { name: "innocent-pod", eviction_priority: 0, pod: sleeper("innocent") },
    ];
    let expect = Expect { condition: Some("DiskPressure"), starved_resource: Some("inodes") };
    let disk = &d.disk;
    let pressure = move |node: &mut E2eNode| {
        // The hogs run first, as upstream's do before the line is reached:
        // a writable layer's inodes reach the ranking through the runtime's
        // stats, which containerd refreshes every 10 s; ranked before that,
        // the container hog holds no more than the innocent pod.
        std::thread::sleep(Duration::from_secs(12));
        // 4,000 inodes below what is free now: each hog makes up to 1,000
        // a second.
        let (_, _, now_free) = disk.stat();
        set_config(node, "  nodefs.inodesFree", &format!("\"{}\"", now_free.saturating_sub(4000)));
    };
    let relief = |node: &mut E2eNode| set_config(node, "  nodefs.inodesFree", "\"1\"");
    d.node.run_eviction_test(&specs, expect, Duration::from_secs(60), TRANSITION, pressure, relief);
}

/// Writes 1 MiB every `every` seconds to `dir` for as long as it lives.
fn disk_hog(container: &str, dir: &str, every: f32) -> serde_json::Value {
    shell(
        container,
        &format!(
            "sleep 2; i=0; while :; do dd if=/dev/zero of={dir}/f$i bs=1048576 count=1 2>/dev/null && i=$((i+1)); sleep {every}; done"
        ),
    )
}

/// The runtime measures writable layers on its own schedule (containerd:
/// every 10 s), and the disk-pressure ranking reads those figures: the
/// hog writes for a while before the line is set, so that what ranks it
/// is what it wrote.
const STATS_SETTLE: Duration = Duration::from_secs(12);

#[test]
fn local_storage_eviction() {
    let config = format!("evictionHard:\n  memory.available: 100Mi\n  nodefs.available: \"1\"\n{TRANSITION_YAML}");
    let mut d = disk_node("disk", 256 * MI, 50_000, &config);
    let specs = [
        EvictSpec {
            name: "container-disk-hog-pod",
            eviction_priority: 1,
            pod: disk_hog("container-disk-hog", "/tmp", 0.5),
        },
        EvictSpec { name: "innocent-pod", eviction_priority: 0, pod: sleeper("innocent") },
    ];
    let expect = Expect { condition: Some("DiskPressure"), starved_resource: Some("ephemeral-storage") };
    let disk = &d.disk;
    let pressure = move |node: &mut E2eNode| {
        std::thread::sleep(STATS_SETTLE);
        // 10 MiB from where the disk is then: the hog writes 2 MiB a second.
        let (available, _, _) = disk.stat();
        set_config(node, "  nodefs.available", &format!("\"{}\"", available - 10 * MI));
    };
    let relief = |node: &mut E2eNode| set_config(node, "  nodefs.available", "\"1\"");
    d.node.run_eviction_test(&specs, expect, Duration::from_secs(60), TRANSITION, pressure, relief);
}

#[test]
fn local_storage_soft_eviction() {
    let config = format!(
        "evictionHard:\n  memory.available: 100Mi\nevictionSoft:\n  nodefs.available: \"1\"\n\
         evictionSoftGracePeriod:\n  nodefs.available: 5s\nevictionMaxPodGracePeriod: 1\n{TRANSITION_YAML}"
    );
    let mut d = disk_node("soft", 256 * MI, 50_000, &config);
    let specs = [
        EvictSpec {
            name: "container-disk-hog-pod",
            eviction_priority: 1,
            pod: disk_hog("container-disk-hog", "/tmp", 0.5),
        },
        EvictSpec { name: "innocent-pod", eviction_priority: 0, pod: sleeper("innocent") },
    ];
    let expect = Expect { condition: Some("DiskPressure"), starved_resource: Some("ephemeral-storage") };
    let disk = &d.disk;
    let pressure = move |node: &mut E2eNode| {
        std::thread::sleep(STATS_SETTLE);
        // 10 MiB from where the disk is then: the hog writes 2 MiB a second.
        let (available, _, _) = disk.stat();
        set_config(node, "  nodefs.available", &format!("\"{}\"", available - 10 * MI));
    };
    let relief = |node: &mut E2eNode| set_config(node, "  nodefs.available", "\"1\"");
    d.node.run_eviction_test(&specs, expect, Duration::from_secs(60), TRANSITION, pressure, relief);
}

#[test]
fn local_storage_capacity_isolation() {
    let mut node = E2eNode::start("isolation", TRANSITION_YAML, &[]);
    let write =
        |dir: &str, mib: u32| format!("sleep 2; dd if=/dev/zero of={dir}/file bs=1048576 count={mib}; exec sleep 3600");
    let with_volume = |mut pod: serde_json::Value, size_limit: Option<&str>| {
        pod["containers"][0]["volumeMounts"] = json!([{"name": "scratch", "mountPath": "/scratch"}]);
        pod["volumes"] =
            json!([{"name": "scratch", "emptyDir": size_limit.map_or(json!({}), |l| json!({"sizeLimit": l}))}]);
        pod
    };
    let with_limit = |mut pod: serde_json::Value, limit: &str| {
        pod["containers"][0]["resources"] = json!({"limits": {"ephemeral-storage": limit}});
        pod
    };
    let specs = [
        EvictSpec {
            name: "emptydir-disk-sizelimit-pod",
            eviction_priority: 1,
            pod: with_volume(shell("emptydir-disk-sizelimit", &write("/scratch", 30)), Some("20Mi")),
        },
        EvictSpec {
            name: "container-disk-limit-pod",
            eviction_priority: 1,
            pod: with_limit(shell("container-disk-limit", &write("/tmp", 30)), "20Mi"),
        },
        EvictSpec {
            name: "container-emptydir-disk-limit-pod",
            eviction_priority: 1,
            pod: with_limit(with_volume(shell("container-emptydir-disk-limit", &write("/scratch", 30)), None), "20Mi"),
        },
        EvictSpec {
            name: "emptydir-disk-below-sizelimit-pod",
            eviction_priority: 0,
            pod: with_volume(shell("emptydir-disk-below-sizelimit", &write("/scratch", 10)), Some("100Mi")),
        },
        EvictSpec { name: "innocent-pod", eviction_priority: 0, pod: sleeper("innocent") },
    ];
    let expect = Expect { condition: None, starved_resource: None };
    node.run_eviction_test(&specs, expect, Duration::from_secs(60), TRANSITION, |_| {}, |_| {});
}
