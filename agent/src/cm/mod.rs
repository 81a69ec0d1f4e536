//! The container manager: QoS and oom_score_adj (`qos`), cgroup names for
//! both drivers (`naming`), node capacity and allocatable (`allocatable`),
//! huge page sizes and limits (`hugepages`), pod-level resources and the
//! pod's effective requests and limits (`pod_level`), the limits of the pods'
//! cgroup hierarchy (`hierarchy`, pure), the cgroup drivers (`manager`: the
//! trait, cgroupfs and in-memory; `systemd`), the hierarchy applied
//! through them (`pod_cgroups`) and the disks whose block I/O cgroup v1
//! must be told to count (`blkio`).

pub mod allocatable;
pub mod blkio;
pub mod hierarchy;
pub mod hugepages;
pub mod manager;
pub mod naming;
pub mod pod_cgroups;
pub mod pod_level;
pub mod qos;
pub mod systemd;
#[cfg(test)]
mod test_support;
