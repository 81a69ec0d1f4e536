//! Pod volumes: hostPath, emptyDir (disk and memory), configMap, secret,
//! downwardAPI and projected (service account tokens, kube-root-ca.crt),
//! the containers' volumeMounts (readOnly, subPath, subPathExpr,
//! propagation), and local ephemeral storage limits.
//!
//! - `manager`: the edge: set-up before containers start, refresh,
//!   container mounts, teardown, orphan sweep (see its doc for the layout).
//! - `objects`: the `ObjectSource` trait (ConfigMaps, Secrets, tokens) and
//!   its standalone and in-memory implementations; `kube`: over kube-rs.
//! - Pure: `payload` (files from objects), `hostpath` (type checks),
//!   `mounts` (volumeMounts → CRI mounts), `validation` (the API server's
//!   checks for static pods), `storage::evaluate` (eviction for local
//!   storage).
//! - I/O helpers: `atomic` (the `..data` swap), `mount` (mount(2) and
//!   mountinfo), `subpath` (safe bind mounts), `storage` (disk usage and
//!   the monitor that evicts), `ownership` (fsGroup).

pub mod atomic;
pub mod hostpath;
pub mod kube;
pub mod manager;
pub mod mount;
pub mod mounts;
pub mod objects;
pub mod ownership;
pub mod payload;
pub mod storage;
pub mod subpath;
pub mod validation;

pub use manager::{PodsInUse, VolumeConfig, VolumeError, VolumeManager};
pub use objects::{EnvObjects, MemoryObjects, NoApiServer, ObjectError, ObjectSource};
