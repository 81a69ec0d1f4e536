//! Eviction tests in the shape of the kubelet's node e2e eviction tests
//! (`test/e2e_node/eviction_test.go`): the real binary as a node of the
//! fake API server, API pods each with an *eviction priority* (higher goes
//! first, 0 never), and one runner that checks what upstream's
//! `runEvictionTest` checks:
//!
//! 1. the node reports the expected pressure condition;
//! 2. pods are evicted in order: no pod fails while a pod of higher
//!    eviction priority still runs, and pods of priority 0 never fail;
//! 3. each evicted pod is Failed with reason Evicted and carries a
//!    `DisruptionTarget` condition with reason `TerminationByKubelet`;
//! 4. there is exactly one Evicted event per evicted pod, annotated with
//!    the starved resource (and, for memory, the offending container and
//!    a usage above its request);
//! 5. while the condition holds, a new BestEffort pod is refused (reason
//!    Evicted, "The node had condition: [...]");
//! 6. once the pods are gone, the condition clears after the transition
//!    period;
//! 7. a new pod is admitted and runs.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{
    apiserver::{
        Credentials, FakeApiServer, Options,
        resources::{EVENTS, NODES, PODS},
        store::DeleteOptions,
    },
    node_process::{NodeProcess, PodCleanup},
};

pub const BUSYBOX: &str = "swiftlet.local/busybox:1.35";
/// The BestEffort pod created while the node reports pressure: refused.
const ADMISSION_PROBE: &str = "admission-probe";
pub const NAMESPACE: &str = "default";
pub const MI: u64 = 1 << 20;

/// A fake API server and the real swiftlet as its node.
pub struct E2eNode {
    pub server: FakeApiServer,
    pub name: String,
    pub agent: NodeProcess,
    /// Pods on the shared containerd, removed when the test ends (None
    /// when the test runs a containerd of its own, which goes with them).
    cleanup: Option<PodCleanup>,
}

/// What a test expects of the node: the pressure condition it reports and
/// the resource its evictions name (None for evictions without node
/// pressure: local storage limits).
#[derive(Clone, Copy, Debug)]
pub struct Expect {
    pub condition: Option<&'static str>,
    pub starved_resource: Option<&'static str>,
}

/// One pod of a test: its name, its eviction priority (higher goes first,
/// 0 never goes), and its manifest.
pub struct EvictSpec {
    pub name: &'static str,
    pub eviction_priority: u8,
    pub pod: Value,
}

pub fn wait<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl E2eNode {
    /// Starts the node with `config` (the body of a KubeletConfiguration)
    /// and `extra` flags; on the shared containerd unless `extra` names
    /// another endpoint. Returns once the node is Ready.
    pub fn start(tag: &str, config: &str, extra: &[String]) -> E2eNode {
        crate::prereq::require_root();
        let name = format!("e2e-{tag}-{}", std::process::id());
        let server = FakeApiServer::start(Options { tls: true, ..Options::default() }).expect("the fake API server");
        let kubeconfig = server.dir().join("kubelet.kubeconfig");
        let (cert, key) =
            server.client_cert(&format!("system:node:{name}"), &["system:nodes"]).expect("a node certificate");
        server.write_kubeconfig(&kubeconfig, &Credentials::ClientCert { cert, key }).expect("the node's kubeconfig");
        let own_runtime = extra.iter().any(|a| a.starts_with("--container-runtime-endpoint="));
        let mut args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--hostname-override={name}"),
            // Pod status reaches the API server as it changes.
            "--housekeeping-interval=2s".into(),
        ];
        args.extend(extra.iter().cloned());
        // As AgentSetup: on this shared, often full disk only memory evicts
        // unless a test is about the disk; disk pressure's reclaim would
        // delete the locally built test images, never to be pulled again.
        let defaults = if config.contains("evictionHard") { "" } else { "evictionHard:\n  memory.available: 100Mi\n" };
        let yaml = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nnodeStatusUpdateFrequency: 1s\n\
             nodeStatusReportFrequency: 10s\n{defaults}{config}"
        );
        let mut agent = NodeProcess::start(Some(&yaml), &args);
        wait("the node to be Ready", Duration::from_secs(60), || {
            agent.assert_running();
            let n = server.get(&NODES, "", &name)?;
            (condition(&n, "Ready") == Some(true)).then_some(())
        });
        E2eNode { server, name, agent, cleanup: (!own_runtime).then(PodCleanup::new) }
    }

    /// Creates an API pod on this node from `spec` (its `spec`, with a name).
    pub fn create(&self, name: &str, spec: &Value) -> String {
        let mut p = json!({"metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec});
        p["spec"]["nodeName"] = self.name.clone().into();
        crate::apiserver::defaults::pod(&mut p);
        let created = self.server.store().create(&PODS, NAMESPACE, p).expect("the pod is created");
        let uid = created["metadata"]["uid"].as_str().expect("uid").to_owned();
        if let Some(c) = &self.cleanup {
            c.track(&uid);
        }
        uid
    }

    pub fn pod(&self, name: &str) -> Option<Value> {
        self.server.get(&PODS, NAMESPACE, name)
    }

    pub fn phase(&self, name: &str) -> Option<String> {
        self.pod(name).and_then(|p| p["status"]["phase"].as_str().map(str::to_owned))
    }

    /// Whether the node reports condition `t` as True (None: not reported).
    pub fn node_condition(&self, t: &str) -> Option<bool> {
        self.server.get(&NODES, "", &self.name).and_then(|n| condition(&n, t))
    }

    /// Events about pod `name` with `reason`.
    pub fn events(&self, name: &str, reason: &str) -> Vec<Value> {
        self.server
            .list(&EVENTS, Some(NAMESPACE))
            .into_iter()
            .filter(|e| e["involvedObject"]["name"] == name && e["reason"] == reason)
            .collect()
    }

    pub fn delete(&self, name: &str) {
        let _ = self.server.store().delete(&PODS, NAMESPACE, name, &DeleteOptions::default());
    }

    /// Waits for every pod named to be Running.
    pub fn wait_running(&mut self, names: &[&str], timeout: Duration) {
        for name in names {
            wait(&format!("{name} Running"), timeout, || {
                self.agent.assert_running();
                (self.phase(name).as_deref() == Some("Running")).then_some(())
            });
        }
    }

    /// The runner: starts `specs`, then `pressure` (whatever makes the node
    /// short, once the pods run), and checks what the kubelet's own tests
    /// check (see the module doc); `relief` runs once the evictions are
    /// done (a line set for the test taken away). `within` bounds the wait
    /// for the evictions; the transition period is `transition`.
    pub fn run_eviction_test(
        &mut self,
        specs: &[EvictSpec],
        expect: Expect,
        within: Duration,
        transition: Duration,
        pressure: impl FnOnce(&mut E2eNode),
        relief: impl FnOnce(&mut E2eNode),
    ) {
        for s in specs {
            self.create(s.name, &s.pod);
        }
        let names: Vec<&str> = specs.iter().map(|s| s.name).collect();
        self.wait_running(&names, Duration::from_secs(90));
        pressure(self);

        let mut saw_condition = false;
        let deadline = Instant::now() + within;
        loop {
            self.agent.assert_running();
            if let Some(c) = expect.condition
                && !saw_condition
                && self.node_condition(c) == Some(true)
            {
                saw_condition = true;
                // While the condition holds, a BestEffort pod is refused
                // (under any pressure: the kubelet's eviction admit handler).
                self.create(ADMISSION_PROBE, &sleeper("probe"));
            }
            let failed: Vec<(&EvictSpec, bool)> =
                specs.iter().map(|s| (s, self.phase(s.name).as_deref() == Some("Failed"))).collect();
            for (s, f) in &failed {
                if !f {
                    continue;
                }
                assert_ne!(s.eviction_priority, 0, "{} must never be evicted: {:#}", s.name, self.pod(s.name).unwrap());
                for (other, other_failed) in &failed {
                    assert!(
                        *other_failed || other.eviction_priority <= s.eviction_priority,
                        "{} was evicted while {} (eviction priority {} > {}) still runs",
                        s.name,
                        other.name,
                        other.eviction_priority,
                        s.eviction_priority
                    );
                }
            }
            if failed.iter().all(|(s, f)| *f == (s.eviction_priority > 0)) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "not every pod with an eviction priority was evicted within {within:?}: {:?}",
                failed.iter().map(|(s, f)| (s.name, *f)).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        if let Some(c) = expect.condition {
            assert!(saw_condition, "the node never reported {c}");
            let refused = wait("the admission probe refused", Duration::from_secs(30), || {
                let p = self.pod(ADMISSION_PROBE)?;
                (p["status"]["phase"] == "Failed").then_some(p)
            });
            assert_eq!(refused["status"]["reason"], "Evicted", "{:#}", refused["status"]);
            let message = refused["status"]["message"].as_str().unwrap_or_default();
            assert!(message.starts_with("The node had condition: ["), "{message}");
            assert!(message.contains(c), "the refusal names {c}: {message}");
            self.delete(ADMISSION_PROBE);
        }
        relief(self);

        for s in specs.iter().filter(|s| s.eviction_priority > 0) {
            let p = self.pod(s.name).expect("the evicted pod is still listed");
            assert_eq!(p["status"]["reason"], "Evicted", "{}: {:#}", s.name, p["status"]);
            let disruption = p["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "DisruptionTarget").cloned());
            let disruption = disruption.unwrap_or_else(|| panic!("{}: no DisruptionTarget condition", s.name));
            assert_eq!(
                (disruption["status"].as_str(), disruption["reason"].as_str()),
                (Some("True"), Some("TerminationByKubelet")),
                "{}",
                s.name
            );
            // The status manager and the event recorder write on their own
            // schedules: give the event a moment.
            let events = wait(&format!("the Evicted event of {}", s.name), Duration::from_secs(10), || {
                let e = self.events(s.name, "Evicted");
                (!e.is_empty()).then_some(e)
            });
            std::thread::sleep(Duration::from_secs(1));
            let events = if events.len() == 1 { self.events(s.name, "Evicted") } else { events };
            assert_eq!(events.len(), 1, "one Evicted event for {}: {events:#?}", s.name);
            assert_eq!(events[0]["count"], 1, "{}: {:#}", s.name, events[0]);
            let annotations = &events[0]["metadata"]["annotations"];
            if let Some(resource) = expect.starved_resource {
                assert_eq!(annotations["starved_resource"], resource, "{}: {:#}", s.name, events[0]);
                if resource == "memory" {
                    let container = &s.pod["containers"][0];
                    assert_eq!(annotations["offending_containers"], container["name"], "{}", s.name);
                    let usage = annotations["offending_containers_usage"].as_str().unwrap_or_default();
                    let usage = swiftlet::quantity::Quantity::parse(usage)
                        .unwrap_or_else(|e| panic!("{}: usage {usage:?}: {e}", s.name))
                        .value();
                    let request = container["resources"]["requests"]["memory"]
                        .as_str()
                        .map_or(0, |q| swiftlet::quantity::Quantity::parse(q).unwrap().value());
                    assert!(usage > request, "{}: usage {usage} above the request {request}", s.name);
                }
            }
        }

        // The pressure goes with the pods; the condition follows after the
        // transition period.
        for s in specs {
            self.delete(s.name);
        }
        if let Some(c) = expect.condition {
            wait(&format!("{c} cleared"), transition + Duration::from_secs(30), || {
                (self.node_condition(c) == Some(false)).then_some(())
            });
        }
        // And a new pod is admitted and runs.
        self.create("after", &sleeper("after"));
        self.wait_running(&["after"], Duration::from_secs(60));
        self.delete("after");
    }
}

/// A node condition's status, as a bool.
pub fn condition(node: &Value, t: &str) -> Option<bool> {
    let c = node.pointer("/status/conditions")?.as_array()?.iter().find(|c| c["type"] == t)?;
    Some(c["status"] == "True")
}

/// A BestEffort pod that sleeps (upstream's innocent pod).
pub fn sleeper(container: &str) -> Value {
    json!({
        "hostNetwork": true,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": container, "image": BUSYBOX, "command": ["sleep", "3600"]}],
    })
}

/// A pod whose one container runs `script` with sh.
pub fn shell(container: &str, script: &str) -> Value {
    json!({
        "hostNetwork": true,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": container, "image": BUSYBOX, "command": ["sh", "-c", script]}],
    })
}

/// A pod that waits 3 s (to be seen Running), then grows its memory by
/// `step_mib` MiB every `every` seconds up to `max_mib` (awk holding
/// strings), and holds it.
pub fn memory_hog(container: &str, step_mib: u32, every: f32, max_mib: u32) -> Value {
    let script = format!(
        "sleep 3; exec awk 'BEGIN {{ for (n = 1; n <= {max_mib}; n++) {{ a[n] = sprintf(\"%1048576s\", \"\"); \
         if (n % {step_mib} == 0) system(\"sleep {every}\") }} system(\"sleep 3600\") }}'"
    );
    shell(container, &script)
}
