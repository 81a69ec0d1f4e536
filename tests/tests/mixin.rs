//! The kubelet as kube-prometheus sees it: a real Prometheus (Debian's
//! package) scrapes the real `swiftlet` binary on its four kubelet
//! ServiceMonitor endpoints (job `kubelet`, a `metrics_path` label, the
//! cAdvisor endpoint's relabelings), evaluates the recording rules in
//! `tests/fixtures/mixin/rules.yaml`, and every metric name and
//! dashboard/alert expression in `tests/fixtures/mixin/queries.yaml` is
//! asked for: each returns data, except those listed as expected-empty
//! with their reason (which must then be empty) and the alerts that must
//! not fire. The node is registered with the fake API server (so the
//! REST client and node metrics are the ones a cluster sees) and runs
//! real pods in a real containerd: one with a CPU limit, a memory limit
//! and an emptyDir volume on the pod network, writing and reading it with
//! O_DIRECT (block I/O the container's own, as page-cache writeback is
//! not on cgroup v1), one whose command does not exist (a runtime call
//! that fails).
//!
//! `SWIFTLET_BINARY` may name another build to measure (the coverage table
//! is printed before anything is asserted).

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::TcpListener,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use serde::Deserialize;
use swiftlet_tests::{
    apiserver::{Credentials, FakeApiServer, Options},
    cri,
    kubelet::RunningAgent,
    pki::TestCa,
    prereq,
    prometheus::Prometheus,
};

const NODE: &str = "test-node";

#[derive(Deserialize)]
struct Fixture {
    names: Vec<Name>,
    queries: Vec<Query>,
}

#[derive(Deserialize)]
struct Name {
    name: String,
    path: String,
    empty: Option<String>,
}

#[derive(Deserialize)]
struct Query {
    source: String,
    expr: String,
    empty: Option<String>,
    #[serde(default = "yes")]
    firing: bool,
}

fn yes() -> bool {
    true
}

fn fixture_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/mixin")
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// A busy, probed pod on the pod network with limits and an emptyDir it
/// does direct I/O in, an idle pod beside it, and a pod whose container
/// cannot start.
fn write_manifests(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let image = cri::BUSYBOX_IMAGE;
    std::fs::write(
        dir.join("web.yaml"),
        format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: monitored
spec:
  containers:
  - name: app
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "gw=$(ip route | awk '/default/ {{print $3}}'); while true; do ping -c 1 -W 1 $gw >/dev/null 2>&1; i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; echo x >> /data/log; dd if=/dev/zero of=/data/direct bs=4k count=1 oflag=direct conv=notrunc 2>/dev/null; dd if=/data/direct of=/dev/null bs=4k iflag=direct 2>/dev/null; sleep 0.2; done"]
    resources:
      requests: {{cpu: 50m, memory: 16Mi}}
      limits: {{cpu: 50m, memory: 64Mi}}
    readinessProbe:
      exec: {{command: ["true"]}}
      periodSeconds: 1
    volumeMounts:
    - {{name: data, mountPath: /data}}
  volumes:
  - name: data
    emptyDir: {{}}
"#
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("idle.yaml"),
        format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: idle
  namespace: monitored
spec:
  containers:
  - name: app
    image: {image}
    imagePullPolicy: Never
    command: ["sleep", "3600"]
"#
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("broken.yaml"),
        format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: broken
  namespace: monitored
spec:
  restartPolicy: Never
  containers:
  - name: app
    image: {image}
    imagePullPolicy: Never
    command: ["/no/such/command"]
"#
        ),
    )
    .unwrap();
}

/// The local PV on `disk`, its claim `data` and the pod `filler` that
/// fills it, in the namespace the static pods use.
fn create_filling_claim(api: &FakeApiServer, disk: &Path) {
    use swiftlet_tests::apiserver::resources::{NAMESPACES, PODS, PVCS, PVS};
    let store = api.store();
    // The static pods' mirror pods may have made it already.
    let _ = store.create(
        &NAMESPACES,
        "",
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitored"}}),
    );
    store
        .create(
            &PVS,
            "",
            serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "monitored-data"},
                "spec": {"capacity": {"storage": "8Mi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "local",
                         "local": {"path": disk.display().to_string()},
                         "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                             {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]}]}}}}),
        )
        .unwrap();
    store
        .create(
            &PVCS,
            "monitored",
            serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local", "volumeName": "monitored-data",
                         "resources": {"requests": {"storage": "8Mi"}}}}),
        )
        .unwrap();
    // Bound before the pod exists: a first mount attempt on an unbound
    // claim would count in storage_operation_errors_total, which this test
    // expects empty.
    api.wait_for(Duration::from_secs(30), |a| {
        (a.get(&PVCS, "monitored", "data")?["status"]["phase"] == "Bound").then_some(())
    })
    .expect("the claim bound");
    store
        .create(
            &PODS,
            "monitored",
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "filler"},
                "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": false,
                         "containers": [{"name": "app", "image": cri::BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                             "command": ["sh", "-c", "dd if=/dev/zero of=/data/fill bs=1k count=8000; sleep 3600"],
                             "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                         "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}}),
        )
        .unwrap();
}

/// The kube-state-metrics series the mixin joins with, for the node's
/// pods: served on a port of its own until dropped.
struct KubeStateMetrics {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl KubeStateMetrics {
    fn serve(pods: &[(String, String, String)]) -> KubeStateMetrics {
        let mut body = String::from(
            "# TYPE kube_pod_info gauge\n# TYPE kube_node_info gauge\n# TYPE kube_node_status_capacity gauge\n",
        );
        for (ns, name, uid) in pods {
            body.push_str(&format!(
                "kube_pod_info{{namespace=\"{ns}\",pod=\"{name}\",uid=\"{uid}\",node=\"{NODE}\"}} 1\n"
            ));
        }
        body.push_str(&format!("kube_node_info{{node=\"{NODE}\"}} 1\n"));
        body.push_str(&format!(
            "kube_node_status_capacity{{node=\"{NODE}\",resource=\"pods\",unit=\"integer\"}} 110\n"
        ));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        let _ = s.set_nonblocking(false);
                        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                        let mut buf = [0u8; 4096];
                        let _ = s.read(&mut buf);
                        let _ = write!(
                            s,
                            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        );
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        KubeStateMetrics { port, stop, thread: Some(thread) }
    }
}

impl Drop for KubeStateMetrics {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Grafana's template variables, as a dashboard on this node sets them.
fn substitute(expr: &str, namespace: &str, pod: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$cluster", "")
        .replace("$namespace", namespace)
        .replace("$pod", pod)
        .replace("$node", NODE)
        .replace("$instance", ".+")
}

/// The pods the agent lists, (namespace, name, uid), once `web` and
/// `idle` run and `broken` has a container status.
fn wait_for_pods(agent: &RunningAgent, ca: &TestCa) -> Vec<(String, String, String)> {
    let c = agent.https(Some(ca.client("admin", &[])));
    rt().block_on(async {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let r = c.get("/pods").await.unwrap();
            let list: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
            let pods: Vec<(String, String, String, bool)> = list["items"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|p| {
                    let statuses = p["status"]["containerStatuses"].as_array().cloned().unwrap_or_default();
                    let running = statuses.iter().any(|c| c["state"]["running"].is_object());
                    let name = p["metadata"]["name"].as_str().unwrap_or_default();
                    let started = if name.starts_with("broken") { !statuses.is_empty() } else { running };
                    (
                        p["metadata"]["namespace"].as_str().unwrap_or_default().to_owned(),
                        p["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
                        p["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
                        started,
                    )
                })
                .collect();
            if ["web", "idle", "broken"]
                .iter()
                .all(|n| pods.iter().any(|(_, name, _, started)| name.starts_with(n) && *started))
            {
                return pods.into_iter().map(|(ns, n, u, _)| (ns, n, u)).collect();
            }
            assert!(Instant::now() < deadline, "the pods did not start within 90s: {}", r.text());
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

#[derive(Debug, PartialEq)]
enum Verdict {
    /// Data where data was expected, or nothing where nothing was.
    Ok,
    MissingData,
    UnexpectedData,
}

#[test]
fn kube_prometheus_dashboards_and_alerts_see_the_kubelets_metrics() {
    prereq::require_root();
    let _ = cri::endpoint();
    let fixture: Fixture =
        serde_saphyr::from_str(&std::fs::read_to_string(fixture_dir().join("queries.yaml")).unwrap()).unwrap();

    // The cluster: an API server the node registers with.
    let api = FakeApiServer::start(Options { tls: true, ..Default::default() }).unwrap();
    let kubeconfig = api.dir().join("kubelet.kubeconfig");
    let (cert, key) = api.client_cert(&format!("system:node:{NODE}"), &["system:nodes"]).unwrap();
    api.write_kubeconfig(&kubeconfig, &Credentials::ClientCert { cert, key }).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    write_manifests(&manifests);
    let ca = TestCa::new("mixin-client-ca");
    ca.write(&dir.path().join("ca.crt"));
    let agent = RunningAgent::start(&[
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--pod-manifest-path={}", manifests.display()),
        format!("--client-ca-file={}", dir.path().join("ca.crt").display()),
        "--authorization-mode=AlwaysAllow".into(),
        "--housekeeping-interval=1s".into(),
        "--volume-stats-agg-period=2s".into(),
    ]);
    // A PersistentVolumeClaim for the Persistent Volumes panels and
    // KubePersistentVolumeFillingUp: a local PV on an 8 MiB tmpfs that an
    // API pod fills to 98 %.
    let local_disk = swiftlet_tests::tmpfs::SmallFs::mount(8 << 20, 1000);
    api.start_storage_controllers(Default::default());
    create_filling_claim(&api, local_disk.path());
    let pods = wait_for_pods(&agent, &ca);
    let (namespace, web) = pods
        .iter()
        .find(|(_, n, _)| n.starts_with("web"))
        .map(|(ns, n, _)| (ns.clone(), n.clone()))
        .expect("the web pod");
    let ksm = KubeStateMetrics::serve(&pods);

    // Prometheus with the ServiceMonitor's scrape configs and the rules.
    let (cert, key) = ca.client_pem("prometheus", &[]);
    std::fs::write(dir.path().join("prom.crt"), cert).unwrap();
    std::fs::write(dir.path().join("prom.key"), key).unwrap();
    let config = std::fs::read_to_string(fixture_dir().join("prometheus.yml.tmpl"))
        .unwrap()
        .replace("{{rules}}", &fixture_dir().join("rules.yaml").display().to_string())
        .replace("{{cert}}", &dir.path().join("prom.crt").display().to_string())
        .replace("{{key}}", &dir.path().join("prom.key").display().to_string())
        .replace("{{kubelet}}", &agent.port.to_string())
        .replace("{{ksm}}", &ksm.port.to_string());
    let prom = Prometheus::start(dir.path(), &config);

    // Every target scraped, on each of the kubelet job's four paths (up
    // or not: a target that is down is a failure reported below, with the
    // coverage of the rest).
    const PATHS: [&str; 4] = ["/metrics", "/metrics/cadvisor", "/metrics/probes", "/metrics/slis"];
    let deadline = Instant::now() + Duration::from_secs(30);
    let down: Vec<String> = loop {
        let up = prom.query("up").unwrap_or_default();
        let value = |path: &str| {
            up.iter()
                .find(|s| s["metric"]["metrics_path"] == path)
                .and_then(|s| s["value"][1].as_str().map(str::to_owned))
        };
        let ksm_up = up.iter().any(|s| s["metric"]["job"] == "kube-state-metrics" && s["value"][1] == "1");
        let all_up = PATHS.iter().all(|p| value(p).as_deref() == Some("1"));
        if (all_up || PATHS.iter().all(|p| value(p).is_some()) && Instant::now() + Duration::from_secs(20) > deadline)
            && ksm_up
        {
            break PATHS.iter().filter(|p| value(p).as_deref() != Some("1")).map(|p| (*p).to_owned()).collect();
        }
        assert!(
            Instant::now() < deadline,
            "the targets were not scraped within 30s: {up:?}\nPrometheus log:\n{}",
            prom.log_text()
        );
        std::thread::sleep(Duration::from_millis(500));
    };

    // Rates need two scrapes in their window, rules a few evaluations:
    // ask until everything expected has data, for at most a minute.
    let evaluate = || {
        let mut rows: Vec<(String, String, Verdict, usize)> = vec![];
        for n in &fixture.names {
            let expr = format!("count({{__name__=\"{}\", job=\"kubelet\", metrics_path=\"{}\"}})", n.name, n.path);
            let got = prom.query(&expr).unwrap_or_default().len();
            let verdict = match (&n.empty, got > 0) {
                (None, true) | (Some(_), false) => Verdict::Ok,
                (None, false) => Verdict::MissingData,
                (Some(_), true) => Verdict::UnexpectedData,
            };
            rows.push((format!("name {} ({})", n.name, n.path), expr, verdict, got));
        }
        for q in &fixture.queries {
            let expr = substitute(&q.expr, &namespace, &web);
            let got = prom.query(&expr).unwrap_or_default().len();
            let expect_data = q.empty.is_none() && q.firing;
            let verdict = match (expect_data, got > 0) {
                (true, true) | (false, false) => Verdict::Ok,
                (true, false) => Verdict::MissingData,
                (false, true) => Verdict::UnexpectedData,
            };
            rows.push((q.source.clone(), expr, verdict, got));
        }
        rows
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let rows = loop {
        let rows = evaluate();
        if rows.iter().all(|r| r.2 == Verdict::Ok) || Instant::now() > deadline {
            break rows;
        }
        std::thread::sleep(Duration::from_secs(2));
    };

    // The coverage table, then the verdict.
    let mut counts: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (what, _, _, got) in &rows {
        let kind = if what.starts_with("name ") { "names" } else { "queries" };
        let e = counts.entry(kind).or_default();
        e.1 += 1;
        if *got > 0 {
            e.0 += 1;
        }
    }
    println!("--- kube-prometheus coverage (entries returning data / entries) ---");
    for (kind, (with_data, all)) in &counts {
        let expected_empty = match *kind {
            "names" => fixture.names.iter().filter(|n| n.empty.is_some()).count(),
            _ => fixture.queries.iter().filter(|q| q.empty.is_some() || !q.firing).count(),
        };
        println!("{kind}: {with_data} of {all} return data ({expected_empty} listed as expected-empty)");
    }
    let mut failures: Vec<String> = rows
        .iter()
        .filter(|r| r.2 != Verdict::Ok)
        .map(|(what, expr, v, got)| format!("{v:?}: {what}: {got} series for\n    {expr}"))
        .collect();
    failures.extend(down.iter().map(|p| format!("target down: job kubelet, metrics_path {p}")));
    for f in &failures {
        println!("{f}");
    }
    if !failures.is_empty() {
        // What the node warned about explains most unexpected series.
        let log = agent.log_text();
        println!("--- the agent's warnings ---");
        for line in log.lines().filter(|l| l.contains("WARN")) {
            println!("{line}");
        }
    }
    assert!(failures.is_empty(), "{} entries of the mixin fixture disagree (see above)", failures.len());
    drop(prom);
    drop(ksm);
    drop(agent);
    drop(api);
}
