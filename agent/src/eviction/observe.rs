//! From raw figures to eviction observations, and from thresholds to the
//! lines the kernel watches. Pure: the driver does the I/O.

use super::{
    core::{Observation, Observations},
    signal::{EvictionSignal, EvictionThreshold},
};
use crate::signals::{Signal, Snapshot, Target, Threshold, node::FsStats};

/// What the node is: the bases of the available figures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    /// MemTotal.
    pub memory_capacity: u64,
    /// Node allocatable memory without the eviction threshold (capacity −
    /// kube-reserved − system-reserved): what allocatableMemory.available
    /// is measured against, and the kubepods limit when enforced.
    pub allocatable_memory: u64,
    /// min(pid_max, threads-max).
    pub pid_limit: u64,
    /// The pods' root cgroup (relative path), registered with the signal
    /// source as the allocatableMemory.available slot.
    pub kubepods_cgroup: String,
}

/// Everything an observation needs that is not in a signal snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsFigures {
    pub nodefs: Option<FsStats>,
    pub imagefs: Option<FsStats>,
}

pub fn observe(snapshot: &Snapshot, node: &NodeInfo, fs: FsFigures) -> Observations {
    let mut obs = Observations::new();
    let sub = |a: u64, b: u64| a as i64 - b as i64;
    obs.insert(
        EvictionSignal::MemoryAvailable,
        Observation {
            available: sub(node.memory_capacity, snapshot.node.working_set_bytes),
            capacity: node.memory_capacity,
        },
    );
    if let Some(kubepods) = snapshot.cgroups.get(&node.kubepods_cgroup) {
        obs.insert(
            EvictionSignal::AllocatableMemoryAvailable,
            Observation {
                available: sub(node.allocatable_memory, kubepods.working_set_bytes),
                capacity: node.allocatable_memory,
            },
        );
    }
    obs.insert(
        EvictionSignal::PidAvailable,
        Observation { available: sub(node.pid_limit, snapshot.node.tasks), capacity: node.pid_limit },
    );
    for (stats, bytes, inodes) in [
        (fs.nodefs, EvictionSignal::NodeFsAvailable, EvictionSignal::NodeFsInodesFree),
        (fs.imagefs, EvictionSignal::ImageFsAvailable, EvictionSignal::ImageFsInodesFree),
    ] {
        if let Some(s) = stats {
            obs.insert(bytes, Observation { available: s.available_bytes as i64, capacity: s.capacity_bytes });
            obs.insert(inodes, Observation { available: s.inodes_free as i64, capacity: s.inodes });
        }
    }
    obs
}

/// The smallest gap kept between a kernel line's trigger and its re-arm
/// level, so a value hovering at the line produces one crossing.
const MEMORY_HYSTERESIS: u64 = 16 << 20;
const PID_HYSTERESIS: u64 = 16;

/// One line for the kernel to watch: crossing it means a hard threshold is met.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelLine {
    pub target: Target,
    pub signal: Signal,
    pub threshold: Threshold,
    pub eviction_signal: EvictionSignal,
}

/// Hard thresholds expressed as "used" lines in the kernel's terms: the
/// working set (node or kubepods) or the node's task count at which the
/// available amount falls below the threshold. Soft thresholds are not here:
/// their grace periods are seconds, which the periodic evaluation covers.
pub fn kernel_lines(thresholds: &[EvictionThreshold], node: &NodeInfo) -> Vec<KernelLine> {
    let mut lines = vec![];
    for t in thresholds.iter().filter(|t| t.is_hard()) {
        let (target, signal, capacity, hysteresis) = match t.signal {
            EvictionSignal::MemoryAvailable => {
                (Target::Node, Signal::MemoryWorkingSet, node.memory_capacity, MEMORY_HYSTERESIS)
            }
            EvictionSignal::AllocatableMemoryAvailable => (
                Target::Cgroup(node.kubepods_cgroup.clone()),
                Signal::MemoryWorkingSet,
                node.allocatable_memory,
                MEMORY_HYSTERESIS,
            ),
            EvictionSignal::PidAvailable => (Target::Node, Signal::Processes, node.pid_limit, PID_HYSTERESIS),
            _ => continue,
        };
        let value = t.value.resolve(capacity);
        // available < value  ⟺  used > capacity − value; the kernel fires at
        // used ≥ trigger, so the trigger is one unit above.
        let trigger = capacity.saturating_sub(value).saturating_add(1).max(1);
        let reclaim = t.min_reclaim.as_ref().map_or(0, |m| m.resolve(capacity)).max(hysteresis);
        lines.push(KernelLine {
            target,
            signal,
            threshold: Threshold { trigger, rearm: trigger.saturating_sub(reclaim) },
            eviction_signal: t.signal,
        });
    }
    lines
}

#[cfg(test)]
mod tests {
    use std::{
        collections::HashMap,
        time::{Duration, Instant},
    };

    use super::*;
    use crate::{
        eviction::signal::ThresholdValue,
        quantity::Quantity,
        signals::{CgroupUsage, NodeUsage},
    };

    const MI: u64 = 1 << 20;

    fn node() -> NodeInfo {
        NodeInfo {
            memory_capacity: 4096 * MI,
            allocatable_memory: 1024 * MI,
            pid_limit: 32768,
            kubepods_cgroup: "kubepods".into(),
        }
    }

    #[test]
    fn observations() {
        let snap = Snapshot {
            node: NodeUsage { working_set_bytes: 1000 * MI, tasks: 700, ..Default::default() },
            cgroups: HashMap::from([(
                "kubepods".into(),
                CgroupUsage { working_set_bytes: 1100 * MI, ..Default::default() },
            )]),
            taken_at: Instant::now(),
        };
        let fs = FsStats { capacity_bytes: 100, available_bytes: 40, inodes: 10, inodes_free: 3 };
        let o = observe(&snap, &node(), FsFigures { nodefs: Some(fs), imagefs: None });
        assert_eq!(
            o[&EvictionSignal::MemoryAvailable],
            Observation { available: 3096 * MI as i64, capacity: 4096 * MI }
        );
        assert_eq!(
            o[&EvictionSignal::AllocatableMemoryAvailable].available,
            -(76 * MI as i64),
            "pods over allocatable"
        );
        assert_eq!(o[&EvictionSignal::PidAvailable].available, 32068);
        assert_eq!(o[&EvictionSignal::NodeFsAvailable], Observation { available: 40, capacity: 100 });
        assert_eq!(o[&EvictionSignal::NodeFsInodesFree], Observation { available: 3, capacity: 10 });
        assert!(!o.contains_key(&EvictionSignal::ImageFsAvailable));
    }

    #[test]
    fn kernel_lines_table() {
        let hard =
            |signal, value, min_reclaim| EvictionThreshold { signal, value, grace_period: Duration::ZERO, min_reclaim };
        let q = |v: u64| ThresholdValue::Quantity(Quantity::from_units(v as i64));
        let thresholds = vec![
            hard(EvictionSignal::MemoryAvailable, q(100 * MI), None),
            hard(EvictionSignal::AllocatableMemoryAvailable, ThresholdValue::Percentage(0.25), Some(q(64 * MI))),
            hard(EvictionSignal::PidAvailable, q(1000), None),
            hard(EvictionSignal::NodeFsAvailable, ThresholdValue::Percentage(0.1), None),
            EvictionThreshold {
                grace_period: Duration::from_secs(30),
                ..hard(EvictionSignal::MemoryAvailable, q(MI), None)
            },
        ];
        let lines = kernel_lines(&thresholds, &node());
        assert_eq!(lines.len(), 3, "hard memory and pid thresholds only");
        assert_eq!(lines[0].target, Target::Node);
        assert_eq!(lines[0].threshold, Threshold { trigger: 3996 * MI + 1, rearm: 3980 * MI + 1 });
        assert_eq!(lines[1].target, Target::Cgroup("kubepods".into()));
        assert_eq!(lines[1].threshold, Threshold { trigger: 768 * MI + 1, rearm: 704 * MI + 1 });
        assert_eq!(lines[2].signal, Signal::Processes);
        assert_eq!(lines[2].threshold, Threshold { trigger: 31769, rearm: 31753 });
    }

    #[test]
    fn a_line_is_crossed_exactly_when_the_threshold_is_met() {
        let t = EvictionThreshold {
            signal: EvictionSignal::AllocatableMemoryAvailable,
            value: ThresholdValue::Quantity(Quantity::from_units((200 * MI) as i64)),
            grace_period: Duration::ZERO,
            min_reclaim: None,
        };
        let line = &kernel_lines(std::slice::from_ref(&t), &node())[0];
        for used in [823 * MI, 824 * MI, 824 * MI + 1, 900 * MI] {
            let available = node().allocatable_memory as i64 - used as i64;
            let met = available < (200 * MI) as i64;
            assert_eq!(used >= line.threshold.trigger, met, "used {used}");
        }
    }
}
