//! The kubelet's plugin watcher (pluginmanager): node plugins (CSI drivers,
//! DRA drivers) register by putting a socket under
//! `<root-dir>/plugins_registry/`.
//!
//! [`PluginWatcher::run`] creates the directory (0750) if missing, watches
//! it and its subdirectories (inotify, and a rescan every second as the
//! kubelet's reconciler runs), and for each unix socket (names starting
//! with `.` ignored) dials it, asks `GetInfo`, hands the plugin to the
//! [`PluginHandler`] registered for its type (validate, then register) and
//! answers `NotifyRegistrationStatus`. A socket removed is deregistered; a
//! socket made again at the same path (a driver restart) is deregistered
//! and registered anew. Failures are retried with back-off.
//!
//! The handlers live with what they feed (the CSI one in
//! `volumes::csi::registration`): this module knows none of them.
//!
//! | module | concern |
//! |---|---|
//! | `api` | the generated pluginregistration v1 types, client and server |
//! | `scan` | the sockets under the directory, each with what identifies its file |
//! | `fswatch` | inotify on the directory tree, to rescan at once |
//! | `operation` | registering one socket with its handler, deregistering it |
//! | `reconciler` | the sockets on disk against the plugins registered (pure) |
//! | `watcher` | the loop tying them together, and what is registered |
//! | `metrics` | `plugin_manager_total_plugins` |

pub mod fswatch;
pub mod metrics;
pub mod operation;
pub mod reconciler;
pub mod scan;
pub mod watcher;

#[cfg(test)]
mod tests;

/// The generated registration API (proto/pluginregistration/v1/api.proto).
#[allow(clippy::all, clippy::pedantic)]
pub mod api {
    tonic::include_proto!("pluginregistration");
}

use std::path::{Path, PathBuf};

use async_trait::async_trait;

pub use metrics::PluginManagerCollector;
pub use watcher::{PluginEntry, PluginWatcher};

/// `PluginInfo.type` of a CSI driver's registrar.
pub const CSI_PLUGIN: &str = "CSIPlugin";
/// `PluginInfo.type` of a DRA driver.
pub const DRA_PLUGIN: &str = "DRAPlugin";
/// `PluginInfo.type` of a device plugin registering through the watcher.
pub const DEVICE_PLUGIN: &str = "DevicePlugin";

/// `<root-dir>/plugins_registry` (the kubelet's
/// /var/lib/kubelet/plugins_registry).
pub fn registry_dir(root_dir: &Path) -> PathBuf {
    root_dir.join("plugins_registry")
}

/// What takes the plugins of one type (the kubelet's
/// `cache.PluginHandler`). Errors are the messages sent back to the plugin.
#[async_trait]
pub trait PluginHandler: Send + Sync {
    /// Whether the plugin `name`, served on `endpoint`, offering API
    /// `versions`, may register. Called before [`PluginHandler::register`].
    fn validate(&self, name: &str, endpoint: &Path, versions: &[String]) -> Result<(), String>;

    /// Takes the plugin in.
    async fn register(&self, name: &str, endpoint: &Path, versions: &[String]) -> Result<(), String>;

    /// The plugin's socket went away (or was made again).
    async fn deregister(&self, name: &str);
}
