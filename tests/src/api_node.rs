//! The real swiftlet binary as a Ready node of a TLS fake API server, with
//! kubectl 1.32 as the cluster's admin: for the tests that drive pods
//! through the API (status subresources, resize, RuntimeClasses).

use std::{path::PathBuf, time::Duration};

use serde_json::{Value, json};

use crate::{
    apiserver::{
        Credentials, FakeApiServer, Options,
        resources::{NODES, PODS},
    },
    e2e::wait,
    kubectl::Kubectl,
    node_process::{NodeProcess, PodCleanup},
    prereq,
};

pub struct ApiNode {
    pub server: FakeApiServer,
    pub kubectl: Kubectl,
    pub node: NodeProcess,
    /// The node's name (`swl-<tag>-<pid>`).
    pub name: String,
}

/// A condition of an object's status, by type.
pub fn condition<'a>(obj: &'a Value, t: &str) -> Option<&'a Value> {
    obj.pointer("/status/conditions")?.as_array()?.iter().find(|c| c["type"] == t)
}

impl ApiNode {
    /// Starts the server and the node with `node_config` (a
    /// KubeletConfiguration) and waits up to a minute for it to be Ready.
    pub fn start(tag: &str, node_config: &str) -> ApiNode {
        prereq::require_root();
        let name = format!("swl-{tag}-{}", std::process::id());
        let server = FakeApiServer::start(Options { tls: true, ..Default::default() }).unwrap();
        let node_kubeconfig = server.dir().join("kubelet.kubeconfig");
        let (cert, key) = server.client_cert(&format!("system:node:{name}"), &["system:nodes"]).unwrap();
        server.write_kubeconfig(&node_kubeconfig, &Credentials::ClientCert { cert, key }).unwrap();
        let admin = server.dir().join("admin.kubeconfig");
        let (cert, key) = server.client_cert("admin", &["system:masters"]).unwrap();
        server.write_kubeconfig(&admin, &Credentials::ClientCert { cert, key }).unwrap();
        let mut kubectl = Kubectl::new(&admin);
        // `--subresource` (status, resize) needs kubectl 1.32.
        kubectl.bin = PathBuf::from("/usr/bin/kubectl");
        assert!(kubectl.bin.exists(), "kubectl 1.32 is expected at /usr/bin/kubectl");
        let extra = vec![format!("--kubeconfig={}", node_kubeconfig.display()), format!("--hostname-override={name}")];
        let mut node = NodeProcess::start(Some(node_config), &extra);
        wait("the node to be Ready", Duration::from_secs(60), || {
            node.assert_running();
            server.get(&NODES, "", &name).filter(|n| condition(n, "Ready").is_some_and(|c| c["status"] == "True"))
        });
        ApiNode { server, kubectl, node, name }
    }

    /// Creates a hostNetwork pod of `spec` bound to this node in
    /// `default`, tracked by `cleanup`; returns its uid.
    pub fn create_pod(&self, cleanup: &PodCleanup, name: &str, spec: Value, grace_seconds: i64) -> String {
        let mut pod = json!({"metadata": {"name": name}, "spec": spec});
        pod["spec"]["nodeName"] = self.name.clone().into();
        pod["spec"]["hostNetwork"] = true.into();
        pod["spec"]["terminationGracePeriodSeconds"] = grace_seconds.into();
        crate::apiserver::defaults::pod(&mut pod);
        let created = self.server.store().create(&PODS, "default", pod).unwrap();
        let uid = created["metadata"]["uid"].as_str().unwrap().to_owned();
        cleanup.track(&uid);
        uid
    }
}
