//! The node's resources and how pods share them: the cgroup layout
//! (cgroupRoot, cgroupDriver), the per-pod limits (pods per node, PIDs,
//! CFS quota), what is reserved for the system and the kubelet, what of
//! that is enforced, and local storage isolation.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use super::{
    configuration::{KubeletConfiguration, SECOND},
    non_negative,
};
use crate::{
    config::{
        CgroupDriver, duration,
        error::ConfigError,
        tree::Node,
        values::{self, Ctx, Object},
    },
    quantity::Quantity,
};

/// A resource kubeReserved / systemReserved may reserve.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReservedResource {
    Cpu,
    Memory,
    EphemeralStorage,
    Pid,
}

impl ReservedResource {
    pub const ALL: [ReservedResource; 4] =
        [ReservedResource::Cpu, ReservedResource::Memory, ReservedResource::EphemeralStorage, ReservedResource::Pid];

    pub fn name(self) -> &'static str {
        match self {
            ReservedResource::Cpu => "cpu",
            ReservedResource::Memory => "memory",
            ReservedResource::EphemeralStorage => "ephemeral-storage",
            ReservedResource::Pid => "pid",
        }
    }

    pub fn from_name(s: &str) -> Option<ReservedResource> {
        ReservedResource::ALL.into_iter().find(|r| r.name() == s)
    }
}

/// kubeReserved or systemReserved.
pub type Reservation = BTreeMap<ReservedResource, Quantity>;

/// An entry of enforceNodeAllocatable (`none` is the empty set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Enforcement {
    Pods,
    SystemReserved,
    SystemReservedCompressible,
    KubeReserved,
    KubeReservedCompressible,
}

impl Enforcement {
    pub const ALL: [Enforcement; 5] = [
        Enforcement::Pods,
        Enforcement::SystemReserved,
        Enforcement::SystemReservedCompressible,
        Enforcement::KubeReserved,
        Enforcement::KubeReservedCompressible,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Enforcement::Pods => "pods",
            Enforcement::SystemReserved => "system-reserved",
            Enforcement::SystemReservedCompressible => "system-reserved-compressible",
            Enforcement::KubeReserved => "kube-reserved",
            Enforcement::KubeReservedCompressible => "kube-reserved-compressible",
        }
    }
}

/// Reads the cgroup layout, the per-pod limits, the reservations and their
/// enforcement, and localStorageCapacityIsolation. `root` is the whole
/// configuration, where an error about a pair of fields points when the
/// one it names is unset.
pub(super) fn read(cx: &Ctx, root: &Node, o: &mut Object, c: &mut KubeletConfiguration) -> Result<(), ConfigError> {
    read_cgroups(cx, root, o, c)?;
    read_pod_limits(cx, o, c)?;
    read_reservations(cx, o, c)?;
    if let Some(v) = o.boolean("localStorageCapacityIsolation")? {
        c.local_storage_capacity_isolation = v;
    }
    Ok(())
}

/// cgroupRoot and cgroupDriver; with the systemd driver the root must be
/// a slice name.
fn read_cgroups(cx: &Ctx, root: &Node, o: &mut Object, c: &mut KubeletConfiguration) -> Result<(), ConfigError> {
    if let Some(v) = o.string("cgroupRoot")?.filter(|s| !s.is_empty()) {
        c.cgroup_root = v;
    }
    if let Some(n) = o.get("cgroupDriver") {
        c.cgroup_driver = match cx.string(n, "cgroupDriver")?.as_str() {
            "" | "cgroupfs" => CgroupDriver::Cgroupfs,
            "systemd" => CgroupDriver::Systemd,
            other => return Err(cx.err(n, "cgroupDriver", format!("{other:?} is not one of cgroupfs, systemd"))),
        };
    }
    if c.cgroup_driver == CgroupDriver::Systemd
        && let Err(e) = crate::config::systemd_root_parts(&c.cgroup_root)
    {
        let n = root.get("cgroupRoot").or_else(|| root.get("cgroupDriver")).unwrap_or(root);
        return Err(cx.err(n, "cgroupRoot", e));
    }
    Ok(())
}

/// maxPods, podsPerCore, podPidsLimit, cpuCFSQuota and cpuCFSQuotaPeriod.
fn read_pod_limits(cx: &Ctx, o: &mut Object, c: &mut KubeletConfiguration) -> Result<(), ConfigError> {
    if let Some(v) = non_negative(o, "maxPods")?.filter(|v| *v != 0) {
        c.max_pods = v;
    }
    if let Some(v) = non_negative(o, "podsPerCore")? {
        c.pods_per_core = v;
    }
    if let Some(v) = o.int_in("podPidsLimit", i64::MIN, i64::MAX)? {
        c.pod_pids_limit = if v <= 0 { -1 } else { v };
    }
    if let Some(v) = o.boolean("cpuCFSQuota")? {
        c.cpu_cfs_quota = v;
    }
    if let Some(n) = o.get("cpuCFSQuotaPeriod") {
        let d = cx.duration(n, "cpuCFSQuotaPeriod")?;
        if d < Duration::from_millis(1) || d > SECOND {
            return Err(cx.err(n, "cpuCFSQuotaPeriod", format!("{} must be between 1ms and 1s", duration::format(d))));
        }
        c.cpu_cfs_quota_period = d;
    }
    Ok(())
}

/// systemReserved, kubeReserved, their cgroups and enforceNodeAllocatable
/// (after the cgroups, which some enforcements need).
fn read_reservations(cx: &Ctx, o: &mut Object, c: &mut KubeletConfiguration) -> Result<(), ConfigError> {
    if let Some(n) = o.get("systemReserved") {
        c.system_reserved = read_reservation(cx, n, "systemReserved")?;
    }
    if let Some(n) = o.get("kubeReserved") {
        c.kube_reserved = read_reservation(cx, n, "kubeReserved")?;
    }
    c.system_reserved_cgroup = o.string("systemReservedCgroup")?.filter(|s| !s.is_empty());
    c.kube_reserved_cgroup = o.string("kubeReservedCgroup")?.filter(|s| !s.is_empty());
    if let Some(n) = o.get("enforceNodeAllocatable") {
        c.enforce_node_allocatable = read_enforcement(cx, n, c)?;
    }
    Ok(())
}

fn read_reservation(cx: &Ctx, node: &Node, field: &str) -> Result<Reservation, ConfigError> {
    let mut out = Reservation::new();
    for (k, raw, n) in cx.string_map(node, field)? {
        let Some(r) = ReservedResource::from_name(&k) else {
            return Err(cx.err(n, field, format!("cannot reserve {k:?} (only cpu, memory, ephemeral-storage, pid)")));
        };
        let q: Quantity =
            raw.parse().map_err(|e| cx.err(n, field, format!("{k:?}: {}", values::quantity_problem(&raw, &e))))?;
        if q.is_negative() {
            return Err(cx.err(n, field, format!("{k:?}: {raw:?} must not be negative")));
        }
        out.insert(r, q);
    }
    Ok(out)
}

fn read_enforcement(cx: &Ctx, node: &Node, c: &KubeletConfiguration) -> Result<BTreeSet<Enforcement>, ConfigError> {
    let field = "enforceNodeAllocatable";
    let items = cx.list(node, field)?;
    let mut out = BTreeSet::new();
    let mut none = None;
    for item in items {
        let s = cx.string(item, field)?;
        match s.as_str() {
            "" => {}
            "none" => none = Some(item),
            _ => {
                let Some(e) = Enforcement::ALL.into_iter().find(|e| e.as_str() == s) else {
                    return Err(cx.err(
                        item,
                        field,
                        format!(
                            "{s:?} is not one of none, pods, system-reserved, system-reserved-compressible, \
                             kube-reserved, kube-reserved-compressible"
                        ),
                    ));
                };
                let (cgroup, cgroup_field) = match e {
                    Enforcement::SystemReserved | Enforcement::SystemReservedCompressible => {
                        (&c.system_reserved_cgroup, "systemReservedCgroup (--system-reserved-cgroup)")
                    }
                    Enforcement::KubeReserved | Enforcement::KubeReservedCompressible => {
                        (&c.kube_reserved_cgroup, "kubeReservedCgroup (--kube-reserved-cgroup)")
                    }
                    Enforcement::Pods => (&None, ""),
                };
                if e != Enforcement::Pods && cgroup.is_none() {
                    return Err(cx.err(item, field, format!("{s:?} needs {cgroup_field}")));
                }
                out.insert(e);
            }
        }
    }
    for (a, b) in [
        (Enforcement::SystemReserved, Enforcement::SystemReservedCompressible),
        (Enforcement::KubeReserved, Enforcement::KubeReservedCompressible),
    ] {
        if out.contains(&a) && out.contains(&b) {
            return Err(cx.err(node, field, format!("{:?} and {:?} exclude each other", a.as_str(), b.as_str())));
        }
    }
    if let Some(n) = none
        && !out.is_empty()
    {
        return Err(cx.err(n, field, "\"none\" cannot be combined with other enforcements"));
    }
    Ok(out)
}
