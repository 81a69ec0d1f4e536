//! The client of one device plugin: dialed on its socket in the device
//! plugin directory, with a deadline on each call but the ListAndWatch
//! stream (as the kubelet's endpoint).

use std::{path::Path, time::Duration};

use tonic::{Streaming, transport::Channel};

use super::api::{self, device_plugin_client::DevicePluginClient};

/// How long dialing and each unary call may take (the kubelet's 10 s).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct PluginClient {
    client: DevicePluginClient<Channel>,
}

async fn timed<T>(
    what: &str,
    f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    crate::grpc::timed(what, CALL_TIMEOUT, f).await
}

impl PluginClient {
    /// Dials the plugin's socket.
    pub async fn dial(socket: &Path) -> Result<PluginClient, String> {
        let channel = crate::grpc::dial_unix(socket, CALL_TIMEOUT, "device plugin").await?;
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
