//! swiftlet against the fake API server: the real binary registers its
//! Node (kubectl shows it Ready, allocatable is what the container manager
//! computes), renews its Lease, reports status on change and every
//! nodeStatusReportFrequency, rides out a 60 s API server outage, and
//! bootstraps its client certificate with a CSR; in process, node
//! conditions and taints follow a real eviction manager, the pod watch
//! keeps its pods through an outage and re-lists after 410 Gone, the
//! status manager writes only changes and deletes terminated pods, mirror
//! pods come back when deleted, and events are deduplicated.
//!
//! At the end, with the pod manager: an API pod runs on containerd, goes
//! Running and Ready, and is deleted within its grace period; a static pod
//! gets a mirror pod; a 60 s outage loses no pod.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::core::v1::{ContainerState, ContainerStateRunning, ContainerStatus, Pod, PodCondition, PodStatus},
    jiff::Timestamp,
};
use serde_json::{Value, json};
use swiftlet::{
    cm::allocatable::{NodeAllocatable, machine_capacity},
    config::format_quantity,
    cri::CriClient,
    events::{EventRecorder, EventType},
    eviction::{
        core::EvictionConfig,
        driver::{DriverConfig, EvictionManager},
        observe::NodeInfo,
        signal::{EvictionSignal, EvictionThreshold, ThresholdValue},
    },
    kubeapi::{
        ApiAgent, CONFIG_HASH, CONFIG_MIRROR, CONFIG_SEEN, CONFIG_SOURCE, client, mirror::MirrorPods,
        pod_api::KubePodApi, pod_watch, recorder, status::StatusManager,
    },
    metrics::Metrics,
    pods::source::{PodSink, PodSnapshot, SourceKind, StatusReporter},
    quantity::Quantity,
    signals::{self, SourceChoice, ebpf::EbpfOptions, node},
};
use swiftlet_tests::{
    agent::cri_endpoint,
    apiserver::{
        Credentials, FakeApiServer, Fault, Options,
        auth::UserInfo,
        resources::{EVENTS, LEASES, NODES, PODS},
    },
    cgroup::TestCgroup,
    kubectl::{Kubectl, table},
    node_process::{NodeProcess, PodCleanup},
    pods::FakePods,
    prereq,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

fn node_name(tag: &str) -> String {
    format!("swl-{tag}-{}", std::process::id())
}

/// A TLS fake with a kubeconfig for the node (client certificate
/// system:node:<name>) and one for kubectl (admin).
struct Cluster {
    server: FakeApiServer,
    node_kubeconfig: std::path::PathBuf,
    kubectl: Kubectl,
}

fn cluster(node: &str, options: Options) -> Cluster {
    let server = FakeApiServer::start(Options { tls: true, ..options }).unwrap();
    let node_kubeconfig = server.dir().join("kubelet.kubeconfig");
    let (cert, key) = server.client_cert(&format!("system:node:{node}"), &["system:nodes"]).unwrap();
    server.write_kubeconfig(&node_kubeconfig, &Credentials::ClientCert { cert, key }).unwrap();
    let admin = server.dir().join("admin.kubeconfig");
    let (cert, key) = server.client_cert("admin", &["system:masters"]).unwrap();
    server.write_kubeconfig(&admin, &Credentials::ClientCert { cert, key }).unwrap();
    Cluster { server, node_kubeconfig, kubectl: Kubectl::new(&admin) }
}

fn condition<'a>(node: &'a Value, t: &str) -> Option<&'a Value> {
    node.pointer("/status/conditions")?.as_array()?.iter().find(|c| c["type"] == t)
}

fn ready(node: &Value) -> bool {
    condition(node, "Ready").is_some_and(|c| c["status"] == "True")
}

fn wait<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn parse_time(s: &str) -> Timestamp {
    s.parse().unwrap_or_else(|e| panic!("bad time {s:?}: {e}"))
}

fn status_patches(server: &FakeApiServer, node: &str) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| {
            r.method == "PATCH" && r.uri.starts_with(&format!("/api/v1/nodes/{node}/status")) && r.status == 200
        })
        .count()
}

fn arg_value<'a>(args: &'a [String], flag: &str) -> &'a str {
    args.iter().find_map(|a| a.strip_prefix(&format!("{flag}="))).unwrap_or_else(|| panic!("no {flag} in {args:?}"))
}

const FAST_NODE: &str = "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
nodeStatusUpdateFrequency: 1s
nodeStatusReportFrequency: 1m
nodeLeaseDurationSeconds: 8
kubeReserved:
  cpu: 100m
  memory: 256Mi
systemReserved:
  memory: 128Mi
evictionHard:
  memory.available: 300Mi
  nodefs.available: 1%
registerWithTaints:
- key: dedicated
  value: test
  effect: PreferNoSchedule
";

#[test]
fn node_registers_ready_with_allocatable_labels_and_lease() {
    prereq::require_root();
    let name = node_name("reg");
    let c = cluster(&name, Options::default());
    let extra = vec![
        format!("--kubeconfig={}", c.node_kubeconfig.display()),
        format!("--hostname-override={name}"),
        "--node-labels=node.kubernetes.io/pool=test".into(),
        "--node-ip=10.11.12.13".into(),
    ];
    let mut agent = NodeProcess::start(Some(FAST_NODE), &extra);
    let node = wait("the node to be Ready", Duration::from_secs(60), || {
        agent.assert_running();
        c.server.get(&NODES, "", &name).filter(ready)
    });

    // kubectl sees it Ready.
    let out = c.kubectl.ok(&["get", "nodes"]);
    println!("$ kubectl get nodes\n{out}");
    let rows = table(&out);
    let row = rows.iter().find(|r| r[0] == name).expect("our node in kubectl get nodes");
    assert_eq!(row[1], "Ready");
    assert_eq!(row[4], swiftlet::version::kubelet_version());
    let wide = c.kubectl.ok(&["get", "nodes", "-o", "wide"]);
    println!("$ kubectl get nodes -o wide\n{wide}");
    assert!(
        table(&wide)
            .iter()
            .any(|r| r[0] == name && r[5] == "10.11.12.13" && r.last().unwrap().starts_with("containerd://"))
    );

    // Allocatable and capacity are the container manager's figures.
    let config = swiftlet::config::load(agent.args.clone()).unwrap();
    let capacity =
        machine_capacity(&config.flags.root_dir, config.kubelet.max_pods, config.kubelet.pods_per_core).unwrap();
    let expected = NodeAllocatable::new(capacity, &config.kubelet);
    for (r, q) in &expected.allocatable {
        let Some(field) = r.status_name() else { continue };
        let jp = format!("jsonpath={{.status.allocatable.{field}}}");
        let got = c.kubectl.ok(&["get", "node", &name, "-o", &jp]);
        println!("$ kubectl get node {name} -o {jp}\n{got}");
        assert_eq!(got, format_quantity(q), "allocatable {field}");
        assert_eq!(Quantity::parse(&got).unwrap(), *q);
        let cap = c.kubectl.ok(&["get", "node", &name, "-o", &format!("jsonpath={{.status.capacity.{field}}}")]);
        assert_eq!(cap, format_quantity(&expected.capacity[r]), "capacity {field}");
    }
    assert!(
        expected.allocatable[&swiftlet::cm::allocatable::Resource::Memory]
            < expected.capacity[&swiftlet::cm::allocatable::Resource::Memory]
    );

    // Labels, taints, addresses, endpoints, node info, images.
    let labels = &node["metadata"]["labels"];
    assert_eq!(labels["kubernetes.io/hostname"], name.as_str());
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["kubernetes.io/arch"], "amd64");
    assert_eq!(labels["node.kubernetes.io/pool"], "test");
    assert_eq!(node["spec"]["taints"], json!([{"key": "dedicated", "value": "test", "effect": "PreferNoSchedule"}]));
    assert_eq!(
        node["status"]["addresses"],
        json!([{"type": "InternalIP", "address": "10.11.12.13"}, {"type": "Hostname", "address": name}])
    );
    let port: i64 = arg_value(&agent.args, "--port").parse().unwrap();
    assert_eq!(node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"], port);
    let info = &node["status"]["nodeInfo"];
    assert_eq!(info["operatingSystem"], "linux");
    assert!(info["containerRuntimeVersion"].as_str().unwrap().starts_with("containerd://"), "{info}");
    assert_eq!(
        info["kernelVersion"].as_str().unwrap(),
        std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap().trim()
    );
    assert!(info["bootID"].as_str().is_some_and(|b| !b.is_empty()));
    let images = node["status"]["images"].to_string();
    assert!(images.contains("swiftlet.local/pause:3.9"), "{images}");
    for (t, reason) in [
        ("MemoryPressure", "KubeletHasSufficientMemory"),
        ("DiskPressure", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "KubeletHasSufficientPID"),
        ("Ready", "KubeletReady"),
    ] {
        assert_eq!(condition(&node, t).unwrap()["reason"], reason, "{t}");
    }

    // The Lease is renewed every 8s/4 and owned by the Node.
    let lease = wait("the lease", Duration::from_secs(10), || c.server.get(&LEASES, "kube-node-lease", &name));
    assert_eq!(lease["spec"]["holderIdentity"], name.as_str());
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 8);
    let first = parse_time(lease["spec"]["renewTime"].as_str().unwrap());
    let renewed = wait("a lease renewal", Duration::from_secs(10), || {
        let l = c.server.get(&LEASES, "kube-node-lease", &name)?;
        let t = parse_time(l["spec"]["renewTime"].as_str()?);
        (t > first).then_some((l, t))
    });
    let gap = renewed.1.duration_since(first);
    assert!(gap.as_secs_f64() < 4.0, "renewed every 2 s, got a gap of {gap:?}");
    wait("the lease owner", Duration::from_secs(10), || {
        let l = c.server.get(&LEASES, "kube-node-lease", &name)?;
        (l["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]).then_some(())
    });

    // Only changes are sent (report frequency 1m): the node is read every
    // second, its status not patched while nothing changes.
    let before = status_patches(&c.server, &name);
    let gets_before = c
        .server
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.uri.starts_with(&format!("/api/v1/nodes/{name}")))
        .count();
    std::thread::sleep(Duration::from_secs(5));
    let gets = c
        .server
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.uri.starts_with(&format!("/api/v1/nodes/{name}")))
        .count();
    assert!(gets - gets_before >= 3, "status checked every nodeStatusUpdateFrequency: {} gets", gets - gets_before);
    assert_eq!(status_patches(&c.server, &name), before, "no change, no patch");
    assert!(
        c.server
            .requests()
            .iter()
            .filter(|r| r.uri.contains("/nodes/"))
            .all(|r| r.user == format!("system:node:{name}") || r.user == "admin")
    );

    // Events and describe.
    let events = c.kubectl.ok(&["get", "events"]);
    println!("$ kubectl get events\n{events}");
    for reason in ["Starting", "NodeHasSufficientMemory", "NodeHasNoDiskPressure", "NodeHasSufficientPID", "NodeReady"]
    {
        assert!(events.contains(reason), "no {reason} event");
    }
    let described = c.kubectl.ok(&["describe", "node", &name]);
    println!("$ kubectl describe node {name}\n{described}");
    assert!(described.contains(&format!("HolderIdentity:  {name}")), "describe shows the lease");
    assert!(described.contains("kubelet is posting ready status"));
    assert!(described.contains("dedicated=test:PreferNoSchedule"));
    assert!(agent.stop(), "swiftlet stops on SIGTERM");
}

/// Eviction thresholds low enough that this machine's disk (shared with
/// builds) never puts the node under pressure during the test.
const REPORTING_NODE: &str = "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
nodeStatusUpdateFrequency: 1s
nodeStatusReportFrequency: 4s
nodeLeaseDurationSeconds: 8
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
";

/// A cluster and the real binary as its node (REPORTING_NODE), Ready.
fn ready_reporting_node(name: &str) -> (Cluster, NodeProcess) {
    let c = cluster(name, Options::default());
    let extra = vec![format!("--kubeconfig={}", c.node_kubeconfig.display()), format!("--hostname-override={name}")];
    let mut agent = NodeProcess::start(Some(REPORTING_NODE), &extra);
    wait("the node to be Ready", Duration::from_secs(60), || {
        agent.assert_running();
        c.server.get(&NODES, "", name).filter(ready)
    });
    (c, agent)
}

#[test]
fn status_reports_and_lease_resume_after_a_60s_outage() {
    prereq::require_root();
    let name = node_name("outage");
    let (c, mut agent) = ready_reporting_node(&name);
    // Unchanged status still goes out every nodeStatusReportFrequency (4s).
    let before = status_patches(&c.server, &name);
    std::thread::sleep(Duration::from_secs(10));
    let reports = status_patches(&c.server, &name) - before;
    assert!((2..=4).contains(&reports), "{reports} reports in 10 s at one per 4 s");

    // The API server goes away for 60 s. Meanwhile the node lifecycle
    // controller would mark the node Unknown.
    c.server.stop();
    let down_at = Timestamp::now();
    let mut n = c.server.get(&NODES, "", &name).unwrap();
    for cond in n["status"]["conditions"].as_array_mut().unwrap() {
        cond["status"] = "Unknown".into();
        cond["reason"] = "NodeStatusUnknown".into();
        cond["message"] = "Kubelet stopped posting node status.".into();
    }
    n["metadata"]["resourceVersion"] = Value::Null;
    c.server.store().update(&NODES, "", &name, n, |_, _| {}).unwrap();
    std::thread::sleep(Duration::from_secs(60));
    agent.assert_running();
    assert!(c.kubectl.run(&["get", "nodes"]).status.code() != Some(0), "the server is down");
    c.server.restart().unwrap();
    let back_at = Timestamp::now();

    // Status catches up and the Lease resumes.
    let node =
        wait("Ready again after the outage", Duration::from_secs(20), || c.server.get(&NODES, "", &name).filter(ready));
    let hb = parse_time(condition(&node, "Ready").unwrap()["lastHeartbeatTime"].as_str().unwrap());
    assert!(hb >= back_at - Duration::from_secs(1), "heartbeat {hb} after the restart at {back_at}");
    assert_eq!(condition(&node, "Ready").unwrap()["reason"], "KubeletReady");
    assert_eq!(condition(&node, "MemoryPressure").unwrap()["status"], "False");
    wait("a lease renewed after the outage", Duration::from_secs(15), || {
        let l = c.server.get(&LEASES, "kube-node-lease", &name)?;
        (parse_time(l["spec"]["renewTime"].as_str()?) >= back_at).then_some(())
    });
    let out = c.kubectl.ok(&["get", "nodes"]);
    println!("$ kubectl get nodes (after the outage)\n{out}");
    assert!(table(&out).iter().any(|r| r[0] == name && r[1] == "Ready"));
    let log = agent.log_text();
    assert!(
        log.contains("cannot renew the node lease") || log.contains("node status:"),
        "the outage was noticed:\n{log}"
    );
    println!("outage from {down_at} to {back_at}");
    assert!(agent.stop());
}

#[test]
fn a_reload_changes_the_status_report_frequency_live() {
    prereq::require_root();
    let name = node_name("reload");
    let (c, mut agent) = ready_reporting_node(&name);
    // (status reports, status rounds) in 10 s; every round GETs the Node.
    let in_10s = || {
        let rounds = || {
            let node = format!("/api/v1/nodes/{name}");
            c.server.requests().iter().filter(|r| r.method == "GET" && r.uri == node).count()
        };
        let before = (status_patches(&c.server, &name), rounds());
        std::thread::sleep(Duration::from_secs(10));
        (status_patches(&c.server, &name) - before.0, rounds() - before.1)
    };
    let (reports, rounds) = in_10s();
    assert!((2..=4).contains(&reports), "{reports} reports in 10 s at one per 4 s");
    assert!((8..=12).contains(&rounds), "{rounds} rounds in 10 s at one per 1 s");

    // SIGHUP with both frequencies changed: a round every 200 ms, and a
    // report once 1 s has passed since the last (about every 1.0-1.2 s).
    let config = agent.config_path();
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("nodeStatusReportFrequency: 4s", "nodeStatusReportFrequency: 1s")
        .replace("nodeStatusUpdateFrequency: 1s", "nodeStatusUpdateFrequency: 200ms");
    std::fs::write(&config, text).unwrap();
    agent.signal(libc::SIGHUP);
    wait("the reload applied", Duration::from_secs(10), || {
        let log = agent.log_text();
        (log.contains("configuration reloaded: applied") && log.contains("nodeStatusUpdateFrequency changed"))
            .then_some(())
    });
    let (reports, rounds) = in_10s();
    assert!(reports >= 7, "{reports} reports in 10 s after the reload to one per 1 s");
    assert!(rounds >= 35, "{rounds} rounds in 10 s after the reload to one per 200 ms");
    agent.assert_running();
    assert!(agent.stop());
}

#[test]
fn bootstraps_a_client_certificate_through_a_csr() {
    prereq::require_root();
    let name = node_name("boot");
    let server = FakeApiServer::start(Options { tls: true, ..Default::default() }).unwrap();
    server.set_token("abcdef.0123456789abcdef", UserInfo::new("system:bootstrap:abcdef", &["system:bootstrappers"]));
    let bootstrap = server.dir().join("bootstrap.kubeconfig");
    server.write_kubeconfig(&bootstrap, &Credentials::Token("abcdef.0123456789abcdef".into())).unwrap();
    let certs = tempfile::tempdir().unwrap();
    let kubeconfig = certs.path().join("kubelet.conf");
    let extra = vec![
        format!("--bootstrap-kubeconfig={}", bootstrap.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--cert-dir={}", certs.path().join("pki").display()),
        format!("--hostname-override={name}"),
    ];
    let mut agent = NodeProcess::start(Some(REPORTING_NODE), &extra);
    wait("the node registered with its own certificate", Duration::from_secs(60), || {
        agent.assert_running();
        server.get(&NODES, "", &name).filter(ready)
    });
    let csrs = server.list(&swiftlet_tests::apiserver::resources::CSRS, None);
    assert_eq!(csrs.len(), 1);
    let csr = &csrs[0];
    assert_eq!(csr["spec"]["signerName"], "kubernetes.io/kube-apiserver-client-kubelet");
    assert_eq!(csr["spec"]["username"], "system:bootstrap:abcdef", "asked with the bootstrap token");
    assert_eq!(csr["spec"]["usages"], json!(["digital signature", "client auth"]));
    assert!(kubeconfig.exists());
    let current = certs.path().join("pki/kubelet-client-current.pem");
    assert!(std::fs::symlink_metadata(&current).unwrap().file_type().is_symlink());
    let node_user = format!("system:node:{name}");
    let reqs = server.requests();
    assert!(
        reqs.iter().any(|r| r.uri.starts_with("/api/v1/nodes") && r.user == node_user),
        "the Node is written as {node_user}"
    );
    assert!(reqs.iter().filter(|r| r.uri.starts_with("/api/v1/nodes")).all(|r| r.user == node_user));
    assert!(agent.stop());
}

// ---- in process ----

fn kube_client(server: &FakeApiServer, rt: &tokio::runtime::Runtime) -> kube::Client {
    let path = server.dir().join(format!("inproc-{}.kubeconfig", std::process::id()));
    server.write_kubeconfig(&path, &Credentials::None).unwrap();
    rt.block_on(async { client::client_from(client::load_kubeconfig(&path).await.unwrap(), 0, 1).unwrap() })
}

fn mem_threshold(bytes: u64) -> EvictionThreshold {
    EvictionThreshold {
        signal: EvictionSignal::MemoryAvailable,
        value: ThresholdValue::Quantity(Quantity::from_units(bytes as i64)),
        grace_period: Duration::from_secs(3600),
        min_reclaim: None,
    }
}

#[test]
fn pressure_conditions_and_taints_follow_the_eviction_manager() {
    prereq::require_root();
    let name = node_name("pressure");
    let server = FakeApiServer::start(Options::default()).unwrap();
    let kubeconfig = server.dir().join("node.kubeconfig");
    server.write_kubeconfig(&kubeconfig, &Credentials::None).unwrap();
    let admin = Kubectl::new(&kubeconfig);
    let tc = TestCgroup::new();
    let kubepods = tc.child("kubepods");
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("config.yaml");
    std::fs::write(
        &yaml,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nnodeStatusUpdateFrequency: 1s\n",
    )
    .unwrap();
    let config = swiftlet::config::load([
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--hostname-override={name}"),
        format!("--config={}", yaml.display()),
        format!("--root-dir={}", dir.path().display()),
    ])
    .unwrap();
    let k = &config.kubelet;
    let alloc = NodeAllocatable::new(machine_capacity(&config.flags.root_dir, k.max_pods, k.pods_per_core).unwrap(), k);
    let api = Arc::new(ApiAgent::new(&config, &name, &alloc));

    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let opened =
        signals::open(SourceChoice::Cgroupfs, tc.fs.clone(), &EbpfOptions::default(), Duration::from_millis(200))
            .unwrap();
    let mem_total = node::mem_total().unwrap();
    let transition = Duration::from_secs(3);
    let cfg = DriverConfig {
        eviction: EvictionConfig {
            // Always met: available memory is below the machine's total.
            thresholds: vec![mem_threshold(mem_total)],
            pressure_transition_period: transition,
            max_pod_grace_period_secs: 0,
        },
        node: NodeInfo {
            memory_capacity: mem_total,
            allocatable_memory: mem_total,
            pid_limit: node::pid_limit().unwrap(),
            kubepods_cgroup: kubepods,
        },
        nodefs_path: dir.path().into(),
        imagefs_path: None,
        housekeeping_interval: Duration::from_millis(500),
        plan_interval: Duration::from_secs(1),
        kernel_eviction: false,
        reclaim_before_eviction: false,
    };
    let pods = Arc::new(FakePods::default());
    let (manager, event_loop) = EvictionManager::new(
        cfg.clone(),
        opened.source.clone(),
        tc.fs.clone(),
        pods.clone(),
        pods,
        None,
        Arc::new(Metrics::new()),
    );
    api.connect_pressure(manager.conditions());
    let cri = Arc::new(CriClient::new(&cri_endpoint(), Duration::from_secs(10)).unwrap());
    let stop = CancellationToken::new();
    let shutdown = stop.clone();
    let eviction = rt.spawn(event_loop.run(shutdown.clone()));
    let (_live, frequencies) = watch::channel(swiftlet::reload::LiveSettings::of(&config));
    let running = rt.spawn(api.clone().run(cri.clone(), cri, frequencies, shutdown));

    let node = wait("MemoryPressure True", Duration::from_secs(30), || {
        let n = server.get(&NODES, "", &name)?;
        (condition(&n, "MemoryPressure")?["status"] == "True").then_some(n)
    });
    assert_eq!(condition(&node, "MemoryPressure").unwrap()["reason"], "KubeletHasInsufficientMemory");
    assert_eq!(condition(&node, "MemoryPressure").unwrap()["message"], "kubelet has insufficient memory available");
    wait("the memory-pressure taint", Duration::from_secs(10), || {
        let n = server.get(&NODES, "", &name)?;
        n["spec"]["taints"]
            .as_array()?
            .iter()
            .any(|t| t["key"] == "node.kubernetes.io/memory-pressure" && t["effect"] == "NoSchedule")
            .then_some(())
    });
    let described = admin.ok(&["describe", "node", &name]);
    println!("$ kubectl describe node {name} (under pressure)\n{described}");
    assert!(described.contains("node.kubernetes.io/memory-pressure:NoSchedule"));
    wait("the NodeHasInsufficientMemory event", Duration::from_secs(10), || {
        server.list(&EVENTS, Some("default")).into_iter().find(|e| e["reason"] == "NodeHasInsufficientMemory")
    });

    // The signal recovers; the condition holds for the transition period.
    let recovered_at = Instant::now();
    manager.reconfigure(EvictionConfig { thresholds: vec![mem_threshold(1 << 20)], ..cfg.eviction.clone() });
    wait("MemoryPressure False", Duration::from_secs(30), || {
        let n = server.get(&NODES, "", &name)?;
        (condition(&n, "MemoryPressure")?["status"] == "False").then_some(())
    });
    let held = recovered_at.elapsed();
    // Held for the transition period since the threshold was last seen met:
    // the last evaluation before the change, at most one housekeeping
    // period (500 ms) earlier.
    assert!(
        held >= transition - Duration::from_millis(500),
        "cleared after {held:?}, before the {transition:?} transition period"
    );
    wait("the taint removed", Duration::from_secs(10), || {
        let n = server.get(&NODES, "", &name)?;
        let tainted = n["spec"]["taints"]
            .as_array()
            .is_some_and(|ts| ts.iter().any(|t| t["key"] == "node.kubernetes.io/memory-pressure"));
        (!tainted).then_some(())
    });
    wait("the NodeHasSufficientMemory event", Duration::from_secs(10), || {
        server
            .list(&EVENTS, Some("default"))
            .into_iter()
            .find(|e| e["reason"] == "NodeHasSufficientMemory" && e["count"].as_i64() == Some(1))
            .filter(|_| true)
    });
    let events = admin.ok(&["get", "events", "-o", "wide"]);
    println!("$ kubectl get events -o wide\n{events}");
    println!("MemoryPressure held {held:?} after the signal recovered (transition period {transition:?})");
    stop.cancel();
    rt.block_on(async {
        running.await.unwrap().unwrap();
        eviction.await.unwrap();
    });
}

/// Collects every snapshot a source delivers.
#[derive(Default)]
struct Snapshots(Mutex<Vec<Vec<String>>>);

impl PodSink for Snapshots {
    fn set(&self, s: PodSnapshot) {
        assert_eq!(s.source, SourceKind::Api);
        let mut names: Vec<String> = s.pods.iter().map(|p| p.metadata.name.clone().unwrap_or_default()).collect();
        names.sort();
        self.0.lock().unwrap().push(names);
    }
}

impl Snapshots {
    fn last(&self) -> Option<Vec<String>> {
        self.0.lock().unwrap().last().cloned()
    }
}

fn api_pod(name: &str, node: &str, annotations: &[(&str, &str)]) -> Value {
    let mut p = json!({
        "metadata": {"name": name, "annotations": annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()},
        "spec": {"nodeName": node, "hostNetwork": true, "terminationGracePeriodSeconds": 5,
                 "containers": [{"name": "c", "image": "swiftlet.local/busybox:1.35", "command": ["sleep", "3600"]}]},
    });
    swiftlet_tests::apiserver::defaults::pod(&mut p);
    p
}

#[test]
fn pod_watch_keeps_pods_through_an_outage_and_relists_after_gone() {
    let name = node_name("watch");
    let server = FakeApiServer::start(Options::default()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = kube_client(&server, &rt);
    let sink = Arc::new(Snapshots::default());
    let mirrors = Arc::new(MirrorPods::new(&name, true));
    let stop = CancellationToken::new();
    let shutdown = stop.clone();
    server.store().create(&PODS, "default", api_pod("p1", &name, &[])).unwrap();
    server.store().create(&PODS, "default", api_pod("elsewhere", "other-node", &[])).unwrap();
    server.store().create(&PODS, "kube-system", api_pod("etcd", &name, &[(CONFIG_MIRROR, "h1")])).unwrap();
    let task = {
        let (sink, mirrors, name) = (sink.clone(), mirrors.clone(), name.clone());
        rt.spawn(async move { pod_watch::run(client, &name, sink, mirrors, shutdown).await })
    };
    wait("the first list", Duration::from_secs(10), || (sink.last()? == ["p1"]).then_some(()));
    let m = mirrors.mirrors().unwrap();
    assert_eq!(m.len(), 1, "mirror pods go to the mirror manager, not the pod workers");
    server.store().create(&PODS, "default", api_pod("p2", &name, &[])).unwrap();
    wait("p2 from the watch", Duration::from_secs(10), || (sink.last()? == ["p1", "p2"]).then_some(()));

    // Outage: nothing is dropped while the server is away.
    let seen_before = sink.0.lock().unwrap().len();
    server.stop();
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(sink.last().unwrap(), ["p1", "p2"]);
    // Meanwhile p2 goes, p3 comes, and the history is compacted: the watch
    // cannot resume (410) and must list again.
    server
        .store()
        .delete(
            &PODS,
            "default",
            "p2",
            &swiftlet_tests::apiserver::store::DeleteOptions { grace_period_seconds: Some(0), ..Default::default() },
        )
        .unwrap();
    server.store().create(&PODS, "default", api_pod("p3", &name, &[])).unwrap();
    server.compact();
    server.restart().unwrap();
    let restarted = Instant::now();
    wait("the re-list after the outage", Duration::from_secs(30), || (sink.last()? == ["p1", "p3"]).then_some(()));
    println!("re-listed {:?} after the restart", restarted.elapsed());
    let snapshots = sink.0.lock().unwrap().clone();
    assert!(
        snapshots[seen_before..].iter().all(|s| s.contains(&"p1".to_owned())),
        "p1 was never dropped: {snapshots:?}"
    );
    let lists_after = server
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.uri.starts_with("/api/v1/pods?") && !r.uri.contains("watch=true"))
        .count();
    assert!(lists_after >= 2, "a list at start and one after the 410");
    stop.cancel();
    rt.block_on(task).unwrap();
}

fn kubelet_status(phase: &str, ready: bool) -> PodStatus {
    let s = if ready { "True" } else { "False" };
    PodStatus {
        phase: Some(phase.into()),
        conditions: Some(vec![
            PodCondition { type_: "Ready".into(), status: s.into(), ..Default::default() },
            PodCondition { type_: "ContainersReady".into(), status: s.into(), ..Default::default() },
        ]),
        container_statuses: Some(vec![ContainerStatus {
            name: "c".into(),
            ready,
            image: "swiftlet.local/busybox:1.35".into(),
            image_id: "sha256:b11f".into(),
            state: Some(ContainerState { running: Some(ContainerStateRunning::default()), ..Default::default() }),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

#[test]
fn status_manager_writes_changes_retries_conflicts_and_deletes_terminated_pods() {
    let name = node_name("status");
    let server = FakeApiServer::start(Options::default()).unwrap();
    let kubeconfig = server.dir().join("admin.kubeconfig");
    server.write_kubeconfig(&kubeconfig, &Credentials::None).unwrap();
    let admin = Kubectl::new(&kubeconfig);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = kube_client(&server, &rt);
    let created = server.store().create(&PODS, "default", api_pod("web", &name, &[])).unwrap();
    let pod: Pod = serde_json::from_value(created).unwrap();
    let sm = Arc::new(StatusManager::default());
    let stop = CancellationToken::new();
    let shutdown = stop.clone();
    let api = Arc::new(KubePodApi { client, timeout: Duration::from_secs(5) });
    let task = {
        let sm = sm.clone();
        rt.spawn(async move { sm.run(api, Duration::from_millis(300), shutdown).await })
    };
    let path = "/api/v1/namespaces/default/pods/web/status";
    server.inject(Fault { method: http::Method::PATCH, path_contains: path.into(), code: 409, count: 1 });
    sm.report(&pod, &kubelet_status("Running", true));
    wait("Running in the API", Duration::from_secs(10), || {
        let p = server.get(&PODS, "default", "web")?;
        (p["status"]["phase"] == "Running" && condition(&p, "Ready")?["status"] == "True").then_some(())
    });
    let patches = |code: u16| {
        server.requests().iter().filter(|r| r.method == "PATCH" && r.uri.starts_with(path) && r.status == code).count()
    };
    assert_eq!((patches(409), patches(200)), (1, 1), "the conflict was retried once");
    let p = server.get(&PODS, "default", "web").unwrap();
    assert_eq!(p["status"]["qosClass"], "BestEffort", "fields the kubelet does not own are kept");
    // The same status again: nothing is sent.
    sm.report(&pod, &kubelet_status("Running", true));
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(patches(200), 1);
    let out = admin.ok(&["get", "pods", "-o", "wide"]);
    println!("$ kubectl get pods -o wide\n{out}");
    assert!(table(&out).iter().any(|r| r[0] == "web" && r[1] == "1/1" && r[2] == "Running"));

    // kubectl delete: graceful; once the kubelet says the pod is done, it
    // is deleted with grace 0.
    admin.ok(&["delete", "pod", "web", "--wait=false"]);
    let deleting: Pod = serde_json::from_value(server.get(&PODS, "default", "web").unwrap()).unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    sm.report(&deleting, &kubelet_status("Running", false));
    sm.terminated(&deleting);
    wait("the pod gone", Duration::from_secs(10), || server.get(&PODS, "default", "web").is_none().then_some(()));
    assert!(
        server.requests().iter().any(|r| r.method == "DELETE"
            && r.uri.starts_with("/api/v1/namespaces/default/pods/web")
            && r.status == 200)
    );
    stop.cancel();
    rt.block_on(task).unwrap();
}

fn static_pod(name: &str, node: &str, hash: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-{node}"), "namespace": "kube-system", "uid": hash,
                     "annotations": {CONFIG_HASH: hash, CONFIG_SOURCE: "file", CONFIG_SEEN: "2025-01-01T00:00:00.000000000Z"}},
        "spec": {"nodeName": node, "hostNetwork": true, "containers": [{"name": "c", "image": "swiftlet.local/busybox:1.35"}]},
    }))
    .unwrap()
}

#[test]
fn mirror_pods_follow_static_pods_and_come_back_when_deleted() {
    let name = node_name("mirror");
    let server = FakeApiServer::start(Options::default()).unwrap();
    let kubeconfig = server.dir().join("admin.kubeconfig");
    server.write_kubeconfig(&kubeconfig, &Credentials::None).unwrap();
    let admin = Kubectl::new(&kubeconfig);
    let node = server.store().create(&NODES, "", json!({"metadata": {"name": name}})).unwrap();
    let node_uid = node["metadata"]["uid"].as_str().unwrap().to_owned();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = kube_client(&server, &rt);
    let mirrors = Arc::new(MirrorPods::new(&name, true));
    let sm = Arc::new(StatusManager::default());
    let stop = CancellationToken::new();
    let shutdown = stop.clone();
    let (_uid_tx, uid_rx) = watch::channel(Some(node_uid.clone()));
    let api = Arc::new(KubePodApi { client: client.clone(), timeout: Duration::from_secs(5) });
    let tasks = {
        let (m, m2, sm, name, sd) = (mirrors.clone(), mirrors.clone(), sm.clone(), name.clone(), shutdown.clone());
        let sink = Arc::new(Snapshots::default());
        let api2 = api.clone();
        vec![
            rt.spawn(async move { pod_watch::run(client, &name, sink, m, sd).await }),
            rt.spawn({
                let sd = shutdown.clone();
                async move { m2.run(api, uid_rx, Duration::from_millis(500), sd).await }
            }),
            rt.spawn(async move { sm.run(api2, Duration::from_millis(300), shutdown).await }),
        ]
    };
    let mirror_name = format!("etcd-{name}");
    let current = |server: &FakeApiServer| server.get(&PODS, "kube-system", &mirror_name);
    mirrors.set(PodSnapshot { source: SourceKind::File, pods: vec![static_pod("etcd", &name, "h1")] });
    let first = wait("the mirror pod", Duration::from_secs(10), || current(&server));
    assert_eq!(first["metadata"]["annotations"][CONFIG_MIRROR], "h1");
    assert_eq!(first["metadata"]["annotations"][CONFIG_SOURCE], "file");
    assert_eq!(first["metadata"]["ownerReferences"][0]["uid"], node_uid.as_str());
    assert_ne!(first["metadata"]["uid"], "h1", "the mirror pod has its own uid");

    // The static pod's status goes to its mirror.
    sm.report(&static_pod("etcd", &name, "h1"), &kubelet_status("Running", true));
    wait("the mirror's status", Duration::from_secs(10), || {
        (current(&server)?["status"]["phase"] == "Running").then_some(())
    });
    let out = admin.ok(&["get", "pods", "-n", "kube-system", "-o", "wide"]);
    println!("$ kubectl get pods -n kube-system -o wide\n{out}");

    // Someone deletes it: it comes back (a new uid).
    admin.ok(&["delete", "pod", "-n", "kube-system", &mirror_name, "--wait=false"]);
    let again = wait("the mirror pod recreated", Duration::from_secs(15), || {
        current(&server).filter(|p| {
            p["metadata"]["uid"] != first["metadata"]["uid"] && p["metadata"].get("deletionTimestamp").is_none()
        })
    });
    assert_eq!(again["metadata"]["annotations"][CONFIG_MIRROR], "h1");
    // The static pod changes: the mirror follows.
    mirrors.set(PodSnapshot { source: SourceKind::File, pods: vec![static_pod("etcd", &name, "h2")] });
    wait("the mirror of the new version", Duration::from_secs(10), || {
        (current(&server)?["metadata"]["annotations"][CONFIG_MIRROR] == "h2").then_some(())
    });
    // The static pod goes: so does its mirror.
    mirrors.set(PodSnapshot { source: SourceKind::File, pods: vec![] });
    wait("the orphan mirror deleted", Duration::from_secs(10), || current(&server).is_none().then_some(()));
    stop.cancel();
    for t in tasks {
        rt.block_on(t).unwrap();
    }
}

#[test]
fn events_are_deduplicated_and_counted_in_the_api() {
    let name = node_name("events");
    let server = FakeApiServer::start(Options::default()).unwrap();
    let kubeconfig = server.dir().join("admin.kubeconfig");
    server.write_kubeconfig(&kubeconfig, &Credentials::None).unwrap();
    let admin = Kubectl::new(&kubeconfig);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = kube_client(&server, &rt);
    let pod: Pod =
        serde_json::from_value(server.store().create(&PODS, "default", api_pod("web", &name, &[])).unwrap()).unwrap();
    let rec = Arc::new(recorder::ApiEventRecorder::new(&name, 50, 100));
    let stop = CancellationToken::new();
    let shutdown = stop.clone();
    let task = {
        let rec = rec.clone();
        let sink: Arc<dyn recorder::EventSink> = Arc::new(recorder::KubeEventSink(client));
        rt.spawn(async move { rec.run(sink, shutdown).await })
    };
    let r = swiftlet::events::pod_ref(&pod);
    for _ in 0..3 {
        rec.record(&r, EventType::Warning, "BackOff", "Back-off restarting failed container c in pod web_default");
        // Event timestamps have whole seconds: 1.2 s between the first and
        // the last always crosses a second boundary.
        std::thread::sleep(Duration::from_millis(600));
    }
    rec.record(
        &r,
        EventType::Normal,
        "Pulled",
        "Container image \"swiftlet.local/busybox:1.35\" already present on machine",
    );
    let backoff = wait("one BackOff event with count 3", Duration::from_secs(10), || {
        let evs = server.list(&EVENTS, Some("default"));
        let b: Vec<Value> = evs.into_iter().filter(|e| e["reason"] == "BackOff").collect();
        (b.len() == 1 && b[0]["count"] == 3).then(|| b[0].clone())
    });
    assert!(
        parse_time(backoff["lastTimestamp"].as_str().unwrap())
            > parse_time(backoff["firstTimestamp"].as_str().unwrap())
    );
    assert_eq!(backoff["source"]["component"], "kubelet");
    assert_eq!(backoff["source"]["host"], name.as_str());
    assert_eq!(backoff["involvedObject"]["uid"], pod.metadata.uid.as_deref().unwrap());
    wait("the Pulled event", Duration::from_secs(10), || {
        server.list(&EVENTS, Some("default")).into_iter().find(|e| e["reason"] == "Pulled")
    });
    let out = admin.ok(&["get", "events", "-o", "wide"]);
    println!("$ kubectl get events -o wide\n{out}");
    assert!(table(&out).iter().any(|r| r.contains(&"BackOff".to_owned()) && r.contains(&"3".to_owned())));
    stop.cancel();
    rt.block_on(task).unwrap();
}

// ---- with the pod manager ----

/// Containers of a pod on the test containerd (by the kubelet's uid label).
fn containers_of(uid: &str) -> Vec<swiftlet::cri::api::Container> {
    use swiftlet::cri::RuntimeService;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cri = {
        let _in_runtime = rt.enter();
        CriClient::new(&cri_endpoint(), Duration::from_secs(10)).unwrap()
    };
    let filter = swiftlet::cri::api::ContainerFilter {
        label_selector: [("io.kubernetes.pod.uid".to_owned(), uid.to_owned())].into(),
        ..Default::default()
    };
    rt.block_on(cri.list_containers(Some(filter))).unwrap()
}

fn running_containers(uid: &str) -> usize {
    containers_of(uid)
        .iter()
        .filter(|c| swiftlet::cri::container_state(c.state) == swiftlet::cri::api::ContainerState::ContainerRunning)
        .count()
}

#[test]
fn api_pod_runs_ready_and_is_deleted_within_its_grace_period() {
    prereq::require_root();
    let name = node_name("pod");
    let cleanup = PodCleanup::new();
    let (c, mut agent) = ready_reporting_node(&name);
    // A pod whose process ignores SIGTERM: deletion waits for the grace
    // period (5 s), then SIGKILL.
    let created = c.server.store().create(&PODS, "default", api_pod("web", &name, &[])).unwrap();
    let uid = created["metadata"]["uid"].as_str().unwrap().to_owned();
    cleanup.track(&uid);
    wait("Running and Ready", Duration::from_secs(60), || {
        agent.assert_running();
        let p = c.server.get(&PODS, "default", "web")?;
        (p["status"]["phase"] == "Running" && condition(&p, "Ready")?["status"] == "True").then_some(())
    });
    let out = c.kubectl.ok(&["get", "pods", "-o", "wide"]);
    println!("$ kubectl get pods -o wide\n{out}");
    assert!(table(&out).iter().any(|r| r[0] == "web" && r[1] == "1/1" && r[2] == "Running" && r[6] == name));
    assert_eq!(running_containers(&uid), 1);
    let started = Instant::now();
    let out = c.kubectl.ok(&["delete", "pod", "web"]);
    let took = started.elapsed();
    println!("$ kubectl delete pod web ({took:?})\n{out}");
    assert!(took < Duration::from_secs(5 + 10), "deleted within its 5 s grace period (plus sync), took {took:?}");
    assert!(c.server.get(&PODS, "default", "web").is_none());
    wait("its containers stopped", Duration::from_secs(10), || (running_containers(&uid) == 0).then_some(()));
    let events = c.kubectl.ok(&["get", "events"]);
    for reason in ["Created", "Started", "Killing"] {
        assert!(events.contains(reason), "no {reason} event:\n{events}");
    }
    assert!(agent.stop());
}

#[test]
fn static_pod_gets_a_mirror_pod() {
    prereq::require_root();
    let name = node_name("static");
    let _cleanup = PodCleanup::with_static_pods_of(&name);
    let c = cluster(&name, Options::default());
    let manifests = tempfile::tempdir().unwrap();
    std::fs::write(
        manifests.path().join("web.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: default\nspec:\n  hostNetwork: true\n  containers:\n  - name: c\n    image: swiftlet.local/busybox:1.35\n    command: [sleep, \"3600\"]\n",
    )
    .unwrap();
    let extra = vec![
        format!("--kubeconfig={}", c.node_kubeconfig.display()),
        format!("--hostname-override={name}"),
        format!("--pod-manifest-path={}", manifests.path().display()),
    ];
    let mut agent = NodeProcess::start(Some(REPORTING_NODE), &extra);
    let mirror_name = format!("web-{name}");
    let mirror = wait("the mirror pod Running", Duration::from_secs(60), || {
        agent.assert_running();
        c.server.get(&PODS, "default", &mirror_name).filter(|p| p["status"]["phase"] == "Running")
    });
    assert!(mirror["metadata"]["annotations"][CONFIG_MIRROR].as_str().is_some_and(|h| !h.is_empty()));
    assert_eq!(mirror["metadata"]["annotations"][CONFIG_SOURCE], "file");
    let out = c.kubectl.ok(&["get", "pods", "-o", "wide"]);
    println!("$ kubectl get pods -o wide\n{out}");
    // Deleting the mirror pod does not stop the static pod; it comes back.
    c.kubectl.ok(&["delete", "pod", &mirror_name, "--wait=false"]);
    wait("the mirror pod recreated", Duration::from_secs(30), || {
        c.server.get(&PODS, "default", &mirror_name).filter(|p| p["metadata"]["uid"] != mirror["metadata"]["uid"])
    });
    assert!(agent.stop());
}

#[test]
fn a_60s_outage_loses_no_pods() {
    prereq::require_root();
    let name = node_name("keep");
    let cleanup = PodCleanup::new();
    let c = cluster(&name, Options::default());
    let extra = vec![format!("--kubeconfig={}", c.node_kubeconfig.display()), format!("--hostname-override={name}")];
    let mut agent = NodeProcess::start(Some(REPORTING_NODE), &extra);
    wait("the node to be Ready", Duration::from_secs(60), || c.server.get(&NODES, "", &name).filter(ready));
    let created = c.server.store().create(&PODS, "default", api_pod("web", &name, &[])).unwrap();
    let uid = created["metadata"]["uid"].as_str().unwrap().to_owned();
    cleanup.track(&uid);
    wait("Running", Duration::from_secs(60), || {
        c.server.get(&PODS, "default", "web").filter(|p| p["status"]["phase"] == "Running")
    });
    let before: BTreeSet<String> = containers_of(&uid).into_iter().map(|c| c.id).collect();
    c.server.stop();
    std::thread::sleep(Duration::from_secs(60));
    agent.assert_running();
    assert_eq!(running_containers(&uid), 1, "the pod kept running while the API server was away");
    c.server.restart().unwrap();
    let back = Timestamp::now();
    wait("status caught up", Duration::from_secs(30), || {
        let p = c.server.get(&PODS, "default", "web")?;
        let n = c.server.get(&NODES, "", &name)?;
        let hb = parse_time(condition(&n, "Ready")?["lastHeartbeatTime"].as_str()?);
        (p["status"]["phase"] == "Running" && hb >= back).then_some(())
    });
    let after: BTreeSet<String> = containers_of(&uid).into_iter().map(|c| c.id).collect();
    assert_eq!(before, after, "no container was restarted");
    assert!(agent.stop());
}
