//! Which resources a pod runs with, and whether a resize may change them,
//! as the kubelet's allocation manager decides. The API holds the desired
//! resources; the node holds the allocated ones (admitted, checkpointed)
//! and runs containers with those. A resize whose requests exceed what the
//! node can ever give is Infeasible; one that does not fit beside the other
//! pods now is Deferred (and retried); otherwise it is admitted and becomes
//! the allocation. Pure.

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};

use super::checkpoint::PodAllocation;
use crate::{
    cm::hierarchy::pod_requests,
    pods::admission::{self, Capacity},
    quantity::Quantity,
};

/// The reasons of the PodResizePending condition.
pub const DEFERRED: &str = "Deferred";
pub const INFEASIBLE: &str = "Infeasible";

/// What admission says of a resize.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Admit,
    /// Reason (Deferred or Infeasible) and message.
    Pending {
        reason: &'static str,
        message: String,
    },
}

/// The containers whose resources can change in place: regular containers
/// and sidecars (restartable init containers), as the kubelet's
/// IsResizableContainer.
fn resizable(pod: &Pod) -> impl Iterator<Item = &Container> {
    let spec = pod.spec.as_ref();
    spec.into_iter().flat_map(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten().filter(|c| c.restart_policy.as_deref() == Some("Always")))
    })
}

/// The allocation a pod's spec asks for.
pub fn allocation_of(pod: &Pod) -> PodAllocation {
    PodAllocation {
        containers: resizable(pod).map(|c| (c.name.clone(), c.resources.clone().unwrap_or_default())).collect(),
        pod_level: pod.spec.as_ref().and_then(|s| s.resources.clone()),
    }
}

fn quantities(
    r: Option<&std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> Vec<(String, i128)> {
    let mut out: Vec<(String, i128)> = r
        .into_iter()
        .flatten()
        .map(|(k, q)| (k.clone(), q.0.parse::<Quantity>().map_or(i128::MIN, |q| i128::from(q.milli_value()))))
        .collect();
    out.sort();
    out
}

/// Equal as quantities ("1" and "1000m" are the same request), as the
/// kubelet's semantic equality.
pub fn same_resources(a: &ResourceRequirements, b: &ResourceRequirements) -> bool {
    quantities(a.limits.as_ref()) == quantities(b.limits.as_ref())
        && quantities(a.requests.as_ref()) == quantities(b.requests.as_ref())
}

/// Whether `pod`'s spec asks for other resources than `allocated`.
pub fn differs(pod: &Pod, allocated: &PodAllocation) -> bool {
    resizable(pod).any(|c| {
        allocated.containers.get(&c.name).is_some_and(|a| !same_resources(a, &c.resources.clone().unwrap_or_default()))
    })
}

/// The pod as it runs: its spec with each container's resources replaced
/// by the allocated ones (the kubelet's UpdatePodFromAllocation).
pub fn with_allocation(pod: &Pod, allocated: &PodAllocation) -> Pod {
    let mut pod = pod.clone();
    if let Some(spec) = pod.spec.as_mut() {
        let all = spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten());
        for c in all {
            if let Some(a) = allocated.containers.get(&c.name) {
                let empty =
                    a.limits.as_ref().is_none_or(|l| l.is_empty()) && a.requests.as_ref().is_none_or(|r| r.is_empty());
                c.resources = if empty && c.resources.is_none() { None } else { Some(a.clone()) };
            }
        }
    }
    pod
}

/// Admits `desired` (the pod with the resources its spec asks for) beside
/// `others` (every other admitted pod, with its allocated resources).
pub fn admit(desired: &Pod, others: &[&Pod], allocatable: &Capacity) -> Verdict {
    let pending = |reason, message: String| Verdict::Pending { reason, message };
    if crate::cm::qos::is_static(desired) {
        return pending(INFEASIBLE, "In-place resize of static-pods is not supported".into());
    }
    let Some(spec) = desired.spec.as_ref() else { return Verdict::Admit };
    let (cpu, memory) = pod_requests(spec);
    let mut over = vec![];
    if cpu > allocatable.cpu_milli {
        over.push(format!("cpu, requested: {cpu}, capacity: {}", allocatable.cpu_milli));
    }
    if memory > allocatable.memory {
        over.push(format!("memory, requested: {memory}, capacity: {}", allocatable.memory));
    }
    if !over.is_empty() {
        return pending(INFEASIBLE, format!("Node didn't have enough capacity: {}", over.join(", ")));
    }
    // The pod is already counted among the node's pods: only its resources
    // are admitted again.
    let capacity = Capacity { pods: i64::MAX, ..allocatable.clone() };
    match admission::admit(desired, others, &capacity) {
        Ok(()) => Verdict::Admit,
        Err(r) => {
            let message = r.message.strip_prefix("Pod was rejected: ").unwrap_or(&r.message).to_owned();
            pending(DEFERRED, message)
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{api::core::v1::PodSpec, apimachinery::pkg::api::resource::Quantity as Q};

    use super::*;

    fn rr(cpu: &str, memory: &str) -> ResourceRequirements {
        let m = [("cpu".to_string(), Q(cpu.into())), ("memory".to_string(), Q(memory.into()))];
        ResourceRequirements { requests: Some(m.clone().into()), limits: Some(m.into()), ..Default::default() }
    }

    fn pod(uid: &str, cpu: &str, memory: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.spec = Some(PodSpec {
            containers: vec![Container { name: "app".into(), resources: Some(rr(cpu, memory)), ..Default::default() }],
            ..Default::default()
        });
        p
    }

    const CAP: Capacity = Capacity { pods: 110, cpu_milli: 2000, memory: 1 << 30, hugepages: vec![] };

    #[test]
    fn admission_table() {
        let other = pod("o", "1", "512Mi");
        let cases = [
            ("fits", pod("p", "500m", "256Mi"), Verdict::Admit),
            (
                "more cpu than the node has",
                pod("p", "3", "256Mi"),
                Verdict::Pending {
                    reason: INFEASIBLE,
                    message: "Node didn't have enough capacity: cpu, requested: 3000, capacity: 2000".into(),
                },
            ),
            (
                "both over capacity",
                pod("p", "3", "2Gi"),
                Verdict::Pending {
                    reason: INFEASIBLE,
                    message: "Node didn't have enough capacity: cpu, requested: 3000, capacity: 2000, memory, \
                              requested: 2147483648, capacity: 1073741824"
                        .into(),
                },
            ),
            (
                "fits the node but not beside the other pod",
                pod("p", "1500m", "256Mi"),
                Verdict::Pending {
                    reason: DEFERRED,
                    message: "Node didn't have enough resource: cpu, requested: 1500, used: 1000, capacity: 2000"
                        .into(),
                },
            ),
        ];
        for (name, desired, want) in cases {
            assert_eq!(admit(&desired, &[&other], &CAP), want, "{name}");
        }
        let mut static_pod = pod("s", "100m", "1Mi");
        static_pod.metadata.annotations = Some([("kubernetes.io/config.source".to_string(), "file".into())].into());
        assert!(matches!(admit(&static_pod, &[], &CAP), Verdict::Pending { reason: INFEASIBLE, .. }));
    }

    #[test]
    fn allocation_replaces_the_spec_and_compares_as_quantities() {
        let desired = pod("p", "1", "128Mi");
        let alloc = allocation_of(&pod("p", "500m", "64Mi"));
        assert!(differs(&desired, &alloc));
        let running = with_allocation(&desired, &alloc);
        assert_eq!(running.spec.unwrap().containers[0].resources, Some(rr("500m", "64Mi")));
        assert!(!differs(&pod("p", "1000m", "128Mi"), &allocation_of(&desired)), "1 == 1000m");
        // A container the allocation does not know (none yet) is left alone.
        assert!(!differs(&desired, &PodAllocation::default()));
    }
}
