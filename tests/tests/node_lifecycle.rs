//! The node's lifecycle around its pods, on the real containerd: kubeadm's
//! control-plane static pods with their hostPath volumes, graceful node
//! shutdown (in process and through the binary's SIGTERM), configuration
//! reload (in process and by SIGHUP), and volumes left by an agent killed
//! with SIGKILL cleaned up by the next start.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use swiftlet::{
    cri::api,
    shutdown::{Phase, SHUTDOWN_MESSAGE},
    volumes::{NoApiServer, mount},
};
use swiftlet_tests::agent::{AgentProcess, AgentSetup, TestAgent, exec};

const BUSYBOX: &str = "swiftlet.local/busybox:1.35";
const T: Duration = Duration::from_secs(60);

fn running(s: &PodStatus) -> bool {
    s.container_statuses
        .as_ref()
        .is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| c.state.as_ref().is_some_and(|st| st.running.is_some())))
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/kubeadm").join(name)
}

/// kubeadm's manifest made runnable here: the local busybox sleeping in
/// place of the component (probes dropped: nothing answers them), and every
/// hostPath moved under `prefix` so the test touches only its own files.
fn runnable(original: &str, prefix: &Path) -> String {
    let mut doc: serde_json::Value = serde_saphyr::from_str(original).unwrap();
    let spec = &mut doc["spec"];
    for c in spec["containers"].as_array_mut().unwrap() {
        c["image"] = BUSYBOX.into();
        c["command"] = serde_json::json!(["sleep", "3600"]);
        let m = c.as_object_mut().unwrap();
        for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
            m.remove(probe);
        }
    }
    for v in spec["volumes"].as_array_mut().unwrap() {
        let p = v["hostPath"]["path"].as_str().unwrap().to_owned();
        v["hostPath"]["path"] = format!("{}{p}", prefix.display()).into();
    }
    spec["terminationGracePeriodSeconds"] = 1.into();
    serde_saphyr::to_string(&doc).unwrap()
}

#[test]
fn kubeadm_control_plane_manifests_parse_and_start_with_their_host_paths() {
    let files = ["etcd.yaml", "kube-apiserver.yaml", "kube-controller-manager.yaml", "kube-scheduler.yaml"];
    // As kubeadm writes them: they load and validate unchanged.
    for f in files {
        let pod = swiftlet::pods::manifest::load(&fixture(f), "node1").unwrap_or_else(|e| panic!("{f}: {e}"));
        let errs = swiftlet::pods::validation::validate(&pod);
        assert!(errs.is_empty(), "{f}: {errs:?}");
        assert_eq!(pod.metadata.namespace.as_deref(), Some("kube-system"));
    }

    let a = TestAgent::start("", &["--signal-source=cgroupfs"]);
    let prefix = a.root().join("host");
    // What kubeadm writes before the manifests.
    std::fs::create_dir_all(prefix.join("etc/kubernetes/pki/etcd")).unwrap();
    std::fs::write(prefix.join("etc/kubernetes/pki/ca.crt"), "CA").unwrap();
    std::fs::write(prefix.join("etc/kubernetes/scheduler.conf"), "kind: Config # scheduler").unwrap();
    let mut names = vec![];
    for f in files {
        let text = runnable(&std::fs::read_to_string(fixture(f)).unwrap(), &prefix);
        names.push((a.add_manifest(f, &text), serde_saphyr::from_str::<Pod>(&text).unwrap()));
    }
    for (name, pod) in &names {
        a.wait_status(name, T, "Running", running);
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let mounts = a.exec(name, &c.name, "cat /proc/mounts").1;
        for m in c.volume_mounts.as_ref().unwrap() {
            let line = mounts
                .lines()
                .find(|l| l.split(' ').nth(1) == Some(m.mount_path.as_str()))
                .unwrap_or_else(|| panic!("{name}: {} is not mounted:\n{mounts}", m.mount_path));
            let ro = line.split(' ').nth(3).unwrap().split(',').any(|o| o == "ro");
            assert_eq!(ro, m.read_only.unwrap_or(false), "{name}: {line}");
        }
    }
    // DirectoryOrCreate and FileOrCreate made what was missing.
    assert!(prefix.join("var/lib/etcd").is_dir());
    assert!(prefix.join("usr/libexec/kubernetes/kubelet-plugins/volume/exec").is_dir());
    assert!(prefix.join("etc/kubernetes/controller-manager.conf").is_file());
    let sched = &names[3].0;
    assert_eq!(a.exec(sched, "kube-scheduler", "cat /etc/kubernetes/scheduler.conf").1, "kind: Config # scheduler");
    let api = &names[1].0;
    assert_eq!(a.exec(api, "kube-apiserver", "cat /etc/kubernetes/pki/ca.crt").1, "CA");
    // etcd writes its data to the host.
    let etcd = &names[0].0;
    assert_eq!(a.exec(etcd, "etcd", "echo member > /var/lib/etcd/m").0, 0);
    assert_eq!(std::fs::read_to_string(prefix.join("var/lib/etcd/m")).unwrap(), "member\n");
}

fn uptime() -> f64 {
    std::fs::read_to_string("/proc/uptime").unwrap().split_whitespace().next().unwrap().parse().unwrap()
}

fn shutdown_pod(name: &str, class: Option<&str>, script: &str, out: &Path) -> String {
    let class = class.map(|c| format!("  priorityClassName: {c}\n")).unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 30\n{class}  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", {script:?}]\n    volumeMounts:\n    - {{name: out, mountPath: /out}}\n  volumes:\n  - name: out\n    hostPath: {{path: {}, type: DirectoryOrCreate}}\n",
        out.display()
    )
}

/// Records (on the node's clock) when SIGTERM came, then exits.
fn on_term(file: &str) -> String {
    format!("trap 'cat /proc/uptime > /out/{file}; exit 0' TERM; while :; do sleep 0.1; done")
}

fn read_time(out: &Path, file: &str) -> f64 {
    let text = std::fs::read_to_string(out.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    text.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn node_shutdown_stops_regular_pods_first_and_critical_pods_last_within_their_periods() {
    let mut setup = AgentSetup::new(
        "shutdownGracePeriod: 8s\nshutdownGracePeriodCriticalPods: 3s\n",
        &["--signal-source=cgroupfs"],
    );
    let marker = setup.dir.path().join("node-shutdown");
    setup.args.push(format!("--node-shutdown-marker={}", marker.display()));
    let a = TestAgent::start_setup(setup, Arc::new(NoApiServer));
    let out = a.root().join("out");
    let fast = a.add_manifest("fast.yaml", &shutdown_pod("fast", None, &on_term("fast"), &out));
    // PID 1 without a handler ignores SIGTERM: it stops only when killed.
    let stubborn =
        a.add_manifest("stubborn.yaml", &shutdown_pod("stubborn", None, "while :; do sleep 0.1; done", &out));
    let critical = a.add_manifest(
        "critical.yaml",
        &shutdown_pod("critical", Some("system-node-critical"), &on_term("critical"), &out),
    );
    for p in [&fast, &stubborn, &critical] {
        a.wait_status(p, T, "Running", running);
    }
    let phase = a.agent.node_shutdown.shutting_down();
    assert_eq!(*phase.borrow(), Phase::Idle);

    let t0 = uptime();
    std::fs::write(&marker, "").unwrap();
    for p in [&fast, &stubborn, &critical] {
        let s = a.wait_status(p, Duration::from_secs(30), "Terminated", |s| s.reason.as_deref() == Some("Terminated"));
        assert_eq!(s.phase.as_deref(), Some("Failed"), "{p}");
        assert_eq!(s.message.as_deref(), Some(SHUTDOWN_MESSAGE), "{p}");
        let d = s.conditions.as_ref().unwrap().iter().find(|c| c.type_ == "DisruptionTarget").cloned();
        assert_eq!(d.map(|c| c.reason), Some(Some("TerminationByKubelet".into())), "{p}");
    }
    let done_at = uptime() - t0;
    let fast_at = read_time(&out, "fast") - t0;
    let critical_at = read_time(&out, "critical") - t0;
    // The regular group (budget 8 − 3 = 5 s) ends when the stubborn pod is
    // killed at the end of its budget; only then do critical pods stop.
    assert!(fast_at < 2.0, "regular pods get SIGTERM at once: {fast_at}");
    assert!(critical_at >= 4.5, "critical pods stop after the regular group's period: {critical_at}");
    assert!(critical_at < 8.0, "{critical_at}");
    assert!(done_at < 8.0 + 3.0, "everything within shutdownGracePeriod (and the test's polling): {done_at}");
    let s = a.status(&stubborn).unwrap();
    let t = s.container_statuses.as_ref().unwrap()[0].state.as_ref().unwrap().terminated.clone().unwrap();
    assert_eq!(t.exit_code, 137, "killed at the end of the regular budget");
    let deadline = Instant::now() + T;
    while *phase.borrow() != Phase::Done {
        assert!(Instant::now() < deadline, "the shutdown did not finish");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(a.events.with_reason("Shutdown").iter().any(|e| e.object == a.node));

    // The node is going away: new pods are refused.
    let late = a.add_manifest("late.yaml", &shutdown_pod("late", None, &on_term("late"), &out));
    let s = a.wait_status(&late, T, "rejected", |s| s.phase.as_deref() == Some("Failed"));
    assert_eq!(s.reason.as_deref(), Some("NodeShutdown"));
}

fn process_state(agent: &AgentProcess, uid: &str) -> Vec<(String, i32)> {
    let (_, c) = agent.runtime_state(uid);
    c.into_iter().map(|c| (c.id, c.state)).collect()
}

fn wait_until(what: &str, timeout: Duration, log: impl Fn() -> String, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "{what} did not happen within {timeout:?}\n{}", log());
        std::thread::sleep(Duration::from_millis(200));
    }
}

const RUNNING: i32 = api::ContainerState::ContainerRunning as i32;

#[test]
fn the_binary_stops_pods_on_sigterm_only_during_a_node_shutdown() {
    let mut setup = AgentSetup::new(
        "shutdownGracePeriod: 6s\nshutdownGracePeriodCriticalPods: 2s\n",
        &["--signal-source=cgroupfs"],
    );
    let marker = setup.dir.path().join("node-shutdown");
    setup.args.push(format!("--node-shutdown-marker={}", marker.display()));
    let out = setup.dir.path().join("out");
    setup.add_manifest("web.yaml", &shutdown_pod("web", None, &on_term("web"), &out));
    let uid =
        swiftlet::pods::manifest::load(&setup.manifests.join("web.yaml"), &setup.node).unwrap().metadata.uid.unwrap();
    let mut agent = AgentProcess::start(setup);
    let up = |agent: &AgentProcess| process_state(agent, &uid).iter().any(|(_, s)| *s == RUNNING);
    wait_until("the pod running", T, || agent.log(), || up(&agent));
    let before = process_state(&agent, &uid);

    // A plain SIGTERM: the agent stops, the pod keeps running.
    agent.stop();
    assert_eq!(process_state(&agent, &uid), before, "a plain SIGTERM leaves pods running");
    assert!(!out.join("web").exists());
    assert!(agent.log().contains("SIGTERM: stopping (pods keep running)"), "{}", agent.log());

    // During a node shutdown the pods stop before the agent exits.
    agent.spawn();
    std::thread::sleep(Duration::from_secs(3));
    std::fs::write(&marker, "").unwrap();
    agent.stop();
    assert!(out.join("web").exists(), "the pod got SIGTERM\n{}", agent.log());
    let after = process_state(&agent, &uid);
    assert!(after.iter().all(|(_, s)| *s != RUNNING), "{after:?}\n{}", agent.log());
    assert!(agent.log().contains("node shutdown"), "{}", agent.log());
}

fn memory_pod(name: &str, class: Option<&str>) -> String {
    let class = class.map(|c| format!("  priorityClassName: {c}\n")).unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n{class}  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [\"sleep\", \"3600\"]\n"
    )
}

/// A memory.available threshold this machine is always under.
fn always_met(config: &str) -> String {
    config.replace("memory.available: 100Mi", "memory.available: \"99%\"")
}

#[test]
fn a_reload_with_a_new_eviction_threshold_changes_the_next_decision_without_restarting_pods() {
    let a = TestAgent::start(
        "evictionPressureTransitionPeriod: 5s\n",
        &["--signal-source=cgroupfs", "--kernel-eviction=false", "--evict-static-pods"],
    );
    let keeper = a.add_manifest("keeper.yaml", &memory_pod("keeper", Some("system-node-critical")));
    let victim = a.add_manifest("victim.yaml", &memory_pod("victim", None));
    a.wait_status(&keeper, T, "Running", running);
    a.wait_status(&victim, T, "Running", running);
    let keeper_id = a.container_id(&keeper, "c").unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(a.status(&victim).unwrap().phase.as_deref(), Some("Running"), "nothing to evict before the reload");

    // A bad file changes nothing.
    let good = std::fs::read_to_string(a.config_file()).unwrap();
    std::fs::write(a.config_file(), format!("{good}maxPods: many\n")).unwrap();
    let e = a.reload().unwrap_err().to_string();
    assert!(e.contains("maxPods"), "{e}");

    std::fs::write(a.config_file(), format!("{}maxPods: 50\n", always_met(&good))).unwrap();
    let diff = a.reload().unwrap();
    assert_eq!(diff.applied, vec!["evictionHard"]);
    assert_eq!(diff.needs_restart, vec!["maxPods"]);
    let s = a.wait_status(&victim, T, "Evicted", |s| s.reason.as_deref() == Some("Evicted"));
    assert!(s.message.as_deref().unwrap_or("").contains("memory.available"), "{s:?}");
    // The critical pod ran on, the same container, never restarted.
    let st = a.status(&keeper).unwrap();
    assert_eq!(st.phase.as_deref(), Some("Running"));
    assert_eq!(st.container_statuses.as_ref().unwrap()[0].restart_count, 0);
    assert_eq!(a.container_id(&keeper, "c").as_deref(), Some(keeper_id.as_str()));
    assert_eq!(a.agent.running_config().kubelet.max_pods, 110, "maxPods needs a restart");
}

/// GET `path` on the read-only port as Prometheus asks (OpenMetrics first):
/// (content type, body).
fn scrape_as_prometheus(port: u16, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: localhost\r\nAccept: application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let content_type = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type:").map(|v| v.trim().to_owned()))
        .unwrap_or_default();
    (content_type, body.to_owned())
}

#[test]
fn sighup_reloads_the_binarys_configuration() {
    let mut setup =
        AgentSetup::new("", &["--signal-source=cgroupfs", "--kernel-eviction=false", "--evict-static-pods"]);
    let read_only = swiftlet_tests::node_process::free_port();
    setup.args.push(format!("--read-only-port={read_only}"));
    setup.add_manifest("keeper.yaml", &memory_pod("keeper", Some("system-node-critical")));
    setup.add_manifest("victim.yaml", &memory_pod("victim", None));
    let uid = |f: &str, s: &AgentSetup| {
        swiftlet::pods::manifest::load(&s.manifests.join(f), &s.node).unwrap().metadata.uid.unwrap()
    };
    let (keeper, victim) = (uid("keeper.yaml", &setup), uid("victim.yaml", &setup));
    let config = setup.dir.path().join("kubelet.yaml");
    let agent = AgentProcess::start(setup);
    let up = |u: &str| process_state(&agent, u).iter().any(|(_, s)| *s == RUNNING);
    wait_until("the pods running", T, || agent.log(), || up(&keeper) && up(&victim));
    let keeper_before = process_state(&agent, &keeper);
    let hup = || {
        // SAFETY: signalling the agent process this test started, by its PID.
        unsafe { libc::kill(agent.pid().unwrap() as i32, libc::SIGHUP) };
    };

    let good = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, "kind: [").unwrap();
    hup();
    wait_until("the bad file reported", T, || agent.log(), || agent.log().contains("the configuration does not load"));
    assert!(up(&victim));

    std::fs::write(&config, format!("{}maxPods: 50\n", always_met(&good))).unwrap();
    hup();
    wait_until("the victim stopped", T, || agent.log(), || !up(&victim));
    let log = agent.log();
    assert!(log.contains("SIGHUP: configuration reloaded"), "{log}");
    assert!(log.contains("need a restart") && log.contains("maxPods"), "{log}");
    assert_eq!(process_state(&agent, &keeper), keeper_before, "the critical pod was not touched");
    // The eviction is counted under the kubelet's name, in the text format,
    // though Prometheus asks for OpenMetrics first (kube-prometheus's
    // KubeNodeEviction queries `kubelet_evictions`).
    let (content_type, metrics) = scrape_as_prometheus(read_only, "/metrics");
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    assert!(metrics.lines().any(|l| l == "kubelet_evictions{eviction_signal=\"memory.available\"} 1"), "{metrics}");
    assert!(!metrics.contains("kubelet_evictions_total"), "{metrics}");
}

#[test]
fn volumes_left_by_a_killed_agent_are_cleaned_up_by_the_next_start() {
    let setup = AgentSetup::new("", &["--signal-source=cgroupfs", "--housekeeping-interval=2s"]);
    let root = setup.dir.path().join("root");
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: vols\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [\"sleep\", \"3600\"]\n    volumeMounts:\n    - {{name: ram, mountPath: /ram}}\n    - {{name: scratch, mountPath: /sub, subPath: deep/dir}}\n  volumes:\n  - name: ram\n    emptyDir: {{medium: Memory}}\n  - name: scratch\n    emptyDir: {{}}\n"
    );
    setup.add_manifest("vols.yaml", &manifest);
    let uid =
        swiftlet::pods::manifest::load(&setup.manifests.join("vols.yaml"), &setup.node).unwrap().metadata.uid.unwrap();
    let mut agent = AgentProcess::start(setup);
    let pods_dir = root.join("pods");
    let pod_dir = pods_dir.join(&uid);
    let mounted = |d: &Path| mount::mounts_under(&mount::mount_table().unwrap(), d);
    wait_until(
        "the pod running with its volumes",
        T,
        || agent.log(),
        || process_state(&agent, &uid).iter().any(|(_, s)| *s == RUNNING) && mounted(&pod_dir).len() == 2,
    );
    let id = process_state(&agent, &uid)[0].0.clone();
    let (code, out, _) = exec(&agent.cri, &agent.rt, &id, "awk '$2 == \"/ram\" { print $3 }' /proc/mounts");
    assert_eq!((code, out.trim()), (0, "tmpfs"));

    // Killed; the pod is deleted while the agent is down, and a crash in
    // the middle of an earlier cleanup left a pod directory with a tmpfs
    // still mounted and nothing in the runtime.
    agent.kill();
    assert_eq!(mounted(&pod_dir).len(), 2, "SIGKILL leaves the mounts");
    std::fs::remove_file(agent.setup.manifests.join("vols.yaml")).unwrap();
    let leftover = pods_dir.join("0f0f0f0f-dead-beef-0000-000000000000/volumes/kubernetes.io~empty-dir/cache");
    std::fs::create_dir_all(&leftover).unwrap();
    mount::mount_tmpfs(&leftover, Some(1 << 20), 0o777).unwrap();
    std::fs::write(leftover.join("junk"), "x").unwrap();
    agent.spawn();
    wait_until(
        "the pod stopped and every volume unmounted",
        T,
        || agent.log(),
        || {
            let (sandboxes, containers) = agent.runtime_state(&uid);
            sandboxes.is_empty() && containers.is_empty() && mounted(&pods_dir).is_empty() && !pod_dir.exists()
        },
    );
    wait_until("the leftover directory removed", T, || agent.log(), || !leftover.exists());
}

/// A SIGHUP that changes evictionHard is reflected where users look for
/// it: /configz, and the Node's allocatable memory (capacity − reserved −
/// the hard memory.available threshold), as a restart would show them.
#[test]
fn a_sighup_changing_eviction_hard_updates_configz_and_node_allocatable() {
    use swiftlet::quantity::Quantity;
    use swiftlet_tests::{
        apiserver::{Credentials, FakeApiServer, Options, resources::NODES},
        node_process::NodeProcess,
        pki::TestCa,
    };
    swiftlet_tests::prereq::require_root();
    let node = format!("swl-hup-{}", std::process::id());
    let api = FakeApiServer::start(Options { tls: true, ..Default::default() }).unwrap();
    let kubeconfig = api.dir().join("kubelet.kubeconfig");
    let (cert, key) = api.client_cert(&format!("system:node:{node}"), &["system:nodes"]).unwrap();
    api.write_kubeconfig(&kubeconfig, &Credentials::ClientCert { cert, key }).unwrap();
    let ca = TestCa::new("reload-client-ca");
    let ca_file = api.dir().join("client-ca.crt");
    ca.write(&ca_file);
    let config = |threshold: &str| {
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nnodeStatusUpdateFrequency: 1s\n\
             evictionHard:\n  memory.available: {threshold}\n"
        )
    };
    let agent = NodeProcess::start(
        Some(&config("100Mi")),
        &[
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--hostname-override={node}"),
            format!("--client-ca-file={}", ca_file.display()),
            "--authorization-mode=AlwaysAllow".into(),
        ],
    );
    let port: u16 = agent.args.iter().find_map(|a| a.strip_prefix("--port=")).unwrap().parse().unwrap();
    let https = swiftlet_tests::https::Https::new(([127, 0, 0, 1], port).into(), Some(ca.client("admin", &[])));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let configz_threshold = || {
        let r = rt.block_on(https.get("/configz")).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        v["kubeletconfig"]["evictionHard"]["memory.available"].as_str().map(str::to_owned)
    };
    let allocatable_memory = || {
        api.get(&NODES, "", &node).and_then(|n| {
            n.pointer("/status/allocatable/memory")?.as_str()?.parse::<Quantity>().ok().map(|q| q.value())
        })
    };
    let mut before = None;
    wait_until(
        "the Node registered with its allocatable",
        T,
        || agent.log_text(),
        || {
            before = allocatable_memory();
            before.is_some()
        },
    );
    let before = before.unwrap();
    assert_eq!(configz_threshold().as_deref(), Some("100Mi"));

    std::fs::write(agent.config_path(), config("612Mi")).unwrap();
    agent.signal(libc::SIGHUP);
    wait_until(
        "/configz to show the new threshold",
        T,
        || agent.log_text(),
        || configz_threshold().as_deref() == Some("612Mi"),
    );
    wait_until(
        "the Node's allocatable memory to drop by 512Mi",
        T,
        || agent.log_text(),
        || allocatable_memory() == Some(before - (512 << 20)),
    );
}
