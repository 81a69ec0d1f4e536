//! Fixtures for swiftlet's integration tests: cgroups the tests own, the
//! workload generator, and (as the project grows) containerd and the fake
//! API server.
//!
//! Every fixture cleans up in `Drop`, so a failing test leaves nothing
//! behind, and never touches a cgroup, process or mount it did not create.

pub mod agent;
pub mod api_node;
pub mod apiserver;
pub mod bench;
pub mod cgroup;
pub mod containerd;
pub mod cri;
pub mod csi;
pub mod csi_driver;
pub mod e2e;
pub mod https;
pub mod kubectl;
pub mod kubelet;
pub mod node_process;
pub mod node_vm;
pub mod pki;
pub mod pods;
pub mod prereq;
pub mod process;
pub mod prometheus;
pub mod recorder;
pub mod registry;
pub mod review_stub;
pub mod sandbox;
pub mod storage_objects;
pub mod streaming;
pub mod tmpfs;
pub mod workload;
