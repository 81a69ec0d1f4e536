//! Pod fields that need the API server, with the real binary as a node of
//! the fake one: a readiness gate holds Ready false until its condition is
//! patched true with kubectl (v1.32, `--subresource=status`), and a
//! RuntimeClass whose handler the runtime does not have fails the
//! sandbox with the runtime's error.

use std::time::Duration;

use serde_json::{Value, json};
use swiftlet_tests::{
    api_node::{ApiNode, condition},
    apiserver::resources::{EVENTS, PODS, RUNTIME_CLASSES},
    e2e::wait,
    node_process::PodCleanup,
};

const NODE_CONFIG: &str = "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
nodeStatusUpdateFrequency: 1s
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
";

fn cluster(tag: &str) -> ApiNode {
    ApiNode::start(tag, NODE_CONFIG)
}

fn create_pod(c: &ApiNode, cleanup: &PodCleanup, name: &str, spec: Value) -> String {
    c.create_pod(cleanup, name, spec, 2)
}

fn sleeper() -> Value {
    json!([{"name": "c", "image": "swiftlet.local/busybox:1.35", "command": ["sleep", "3600"]}])
}

#[test]
fn a_readiness_gate_holds_ready_until_its_condition_is_true() {
    let cleanup = PodCleanup::new();
    let mut c = cluster("gate");
    create_pod(
        &c,
        &cleanup,
        "gated",
        json!({"readinessGates": [{"conditionType": "example.com/lb-ready"}], "containers": sleeper()}),
    );
    let pod = wait("Running with its containers ready", Duration::from_secs(60), || {
        c.node.assert_running();
        let p = c.server.get(&PODS, "default", "gated")?;
        (p["status"]["phase"] == "Running" && condition(&p, "ContainersReady")?["status"] == "True").then_some(p)
    });
    let ready = condition(&pod, "Ready").expect("a Ready condition");
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "ReadinessGatesNotReady");
    assert_eq!(
        ready["message"],
        "corresponding condition of pod readiness gate \"example.com/lb-ready\" does not exist."
    );

    let patch = |status: &str| {
        let body = json!({"status": {"conditions": [{"type": "example.com/lb-ready", "status": status}]}}).to_string();
        c.kubectl.ok(&["patch", "pod", "gated", "--subresource=status", "-p", &body]);
    };
    patch("False");
    wait("the gate's status in the message", Duration::from_secs(30), || {
        let p = c.server.get(&PODS, "default", "gated")?;
        (condition(&p, "Ready")?["message"]
            == "the status of pod readiness gate \"example.com/lb-ready\" is not \"True\", but False")
            .then_some(())
    });
    patch("True");
    let p = wait("Ready once the gate is True", Duration::from_secs(30), || {
        let p = c.server.get(&PODS, "default", "gated")?;
        (condition(&p, "Ready")?["status"] == "True").then_some(p)
    });
    assert_eq!(condition(&p, "example.com/lb-ready").unwrap()["status"], "True", "the gate's condition is kept");
    let out = c.kubectl.ok(&["get", "pod", "gated", "-o", "wide"]);
    println!("$ kubectl get pod gated -o wide\n{out}");
    assert!(c.node.stop());
}

#[test]
fn an_unknown_runtime_handler_fails_the_sandbox_with_the_runtimes_error() {
    let cleanup = PodCleanup::new();
    let mut c = cluster("rtclass");
    c.server
        .store()
        .create(&RUNTIME_CLASSES, "", json!({"metadata": {"name": "sandboxed"}, "handler": "no-such-handler"}))
        .unwrap();
    create_pod(&c, &cleanup, "classy", json!({"runtimeClassName": "sandboxed", "containers": sleeper()}));
    let event = wait("a FailedCreatePodSandBox event", Duration::from_secs(60), || {
        c.node.assert_running();
        c.server
            .list(&EVENTS, Some("default"))
            .into_iter()
            .find(|e| e["reason"] == "FailedCreatePodSandBox" && e["involvedObject"]["name"] == "classy")
    });
    let message = event["message"].as_str().unwrap();
    assert!(message.starts_with("Failed to create pod sandbox: "), "{message}");
    assert!(message.contains("no runtime for \"no-such-handler\" is configured"), "the runtime's words: {message}");
    let p = c.server.get(&PODS, "default", "classy").unwrap();
    assert_eq!(p["status"]["phase"], "Pending");
    let waiting = &p["status"]["containerStatuses"][0]["state"]["waiting"];
    assert_eq!(waiting["reason"], "ContainerCreating");
    assert!(waiting["message"].as_str().is_some_and(|m| m.contains("no-such-handler")), "{waiting}");
    assert!(c.node.stop());
}
