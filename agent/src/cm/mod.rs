//! The container manager: QoS and oom_score_adj (`qos`), cgroup names for
//! both drivers (`naming`), node capacity and allocatable (`allocatable`),
//! huge page sizes and limits (`hugepages`), and the pods' cgroup
//! hierarchy with its limits (`hierarchy`).

pub mod allocatable;
pub mod hierarchy;
pub mod hugepages;
pub mod naming;
pub mod qos;
