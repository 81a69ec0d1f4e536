//! Real pods through the CRI, for tests that need containers: a sandbox
//! (host network, so no CNI is needed) whose cgroup sits under a test
//! cgroup root, and busybox containers with the kubelet's labels and log
//! layout. The matching `Pod` object (spec and a running status) is what
//! an in-memory PodView serves. Everything is stopped and removed on drop.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::{Container, ContainerState, ContainerStateRunning, ContainerStatus, Pod, PodSpec, PodStatus},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};
use swiftlet::{
    cri::{CriClient, RuntimeService, api, labels},
    pods::source::PodView,
};

pub const PAUSE_IMAGE: &str = "swiftlet.local/pause:3.9";
pub const BUSYBOX_IMAGE: &str = "swiftlet.local/busybox:1.35";

/// The test containerd's endpoint, or a panic saying how to get one.
pub fn endpoint() -> String {
    std::env::var("SWIFTLET_TEST_CRI_ENDPOINT").unwrap_or_else(|_| {
        panic!("this test needs a containerd: SWIFTLET_TEST_CRI_ENDPOINT is not set; run it through `cargo xtask test`")
    })
}

pub fn client() -> Arc<CriClient> {
    Arc::new(CriClient::new(&endpoint(), Duration::from_secs(60)).expect("CRI endpoint"))
}

/// Pods served from memory (what the pod manager will provide).
#[derive(Default)]
pub struct StaticPods(pub RwLock<Vec<Pod>>);

impl StaticPods {
    pub fn set(&self, pods: Vec<Pod>) {
        *self.0.write().unwrap() = pods;
    }
}

impl PodView for StaticPods {
    fn pods(&self) -> Vec<Pod> {
        self.0.read().unwrap().clone()
    }
}

/// A running pod.
pub struct TestPod {
    client: Arc<CriClient>,
    pub sandbox_id: String,
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// (container name, container id)
    pub containers: Vec<(String, String)>,
    /// The pod's cgroup relative to the hierarchy root.
    pub cgroup: String,
    pub log_dir: PathBuf,
    pub pod: Pod,
}

impl TestPod {
    /// Starts `name` (namespace default) as a BestEffort pod under
    /// `cgroup_root` with one busybox container per `(name, shell script)`.
    pub async fn start(
        client: Arc<CriClient>,
        cgroup_root: &str,
        logs_dir: &Path,
        name: &str,
        containers: &[(&str, &str)],
    ) -> TestPod {
        let uid = format!("{name}-{}-uid", std::process::id());
        let namespace = "default".to_owned();
        let id = labels::PodIdentity { uid: uid.clone(), namespace: namespace.clone(), name: name.to_owned() };
        let cgroup = format!("{}/kubepods/besteffort/pod{uid}", cgroup_root.trim_matches('/'));
        let log_dir = logs_dir.join(format!("{namespace}_{name}_{uid}"));
        std::fs::create_dir_all(&log_dir).expect("pod log dir");
        let sandbox = api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: name.to_owned(),
                uid: uid.clone(),
                namespace: namespace.clone(),
                attempt: 0,
            }),
            // Host network: the node's hostname (a private UTS namespace is needed to set one).
            log_directory: log_dir.display().to_string(),
            labels: labels::sandbox_labels(&id, &Default::default()),
            linux: Some(api::LinuxPodSandboxConfig {
                cgroup_parent: format!("/{cgroup}"),
                security_context: Some(api::LinuxSandboxSecurityContext {
                    namespace_options: Some(api::NamespaceOption {
                        network: api::NamespaceMode::Node as i32,
                        pid: api::NamespaceMode::Container as i32,
                        ipc: api::NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let sandbox_id = client.run_pod_sandbox(sandbox.clone(), "").await.expect("RunPodSandbox");
        let mut pod = TestPod {
            client: client.clone(),
            sandbox_id: sandbox_id.clone(),
            uid: uid.clone(),
            namespace: namespace.clone(),
            name: name.to_owned(),
            containers: vec![],
            cgroup,
            log_dir: log_dir.clone(),
            pod: Pod::default(),
        };
        for (cname, script) in containers {
            let config = api::ContainerConfig {
                metadata: Some(api::ContainerMetadata { name: (*cname).to_owned(), attempt: 0 }),
                image: Some(api::ImageSpec { image: BUSYBOX_IMAGE.into(), ..Default::default() }),
                command: vec!["sh".into(), "-c".into(), (*script).to_owned()],
                labels: labels::container_labels(&id, cname),
                log_path: format!("{cname}/0.log"),
                ..Default::default()
            };
            let cid = client.create_container(&sandbox_id, config, sandbox.clone()).await.expect("CreateContainer");
            client.start_container(&cid).await.expect("StartContainer");
            pod.containers.push(((*cname).to_owned(), cid));
        }
        pod.pod = pod.object();
        pod
    }

    /// The Pod as the pod manager would report it: running, restartCount 0.
    fn object(&self) -> Pod {
        let now = Time(Timestamp::now());
        Pod {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                uid: Some(self.uid.clone()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: self
                    .containers
                    .iter()
                    .map(|(n, _)| Container {
                        name: n.clone(),
                        image: Some(BUSYBOX_IMAGE.into()),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                qos_class: Some("BestEffort".into()),
                start_time: Some(now.clone()),
                container_statuses: Some(
                    self.containers
                        .iter()
                        .map(|(n, id)| ContainerStatus {
                            name: n.clone(),
                            container_id: Some(format!("containerd://{id}")),
                            image: BUSYBOX_IMAGE.into(),
                            ready: true,
                            restart_count: 0,
                            state: Some(ContainerState {
                                running: Some(ContainerStateRunning { started_at: Some(now.clone()) }),
                                ..Default::default()
                            }),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
        }
    }

    pub fn container_id(&self, name: &str) -> &str {
        &self.containers.iter().find(|(n, _)| n == name).expect("container").1
    }

    /// The container's cgroup (containerd with the cgroupfs driver).
    pub fn container_cgroup(&self, name: &str) -> String {
        format!("{}/{}", self.cgroup, self.container_id(name))
    }

    pub fn labels(&self) -> HashMap<String, String> {
        labels::sandbox_labels(
            &labels::PodIdentity { uid: self.uid.clone(), namespace: self.namespace.clone(), name: self.name.clone() },
            &Default::default(),
        )
    }
}

impl Drop for TestPod {
    fn drop(&mut self) {
        // A client of its own: the test's may be bound to a runtime that
        // is not running any more.
        let endpoint = self.client.endpoint().to_owned();
        let sandbox = self.sandbox_id.clone();
        let containers: Vec<String> = self.containers.iter().map(|(_, id)| id.clone()).collect();
        // Drop may run inside a runtime: clean up on a thread of our own.
        let t = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async {
                let Ok(client) = CriClient::new(&endpoint, Duration::from_secs(60)) else { return };
                for c in &containers {
                    let _ = client.stop_container(c, Duration::ZERO).await;
                    let _ = client.remove_container(c).await;
                }
                if let Err(e) = client.stop_pod_sandbox(&sandbox).await {
                    eprintln!("warning: cannot stop sandbox {sandbox}: {e}");
                }
                if let Err(e) = client.remove_pod_sandbox(&sandbox).await {
                    eprintln!("warning: cannot remove sandbox {sandbox}: {e}");
                }
            });
        });
        let _ = t.join();
    }
}
