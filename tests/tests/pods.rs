//! Pods on the real containerd, through the whole agent: static pods,
//! restart policies, init containers, probes, CrashLoopBackOff, OOM kills,
//! manifest edits and deletes. Pods use the host network (this machine has
//! no CNI network for pods).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ContainerStatus, PodStatus};
use swiftlet_tests::{agent::TestAgent, node_process::free_port};

const BUSYBOX: &str = "swiftlet.local/busybox:1.35";

/// A host-network static pod. `containers` is the YAML list body, indented
/// by two spaces.
fn manifest(name: &str, restart_policy: &str, extra_spec: &str, containers: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  restartPolicy: {restart_policy}\n  terminationGracePeriodSeconds: 2\n{extra_spec}  containers:\n{containers}"
    )
}

fn container(name: &str, script: &str) -> String {
    format!("  - name: {name}\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", {script:?}]\n")
}

fn cs<'a>(s: &'a PodStatus, name: &str) -> &'a ContainerStatus {
    s.container_statuses
        .as_ref()
        .and_then(|l| l.iter().find(|c| c.name == name))
        .unwrap_or_else(|| panic!("no status for container {name}"))
}

fn init_cs<'a>(s: &'a PodStatus, name: &str) -> &'a ContainerStatus {
    s.init_container_statuses
        .as_ref()
        .and_then(|l| l.iter().find(|c| c.name == name))
        .unwrap_or_else(|| panic!("no status for init container {name}"))
}

fn terminated(c: &ContainerStatus) -> Option<(i32, String)> {
    let t = c.state.as_ref()?.terminated.as_ref()?;
    Some((t.exit_code, t.reason.clone().unwrap_or_default()))
}

fn waiting_reason(c: &ContainerStatus) -> Option<String> {
    c.state.as_ref()?.waiting.as_ref()?.reason.clone()
}

fn running(c: &ContainerStatus) -> bool {
    c.state.as_ref().is_some_and(|s| s.running.is_some())
}

fn condition(s: &PodStatus, t: &str) -> Option<String> {
    s.conditions.as_ref()?.iter().find(|c| c.type_ == t).map(|c| c.status.clone())
}

fn phase(s: &PodStatus) -> &str {
    s.phase.as_deref().unwrap_or("")
}

const T: Duration = Duration::from_secs(60);

#[test]
fn restart_policies() {
    let a = TestAgent::start("", &["--signal-source=cgroupfs"]);
    let always = a.add_manifest("always.yaml", &manifest("always", "Always", "", &container("c", "echo run; exit 0")));
    let on_failure_ok = a.add_manifest("onf-ok.yaml", &manifest("onf-ok", "OnFailure", "", &container("c", "exit 0")));
    let on_failure_bad =
        a.add_manifest("onf-bad.yaml", &manifest("onf-bad", "OnFailure", "", &container("c", "sleep 1; exit 3")));
    let never = a.add_manifest("never.yaml", &manifest("never", "Never", "", &container("c", "echo oops >&2; exit 7")));

    // Always: a container that completes is started again.
    let s = a.wait_status(&always, T, "a restart", |s| cs(s, "c").restart_count >= 1);
    assert_eq!(phase(&s), "Running");
    // OnFailure: success ends the pod, failure restarts the container.
    let s = a.wait_status(&on_failure_ok, T, "Succeeded", |s| phase(s) == "Succeeded");
    assert_eq!(terminated(cs(&s, "c")), Some((0, "Completed".into())));
    assert_eq!(cs(&s, "c").restart_count, 0);
    assert_eq!(condition(&s, "Ready").as_deref(), Some("False"));
    let s = a.wait_status(&on_failure_bad, T, "a restart after failure", |s| cs(s, "c").restart_count >= 1);
    assert_eq!(phase(&s), "Running");
    let last = cs(&s, "c").last_state.as_ref().and_then(|l| l.terminated.as_ref()).expect("last state after a restart");
    assert_eq!((last.exit_code, last.reason.as_deref()), (3, Some("Error")));
    // Never: the failure is final.
    let s = a.wait_status(&never, T, "Failed", |s| phase(s) == "Failed");
    assert_eq!(terminated(cs(&s, "c")), Some((7, "Error".into())));
    std::thread::sleep(Duration::from_secs(3));
    let s = a.status(&never).unwrap();
    assert_eq!(cs(&s, "c").restart_count, 0, "restartPolicy Never must not restart");
    let uid = a.pod(&never).unwrap().metadata.uid.unwrap();
    let (sandboxes, containers) = a.runtime_state(&uid);
    assert_eq!(containers.len(), 1, "one container instance for a Never pod");
    assert!(sandboxes.iter().all(|s| !swiftlet::cri::sandbox_ready(s.state)), "a finished pod's sandbox is stopped");
    // The events the kubelet emits.
    let started = a.events.with_reason("Started");
    assert!(
        started.iter().any(|e| e.object == never && e.field_path.as_deref() == Some("spec.containers{c}")),
        "{started:?}"
    );
}

#[test]
fn init_containers_run_in_order_before_the_app() {
    let a = TestAgent::start("", &["--signal-source=cgroupfs"]);
    let extra = format!(
        "  initContainers:\n{}{}",
        container("first", "sleep 1; echo first"),
        container("second", "sleep 1; echo second")
    )
    .replace("  - name", "  - name");
    let name = a.add_manifest("init.yaml", &manifest("init", "Always", &extra, &container("app", "sleep 3600")));
    // While init runs, the pod is Pending and Initialized is False.
    let s = a.wait_status(&name, T, "Pending with init running", |s| {
        s.init_container_statuses.as_ref().is_some_and(|l| l.iter().any(running))
    });
    assert_eq!(phase(&s), "Pending");
    assert_eq!(condition(&s, "Initialized").as_deref(), Some("False"));
    assert_eq!(waiting_reason(cs(&s, "app")).as_deref(), Some("PodInitializing"));
    let s = a.wait_status(&name, T, "Running", |s| running(cs(s, "app")));
    assert_eq!(phase(&s), "Running");
    assert_eq!(condition(&s, "Initialized").as_deref(), Some("True"));
    assert_eq!(condition(&s, "Ready").as_deref(), Some("True"));
    let time = |c: &ContainerStatus, started: bool| {
        let t = c.state.as_ref().and_then(|s| s.terminated.as_ref()).expect("init container terminated");
        if started { t.started_at.clone().unwrap().0 } else { t.finished_at.clone().unwrap().0 }
    };
    let (first, second) = (init_cs(&s, "first"), init_cs(&s, "second"));
    assert_eq!(terminated(first), Some((0, "Completed".into())));
    assert!(time(first, false) <= time(second, true), "second started before first finished");
    let app_started = cs(&s, "app").state.as_ref().unwrap().running.as_ref().unwrap().started_at.clone().unwrap().0;
    assert!(time(second, false) <= app_started, "the app started before init finished");
}

#[test]
fn a_failing_init_container_is_retried_or_fails_the_pod() {
    let a = TestAgent::start("", &["--signal-source=cgroupfs"]);
    let extra = format!("  initContainers:\n{}", container("setup", "exit 4"));
    let never = a.add_manifest("n.yaml", &manifest("init-never", "Never", &extra, &container("app", "sleep 3600")));
    let always = a.add_manifest("a.yaml", &manifest("init-always", "Always", &extra, &container("app", "sleep 3600")));
    let s = a.wait_status(&never, T, "Failed", |s| phase(s) == "Failed");
    assert_eq!(terminated(init_cs(&s, "setup")), Some((4, "Error".into())));
    assert!(cs(&s, "app").state.as_ref().unwrap().waiting.is_some(), "the app never started");
    let s = a.wait_status(&always, T, "a retried init container", |s| init_cs(s, "setup").restart_count >= 1);
    assert_eq!(phase(&s), "Pending");
}

#[test]
fn probes_drive_readiness_and_liveness() {
    let a = TestAgent::start("", &["--signal-source=cgroupfs"]);
    let port = free_port();
    // The probes test files in a host directory the test changes, so the
    // moments they pass and fail do not depend on how fast this machine
    // runs the containers and their probe execs.
    let probe_dir = tempfile::Builder::new().prefix("swiftlet-probes-").tempdir().expect("probe dir");
    let with_probe_dir = |probe: &str| {
        format!("{}    volumeMounts: [{{name: probe, mountPath: /probe}}]\n{probe}", container("c", "sleep 3600"))
    };
    let volume = format!(
        "  volumes:\n  - name: probe\n    hostPath: {{path: {}, type: Directory}}\n",
        probe_dir.path().display()
    );
    let (ready_file, alive_file) = (probe_dir.path().join("ready"), probe_dir.path().join("alive"));
    std::fs::write(&alive_file, "").unwrap();
    let readiness = with_probe_dir(
        "    readinessProbe:\n      exec: {command: [\"test\", \"-f\", \"/probe/ready\"]}\n      periodSeconds: 1\n",
    );
    let r = a.add_manifest("ready.yaml", &manifest("ready", "Always", &volume, &readiness));
    let liveness = with_probe_dir(
        "    livenessProbe:\n      exec: {command: [\"test\", \"-f\", \"/probe/alive\"]}\n      periodSeconds: 1\n      failureThreshold: 2\n",
    );
    let l = a.add_manifest("live.yaml", &manifest("live", "Always", &volume, &liveness));

    // Readiness: not Ready while the file is missing, Ready once it exists,
    // not Ready again when it goes; it never restarts the container.
    let s = a.wait_status(&r, T, "running", |s| running(cs(s, "c")));
    assert_eq!(condition(&s, "Ready").as_deref(), Some("False"), "no /probe/ready yet");
    std::fs::write(&ready_file, "").unwrap();
    let s = a.wait_status(&r, T, "Ready", |s| condition(s, "Ready").as_deref() == Some("True"));
    assert!(cs(&s, "c").ready);
    std::fs::remove_file(&ready_file).unwrap();
    let s = a.wait_status(&r, T, "not Ready again", |s| condition(s, "Ready").as_deref() == Some("False"));
    assert_eq!(cs(&s, "c").restart_count, 0, "readiness never restarts");
    assert!(running(cs(&s, "c")));

    // Liveness: passing, no restart; the file gone, the container restarts.
    let s = a.wait_status(&l, T, "running", |s| running(cs(s, "c")));
    assert_eq!(cs(&s, "c").restart_count, 0);
    std::fs::remove_file(&alive_file).unwrap();
    let s = a.wait_status(&l, T, "a liveness restart", |s| cs(s, "c").restart_count >= 1);
    assert_eq!(phase(&s), "Running");
    let unhealthy = a.events.with_reason("Unhealthy");
    assert!(unhealthy.iter().any(|e| e.object == l && e.message.starts_with("Liveness probe failed")), "{unhealthy:?}");
    let killing = a.events.with_reason("Killing");
    assert!(
        killing.iter().any(|e| e.object == l && e.message == "Container c failed liveness probe, will be restarted"),
        "{killing:?}"
    );

    // HTTP readiness and TCP liveness against a web server on the host network.
    let web = format!(
        "  - name: web\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"mkdir -p /www && echo ok > /www/healthz && exec httpd -f -p {port} -h /www\"]\n    ports: [{{containerPort: {port}, name: http}}]\n    readinessProbe:\n      httpGet: {{path: /healthz, port: http}}\n      periodSeconds: 1\n    livenessProbe:\n      tcpSocket: {{port: {port}}}\n      periodSeconds: 1\n"
    );
    let w = a.add_manifest("web.yaml", &manifest("web", "Always", "", &web));

    let s = a.wait_status(&w, T, "web Ready", |s| condition(s, "Ready").as_deref() == Some("True"));
    assert_eq!(cs(&s, "web").restart_count, 0);
    assert!(a.events.with_reason("Unhealthy").iter().all(|e| e.object != w), "the web probes must pass");
}

#[test]
fn crash_loop_back_off_follows_the_configured_cap() {
    // The cap is shortened through the kubelet's own setting, not test code.
    let a = TestAgent::start(
        "featureGates:\n  KubeletCrashLoopBackOffMax: true\ncrashLoopBackOff:\n  maxContainerRestartPeriod: 2s",
        &["--signal-source=cgroupfs"],
    );
    let name = a.add_manifest("crash.yaml", &manifest("crash", "Always", "", &container("c", "exit 1")));
    let mut restarts: Vec<(i32, Instant)> = vec![];
    let mut saw_back_off = false;
    let deadline = Instant::now() + T;
    while restarts.last().is_none_or(|(n, _)| *n < 4) {
        assert!(Instant::now() < deadline, "restarts so far: {:?}", restarts.iter().map(|r| r.0).collect::<Vec<_>>());
        if let Some(s) = a.status(&name) {
            let c = cs(&s, "c");
            if restarts.last().is_none_or(|(n, _)| c.restart_count > *n) {
                restarts.push((c.restart_count, Instant::now()));
            }
            if waiting_reason(c).as_deref() == Some("CrashLoopBackOff") {
                saw_back_off = true;
                let msg = c.state.as_ref().unwrap().waiting.as_ref().unwrap().message.clone().unwrap_or_default();
                assert!(msg.starts_with("back-off 2s restarting failed container=c pod="), "{msg}");
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(saw_back_off, "CrashLoopBackOff never shown");
    // After the first immediate restart, restarts are at least the back-off
    // apart (a loaded machine can only make them later).
    for w in restarts.windows(2).skip(1) {
        let gap = w[1].1 - w[0].1;
        assert!(gap >= Duration::from_millis(1500), "restart {} came {gap:?} after the previous one", w[1].0);
    }
    assert!(!a.events.with_reason("BackOff").is_empty());
}

#[test]
fn a_container_over_its_memory_limit_is_oom_killed() {
    let a = TestAgent::start("", &["--signal-source=cgroupfs"]);
    let hog = format!(
        "{}    resources:\n      limits: {{memory: 32Mi}}\n",
        container("hog", "exec dd if=/dev/zero of=/dev/null bs=128M count=1")
    );
    let name = a.add_manifest("oom.yaml", &manifest("oom", "Never", "", &hog));
    let s = a.wait_status(&name, T, "Failed", |s| phase(s) == "Failed");
    assert_eq!(terminated(cs(&s, "hog")), Some((137, "OOMKilled".into())));
    assert_eq!(s.qos_class.as_deref(), Some("Burstable"));
}

#[test]
fn termination_messages_and_logs() {
    let a = TestAgent::start("", &["--signal-source=cgroupfs"]);
    let c = format!(
        "{}{}    terminationMessagePolicy: FallbackToLogsOnError\n",
        container("file", "echo 'checksum mismatch' > /dev/termination-log; exit 2"),
        container("logs", "echo first; echo 'last words'; exit 5")
    );
    let name = a.add_manifest("msg.yaml", &manifest("msg", "Never", "", &c));
    let s = a.wait_status(&name, T, "Failed", |s| phase(s) == "Failed");
    let msg = |n: &str| cs(&s, n).state.as_ref().unwrap().terminated.as_ref().unwrap().message.clone();
    assert_eq!(msg("file").as_deref(), Some("checksum mismatch\n"));
    assert_eq!(msg("logs").as_deref(), Some("first\nlast words"));
    // The kubelet's log layout: <podLogsDir>/<ns>_<name>_<uid>/<container>/<restart>.log
    let uid = a.pod(&name).unwrap().metadata.uid.unwrap();
    let log = a.root().join("logs").join(format!("default_{name}_{uid}")).join("logs").join("0.log");
    let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    assert!(text.lines().any(|l| l.ends_with(" stdout F last words")), "{text}");
}

#[test]
fn static_pod_edit_replaces_the_pod_and_delete_removes_it() {
    let a = TestAgent::start("", &["--signal-source=cgroupfs"]);
    let name = a.add_manifest("svc.yaml", &manifest("svc", "Always", "", &container("c", "sleep 3600")));
    a.wait_status(&name, T, "Running", |s| phase(s) == "Running" && running(cs(s, "c")));
    let old_uid = a.pod(&name).unwrap().metadata.uid.unwrap();
    let pod_cgroup = a.agent.pod_cgroups.pod_cgroup(swiftlet::cm::qos::QosClass::BestEffort, &old_uid);
    assert!(a.cgroupfs().exists(&pod_cgroup), "the pod cgroup {pod_cgroup} exists while it runs");

    // An edit is a new pod (a new uid): the old one is stopped and removed.
    a.add_manifest("svc.yaml", &manifest("svc", "Always", "", &container("c", "sleep 3601")));
    let deadline = Instant::now() + T;
    loop {
        let p = a.pod(&name);
        if p.as_ref().and_then(|p| p.metadata.uid.as_deref()) != Some(old_uid.as_str())
            && p.as_ref().and_then(|p| p.status.as_ref()).is_some_and(|s| running(cs(s, "c")))
        {
            break;
        }
        assert!(Instant::now() < deadline, "the edited pod did not replace the old one");
        std::thread::sleep(Duration::from_millis(100));
    }
    let deadline = Instant::now() + T;
    while a.runtime_state(&old_uid) != (vec![], vec![]) {
        assert!(Instant::now() < deadline, "the old pod's sandbox was not removed: {:?}", a.runtime_state(&old_uid));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(!a.cgroupfs().exists(&pod_cgroup), "the old pod cgroup is removed");

    let new_uid = a.pod(&name).unwrap().metadata.uid.unwrap();
    a.remove_manifest("svc.yaml");
    a.wait_gone(&name, T);
    assert_eq!(a.runtime_state(&new_uid), (vec![], vec![]));
    assert!(!a.root().join("logs").join(format!("default_{name}_{new_uid}")).exists(), "logs of a removed pod go too");
}

#[test]
fn a_bad_manifest_is_reported_and_the_others_run() {
    let a = TestAgent::start("", &["--signal-source=cgroupfs"]);
    swiftlet_tests::agent::write_atomically(
        &a.manifests.join("broken.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: broken}\nspec:\n  containers:\n  - name: c\n    image: x\n    resources: {limits: {memory: 2Gx}}\n",
    );
    let good = a.add_manifest("good.yaml", &manifest("good", "Always", "", &container("c", "sleep 3600")));
    a.wait_status(&good, T, "Running", |s| phase(s) == "Running");
    assert_eq!(a.pods().len(), 1, "only the good pod runs");
    assert_eq!(a.agent.pod_metrics.manifest_errors.get(), 1);
    let metrics = a.agent.metrics.encode();
    assert!(metrics.contains("swiftlet_static_pod_manifest_errors_total 1"), "{metrics}");
}

#[test]
fn pre_stop_hooks_run_before_the_container_is_stopped() {
    let a = TestAgent::start("", &["--signal-source=cgroupfs"]);
    // The main process exits with whatever code the preStop hook left for
    // it when SIGTERM arrives; the liveness probe fails after 2 s, so the
    // kubelet's kill path (preStop, then SIGTERM) runs.
    let c = format!(
        "{}    lifecycle:\n      preStop:\n        exec: {{command: [\"sh\", \"-c\", \"echo 42 > /tmp/code\"]}}\n    livenessProbe:\n      exec: {{command: [\"test\", \"-f\", \"/tmp/alive\"]}}\n      periodSeconds: 1\n      failureThreshold: 1\n",
        container(
            "c",
            "trap 'exit $(cat /tmp/code)' TERM; touch /tmp/alive; (sleep 2; rm /tmp/alive) & while true; do sleep 1; done"
        )
    );
    let name = a.add_manifest(
        "hook.yaml",
        &manifest("hook", "Always", "", &c)
            .replace("terminationGracePeriodSeconds: 2", "terminationGracePeriodSeconds: 10"),
    );
    let s = a.wait_status(&name, T, "a restart", |s| cs(s, "c").restart_count >= 1);
    let last = cs(&s, "c").last_state.as_ref().and_then(|l| l.terminated.as_ref()).expect("the killed instance");
    assert_eq!(last.exit_code, 42, "the preStop hook ran before SIGTERM");
    assert!(a.events.with_reason("FailedPreStopHook").is_empty(), "{:?}", a.events.all());
}
