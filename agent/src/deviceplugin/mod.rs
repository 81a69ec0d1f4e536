//! Device plugins: the kubelet's devicemanager for the v1beta1 API.
//!
//! [`manager::DeviceManager::new`] reads the checkpoint under
//! `<root-dir>/device-plugins/`; `start` removes the stale sockets there
//! (plugins watch for that and register again), serves `Registration` on
//! `kubelet.sock`, and for each registered plugin dials its socket, asks
//! its options and follows `ListAndWatch`. What it knows feeds:
//! - node status: `extended_resources()` (capacity counts every device,
//!   allocatable the healthy ones; a plugin gone for 5 minutes is removed);
//! - admission: `PodDeviceAllocator::admit` reserves devices for every
//!   container or rejects the pod with `UnexpectedAdmissionError`;
//! - container creation: `container_options` calls `Allocate` (once per
//!   container, kept in the checkpoint) and `PreStartContainer`, and the
//!   result goes into the CRI config (`container::apply`).
//!
//! | module | concern |
//! |---|---|
//! | `api` | the generated v1beta1 types, client and server |
//! | `devices` | devices per resource, health, capacity and allocatable (pure) |
//! | `allocation` | which devices a pod's containers get (pure) |
//! | `container` | Allocate responses → CRI container config (pure) |
//! | `checkpoint` | `kubelet_internal_checkpoint`, written atomically |
//! | `registration` | request validation (pure) and the Registration server |
//! | `endpoint` | the client of one plugin |
//! | `manager` | the state and the tasks tying them together |

pub mod allocation;
pub mod checkpoint;
pub mod container;
pub mod devices;
pub mod endpoint;
pub mod manager;
pub mod registration;

/// The generated v1beta1 API (proto/deviceplugin/v1beta1/api.proto).
#[allow(clippy::all, clippy::pedantic)]
pub mod api {
    tonic::include_proto!("v1beta1");
}

use std::path::{Path, PathBuf};

pub use manager::{DeviceManager, PodDeviceAllocator};

/// The only API version served.
pub const VERSION: &str = "v1beta1";
/// The registration socket's file name in the device plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// The assignments and registered devices, kept across restarts.
pub const CHECKPOINT_FILE: &str = "kubelet_internal_checkpoint";
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";

/// `<root-dir>/device-plugins` (the kubelet's /var/lib/kubelet/device-plugins).
pub fn plugin_dir(root_dir: &Path) -> PathBuf {
    root_dir.join("device-plugins")
}
