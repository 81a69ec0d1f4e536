//! The limits of the pods' cgroup hierarchy under cgroupRoot: `kubepods`,
//! `kubepods/burstable`, `kubepods/besteffort` and one cgroup per pod
//! (Guaranteed pods directly under kubepods), as the kubelet computes them.
//! Pure: `pod_cgroups::PodCgroups` applies them through the driver.

use std::time::Duration;

use k8s_openapi::api::core::v1::PodSpec;

use super::{
    allocatable::{Resource, ResourceList},
    naming::{MIN_SHARES, QUOTA_PERIOD_US, milli_cpu_to_quota, milli_cpu_to_shares},
    pod_level,
    qos::{QosClass, qos_class},
};
use crate::{
    cgroups::CpuLimits,
    config::{Reservation, ReservedResource},
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

/// The pod's effective cpu (milli) and memory (bytes) requests, as the
/// scheduler and admission count them (PodRequests: regular containers and
/// sidecars summed, the largest init container's peak, pod-level requests
/// where `spec.resources` sets them, plus overhead).
pub fn pod_requests(spec: &PodSpec) -> (i64, i64) {
    let r = pod_level::pod_requests(spec);
    (pod_level::milli(&r, "cpu"), pod_level::value(&r, "memory"))
}

/// The pod's effective cpu (milli) and memory (bytes) limits, as the
/// kubelet's PodLimits (containers without a limit add nothing, a
/// pod-level limit replaces the containers' sum, the overhead is added
/// only to a limit that is set). Zero: no limit.
pub fn pod_limits(spec: &PodSpec) -> (i64, i64) {
    let l = pod_level::pod_limits(spec);
    (pod_level::milli(&l, "cpu"), pod_level::value(&l, "memory"))
}

/// The pod cgroup's settings (the kubelet's ResourceConfigForPod):
/// - cpu shares from the pod's cpu requests (2 for BestEffort);
/// - CFS quota from the pod's cpu limit, only when every container has
///   one or the pod level sets one (always for Guaranteed) and
///   `cpu_cfs_quota` is on;
/// - memory limit = the pod's memory limit, only when every container has
///   one or the pod level sets one;
/// - pids.max = podPidsLimit when positive.
///
/// Requests and limits are PodRequests / PodLimits, so pod-level
/// resources take the place of the containers' sums.
pub fn pod_cgroup_config(spec: &PodSpec, cpu_cfs_quota: bool, period: Duration, pod_pids_limit: i64) -> CgroupLimits {
    let period_us = period.as_micros().clamp(1_000, 1_000_000) as u64;
    let all = || spec.containers.iter().chain(spec.init_containers.iter().flatten());
    let declared = |name: &str| all().all(|c| pod_level::milli(&pod_level::container_limits(c), name) > 0);
    let mut cpu_limits_declared = declared("cpu");
    let mut memory_limits_declared = declared("memory");
    if let Some(p) = pod_level::declared(spec).filter(pod_level::PodLevel::is_set) {
        cpu_limits_declared |= pod_level::milli(&p.limits, "cpu") > 0;
        memory_limits_declared |= pod_level::milli(&p.limits, "memory") > 0;
    }
    let requests = pod_level::pod_requests(spec);
    let limits = pod_level::pod_limits(spec);
    let quota = if cpu_cfs_quota { milli_cpu_to_quota(pod_level::milli(&limits, "cpu"), period_us) } else { None };
    let memory_limit = pod_level::value(&limits, "memory") as u64;
    let shares = milli_cpu_to_shares(pod_level::milli(&requests, "cpu"));
    let pids = (pod_pids_limit > 0).then_some(pod_pids_limit as u64);
    let mut cfg = CgroupLimits {
        memory: None,
        cpu: CpuLimits { shares: None, quota_us: None, period_us },
        pids,
        hugetlb: vec![],
    };
    match qos_class(spec) {
        QosClass::Guaranteed => {
            cfg.cpu.shares = Some(shares);
            cfg.cpu.quota_us = quota;
            cfg.memory = Some(memory_limit);
        }
        QosClass::Burstable => {
            cfg.cpu.shares = Some(shares);
            if cpu_limits_declared {
                cfg.cpu.quota_us = quota;
            }
            if memory_limits_declared {
                cfg.memory = Some(memory_limit);
            }
        }
        QosClass::BestEffort => cfg.cpu.shares = Some(MIN_SHARES),
    }
    cfg
}

/// The pod cgroup's huge page limits (the kubelet's HugePageLimits of the
/// pod's requests): for each of the host's page sizes, what the pod asks
/// for (PodRequests: the containers' sum, or the pod-level request); 0 for
/// a size the pod does not ask for, so it cannot take pages it did not
/// request.
pub fn pod_hugetlb_limits(spec: &PodSpec, host_sizes: &[u64]) -> Vec<(u64, u64)> {
    let requests = pod_level::pod_requests(spec);
    host_sizes
        .iter()
        .map(|&size| {
            let bytes: i64 = requests
                .iter()
                .filter(|(name, _)| super::hugepages::page_bytes(name) == Some(size))
                .map(|(_, q)| q.value().max(0))
                .fold(0, i64::saturating_add);
            (size, bytes as u64)
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
    use k8s_openapi::api::core::v1::{Container, ResourceRequirements};

    use super::*;
    use crate::cm::test_support::{container, res, reservation, spec};

    fn pod_level(mut s: PodSpec, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> PodSpec {
        s.resources = Some(ResourceRequirements { requests: res(requests), limits: res(limits), ..Default::default() });
        s
    }

    #[test]
    fn pod_level_resources_table() {
        let none = || vec![container(&[], &[]), container(&[], &[])];
        let cases: Vec<(&str, PodSpec, CgroupLimits)> = vec![
            (
                "guaranteed at the pod level, best-effort containers",
                pod_level(spec(none()), &[], &[("cpu", "500m"), ("memory", "96Mi")]),
                CgroupLimits { memory: Some(96 * MI), cpu: cpu(512, Some(50_000)), pids: None, hugetlb: vec![] },
            ),
            (
                "burstable: memory limit only, shares from the defaulted memory-less cpu request",
                pod_level(spec(none()), &[], &[("memory", "96Mi")]),
                CgroupLimits { memory: Some(96 * MI), cpu: cpu(2, None), pids: None, hugetlb: vec![] },
            ),
            (
                "burstable: requests below limits, containers' requests replaced",
                pod_level(
                    spec(vec![container(&[("cpu", "100m")], &[]), container(&[], &[])]),
                    &[("cpu", "250m"), ("memory", "64Mi")],
                    &[("cpu", "1"), ("memory", "128Mi")],
                ),
                CgroupLimits { memory: Some(128 * MI), cpu: cpu(256, Some(100_000)), pids: None, hugetlb: vec![] },
            ),
            (
                "burstable: pod-level requests only, no limits anywhere",
                pod_level(spec(none()), &[("cpu", "1"), ("memory", "64Mi")], &[]),
                CgroupLimits { memory: None, cpu: cpu(1024, None), pids: None, hugetlb: vec![] },
            ),
            (
                "pod-level memory limit, containers' cpu limits kept",
                pod_level(
                    spec(vec![container(&[], &[("cpu", "200m")]), container(&[], &[("cpu", "300m")])]),
                    &[],
                    &[("memory", "1Gi")],
                ),
                CgroupLimits { memory: Some(1024 * MI), cpu: cpu(512, Some(50_000)), pids: None, hugetlb: vec![] },
            ),
            (
                "best effort: spec.resources set but empty",
                pod_level(spec(vec![container(&[], &[("cpu", "1"), ("memory", "1Gi")])]), &[], &[]),
                CgroupLimits { memory: None, cpu: cpu(2, None), pids: None, hugetlb: vec![] },
            ),
            (
                "overhead on top of the pod level",
                PodSpec {
                    overhead: res(&[("cpu", "250m"), ("memory", "120Mi")]),
                    ..pod_level(spec(none()), &[], &[("cpu", "1"), ("memory", "1Gi")])
                },
                CgroupLimits { memory: Some(1144 * MI), cpu: cpu(1280, Some(125_000)), pids: None, hugetlb: vec![] },
            ),
        ];
        for (name, s, want) in cases {
            assert_eq!(pod_cgroup_config(&s, true, P, -1), want, "{name}");
        }
    }

    #[test]
    fn pod_level_requests_and_limits() {
        let s = pod_level(
            spec(vec![container(&[("cpu", "100m"), ("memory", "10Mi")], &[("memory", "20Mi")])]),
            &[("memory", "96Mi")],
            &[("memory", "200Mi")],
        );
        assert_eq!(pod_requests(&s), (100, 96 * MI as i64), "cpu from the containers, memory from the pod");
        assert_eq!(pod_limits(&s), (0, 200 * MI as i64));
        assert_eq!(burstable_cpu_request(&s), 100);
        let huge = pod_level(
            spec(vec![container(&[], &[("hugepages-2Mi", "4Mi")])]),
            &[],
            &[("memory", "64Mi"), ("hugepages-2Mi", "8Mi")],
        );
        assert_eq!(pod_hugetlb_limits(&huge, &[2 << 20]), vec![(2 << 20, 4 << 20)], "defaulted from the containers");
        let explicit = pod_level(
            spec(vec![container(&[], &[("hugepages-2Mi", "4Mi")])]),
            &[("hugepages-2Mi", "8Mi")],
            &[("memory", "64Mi"), ("hugepages-2Mi", "8Mi")],
        );
        assert_eq!(pod_hugetlb_limits(&explicit, &[2 << 20]), vec![(2 << 20, 8 << 20)], "the pod-level request");
    }

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
