//! The production node, end to end: swiftlet from its systemd unit on a
//! Debian node with systemd as PID 1, cgroup v2 only and containerd, with
//! the systemd cgroup driver (or cgroupfs, as the VM was booted), driven
//! through a fake API server as a cluster drives a kubelet. Each check
//! needs the node VM: `cargo xtask vmtest --e2e` boots it and runs them in
//! order (the node shutdown, which powers the VM off, last); anywhere else
//! they fail and say so.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use swiftlet_tests::node_vm::{
    Driver, Node, cgroup_file, mem_total, pod_cgroup, qos_cgroup, require_node_vm, sh, sh_ok, unit_property, wait,
};

// A crate root's `mod` looks beside it (tests/tests/storage.rs is the host's
// storage suite): the node's storage checks live in the directory named
// after this target.
#[path = "node_e2e/storage.rs"]
mod storage;

const BUSYBOX: &str = "swiftlet.local/busybox:1.35";
const MIB: u64 = 1 << 20;

fn container(name: &str, command: &str) -> Value {
    json!({"name": name, "image": BUSYBOX, "command": ["sh", "-c", command]})
}

fn pod(name: &str, spec: Value) -> Value {
    let mut spec = spec;
    spec["hostNetwork"] = json!(true);
    if spec.get("terminationGracePeriodSeconds").is_none() {
        spec["terminationGracePeriodSeconds"] = json!(2);
    }
    json!({"metadata": {"name": name}, "spec": spec})
}

fn resources(requests: Value, limits: Value) -> Value {
    json!({"requests": requests, "limits": limits})
}

/// cpu.shares → cpu.weight, as runc and the kubelet convert it.
fn weight(shares: u64) -> u64 {
    1 + ((shares - 2) * 9999) / 262_142
}

/// The kubelet's MilliCPUToShares.
fn shares(milli: u64) -> u64 {
    (milli * 1024 / 1000).max(2)
}

fn container_status<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["status"]["containerStatuses"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no status of container {name}: {}", pod["status"]))
}

/// Checks that the pod's cgroup is where the kubelet puts it, is a
/// transient slice systemd manages (with the systemd driver), and holds
/// every running container of the pod in its own scope (or directory).
fn assert_pod_cgroup(node: &Node, qos: &str, uid: &str) -> String {
    let rel = pod_cgroup(node.driver, qos, uid);
    assert!(std::path::Path::new("/sys/fs/cgroup").join(&rel).is_dir(), "/sys/fs/cgroup/{rel} exists");
    let (_, containers) = node.runtime(uid);
    let running: Vec<_> = containers.iter().filter(|c| c.state == 1).collect();
    assert!(!running.is_empty(), "the pod has running containers");
    // A container that exited has no cgroup left (systemd removed its scope).
    for c in running {
        let child = match node.driver {
            Driver::Systemd => format!("cri-containerd-{}.scope", c.id),
            Driver::Cgroupfs => c.id.clone(),
        };
        assert!(
            std::path::Path::new("/sys/fs/cgroup").join(&rel).join(&child).is_dir(),
            "container {} sits in {rel}/{child}",
            c.metadata.as_ref().map(|m| m.name.as_str()).unwrap_or_default()
        );
    }
    if node.driver == Driver::Systemd {
        let unit = rel.rsplit('/').next().unwrap_or_default();
        assert_eq!(unit_property(unit, "ActiveState"), "active", "{unit} is an active unit");
        assert_eq!(unit_property(unit, "Transient"), "yes", "{unit} is a transient unit made over D-Bus");
    }
    rel
}

#[test]
#[ignore = "runs in the node VM: cargo xtask vmtest --e2e"]
fn a_pod_with_init_and_probes_runs_in_its_slice_with_the_kubelets_limits() {
    let node = Node::start("podPidsLimit: 512\n", "");
    // The app fails its liveness probe once (8 s after its first start) and
    // is restarted; the marker in the emptyDir tells the second run to stay
    // healthy. The init container must have run first.
    let app = "test -e /data/init-done || exit 3; \
               if [ -e /data/restarted ]; then touch /tmp/alive; exec sleep 3600; fi; \
               touch /data/restarted /tmp/alive; sleep 8; rm /tmp/alive; exec sleep 3600";
    let mut main = container("app", app);
    main["resources"] = resources(json!({"cpu": "100m", "memory": "64Mi"}), json!({"cpu": "250m", "memory": "128Mi"}));
    main["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
    let probe = json!({"exec": {"command": ["test", "-f", "/tmp/alive"]}, "periodSeconds": 2, "failureThreshold": 2});
    main["livenessProbe"] = probe.clone();
    main["readinessProbe"] = json!({"exec": {"command": ["test", "-f", "/tmp/alive"]}, "periodSeconds": 2});
    main["startupProbe"] = json!({"exec": {"command": ["test", "-e", "/data/init-done"]}, "periodSeconds": 1});
    let mut init = container("init", "echo done > /data/init-done");
    init["resources"] = resources(json!({"cpu": "50m", "memory": "32Mi"}), json!({"cpu": "100m", "memory": "64Mi"}));
    init["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
    let uid = node.create_pod(pod(
        "probed",
        json!({"initContainers": [init], "containers": [main], "volumes": [{"name": "data", "emptyDir": {}}]}),
    ));
    let p = node.wait_pod(
        "probed",
        "restarted once by its liveness probe, then Running and Ready",
        Duration::from_secs(240),
        |p| {
            p["status"]["phase"] == "Running"
                && p["status"]["containerStatuses"].as_array().is_some_and(|cs| {
                    cs.iter().any(|c| c["name"] == "app" && c["restartCount"] == 1 && c["ready"] == true)
                })
        },
    );
    let init_status = &p["status"]["initContainerStatuses"][0];
    assert_eq!(init_status["state"]["terminated"]["exitCode"], 0, "the init container completed: {init_status}");
    let last = &container_status(&p, "app")["lastState"]["terminated"];
    assert_eq!(last["exitCode"], 137, "the first run was killed for its liveness probe: {last}");

    // The pod cgroup as the kubelet computes it (ResourceConfigForPod):
    // Burstable; cpu shares from the larger of the app's request (100m) and
    // the init container's (50m): 102 shares; CFS quota from the limits,
    // set on every container: 250m of a 100 ms period; memory.max from the
    // larger of the app's (128Mi) and the init container's (64Mi) limits;
    // pids.max = podPidsLimit.
    let rel = assert_pod_cgroup(&node, "burstable", &uid);
    assert_eq!(cgroup_file(&rel, "cpu.weight"), weight(102).to_string(), "cpu.weight of {rel}");
    assert_eq!(cgroup_file(&rel, "cpu.max"), "25000 100000", "cpu.max of {rel}");
    assert_eq!(cgroup_file(&rel, "memory.max"), (128 * MIB).to_string(), "memory.max of {rel}");
    assert_eq!(cgroup_file(&rel, "pids.max"), "512", "pids.max of {rel}");
    if node.driver == Driver::Systemd {
        let unit = rel.rsplit('/').next().unwrap_or_default();
        assert_eq!(unit_property(unit, "MemoryMax"), (128 * MIB).to_string());
        assert_eq!(unit_property(unit, "TasksMax"), "512");
        assert_eq!(unit_property(unit, "CPUQuotaPerSecUSec"), "250ms");
    }
    // Stats find the containers' cgroups under the driver's names.
    wait("/stats/summary to report the app container's memory", Duration::from_secs(60), || {
        let summary: Value = serde_json::from_str(&node.try_kubelet_get("/stats/summary")?).ok()?;
        let pods = summary["pods"].as_array()?;
        let probed = pods.iter().find(|p| p["podRef"]["name"] == "probed")?;
        let app = probed["containers"].as_array()?.iter().find(|c| c["name"] == "app")?;
        (app["memory"]["workingSetBytes"].as_u64()? > 0).then_some(())
    });
    node.delete_pod("probed", Duration::from_secs(60));
    wait("the pod cgroup to be removed", Duration::from_secs(30), || {
        (!std::path::Path::new("/sys/fs/cgroup").join(&rel).exists()).then_some(())
    });
    if node.driver == Driver::Systemd {
        // Listing does not load a unit (asking for its properties would
        // synthesise an empty slice): the stopped slice is gone from systemd.
        let unit = rel.rsplit('/').next().unwrap_or_default().to_owned();
        wait(&format!("systemd to drop {unit} once the pod is gone"), Duration::from_secs(20), || {
            sh_ok("systemctl", &["list-units", "--all", "--plain", "--no-legend", &unit])
                .trim()
                .is_empty()
                .then_some(())
        });
    }
}

#[test]
#[ignore = "runs in the node VM: cargo xtask vmtest --e2e"]
fn qos_classes_land_in_their_slices_under_node_allocatable() {
    // Huge pages on the node before the agent reads its capacity.
    std::fs::write("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "16").expect("16 huge pages of 2 MiB");
    // Node allocatable enforced on kubepods: capacity − systemReserved −
    // kubeReserved (the eviction threshold is left to the eviction manager).
    let node = Node::start(
        "enforceNodeAllocatable: [pods]\nsystemReserved:\n  cpu: 200m\n  memory: 512Mi\nkubeReserved:\n  memory: 256Mi\n",
        "",
    );
    let g = container("g", "exec sleep 3600");
    let mut g = g;
    g["resources"] = resources(
        json!({"cpu": "100m", "memory": "64Mi", "hugepages-2Mi": "4Mi"}),
        json!({"cpu": "100m", "memory": "64Mi", "hugepages-2Mi": "4Mi"}),
    );
    let mut b1 = container("b", "exec sleep 3600");
    b1["resources"] = json!({"requests": {"cpu": "500m"}});
    let mut b2 = container("b", "exec sleep 3600");
    b2["resources"] = json!({"requests": {"cpu": "250m"}});
    let be = container("be", "exec sleep 3600");
    let uids: Vec<(&str, &str, String)> =
        [("guaranteed", "g", g), ("burstable", "b1", b1), ("burstable", "b2", b2), ("besteffort", "be", be)]
            .into_iter()
            .map(|(qos, name, c)| (qos, name, node.create_pod(pod(name, json!({"containers": [c]})))))
            .collect();
    for (qos, name, uid) in &uids {
        node.wait_running(name, Duration::from_secs(120));
        let rel = assert_pod_cgroup(&node, qos, uid);
        let parent = rel.rsplit_once('/').map(|(p, _)| p).unwrap_or_default();
        assert_eq!(parent, qos_cgroup(node.driver, qos), "{name} sits in its QoS cgroup");
    }
    let g_rel = pod_cgroup(node.driver, "guaranteed", &uids[0].2);
    assert_eq!(cgroup_file(&g_rel, "memory.max"), (64 * MIB).to_string());
    assert_eq!(cgroup_file(&g_rel, "cpu.max"), "10000 100000");
    // The pod may take the huge pages it asked for and none of another size.
    for size in std::fs::read_dir("/sys/kernel/mm/hugepages").expect("huge page sizes").flatten() {
        let kb: u64 =
            size.file_name().to_string_lossy().trim_start_matches("hugepages-").trim_end_matches("kB").parse().unwrap();
        let (name, want) = match kb {
            2048 => ("2MB", 4 * MIB),
            1048576 => ("1GB", 0),
            other => panic!("a huge page size the check does not know: {other} kB"),
        };
        assert_eq!(
            cgroup_file(&g_rel, &format!("hugetlb.{name}.max")),
            want.to_string(),
            "hugetlb.{name}.max of {g_rel}"
        );
    }

    // kubepods: memory capacity − 768Mi; cpu shares of 2 CPUs − 200m;
    // pids.max the node's pid limit (nothing reserved).
    let kubepods = qos_cgroup(node.driver, "guaranteed");
    let cores = std::thread::available_parallelism().map(|n| n.get() as u64).unwrap_or(1);
    assert_eq!(cgroup_file(&kubepods, "memory.max"), (mem_total() - 768 * MIB).to_string(), "kubepods memory.max");
    assert_eq!(
        cgroup_file(&kubepods, "cpu.weight"),
        weight(shares(cores * 1000 - 200)).to_string(),
        "kubepods cpu.weight"
    );
    if node.driver == Driver::Systemd {
        assert_eq!(unit_property("kubepods.slice", "MemoryMax"), (mem_total() - 768 * MIB).to_string());
        assert_eq!(unit_property("kubepods.slice", "Transient"), "yes");
    }
    // The QoS cgroups: BestEffort at the minimum; Burstable following its
    // pods' requests (500m + 250m), as the kubelet's QoS manager keeps it.
    let burstable = qos_cgroup(node.driver, "burstable");
    assert_eq!(cgroup_file(&qos_cgroup(node.driver, "besteffort"), "cpu.weight"), weight(2).to_string());
    wait("the Burstable weight for 750m", Duration::from_secs(30), || {
        (cgroup_file(&burstable, "cpu.weight") == weight(shares(750)).to_string()).then_some(())
    });
    node.delete_pod("b2", Duration::from_secs(60));
    wait("the Burstable weight for 500m once b2 is gone", Duration::from_secs(30), || {
        (cgroup_file(&burstable, "cpu.weight") == weight(shares(500)).to_string()).then_some(())
    });
}

/// The kubelet's memory.available on cgroup v2: capacity − the root's
/// working set (anon + file − inactive_file).
fn memory_available() -> u64 {
    let stat = std::fs::read_to_string("/sys/fs/cgroup/memory.stat").expect("the root's memory.stat");
    let get = |k: &str| -> u64 {
        stat.lines()
            .find_map(|l| l.strip_prefix(k).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0)
    };
    mem_total().saturating_sub(get("anon") + get("file") - get("inactive_file"))
}

fn kubepods_oom_kills(node: &Node) -> u64 {
    let events = cgroup_file(&qos_cgroup(node.driver, "guaranteed"), "memory.events");
    events.lines().find_map(|l| l.strip_prefix("oom_kill ").and_then(|v| v.trim().parse().ok())).unwrap_or(0)
}

#[test]
#[ignore = "runs in the node VM: cargo xtask vmtest --e2e"]
fn a_best_effort_hog_is_killed_in_the_kernel_at_memory_available() {
    require_node_vm();
    // The line sits 400 MiB below what is available now, so the hog (up to
    // 900 MiB, 1 MiB at a time) crosses it; the VM has room to spare, so the
    // kernel's OOM killer has no reason to act.
    let line = (memory_available() - 400 * MIB) / MIB;
    let node = Node::start(&format!("evictionHard:\n  memory.available: {line}Mi\n"), "--kernel-eviction=true");
    let mut steady = container("steady", "exec sleep 3600");
    steady["resources"] = resources(json!({"cpu": "100m", "memory": "64Mi"}), json!({"cpu": "100m", "memory": "64Mi"}));
    node.create_pod(pod("steady", json!({"containers": [steady]})));
    node.wait_running("steady", Duration::from_secs(120));
    let hog = container(
        "hog",
        "exec awk 'BEGIN { for (n = 1; n <= 900; n++) { a[n] = sprintf(\"%1048576s\", \"\"); if (n % 32 == 0) system(\"sleep 0.25\") } system(\"sleep 3600\") }'",
    );
    node.create_pod(pod("hog", json!({"containers": [hog]})));
    let p = node.wait_pod("hog", "Failed/Evicted", Duration::from_secs(240), |p| p["status"]["reason"] == "Evicted");
    assert_eq!(p["status"]["phase"], "Failed");
    let message = p["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(&format!("The node was low on resource: memory. Threshold quantity: {line}Mi")),
        "{message}"
    );
    let killed = node.metric("swiftlet_eviction_crossing_to_kill_seconds_count{path=\"kernel\"}");
    assert_eq!(killed, Some(1.0), "the kernel program killed the hog at the crossing");
    assert_eq!(kubepods_oom_kills(&node), 0, "the kernel OOM killer never fired");
    let steady = node.pod("steady").expect("steady");
    assert_eq!(steady["status"]["phase"], "Running");
    assert_eq!(container_status(&steady, "steady")["restartCount"], 0, "the Guaranteed pod was not touched");
    let shown = node.kubectl.ok(&["get", "pod", "hog", "-o", "jsonpath={.status.phase}/{.status.reason}"]);
    assert_eq!(shown, "Failed/Evicted", "what kubectl shows of the hog");
}

/// The classic LRU for the life of the guard. With the multi-gen LRU on
/// (6.12's default), page cache read with read(2) stays in the oldest
/// generations, which memory.stat counts as inactive_file: the working set
/// never holds it, and the problem reclaim-first answers does not arise.
/// On the classic LRU a second read makes the pages active.
struct ClassicLru(Option<String>);

impl ClassicLru {
    const KNOB: &'static str = "/sys/kernel/mm/lru_gen/enabled";

    fn switch() -> ClassicLru {
        let was = std::fs::read_to_string(Self::KNOB).ok().map(|s| s.trim().to_owned());
        if was.is_some() {
            std::fs::write(Self::KNOB, "n").expect("turn the multi-gen LRU off in the node VM");
        }
        ClassicLru(was)
    }
}

impl Drop for ClassicLru {
    fn drop(&mut self) {
        if let Some(was) = &self.0 {
            let _ = std::fs::write(Self::KNOB, was);
        }
    }
}

/// memory.stat's working-set fields of a cgroup (the root: "/"), for
/// failure messages.
fn working_set_fields(rel: &str) -> String {
    let stat = std::fs::read_to_string(Path::new("/sys/fs/cgroup").join(rel.trim_matches('/')).join("memory.stat"))
        .unwrap_or_default();
    let keep = ["anon ", "file ", "active_file ", "inactive_file "];
    stat.lines().filter(|l| keep.iter().any(|k| l.starts_with(k))).collect::<Vec<_>>().join(", ")
}

/// Reclaim before evicting (`--memory-reclaim-before-eviction`): a pod
/// that re-reads a file set larger than the distance to the line pushes
/// the node's working set over it with page cache; swiftlet reclaims that
/// cache and evicts no one. A BestEffort anonymous hog afterwards is
/// evicted, before the kernel's OOM killer has a reason to act.
#[test]
#[ignore = "runs in the node VM: cargo xtask vmtest --e2e"]
fn page_cache_over_the_line_is_reclaimed_and_an_anonymous_hog_evicted() {
    require_node_vm();
    let _lru = ClassicLru::switch();
    let line = (memory_available() - 80 * MIB) / MIB;
    let node = Node::start(
        // (The node's configuration holds the condition for 10 s.)
        &format!("evictionHard:\n  memory.available: {line}Mi\n"),
        "--kernel-eviction=true --memory-reclaim-before-eviction=true",
    );
    // 128 MiB of files, written and synced once (dirty pages cannot be
    // reclaimed), then read every 2 s, 12 times: from the second read on
    // they are active page cache, which the working set counts.
    let mut cache = container(
        "cache",
        "mkdir -p /data && for i in 1 2 3 4; do dd if=/dev/zero of=/data/f$i bs=1M count=32 2>/dev/null; done; \
         sync; for n in 1 2 3 4 5 6 7 8 9 10 11 12; do cat /data/f* > /dev/null; sleep 2; done; exec sleep 3600",
    );
    // Its request covers what it holds (within the small allocatable that
    // so high a threshold leaves): the BestEffort hog, over its request
    // of nothing, ranks before it.
    cache["resources"] = resources(json!({"memory": "160Mi"}), json!({}));
    let cache_uid = node.create_pod(pod("cache", json!({"containers": [cache]})));
    node.wait_running("cache", Duration::from_secs(120));
    let reclaims = |node: &Node| {
        ["done", "short"]
            .iter()
            .filter_map(|r| node.metric(&format!("swiftlet_memory_reclaim_total{{result=\"{r}\"}}")))
            .sum::<f64>()
    };
    let cache_cgroup = pod_cgroup(node.driver, "burstable", &cache_uid);
    let started = Instant::now();
    let mut last_print = Instant::now();
    while reclaims(&node) < 1.0 {
        // What the node and the pod hold, now and then, and at the end.
        let (root, pod) = (working_set_fields("/"), working_set_fields(&cache_cgroup));
        let available = memory_available() / MIB;
        if last_print.elapsed() > Duration::from_secs(10) {
            eprintln!("available {available}Mi (line {line}Mi); root: {root}; cache pod: {pod}");
            last_print = Instant::now();
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "no page cache reclaimed at the line in 90 s: available {available}Mi (line {line}Mi); root: {root}; \
             cache pod: {pod}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // What the agent measured: the pod's file pages before − after.
    let reclaimed = node.metric("swiftlet_memory_reclaimed_bytes_total").unwrap_or(0.0);
    assert!(reclaimed >= (16 * MIB) as f64, "the cache pod's page cache shrank: {reclaimed} bytes reclaimed");
    let deferred: f64 = ["deferred_file_growth", "deferred_unknown_growth"]
        .iter()
        .filter_map(|o| node.metric(&format!("swiftlet_kernel_plan_outcomes_total{{outcome=\"{o}\"}}")))
        .sum();
    assert!(deferred >= 1.0, "the kernel left the page-cache crossing to the agent");
    // Reading on for a while: still no eviction.
    std::thread::sleep(Duration::from_secs(5));
    let cache_pod = node.pod("cache").expect("the cache pod");
    assert_eq!(cache_pod["status"]["phase"], "Running", "the cache pod was not evicted: {}", cache_pod["status"]);
    assert_eq!(container_status(&cache_pod, "cache")["restartCount"], 0);
    assert_eq!(node.metric("kubelet_evictions_total{eviction_signal=\"memory.available\"}"), None);

    // The reads over, the pressure ends; a BestEffort pod is admitted
    // again once MemoryPressure is no longer reported (the kubelet's
    // admission refuses it before).
    let condition = "swiftlet_node_condition{condition=\"MemoryPressure\"}";
    wait("MemoryPressure to clear", Duration::from_secs(120), || (node.metric(condition) == Some(0.0)).then_some(()));
    let hog = container(
        "hog",
        "exec awk 'BEGIN { for (n = 1; n <= 900; n++) { a[n] = sprintf(\"%1048576s\", \"\"); if (n % 32 == 0) system(\"sleep 0.25\") } system(\"sleep 3600\") }'",
    );
    node.create_pod(pod("hog", json!({"containers": [hog]})));
    let p = node.wait_pod("hog", "Failed/Evicted", Duration::from_secs(120), |p| p["status"]["reason"] == "Evicted");
    let message = p["status"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("The node was low on resource: memory."), "{message}");
    assert_eq!(kubepods_oom_kills(&node), 0, "the kernel OOM killer never fired");
    let cache_pod = node.pod("cache").expect("the cache pod");
    assert_eq!(cache_pod["status"]["phase"], "Running", "the hog went, not the cache pod");
    let age = node.metric("kubelet_eviction_stats_age_seconds_count{eviction_signal=\"memory.available\"}");
    assert_eq!(age, Some(1.0), "the stats age of the one eviction");
}

fn node_tasks() -> u64 {
    let s = std::fs::read_to_string("/proc/loadavg").expect("/proc/loadavg");
    s.split_whitespace().nth(3).and_then(|f| f.split('/').nth(1)).and_then(|n| n.parse().ok()).expect("tasks")
}

fn pid_limit() -> u64 {
    let read = |p: &str| std::fs::read_to_string(p).ok().and_then(|s| s.trim().parse::<u64>().ok());
    let pid_max = read("/proc/sys/kernel/pid_max").expect("kernel.pid_max");
    read("/proc/sys/kernel/threads-max").map_or(pid_max, |t| t.min(pid_max))
}

#[test]
#[ignore = "runs in the node VM: cargo xtask vmtest --e2e"]
fn a_fork_bomb_pod_is_evicted_under_pid_pressure() {
    require_node_vm();
    // The node is quiet: the line sits 300 tasks above what runs now (the
    // agent and the steady pod included, with room for both to settle),
    // and the bomb is capped at 600 by podPidsLimit, so it crosses.
    let node = Node::start("podPidsLimit: 600\nevictionHard:\n  pid.available: \"1\"\n", "");
    let steady = container("steady", "exec sleep 3600");
    node.create_pod(pod("steady", json!({"containers": [steady]})));
    node.wait_running("steady", Duration::from_secs(120));
    let line = pid_limit() - (node_tasks() + 300);
    node.reconfigure(&format!("podPidsLimit: 600\nevictionHard:\n  pid.available: \"{line}\"\n"), "");
    node.wait_running("steady", Duration::from_secs(120));
    let bomb = container("bomb", "sh -c 'while :; do sleep 1000 & done' & exec sleep 3600");
    node.create_pod(pod("bomb", json!({"containers": [bomb], "terminationGracePeriodSeconds": 1})));
    let p = node.wait_pod("bomb", "Failed/Evicted", Duration::from_secs(240), |p| p["status"]["reason"] == "Evicted");
    let message = p["status"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("The node was low on resource: pids."), "{message}");
    let steady = node.pod("steady").expect("steady");
    assert_eq!(steady["status"]["phase"], "Running", "the pod beside the bomb keeps running");
    assert_eq!(container_status(&steady, "steady")["restartCount"], 0);
}

#[test]
#[ignore = "runs in the node VM: cargo xtask vmtest --e2e"]
fn a_killed_agent_and_a_restarted_containerd_recreate_nothing() {
    let node = Node::start("", "");
    let uid = node.create_pod(pod("web", json!({"containers": [container("web", "exec sleep 3600")]})));
    node.wait_running("web", Duration::from_secs(120));
    let before = node.runtime_ids(&uid);
    // SIGKILL: systemd restarts the agent (Restart=always); the pod runs on.
    node.kill_agent();
    std::thread::sleep(Duration::from_secs(5));
    let p = node.wait_running("web", Duration::from_secs(60));
    assert_eq!(container_status(&p, "web")["restartCount"], 0, "re-adopted with no restart");
    assert_eq!(node.runtime_ids(&uid), before, "same sandbox and container after the agent's SIGKILL");

    // containerd restarted: the agent reconnects and recreates nothing.
    sh_ok("systemctl", &["restart", "containerd.service"]);
    std::thread::sleep(Duration::from_secs(10));
    let p = node.wait_running("web", Duration::from_secs(60));
    assert_eq!(container_status(&p, "web")["restartCount"], 0);
    assert_eq!(node.runtime_ids(&uid), before, "same sandbox and container after containerd's restart");
    assert!(node.journal().contains("container runtime"), "the agent logged the runtime");
}

/// The pod's memory.pressure `some` total in µs, and its `psi` from a
/// /stats/summary pass taken after `after` (the pass's time).
fn summary_pod_psi(node: &Node, pod: &str, after: k8s_openapi::jiff::Timestamp) -> Value {
    wait("a /stats/summary pass with the pod's PSI", Duration::from_secs(30), || {
        let s: Value = serde_json::from_str(&node.kubelet_get("/stats/summary")).ok()?;
        let p = s["pods"].as_array()?.iter().find(|p| p["podRef"]["name"] == pod)?.clone();
        let at: k8s_openapi::jiff::Timestamp = p["memory"]["time"].as_str()?.parse().ok()?;
        (at > after && p["memory"]["psi"].is_object()).then_some(p)
    })
}

#[test]
#[ignore = "runs in the node VM: cargo xtask vmtest --e2e"]
fn psi_in_stats_and_metrics_and_the_memory_pressure_signal_on_a_stalled_pod() {
    use swiftlet::psi;
    let node = Node::start(
        "",
        "--eviction-memory-pressure=10 --eviction-memory-pressure-grace-period=2s --housekeeping-interval=1s",
    );
    // Both critical: the node's signal, which the stalled pod raises too
    // (the node's memory.pressure counts every stall), evicts neither, so
    // what the pods' own signal does is seen alone.
    let critical = |mut spec: Value| {
        spec["priorityClassName"] = json!("system-cluster-critical");
        spec["priority"] = json!(2_000_000_000);
        spec
    };
    node.create_pod(pod("idle", critical(json!({"containers": [container("idle", "exec sleep 3600")]}))));
    // It leaves the test 10 s to set memory.high, then rewrites 64 MiB over
    // and over: with no swap, every page above memory.high is throttled,
    // which the kernel counts as a memory stall of the pod.
    let churn = "sleep 10; \
                 exec awk 'BEGIN { while (1) for (n = 1; n <= 64; n++) a[n] = sprintf(\"%1048576s\", n) }'";
    let uid = node.create_pod(pod("stalled", critical(json!({"containers": [container("churn", churn)]}))));
    node.wait_running("idle", Duration::from_secs(120));
    node.wait_running("stalled", Duration::from_secs(120));
    let rel = pod_cgroup(node.driver, "besteffort", &uid);
    let dir = std::path::Path::new("/sys/fs/cgroup").join(&rel);
    std::fs::write(dir.join("memory.high"), format!("{}", 16 * MIB)).expect("memory.high on the stalled pod");

    // /stats/summary: the pod's PSI is its cgroup's pressure files as a pass
    // read them, so the totals lie between two reads around that pass.
    let started = k8s_openapi::jiff::Timestamp::now();
    let before = psi::read_cgroup_dir(&dir);
    let p = summary_pod_psi(&node, "stalled", started);
    let after = psi::read_cgroup_dir(&dir);
    for (resource, got, b, a) in [
        ("memory", &p["memory"]["psi"], before.memory, after.memory),
        ("cpu", &p["cpu"]["psi"], before.cpu, after.cpu),
        ("io", &p["io"]["psi"], before.io, after.io),
    ] {
        let (b, a) = (b.expect("the pod's pressure file"), a.expect("the pod's pressure file"));
        let total = got["some"]["total"].as_u64().unwrap_or_else(|| panic!("{resource}.psi.some.total: {p}"));
        assert!(
            b.some.total_us <= total && total <= a.some.total_us,
            "pod {resource} some total {total} not between {} and {}",
            b.some.total_us,
            a.some.total_us
        );
    }
    let c = p["containers"].as_array().and_then(|cs| cs.iter().find(|c| c["name"] == "churn")).expect("churn");
    assert!(c["memory"]["psi"]["full"]["total"].is_u64() && c["io"]["psi"]["some"]["avg10"].is_number(), "{c}");
    let cadvisor = node.kubelet_get("/metrics/cadvisor");
    for name in ["container_pressure_memory_waiting_seconds_total", "container_pressure_cpu_stalled_seconds_total"] {
        assert!(
            cadvisor.lines().any(|l| l.starts_with(name) && l.contains("container=\"churn\"")),
            "{name} for the container missing"
        );
    }

    // The signal: the stalled pod gets a warning, the idle one nothing.
    let stall_events = |pod: &str| -> usize {
        node.api
            .list(&swiftlet_tests::apiserver::resources::EVENTS, Some("default"))
            .iter()
            .filter(|e| e["reason"] == "MemoryPressureStall" && e["involvedObject"]["name"] == pod)
            .count()
    };
    wait("a MemoryPressureStall event on the stalled pod", Duration::from_secs(60), || {
        (stall_events("stalled") > 0).then_some(())
    });
    assert!(node.metric("swiftlet_memory_pressure_firings_total{scope=\"pod\"}").unwrap_or(0.0) >= 1.0);
    assert_eq!(stall_events("idle"), 0, "the idle pod never stalled");
    // The node's figure counts the pod's stalls: its condition is set (with
    // nothing evictable here).
    wait("the node's SystemMemoryContentionPressure condition", Duration::from_secs(60), || {
        let status = node.kubectl.ok(&[
            "get",
            "nodes",
            "-o",
            "jsonpath={.items[0].status.conditions[?(@.type==\"SystemMemoryContentionPressure\")].status}",
        ]);
        (status == "True").then_some(())
    });
    for name in ["idle", "stalled"] {
        let p = node.pod(name).expect("the pod");
        assert_eq!(p["status"]["phase"], "Running", "{name}: critical pods are never evicted");
    }
}

#[test]
#[ignore = "runs in the node VM: cargo xtask vmtest --e2e"]
fn graceful_node_shutdown_through_logind_stops_pods_by_priority() {
    // Longer than logind's default InhibitDelayMaxSec (5 s): the agent must
    // raise it with the kubelet's drop-in.
    let node = Node::start("shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n", "");
    // The regular pod takes 3 s to stop, the critical one none: stopped in
    // priority order, the critical pod stops after the regular one; stopped
    // together, it would stop first.
    let regular = node.create_pod(pod(
        "regular",
        json!({"containers": [container("c", "trap 'sleep 3; exit 0' TERM; sleep 3600 & wait")], "terminationGracePeriodSeconds": 10}),
    ));
    let critical = node.create_pod(pod(
        "critical",
        json!({"priorityClassName": "system-node-critical", "priority": 2000001000,
               "containers": [container("c", "trap 'exit 0' TERM; sleep 3600 & wait")], "terminationGracePeriodSeconds": 10}),
    ));
    node.wait_running("regular", Duration::from_secs(120));
    node.wait_running("critical", Duration::from_secs(120));

    // A plain SIGTERM stops the agent only.
    sh_ok("systemctl", &["stop", "swiftlet.service"]);
    std::thread::sleep(Duration::from_secs(3));
    for uid in [&regular, &critical] {
        let (sandboxes, containers) = node.runtime(uid);
        assert!(sandboxes.iter().all(|s| s.state == 0), "the pod's sandbox still runs with the agent stopped");
        assert!(!containers.is_empty() && containers.iter().all(|c| c.state == 1), "its containers still run");
    }
    sh_ok("systemctl", &["start", "swiftlet.service"]);
    node.wait_ready(Duration::from_secs(180));
    wait("the restarted agent to know both pods", Duration::from_secs(120), || {
        let pods = node.try_kubelet_get("/pods")?;
        (pods.contains("\"regular\"") && pods.contains("\"critical\"")).then_some(())
    });
    let inhibitors = wait("the agent's delay inhibitor lock", Duration::from_secs(60), || {
        let text = sh_ok("systemd-inhibit", &["--list", "--no-pager"]);
        text.lines().any(|l| l.contains("swiftlet") && l.contains("delay") && l.contains("shutdown")).then_some(text)
    });
    assert!(inhibitors.contains("Kubelet needs time to handle node shutdown"), "{inhibitors}");
    assert_eq!(
        sh_ok(
            "busctl",
            &[
                "get-property",
                "org.freedesktop.login1",
                "/org/freedesktop/login1",
                "org.freedesktop.login1.Manager",
                "InhibitDelayMaxUSec"
            ]
        )
        .trim(),
        "t 30000000",
        "logind's delay was raised to shutdownGracePeriod"
    );

    // The node goes down: the regular pod stops first, the critical one
    // after it, each Failed with the kubelet's reason, before the agent
    // releases its lock. This test must outlive the shutdown it started.
    // SAFETY: ignoring SIGTERM has no preconditions.
    unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
    let started = Instant::now();
    let _ = sh("systemctl", &["poweroff", "--no-block"]);
    let stopped_at = |uid: &str| -> Option<Duration> {
        let (sandboxes, _) = node.runtime(uid);
        sandboxes.iter().all(|s| s.state != 0).then(|| started.elapsed())
    };
    let mut regular_at = None;
    let mut critical_at = None;
    while (regular_at.is_none() || critical_at.is_none()) && started.elapsed() < Duration::from_secs(40) {
        regular_at = regular_at.or_else(|| stopped_at(&regular));
        critical_at = critical_at.or_else(|| stopped_at(&critical));
        std::thread::sleep(Duration::from_millis(100));
    }
    let (r, c) = (regular_at.expect("the regular pod stopped"), critical_at.expect("the critical pod stopped"));
    println!("regular pod stopped {r:?} after the power-off, the critical one {c:?}");
    assert!(c > r, "the critical pod stops after the regular one ({c:?} vs {r:?}): stopped by priority");
    for name in ["regular", "critical"] {
        node.wait_pod(name, "Failed with reason Terminated", Duration::from_secs(10), |p| {
            p["status"]["phase"] == "Failed" && p["status"]["reason"] == "Terminated"
        });
    }
    let journal = node.journal();
    assert!(journal.contains("PrepareForShutdown"), "the shutdown came from logind:\n{journal}");
    // The node is going down; nothing to clean.
    std::mem::forget(node);
}
