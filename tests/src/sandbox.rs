//! Sandboxes and containers made directly through the CRI client on the
//! test containerd (`SWIFTLET_TEST_CRI_ENDPOINT`, started by `cargo xtask
//! test`): host-network sandboxes with their cgroups under a test cgroup
//! tree, labelled as swiftlet labels what it creates, stopped and removed
//! on drop.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use swiftlet::cri::{
    CriClient, RuntimeService,
    api::{self, ContainerState},
    labels::{self, PodIdentity},
};

use crate::cgroup::TestCgroup;

/// The images `cargo xtask test` imports (xtask/src/images.rs).
pub const PAUSE_IMAGE: &str = "swiftlet.local/pause:3.9";
pub const BUSYBOX_IMAGE: &str = "swiftlet.local/busybox:1.35";

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The test containerd's endpoint; fails with what to do when unset.
pub fn endpoint() -> String {
    std::env::var("SWIFTLET_TEST_CRI_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "SWIFTLET_TEST_CRI_ENDPOINT is not set: this test needs the project-local containerd that `cargo xtask test` starts"
        )
    })
}

/// A CRI client on the test containerd; panics if it does not answer.
pub async fn client() -> Arc<CriClient> {
    crate::prereq::require_root();
    let ep = endpoint();
    let c = CriClient::new(&ep, Duration::from_secs(60)).unwrap_or_else(|e| panic!("bad endpoint {ep}: {e}"));
    if let Err(e) = c.version().await {
        panic!("the test containerd at {ep} does not answer: {e}");
    }
    Arc::new(c)
}

/// A running host-network sandbox; stopped and removed (with its
/// containers) on drop.
pub struct TestPod {
    pub cri: Arc<CriClient>,
    pub id: String,
    pub identity: PodIdentity,
    pub config: api::PodSandboxConfig,
    /// The sandbox's log directory (`<logs root>/<ns>_<name>_<uid>`).
    pub log_dir: PathBuf,
}

/// Options for [`TestPod::start`].
pub struct PodOptions<'a> {
    pub name: &'a str,
    /// The pod logs root (the kubelet's /var/log/pods).
    pub logs_root: &'a Path,
    /// Its cgroups go below this test cgroup.
    pub cgroup: &'a TestCgroup,
    /// Without swiftlet's labels (something else's sandbox).
    pub foreign: bool,
}

impl TestPod {
    pub async fn start(cri: Arc<CriClient>, o: PodOptions<'_>) -> TestPod {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let uid = format!("{}-{}-{n}", o.name, std::process::id());
        let identity = PodIdentity { uid: uid.clone(), namespace: "swiftlet-test".into(), name: o.name.into() };
        let log_dir = o.logs_root.join(format!("{}_{}_{}", identity.namespace, identity.name, uid));
        std::fs::create_dir_all(&log_dir).unwrap_or_else(|e| panic!("{}: {e}", log_dir.display()));
        let mut sandbox_labels = labels::sandbox_labels(&identity, &Default::default());
        if o.foreign {
            sandbox_labels.remove(labels::MANAGED_BY);
        }
        let config = api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: identity.name.clone(),
                uid: uid.clone(),
                namespace: identity.namespace.clone(),
                attempt: 0,
            }),
            // No hostname: a host-network sandbox shares the node's UTS
            // namespace (runc refuses to set one), as the kubelet leaves it.
            log_directory: log_dir.display().to_string(),
            labels: sandbox_labels,
            linux: Some(api::LinuxPodSandboxConfig {
                cgroup_parent: format!("/{}/pod{uid}", o.cgroup.root),
                security_context: Some(api::LinuxSandboxSecurityContext {
                    namespace_options: Some(api::NamespaceOption {
                        network: api::NamespaceMode::Node as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let id = cri
            .run_pod_sandbox(config.clone(), "")
            .await
            .unwrap_or_else(|e| panic!("RunPodSandbox {}: {e}", identity.name));
        TestPod { cri, id, identity, config, log_dir }
    }

    /// Creates (and starts, if `start`) container `name` running `sh -c
    /// script` in busybox; its log is `<log dir>/<name>/<attempt>.log`.
    pub async fn container(&self, name: &str, attempt: u32, script: &str, start: bool) -> String {
        std::fs::create_dir_all(self.log_dir.join(name)).unwrap();
        let mut container_labels = labels::container_labels(&self.identity, name);
        if !self.config.labels.contains_key(labels::MANAGED_BY) {
            container_labels.remove(labels::MANAGED_BY);
        }
        let config = api::ContainerConfig {
            metadata: Some(api::ContainerMetadata { name: name.into(), attempt }),
            image: Some(api::ImageSpec { image: BUSYBOX_IMAGE.into(), ..Default::default() }),
            command: vec!["sh".into(), "-c".into(), script.into()],
            log_path: format!("{name}/{attempt}.log"),
            labels: container_labels,
            ..Default::default()
        };
        let id = self
            .cri
            .create_container(&self.id, config, self.config.clone())
            .await
            .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}"));
        if start {
            self.cri.start_container(&id).await.unwrap_or_else(|e| panic!("StartContainer {name}: {e}"));
        }
        id
    }

    /// Waits until container `id` has exited; returns its status.
    pub async fn wait_exited(&self, id: &str, timeout: Duration) -> api::ContainerStatus {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.cri.container_status(id).await.unwrap_or_else(|e| panic!("ContainerStatus {id}: {e}"));
            if s.state == ContainerState::ContainerExited as i32 {
                return s;
            }
            assert!(Instant::now() < deadline, "container {id} still {:?} after {timeout:?}", s.state);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Stops and removes a sandbox from a fresh thread and client, so it works
/// from any Drop (inside or outside a runtime, during a panic).
pub fn remove_sandbox_blocking(sandbox_id: &str) {
    let id = sandbox_id.to_owned();
    let Ok(ep) = std::env::var("SWIFTLET_TEST_CRI_ENDPOINT") else { return };
    let t = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
        rt.block_on(async move {
            let Ok(c) = CriClient::new(&ep, Duration::from_secs(60)) else { return };
            if let Err(e) = c.stop_pod_sandbox(&id).await
                && !e.is_not_found()
            {
                eprintln!("warning: cannot stop test sandbox {id}: {e}");
            }
            if let Err(e) = c.remove_pod_sandbox(&id).await
                && !e.is_not_found()
            {
                eprintln!("warning: cannot remove test sandbox {id}: {e}");
            }
        });
    });
    let _ = t.join();
}

impl Drop for TestPod {
    fn drop(&mut self) {
        remove_sandbox_blocking(&self.id);
    }
}

/// Removes images (by id or name) on drop, from a fresh thread and client.
pub struct ImageGuard(pub Vec<String>);

impl Drop for ImageGuard {
    fn drop(&mut self) {
        let images = std::mem::take(&mut self.0);
        let Ok(ep) = std::env::var("SWIFTLET_TEST_CRI_ENDPOINT") else { return };
        let t = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
            rt.block_on(async move {
                use swiftlet::cri::ImageService;
                let Ok(c) = CriClient::new(&ep, Duration::from_secs(60)) else { return };
                for i in images {
                    if let Err(e) = c.remove_image(&i).await {
                        eprintln!("warning: cannot remove test image {i}: {e}");
                    }
                }
            });
        });
        let _ = t.join();
    }
}
