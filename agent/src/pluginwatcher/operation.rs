//! Registering one socket (the kubelet's operation generator): dial it,
//! `GetInfo`, the handler for its type validates and registers it, and the
//! plugin hears the outcome through `NotifyRegistrationStatus`. The
//! messages are the kubelet's.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use tonic::transport::Channel;

use super::{
    PluginHandler,
    api::{InfoRequest, RegistrationStatus, registration_client::RegistrationClient},
    scan::Stamp,
};
use crate::grpc::{dial_unix, timed};

/// How long dialing a registration socket may take (the kubelet's
/// dialTimeoutDuration).
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// The deadline of `GetInfo` and `NotifyRegistrationStatus`.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The handlers by plugin type, as they are when an operation starts.
pub type Handlers = HashMap<String, Arc<dyn PluginHandler>>;

/// A plugin registered through a socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registered {
    pub socket: PathBuf,
    pub stamp: Stamp,
    pub plugin_type: String,
    pub name: String,
    /// Where the plugin serves its own API (`PluginInfo.endpoint`, or the
    /// registration socket when it sets none).
    pub endpoint: PathBuf,
}

/// What a registration came to: the plugin, and a warning when it was
/// registered but could not be told so.
pub type RegisterResult = Result<(Registered, Option<String>), String>;

async fn notify(client: &mut RegistrationClient<Channel>, registered: bool, error: &str) -> Result<(), String> {
    let status = RegistrationStatus { plugin_registered: registered, error: error.to_owned() };
    timed("NotifyRegistrationStatus", CALL_TIMEOUT, client.notify_registration_status(status)).await.map(drop)
}

/// Tells the plugin it was refused and returns `why` (with the notify
/// failure, if telling it failed too).
async fn refuse(client: &mut RegistrationClient<Channel>, socket: &Path, why: String) -> String {
    match notify(client, false, &why).await {
        Ok(()) => why,
        Err(e) => format!("{why}; and failed to send the registration status at socket {}: {e}", socket.display()),
    }
}

/// Registers the plugin serving `socket` with the handler for its type.
pub async fn register(socket: &Path, stamp: Stamp, handlers: &Handlers) -> RegisterResult {
    let channel = dial_unix(socket, DIAL_TIMEOUT, "plugin registration socket")
        .await
        .map_err(|e| format!("RegisterPlugin error -- dial failed at socket {}, err: {e}", socket.display()))?;
    let mut client = RegistrationClient::new(channel);
    let info = timed("GetInfo", CALL_TIMEOUT, client.get_info(InfoRequest {})).await.map_err(|e| {
        format!(
            "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {}, err: {e}",
            socket.display()
        )
    })?;
    let Some(handler) = handlers.get(&info.r#type) else {
        let why = format!(
            "RegisterPlugin error -- no handler registered for plugin type: {} at socket {}",
            info.r#type,
            socket.display()
        );
        return Err(refuse(&mut client, socket, why).await);
    };
    let endpoint = if info.endpoint.is_empty() { socket.to_path_buf() } else { PathBuf::from(&info.endpoint) };
    if let Err(e) = handler.validate(&info.name, &endpoint, &info.supported_versions) {
        let why = format!("RegisterPlugin error -- plugin validation failed with err: {e}");
        return Err(refuse(&mut client, socket, why).await);
    }
    if let Err(e) = handler.register(&info.name, &endpoint, &info.supported_versions).await {
        let why = format!("RegisterPlugin error -- plugin registration failed with err: {e}");
        return Err(refuse(&mut client, socket, why).await);
    }
    let registered =
        Registered { socket: socket.to_path_buf(), stamp, plugin_type: info.r#type, name: info.name, endpoint };
    // The handler has the plugin now: a plugin that cannot hear it stays
    // registered (as the kubelet's), and its socket going away deregisters it.
    let warning = notify(&mut client, true, "").await.err().map(|e| {
        format!("RegisterPlugin error -- failed to send registration status at socket {}, err: {e}", socket.display())
    });
    Ok((registered, warning))
}

/// Deregisters `plugin` from its handler (gone: nothing to do).
pub async fn deregister(plugin: &Registered, handlers: &Handlers) {
    match handlers.get(&plugin.plugin_type) {
        Some(h) => h.deregister(&plugin.name).await,
        None => tracing::warn!(plugin = plugin.name, kind = plugin.plugin_type, "no handler to deregister from"),
    }
}
