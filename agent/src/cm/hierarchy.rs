//! The limits of the pods' cgroup hierarchy under cgroupRoot: `kubepods`,
//! `kubepods/burstable`, `kubepods/besteffort` and one cgroup per pod
//! (Guaranteed pods directly under kubepods), as the kubelet computes them.
//! Pure: `pod_cgroups::PodCgroups` applies them through the driver.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, PodSpec};

use super::{
    allocatable::{Resource, ResourceList},
    naming::{MIN_SHARES, QUOTA_PERIOD_US, milli_cpu_to_quota, milli_cpu_to_shares},
    qos::{QosClass, container_resources, qos_class},
};
use crate::{
    cgroups::CpuLimits,
    config::{Reservation, ReservedResource},
    quantity::Quantity,
};

/// Settings of one cgroup, in the kubelet's terms (its ResourceConfig).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupLimits {
    /// Bytes; None leaves the memory limit unset.
    pub memory: Option<u64>,
    pub cpu: CpuLimits,
    /// pids.max; None leaves it unlimited.
    pub pids: Option<u64>,
    /// (page size, limit) in bytes for each huge page size the host has;
    /// empty leaves the hugetlb controller alone.
    pub hugetlb: Vec<(u64, u64)>,
}

/// The kubepods cgroup: memory limit, cpu shares (no CFS quota) and
/// pids.max from `limits` (enforced allocatable, or capacity when
/// allocatable is not enforced; see `NodeAllocatable::kubepods`).
pub fn kubepods_limits(limits: &ResourceList) -> CgroupLimits {
    CgroupLimits {
        memory: limits.get(&Resource::Memory).map(|q| q.value().max(0) as u64),
        cpu: CpuLimits {
            shares: limits.get(&Resource::Cpu).map(|q| milli_cpu_to_shares(q.milli_value())),
            quota_us: None,
            period_us: QUOTA_PERIOD_US,
        },
        pids: limits.get(&Resource::Pid).map(|q| q.value().max(0) as u64),
        hugetlb: vec![],
    }
}

/// Limits of the kubeReservedCgroup / systemReservedCgroup when the
/// kubelet enforces `kube-reserved` / `system-reserved` (memory, cpu
/// shares and pids.max from the reservation), or only cpu shares for the
/// `-compressible` forms (the kubelet's getCgroupConfig).
pub fn reserved_cgroup_limits(reserved: &Reservation, compressible_only: bool) -> CgroupLimits {
    let shares = reserved.get(&ReservedResource::Cpu).map(|q| milli_cpu_to_shares(q.milli_value()));
    let cpu = CpuLimits { shares, quota_us: None, period_us: QUOTA_PERIOD_US };
    if compressible_only {
        return CgroupLimits { memory: None, cpu, pids: None, hugetlb: vec![] };
    }
    CgroupLimits {
        memory: reserved.get(&ReservedResource::Memory).map(|q| q.value().max(0) as u64),
        cpu,
        pids: reserved.get(&ReservedResource::Pid).map(|q| q.value().max(0) as u64),
        hugetlb: vec![],
    }
}

/// cpu (milli) and memory (bytes) of a container or a pod.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct CpuMem {
    cpu_milli: i64,
    memory: i64,
}

impl CpuMem {
    fn add(self, o: CpuMem) -> CpuMem {
        CpuMem { cpu_milli: self.cpu_milli.saturating_add(o.cpu_milli), memory: self.memory.saturating_add(o.memory) }
    }

    fn max(self, o: CpuMem) -> CpuMem {
        CpuMem { cpu_milli: self.cpu_milli.max(o.cpu_milli), memory: self.memory.max(o.memory) }
    }
}

fn milli(q: Option<Quantity>) -> i64 {
    q.map_or(0, |q| q.milli_value().max(0))
}

fn bytes(q: Option<Quantity>) -> i64 {
    q.map_or(0, |q| q.value().max(0))
}

fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// The pod's effective requests or limits, as the kubelet's PodRequests /
/// PodLimits: the sum over app containers and sidecars (restartable init
/// containers), or the largest init container plus the sidecars started
/// before it if that is more, plus the pod overhead.
fn pod_total(spec: &PodSpec, of: impl Fn(&Container) -> CpuMem) -> CpuMem {
    let mut total = spec.containers.iter().map(&of).fold(CpuMem::default(), CpuMem::add);
    let mut sidecars = CpuMem::default();
    let mut init_peak = CpuMem::default();
    for c in spec.init_containers.iter().flatten() {
        let own = of(c);
        let running = if is_sidecar(c) {
            total = total.add(own);
            sidecars = sidecars.add(own);
            sidecars
        } else {
            own.add(sidecars)
        };
        init_peak = init_peak.max(running);
    }
    total.max(init_peak)
}

fn overhead(spec: &PodSpec) -> CpuMem {
    let get = |k: &str| spec.overhead.as_ref().and_then(|o| o.get(k)).and_then(|q| q.0.parse::<Quantity>().ok());
    CpuMem { cpu_milli: milli(get("cpu")), memory: bytes(get("memory")) }
}

/// The pod's effective cpu (milli) and memory (bytes) requests, as the
/// scheduler and admission count them (PodRequests: regular containers and
/// sidecars summed, the largest init container's peak, plus overhead).
pub fn pod_requests(spec: &PodSpec) -> (i64, i64) {
    let r = pod_total(spec, |c| {
        let r = container_resources(c);
        CpuMem { cpu_milli: milli(r.cpu_request), memory: bytes(r.memory_request) }
    })
    .add(overhead(spec));
    (r.cpu_milli, r.memory)
}

/// The pod's effective cpu (milli) and memory (bytes) limits, summed as
/// the kubelet's PodLimits (containers without a limit add nothing; the
/// overhead is added only to a limit that is set). Zero: no limit.
pub fn pod_limits(spec: &PodSpec) -> (i64, i64) {
    let r = pod_total(spec, |c| {
        let r = container_resources(c);
        CpuMem { cpu_milli: milli(r.cpu_limit), memory: bytes(r.memory_limit) }
    });
    let o = overhead(spec);
    let plus = |v: i64, extra: i64| if v > 0 { v + extra } else { 0 };
    (plus(r.cpu_milli, o.cpu_milli), plus(r.memory, o.memory))
}

/// The pod cgroup's settings (the kubelet's ResourceConfigForPod):
/// - cpu shares from the sum of cpu requests (2 for BestEffort);
/// - CFS quota from the sum of cpu limits, only when every container has
///   one (always for Guaranteed) and `cpu_cfs_quota` is on;
/// - memory limit = the sum of memory limits, only when every container has
///   one;
/// - pids.max = podPidsLimit when positive.
pub fn pod_cgroup_config(spec: &PodSpec, cpu_cfs_quota: bool, period: Duration, pod_pids_limit: i64) -> CgroupLimits {
    let period_us = period.as_micros().clamp(1_000, 1_000_000) as u64;
    let all = || spec.containers.iter().chain(spec.init_containers.iter().flatten());
    let cpu_limits_declared = all().all(|c| milli(container_resources(c).cpu_limit) > 0);
    let memory_limits_declared = all().all(|c| bytes(container_resources(c).memory_limit) > 0);
    let over = overhead(spec);
    let requests = pod_total(spec, |c| {
        let r = container_resources(c);
        CpuMem { cpu_milli: milli(r.cpu_request), memory: bytes(r.memory_request) }
    })
    .add(over);
    let limits = pod_total(spec, |c| {
        let r = container_resources(c);
        CpuMem { cpu_milli: milli(r.cpu_limit), memory: bytes(r.memory_limit) }
    })
    .add(over);
    let quota = if cpu_cfs_quota { milli_cpu_to_quota(limits.cpu_milli, period_us) } else { None };
    let pids = (pod_pids_limit > 0).then_some(pod_pids_limit as u64);
    let mut cfg = CgroupLimits {
        memory: None,
        cpu: CpuLimits { shares: None, quota_us: None, period_us },
        pids,
        hugetlb: vec![],
    };
    match qos_class(spec) {
        QosClass::Guaranteed => {
            cfg.cpu.shares = Some(milli_cpu_to_shares(requests.cpu_milli));
            cfg.cpu.quota_us = quota;
            cfg.memory = Some(limits.memory as u64);
        }
        QosClass::Burstable => {
            cfg.cpu.shares = Some(milli_cpu_to_shares(requests.cpu_milli));
            if cpu_limits_declared {
                cfg.cpu.quota_us = quota;
            }
            if memory_limits_declared {
                cfg.memory = Some(limits.memory as u64);
            }
        }
        QosClass::BestEffort => cfg.cpu.shares = Some(MIN_SHARES),
    }
    cfg
}

/// The pod cgroup's huge page limits (the kubelet's HugePageLimits of the
/// pod's requests): for each of the host's page sizes, what the pod's
/// containers ask for, summed as PodRequests sums them; 0 for a size the
/// pod does not ask for, so it cannot take pages it did not request.
pub fn pod_hugetlb_limits(spec: &PodSpec, host_sizes: &[u64]) -> Vec<(u64, u64)> {
    host_sizes
        .iter()
        .map(|&size| {
            let of = |c: &Container| {
                let r = c.resources.as_ref();
                // Huge pages are requested through limits (requests default to them).
                let q = r
                    .and_then(|r| r.requests.as_ref())
                    .into_iter()
                    .chain(r.and_then(|r| r.limits.as_ref()))
                    .flatten()
                    .find(|(name, _)| super::hugepages::page_bytes(name) == Some(size))
                    .and_then(|(_, q)| q.0.parse::<Quantity>().ok());
                CpuMem { cpu_milli: 0, memory: bytes(q) }
            };
            (size, pod_total(spec, of).memory.max(0) as u64)
        })
        .collect()
}

/// The QoS cgroups' limits: BestEffort gets the minimum cpu shares,
/// Burstable the shares of its pods' summed cpu requests (the kubelet's QoS
/// container manager), neither a memory limit.
pub fn qos_cgroup_limits(qos: QosClass, burstable_request_milli: i64) -> CgroupLimits {
    let shares = match qos {
        QosClass::Burstable => milli_cpu_to_shares(burstable_request_milli),
        QosClass::BestEffort | QosClass::Guaranteed => MIN_SHARES,
    };
    CgroupLimits {
        cpu: CpuLimits { shares: Some(shares), quota_us: None, period_us: QUOTA_PERIOD_US },
        ..Default::default()
    }
}

/// The cpu requests (milli) of a Burstable pod, which the Burstable QoS
/// cgroup's shares follow; 0 for other classes.
pub fn burstable_cpu_request(spec: &PodSpec) -> i64 {
    if qos_class(spec) == QosClass::Burstable { pod_requests(spec).0 } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::test_support::{container, res, reservation, spec};

    const P: Duration = Duration::from_millis(100);
    const MI: u64 = 1 << 20;

    fn cpu(shares: u64, quota: Option<i64>) -> CpuLimits {
        CpuLimits { shares: Some(shares), quota_us: quota, period_us: 100_000 }
    }

    #[test]
    fn pod_cgroup_config_table() {
        let sidecar = |mut c: Container| {
            c.restart_policy = Some("Always".into());
            c
        };
        let cases: Vec<(&str, PodSpec, CgroupLimits)> = vec![
            (
                "best effort",
                spec(vec![container(&[], &[]), container(&[], &[])]),
                CgroupLimits { memory: None, cpu: cpu(2, None), pids: None, hugetlb: vec![] },
            ),
            (
                "guaranteed: sums of limits",
                spec(vec![
                    container(&[], &[("cpu", "500m"), ("memory", "128Mi")]),
                    container(&[], &[("cpu", "250m"), ("memory", "64Mi")]),
                ]),
                CgroupLimits { memory: Some(192 * MI), cpu: cpu(768, Some(75_000)), pids: None, hugetlb: vec![] },
            ),
            (
                "burstable with all limits",
                spec(vec![
                    container(&[("cpu", "100m"), ("memory", "64Mi")], &[("cpu", "1"), ("memory", "256Mi")]),
                    container(&[("cpu", "100m")], &[("cpu", "1"), ("memory", "256Mi")]),
                ]),
                CgroupLimits { memory: Some(512 * MI), cpu: cpu(204, Some(200_000)), pids: None, hugetlb: vec![] },
            ),
            (
                "burstable with a container lacking limits: no quota, no memory limit",
                spec(vec![
                    container(&[("cpu", "500m")], &[("cpu", "1"), ("memory", "1Gi")]),
                    container(&[("memory", "1Gi")], &[]),
                ]),
                CgroupLimits { memory: None, cpu: cpu(512, None), pids: None, hugetlb: vec![] },
            ),
            (
                "burstable with memory limits only",
                spec(vec![container(&[("cpu", "200m")], &[("memory", "100Mi")])]),
                CgroupLimits { memory: Some(100 * MI), cpu: cpu(204, None), pids: None, hugetlb: vec![] },
            ),
            (
                "an init container larger than the app containers",
                PodSpec {
                    init_containers: Some(vec![container(&[], &[("cpu", "2"), ("memory", "1Gi")])]),
                    ..spec(vec![container(&[], &[("cpu", "1"), ("memory", "512Mi")])])
                },
                CgroupLimits { memory: Some(1024 * MI), cpu: cpu(2048, Some(200_000)), pids: None, hugetlb: vec![] },
            ),
            (
                "a sidecar adds to the app containers",
                PodSpec {
                    init_containers: Some(vec![sidecar(container(&[], &[("cpu", "500m"), ("memory", "100Mi")]))]),
                    ..spec(vec![container(&[], &[("cpu", "1"), ("memory", "200Mi")])])
                },
                CgroupLimits { memory: Some(300 * MI), cpu: cpu(1536, Some(150_000)), pids: None, hugetlb: vec![] },
            ),
            (
                "overhead is added",
                PodSpec {
                    overhead: res(&[("cpu", "250m"), ("memory", "120Mi")]),
                    ..spec(vec![container(&[], &[("cpu", "1"), ("memory", "1Gi")])])
                },
                CgroupLimits { memory: Some(1144 * MI), cpu: cpu(1280, Some(125_000)), pids: None, hugetlb: vec![] },
            ),
        ];
        for (name, s, want) in cases {
            assert_eq!(pod_cgroup_config(&s, true, P, -1), want, "{name}");
        }
    }

    #[test]
    fn quota_off_and_pids() {
        let s = spec(vec![container(&[], &[("cpu", "1"), ("memory", "1Gi")])]);
        let cfg = pod_cgroup_config(&s, false, P, 1024);
        assert_eq!(cfg.cpu.quota_us, None, "cpuCFSQuota=false: no quota");
        assert_eq!(cfg.pids, Some(1024));
        let period = pod_cgroup_config(&s, true, Duration::from_millis(50), 0);
        assert_eq!((period.cpu.period_us, period.cpu.quota_us), (50_000, Some(50_000)));
        assert_eq!(period.pids, None, "podPidsLimit 0 or -1: no per-pod limit");
    }

    #[test]
    fn kubepods_limits_from_allocatable() {
        let limits = ResourceList::from([
            (Resource::Cpu, "14.5".parse().unwrap()),
            (Resource::Memory, "29Gi".parse().unwrap()),
            (Resource::Pid, "1000".parse().unwrap()),
            (Resource::Pods, "110".parse().unwrap()),
        ]);
        let k = kubepods_limits(&limits);
        assert_eq!(k.memory, Some(29 << 30));
        assert_eq!(k.cpu, CpuLimits { shares: Some(14_848), quota_us: None, period_us: 100_000 });
        assert_eq!(k.pids, Some(1000));
        let nothing = CpuLimits { shares: None, quota_us: None, period_us: 100_000 };
        assert_eq!(
            kubepods_limits(&ResourceList::new()),
            CgroupLimits { memory: None, cpu: nothing, pids: None, hugetlb: vec![] }
        );
    }

    #[test]
    fn reserved_cgroups() {
        let r = reservation();
        let full = reserved_cgroup_limits(&r, false);
        assert_eq!(
            full,
            CgroupLimits { memory: Some(1 << 30), cpu: cpu(512, None), pids: Some(1000), hugetlb: vec![] }
        );
        let compressible = reserved_cgroup_limits(&r, true);
        assert_eq!(compressible, CgroupLimits { memory: None, cpu: cpu(512, None), pids: None, hugetlb: vec![] });
    }

    #[test]
    fn hugetlb_limits_cover_every_host_size() {
        const MI2: u64 = 2 << 20;
        const GI1: u64 = 1 << 30;
        let one = container(&[], &[("hugepages-2Mi", "100Mi"), ("memory", "1Gi"), ("cpu", "1")]);
        let two = container(&[("hugepages-2Mi", "20Mi")], &[("hugepages-2Mi", "20Mi")]);
        let s = spec(vec![one, two]);
        assert_eq!(
            pod_hugetlb_limits(&s, &[MI2, GI1]),
            vec![(MI2, 120 << 20), (GI1, 0)],
            "summed; 0 for sizes not asked for"
        );
        assert!(pod_hugetlb_limits(&s, &[]).is_empty(), "no hugetlb controller: nothing to set");
        let init = PodSpec { init_containers: Some(vec![container(&[], &[("hugepages-1Gi", "2Gi")])]), ..spec(vec![]) };
        assert_eq!(pod_hugetlb_limits(&init, &[GI1]), vec![(GI1, 2 << 30)], "an init container's peak counts");
    }

    #[test]
    fn qos_cgroups_follow_the_burstable_requests() {
        assert_eq!(qos_cgroup_limits(QosClass::BestEffort, 5_000).cpu.shares, Some(2));
        assert_eq!(qos_cgroup_limits(QosClass::Burstable, 0).cpu.shares, Some(2));
        assert_eq!(qos_cgroup_limits(QosClass::Burstable, 750).cpu.shares, Some(768));
        assert_eq!(qos_cgroup_limits(QosClass::Burstable, 750).memory, None);
        let burstable =
            spec(vec![container(&[("cpu", "500m")], &[]), container(&[("cpu", "250m")], &[("memory", "1Gi")])]);
        assert_eq!(burstable_cpu_request(&burstable), 750);
        let guaranteed = spec(vec![container(&[], &[("cpu", "1"), ("memory", "1Gi")])]);
        assert_eq!(burstable_cpu_request(&guaranteed), 0);
    }
}
