//! The container manager on this machine's cgroups: the pods' hierarchy
//! under a test cgroup root, kubepods limited to enforced allocatable, and
//! a pod cgroup created, populated, killed and removed. Needs root.

use std::{
    os::unix::process::ExitStatusExt,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use swiftlet::{
    cgroups::{CgroupFs, Version},
    cm::{
        allocatable::{NodeAllocatable, Resource, machine_capacity},
        hierarchy::{kubepods_limits, pod_cgroup_config},
        naming::{CgroupDriver, CgroupNaming, milli_cpu_to_shares},
        pod_cgroups::PodCgroups,
        qos::{QosClass, qos_class},
    },
    config::{KubeletConfiguration, ReservedResource},
    quantity::Quantity,
};
use swiftlet_tests::{cgroup::TestCgroup, workload::in_cgroup};

const MIB: u64 = 1 << 20;

fn read(fs: &CgroupFs, controller: &str, rel: &str, file: &str) -> String {
    let p = fs.controller_dir(controller, rel).join(file);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).trim().to_owned()
}

/// cpu.shares on v1, cpu.weight on v2 (converted as runc does).
fn cpu_shares_file(fs: &CgroupFs, rel: &str, shares: u64) -> (String, String) {
    match fs.version() {
        Version::V1 => (read(fs, "cpu", rel, "cpu.shares"), shares.to_string()),
        Version::V2 => (read(fs, "cpu", rel, "cpu.weight"), swiftlet::cgroups::shares_to_weight(shares).to_string()),
    }
}

fn quota(fs: &CgroupFs, rel: &str) -> String {
    match fs.version() {
        Version::V1 => read(fs, "cpu", rel, "cpu.cfs_quota_us"),
        Version::V2 => read(fs, "cpu", rel, "cpu.max").split_whitespace().next().unwrap_or_default().to_owned(),
    }
}

fn container(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> k8s_openapi::api::core::v1::Container {
    use k8s_openapi::{api::core::v1::ResourceRequirements, apimachinery::pkg::api::resource::Quantity as Q};
    let m = |p: &[(&str, &str)]| Some(p.iter().map(|(k, v)| (k.to_string(), Q(v.to_string()))).collect());
    k8s_openapi::api::core::v1::Container {
        name: "c".into(),
        resources: Some(ResourceRequirements { requests: m(requests), limits: m(limits), ..Default::default() }),
        ..Default::default()
    }
}

#[tokio::test]
async fn hierarchy_limits_and_pod_cgroups_on_this_machine() {
    let tc = TestCgroup::new();
    let fs = tc.fs.clone();
    println!("cgroup {:?} at {}, test root {}", fs.version(), fs.root().display(), tc.root);

    // Reserve all but 1.5 GiB of memory and half a CPU, so kubepods' limits
    // are known exactly.
    let capacity = machine_capacity(Path::new("/var/lib/kubelet"), 110, 0).expect("machine capacity");
    let mem_total = capacity[&Resource::Memory];
    let cores = capacity[&Resource::Cpu];
    let pids = capacity[&Resource::Pid];
    println!("capacity: {cores} cores, {} MiB, pid {pids}", mem_total.value() >> 20);
    let system = Quantity::from_units(512 * MIB as i64);
    let kube = mem_total - system - Quantity::from_units(1536 * MIB as i64);
    assert!(!kube.is_negative(), "this test needs more than 2 GiB of memory");
    let config = KubeletConfiguration {
        cgroup_root: tc.root.clone(),
        kube_reserved: [(ReservedResource::Memory, kube), (ReservedResource::Cpu, Quantity::from_milli(500))].into(),
        system_reserved: [(ReservedResource::Memory, system), (ReservedResource::Pid, Quantity::from_units(100))]
            .into(),
        ..Default::default()
    };
    let node = NodeAllocatable::new(capacity.clone(), &config);
    assert_eq!(node.kubepods[&Resource::Memory].value() as u64, 1536 * MIB);
    assert!(node.allocatable[&Resource::Memory] < node.kubepods[&Resource::Memory], "status subtracts the threshold");

    let pc = PodCgroups::for_config(fs.clone(), &config).await.expect("the cgroupfs driver");
    assert_eq!(pc.naming(), &CgroupNaming::new(CgroupDriver::Cgroupfs, &tc.root));
    pc.ensure_hierarchy(&kubepods_limits(&node.kubepods)).await.expect("create the hierarchy");
    pc.ensure_hierarchy(&kubepods_limits(&node.kubepods)).await.expect("again: idempotent");

    let kubepods = format!("{}/kubepods", tc.root);
    assert!(fs.exists(&kubepods), "{kubepods}");
    assert_eq!(fs.memory_limit(&kubepods).unwrap(), Some(1536 * MIB), "kubepods memory limit = enforced allocatable");
    let shares = milli_cpu_to_shares(cores.milli_value() - 500);
    let (got, want) = cpu_shares_file(&fs, &kubepods, shares);
    assert_eq!(got, want, "kubepods cpu shares from allocatable cpu");
    assert!(matches!(quota(&fs, &kubepods).as_str(), "-1" | "max"), "no CFS quota on kubepods");
    assert_eq!(read(&fs, "pids", &kubepods, "pids.max"), (pids.value() - 100).to_string());
    for qos in ["burstable", "besteffort"] {
        let rel = format!("{kubepods}/{qos}");
        assert!(fs.exists(&rel), "{rel}");
        let (got, want) = cpu_shares_file(&fs, &rel, 2);
        assert_eq!(got, want, "{rel} starts at the minimum shares");
        assert_eq!(fs.memory_limit(&rel).unwrap(), None, "{rel} has no memory limit");
    }
    pc.update_burstable_cpu_shares(1500).await.unwrap();
    let (got, want) = cpu_shares_file(&fs, &format!("{kubepods}/burstable"), 1536);
    assert_eq!(got, want, "burstable shares follow its pods' cpu requests (1500m)");

    // A Burstable pod with limits on every container.
    let spec = k8s_openapi::api::core::v1::PodSpec {
        containers: vec![container(&[("cpu", "250m")], &[("cpu", "500m"), ("memory", "256Mi")])],
        ..Default::default()
    };
    assert_eq!(qos_class(&spec), QosClass::Burstable);
    let cfg = pod_cgroup_config(&spec, true, Duration::from_millis(100), 1024);
    let uid = "3f2c6a1e-0000-4000-8000-000000000001";
    let pod = pc.ensure_pod_cgroup(QosClass::Burstable, uid, &cfg).await.expect("pod cgroup");
    assert_eq!(pod, format!("{kubepods}/burstable/pod{uid}"));
    assert_eq!(fs.memory_limit(&pod).unwrap(), Some(256 * MIB));
    assert_eq!(quota(&fs, &pod), "50000");
    let (got, want) = cpu_shares_file(&fs, &pod, 256);
    assert_eq!(got, want);
    assert_eq!(read(&fs, "pids", &pod, "pids.max"), "1024");

    // A process in the pod's cgroup is killed when the cgroup is removed.
    let mut cmd = Command::new("sleep");
    cmd.arg("600").stdin(Stdio::null());
    in_cgroup(&mut cmd, &fs, &pod);
    let mut child = cmd.spawn().expect("spawn sleep in the pod cgroup");
    assert!(fs.procs(&pod).unwrap().contains(&child.id()), "the process runs in {pod}");
    pc.remove_pod_cgroup(QosClass::Burstable, uid, Duration::from_secs(10)).await.expect("remove the pod cgroup");
    let status = child.wait().expect("wait for sleep");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "the pod's process was killed");
    assert!(!fs.exists(&pod), "{pod} is gone");
    for c in ["memory", "cpu", "pids"] {
        assert!(!fs.controller_dir(c, &pod).exists(), "{pod} is gone from the {c} tree");
    }
    pc.remove_pod_cgroup(QosClass::Burstable, uid, Duration::from_secs(1)).await.expect("removing twice is fine");

    // A Guaranteed pod sits directly under kubepods.
    let g = k8s_openapi::api::core::v1::PodSpec {
        containers: vec![container(&[], &[("cpu", "1"), ("memory", "128Mi")])],
        ..Default::default()
    };
    let gcfg = pod_cgroup_config(&g, true, Duration::from_millis(100), -1);
    let gpod = pc.ensure_pod_cgroup(qos_class(&g), "g-1", &gcfg).await.unwrap();
    assert_eq!(gpod, format!("{kubepods}/podg-1"));
    assert_eq!(fs.memory_limit(&gpod).unwrap(), Some(128 * MIB));
    assert_eq!(quota(&fs, &gpod), "100000");
    pc.remove_pod_cgroup(QosClass::Guaranteed, "g-1", Duration::from_secs(10)).await.unwrap();
    assert!(!fs.exists(&gpod));
    // The TestCgroup guard removes kubepods and the test root.
}

/// The Burstable QoS cgroup's cpu shares follow the Burstable pods' cpu
/// requests, read from cgroupfs under a running agent, as the kubelet's
/// QoS container manager keeps them: 500m + 250m give the shares of 750m,
/// and they drop to 500m's when one pod goes.
#[test]
fn burstable_cpu_shares_follow_the_burstable_pods() {
    use swiftlet_tests::agent::TestAgent;
    let a = TestAgent::start("", &[]);
    let fs = a.cgroupfs();
    let burstable = format!("{}/kubepods/burstable", a.cgroup_root.trim_matches('/'));
    let manifest = |name: &str, cpu: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: swiftlet.local/busybox:1.35\n    command: [\"sleep\", \"3600\"]\n    resources:\n      requests: {{cpu: {cpu}}}\n"
        )
    };
    let shares_now = || {
        let (got, _) = cpu_shares_file(&fs, &burstable, 2);
        got
    };
    let want = |milli: u64| cpu_shares_file_value(&fs, milli_cpu_to_shares(milli as i64));
    let wait_for = |what: &str, value: String| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while shares_now() != value {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: the Burstable cgroup holds {}, not {value}",
                shares_now()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let b1 = a.add_manifest("b1.yaml", &manifest("b1", "500m"));
    let b2 = a.add_manifest("b2.yaml", &manifest("b2", "250m"));
    for p in [&b1, &b2] {
        a.wait_status(p, Duration::from_secs(60), "Running", |s| s.phase.as_deref() == Some("Running"));
    }
    wait_for("two Burstable pods, 500m and 250m", want(750));
    a.remove_manifest("b2.yaml");
    a.wait_gone(&b2, Duration::from_secs(60));
    wait_for("one Burstable pod left, 500m", want(500));
}

/// What the QoS cgroup's file holds for `shares` on this machine's
/// cgroup version.
fn cpu_shares_file_value(fs: &CgroupFs, shares: u64) -> String {
    match fs.version() {
        Version::V1 => shares.to_string(),
        Version::V2 => swiftlet::cgroups::shares_to_weight(shares).to_string(),
    }
}
