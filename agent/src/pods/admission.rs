//! Pod admission, as the kubelet's predicate admit handler does it for the
//! resources it owns: a pod is rejected when the node's pod count or the
//! summed requests of the pods it runs would exceed allocatable. A
//! rejected pod gets phase Failed with reason `OutOf<resource>` and the
//! kubelet's message, and never runs.
//!
//! Critical pods (static, mirror, system priority) are admitted anyway:
//! the kubelet would preempt other pods to make room for them; swiftlet
//! admits them and leaves the pressure to the eviction manager.

use k8s_openapi::api::core::v1::Pod;

use crate::cm::{hierarchy::pod_requests, qos::is_critical};

/// The reason of a pod the device manager cannot give its devices.
pub const UNEXPECTED_ADMISSION_ERROR: &str = "UnexpectedAdmissionError";

/// What the node can hold, in the units admission counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capacity {
    pub pods: i64,
    pub cpu_milli: i64,
    pub memory: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// OutOfpods, OutOfcpu, OutOfmemory.
    pub reason: String,
    pub message: String,
}

/// Admits `pod` beside the `active` pods (those admitted and not finished).
pub fn admit(pod: &Pod, active: &[&Pod], allocatable: Capacity) -> Result<(), Rejection> {
    if is_critical(pod) {
        return Ok(());
    }
    let reject = |resource: &str, requested: i64, used: i64, capacity: i64| Rejection {
        reason: format!("OutOf{resource}"),
        message: format!(
            "Pod was rejected: Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
        ),
    };
    let used_pods = active.len() as i64;
    if used_pods + 1 > allocatable.pods {
        return Err(reject("pods", 1, used_pods, allocatable.pods));
    }
    let Some(spec) = pod.spec.as_ref() else { return Ok(()) };
    let (cpu, memory) = pod_requests(spec);
    let (used_cpu, used_memory) = active
        .iter()
        .filter_map(|p| p.spec.as_ref())
        .map(pod_requests)
        .fold((0i64, 0i64), |(c, m), (pc, pm)| (c.saturating_add(pc), m.saturating_add(pm)));
    if cpu > 0 && used_cpu.saturating_add(cpu) > allocatable.cpu_milli {
        return Err(reject("cpu", cpu, used_cpu, allocatable.cpu_milli));
    }
    if memory > 0 && used_memory.saturating_add(memory) > allocatable.memory {
        return Err(reject("memory", memory, used_memory, allocatable.memory));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{Container, PodSpec, ResourceRequirements},
        apimachinery::pkg::api::resource::Quantity,
    };

    use super::*;

    fn pod(cpu: &str, memory: &str) -> Pod {
        let mut requests = std::collections::BTreeMap::new();
        if !cpu.is_empty() {
            requests.insert("cpu".to_string(), Quantity(cpu.into()));
        }
        if !memory.is_empty() {
            requests.insert("memory".to_string(), Quantity(memory.into()));
        }
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements { requests: Some(requests), ..Default::default() }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn table() {
        let cap = Capacity { pods: 3, cpu_milli: 2000, memory: 1 << 30 };
        let a = pod("500m", "256Mi");
        let b = pod("1", "512Mi");
        let cases: Vec<(&str, Pod, Vec<&Pod>, Option<&str>)> = vec![
            ("fits", pod("500m", "128Mi"), vec![&a, &b], None),
            ("best effort always fits resources", pod("", ""), vec![&a, &b], None),
            (
                "cpu",
                pod("600m", ""),
                vec![&a, &b],
                Some(
                    "OutOfcpu: Pod was rejected: Node didn't have enough resource: cpu, requested: 600, used: 1500, capacity: 2000",
                ),
            ),
            (
                "memory",
                pod("", "300Mi"),
                vec![&a, &b],
                Some(
                    "OutOfmemory: Pod was rejected: Node didn't have enough resource: memory, requested: 314572800, used: 805306368, capacity: 1073741824",
                ),
            ),
            (
                "pods",
                pod("", ""),
                vec![&a, &b, &a],
                Some(
                    "OutOfpods: Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3",
                ),
            ),
        ];
        for (name, p, active, want) in cases {
            let got = admit(&p, &active, cap).err().map(|r| format!("{}: {}", r.reason, r.message));
            assert_eq!(got.as_deref(), want, "{name}");
        }
    }

    #[test]
    fn critical_pods_are_admitted_over_capacity() {
        let mut p = pod("4", "4Gi");
        p.metadata.annotations = Some([("kubernetes.io/config.source".to_string(), "file".to_string())].into());
        assert!(admit(&p, &[], Capacity { pods: 0, cpu_milli: 0, memory: 0 }).is_ok());
    }
}
