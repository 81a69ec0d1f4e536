//! Pod-level resources (`spec.resources`) on the real containerd, through
//! the whole agent: for each QoS class, the class the API server computes
//! from the pod level, and the pod cgroup's memory limit, CFS quota and cpu
//! shares from the pod-level limits and requests, and the containers'
//! cgroups the pod-level limits they do not set themselves. A manifest the API
//! server would refuse for its pod-level resources is refused. (Not the
//! PodResources gRPC API: that is tests/tests/device_plugin.rs.)

use std::time::Duration;

use k8s_openapi::api::core::v1::PodStatus;
use swiftlet::{
    cgroups::{CgroupFs, Version},
    cm::qos::QosClass,
};
use swiftlet_tests::agent::TestAgent;

const BUSYBOX: &str = "swiftlet.local/busybox:1.35";
const T: Duration = Duration::from_secs(60);
const MIB: u64 = 1 << 20;

/// A host-network static pod with two containers without resources of
/// their own and `resources` (YAML, indented by four spaces) at the pod
/// level.
fn manifest(name: &str, resources: &str) -> String {
    let c = |n: &str| format!("  - name: {n}\n    image: {BUSYBOX}\n    command: [\"sleep\", \"3600\"]\n");
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  resources:\n{resources}  containers:\n{}{}",
        c("a"),
        c("b")
    )
}

fn read(fs: &CgroupFs, controller: &str, rel: &str, file: &str) -> String {
    let p = fs.controller_dir(controller, rel).join(file);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).trim().to_owned()
}

/// The pod cgroup's memory limit, None when unlimited.
fn memory_limit(fs: &CgroupFs, rel: &str) -> Option<u64> {
    let raw = match fs.version() {
        Version::V1 => read(fs, "memory", rel, "memory.limit_in_bytes"),
        Version::V2 => read(fs, "memory", rel, "memory.max"),
    };
    // v1 spells "unlimited" as the largest page-aligned i64.
    raw.parse::<u64>().ok().filter(|v| *v < (1 << 62))
}

/// The pod cgroup's CFS quota in µs, None when unlimited.
fn cfs_quota(fs: &CgroupFs, rel: &str) -> Option<u64> {
    let raw = match fs.version() {
        Version::V1 => read(fs, "cpu", rel, "cpu.cfs_quota_us"),
        Version::V2 => read(fs, "cpu", rel, "cpu.max").split_whitespace().next().unwrap_or_default().to_owned(),
    };
    raw.parse::<i64>().ok().and_then(|v| u64::try_from(v).ok())
}

/// cpu.shares on v1; on v2 the shares runc's conversion gives cpu.weight.
fn cpu_shares_matches(fs: &CgroupFs, rel: &str, shares: u64) -> bool {
    match fs.version() {
        Version::V1 => read(fs, "cpu", rel, "cpu.shares") == shares.to_string(),
        Version::V2 => read(fs, "cpu", rel, "cpu.weight") == swiftlet::cgroups::shares_to_weight(shares).to_string(),
    }
}

fn running(s: &PodStatus) -> bool {
    s.phase.as_deref() == Some("Running")
        && s.container_statuses
            .iter()
            .flatten()
            .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
            .count()
            == 2
}

struct Case {
    name: &'static str,
    resources: &'static str,
    qos: QosClass,
    memory: Option<u64>,
    quota: Option<u64>,
    shares: u64,
}

#[test]
fn the_pod_level_sets_the_qos_class_and_the_pod_cgroup() {
    let a = TestAgent::start("", &["--signal-source=cgroupfs"]);
    let cases = [
        Case {
            // Limits only: the requests default to them.
            name: "guaranteed",
            resources: "    limits: {cpu: 500m, memory: 96Mi}\n",
            qos: QosClass::Guaranteed,
            memory: Some(96 * MIB),
            quota: Some(50_000),
            shares: 512,
        },
        Case {
            // The pod: 96Mi for two containers, and a cpu request.
            name: "burstable",
            resources: "    requests: {cpu: 100m}\n    limits: {memory: 96Mi}\n",
            qos: QosClass::Burstable,
            memory: Some(96 * MIB),
            quota: None,
            shares: 102,
        },
        Case {
            name: "besteffort",
            resources: "    {}\n",
            qos: QosClass::BestEffort,
            memory: None,
            quota: None,
            shares: 2,
        },
    ];
    let names: Vec<String> =
        cases.iter().map(|c| a.add_manifest(&format!("{}.yaml", c.name), &manifest(c.name, c.resources))).collect();
    let fs = a.cgroupfs();
    for (c, name) in cases.iter().zip(&names) {
        let s = a.wait_status(name, T, "both containers running", running);
        assert_eq!(s.qos_class.as_deref(), Some(c.qos.as_str()), "{}: status.qosClass", c.name);
        let uid = a.pod(name).and_then(|p| p.metadata.uid).expect("the pod has a uid");
        let cgroup = a.agent.pod_cgroups.pod_cgroup(c.qos, &uid);
        assert!(fs.exists(&cgroup), "{}: the pod cgroup {cgroup} is under its QoS class", c.name);
        assert_eq!(memory_limit(&fs, &cgroup), c.memory, "{}: the pod cgroup's memory limit", c.name);
        assert_eq!(cfs_quota(&fs, &cgroup), c.quota, "{}: the pod cgroup's CFS quota", c.name);
        assert!(cpu_shares_matches(&fs, &cgroup, c.shares), "{}: the pod cgroup's cpu shares {}", c.name, c.shares);
        // The containers set no limits of their own: their cgroups get the
        // pod-level ones.
        let (_, containers) = a.runtime_state(&uid);
        assert_eq!(containers.len(), 2, "{}: both containers in the runtime", c.name);
        for ctr in containers {
            let rel = [format!("{cgroup}/{}", ctr.id), format!("{cgroup}/cri-containerd-{}.scope", ctr.id)]
                .into_iter()
                .find(|r| fs.exists(r))
                .unwrap_or_else(|| panic!("{}: no cgroup for container {}", c.name, ctr.id));
            assert_eq!(memory_limit(&fs, &rel), c.memory, "{}: a container's memory limit", c.name);
            assert_eq!(cfs_quota(&fs, &rel), c.quota, "{}: a container's CFS quota", c.name);
        }
    }
}

#[test]
fn pod_level_resources_the_api_server_refuses_are_refused() {
    let a = TestAgent::start("", &["--signal-source=cgroupfs"]);
    // A container limited above the pod, and a pod-level resource the pod
    // level does not support.
    let bad = manifest("bad", "    limits: {cpu: 500m, memory: 64Mi, ephemeral-storage: 1Gi}\n")
        .replace("  - name: b\n", "  - name: b\n    resources: {limits: {memory: 128Mi}}\n");
    swiftlet_tests::agent::write_atomically(&a.manifests.join("bad.yaml"), &bad);
    let good = a.add_manifest("good.yaml", &manifest("good", "    limits: {memory: 64Mi}\n"));
    a.wait_status(&good, T, "Running", running);
    assert_eq!(a.pods().len(), 1, "only the good pod runs");
    assert_eq!(a.agent.pod_metrics.manifest_errors.get(), 1);
}
