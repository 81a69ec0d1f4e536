//! The kubelet's eviction signals and thresholds.

use std::{fmt, time::Duration};

use crate::quantity::Quantity;

/// The seven eviction signals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EvictionSignal {
    MemoryAvailable,
    AllocatableMemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    PidAvailable,
}

impl EvictionSignal {
    pub const ALL: [EvictionSignal; 7] = [
        EvictionSignal::MemoryAvailable,
        EvictionSignal::AllocatableMemoryAvailable,
        EvictionSignal::NodeFsAvailable,
        EvictionSignal::NodeFsInodesFree,
        EvictionSignal::ImageFsAvailable,
        EvictionSignal::ImageFsInodesFree,
        EvictionSignal::PidAvailable,
    ];

    /// The name used in flags, config files and messages.
    pub fn name(self) -> &'static str {
        match self {
            EvictionSignal::MemoryAvailable => "memory.available",
            EvictionSignal::AllocatableMemoryAvailable => "allocatableMemory.available",
            EvictionSignal::NodeFsAvailable => "nodefs.available",
            EvictionSignal::NodeFsInodesFree => "nodefs.inodesFree",
            EvictionSignal::ImageFsAvailable => "imagefs.available",
            EvictionSignal::ImageFsInodesFree => "imagefs.inodesFree",
            EvictionSignal::PidAvailable => "pid.available",
        }
    }

    pub fn from_name(name: &str) -> Option<EvictionSignal> {
        EvictionSignal::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The node condition this signal drives.
    pub fn condition(self) -> NodeCondition {
        match self {
            EvictionSignal::MemoryAvailable | EvictionSignal::AllocatableMemoryAvailable => {
                NodeCondition::MemoryPressure
            }
            EvictionSignal::PidAvailable => NodeCondition::PidPressure,
            _ => NodeCondition::DiskPressure,
        }
    }

    /// The resource named in eviction messages ("memory", "ephemeral-storage", "pids").
    pub fn resource(self) -> &'static str {
        match self {
            EvictionSignal::MemoryAvailable | EvictionSignal::AllocatableMemoryAvailable => "memory",
            EvictionSignal::NodeFsAvailable | EvictionSignal::ImageFsAvailable => "ephemeral-storage",
            EvictionSignal::NodeFsInodesFree | EvictionSignal::ImageFsInodesFree => "inodes",
            EvictionSignal::PidAvailable => "pids",
        }
    }
}

impl fmt::Display for EvictionSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The node conditions eviction reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeCondition {
    MemoryPressure,
    DiskPressure,
    PidPressure,
    /// swiftlet's memory.pressure signal held above its threshold (named
    /// as KEP-5394's draft names the node-level memory PSI condition).
    MemoryContention,
}

impl NodeCondition {
    pub const ALL: [NodeCondition; 4] = [
        NodeCondition::MemoryPressure,
        NodeCondition::DiskPressure,
        NodeCondition::PidPressure,
        NodeCondition::MemoryContention,
    ];

    /// The condition type in NodeStatus.
    pub fn type_name(self) -> &'static str {
        match self {
            NodeCondition::MemoryPressure => "MemoryPressure",
            NodeCondition::DiskPressure => "DiskPressure",
            NodeCondition::PidPressure => "PIDPressure",
            NodeCondition::MemoryContention => "SystemMemoryContentionPressure",
        }
    }

    /// The NoSchedule taint key the node gets while the condition holds.
    pub fn taint_key(self) -> &'static str {
        match self {
            NodeCondition::MemoryPressure => "node.kubernetes.io/memory-pressure",
            NodeCondition::DiskPressure => "node.kubernetes.io/disk-pressure",
            NodeCondition::PidPressure => "node.kubernetes.io/pid-pressure",
            NodeCondition::MemoryContention => "node.kubernetes.io/memory-contention-pressure",
        }
    }
}

/// A threshold value: an absolute quantity or a fraction of capacity. Read
/// from configuration by `config::thresholds` (the one parser).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ThresholdValue {
    Quantity(Quantity),
    /// 0.0..=1.0
    Percentage(f64),
}

impl ThresholdValue {
    /// The value in the signal's unit, given the capacity percentages are of.
    pub fn resolve(&self, capacity: u64) -> u64 {
        match self {
            ThresholdValue::Quantity(q) => q.value().max(0) as u64,
            ThresholdValue::Percentage(p) => (capacity as f64 * p) as u64,
        }
    }

    pub fn is_zero(&self) -> bool {
        match self {
            ThresholdValue::Quantity(q) => *q == Quantity::ZERO,
            ThresholdValue::Percentage(p) => *p == 0.0,
        }
    }
}

impl fmt::Display for ThresholdValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThresholdValue::Quantity(q) => write!(f, "{q}"),
            ThresholdValue::Percentage(p) => write!(f, "{}%", p * 100.0),
        }
    }
}

/// One eviction threshold: `signal < value`, hard when `grace_period` is
/// zero, soft otherwise; `min_reclaim` is how far below the line eviction
/// keeps going once started.
#[derive(Clone, Debug, PartialEq)]
pub struct EvictionThreshold {
    pub signal: EvictionSignal,
    pub value: ThresholdValue,
    pub grace_period: Duration,
    pub min_reclaim: Option<ThresholdValue>,
}

impl EvictionThreshold {
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in EvictionSignal::ALL {
            assert_eq!(EvictionSignal::from_name(s.name()), Some(s));
        }
        assert_eq!(EvictionSignal::from_name("foo.available"), None);
        assert_eq!(EvictionSignal::from_name("Memory.available"), None);
    }

    #[test]
    fn conditions() {
        assert_eq!(EvictionSignal::AllocatableMemoryAvailable.condition(), NodeCondition::MemoryPressure);
        assert_eq!(EvictionSignal::ImageFsInodesFree.condition(), NodeCondition::DiskPressure);
        assert_eq!(NodeCondition::PidPressure.type_name(), "PIDPressure");
    }
}
