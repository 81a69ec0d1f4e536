//! The kubelet's plugin registration, as node-driver-registrar serves it
//! beside a CSI driver: GetInfo names the driver and its endpoint, and
//! NotifyRegistrationStatus is the kubelet's answer.

use std::path::PathBuf;

use swiftlet::pluginwatcher::api::{self, InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use tonic::{Request, Response, Status};

use super::Driver;

/// The plugin type of CSI drivers.
pub const CSI_PLUGIN: &str = "CSIPlugin";
/// The CSI versions the driver speaks.
pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];

#[derive(Clone)]
pub struct Registration {
    pub driver: Driver,
    /// The CSI socket the kubelet is to dial.
    pub endpoint: PathBuf,
}

#[tonic::async_trait]
impl api::registration_server::Registration for Registration {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        let endpoint = self.endpoint.display().to_string();
        self.driver
            .call("GetInfo", "GetInfo".into(), move |d| {
                Ok(PluginInfo {
                    r#type: CSI_PLUGIN.into(),
                    name: d.config().name.clone(),
                    endpoint,
                    supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
                })
            })
            .await
    }

    /// Logged as `registered` or `registration failed: <error>`; a refusal
    /// keeps the socket served, for the kubelet tries again.
    async fn notify_registration_status(
        &self,
        r: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let r = r.into_inner();
        let line =
            if r.plugin_registered { "registered".to_owned() } else { format!("registration failed: {}", r.error) };
        self.driver.call("NotifyRegistrationStatus", line, |_| Ok(RegistrationStatusResponse {})).await
    }
}
