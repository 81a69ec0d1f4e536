//! swiftlet: a Kubernetes node agent whose resource-pressure path runs in
//! the kernel through eBPF. See docs/ARCHITECTURE.md for the map.

pub mod app;
pub mod certs;
pub mod cgroups;
pub mod cli;
pub mod cloudprovider;
pub mod cm;
pub mod config;
pub mod cri;
pub mod events;
pub mod eviction;
pub mod flowcontrol;
pub mod gc;
pub mod grpc;
pub mod heap;
pub mod host;
pub mod images;
pub mod kernel_tunables;
pub mod kubeapi;
pub mod logs;
pub mod metrics;
pub mod node;
pub mod pluginwatcher;
pub mod pods;
pub mod psi;
pub mod quantity;
pub mod reload;
pub mod server;
pub mod shutdown;
pub mod signals;
pub mod smp;
pub mod startup;
pub mod sysctl;
pub mod systemd;
pub mod version;
pub mod volumes;
pub mod yaml_locate;
pub mod yaml_read;
// ---- device plugins ----
pub mod deviceplugin;
