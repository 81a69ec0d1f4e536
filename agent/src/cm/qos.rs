//! QoS classes, oom_score_adj and criticality, as the kubelet computes them.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

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

fn all_containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.init_containers.iter().flatten().chain(spec.containers.iter())
}

/// The pod's QoS class: BestEffort when no container sets any cpu or memory
/// request or limit; Guaranteed when every container sets both limits and
/// its requests equal them; Burstable otherwise.
pub fn qos_class(spec: &PodSpec) -> QosClass {
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

/// oom_score_adj for a container: −997 for Guaranteed and node-critical
/// pods, 1000 for BestEffort, and for Burstable
/// min(max(2, 1000 − 1000·memoryRequest/memoryCapacity), 999).
pub fn oom_score_adj(pod: &Pod, container: &Container, memory_capacity: u64) -> i32 {
    if is_node_critical(pod) {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    let Some(spec) = pod.spec.as_ref() else { return BEST_EFFORT_OOM_SCORE_ADJ };
    match qos_class(spec) {
        QosClass::Guaranteed => GUARANTEED_OOM_SCORE_ADJ,
        QosClass::BestEffort => BEST_EFFORT_OOM_SCORE_ADJ,
        QosClass::Burstable => {
            let request = container_resources(container).memory_request.map_or(0, |q| q.value().max(0) as i128);
            let capacity = memory_capacity.max(1) as i128;
            let adj = 1000 - (1000 * request) / capacity;
            adj.clamp(2, 999) as i32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::test_support::{container, spec};

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
        let cases = [("1Gi", 900), ("5Gi", 500), ("10Gi", 2), ("20Gi", 2), ("1", 999), ("0", 999)];
        for (request, want) in cases {
            let b = container(&[("memory", request)], &[]);
            assert_eq!(oom_score_adj(&pod(vec![b.clone()]), &b, cap), want, "burstable request {request}");
        }
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
