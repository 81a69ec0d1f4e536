//! The container runtime over CRI (`runtime.v1`): two small traits, the
//! RuntimeService and the ImageService, that the pod workers, the image
//! manager, garbage collection and node status call; a tonic client over
//! the runtime's unix socket (`client`); and the label and annotation keys
//! the kubelet puts on what it creates (`labels`).
//!
//! The traits take and return the generated CRI types (`api`) so nothing
//! is lost in translation; they exist so the logic above them runs against
//! containerd in integration tests and against an in-memory runtime in unit
//! tests.

pub mod client;
pub mod error;
/// The in-memory runtime for tests: compiled into unit tests and, through
/// the `test-util` feature, into the integration tests and benches, never
/// into the product binary.
#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub mod labels;
pub mod runtime_config;

use std::time::Duration;

use async_trait::async_trait;
pub use client::CriClient;
pub use error::CriError;
pub use k8s_cri::v1 as api;

pub type Result<T> = std::result::Result<T, CriError>;

/// A sandbox or container as a relist sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Listed {
    pub id: String,
    /// `PodSandboxState` or `ContainerState`.
    pub state: i32,
    /// The pod it belongs to, from its labels; None when swiftlet did not
    /// make it.
    pub pod: Option<labels::PodIdentity>,
}

/// The RuntimeService calls the kubelet makes.
#[async_trait]
pub trait RuntimeService: Send + Sync {
    async fn version(&self) -> Result<api::VersionResponse>;
    /// The runtime's conditions (RuntimeReady, NetworkReady).
    async fn status(&self) -> Result<api::StatusResponse>;
    /// The runtime's own configuration (its cgroup driver). The default is
    /// a runtime without the call, as containerd before 2.0.
    async fn runtime_config(&self) -> Result<api::RuntimeConfigResponse> {
        Err(CriError::Status {
            call: "RuntimeConfig",
            code: tonic::Code::Unimplemented,
            message: "the runtime does not implement RuntimeConfig".into(),
        })
    }

    /// Returns the new sandbox's id.
    async fn run_pod_sandbox(&self, config: api::PodSandboxConfig, runtime_handler: &str) -> Result<String>;
    async fn stop_pod_sandbox(&self, sandbox_id: &str) -> Result<()>;
    async fn remove_pod_sandbox(&self, sandbox_id: &str) -> Result<()>;
    async fn pod_sandbox_status(&self, sandbox_id: &str) -> Result<api::PodSandboxStatus>;
    async fn list_pod_sandbox(&self, filter: Option<api::PodSandboxFilter>) -> Result<Vec<api::PodSandbox>>;

    /// Returns the new container's id.
    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
    ) -> Result<String>;
    async fn start_container(&self, container_id: &str) -> Result<()>;
    /// Stops with `timeout` of grace between SIGTERM (or the image's stop
    /// signal) and SIGKILL.
    async fn stop_container(&self, container_id: &str, timeout: Duration) -> Result<()>;
    async fn remove_container(&self, container_id: &str) -> Result<()>;
    async fn list_containers(&self, filter: Option<api::ContainerFilter>) -> Result<Vec<api::Container>>;
    /// The id, state and pod of the sandboxes and of the containers the
    /// filters select: all a relist needs. The default lists them in full;
    /// the gRPC client decodes only these fields, since the relist runs
    /// every second and annotations are most of a listing.
    async fn list_states(
        &self,
        sandboxes: Option<api::PodSandboxFilter>,
        containers: Option<api::ContainerFilter>,
    ) -> Result<(Vec<Listed>, Vec<Listed>)> {
        let s = self.list_pod_sandbox(sandboxes).await?;
        let c = self.list_containers(containers).await?;
        Ok((
            s.into_iter().map(|s| Listed { pod: labels::identity(&s.labels), id: s.id, state: s.state }).collect(),
            c.into_iter().map(|c| Listed { pod: labels::identity(&c.labels), id: c.id, state: c.state }).collect(),
        ))
    }
    async fn container_status(&self, container_id: &str) -> Result<api::ContainerStatus>;
    /// Changes a running container's cgroup limits (in-place resize). The
    /// default is a runtime that cannot.
    async fn update_container_resources(
        &self,
        _container_id: &str,
        _resources: api::LinuxContainerResources,
    ) -> Result<()> {
        Err(CriError::Status {
            call: "UpdateContainerResources",
            code: tonic::Code::Unimplemented,
            message: "the runtime cannot update container resources".into(),
        })
    }
    /// Runs `cmd` in the container and waits at most `timeout`.
    async fn exec_sync(&self, container_id: &str, cmd: Vec<String>, timeout: Duration)
    -> Result<api::ExecSyncResponse>;
    /// Asks the runtime to reopen the container's log file (after rotation).
    async fn reopen_container_log(&self, container_id: &str) -> Result<()>;
    async fn list_container_stats(&self, filter: Option<api::ContainerStatsFilter>)
    -> Result<Vec<api::ContainerStats>>;
}

/// The ImageService calls the kubelet makes.
#[async_trait]
pub trait ImageService: Send + Sync {
    async fn list_images(&self) -> Result<Vec<api::Image>>;
    /// None when the image is not present.
    async fn image_status(&self, image: &str) -> Result<Option<api::Image>>;
    /// Pulls `image` with `auth` (the registry credentials, if any);
    /// returns the image reference (its id) the runtime gives.
    async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        sandbox_config: Option<api::PodSandboxConfig>,
    ) -> Result<String>;
    async fn remove_image(&self, image: &str) -> Result<()>;
    async fn image_fs_info(&self) -> Result<Vec<api::FilesystemUsage>>;
    /// ImageFsInfo in full: the image filesystems and, where the runtime
    /// keeps containers' writable layers apart from images, the container
    /// filesystems (empty otherwise, as containerd 1.6 and 2.1 answer). The
    /// default is a runtime that does not split them.
    async fn filesystems(&self) -> Result<api::ImageFsInfoResponse> {
        Ok(api::ImageFsInfoResponse { image_filesystems: self.image_fs_info().await?, container_filesystems: vec![] })
    }
}

/// The CRI sandbox and container states, readable.
pub fn sandbox_ready(state: i32) -> bool {
    state == api::PodSandboxState::SandboxReady as i32
}

pub fn container_state(state: i32) -> api::ContainerState {
    api::ContainerState::try_from(state).unwrap_or(api::ContainerState::ContainerUnknown)
}

/// The streaming calls (the kubelet's GetExec, GetAttach, GetPortForward):
/// each asks the runtime to prepare a session and returns the URL of its
/// stream server, which the kubelet API then speaks to.
#[async_trait]
pub trait StreamingRuntime: Send + Sync {
    async fn exec(&self, req: api::ExecRequest) -> Result<String>;
    async fn attach(&self, req: api::AttachRequest) -> Result<String>;
    async fn port_forward(&self, sandbox_id: &str, ports: Vec<i32>) -> Result<String>;
    /// The host PID of the container's first process (from the runtime's
    /// verbose status), None when it reports none.
    async fn container_pid(&self, container_id: &str) -> Result<Option<u32>>;
}

/// The PID in a verbose ContainerStatus' `info` (containerd's layout:
/// `{"info": "{\"pid\": 1234, ...}"}`).
pub fn pid_from_verbose_info(info: &std::collections::HashMap<String, String>) -> Option<u32> {
    let v: serde_json::Value = serde_json::from_str(info.get("info")?).ok()?;
    v.get("pid")?.as_u64().and_then(|p| u32::try_from(p).ok()).filter(|p| *p > 0)
}
