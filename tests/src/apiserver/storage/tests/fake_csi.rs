//! A CSI Identity and Controller service for the controllers' tests,
//! served with tonic on a unix socket: it records every call, answers
//! with what a simple driver would, and fails a method on request.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
};

use swiftlet::volumes::csi::api::{
    self as csi,
    controller_server::{Controller, ControllerServer},
    identity_server::{Identity, IdentityServer},
};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

#[derive(Clone, Debug)]
pub enum Call {
    Create(csi::CreateVolumeRequest),
    Delete(csi::DeleteVolumeRequest),
    Publish(csi::ControllerPublishVolumeRequest),
    Unpublish(csi::ControllerUnpublishVolumeRequest),
    Expand(csi::ControllerExpandVolumeRequest),
}

#[derive(Default)]
struct Shared {
    calls: Mutex<Vec<Call>>,
    /// method name → the status it answers with.
    failures: Mutex<HashMap<&'static str, Status>>,
    node_expansion: AtomicBool,
}

#[derive(Clone)]
struct Service {
    driver: String,
    shared: Arc<Shared>,
}

impl Service {
    fn begin(&self, method: &'static str, call: Call) -> Result<(), Status> {
        self.shared.calls.lock().unwrap().push(call);
        match self.shared.failures.lock().unwrap().get(method) {
            Some(s) => Err(s.clone()),
            None => Ok(()),
        }
    }
}

pub struct FakeCsi {
    pub socket: PathBuf,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl FakeCsi {
    pub fn start(driver: &str) -> FakeCsi {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("csi.sock");
        let shared = Arc::new(Shared::default());
        let service = Service { driver: driver.to_owned(), shared: shared.clone() };
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let path = socket.clone();
        let thread = thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::UnixListener::bind(&path).unwrap();
                ready_tx.send(()).unwrap();
                let _ = tonic::transport::Server::builder()
                    .add_service(IdentityServer::new(service.clone()))
                    .add_service(ControllerServer::new(service))
                    .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), async {
                        let _ = stop_rx.await;
                    })
                    .await;
            });
        });
        ready_rx.recv().unwrap();
        FakeCsi { socket, shared, stop: Some(stop_tx), thread: Some(thread), _dir: dir }
    }

    pub fn calls(&self) -> Vec<Call> {
        self.shared.calls.lock().unwrap().clone()
    }

    /// `method` ("create_volume", "controller_publish_volume", ...) answers
    /// `status` from now on; None: succeeds again.
    pub fn fail(&self, method: &'static str, status: Option<Status>) {
        let mut f = self.shared.failures.lock().unwrap();
        match status {
            Some(s) => f.insert(method, s),
            None => f.remove(method),
        };
    }

    pub fn set_node_expansion(&self, required: bool) {
        self.shared.node_expansion.store(required, Ordering::SeqCst);
    }
}

impl Drop for FakeCsi {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[tonic::async_trait]
impl Identity for Service {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.driver.clone(),
            vendor_version: "0.1.0".into(),
            manifest: HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        use csi::plugin_capability::{Service as S, Type, service::Type as ST};
        let service = |t: ST| csi::PluginCapability { r#type: Some(Type::Service(S { r#type: t as i32 })) };
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities: vec![service(ST::ControllerService), service(ST::VolumeAccessibilityConstraints)],
        }))
    }

    async fn probe(&self, _: Request<csi::ProbeRequest>) -> Result<Response<csi::ProbeResponse>, Status> {
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Controller for Service {
    async fn create_volume(
        &self,
        r: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let r = r.into_inner();
        self.begin("create_volume", Call::Create(r.clone()))?;
        let topology = r.accessibility_requirements.and_then(|t| t.requisite.into_iter().next());
        Ok(Response::new(csi::CreateVolumeResponse {
            volume: Some(csi::Volume {
                capacity_bytes: r.capacity_range.map_or(0, |c| c.required_bytes),
                volume_id: format!("vol-{}", r.name),
                volume_context: HashMap::from([("backing".to_owned(), "loop".to_owned())]),
                content_source: None,
                accessible_topology: topology.into_iter().collect(),
            }),
        }))
    }

    async fn delete_volume(
        &self,
        r: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        self.begin("delete_volume", Call::Delete(r.into_inner()))?;
        Ok(Response::new(csi::DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        r: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        let r = r.into_inner();
        self.begin("controller_publish_volume", Call::Publish(r.clone()))?;
        Ok(Response::new(csi::ControllerPublishVolumeResponse {
            publish_context: HashMap::from([("devicePath".to_owned(), format!("/dev/fake/{}", r.volume_id))]),
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        r: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        self.begin("controller_unpublish_volume", Call::Unpublish(r.into_inner()))?;
        Ok(Response::new(csi::ControllerUnpublishVolumeResponse {}))
    }

    async fn controller_expand_volume(
        &self,
        r: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        let r = r.into_inner();
        self.begin("controller_expand_volume", Call::Expand(r.clone()))?;
        Ok(Response::new(csi::ControllerExpandVolumeResponse {
            capacity_bytes: r.capacity_range.map_or(0, |c| c.required_bytes),
            node_expansion_required: self.shared.node_expansion.load(Ordering::SeqCst),
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        use csi::controller_service_capability::{Rpc, Type, rpc::Type as RT};
        let rpc = |t: RT| csi::ControllerServiceCapability { r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })) };
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities: vec![rpc(RT::CreateDeleteVolume), rpc(RT::PublishUnpublishVolume), rpc(RT::ExpandVolume)],
        }))
    }

    async fn validate_volume_capabilities(
        &self,
        _: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        Err(Status::unimplemented("validate_volume_capabilities"))
    }

    async fn list_volumes(
        &self,
        _: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        Err(Status::unimplemented("list_volumes"))
    }

    async fn get_capacity(
        &self,
        _: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        Err(Status::unimplemented("get_capacity"))
    }

    async fn create_snapshot(
        &self,
        _: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        Err(Status::unimplemented("create_snapshot"))
    }

    async fn delete_snapshot(
        &self,
        _: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        Err(Status::unimplemented("delete_snapshot"))
    }

    async fn list_snapshots(
        &self,
        _: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        Err(Status::unimplemented("list_snapshots"))
    }

    async fn controller_get_volume(
        &self,
        _: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        Err(Status::unimplemented("controller_get_volume"))
    }

    async fn controller_modify_volume(
        &self,
        _: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        Err(Status::unimplemented("controller_modify_volume"))
    }
}
