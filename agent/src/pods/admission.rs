//! Pod admission, as the kubelet's predicate admit handler does it for the
//! resources it owns: a pod is rejected when the node's pod count or the
//! summed requests of the pods it runs would exceed allocatable. A
//! rejected pod gets phase Failed with reason `OutOf<resource>` and the
//! kubelet's message, and never runs.
//!
//! Critical pods (static, mirror, system priority) are admitted anyway:
//! the kubelet would preempt other pods to make room for them; swiftlet
//! admits them and leaves the pressure to the eviction manager.
//!
//! [`admit_host`] is the kubelet's other admit handlers, for what a pod
//! asks of the node rather than of its resources: sysctls
//! (`SysctlForbidden`), AppArmor (`AppArmor`), supplementalGroupsPolicy
//! Strict (`SupplementalGroupsPolicyNotSupported`) and user namespaces
//! (`UserNamespacesNotSupported`).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Pod, PodSpec, Toleration};

use super::{security, sysctl::Allowlist};
use crate::{
    cm::{
        hierarchy::pod_requests,
        hugepages, pod_level,
        qos::{QosClass, is_critical, qos_class},
    },
    eviction::signal::NodeCondition,
};

/// The reason of a pod the device manager cannot give its devices.
pub const UNEXPECTED_ADMISSION_ERROR: &str = "UnexpectedAdmissionError";

/// What the node can hold, in the units admission counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Capacity {
    pub pods: i64,
    pub cpu_milli: i64,
    pub memory: i64,
    /// Allocatable huge pages per page size: (page bytes, bytes).
    pub hugepages: Vec<(u64, i64)>,
}

/// What the node offers pods beyond resources.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostSupport {
    /// The safe sysctls and allowedUnsafeSysctls.
    pub sysctls: Allowlist,
    /// AppArmor is enabled on the host.
    pub apparmor: bool,
    /// Runtime handlers that support user namespaces (CRI Status).
    pub userns_handlers: Vec<String>,
    /// The runtime supports supplementalGroupsPolicy Strict.
    pub supplemental_groups_policy: bool,
}

/// The kubelet's admit handlers for what a pod asks of the host.
pub fn admit_host(pod: &Pod, host: &HostSupport) -> Result<(), Rejection> {
    let reject = |reason: &str, message: String| Err(Rejection { reason: reason.into(), message });
    if let Some(message) = host.sysctls.admit(pod) {
        return reject(super::sysctl::FORBIDDEN_REASON, message);
    }
    if !host.apparmor && security::requires_apparmor(pod) {
        return reject("AppArmor", "Cannot enforce AppArmor: AppArmor is not enabled on the host".into());
    }
    let spec = pod.spec.as_ref();
    let strict = spec.and_then(|s| s.security_context.as_ref()).and_then(|s| s.supplemental_groups_policy.as_deref())
        == Some("Strict");
    if strict && !host.supplemental_groups_policy {
        return reject(
            "SupplementalGroupsPolicyNotSupported",
            "SupplementalGroupsPolicy=Strict is not supported in this node".into(),
        );
    }
    if spec.and_then(|s| s.host_users) == Some(false) {
        // swiftlet does not allocate user namespace ID ranges: a pod that
        // needs one is refused here, whatever the runtime could do.
        let why = if host.userns_handlers.is_empty() {
            "RuntimeClass handler \"\" does not support user namespaces (the container runtime reports no handler \
             with user namespaces)"
        } else {
            "user namespaces (hostUsers: false) are not implemented by this node's agent"
        };
        return reject("UserNamespacesNotSupported", why.into());
    }
    Ok(())
}

/// A pod's request of one resource as the kubelet's PodRequests counts
/// it: regular containers and sidecars together, against the largest init
/// container with the sidecars started before it, the pod-level request
/// instead where `spec.resources` sets one, plus overhead.
pub fn pod_request(spec: &PodSpec, resource: &str) -> i64 {
    pod_level::value(&pod_level::pod_requests(spec), resource)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// OutOfpods, OutOfcpu, OutOfmemory.
    pub reason: String,
    pub message: String,
}

/// Admits `pod` beside the `active` pods (those admitted and not finished).
pub fn admit(pod: &Pod, active: &[&Pod], allocatable: &Capacity) -> Result<(), Rejection> {
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
    for (size, capacity) in &allocatable.hugepages {
        let name = hugepages::resource_name(*size);
        let want = pod_request(spec, &name);
        if want == 0 {
            continue;
        }
        let used: i64 = active.iter().filter_map(|p| p.spec.as_ref()).map(|s| pod_request(s, &name)).sum();
        if used.saturating_add(want) > *capacity {
            return Err(reject(&name, want, used, *capacity));
        }
    }
    // A page size the node does not have at all (asked for by a container
    // or at the pod level).
    let all = spec.containers.iter().chain(spec.init_containers.iter().flatten());
    let resources = all.filter_map(|c| c.resources.as_ref()).chain(spec.resources.as_ref());
    for name in resources.flat_map(|r| r.limits.iter().chain(r.requests.iter())).flatten().map(|(n, _)| n) {
        let Some(size) = hugepages::page_bytes(name) else { continue };
        if !allocatable.hugepages.iter().any(|(s, _)| *s == size) {
            return Err(reject(name, pod_request(spec, name), 0, 0));
        }
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
    // Memory conditions only (the kubelet's MemoryPressure, or swiftlet's
    // memory.pressure condition, which is treated alike).
    let memory = [NodeCondition::MemoryPressure, NodeCondition::MemoryContention];
    if conditions.iter().all(|c| memory.contains(c)) {
        let spec = pod.spec.as_ref();
        let best_effort = spec.is_none_or(|s| qos_class(s) == QosClass::BestEffort);
        let tolerates = conditions.iter().all(|c| {
            spec.and_then(|s| s.tolerations.as_ref())
                .is_some_and(|t| t.iter().any(|t| tolerates_no_schedule(t, c.taint_key())))
        });
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
        let cap = Capacity { pods: 3, cpu_milli: 2000, memory: 1 << 30, hugepages: vec![] };
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
            let got = admit(&p, &active, &cap).err().map(|r| format!("{}: {}", r.reason, r.message));
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
            (
                "memory contention: best effort refused",
                pod("", ""),
                BTreeSet::from([MemoryContention]),
                Some("The node had condition: [SystemMemoryContentionPressure]. "),
            ),
            (
                "memory contention: burstable admitted",
                pod("", "64Mi"),
                BTreeSet::from([MemoryPressure, MemoryContention]),
                None,
            ),
            (
                "both memory conditions: a toleration of one taint is not enough",
                tolerating(Some(taint), "Exists", Some("NoSchedule")),
                BTreeSet::from([MemoryPressure, MemoryContention]),
                Some("The node had condition: [MemoryPressure SystemMemoryContentionPressure]. "),
            ),
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
        assert!(admit(&p, &[], &Capacity::default()).is_ok());
    }

    fn host() -> HostSupport {
        HostSupport {
            sysctls: Allowlist::new((6, 1), &[]).unwrap(),
            apparmor: false,
            userns_handlers: vec![],
            supplemental_groups_policy: false,
        }
    }

    #[test]
    fn host_admission_table() {
        use k8s_openapi::api::core::v1::{AppArmorProfile, PodSecurityContext, SecurityContext, Sysctl};
        let with_psc = |psc: PodSecurityContext| {
            let mut p = pod("", "");
            p.spec.as_mut().unwrap().security_context = Some(psc);
            p
        };
        let mut userns = pod("", "");
        userns.spec.as_mut().unwrap().host_users = Some(false);
        let mut armored = pod("", "");
        armored.spec.as_mut().unwrap().containers[0].security_context = Some(SecurityContext {
            app_armor_profile: Some(AppArmorProfile { type_: "RuntimeDefault".into(), localhost_profile: None }),
            ..Default::default()
        });
        let cases: Vec<(&str, Pod, Option<&str>)> = vec![
            ("plain", pod("", ""), None),
            (
                "unsafe sysctl",
                with_psc(PodSecurityContext {
                    sysctls: Some(vec![Sysctl { name: "kernel.msgmax".into(), value: "1".into() }]),
                    ..Default::default()
                }),
                Some("SysctlForbidden: forbidden sysctl: \"kernel.msgmax\" not allowlisted"),
            ),
            (
                "safe sysctl",
                with_psc(PodSecurityContext {
                    sysctls: Some(vec![Sysctl { name: "net.ipv4.tcp_syncookies".into(), value: "1".into() }]),
                    ..Default::default()
                }),
                None,
            ),
            (
                "AppArmor on a host without it",
                armored,
                Some("AppArmor: Cannot enforce AppArmor: AppArmor is not enabled on the host"),
            ),
            (
                "Strict groups on a runtime without it",
                with_psc(PodSecurityContext {
                    supplemental_groups_policy: Some("Strict".into()),
                    ..Default::default()
                }),
                Some(
                    "SupplementalGroupsPolicyNotSupported: SupplementalGroupsPolicy=Strict is not supported in this node",
                ),
            ),
            (
                "Merge groups",
                with_psc(PodSecurityContext { supplemental_groups_policy: Some("Merge".into()), ..Default::default() }),
                None,
            ),
            (
                "hostUsers false on a runtime without user namespaces",
                userns,
                Some(
                    "UserNamespacesNotSupported: RuntimeClass handler \"\" does not support user namespaces (the container runtime reports no handler with user namespaces)",
                ),
            ),
        ];
        for (name, p, want) in cases {
            let got = admit_host(&p, &host()).err().map(|r| format!("{}: {}", r.reason, r.message));
            assert_eq!(got.as_deref(), want, "{name}");
        }
    }

    #[test]
    fn hugepages_are_admitted_against_allocatable() {
        let huge = |amount: &str| {
            let mut p = pod("", "");
            p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
                limits: Some(
                    [
                        ("hugepages-2Mi".to_string(), Quantity(amount.into())),
                        ("memory".to_string(), Quantity("64Mi".into())),
                    ]
                    .into(),
                ),
                ..Default::default()
            });
            p
        };
        let cap =
            Capacity { pods: 10, cpu_milli: 1000, memory: 1 << 30, hugepages: vec![(2 << 20, 64 << 20), (1 << 30, 0)] };
        let a = huge("32Mi");
        assert!(admit(&huge("32Mi"), &[&a], &cap).is_ok());
        let r = admit(&huge("64Mi"), &[&a], &cap).unwrap_err();
        assert_eq!(r.reason, "OutOfhugepages-2Mi");
        assert_eq!(
            r.message,
            "Pod was rejected: Node didn't have enough resource: hugepages-2Mi, requested: 67108864, used: 33554432, capacity: 67108864"
        );
        let none = Capacity { hugepages: vec![], ..cap.clone() };
        assert_eq!(
            admit(&huge("2Mi"), &[], &none).unwrap_err().reason,
            "OutOfhugepages-2Mi",
            "a page size the node lacks"
        );
    }

    #[test]
    fn sidecars_add_to_the_pod_and_to_later_init_containers() {
        let c = |name: &str, mem: &str, sidecar: bool| Container {
            name: name.into(),
            restart_policy: sidecar.then(|| "Always".to_string()),
            resources: Some(ResourceRequirements {
                requests: Some([("memory".to_string(), Quantity(mem.into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let spec = PodSpec {
            init_containers: Some(vec![
                c("init-big", "1Gi", false),
                c("proxy", "100Mi", true),
                c("init-after", "500Mi", false),
            ]),
            containers: vec![c("app", "200Mi", false)],
            ..Default::default()
        };
        // max(app + proxy = 300Mi, init-big 1Gi, init-after + proxy = 600Mi)
        assert_eq!(pod_request(&spec, "memory"), 1 << 30);
        let spec = PodSpec { init_containers: Some(vec![c("proxy", "100Mi", true)]), ..spec };
        assert_eq!(pod_request(&spec, "memory"), 300 << 20);
    }

    #[test]
    fn overhead_counts_in_admission() {
        let mut p = pod("", "600Mi");
        p.spec.as_mut().unwrap().overhead = Some([("memory".to_string(), Quantity("300Mi".into()))].into());
        let cap = Capacity { pods: 10, cpu_milli: 1000, memory: 800 << 20, hugepages: vec![] };
        let r = admit(&p, &[], &cap).unwrap_err();
        assert_eq!(r.reason, "OutOfmemory", "600Mi + 300Mi of RuntimeClass overhead exceed 800Mi");
        p.spec.as_mut().unwrap().overhead = None;
        assert!(admit(&p, &[], &cap).is_ok());
    }

    #[test]
    fn pod_level_requests_are_what_admission_counts() {
        let with_pod_level = |mut p: Pod, requests: &[(&str, &str)], limits: &[(&str, &str)]| {
            let list = |pairs: &[(&str, &str)]| {
                (!pairs.is_empty())
                    .then(|| pairs.iter().map(|(k, v)| (k.to_string(), Quantity(v.to_string()))).collect())
            };
            p.spec.as_mut().unwrap().resources =
                Some(ResourceRequirements { requests: list(requests), limits: list(limits), ..Default::default() });
            p
        };
        let cap = Capacity { pods: 10, cpu_milli: 2000, memory: 1 << 30, hugepages: vec![] };
        // The containers ask for 100Mi; the pod level for 800Mi.
        let big = with_pod_level(pod("", "100Mi"), &[("memory", "800Mi")], &[]);
        let small = pod("", "300Mi");
        let r = admit(&small, &[&big], &cap).unwrap_err();
        assert_eq!(
            r.message,
            "Pod was rejected: Node didn't have enough resource: memory, requested: 314572800, used: 838860800, capacity: 1073741824",
            "the active pod counts its pod-level request"
        );
        // Limits only: the requests default to them.
        let limited = with_pod_level(pod("", ""), &[], &[("cpu", "1500m"), ("memory", "64Mi")]);
        let r = admit(&pod("600m", ""), &[&limited], &cap).unwrap_err();
        assert_eq!(r.reason, "OutOfcpu");
        assert_eq!(pod_request(limited.spec.as_ref().unwrap(), "memory"), 64 << 20);
        let huge = with_pod_level(pod("", ""), &[], &[("memory", "64Mi"), ("hugepages-1Gi", "1Gi")]);
        assert_eq!(
            admit(&huge, &[], &cap).unwrap_err().reason,
            "OutOfhugepages-1Gi",
            "a pod-level page size the node lacks"
        );
    }
}
