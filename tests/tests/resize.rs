//! In-place pod resize on the real containerd, with the real binary as a
//! node of the fake API server and kubectl 1.32 driving the `resize`
//! subresource: a resize that fits changes the running container's cgroup
//! (CFS quota, memory limit) without a restart and shows in the pod's
//! status; a resizePolicy RestartContainer restarts the container once;
//! a resize beyond the node's allocatable is reported PodResizePending /
//! Infeasible and leaves the container as it was.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::{Value, json};
use swiftlet_tests::{
    api_node::{ApiNode, condition},
    apiserver::resources::PODS,
    e2e::wait,
    node_process::PodCleanup,
};

const NODE_CONFIG: &str = "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
nodeStatusUpdateFrequency: 1s
syncFrequency: 5s
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
";
const T: Duration = Duration::from_secs(60);
const MIB: u64 = 1 << 20;

fn cluster(tag: &str) -> ApiNode {
    ApiNode::start(tag, NODE_CONFIG)
}

fn create_pod(c: &ApiNode, cleanup: &PodCleanup, name: &str, container: Value) {
    c.create_pod(cleanup, name, json!({"containers": [container]}), 1);
}

/// A Burstable sleeper: 100m/200m cpu, 32Mi/64Mi memory.
fn sleeper(policy: Option<Value>) -> Value {
    let mut c = json!({
        "name": "c",
        "image": "swiftlet.local/busybox:1.35",
        "command": ["sleep", "3600"],
        "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}},
    });
    if let Some(p) = policy {
        c["resizePolicy"] = p;
    }
    c
}

fn status0(p: &Value) -> &Value {
    &p["status"]["containerStatuses"][0]
}

fn running(c: &ApiNode, name: &str) -> Value {
    wait(&format!("{name} running"), T, || {
        let p = c.server.get(&PODS, "default", name)?;
        (p["status"]["phase"] == "Running" && status0(&p)["state"]["running"].is_object()).then_some(p)
    })
}

fn container_id(p: &Value) -> String {
    let id = status0(p)["containerID"].as_str().unwrap_or_default();
    id.split("://").nth(1).unwrap_or(id).to_owned()
}

/// The container's cgroup directory under a v1 controller (or the v2
/// unified tree), found by its id.
fn find_dir(root: &Path, id: &str, depth: u32) -> Option<PathBuf> {
    for e in std::fs::read_dir(root).ok()?.flatten() {
        let p = e.path();
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if e.file_name().to_string_lossy().ends_with(id) {
            return Some(p);
        }
        if depth > 0
            && let Some(found) = find_dir(&p, id, depth - 1)
        {
            return Some(found);
        }
    }
    None
}

fn v2() -> bool {
    Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// (CFS quota in µs or None, memory limit in bytes or None).
fn cgroup_limits(id: &str) -> Option<(Option<u64>, Option<u64>)> {
    let read = |p: PathBuf| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned());
    if v2() {
        let dir = find_dir(Path::new("/sys/fs/cgroup"), id, 6)?;
        let quota = read(dir.join("cpu.max"))?.split_whitespace().next()?.parse().ok();
        let memory = read(dir.join("memory.max"))?.parse().ok();
        return Some((quota, memory));
    }
    let cpu = find_dir(Path::new("/sys/fs/cgroup/cpu"), id, 6)?;
    let memory = find_dir(Path::new("/sys/fs/cgroup/memory"), id, 6)?;
    let quota = read(cpu.join("cpu.cfs_quota_us"))?.parse::<i64>().ok().and_then(|q| u64::try_from(q).ok());
    let limit = read(memory.join("memory.limit_in_bytes"))?.parse::<u64>().ok().filter(|v| *v < (1 << 62));
    Some((quota, limit))
}

fn resize(c: &ApiNode, name: &str, resources: Value) -> String {
    let patch = json!({"spec": {"containers": [{"name": "c", "resources": resources}]}}).to_string();
    c.kubectl.ok(&["patch", "pod", name, "--subresource", "resize", "--patch", &patch])
}

#[test]
fn resizes_in_place_restart_by_policy_and_report_infeasible() {
    let cleanup = PodCleanup::new();
    let mut c = cluster("resize");

    // In place: the cgroup follows, nothing restarts.
    create_pod(&c, &cleanup, "grow", sleeper(None));
    let p = running(&c, "grow");
    let id = container_id(&p);
    assert_eq!(cgroup_limits(&id), Some((Some(20_000), Some(64 * MIB))), "the limits it started with");
    let out = resize(
        &c,
        "grow",
        json!({"requests": {"cpu": "200m", "memory": "64Mi"}, "limits": {"cpu": "400m", "memory": "128Mi"}}),
    );
    assert!(out.contains("patched"), "{out}");
    wait("the container's cgroup to follow the resize", T, || {
        c.node.assert_running();
        (cgroup_limits(&id) == Some((Some(40_000), Some(128 * MIB)))).then_some(())
    });
    let p = wait("the status to show the new resources", T, || {
        let p = c.server.get(&PODS, "default", "grow")?;
        let s = status0(&p);
        (s["allocatedResources"]["cpu"] == "200m"
            && s["resources"]["limits"]["cpu"] == "400m"
            && s["resources"]["limits"]["memory"] == "128Mi"
            && condition(&p, "PodResizeInProgress").is_none())
        .then_some(p)
    });
    assert_eq!(status0(&p)["restartCount"], 0, "resized in place");
    assert_eq!(container_id(&p), id, "the same container");

    // Beyond the node: Infeasible, and the container keeps its limits.
    resize(&c, "grow", json!({"requests": {"cpu": "1000"}, "limits": {"cpu": "1000"}}));
    let p = wait("PodResizePending", T, || {
        let p = c.server.get(&PODS, "default", "grow")?;
        condition(&p, "PodResizePending").is_some().then_some(p)
    });
    let pending = condition(&p, "PodResizePending").unwrap();
    assert_eq!(pending["reason"], "Infeasible", "{pending}");
    assert!(pending["message"].as_str().unwrap_or("").contains("Node didn't have enough capacity: cpu"), "{pending}");
    assert_eq!(cgroup_limits(&id), Some((Some(40_000), Some(128 * MIB))));
    assert_eq!(status0(&p)["allocatedResources"]["cpu"], "200m", "the allocation stands");

    // RestartContainer for cpu: restarted once, with the new quota.
    create_pod(
        &c,
        &cleanup,
        "restart",
        sleeper(Some(json!([{"resourceName": "cpu", "restartPolicy": "RestartContainer"}]))),
    );
    let p = running(&c, "restart");
    let first = container_id(&p);
    resize(&c, "restart", json!({"requests": {"cpu": "150m"}, "limits": {"cpu": "300m"}}));
    let p = wait("the container restarted", T, || {
        c.node.assert_running();
        let p = c.server.get(&PODS, "default", "restart")?;
        (status0(&p)["restartCount"] == 1 && status0(&p)["state"]["running"].is_object()).then_some(p)
    });
    let second = container_id(&p);
    assert_ne!(first, second);
    assert_eq!(cgroup_limits(&second).map(|l| l.0), Some(Some(30_000)));
    std::thread::sleep(Duration::from_secs(3));
    let p = c.server.get(&PODS, "default", "restart").unwrap();
    assert_eq!(status0(&p)["restartCount"], 1, "restarted once only");

    // A crashed and restarted agent keeps the allocation it checkpointed
    // (not the infeasible spec), re-applies nothing and restarts nothing.
    let uid = c.server.get(&PODS, "default", "grow").unwrap()["metadata"]["uid"].as_str().unwrap().to_owned();
    let checkpoint = std::fs::read_to_string(c.node.root_dir().join("allocated_pods_state")).unwrap();
    assert!(checkpoint.contains(&uid) && checkpoint.contains(r#"\"cpu\":\"200m\""#), "{checkpoint}");
    let applied_before = c.node.log_text().matches("resized in place").count();
    c.node.kill();
    c.node.respawn();
    std::thread::sleep(Duration::from_secs(8));
    wait("the restarted agent to report the pods", T, || {
        c.node.assert_running();
        let p = c.server.get(&PODS, "default", "grow")?;
        condition(&p, "PodResizePending").is_some_and(|x| x["reason"] == "Infeasible").then_some(())
    });
    let p = c.server.get(&PODS, "default", "grow").unwrap();
    assert_eq!((container_id(&p), status0(&p)["restartCount"].clone()), (id.clone(), json!(0)));
    assert_eq!(status0(&p)["allocatedResources"]["cpu"], "200m");
    assert_eq!(cgroup_limits(&id), Some((Some(40_000), Some(128 * MIB))));
    let p = c.server.get(&PODS, "default", "restart").unwrap();
    assert_eq!((container_id(&p), status0(&p)["restartCount"].clone()), (second, json!(1)));
    assert_eq!(c.node.log_text().matches("resized in place").count(), applied_before, "nothing re-applied");

    assert!(c.node.stop());
}
