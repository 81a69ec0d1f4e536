//! CSI volumes, as the kubelet's `kubernetes.io/csi` plugin drives them.
//!
//! | module | concern |
//! |---|---|
//! | `api` | the generated CSI v1 types, clients and servers |
//! | `client` | the node side of one driver, with the kubelet's deadlines |
//! | `drivers` | the drivers registered on this node |
//! | `registration` | the plugin watcher's `CSIPlugin` handler: version checks, NodeGetInfo, CsiDrivers |
//! | `nodeinfo` | the CSINode object, the node ID annotation and topology labels (over a small API trait) |
//! | `paths` | the kubelet's directories and `vol_data.json` files (pure, and small reads and writes) |
//! | `mounter` | stage, publish, unpublish, unstage one volume for one pod |

/// The generated CSI v1 API (proto/csi/v1/csi.proto): the Identity, Node
/// and Controller services' types, clients and servers.
#[allow(clippy::all, clippy::pedantic)]
pub mod api {
    tonic::include_proto!("csi.v1");
}

pub mod client;
pub mod drivers;
pub mod mounter;
pub mod nodeinfo;
pub mod paths;
pub mod registration;

pub use drivers::{CsiDrivers, DriverInfo};
