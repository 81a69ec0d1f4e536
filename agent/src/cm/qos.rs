//! QoS classes, oom_score_adj and criticality, as the kubelet computes them.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use super::pod_level;
use crate::quantity::Quantity;

/// system-cluster-critical; pods at or above it are critical.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
/// system-node-critical.
pub const SYSTEM_NODE_CRITICAL_PRIORITY: i32 = 2_000_001_000;

/// oom_score_adj of Guaranteed (and node-critical) containers.
pub const GUARANTEED_OOM_SCORE_ADJ: i32 = -997;
/// oom_score_adj of BestEffort containers.
pub const BEST_EFFORT_OOM_SCORE_ADJ: i32 = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    /// The name the API uses (`status.qosClass`).
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

/// A container's cpu/memory request and limit, with the API server's
/// defaulting applied (a limit without a request makes the request equal
/// to the limit). None means unset; a value that does not parse counts as
/// unset (validation rejects such pods earlier).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    pub cpu_request: Option<Quantity>,
    pub cpu_limit: Option<Quantity>,
    pub memory_request: Option<Quantity>,
    pub memory_limit: Option<Quantity>,
}

fn get(
    map: Option<&std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    key: &str,
) -> Option<Quantity> {
    map?.get(key).and_then(|q| q.0.parse().ok())
}

pub fn container_resources(c: &Container) -> Resources {
    let r = c.resources.as_ref();
    let requests = r.and_then(|r| r.requests.as_ref());
    let limits = r.and_then(|r| r.limits.as_ref());
    let cpu_limit = get(limits, "cpu");
    let memory_limit = get(limits, "memory");
    Resources {
        cpu_request: get(requests, "cpu").or(cpu_limit),
        cpu_limit,
        memory_request: get(requests, "memory").or(memory_limit),
        memory_limit,
    }
}

/// What a container's own cgroup is given (the kubelet's getCPULimit,
/// getMemoryLimit and calculateLinuxResources): its resources, where the
/// pod sets pod-level resources and the container has no cpu or memory
/// limit, the pod-level limit instead; and without a cpu request, the cpu
/// shares follow that limit.
pub fn container_runtime_resources(spec: Option<&PodSpec>, c: &Container) -> Resources {
    let mut r = container_resources(c);
    let Some(p) = spec.and_then(pod_level::declared).filter(pod_level::PodLevel::is_set) else { return r };
    let unset = |q: Option<Quantity>| q.is_none_or(|q| q == Quantity::ZERO);
    if unset(r.cpu_limit) {
        r.cpu_limit = p.limits.get("cpu").copied();
    }
    if unset(r.memory_limit) {
        r.memory_limit = p.limits.get("memory").copied();
    }
    if r.cpu_request.is_none() {
        r.cpu_request = r.cpu_limit;
    }
    r
}

fn all_containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.init_containers.iter().flatten().chain(spec.containers.iter())
}

/// The pod's QoS class as the API server computes it (ComputePodQOS).
/// When the pod sets `spec.resources`, that alone decides (see
/// [`resources_qos`], on the defaulted pod-level requests). Otherwise:
/// BestEffort when no container sets any cpu or memory request or limit;
/// Guaranteed when every container sets both limits and its requests equal
/// them; Burstable otherwise.
pub fn qos_class(spec: &PodSpec) -> QosClass {
    if let Some(p) = pod_level::declared(spec) {
        return resources_qos(&p.requests, &p.limits);
    }
    let mut any = false;
    let mut guaranteed = true;
    for c in all_containers(spec) {
        let r = container_resources(c);
        if r.cpu_request.is_some() || r.cpu_limit.is_some() || r.memory_request.is_some() || r.memory_limit.is_some() {
            any = true;
        }
        let cpu_ok = r.cpu_limit.is_some() && r.cpu_request == r.cpu_limit;
        let mem_ok = r.memory_limit.is_some() && r.memory_request == r.memory_limit;
        if !(cpu_ok && mem_ok) {
            guaranteed = false;
        }
    }
    if !any {
        QosClass::BestEffort
    } else if guaranteed {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

/// The QoS class of one set of requests and limits (the API's
/// resourceQOS): BestEffort when both are empty; for cpu and memory, a
/// request that differs from the limit (an absent one is zero) makes it
/// Burstable; both zero for both resources is BestEffort, both set and
/// equal for both is Guaranteed, a mix is Burstable.
pub fn resources_qos(requests: &pod_level::ResourceList, limits: &pod_level::ResourceList) -> QosClass {
    if requests.is_empty() && limits.is_empty() {
        return QosClass::BestEffort;
    }
    let mut class = None;
    for name in ["cpu", "memory"] {
        let req = requests.get(name).copied().unwrap_or(Quantity::ZERO);
        let lim = limits.get(name).copied().unwrap_or(Quantity::ZERO);
        if req != lim {
            return QosClass::Burstable;
        }
        let this = if req == Quantity::ZERO { QosClass::BestEffort } else { QosClass::Guaranteed };
        match class {
            None => class = Some(this),
            Some(c) if c != this => return QosClass::Burstable,
            Some(_) => {}
        }
    }
    class.unwrap_or(QosClass::BestEffort)
}

/// The pod's QoS class as the kubelet reads it (GetPodQOS):
/// `status.qosClass` once set, computed from the spec before.
pub fn pod_qos(pod: &Pod) -> QosClass {
    match pod.status.as_ref().and_then(|s| s.qos_class.as_deref()) {
        Some("Guaranteed") => QosClass::Guaranteed,
        Some("Burstable") => QosClass::Burstable,
        Some("BestEffort") => QosClass::BestEffort,
        _ => pod.spec.as_ref().map(qos_class).unwrap_or(QosClass::BestEffort),
    }
}

/// The pod's priority: `spec.priority`, or for a pod that names one of the
/// built-in classes without a resolved number (static pods in standalone
/// mode never pass priority admission), that class's value.
pub fn priority(pod: &Pod) -> i32 {
    let spec = pod.spec.as_ref();
    if let Some(p) = spec.and_then(|s| s.priority) {
        return p;
    }
    match spec.and_then(|s| s.priority_class_name.as_deref()) {
        Some("system-node-critical") => SYSTEM_NODE_CRITICAL_PRIORITY,
        Some("system-cluster-critical") => SYSTEM_CRITICAL_PRIORITY,
        _ => 0,
    }
}

/// A static pod read from the manifest directory, or its mirror.
pub fn is_static(pod: &Pod) -> bool {
    let ann = pod.metadata.annotations.as_ref();
    let source = ann.and_then(|a| a.get("kubernetes.io/config.source")).map(String::as_str);
    matches!(source, Some("file") | Some("http")) || ann.is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"))
}

/// The kubelet's IsCriticalPod: static, mirror, or priority at or above
/// system-cluster-critical.
pub fn is_critical(pod: &Pod) -> bool {
    is_static(pod) || priority(pod) >= SYSTEM_CRITICAL_PRIORITY
}

/// Critical and of class system-node-critical.
pub fn is_node_critical(pod: &Pod) -> bool {
    is_critical(pod)
        && (priority(pod) >= SYSTEM_NODE_CRITICAL_PRIORITY
            || pod.spec.as_ref().and_then(|s| s.priority_class_name.as_deref()) == Some("system-node-critical"))
}

/// oom_score_adj for a container (the kubelet's
/// GetContainerOOMScoreAdjust): −997 for Guaranteed and node-critical
/// pods, 1000 for BestEffort, and for Burstable
/// min(max(3, 1000 − 1000·memoryRequest/memoryCapacity), 999). With
/// pod-level memory requests, the part of the pod's request no container
/// asks for is shared equally among the containers and added to each
/// container's request. A sidecar scores no higher than the app container
/// with the smallest request.
pub fn oom_score_adj(pod: &Pod, container: &Container, memory_capacity: u64) -> i32 {
    if is_node_critical(pod) {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    let Some(spec) = pod.spec.as_ref() else { return BEST_EFFORT_OOM_SCORE_ADJ };
    match qos_class(spec) {
        QosClass::Guaranteed => GUARANTEED_OOM_SCORE_ADJ,
        QosClass::BestEffort => BEST_EFFORT_OOM_SCORE_ADJ,
        QosClass::Burstable => {
            let capacity = memory_capacity.max(1) as i128;
            let memory_request = |c: &Container| container_resources(c).memory_request.map_or(0, |q| q.value().max(0));
            let share = pod_memory_share(spec) as i128;
            let score = |request: i64| 1000 - (1000 * (request as i128 + share)) / capacity;
            let mut adj = score(memory_request(container));
            let sidecar = container.restart_policy.as_deref() == Some("Always")
                && spec.init_containers.iter().flatten().any(|c| c.name == container.name);
            if sidecar && let Some(min) = spec.containers.iter().map(memory_request).min() {
                adj = adj.min(score(min));
            }
            if adj < i128::from(1000 + GUARANTEED_OOM_SCORE_ADJ) {
                1000 + GUARANTEED_OOM_SCORE_ADJ
            } else if adj >= i128::from(BEST_EFFORT_OOM_SCORE_ADJ) {
                BEST_EFFORT_OOM_SCORE_ADJ - 1
            } else {
                adj as i32
            }
        }
    }
}

/// The pod-level memory request the containers do not ask for, per
/// container (the kubelet's remainingPodMemReqPerContainer); 0 without a
/// pod-level memory request.
fn pod_memory_share(spec: &PodSpec) -> i64 {
    let Some(p) = pod_level::declared(spec).filter(pod_level::PodLevel::requests_set) else { return 0 };
    let pod = pod_level::value(&p.requests, "memory");
    if pod == 0 {
        return 0;
    }
    let containers = pod_level::value(&pod_level::aggregate(spec, pod_level::container_requests), "memory");
    let count = (spec.containers.len() + spec.init_containers.as_ref().map_or(0, Vec::len)).max(1) as i64;
    (pod - containers) / count
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ResourceRequirements;

    use super::*;
    use crate::cm::test_support::{container, res, spec};

    fn pod(containers: Vec<Container>) -> Pod {
        Pod { spec: Some(spec(containers)), ..Default::default() }
    }

    #[test]
    fn qos_table() {
        let cases: Vec<(&str, Vec<Container>, QosClass)> = vec![
            ("no resources", vec![container(&[], &[])], QosClass::BestEffort),
            ("only ephemeral-storage", vec![container(&[("ephemeral-storage", "1Gi")], &[])], QosClass::BestEffort),
            (
                "limits equal requests",
                vec![container(&[("cpu", "1"), ("memory", "1Gi")], &[("cpu", "1"), ("memory", "1Gi")])],
                QosClass::Guaranteed,
            ),
            (
                "limits only (requests default to them)",
                vec![container(&[], &[("cpu", "500m"), ("memory", "128Mi")])],
                QosClass::Guaranteed,
            ),
            (
                "1000m equals 1",
                vec![container(&[("cpu", "1000m"), ("memory", "1Gi")], &[("cpu", "1"), ("memory", "1024Mi")])],
                QosClass::Guaranteed,
            ),
            (
                "request below limit",
                vec![container(&[("cpu", "500m"), ("memory", "1Gi")], &[("cpu", "1"), ("memory", "1Gi")])],
                QosClass::Burstable,
            ),
            ("memory only", vec![container(&[], &[("memory", "1Gi")])], QosClass::Burstable),
            ("requests only", vec![container(&[("memory", "1Gi")], &[])], QosClass::Burstable),
            (
                "one guaranteed, one best-effort container",
                vec![container(&[], &[("cpu", "1"), ("memory", "1Gi")]), container(&[], &[])],
                QosClass::Burstable,
            ),
        ];
        for (name, containers, want) in cases {
            assert_eq!(qos_class(pod(containers).spec.as_ref().unwrap()), want, "{name}");
        }
    }

    #[test]
    fn init_containers_count() {
        let mut p = pod(vec![container(&[], &[])]);
        p.spec.as_mut().unwrap().init_containers = Some(vec![container(&[("memory", "1Mi")], &[])]);
        assert_eq!(qos_class(p.spec.as_ref().unwrap()), QosClass::Burstable);
    }

    #[test]
    fn oom_score_adj_table() {
        let cap = 10u64 << 30;
        let g = container(&[], &[("cpu", "1"), ("memory", "1Gi")]);
        assert_eq!(oom_score_adj(&pod(vec![g.clone()]), &g, cap), -997);
        let be = container(&[], &[]);
        assert_eq!(oom_score_adj(&pod(vec![be.clone()]), &be, cap), 1000);
        // The floor is 1000 + the Guaranteed score: 3.
        let cases = [("1Gi", 900), ("5Gi", 500), ("10Gi", 3), ("20Gi", 3), ("1", 999), ("0", 999)];
        for (request, want) in cases {
            let b = container(&[("memory", request)], &[]);
            assert_eq!(oom_score_adj(&pod(vec![b.clone()]), &b, cap), want, "burstable request {request}");
        }
    }

    fn pod_level(containers: Vec<Container>, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Pod {
        let mut p = pod(containers);
        p.spec.as_mut().unwrap().resources =
            Some(ResourceRequirements { requests: res(requests), limits: res(limits), ..Default::default() });
        p
    }

    #[test]
    fn qos_with_pod_level_resources_table() {
        let be = || container(&[], &[]);
        let g = || container(&[], &[("cpu", "1"), ("memory", "1Gi")]);
        let cases: Vec<(&str, Pod, QosClass)> = vec![
            (
                "guaranteed: cpu and memory limits, requests defaulted to them",
                pod_level(vec![be(), be()], &[], &[("cpu", "1"), ("memory", "96Mi")]),
                QosClass::Guaranteed,
            ),
            (
                "guaranteed: requests equal to limits",
                pod_level(vec![be()], &[("cpu", "500m"), ("memory", "1Gi")], &[("cpu", "0.5"), ("memory", "1024Mi")]),
                QosClass::Guaranteed,
            ),
            (
                "guaranteed at the pod level wins over burstable containers",
                pod_level(
                    vec![container(&[("cpu", "100m")], &[])],
                    &[("cpu", "1")],
                    &[("cpu", "1"), ("memory", "1Gi")],
                ),
                QosClass::Guaranteed,
            ),
            (
                "burstable: memory limit only (the issue's 96Mi pod)",
                pod_level(vec![be(), be()], &[], &[("memory", "96Mi")]),
                QosClass::Burstable,
            ),
            (
                "burstable: requests only",
                pod_level(vec![be()], &[("cpu", "100m"), ("memory", "64Mi")], &[]),
                QosClass::Burstable,
            ),
            (
                "burstable: requests below limits",
                pod_level(vec![be()], &[("cpu", "500m"), ("memory", "1Gi")], &[("cpu", "1"), ("memory", "1Gi")]),
                QosClass::Burstable,
            ),
            (
                "burstable: the containers' requests become the pod's, below its limits",
                pod_level(vec![container(&[("cpu", "100m")], &[])], &[], &[("cpu", "1"), ("memory", "1Gi")]),
                QosClass::Burstable,
            ),
            ("best effort: spec.resources empty, whatever the containers say", pod_level(vec![g()], &[], &[]), {
                QosClass::BestEffort
            }),
            (
                "best effort: only unsupported pod-level resources",
                pod_level(vec![g()], &[("ephemeral-storage", "1Gi")], &[]),
                QosClass::BestEffort,
            ),
        ];
        for (name, p, want) in cases {
            assert_eq!(qos_class(p.spec.as_ref().unwrap()), want, "{name}");
            assert_eq!(pod_qos(&p), want, "{name}: no status yet");
        }
    }

    #[test]
    fn containers_without_limits_get_the_pod_level_ones() {
        let q = |s: &str| Some(s.parse::<Quantity>().unwrap());
        let p = pod_level(
            vec![container(&[], &[]), container(&[("cpu", "100m")], &[("memory", "32Mi")])],
            &[],
            &[("cpu", "1"), ("memory", "96Mi")],
        );
        let spec = p.spec.as_ref();
        let containers = &p.spec.as_ref().unwrap().containers;
        let bare = container_runtime_resources(spec, &containers[0]);
        assert_eq!((bare.cpu_limit, bare.memory_limit), (q("1"), q("96Mi")));
        assert_eq!(bare.cpu_request, q("1"), "no cpu request: the shares follow the pod-level limit");
        let own = container_runtime_resources(spec, &containers[1]);
        assert_eq!((own.cpu_request, own.cpu_limit, own.memory_limit), (q("100m"), q("1"), q("32Mi")));
        let plain = pod(vec![container(&[], &[])]);
        assert_eq!(
            container_runtime_resources(plain.spec.as_ref(), &plain.spec.as_ref().unwrap().containers[0]),
            Resources::default(),
            "no pod-level resources: the container's own"
        );
    }

    #[test]
    fn pod_qos_prefers_the_status() {
        let mut p = pod(vec![container(&[], &[])]);
        p.status =
            Some(k8s_openapi::api::core::v1::PodStatus { qos_class: Some("Burstable".into()), ..Default::default() });
        assert_eq!(pod_qos(&p), QosClass::Burstable);
    }

    #[test]
    fn oom_score_adj_with_pod_level_requests() {
        let cap = 10u64 << 30;
        // 2Gi at the pod level, 512Mi asked by the containers: 1.5Gi shared by 3.
        let a = container(&[("memory", "512Mi")], &[]);
        let b = container(&[], &[]);
        let mut p = pod_level(vec![a.clone(), b.clone()], &[("memory", "2Gi")], &[]);
        let mut sidecar = container(&[], &[]);
        sidecar.name = "sidecar".into();
        sidecar.restart_policy = Some("Always".into());
        p.spec.as_mut().unwrap().init_containers = Some(vec![sidecar.clone()]);
        assert_eq!(oom_score_adj(&p, &a, cap), 900, "512Mi + 512Mi share: 1Gi of 10Gi");
        assert_eq!(oom_score_adj(&p, &b, cap), 950, "the 512Mi share alone");
        assert_eq!(oom_score_adj(&p, &sidecar, cap), oom_score_adj(&p, &b, cap), "a sidecar: no higher than b");
        let no_pod_request = pod_level(vec![a.clone()], &[], &[]);
        assert_eq!(oom_score_adj(&no_pod_request, &a, cap), 1000, "spec.resources empty: best effort");
    }

    #[test]
    fn criticality() {
        let mut p = pod(vec![container(&[], &[])]);
        assert!(!is_critical(&p));
        p.spec.as_mut().unwrap().priority = Some(SYSTEM_NODE_CRITICAL_PRIORITY);
        assert!(is_critical(&p) && is_node_critical(&p));
        let c = p.spec.as_ref().unwrap().containers[0].clone();
        assert_eq!(oom_score_adj(&p, &c, 1 << 30), -997, "node-critical pods get the guaranteed score");
        let mut s = pod(vec![]);
        s.metadata.annotations = Some([("kubernetes.io/config.source".to_string(), "file".to_string())].into());
        assert!(is_static(&s) && is_critical(&s) && !is_node_critical(&s));
    }
}
