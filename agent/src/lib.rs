//! swiftlet: a Kubernetes node agent whose resource-pressure path runs in
//! the kernel through eBPF. See docs/ARCHITECTURE.md for the map.

pub mod cgroups;
pub mod signals;
