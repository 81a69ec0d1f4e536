//! Pod volumes: hostPath, emptyDir (disk and memory), configMap, secret,
//! downwardAPI and projected (service account tokens, kube-root-ca.crt),
//! persistentVolumeClaim and ephemeral (PVs with hostPath, local or CSI
//! sources), inline csi,
//! the containers' volumeMounts (readOnly, subPath, subPathExpr,
//! propagation), and local ephemeral storage limits.
//!
//! - `manager`: the edge: set-up before containers start, refresh,
//!   container mounts, teardown, orphan sweep (see its doc for the layout).
//! - `objects`: the `ObjectSource` trait (ConfigMaps, Secrets, tokens) and
//!   its standalone and in-memory implementations; `kube`: over kube-rs.
//! - `csi`: CSI drivers (their API, the registered drivers, the kubelet's
//!   paths, stage and publish); `affinity`: a PV's node affinity (pure).
//! - Pure: `payload` (files from objects), `hostpath` (type checks),
//!   `mounts` (volumeMounts → CRI mounts), `downward` (downward API values,
//!   shared with the container environment).
//! - I/O helpers: `atomic` (the `..data` swap), `mount` (mount(2) and
//!   mountinfo), `subpath` (safe bind mounts), `ownership` (fsGroup).
//!
//! Pod-level checks that read volumes live with the pods: the API server's
//! volume validation (`pods::volume_validation`) and local storage eviction
//! (`pods::local_storage`).

pub mod affinity;
pub mod atomic;
pub mod csi;
pub mod downward;
pub mod hostpath;
pub mod kube;
pub mod manager;
pub mod mount;
pub mod mounts;
pub mod objects;
pub mod ownership;
pub mod payload;
pub mod subpath;

pub use manager::{PodsInUse, VolumeConfig, VolumeError, VolumeManager};
pub use objects::{EnvObjects, MemoryObjects, NoApiServer, ObjectError, ObjectSource};
