//! swiftlet's own monitoring, `deploy/prometheus/swiftlet.rules.yaml` and
//! `deploy/grafana/swiftlet-eviction.json`, checked by the tools that
//! will run them:
//! - the rules pass `promtool check rules` and their unit tests against
//!   recorded series (`promtool test rules`), and every expression of the
//!   dashboard parses as PromQL;
//! - the real binary, scraped by a real Prometheus that loads the rules,
//!   fires each alert on its fault and no other: the kernel programs not
//!   loaded (signals polled from cgroupfs), then, with the programs loaded
//!   and kernel eviction off, a hog killed by the agent at the crossing
//!   (the forced fallback). After that eviction every dashboard target
//!   that reads the kubelet's endpoints returns data.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;
use swiftlet_tests::{
    cri,
    kubelet::RunningAgent,
    pki::TestCa,
    prereq,
    prometheus::{Prometheus, promtool},
};

const BUSYBOX: &str = "swiftlet.local/busybox:1.35";

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn rules_file() -> PathBuf {
    deploy().join("prometheus/swiftlet.rules.yaml")
}

/// Every (panel title, expression) of the dashboard, with Grafana's
/// variables as a dashboard showing every node sets them.
fn dashboard_targets() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(deploy().join("grafana/swiftlet-eviction.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    let mut out = vec![];
    for p in panels {
        let title = p["title"].as_str().expect("every panel has a title");
        let targets = p["targets"].as_array().filter(|t| !t.is_empty());
        for t in targets.unwrap_or_else(|| panic!("panel {title} has no target")) {
            let expr = t["expr"].as_str().unwrap_or_else(|| panic!("a target of {title} has no expr"));
            out.push((title.to_owned(), expr.replace("$__rate_interval", "1m").replace("$instance", ".+")));
        }
    }
    out
}

fn promtool_ok(args: &[&str], dir: &Path) {
    let out = Command::new(promtool()).args(args).current_dir(dir).output().expect("run promtool");
    assert!(
        out.status.success(),
        "promtool {} failed:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_rules_and_the_dashboard_pass_promtool() {
    let dir = deploy().join("prometheus");
    promtool_ok(&["check", "rules", "swiftlet.rules.yaml"], &dir);
    promtool_ok(&["test", "rules", "swiftlet.rules.test.yaml"], &dir);
    // The dashboard's expressions, checked as recording rules.
    let rules: Vec<Value> = dashboard_targets()
        .iter()
        .enumerate()
        .map(|(i, (_, expr))| serde_json::json!({"record": format!("swiftlet:dashboard_target_{i}"), "expr": expr}))
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let doc = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    std::fs::write(tmp.path().join("dashboard.rules.json"), doc.to_string()).unwrap();
    promtool_ok(&["check", "rules", "dashboard.rules.json"], tmp.path());
}

/// Prometheus scraping the agent's /metrics and /metrics/cadvisor as
/// kube-prometheus's ServiceMonitor does (job `kubelet`), with the rules.
fn prometheus(dir: &Path, ca: &TestCa, agent: &RunningAgent) -> Prometheus {
    let (cert, key) = ca.client_pem("prometheus", &[]);
    std::fs::write(dir.join("prom.crt"), cert).unwrap();
    std::fs::write(dir.join("prom.key"), key).unwrap();
    let job = |name: &str, path: &str| {
        format!(
            "  - job_name: {name}\n    scheme: https\n    metrics_path: {path}\n    honor_labels: true\n\
             \x20   tls_config: {{insecure_skip_verify: true, cert_file: {crt}, key_file: {key}}}\n\
             \x20   static_configs: [{{targets: [\"127.0.0.1:{port}\"]}}]\n\
             \x20   relabel_configs:\n      - {{target_label: job, replacement: kubelet}}\n\
             \x20     - {{source_labels: [__metrics_path__], target_label: metrics_path}}\n",
            crt = dir.join("prom.crt").display(),
            key = dir.join("prom.key").display(),
            port = agent.port,
        )
    };
    let config = format!(
        "global: {{scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}}\nrule_files: [{}]\n\
         scrape_configs:\n{}{}",
        rules_file().display(),
        job("kubelet-metrics", "/metrics"),
        job("kubelet-cadvisor", "/metrics/cadvisor"),
    );
    Prometheus::start(dir, &config)
}

/// The alerts pending or firing, by name.
fn alerts(prom: &Prometheus) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = prom
        .query("ALERTS")
        .unwrap_or_default()
        .iter()
        .filter_map(|s| {
            let m = &s["metric"];
            Some((m["alertname"].as_str()?.to_owned(), m["alertstate"].as_str()?.to_owned()))
        })
        .collect();
    out.sort();
    out
}

/// Waits until `alert` is pending or firing, then checks nothing else is.
fn expect_only_alert(prom: &Prometheus, agent: &RunningAgent, alert: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = alerts(prom);
        if now.iter().any(|(name, _)| name == alert) {
            let others: Vec<_> = now.iter().filter(|(name, _)| name != alert).collect();
            assert!(others.is_empty(), "only {alert} should be active, got {now:?}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{alert} did not fire within 60s (active: {now:?}); up: {:?}; swiftlet's series: {:?}\nPrometheus log:\n{}\nagent log:\n{}",
            prom.query("up"),
            prom.query(r#"{__name__=~"swiftlet_(signal_source|eviction_crossing_to_kill_seconds_count|kernel_plan_outcomes_total)"}"#),
            prom.log_text(),
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn scrape_flags(dir: &Path, ca: &TestCa) -> Vec<String> {
    ca.write(&dir.join("ca.crt"));
    vec![format!("--client-ca-file={}", dir.join("ca.crt").display()), "--authorization-mode=AlwaysAllow".into()]
}

#[test]
fn the_kernel_programs_not_loaded_fire_their_alert() {
    prereq::require_root();
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("alerts-client-ca");
    let agent = RunningAgent::start(&[scrape_flags(dir.path(), &ca), vec!["--signal-source=cgroupfs".into()]].concat());
    let prom = prometheus(dir.path(), &ca, &agent);
    expect_only_alert(&prom, &agent, "SwiftletKernelProgramsNotLoaded");
}

/// A Burstable pod that stays, under its request: a pod the dashboard
/// shows beside its line.
fn steady() -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: alerts-steady\nspec:\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 2\n  containers:\n  - name: steady\n    image: {BUSYBOX}\n    \
         command: [\"sleep\", \"3600\"]\n    resources:\n      requests: {{memory: 64Mi}}\n"
    )
}

/// A BestEffort pod that takes 900 MiB, 32 MiB at a time.
fn hog() -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: alerts-hog\nspec:\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 2\n  containers:\n  - name: hog\n    image: {BUSYBOX}\n    \
         command: [\"awk\", \"BEGIN {{ for (n = 1; n <= 900; n++) {{ a[n] = sprintf(\\\"%1048576s\\\", \\\"\\\"); \
         if (n % 32 == 0) system(\\\"sleep 0.25\\\") }} system(\\\"sleep 3600\\\") }}\"]\n"
    )
}

#[test]
fn a_crossing_left_to_the_agent_fires_the_fallback_alert_and_fills_the_dashboard() {
    prereq::require_root();
    let _ = cri::endpoint();
    const PODS_MIB: u64 = 1024;
    let total_mib = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .expect("MemTotal")
        / 1024;
    assert!(total_mib > 2 * PODS_MIB, "this test needs more than {} MiB of memory", 2 * PODS_MIB);
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    let ca = TestCa::new("alerts-client-ca");
    // The pods limited to 1 GiB, evicted when they use half of it; the
    // kernel programs loaded but told not to kill, so the agent does.
    let flags = [
        scrape_flags(dir.path(), &ca),
        vec![
            "--signal-source=ebpf".into(),
            "--kernel-eviction=false".into(),
            "--evict-static-pods".into(),
            format!("--pod-manifest-path={}", manifests.display()),
            "--enforce-node-allocatable=pods".into(),
            format!("--system-reserved=memory={}Mi", total_mib - PODS_MIB),
            "--eviction-hard=memory.available<512Mi".into(),
            "--eviction-pressure-transition-period=5s".into(),
        ],
    ]
    .concat();
    let agent = RunningAgent::start(&flags);
    let prom = prometheus(dir.path(), &ca, &agent);
    std::fs::write(manifests.join("steady.yaml"), steady()).unwrap();
    std::fs::write(manifests.join("hog.yaml"), hog()).unwrap();
    expect_only_alert(&prom, &agent, "SwiftletEvictionFellBackToAgent");

    // Every dashboard target over the kubelet's endpoints has data (a
    // series born at the eviction needs two scrapes for a rate); the pods'
    // requests come from kube-state-metrics, which is not here.
    const FROM_KUBE_STATE_METRICS: &str = "kube_pod_container_resource_requests";
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut empty = vec![];
        for (title, expr) in dashboard_targets() {
            let got = prom.query(&expr).unwrap_or_default();
            match (expr.contains(FROM_KUBE_STATE_METRICS), got.is_empty()) {
                (false, true) => empty.push(format!("{title}: {expr}")),
                (true, false) => panic!("{title}: {expr} has data without kube-state-metrics: {got:?}"),
                _ => {}
            }
        }
        if empty.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "dashboard targets without data after an eviction:\n{}", empty.join("\n"));
        std::thread::sleep(Duration::from_secs(1));
    }
}
