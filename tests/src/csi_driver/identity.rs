//! The Identity service.

use swiftlet::volumes::csi::api::{
    self, GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest, GetPluginInfoResponse,
    PluginCapability, ProbeRequest, ProbeResponse, plugin_capability,
};
use tonic::{Request, Response, Status};

use super::Driver;

pub const VENDOR_VERSION: &str = "0.1.0";

fn service(t: plugin_capability::service::Type) -> PluginCapability {
    PluginCapability { r#type: Some(plugin_capability::Type::Service(plugin_capability::Service { r#type: t as i32 })) }
}

/// What GetPluginCapabilities answers.
pub fn capabilities(driver: &Driver) -> Vec<PluginCapability> {
    let mut caps = vec![service(plugin_capability::service::Type::ControllerService)];
    if driver.config().topology_key.is_some() {
        caps.push(service(plugin_capability::service::Type::VolumeAccessibilityConstraints));
    }
    caps.push(PluginCapability {
        r#type: Some(plugin_capability::Type::VolumeExpansion(plugin_capability::VolumeExpansion {
            r#type: plugin_capability::volume_expansion::Type::Online as i32,
        })),
    });
    caps
}

#[tonic::async_trait]
impl api::identity_server::Identity for Driver {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        self.call("GetPluginInfo", "GetPluginInfo".into(), |d| {
            Ok(GetPluginInfoResponse {
                name: d.config().name.clone(),
                vendor_version: VENDOR_VERSION.into(),
                manifest: Default::default(),
            })
        })
        .await
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        self.call("GetPluginCapabilities", "GetPluginCapabilities".into(), |d| {
            Ok(GetPluginCapabilitiesResponse { capabilities: capabilities(d) })
        })
        .await
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        self.call("Probe", "Probe".into(), |_| Ok(ProbeResponse { ready: Some(true) })).await
    }
}
