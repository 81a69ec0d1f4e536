//! The client of one device plugin: dialed on its socket in the device
//! plugin directory, with a deadline on each call but the ListAndWatch
//! stream (as the kubelet's endpoint).

use std::{path::Path, time::Duration};

use hyper_util::rt::TokioIo;
use tonic::{
    Streaming,
    transport::{Channel, Endpoint, Uri},
};

use super::api::{self, device_plugin_client::DevicePluginClient};

/// How long dialing and each unary call may take (the kubelet's 10 s).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct PluginClient {
    client: DevicePluginClient<Channel>,
}

fn status_text(s: tonic::Status) -> String {
    if s.message().is_empty() { format!("{:?}", s.code()) } else { s.message().to_owned() }
}

async fn timed<T>(
    what: &str,
    f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(format!("{what}: {}", status_text(s))),
        Err(_) => Err(format!("{what}: no answer within {CALL_TIMEOUT:?}")),
    }
}

impl PluginClient {
    /// Dials the plugin's socket.
    pub async fn dial(socket: &Path) -> Result<PluginClient, String> {
        let path = socket.to_owned();
        // The URI is a placeholder: the connector dials the socket.
        let endpoint = Endpoint::from_static("http://[::]:50051");
        let connect = endpoint.connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { tokio::net::UnixStream::connect(&path).await.map(TokioIo::new) }
        }));
        let channel = match tokio::time::timeout(CALL_TIMEOUT, connect).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(format!("cannot dial device plugin {}: {e}", socket.display())),
            Err(_) => {
                return Err(format!(
                    "cannot dial device plugin {}: no answer within {CALL_TIMEOUT:?}",
                    socket.display()
                ));
            }
        };
        Ok(PluginClient { client: DevicePluginClient::new(channel) })
    }

    pub async fn options(&self) -> Result<api::DevicePluginOptions, String> {
        timed("GetDevicePluginOptions", self.client.clone().get_device_plugin_options(api::Empty {})).await
    }

    pub async fn list_and_watch(&self) -> Result<Streaming<api::ListAndWatchResponse>, String> {
        timed("ListAndWatch", self.client.clone().list_and_watch(api::Empty {})).await
    }

    /// Allocate for one container's devices.
    pub async fn allocate(&self, ids: Vec<String>) -> Result<api::ContainerAllocateResponse, String> {
        let request =
            api::AllocateRequest { container_requests: vec![api::ContainerAllocateRequest { devices_ids: ids }] };
        let mut r = timed("Allocate", self.client.clone().allocate(request)).await?;
        if r.container_responses.len() != 1 {
            return Err(format!(
                "Allocate: the plugin answered for {} containers instead of 1",
                r.container_responses.len()
            ));
        }
        Ok(r.container_responses.remove(0))
    }

    pub async fn pre_start(&self, ids: Vec<String>) -> Result<(), String> {
        timed(
            "PreStartContainer",
            self.client.clone().pre_start_container(api::PreStartContainerRequest { devices_ids: ids }),
        )
        .await
        .map(|_| ())
    }
}
