//! Node capacity and allocatable, as the kubelet's container manager
//! computes them.
//!
//! - allocatable (node status, what the scheduler sees) = capacity −
//!   kubeReserved − systemReserved − the hard eviction threshold
//!   (memory.available for memory, nodefs.available for
//!   ephemeral-storage; percentages of capacity), floored at zero.
//! - enforced allocatable (the kubepods cgroup's limits with
//!   `enforceNodeAllocatable: [pods]`) = capacity − kubeReserved −
//!   systemReserved, without the eviction threshold: the eviction manager,
//!   not the kernel OOM killer, is meant to act in the gap between the two
//!   (the kubelet's getNodeAllocatableAbsolute).
//!
//! Huge pages are capacity (`hugepages-2Mi`, `hugepages-1Gi`: pages
//! pre-allocated × page size) and allocatable as they are; allocatable
//! memory excludes them.
//!
//! The arithmetic is pure; `machine_capacity` reads the machine.

use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
};

use procfs::Current;

use super::hugepages;
use crate::{
    config::{KubeletConfiguration, Reservation, ReservedResource},
    eviction::signal::{EvictionSignal, EvictionThreshold},
    quantity::Quantity,
    signals::node,
};

/// A node resource. `Pid` is internal (it sizes kubepods' pids.max) and
/// is not reported in the node's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    Cpu,
    Memory,
    EphemeralStorage,
    Pods,
    Pid,
    /// Pre-allocated huge pages of one page size (bytes).
    Hugepages(u64),
}

impl Resource {
    /// The name in NodeStatus.capacity/allocatable; None for `Pid`.
    pub fn status_name(self) -> Option<String> {
        match self {
            Resource::Cpu => Some("cpu".into()),
            Resource::Memory => Some("memory".into()),
            Resource::EphemeralStorage => Some("ephemeral-storage".into()),
            Resource::Pods => Some("pods".into()),
            Resource::Pid => None,
            Resource::Hugepages(size) => Some(hugepages::resource_name(size)),
        }
    }
}

impl From<ReservedResource> for Resource {
    fn from(r: ReservedResource) -> Resource {
        match r {
            ReservedResource::Cpu => Resource::Cpu,
            ReservedResource::Memory => Resource::Memory,
            ReservedResource::EphemeralStorage => Resource::EphemeralStorage,
            ReservedResource::Pid => Resource::Pid,
        }
    }
}

pub type ResourceList = BTreeMap<Resource, Quantity>;

/// What hard eviction thresholds hold back from pods: memory.available
/// against memory, nodefs.available against ephemeral-storage (the
/// kubelet's hardEvictionReservation). Percentages resolve against capacity.
pub fn eviction_reservation(hard: &[EvictionThreshold], capacity: &ResourceList) -> ResourceList {
    let mut out = ResourceList::new();
    for t in hard.iter().filter(|t| t.is_hard()) {
        let resource = match t.signal {
            EvictionSignal::MemoryAvailable => Resource::Memory,
            EvictionSignal::NodeFsAvailable => Resource::EphemeralStorage,
            _ => continue,
        };
        let cap = capacity.get(&resource).map_or(0, |q| q.value().max(0) as u64);
        out.insert(resource, Quantity::from_units(t.value.resolve(cap).min(i64::MAX as u64) as i64));
    }
    out
}

/// Everything withheld from pods, per resource: kube + system reserved
/// (+ the eviction reservation when given). The kubelet's
/// GetNodeAllocatableReservation, which node status subtracts.
pub fn reservation(
    capacity: &ResourceList,
    kube_reserved: &Reservation,
    system_reserved: &Reservation,
    hard: &[EvictionThreshold],
) -> ResourceList {
    let mut out = ResourceList::new();
    for (r, q) in kube_reserved.iter().chain(system_reserved) {
        let e = out.entry(Resource::from(*r)).or_insert(Quantity::ZERO);
        *e = *e + *q;
    }
    for (r, q) in eviction_reservation(hard, capacity) {
        let e = out.entry(r).or_insert(Quantity::ZERO);
        *e = *e + q;
    }
    out
}

/// capacity − withheld, per resource of capacity, floored at zero.
fn subtract(capacity: &ResourceList, withheld: &ResourceList) -> ResourceList {
    capacity
        .iter()
        .map(|(r, cap)| {
            let v = *cap - withheld.get(r).copied().unwrap_or(Quantity::ZERO);
            (*r, if v.is_negative() { Quantity::ZERO } else { v })
        })
        .collect()
}

/// Node status allocatable: capacity − kubeReserved − systemReserved −
/// hard eviction thresholds, floored at zero, and memory less the
/// pre-allocated huge pages (as the kubelet's node status setter).
/// Resources missing from capacity are missing here too.
pub fn allocatable(
    capacity: &ResourceList,
    kube_reserved: &Reservation,
    system_reserved: &Reservation,
    hard: &[EvictionThreshold],
) -> ResourceList {
    let mut out = subtract(capacity, &reservation(capacity, kube_reserved, system_reserved, hard));
    let huge: Quantity = capacity
        .iter()
        .filter(|(r, _)| matches!(r, Resource::Hugepages(_)))
        .fold(Quantity::ZERO, |acc, (_, q)| acc + *q);
    if let Some(m) = out.get_mut(&Resource::Memory) {
        let v = *m - huge;
        *m = if v.is_negative() { Quantity::ZERO } else { v };
    }
    out
}

/// What the kubepods cgroup is limited to when pods' allocatable is
/// enforced: capacity − kubeReserved − systemReserved (no eviction
/// threshold), floored at zero.
pub fn enforced_allocatable(
    capacity: &ResourceList,
    kube_reserved: &Reservation,
    system_reserved: &Reservation,
) -> ResourceList {
    subtract(capacity, &reservation(capacity, kube_reserved, system_reserved, &[]))
}

/// Capacity, allocatable and the enforced limits of one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAllocatable {
    pub capacity: ResourceList,
    /// For node status and allocatableMemory.available.
    pub allocatable: ResourceList,
    /// The kubepods cgroup's limits: enforced allocatable with
    /// `enforceNodeAllocatable: [pods]`, capacity otherwise (as the kubelet).
    pub kubepods: ResourceList,
}

impl NodeAllocatable {
    pub fn new(capacity: ResourceList, config: &KubeletConfiguration) -> NodeAllocatable {
        let allocatable = allocatable(&capacity, &config.kube_reserved, &config.system_reserved, &config.eviction_hard);
        let kubepods = if config.enforces(crate::config::Enforcement::Pods) {
            enforced_allocatable(&capacity, &config.kube_reserved, &config.system_reserved)
        } else {
            capacity.clone()
        };
        NodeAllocatable { capacity, allocatable, kubepods }
    }
}

/// Pods capacity: maxPods, capped at podsPerCore × cores when set.
pub fn pods_capacity(max_pods: u32, pods_per_core: u32, cores: u64) -> u64 {
    let max = u64::from(max_pods);
    if pods_per_core == 0 { max } else { max.min(u64::from(pods_per_core) * cores) }
}

/// Counts the CPUs in a kernel CPU list such as `0-3,8,10-11`.
pub fn parse_cpu_list(s: &str) -> Option<u64> {
    let mut n = 0;
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
                b.checked_sub(a)? + 1
            }
            None => {
                part.parse::<u64>().ok()?;
                1
            }
        };
    }
    (n > 0).then_some(n)
}

/// The machine's online CPUs, as cAdvisor counts them for the kubelet:
/// /sys/devices/system/cpu/online, else /proc/cpuinfo, else what the
/// standard library sees (which also honours this process's affinity).
pub fn machine_cores() -> u64 {
    fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| parse_cpu_list(&s))
        .or_else(|| procfs::CpuInfo::current().ok().map(|c| c.num_cores() as u64).filter(|n| *n > 0))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64))
}

/// The nearest existing directory at or above `path` (the root dir may not
/// exist yet on first start).
fn existing_ancestor(path: &Path) -> PathBuf {
    path.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/")).to_owned()
}

/// Capacity read from this machine: cores, MemTotal, the size of the
/// filesystem holding `root_dir`, the pid limit, and pods.
pub fn machine_capacity(root_dir: &Path, max_pods: u32, pods_per_core: u32) -> io::Result<ResourceList> {
    let cores = machine_cores();
    let memory = node::mem_total()?;
    let storage = node::statfs(&existing_ancestor(root_dir))
        .map_err(|e| io::Error::new(e.kind(), format!("statfs {}: {e}", root_dir.display())))?;
    let pids = node::pid_limit()?;
    let units = |v: u64| Quantity::from_units(v.min(i64::MAX as u64) as i64);
    let mut list = ResourceList::from([
        (Resource::Cpu, units(cores)),
        (Resource::Memory, units(memory)),
        (Resource::EphemeralStorage, units(storage.capacity_bytes)),
        (Resource::Pid, units(pids)),
        (Resource::Pods, units(pods_capacity(max_pods, pods_per_core, cores))),
    ]);
    // Every page size the host offers, even with no page allocated, as
    // cAdvisor reports them to the kubelet.
    for p in hugepages::host_page_sizes(Path::new(hugepages::SYSFS))? {
        list.insert(Resource::Hugepages(p.bytes), units(p.capacity()));
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::eviction::signal::ThresholdValue;

    fn q(s: &str) -> Quantity {
        s.parse().unwrap()
    }

    fn list(pairs: &[(Resource, &str)]) -> ResourceList {
        pairs.iter().map(|(r, v)| (*r, q(v))).collect()
    }

    fn reserved(pairs: &[(ReservedResource, &str)]) -> Reservation {
        pairs.iter().map(|(r, v)| (*r, q(v))).collect()
    }

    fn hard(signal: EvictionSignal, value: ThresholdValue) -> EvictionThreshold {
        EvictionThreshold { signal, value, grace_period: Duration::ZERO, min_reclaim: None }
    }

    fn pct(p: f64) -> ThresholdValue {
        ThresholdValue::Percentage(p)
    }

    fn qty(s: &str) -> ThresholdValue {
        ThresholdValue::Quantity(q(s))
    }

    use EvictionSignal::{MemoryAvailable as Mem, NodeFsAvailable as NodeFs};
    use ReservedResource as R;
    use Resource::*;

    /// The reference notes' example: 32Gi, 16 CPUs, 100Gi of storage,
    /// kube-reserved cpu=1,memory=2Gi,ephemeral-storage=1Gi,
    /// system-reserved cpu=500m,memory=1Gi,ephemeral-storage=1Gi,
    /// eviction-hard memory.available<500Mi,nodefs.available<10%.
    #[test]
    fn reference_example() {
        let capacity = list(&[(Cpu, "16"), (Memory, "32Gi"), (EphemeralStorage, "100Gi"), (Pods, "110")]);
        let kube = reserved(&[(R::Cpu, "1"), (R::Memory, "2Gi"), (R::EphemeralStorage, "1Gi")]);
        let system = reserved(&[(R::Cpu, "500m"), (R::Memory, "1Gi"), (R::EphemeralStorage, "1Gi")]);
        let thresholds = [hard(Mem, qty("500Mi")), hard(NodeFs, pct(0.10))];
        let a = allocatable(&capacity, &kube, &system, &thresholds);
        assert_eq!(a[&Cpu], q("14.5"));
        assert_eq!(a[&Cpu].milli_value(), 14_500);
        // 32Gi − 2Gi − 1Gi − 500Mi; the notes round 500Mi to 0.5Gi and say
        // "28.5Gi" (it is 28.51Gi, 12Mi more).
        assert_eq!(a[&Memory], q("32Gi") - q("2Gi") - q("1Gi") - q("500Mi"));
        assert_eq!(a[&Memory].value(), 30_614_224_896);
        assert!(a[&Memory].value() - q("28.5Gi").value() == 12 << 20);
        assert_eq!(a[&EphemeralStorage], q("88Gi"));
        assert_eq!(a[&Pods], q("110"));
        // Eviction starts at 31.5Gi (32Gi − 500Mi) and 90Gi of use without
        // reservations: the reservation holds exactly the thresholds.
        let e = eviction_reservation(&thresholds, &capacity);
        assert_eq!(e, list(&[(Memory, "500Mi"), (EphemeralStorage, "10Gi")]));
        // kubepods is limited to capacity − reserved only.
        let enforced = enforced_allocatable(&capacity, &kube, &system);
        assert_eq!(enforced[&Memory], q("29Gi"));
        assert_eq!(enforced[&Cpu], q("14.5"));
        assert_eq!(enforced[&EphemeralStorage], q("98Gi"));
    }

    #[test]
    fn allocatable_table() {
        struct Case {
            name: &'static str,
            capacity: ResourceList,
            kube: Reservation,
            system: Reservation,
            hard: Vec<EvictionThreshold>,
            want: ResourceList,
        }
        let cases = vec![
            Case {
                name: "huge pages are allocatable as they are and leave memory",
                capacity: list(&[(Memory, "8Gi"), (Hugepages(2 << 20), "1Gi"), (Hugepages(1 << 30), "0")]),
                kube: reserved(&[(ReservedResource::Memory, "1Gi")]),
                system: reserved(&[]),
                hard: vec![],
                want: list(&[(Memory, "6Gi"), (Hugepages(2 << 20), "1Gi"), (Hugepages(1 << 30), "0")]),
            },
            Case {
                name: "nothing reserved",
                capacity: list(&[(Cpu, "2"), (Memory, "4Gi")]),
                kube: reserved(&[]),
                system: reserved(&[]),
                hard: vec![],
                want: list(&[(Cpu, "2"), (Memory, "4Gi")]),
            },
            Case {
                name: "percent thresholds resolve against capacity",
                capacity: list(&[(Memory, "10Gi"), (EphemeralStorage, "200Gi")]),
                kube: reserved(&[]),
                system: reserved(&[]),
                hard: vec![hard(Mem, pct(0.05)), hard(NodeFs, pct(0.15))],
                want: list(&[(Memory, "9728Mi"), (EphemeralStorage, "170Gi")]),
            },
            Case {
                name: "other signals hold nothing back",
                capacity: list(&[(Memory, "8Gi"), (EphemeralStorage, "50Gi"), (Pid, "4096")]),
                kube: reserved(&[]),
                system: reserved(&[]),
                hard: vec![
                    hard(EvictionSignal::ImageFsAvailable, pct(0.15)),
                    hard(EvictionSignal::NodeFsInodesFree, pct(0.05)),
                    hard(EvictionSignal::PidAvailable, qty("100")),
                    hard(EvictionSignal::AllocatableMemoryAvailable, qty("1Gi")),
                ],
                want: list(&[(Memory, "8Gi"), (EphemeralStorage, "50Gi"), (Pid, "4096")]),
            },
            Case {
                name: "soft thresholds hold nothing back",
                capacity: list(&[(Memory, "8Gi")]),
                kube: reserved(&[]),
                system: reserved(&[]),
                hard: vec![EvictionThreshold {
                    signal: Mem,
                    value: qty("1Gi"),
                    grace_period: Duration::from_secs(30),
                    min_reclaim: None,
                }],
                want: list(&[(Memory, "8Gi")]),
            },
            Case {
                name: "reserved larger than capacity floors at zero",
                capacity: list(&[(Cpu, "2"), (Memory, "1Gi"), (EphemeralStorage, "10Gi")]),
                kube: reserved(&[(R::Cpu, "3"), (R::Memory, "512Mi")]),
                system: reserved(&[(R::Memory, "512Mi")]),
                hard: vec![hard(Mem, qty("1Mi")), hard(NodeFs, pct(1.0))],
                want: list(&[(Cpu, "0"), (Memory, "0"), (EphemeralStorage, "0")]),
            },
            Case {
                name: "resources missing from capacity stay missing",
                capacity: list(&[(Cpu, "4")]),
                kube: reserved(&[(R::Memory, "1Gi"), (R::EphemeralStorage, "1Gi")]),
                system: reserved(&[(R::Cpu, "250m")]),
                hard: vec![hard(Mem, qty("100Mi"))],
                want: list(&[(Cpu, "3750m")]),
            },
            Case {
                name: "pid reservations",
                capacity: list(&[(Pid, "4194304"), (Pods, "110")]),
                kube: reserved(&[(R::Pid, "1000")]),
                system: reserved(&[(R::Pid, "24")]),
                hard: vec![],
                want: list(&[(Pid, "4193280"), (Pods, "110")]),
            },
            Case {
                name: "milli-cpu reservations",
                capacity: list(&[(Cpu, "3")]),
                kube: reserved(&[(R::Cpu, "100m")]),
                system: reserved(&[(R::Cpu, "150m")]),
                hard: vec![],
                want: list(&[(Cpu, "2750m")]),
            },
        ];
        for c in cases {
            assert_eq!(allocatable(&c.capacity, &c.kube, &c.system, &c.hard), c.want, "{}", c.name);
        }
    }

    #[test]
    fn node_allocatable_follows_enforcement() {
        let capacity = list(&[(Cpu, "4"), (Memory, "8Gi"), (Pid, "1000")]);
        let mut config = KubeletConfiguration {
            kube_reserved: reserved(&[(R::Memory, "1Gi"), (R::Pid, "100")]),
            eviction_hard: vec![hard(Mem, qty("512Mi"))],
            ..Default::default()
        };
        let n = NodeAllocatable::new(capacity.clone(), &config);
        assert_eq!(n.allocatable[&Memory], q("6656Mi"));
        assert_eq!(n.kubepods, list(&[(Cpu, "4"), (Memory, "7Gi"), (Pid, "900")]));
        config.enforce_node_allocatable.clear();
        let n = NodeAllocatable::new(capacity.clone(), &config);
        assert_eq!(n.kubepods, capacity, "without enforcement kubepods gets capacity, as the kubelet");
    }

    #[test]
    fn pods_capacity_table() {
        for (max, per_core, cores, want) in [(110, 0, 16, 110), (110, 5, 16, 80), (110, 10, 16, 110), (0, 0, 4, 0)] {
            assert_eq!(pods_capacity(max, per_core, cores), want, "{max} {per_core} {cores}");
        }
    }

    #[test]
    fn cpu_lists() {
        for (s, want) in
            [("0-1\n", Some(2)), ("0", Some(1)), ("0-3,8,10-11", Some(7)), ("", None), ("3-1", None), ("x", None)]
        {
            assert_eq!(parse_cpu_list(s), want, "{s:?}");
        }
    }

    #[test]
    fn this_machine_has_capacity() {
        let c = machine_capacity(Path::new("/nonexistent/kubelet/root"), 110, 0).unwrap();
        assert!(c[&Cpu] >= q("1"));
        assert!(c[&Memory] > q("64Mi"));
        assert!(c[&EphemeralStorage] > Quantity::ZERO, "statfs of the nearest existing ancestor");
        assert!(c[&Pid] > Quantity::ZERO);
        assert_eq!(c[&Pods], q("110"));
        assert_eq!(q(&machine_cores().to_string()), c[&Cpu]);
    }
}
