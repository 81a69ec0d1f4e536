//! The CRI client: tonic over the runtime's unix socket.
//!
//! Every call is bounded by runtimeRequestTimeout (image pulls by their own,
//! longer bound, as the kubelet's are). The channel connects lazily and
//! reconnects by itself when the socket comes back; while it is gone,
//! dialing backs off exponentially (100 ms doubling to 5 s) so a dead
//! runtime is not hammered by every pod worker at once, and calls in the
//! back-off window fail at once with Unavailable. [`CriClient::health`]
//! tells healthz how long the runtime has been unreachable.

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tonic::transport::{Channel, Endpoint, Uri};

use super::{CriError, ImageService, Listed, Result, RuntimeService, api};

/// kubelet's maxMsgSize for CRI responses (ListContainers on a busy node).
const MAX_MESSAGE_BYTES: usize = 16 << 20;
const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_CAP: Duration = Duration::from_secs(5);
/// How long a pull may take; the kubelet has no per-call bound on pulls
/// beyond progress deadlines, but a hung runtime must not hang a worker.
const PULL_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Where the runtime was last seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuntimeHealth {
    /// When a call last succeeded.
    pub last_ok: Option<Instant>,
    /// Since when calls have failed for lack of a runtime (None while it
    /// answers).
    pub down_since: Option<Instant>,
}

#[derive(Debug)]
struct Dialer {
    failures: u32,
    next_attempt: Option<Instant>,
}

#[derive(Debug, Default)]
struct HealthState {
    last_ok: Option<Instant>,
    down_since: Option<Instant>,
}

#[derive(Clone)]
pub struct CriClient {
    runtime: api::runtime_service_client::RuntimeServiceClient<Channel>,
    /// The runtime's channel, for calls decoded into [`lean`] messages.
    runtime_channel: Channel,
    images: api::image_service_client::ImageServiceClient<Channel>,
    timeout: Duration,
    health: Arc<Mutex<HealthState>>,
    endpoint: String,
    /// Where calls are counted and timed (kubelet_runtime_operations_*),
    /// shared by clones.
    metrics: Arc<std::sync::OnceLock<Arc<crate::metrics::Metrics>>>,
}

/// The socket path of a kubelet-style endpoint (`unix:///run/x.sock`, or a
/// bare absolute path as older kubelets accepted).
pub fn socket_path(endpoint: &str) -> Result<PathBuf> {
    let bad = |why: &str| CriError::Endpoint { endpoint: endpoint.to_owned(), why: why.to_owned() };
    let path = match endpoint.split_once("://") {
        Some(("unix", rest)) => rest,
        Some((scheme, _)) => return Err(bad(&format!("scheme {scheme}:// is not supported; use unix://"))),
        None => endpoint,
    };
    if !path.starts_with('/') {
        return Err(bad("the socket path must be absolute"));
    }
    Ok(PathBuf::from(path))
}

impl CriClient {
    /// A client for `endpoint` (runtime and image services on one socket).
    /// Does not connect until the first call.
    pub fn new(endpoint: &str, timeout: Duration) -> Result<CriClient> {
        CriClient::with_image_endpoint(endpoint, endpoint, timeout)
    }

    /// A client whose ImageService lives on its own socket
    /// (imageServiceEndpoint).
    pub fn with_image_endpoint(endpoint: &str, image_endpoint: &str, timeout: Duration) -> Result<CriClient> {
        let health = Arc::new(Mutex::new(HealthState::default()));
        let runtime_channel = channel(socket_path(endpoint)?);
        let image_channel =
            if image_endpoint == endpoint { runtime_channel.clone() } else { channel(socket_path(image_endpoint)?) };
        Ok(CriClient {
            runtime_channel: runtime_channel.clone(),
            runtime: api::runtime_service_client::RuntimeServiceClient::new(runtime_channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            images: api::image_service_client::ImageServiceClient::new(image_channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            timeout,
            health,
            endpoint: endpoint.to_owned(),
            metrics: Arc::default(),
        })
    }

    /// Counts and times every call from now on in `metrics`
    /// (kubelet_runtime_operations_*); the first registry given stays.
    pub fn observe_with(&self, metrics: Arc<crate::metrics::Metrics>) {
        let _ = self.metrics.set(metrics);
    }

    /// The image the runtime makes sandboxes from, which image GC must
    /// keep: containerd 1.x's `sandbox_image`, from its verbose status;
    /// containerd 2.x no longer tells it there (the image side of its CRI
    /// plugin holds it, as `pinned_images.sandbox`), but pins it, so the
    /// pinned image's name stands in.
    pub async fn sandbox_image(&self) -> Option<String> {
        let mut c = self.runtime.clone();
        let status = self.call("Status", self.timeout, c.status(api::StatusRequest { verbose: true })).await.ok()?;
        let configured = status
            .info
            .get("config")
            .and_then(|c| serde_json::from_str::<serde_json::Value>(c).ok())
            .and_then(|config| config.get("sandboxImage").and_then(|v| v.as_str()).map(str::to_owned));
        if configured.is_some() {
            return configured;
        }
        let images = self.list_images().await.ok()?;
        images.into_iter().filter(|i| i.pinned).find_map(|i| i.repo_tags.into_iter().next())
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn health(&self) -> RuntimeHealth {
        let h = self.health.lock();
        RuntimeHealth { last_ok: h.last_ok, down_since: h.down_since }
    }

    /// Runs one call with the timeout, recording whether the runtime answered.
    async fn call<T>(
        &self,
        name: &'static str,
        timeout: Duration,
        fut: impl std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T> {
        let started = Instant::now();
        let out = match tokio::time::timeout(timeout, fut).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) => Err(CriError::status(name, s)),
            Err(_) => Err(CriError::Timeout { call: name, timeout_secs: timeout.as_secs() }),
        };
        if let Some(m) = self.metrics.get() {
            m.kubelet.observe_runtime_call(name, started.elapsed().as_secs_f64(), out.is_err());
        }
        let mut h = self.health.lock();
        match &out {
            Err(e) if e.is_unavailable() => {
                h.down_since.get_or_insert_with(Instant::now);
            }
            _ => {
                h.last_ok = Some(Instant::now());
                h.down_since = None;
            }
        }
        out
    }

    /// The unary RuntimeService call `method`, with [`CriClient::call`]'s
    /// timeout and accounting, its response decoded into `Resp`: a message
    /// with a subset of the real one's fields.
    async fn lean_call<Req, Resp>(&self, method: &'static str, req: Req) -> Result<Resp>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(self.runtime_channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let path = format!("/runtime.v1.RuntimeService/{method}");
        let fut = async move {
            grpc.ready().await.map_err(|e| tonic::Status::unavailable(format!("runtime not ready: {e}")))?;
            let path = tonic::codegen::http::uri::PathAndQuery::try_from(path)
                .map_err(|e| tonic::Status::internal(format!("CRI method path: {e}")))?;
            grpc.unary(tonic::Request::new(req), path, tonic_prost::ProstCodec::<Req, Resp>::default()).await
        };
        self.call(method, self.timeout, fut).await
    }
}

/// Listing responses with only what a relist reads. prost skips the fields
/// these messages leave out (annotations, metadata, image) without
/// allocating; the tags are the CRI's (runtime.v1 api.proto).
mod lean {
    use bytes::Bytes;

    use crate::cri::labels::{self, PodIdentity};

    /// One entry of a proto3 `map<string, string>`: on the wire a map is a
    /// repeated message with the key at tag 1 and the value at tag 2. Read
    /// as such, the relist's labels go into no hash map, and as `Bytes`
    /// they are slices of the response, not copies.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(bytes = "bytes", tag = "1")]
        pub key: Bytes,
        #[prost(bytes = "bytes", tag = "2")]
        pub value: Bytes,
    }

    /// The pod identity the labels carry, if it is ours. A value that is
    /// not UTF-8 (which proto3 strings never are) counts as absent.
    pub fn identity(labels: &[Label]) -> Option<PodIdentity> {
        labels::identity_by(|key| {
            let l = labels.iter().find(|l| l.key == key.as_bytes())?;
            std::str::from_utf8(&l.value).ok()
        })
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandbox {
        #[prost(string, tag = "1")]
        pub id: String,
        #[prost(int32, tag = "3")]
        pub state: i32,
        #[prost(message, repeated, tag = "5")]
        pub labels: Vec<Label>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodSandboxResponse {
        #[prost(message, repeated, tag = "1")]
        pub items: Vec<PodSandbox>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Container {
        #[prost(string, tag = "1")]
        pub id: String,
        #[prost(int32, tag = "6")]
        pub state: i32,
        #[prost(message, repeated, tag = "8")]
        pub labels: Vec<Label>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListContainersResponse {
        #[prost(message, repeated, tag = "1")]
        pub containers: Vec<Container>,
    }
}

/// A lazily connecting channel over a unix socket, dialing with back-off.
fn channel(path: PathBuf) -> Channel {
    let dialer = Arc::new(Mutex::new(Dialer { failures: 0, next_attempt: None }));
    // The URI is a placeholder: the connector ignores it and dials the socket.
    let endpoint = Endpoint::from_static("http://[::]:50051");
    endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
        let path = path.clone();
        let dialer = dialer.clone();
        async move {
            if let Some(at) = dialer.lock().next_attempt
                && Instant::now() < at
            {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    format!("{}: backing off after failed connection attempts", path.display()),
                ));
            }
            match tokio::net::UnixStream::connect(&path).await {
                Ok(s) => {
                    let mut d = dialer.lock();
                    d.failures = 0;
                    d.next_attempt = None;
                    Ok(TokioIo::new(s))
                }
                Err(e) => {
                    let mut d = dialer.lock();
                    let delay = BACKOFF_START.saturating_mul(1 << d.failures.min(10)).min(BACKOFF_CAP);
                    d.failures = d.failures.saturating_add(1);
                    d.next_attempt = Some(Instant::now() + delay);
                    Err(std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
                }
            }
        }
    }))
}

#[async_trait]
impl RuntimeService for CriClient {
    async fn version(&self) -> Result<api::VersionResponse> {
        let mut c = self.runtime.clone();
        self.call("Version", self.timeout, c.version(api::VersionRequest { version: "v1".into() })).await
    }

    async fn status(&self) -> Result<api::StatusResponse> {
        let mut c = self.runtime.clone();
        self.call("Status", self.timeout, c.status(api::StatusRequest { verbose: false })).await
    }

    async fn runtime_config(&self) -> Result<api::RuntimeConfigResponse> {
        let mut c = self.runtime.clone();
        self.call("RuntimeConfig", self.timeout, c.runtime_config(api::RuntimeConfigRequest {})).await
    }

    async fn run_pod_sandbox(&self, config: api::PodSandboxConfig, runtime_handler: &str) -> Result<String> {
        let mut c = self.runtime.clone();
        let req = api::RunPodSandboxRequest { config: Some(config), runtime_handler: runtime_handler.to_owned() };
        // Creating a sandbox includes networking; the kubelet allows it the
        // same bound as any call.
        Ok(self.call("RunPodSandbox", self.timeout, c.run_pod_sandbox(req)).await?.pod_sandbox_id)
    }

    async fn stop_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = api::StopPodSandboxRequest { pod_sandbox_id: sandbox_id.to_owned() };
        self.call("StopPodSandbox", self.timeout, c.stop_pod_sandbox(req)).await.map(drop)
    }

    async fn remove_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = api::RemovePodSandboxRequest { pod_sandbox_id: sandbox_id.to_owned() };
        self.call("RemovePodSandbox", self.timeout, c.remove_pod_sandbox(req)).await.map(drop)
    }

    async fn pod_sandbox_status(&self, sandbox_id: &str) -> Result<api::PodSandboxStatus> {
        let mut c = self.runtime.clone();
        let req = api::PodSandboxStatusRequest { pod_sandbox_id: sandbox_id.to_owned(), verbose: false };
        let r = self.call("PodSandboxStatus", self.timeout, c.pod_sandbox_status(req)).await?;
        r.status.ok_or(CriError::Status {
            call: "PodSandboxStatus",
            code: tonic::Code::Internal,
            message: format!("the runtime returned no status for sandbox {sandbox_id}"),
        })
    }

    async fn list_pod_sandbox(&self, filter: Option<api::PodSandboxFilter>) -> Result<Vec<api::PodSandbox>> {
        let mut c = self.runtime.clone();
        let req = api::ListPodSandboxRequest { filter };
        Ok(self.call("ListPodSandbox", self.timeout, c.list_pod_sandbox(req)).await?.items)
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: api::PodSandboxConfig,
    ) -> Result<String> {
        let mut c = self.runtime.clone();
        let req = api::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        Ok(self.call("CreateContainer", self.timeout, c.create_container(req)).await?.container_id)
    }

    async fn start_container(&self, container_id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = api::StartContainerRequest { container_id: container_id.to_owned() };
        self.call("StartContainer", self.timeout, c.start_container(req)).await.map(drop)
    }

    async fn stop_container(&self, container_id: &str, timeout: Duration) -> Result<()> {
        let mut c = self.runtime.clone();
        let req =
            api::StopContainerRequest { container_id: container_id.to_owned(), timeout: timeout.as_secs() as i64 };
        // As the kubelet: the call may take the grace period plus the
        // request timeout.
        self.call("StopContainer", self.timeout + timeout, c.stop_container(req)).await.map(drop)
    }

    async fn remove_container(&self, container_id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = api::RemoveContainerRequest { container_id: container_id.to_owned() };
        self.call("RemoveContainer", self.timeout, c.remove_container(req)).await.map(drop)
    }

    async fn list_states(
        &self,
        sandboxes: Option<api::PodSandboxFilter>,
        containers: Option<api::ContainerFilter>,
    ) -> Result<(Vec<Listed>, Vec<Listed>)> {
        let s: lean::ListPodSandboxResponse =
            self.lean_call("ListPodSandbox", api::ListPodSandboxRequest { filter: sandboxes }).await?;
        let c: lean::ListContainersResponse =
            self.lean_call("ListContainers", api::ListContainersRequest { filter: containers }).await?;
        Ok((
            s.items.into_iter().map(|s| Listed { pod: lean::identity(&s.labels), id: s.id, state: s.state }).collect(),
            c.containers
                .into_iter()
                .map(|c| Listed { pod: lean::identity(&c.labels), id: c.id, state: c.state })
                .collect(),
        ))
    }

    async fn list_containers(&self, filter: Option<api::ContainerFilter>) -> Result<Vec<api::Container>> {
        let mut c = self.runtime.clone();
        let req = api::ListContainersRequest { filter };
        Ok(self.call("ListContainers", self.timeout, c.list_containers(req)).await?.containers)
    }

    async fn container_status(&self, container_id: &str) -> Result<api::ContainerStatus> {
        let mut c = self.runtime.clone();
        let req = api::ContainerStatusRequest { container_id: container_id.to_owned(), verbose: false };
        let r = self.call("ContainerStatus", self.timeout, c.container_status(req)).await?;
        r.status.ok_or(CriError::Status {
            call: "ContainerStatus",
            code: tonic::Code::Internal,
            message: format!("the runtime returned no status for container {container_id}"),
        })
    }

    async fn exec_sync(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<api::ExecSyncResponse> {
        let mut c = self.runtime.clone();
        let req =
            api::ExecSyncRequest { container_id: container_id.to_owned(), cmd, timeout: timeout.as_secs() as i64 };
        self.call("ExecSync", self.timeout + timeout, c.exec_sync(req)).await
    }

    async fn update_container_resources(
        &self,
        container_id: &str,
        resources: api::LinuxContainerResources,
    ) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = api::UpdateContainerResourcesRequest {
            container_id: container_id.to_owned(),
            linux: Some(resources),
            ..Default::default()
        };
        self.call("UpdateContainerResources", self.timeout, c.update_container_resources(req)).await.map(drop)
    }

    async fn reopen_container_log(&self, container_id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = api::ReopenContainerLogRequest { container_id: container_id.to_owned() };
        self.call("ReopenContainerLog", self.timeout, c.reopen_container_log(req)).await.map(drop)
    }

    async fn list_container_stats(
        &self,
        filter: Option<api::ContainerStatsFilter>,
    ) -> Result<Vec<api::ContainerStats>> {
        let mut c = self.runtime.clone();
        let req = api::ListContainerStatsRequest { filter };
        Ok(self.call("ListContainerStats", self.timeout, c.list_container_stats(req)).await?.stats)
    }
}

#[async_trait]
impl super::StreamingRuntime for CriClient {
    async fn exec(&self, req: api::ExecRequest) -> Result<String> {
        let mut c = self.runtime.clone();
        Ok(self.call("Exec", self.timeout, c.exec(req)).await?.url)
    }

    async fn attach(&self, req: api::AttachRequest) -> Result<String> {
        let mut c = self.runtime.clone();
        Ok(self.call("Attach", self.timeout, c.attach(req)).await?.url)
    }

    async fn port_forward(&self, sandbox_id: &str, ports: Vec<i32>) -> Result<String> {
        let mut c = self.runtime.clone();
        let req = api::PortForwardRequest { pod_sandbox_id: sandbox_id.to_owned(), port: ports };
        Ok(self.call("PortForward", self.timeout, c.port_forward(req)).await?.url)
    }

    async fn container_pid(&self, container_id: &str) -> Result<Option<u32>> {
        let mut c = self.runtime.clone();
        let req = api::ContainerStatusRequest { container_id: container_id.to_owned(), verbose: true };
        let r = self.call("ContainerStatus", self.timeout, c.container_status(req)).await?;
        Ok(super::pid_from_verbose_info(&r.info))
    }
}

#[async_trait]
impl ImageService for CriClient {
    async fn list_images(&self) -> Result<Vec<api::Image>> {
        let mut c = self.images.clone();
        Ok(self.call("ListImages", self.timeout, c.list_images(api::ListImagesRequest { filter: None })).await?.images)
    }

    async fn image_status(&self, image: &str) -> Result<Option<api::Image>> {
        let mut c = self.images.clone();
        let req = api::ImageStatusRequest {
            image: Some(api::ImageSpec { image: image.to_owned(), ..Default::default() }),
            verbose: false,
        };
        Ok(self.call("ImageStatus", self.timeout, c.image_status(req)).await?.image)
    }

    async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        sandbox_config: Option<api::PodSandboxConfig>,
    ) -> Result<String> {
        let mut c = self.images.clone();
        let req = api::PullImageRequest {
            image: Some(api::ImageSpec { image: image.to_owned(), ..Default::default() }),
            auth,
            sandbox_config,
        };
        Ok(self.call("PullImage", PULL_TIMEOUT, c.pull_image(req)).await?.image_ref)
    }

    async fn remove_image(&self, image: &str) -> Result<()> {
        let mut c = self.images.clone();
        let req =
            api::RemoveImageRequest { image: Some(api::ImageSpec { image: image.to_owned(), ..Default::default() }) };
        self.call("RemoveImage", self.timeout, c.remove_image(req)).await.map(drop)
    }

    async fn filesystems(&self) -> Result<api::ImageFsInfoResponse> {
        let mut c = self.images.clone();
        self.call("ImageFsInfo", self.timeout, c.image_fs_info(api::ImageFsInfoRequest {})).await
    }

    async fn image_fs_info(&self) -> Result<Vec<api::FilesystemUsage>> {
        let mut c = self.images.clone();
        Ok(self.call("ImageFsInfo", self.timeout, c.image_fs_info(api::ImageFsInfoRequest {})).await?.image_filesystems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            socket_path("unix:///run/containerd/containerd.sock").unwrap(),
            PathBuf::from("/run/containerd/containerd.sock")
        );
        assert_eq!(socket_path("/run/crio/crio.sock").unwrap(), PathBuf::from("/run/crio/crio.sock"));
        for bad in ["tcp://127.0.0.1:1234", "npipe:////./pipe/x", "unix://relative.sock", "relative.sock"] {
            let e = socket_path(bad).unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    #[tokio::test]
    async fn a_missing_socket_is_unavailable_and_backs_off() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("none.sock");
        let c = CriClient::new(&format!("unix://{}", sock.display()), Duration::from_secs(2)).unwrap();
        let e = c.version().await.unwrap_err();
        assert!(e.is_unavailable(), "{e}");
        assert!(c.health().down_since.is_some());
        // Within the back-off window the dial is not even attempted, so the
        // second failure is immediate and says so.
        let t = Instant::now();
        let e = RuntimeService::status(&c).await.unwrap_err();
        assert!(e.is_unavailable(), "{e}");
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}
