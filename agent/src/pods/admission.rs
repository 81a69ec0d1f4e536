//! Pod admission, as the kubelet's predicate admit handler does it for the
//! resources it owns: a pod is rejected when the node's pod count or the
//! summed requests of the pods it runs would exceed allocatable. A
//! rejected pod gets phase Failed with reason `OutOf<resource>` and the
//! kubelet's message, and never runs.
//!
//! Critical pods (static, mirror, system priority) are admitted anyway:
//! the kubelet would preempt other pods to make room for them; swiftlet
//! admits them and leaves the pressure to the eviction manager.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Pod, Toleration};

use crate::{
    cm::{
        hierarchy::pod_requests,
        qos::{QosClass, is_critical, qos_class},
    },
    eviction::signal::NodeCondition,
};

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

/// The eviction manager's admit handler, as the kubelet's: while the node
/// reports pressure conditions, critical pods are admitted; under memory
/// pressure alone, pods other than BestEffort are too, and BestEffort pods
/// that tolerate the memory-pressure taint; everything else is refused
/// with reason `Evicted`, naming the conditions.
pub fn admit_under_pressure(pod: &Pod, conditions: &BTreeSet<NodeCondition>) -> Result<(), Rejection> {
    if conditions.is_empty() || is_critical(pod) {
        return Ok(());
    }
    if conditions.len() == 1 && conditions.contains(&NodeCondition::MemoryPressure) {
        let spec = pod.spec.as_ref();
        let best_effort = spec.is_none_or(|s| qos_class(s) == QosClass::BestEffort);
        let tolerates = spec
            .and_then(|s| s.tolerations.as_ref())
            .is_some_and(|t| t.iter().any(|t| tolerates_no_schedule(t, NodeCondition::MemoryPressure.taint_key())));
        if !best_effort || tolerates {
            return Ok(());
        }
    }
    let names: Vec<&str> = conditions.iter().map(|c| c.type_name()).collect();
    Err(Rejection { reason: "Evicted".into(), message: format!("The node had condition: [{}]. ", names.join(" ")) })
}

/// Whether `t` tolerates the NoSchedule taint `key` (with no value), as
/// ToleratesTaint does.
fn tolerates_no_schedule(t: &Toleration, key: &str) -> bool {
    let effect_ok = t.effect.as_deref().is_none_or(|e| e.is_empty() || e == "NoSchedule");
    let key_ok = match t.key.as_deref() {
        None | Some("") => t.operator.as_deref() == Some("Exists"),
        Some(k) => k == key,
    };
    let value_ok = match t.operator.as_deref() {
        Some("Exists") => true,
        None | Some("") | Some("Equal") => t.value.as_deref().unwrap_or("").is_empty(),
        Some(_) => false,
    };
    effect_ok && key_ok && value_ok
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
    fn pressure_table() {
        use NodeCondition::*;
        let tolerating = |key: Option<&str>, op: &str, effect: Option<&str>| {
            let mut p = pod("", "");
            p.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
                key: key.map(Into::into),
                operator: Some(op.into()),
                effect: effect.map(Into::into),
                ..Default::default()
            }]);
            p
        };
        let mut static_pod = pod("", "");
        static_pod.metadata.annotations =
            Some([("kubernetes.io/config.source".to_string(), "file".to_string())].into());
        let memory = BTreeSet::from([MemoryPressure]);
        let taint = "node.kubernetes.io/memory-pressure";
        let cases: Vec<(&str, Pod, BTreeSet<NodeCondition>, Option<&str>)> = vec![
            ("no pressure", pod("", ""), BTreeSet::new(), None),
            (
                "memory: best effort refused",
                pod("", ""),
                memory.clone(),
                Some("The node had condition: [MemoryPressure]. "),
            ),
            ("memory: burstable admitted", pod("", "64Mi"), memory.clone(), None),
            (
                "memory: tolerates the taint",
                tolerating(Some(taint), "Exists", Some("NoSchedule")),
                memory.clone(),
                None,
            ),
            ("memory: tolerates everything", tolerating(None, "Exists", None), memory.clone(), None),
            (
                "memory: tolerates another taint",
                tolerating(Some("node.kubernetes.io/disk-pressure"), "Exists", None),
                memory.clone(),
                Some("The node had condition: [MemoryPressure]. "),
            ),
            (
                "memory: NoExecute only",
                tolerating(Some(taint), "Exists", Some("NoExecute")),
                memory.clone(),
                Some("The node had condition: [MemoryPressure]. "),
            ),
            (
                "disk: burstable refused",
                pod("", "64Mi"),
                BTreeSet::from([DiskPressure]),
                Some("The node had condition: [DiskPressure]. "),
            ),
            (
                "memory and pids: burstable refused",
                pod("100m", "64Mi"),
                BTreeSet::from([MemoryPressure, PidPressure]),
                Some("The node had condition: [MemoryPressure PIDPressure]. "),
            ),
            ("critical: admitted", static_pod, BTreeSet::from([DiskPressure, PidPressure]), None),
        ];
        for (name, p, conditions, want) in cases {
            let got = admit_under_pressure(&p, &conditions).err();
            assert_eq!(got.as_ref().map(|r| r.message.as_str()), want, "{name}");
            assert!(got.is_none_or(|r| r.reason == "Evicted"), "{name}");
        }
    }

    #[test]
    fn critical_pods_are_admitted_over_capacity() {
        let mut p = pod("4", "4Gi");
        p.metadata.annotations = Some([("kubernetes.io/config.source".to_string(), "file".to_string())].into());
        assert!(admit(&p, &[], Capacity { pods: 0, cpu_milli: 0, memory: 0 }).is_ok());
    }
}
