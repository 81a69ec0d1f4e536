//! The kubelet API end to end: the real `swiftlet` binary (or the server
//! module in this process, where noted) answering real HTTP(S) requests
//! with real TLS, over real pods in a real containerd.
//!
//! - the read-only port serves pods, stats, metrics and healthz over
//!   plain HTTP without authentication, and nothing else;
//! - healthz answers on loopback only; the serving certificate is
//!   self-signed in --cert-dir on first start.
//! - :10250 authenticates (client certificates against --client-ca-file,
//!   bearer tokens by TokenReview, anonymous only when allowed: 401
//!   otherwise) and authorizes (AlwaysAllow, or SubjectAccessReview: 403
//!   when denied).
//! - every metrics endpoint passes `promtool check metrics` and answers
//!   in the text format with the kubelet's names whatever the client asks
//!   (Prometheus asks for OpenMetrics first); a real Prometheus scrapes
//!   /metrics/resource (kube-prometheus's view is `mixin.rs`);
//!   /stats/summary parses into metrics-server's types, with the node's
//!   fs.usedBytes as cAdvisor reports it; /containerLogs follows a
//!   container's output.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use swiftlet_tests::{
    cgroup::TestCgroup,
    cri::{self, StaticPods},
    https::{Https, read_until},
    kubelet::{InProcess, RunningAgent, free_port, plain_get},
    pki::TestCa,
    prereq,
    prometheus::{encode, promtool},
    review_stub::ReviewStub,
};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// A non-loopback IPv4 address of this machine.
fn external_ipv4() -> Option<Ipv4Addr> {
    let mut ifs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills a list we free below.
    if unsafe { libc::getifaddrs(&mut ifs) } != 0 {
        return None;
    }
    let mut found = None;
    let mut p = ifs;
    while !p.is_null() {
        // SAFETY: p walks the list getifaddrs returned.
        let ifa = unsafe { &*p };
        // SAFETY: a non-null ifa_addr points at a sockaddr of the list.
        if !ifa.ifa_addr.is_null() && unsafe { (*ifa.ifa_addr).sa_family } as i32 == libc::AF_INET {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            if !ip.is_loopback() {
                found = Some(ip);
                break;
            }
        }
        p = ifa.ifa_next;
    }
    // SAFETY: freeing what getifaddrs allocated.
    unsafe { libc::freeifaddrs(ifs) };
    found
}

#[test]
fn healthz_is_loopback_only_and_the_serving_certificate_is_self_signed() {
    let agent = RunningAgent::start(&["--authorization-mode=AlwaysAllow".into()]);
    let (status, body) = plain_get(SocketAddr::from(([127, 0, 0, 1], agent.healthz_port)), "/healthz").unwrap();
    assert_eq!((status, body.as_str()), (200, "ok"));
    let (status, body) = plain_get(SocketAddr::from(([127, 0, 0, 1], agent.healthz_port)), "/healthz?verbose").unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("[+]ping ok\n") && body.contains("[+]runtime ok\n"), "{body}");
    assert!(body.ends_with("healthz check passed\n"), "{body}");
    let ip = external_ipv4().expect("this test needs a non-loopback IPv4 address on the machine");
    // :10250 binds every address (0.0.0.0): the address is reachable...
    std::net::TcpStream::connect_timeout(&SocketAddr::new(IpAddr::V4(ip), agent.port), Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("{ip}:{} (the secure port) should accept: {e}", agent.port));
    // ...but healthz is not served there.
    let e = std::net::TcpStream::connect_timeout(
        &SocketAddr::new(IpAddr::V4(ip), agent.healthz_port),
        Duration::from_secs(2),
    )
    .expect_err("healthz must not answer on a non-loopback address");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");

    let pki = agent.dir.path().join("pki");
    let crt = std::fs::read_to_string(pki.join("kubelet.crt")).expect("kubelet.crt generated in --cert-dir");
    assert!(pki.join("kubelet.key").exists());
    rt().block_on(async {
        let c = agent.https(None).connect().await.unwrap();
        let served = &c.server_certs[0];
        let (_, file_der) = rustls_pem_first(&crt);
        assert_eq!(served.as_ref(), file_der.as_slice(), "the server presents kubelet.crt");
        // Anonymous requests are refused by default.
        let r = agent.https(None).get("/pods").await.unwrap();
        assert_eq!((r.status, r.text().as_str()), (401, "Unauthorized"));
    });
}

#[test]
fn the_read_only_port_serves_the_default_handlers_without_authentication() {
    let read_only = free_port();
    let agent = RunningAgent::start(&[format!("--read-only-port={read_only}")]);
    let addr = SocketAddr::from(([127, 0, 0, 1], read_only));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(std::time::Instant::now() < deadline, ":{read_only} did not open; log:\n{}", agent.log_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, body) = plain_get(addr, "/pods").unwrap();
    assert_eq!(status, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("/pods: {e}: {body}"));
    assert_eq!(list["kind"], "PodList", "{body}");
    assert_eq!(plain_get(addr, "/healthz").unwrap(), (200, "ok".to_owned()));
    let (status, body) = plain_get(addr, "/metrics").unwrap();
    assert!(status == 200 && body.contains("kubelet_running_pods"), "{status}: {body}");
    // What the kubelet keeps behind authentication stays there.
    for path in ["/configz", "/containerLogs/default/p/c", "/debug/events"] {
        assert_eq!(plain_get(addr, path).unwrap().0, 404, "{path} on the read-only port");
    }
    // The secure port still refuses the same request anonymously.
    rt().block_on(async {
        let r = agent.https(None).get("/pods").await.unwrap();
        assert_eq!(r.status, 401);
    });
}

/// The DER of the first PEM block.
fn rustls_pem_first(pem: &str) -> (String, Vec<u8>) {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let c = CertificateDer::pem_slice_iter(pem.as_bytes()).next().expect("a certificate").expect("PEM");
    ("CERTIFICATE".into(), c.to_vec())
}

#[test]
fn client_certificates_against_the_client_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test-client-ca");
    ca.write(&dir.path().join("ca.crt"));
    let agent = RunningAgent::start(&[
        format!("--client-ca-file={}", dir.path().join("ca.crt").display()),
        "--authorization-mode=AlwaysAllow".into(),
    ]);
    rt().block_on(async {
        let none = agent.https(None).get("/pods").await.unwrap();
        assert_eq!(none.status, 401);
        let stranger = TestCa::new("someone-else").client("admin", &["system:masters"]);
        let r = agent.https(Some(stranger)).get("/pods").await.unwrap();
        assert_eq!((r.status, r.text().as_str()), (401, "Unauthorized"), "a certificate from another CA");
        let good = ca.client("admin", &["system:masters"]);
        let r = agent.https(Some(good.clone())).get("/pods").await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let list: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!((list["kind"].as_str(), list["apiVersion"].as_str()), (Some("PodList"), Some("v1")));
        let r = agent.https(Some(good.clone())).get("/configz").await.unwrap();
        let cfg: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(cfg["kubeletconfig"]["authorization"]["mode"], "AlwaysAllow");
        assert_eq!(agent.https(Some(good)).get("/no/such/path").await.unwrap().status, 404);
    });
}

#[test]
fn anonymous_requests_when_allowed() {
    let agent = RunningAgent::start(&["--anonymous-auth=true".into(), "--authorization-mode=AlwaysAllow".into()]);
    rt().block_on(async {
        let r = agent.https(None).get("/healthz").await.unwrap();
        assert_eq!((r.status, r.text().as_str()), (200, "ok"));
    });
    drop(agent);
    // Webhook authorization without an API server (standalone) allows nothing.
    let agent = RunningAgent::start(&["--anonymous-auth=true".into(), "--authorization-mode=Webhook".into()]);
    rt().block_on(async {
        let r = agent.https(None).get("/pods").await.unwrap();
        assert_eq!(r.status, 403, "{}", r.text());
        assert_eq!(
            r.text(),
            "Forbidden (user=system:anonymous, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
        );
    });
}

/// 401 / 403 / 200 with the webhooks: the server module in this process,
/// its kube client asking a stand-in API server over HTTP.
#[test]
fn webhook_authentication_and_authorization() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test-client-ca");
    let ca_file = dir.path().join("ca.crt");
    ca.write(&ca_file);
    rt().block_on(async {
        let stub = ReviewStub::start().await;
        {
            let mut r = stub.rules.lock().unwrap();
            r.allow.push(("metrics-reader".into(), "metrics".into()));
            r.allow.push(("admin".into(), "proxy".into()));
            r.tokens.insert("good-token".into(), ("system:serviceaccount:monitoring:prometheus".into(), vec![]));
            r.allow.push(("system:serviceaccount:monitoring:prometheus".into(), "stats".into()));
        }
        let kubeconfig = dir.path().join("kubeconfig");
        stub.write_kubeconfig(&kubeconfig);
        let tc = TestCgroup::new();
        let s = InProcess::start_with(
            Arc::new(StaticPods::default()),
            &tc.root,
            Default::default(),
            &[
                format!("--client-ca-file={}", ca_file.display()),
                "--anonymous-auth=false".into(),
                "--authorization-mode=Webhook".into(),
                "--authentication-token-webhook=true".into(),
                format!("--kubeconfig={}", kubeconfig.display()),
            ],
            Some(&kubeconfig),
        )
        .await;
        // No credentials: 401.
        assert_eq!(s.https(None).get("/metrics/resource").await.unwrap().status, 401);
        // A certificate the webhook does not allow: 403, with the kubelet's message.
        let r = s.https(Some(ca.client("mallory", &["staff"]))).get("/metrics/resource").await.unwrap();
        assert_eq!(r.status, 403);
        assert_eq!(r.text(), "Forbidden (user=mallory, verb=get, resource=nodes, subresource(s)=[metrics])\n");
        // Allowed: 200; the same user on another subresource: 403.
        let reader = ca.client("metrics-reader", &[]);
        let r = s.https(Some(reader.clone())).get("/metrics/resource").await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.text().contains("node_memory_working_set_bytes"));
        assert_eq!(s.https(Some(reader)).get("/pods").await.unwrap().status, 403);
        // nodes/proxy covers /pods through the fine-grained fallback.
        assert_eq!(s.https(Some(ca.client("admin", &[]))).get("/pods").await.unwrap().status, 200);
        // Bearer tokens through TokenReview.
        let r = s.https(None).with_token("good-token").get("/stats/summary").await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(s.https(None).with_token("bad-token").get("/stats/summary").await.unwrap().status, 401);
        let seen = stub.rules.lock().unwrap().seen.clone();
        let sar = seen
            .iter()
            .find(|(k, spec)| k == "SubjectAccessReview" && spec["user"] == "mallory")
            .expect("a SubjectAccessReview for mallory");
        assert_eq!(
            sar.1["resourceAttributes"],
            serde_json::json!({"verb": "get", "group": "", "version": "v1", "resource": "nodes", "subresource": "metrics", "name": "test-node"})
        );
        assert!(sar.1["groups"].as_array().unwrap().iter().any(|g| g == "system:authenticated"));
        assert!(seen.iter().any(|(k, spec)| k == "TokenReview" && spec["token"] == "good-token"));
        s.shutdown().await;
    });
}

/// (fragment size, blocks, free blocks, available blocks) of `path`.
fn statvfs(path: &Path) -> (u64, u64, u64, u64) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a zeroed statvfs is a valid out-parameter; c is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` a valid statvfs to fill.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0, "statvfs {}", path.display());
    (st.f_frsize as u64, st.f_blocks as u64, st.f_bfree as u64, st.f_bavail as u64)
}

fn promtool_check(name: &str, text: &str) {
    use std::io::Write;
    let mut child = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed on {name}:\n{}{}\n--- exposition ---\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A static pod whose container prints a numbered line every 200 ms and
/// holds some memory.
fn write_static_pod(dir: &Path, name: &str) {
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
spec:
  hostNetwork: true
  containers:
  - name: app
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "x=$(yes aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa | head -c 8000000); i=0; while true; do echo line $i; i=$((i+1)); sleep 0.2; done"]
"#,
        image = cri::BUSYBOX_IMAGE
    );
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(format!("{name}.yaml")), manifest).unwrap();
}

/// Starts the agent on a static pod (a real containerd is needed), with
/// client certificates from the returned CA and AlwaysAllow.
fn agent_with_static_pod(name: &str) -> (RunningAgent, tempfile::TempDir, TestCa) {
    prereq::require_root();
    let _ = cri::endpoint();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    write_static_pod(&manifests, name);
    let ca = TestCa::new("test-client-ca");
    ca.write(&dir.path().join("ca.crt"));
    let agent = RunningAgent::start(&[
        format!("--pod-manifest-path={}", manifests.display()),
        format!("--client-ca-file={}", dir.path().join("ca.crt").display()),
        "--authorization-mode=AlwaysAllow".into(),
        "--housekeeping-interval=1s".into(),
    ]);
    (agent, dir, ca)
}

/// The sample value of the first series of `name` whose labels contain
/// every `label="value"` of `labels`, in the text format.
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, ""));
        (n == name && labels.iter().all(|x| rest.contains(x))).then(|| value.parse().ok()).flatten()
    })
}

/// What Prometheus 2.x sends: OpenMetrics first.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

#[test]
fn metrics_endpoints_pass_promtool_in_the_text_format_whatever_is_asked() {
    let (agent, _dir, ca) = agent_with_static_pod("metrics-pod");
    let c = agent.https(Some(ca.client("admin", &[])));
    rt().block_on(async {
        let (ns, pod) = c.wait_running("metrics-pod").await;
        let pod_label = format!("pod=\"{pod}\"");
        let ns_label = format!("namespace=\"{ns}\"");
        // Wait for a housekeeping pass that saw the container.
        let deadline = Instant::now() + Duration::from_secs(30);
        let resource = loop {
            let r = c.get("/metrics/resource").await.unwrap();
            if sample(&r.text(), "container_memory_working_set_bytes", &[&pod_label]).is_some() {
                break r;
            }
            assert!(Instant::now() < deadline, "no container series in /metrics/resource:\n{}", r.text());
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        assert_eq!(resource.header("content-type"), "text/plain; version=0.0.4; charset=utf-8");
        let text = resource.text();
        for (name, labels) in [
            ("container_cpu_usage_seconds_total", vec!["container=\"app\"", pod_label.as_str(), ns_label.as_str()]),
            ("container_memory_working_set_bytes", vec!["container=\"app\"", pod_label.as_str()]),
            ("container_start_time_seconds", vec!["container=\"app\"", pod_label.as_str()]),
            ("pod_cpu_usage_seconds_total", vec![pod_label.as_str(), ns_label.as_str()]),
            ("pod_memory_working_set_bytes", vec![pod_label.as_str()]),
            ("node_cpu_usage_seconds_total", vec![]),
            ("node_memory_working_set_bytes", vec![]),
            ("resource_scrape_error", vec![]),
        ] {
            let v = sample(&text, name, &labels).unwrap_or_else(|| panic!("{name} {labels:?} missing:\n{text}"));
            if name.contains("working_set") {
                assert!(v > 4e6, "{name} = {v}: the pod holds 8 MB");
            }
        }
        assert_eq!(sample(&text, "resource_scrape_error", &[]), Some(0.0), "{text}");
        promtool_check("/metrics/resource", &text);

        let cadvisor = c.get("/metrics/cadvisor").await.unwrap().text();
        for name in [
            "container_memory_working_set_bytes",
            "container_memory_rss",
            "container_memory_cache",
            "container_cpu_usage_seconds_total",
            "container_fs_usage_bytes",
            "container_processes",
            "container_threads",
            "container_oom_events_total",
            "container_spec_memory_limit_bytes",
            "container_last_seen",
        ] {
            assert!(
                sample(&cadvisor, name, &["container=\"app\"", pod_label.as_str(), ns_label.as_str(), "id=\"/"])
                    .is_some(),
                "{name} for the container missing:\n{cadvisor}"
            );
        }
        // The pod's own cgroup, with cAdvisor's empty container and image.
        assert!(
            sample(
                &cadvisor,
                "container_memory_working_set_bytes",
                &["container=\"\"", "image=\"\"", pod_label.as_str()]
            )
            .is_some(),
            "the pod-level series missing:\n{cadvisor}"
        );
        for name in ["machine_cpu_cores", "machine_memory_bytes"] {
            assert!(sample(&cadvisor, name, &["boot_id=\""]).unwrap_or(0.0) > 0.0, "{name} missing:\n{cadvisor}");
        }
        // PSI (KEP-4205): the root's series are the node's /proc/pressure;
        // the pods' and containers' only where their cgroups have pressure
        // files (cgroup v2), none on a v1 host.
        let root = ["id=\"/\"", "container=\"\"", "pod=\"\""];
        for resource in ["cpu", "memory", "io"] {
            for kind in ["waiting", "stalled"] {
                let name = format!("container_pressure_{resource}_{kind}_seconds_total");
                assert!(sample(&cadvisor, &name, &root).is_some(), "{name} for the root missing:\n{cadvisor}");
            }
        }
        let waiting = sample(&cadvisor, "container_pressure_memory_waiting_seconds_total", &root).unwrap();
        let proc_us = swiftlet::psi::read_file(Path::new("/proc/pressure/memory")).unwrap().some.total_us;
        assert!(waiting <= proc_us as f64 / 1e6, "seconds of the kernel's µs: {waiting} vs {proc_us} µs now");
        let pod_psi = cadvisor.lines().any(|l| l.starts_with("container_pressure_") && l.contains(pod_label.as_str()));
        assert_eq!(pod_psi, Path::new("/sys/fs/cgroup/cgroup.controllers").exists(), "pod PSI series only on v2");
        promtool_check("/metrics/cadvisor", &cadvisor);

        let metrics = c.get("/metrics").await.unwrap().text();
        for name in [
            "kubelet_running_pods",
            "kubelet_running_containers",
            "kubelet_runtime_operations_total",
            "kubelet_runtime_operations_duration_seconds_bucket",
            "kubelet_pod_start_duration_seconds_count",
            "kubelet_pod_worker_duration_seconds_count",
            "kubelet_pleg_relist_duration_seconds_bucket",
            "kubelet_pleg_relist_interval_seconds_bucket",
            "kubelet_cgroup_manager_duration_seconds_count",
            "kubelet_node_name",
            "kubernetes_build_info",
            "process_resident_memory_bytes",
            "swiftlet_signal_source",
        ] {
            assert!(metrics.lines().any(|l| l.starts_with(name)), "{name} missing from /metrics:\n{metrics}");
        }
        assert!(sample(&metrics, "kubelet_running_pods", &[]).unwrap() >= 1.0);
        promtool_check("/metrics", &metrics);
        promtool_check("/metrics/probes", &c.get("/metrics/probes").await.unwrap().text());
        // /metrics/slis, after a health check ran.
        let _ = c.get("/healthz").await.unwrap();
        let slis = c.get("/metrics/slis").await.unwrap();
        assert_eq!(slis.status, 200);
        assert!(
            sample(&slis.text(), "kubernetes_healthcheck", &["name=\"ping\"", "type=\"healthz\""]) == Some(1.0),
            "{}",
            slis.text()
        );
        promtool_check("/metrics/slis", &slis.text());

        // Prometheus asks for OpenMetrics first; the kubelet answers in the
        // text format with its own names (kubelet_evictions, not
        // kubelet_evictions_total, which KubeNodeEviction would miss: that
        // series exists once a pod is evicted, see node_lifecycle.rs).
        for path in ["/metrics", "/metrics/resource", "/metrics/cadvisor", "/metrics/probes", "/metrics/slis"] {
            let r = c.get_with(path, &[("accept", PROMETHEUS_ACCEPT)]).await.unwrap();
            assert_eq!(r.header("content-type"), "text/plain; version=0.0.4; charset=utf-8", "{path}");
            assert!(!r.text().contains("# EOF"), "{path}: {}", r.text());
            promtool_check(path, &r.text());
        }
    });
}

/// metrics-server's decoding types for the Summary API
/// (sigs.k8s.io/metrics-server/pkg/scraper/client/summary/types.go).
mod metrics_server {
    use serde::Deserialize;

    #[derive(Deserialize)]
    pub struct Summary {
        pub node: NodeStats,
        pub pods: Vec<PodStats>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct NodeStats {
        pub node_name: String,
        pub cpu: Option<CpuStats>,
        pub memory: Option<MemoryStats>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct PodStats {
        pub pod_ref: PodReference,
        pub containers: Vec<ContainerStats>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ContainerStats {
        pub name: String,
        pub start_time: String,
        pub cpu: Option<CpuStats>,
        pub memory: Option<MemoryStats>,
    }
    #[derive(Deserialize)]
    pub struct PodReference {
        pub name: String,
        pub namespace: String,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct CpuStats {
        pub time: String,
        pub usage_core_nano_seconds: Option<u64>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct MemoryStats {
        #[allow(dead_code)]
        pub time: String,
        pub working_set_bytes: Option<u64>,
    }
}

#[test]
fn stats_summary_parses_into_the_metrics_server_types() {
    let (agent, _dir, ca) = agent_with_static_pod("stats-pod");
    let c = agent.https(Some(ca.client("admin", &[])));
    rt().block_on(async {
        let (ns, pod) = c.wait_running("stats-pod").await;
        let deadline = Instant::now() + Duration::from_secs(30);
        let (ms, ours) = loop {
            let r = c.get("/stats/summary").await.unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(r.header("content-type"), "application/json");
            let ms: metrics_server::Summary = serde_json::from_slice(&r.body).unwrap_or_else(|e| {
                panic!("/stats/summary does not parse as metrics-server's Summary: {e}\n{}", r.text())
            });
            let ours: swiftlet::server::summary::Summary = serde_json::from_slice(&r.body).unwrap();
            let has_app = ms
                .pods
                .iter()
                .any(|p| p.pod_ref.name == pod && p.containers.iter().any(|c| c.name == "app" && c.cpu.is_some()));
            if has_app {
                break (ms, ours);
            }
            assert!(Instant::now() < deadline, "pod {pod} never appeared with its container:\n{}", r.text());
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        assert_eq!(ms.node.node_name, "test-node");
        assert!(ms.node.cpu.as_ref().and_then(|c| c.usage_core_nano_seconds).unwrap() > 0);
        assert!(ms.node.memory.as_ref().and_then(|m| m.working_set_bytes).unwrap() > 0);
        let p = ms.pods.iter().find(|p| p.pod_ref.name == pod).unwrap();
        assert_eq!(p.pod_ref.namespace, ns);
        let app = p.containers.iter().find(|c| c.name == "app").unwrap();
        assert!(app.start_time.ends_with('Z'));
        assert!(app.memory.as_ref().and_then(|m| m.working_set_bytes).unwrap() > 4_000_000, "8 MB held");
        assert!(app.cpu.as_ref().unwrap().time.ends_with('Z'));
        // The rest of the kubelet's Summary: rlimit, fs, processes, ephemeral storage.
        let n = &ours.node;
        assert!(n.rlimit.as_ref().and_then(|r| r.maxpid).unwrap() > 0);
        assert!(n.rlimit.as_ref().and_then(|r| r.curproc).unwrap() > 0);
        let fs = n.fs.as_ref().expect("node fs");
        assert!(fs.capacity_bytes.unwrap() > 0);
        // usedBytes is capacity − free, as cAdvisor reports it (blocks
        // reserved for root count as used), not capacity − available.
        let st = statvfs(agent.dir.path());
        let (capacity, free, available) = (st.0 * st.1, st.0 * st.2, st.0 * st.3);
        assert_eq!(fs.capacity_bytes, Some(capacity));
        let used = fs.used_bytes.unwrap() as i128;
        let slack = 256 << 20; // other work on this shared disk moves it a little
        assert!(
            (used - (capacity - free) as i128).abs() < slack,
            "usedBytes {used} vs capacity − free {}",
            capacity - free
        );
        if free - available > 2 * slack as u64 {
            assert!((used - (capacity - available) as i128).abs() > slack, "usedBytes is capacity − available");
        }
        let p = ours.pods.iter().find(|p| p.pod_ref.name == pod).unwrap();
        assert!(!p.pod_ref.uid.is_empty());
        assert!(p.process_stats.as_ref().and_then(|s| s.process_count).unwrap() >= 1);
        assert!(p.memory.as_ref().and_then(|m| m.working_set_bytes).unwrap() > 4_000_000);
        let logs =
            p.containers.iter().find(|c| c.name == "app").and_then(|c| c.logs.clone()).expect("container logs stats");
        assert!(logs.used_bytes.unwrap() > 0, "the container has written lines");
        assert!(p.ephemeral_storage.as_ref().and_then(|e| e.used_bytes).unwrap() > 0);
        node_psi_matches_proc_pressure(&c, &pod).await;
    });
}

/// PSI (KEP-4205): the node's `cpu.psi`, `memory.psi` and `io.psi` are
/// /proc/pressure as a housekeeping pass read it, so they lie between two
/// reads of /proc/pressure taken before and after that pass: totals
/// (cumulative µs) exactly between the two; averages within a tolerance,
/// as they are not monotonic: the kernel recomputes them every 2 s, and
/// the other work on this shared machine moves avg10 by a few points from
/// one update to the next (avg60 and avg300 move less). The pods'
/// and containers' are there only where their cgroups have pressure files
/// (cgroup v2), and absent on a v1 host, as the kubelet leaves them.
async fn node_psi_matches_proc_pressure(c: &Https, pod: &str) {
    use swiftlet::{psi, server::summary::PsiStats};
    let proc = Path::new(psi::PROC_PRESSURE);
    if !proc.join("memory").exists() {
        panic!("this test needs a kernel with PSI (/proc/pressure)");
    }
    let started = k8s_openapi::jiff::Timestamp::now();
    let before = psi::read_node_at(proc);
    let deadline = Instant::now() + Duration::from_secs(15);
    let summary: swiftlet::server::summary::Summary = loop {
        let s: swiftlet::server::summary::Summary =
            serde_json::from_slice(&c.get("/stats/summary").await.unwrap().body).unwrap();
        // A pass taken after the first read (the pass's time is each
        // figure's `time`).
        if s.node.cpu.as_ref().is_some_and(|cpu| cpu.time.0 > started) {
            break s;
        }
        assert!(Instant::now() < deadline, "no housekeeping pass after {started}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let after = psi::read_node_at(proc);
    let n = &summary.node;
    let got = [
        ("cpu", n.cpu.as_ref().and_then(|x| x.psi), before.cpu, after.cpu),
        ("memory", n.memory.as_ref().and_then(|x| x.psi), before.memory, after.memory),
        ("io", n.io.as_ref().and_then(|x| x.psi), before.io, after.io),
    ];
    for (resource, got, b, a) in got {
        let (Some(got), Some(b), Some(a)) = (got, b, a) else {
            panic!("node {resource}.psi missing: {got:?} (/proc/pressure/{resource}: {b:?} then {a:?})")
        };
        let lines = |p: &PsiStats, which: &str| if which == "some" { p.some } else { p.full };
        for which in ["some", "full"] {
            let g = lines(&got, which);
            let (b, a) = if which == "some" {
                (b.some, a.some)
            } else {
                // No full line (the node's CPU on kernels before 5.13): zeros.
                (b.full.unwrap_or_default(), a.full.unwrap_or_default())
            };
            assert!(
                b.total_us <= g.total && g.total <= a.total_us,
                "{resource} {which} total {} not between {} and {}",
                g.total,
                b.total_us,
                a.total_us
            );
            for (name, g, b, a, tolerance) in [
                ("avg10", g.avg10, b.avg10, a.avg10, 10.0),
                ("avg60", g.avg60, b.avg60, a.avg60, 5.0),
                ("avg300", g.avg300, b.avg300, a.avg300, 2.0),
            ] {
                assert!(
                    g >= b.min(a) - tolerance && g <= b.max(a) + tolerance,
                    "{resource} {which} {name} {g} far from {b} and {a}"
                );
            }
        }
    }
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let p = summary.pods.iter().find(|p| p.pod_ref.name == pod).unwrap();
    let app = p.containers.iter().find(|c| c.name == "app").unwrap();
    for (scope, cpu, memory, io) in [
        ("pod", p.cpu.as_ref().and_then(|x| x.psi), p.memory.as_ref().and_then(|x| x.psi), p.io.as_ref()),
        ("container", app.cpu.as_ref().and_then(|x| x.psi), app.memory.as_ref().and_then(|x| x.psi), app.io.as_ref()),
    ] {
        if v2 {
            assert!(cpu.is_some() && memory.is_some() && io.is_some(), "{scope} PSI missing on cgroup v2");
        } else {
            assert!(
                cpu.is_none() && memory.is_none() && io.is_none(),
                "{scope} PSI on a cgroup v1 host: {cpu:?} {memory:?} {io:?}"
            );
        }
    }
}

#[test]
fn container_logs_tail_timestamps_limits_and_follow() {
    let (agent, _dir, ca) = agent_with_static_pod("logs-pod");
    let c = agent.https(Some(ca.client("admin", &[])));
    rt().block_on(async {
        let (ns, pod) = c.wait_running("logs-pod").await;
        let base = format!("/containerLogs/{ns}/{pod}/app");
        // Wait for a few lines.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let r = c.get(&base).await.unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
            if r.text().lines().count() >= 3 {
                break;
            }
            assert!(Instant::now() < deadline, "no output from the container: {}", r.text());
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let r = c.get(&format!("{base}?tailLines=1")).await.unwrap();
        let t = r.text();
        assert_eq!(t.lines().count(), 1, "{t:?}");
        assert!(t.starts_with("line ") && t.ends_with('\n'), "{t:?}");
        let r = c.get(&format!("{base}?tailLines=2&timestamps=true")).await.unwrap();
        for l in r.text().lines() {
            let (ts, rest) = l.split_once(' ').unwrap();
            assert!(ts.len() == 30 && ts.ends_with('Z'), "RFC 3339 with nanoseconds: {l:?}");
            assert!(rest.starts_with("line "), "{l:?}");
        }
        assert_eq!(c.get(&format!("{base}?limitBytes=4")).await.unwrap().text(), "line");
        let r = c.get(&format!("{base}?sinceSeconds=1")).await.unwrap();
        let recent = r.text().lines().count();
        assert!(recent <= 8, "lines of the last second only: {recent}");
        let r = c.get(&format!("{base}?previous=true")).await.unwrap();
        assert_eq!(r.status, 400);
        assert!(r.text().contains("previous terminated container \"app\""), "{}", r.text());
        let r = c.get(&format!("/containerLogs/{ns}/{pod}/nope")).await.unwrap();
        assert_eq!((r.status, r.text()), (404, format!("container \"nope\" not found in pod \"{pod}\"")));
        assert_eq!(c.get(&format!("/containerLogs/{ns}/missing/app")).await.unwrap().status, 404);
        assert_eq!(c.get(&format!("{base}?tailLines=-1")).await.unwrap().status, 422);

        // follow: lines written after the request arrive on the open stream.
        let last: u64 = c
            .get(&format!("{base}?tailLines=1"))
            .await
            .unwrap()
            .text()
            .trim()
            .trim_start_matches("line ")
            .parse()
            .unwrap();
        let (status, mut body) = c.stream(&format!("{base}?follow=true&tailLines=1")).await.unwrap();
        assert_eq!(status, 200);
        let want = last + 5;
        let got =
            read_until(&mut body, Duration::from_secs(20), |t| t.contains(&format!("line {want}\n"))).await.unwrap();
        assert!(got.lines().count() >= 5, "{got:?}");
    });
}

/// A real Prometheus on loopback scrapes /metrics/resource with a client
/// certificate and records the pod's memory series.
#[test]
fn prometheus_scrapes_the_resource_metrics() {
    if Command::new("prometheus").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
        panic!("this test needs prometheus (Debian package prometheus; `cargo xtask test` installs it)");
    }
    let (agent, dir, ca) = agent_with_static_pod("scraped-pod");
    let (cert, key) = ca.client_pem("prometheus", &[]);
    std::fs::write(dir.path().join("prom.crt"), cert).unwrap();
    std::fs::write(dir.path().join("prom.key"), key).unwrap();
    let c = agent.https(Some(ca.client("admin", &[])));
    let (_, pod) = rt().block_on(c.wait_running("scraped-pod"));
    let port = free_port();
    let config = format!(
        r#"global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
- job_name: kubelet-resource
  scheme: https
  metrics_path: /metrics/resource
  tls_config:
    insecure_skip_verify: true
    cert_file: {dir}/prom.crt
    key_file: {dir}/prom.key
  static_configs:
  - targets: ["127.0.0.1:{kubelet}"]
"#,
        dir = dir.path().display(),
        kubelet = agent.port
    );
    std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let mut prom = Command::new("prometheus")
        .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start prometheus");
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            // SAFETY: signalling the Prometheus this test started.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
            let _ = self.0.wait();
        }
    }
    let _guard = Kill(prom_take(&mut prom));
    let query = format!("pod_memory_working_set_bytes{{pod=\"{pod}\"}}");
    let path = format!("/api/v1/query?query={}", encode(&query));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok((200, body)) = plain_get(SocketAddr::from(([127, 0, 0, 1], port)), &path) {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            if let Some(r) = v["data"]["result"].as_array().and_then(|a| a.first()) {
                assert_eq!(r["metric"]["namespace"], "default");
                let value: f64 = r["value"][1].as_str().unwrap().parse().unwrap();
                assert!(value > 4e6, "the pod holds 8 MB, Prometheus recorded {value}");
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus recorded no {query} within 60s; its log:\n{}",
            std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let (_, up) = plain_get(
        SocketAddr::from(([127, 0, 0, 1], port)),
        &format!("/api/v1/query?query={}", encode("up{job=\"kubelet-resource\"}")),
    )
    .unwrap();
    assert!(up.contains("\"1\"]"), "the target is up: {up}");
}

fn prom_take(c: &mut std::process::Child) -> std::process::Child {
    std::mem::replace(c, Command::new("true").spawn().unwrap())
}
