//! The container manager: QoS, cgroup naming, and (with the configuration)
//! node allocatable and the pods' cgroup hierarchy.

pub mod naming;
pub mod qos;
