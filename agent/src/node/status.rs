//! The node's status as the kubelet's status setters compute it, as pure
//! functions of what the agent observed (`NodeFacts`) and of the status
//! the API server holds: capacity and allocatable, the conditions Ready,
//! MemoryPressure, DiskPressure and PIDPressure with the kubelet's reasons
//! and messages, addresses, nodeInfo, daemonEndpoints and images; which
//! condition transitions are events; whether anything changed; and the
//! pressure taints.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{
    api::core::v1::{
        ContainerImage, DaemonEndpoint, NodeAddress, NodeCondition as ApiCondition, NodeDaemonEndpoints, NodeFeatures,
        NodeRuntimeHandler, NodeRuntimeHandlerFeatures, NodeStatus, NodeSystemInfo, Taint,
    },
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::Time},
    jiff::Timestamp,
};

use crate::{cri::api, eviction::signal::NodeCondition};

/// Facts about this machine that do not change while it runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineInfo {
    pub machine_id: String,
    pub system_uuid: String,
    pub boot_id: String,
    pub kernel_version: String,
    pub os_image: String,
    pub operating_system: String,
    pub architecture: String,
}

/// Everything node status is computed from, gathered at the edge.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeFacts {
    /// Resource name → quantity text, from the container manager.
    pub capacity: BTreeMap<String, String>,
    pub allocatable: BTreeMap<String, String>,
    /// The pressure conditions the eviction manager reports now.
    pub pressure: BTreeSet<NodeCondition>,
    /// `<runtime>://<version>`; empty until the runtime answered once.
    pub runtime_version: String,
    /// Why the runtime is not ready (runtime errors, then network errors),
    /// worded as the kubelet's; empty when ready.
    pub runtime_errors: Vec<String>,
    pub runtime_handlers: Vec<NodeRuntimeHandler>,
    /// The runtime supports supplementalGroupsPolicy Strict (CRI Status
    /// features).
    pub supplemental_groups_policy: bool,
    pub addresses: Vec<NodeAddress>,
    pub machine: MachineInfo,
    pub kubelet_version: String,
    pub kubelet_port: i32,
    pub images: Vec<ContainerImage>,
    /// Device plugin resources (the device manager's figures).
    pub extended: crate::deviceplugin::devices::ExtendedResources,
    /// The attachable volumes mounted or being mounted, sorted.
    pub volumes_in_use: Vec<String>,
}

/// A node event to record for a condition transition (all `Normal`, as
/// the kubelet records them), e.g. "NodeHasInsufficientMemory".
pub type NodeEvent = &'static str;

/// Status, reason and message of each pressure condition, and the events
/// of its transitions: (condition, true: (reason, message, event), false: ...).
struct PressureText {
    type_: &'static str,
    on: (&'static str, &'static str, NodeEvent),
    off: (&'static str, &'static str, NodeEvent),
}

fn pressure_text(c: NodeCondition) -> PressureText {
    match c {
        NodeCondition::MemoryPressure => PressureText {
            type_: "MemoryPressure",
            on: (
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
                "NodeHasInsufficientMemory",
            ),
            off: ("KubeletHasSufficientMemory", "kubelet has sufficient memory available", "NodeHasSufficientMemory"),
        },
        NodeCondition::DiskPressure => PressureText {
            type_: "DiskPressure",
            on: ("KubeletHasDiskPressure", "kubelet has disk pressure", "NodeHasDiskPressure"),
            off: ("KubeletHasNoDiskPressure", "kubelet has no disk pressure", "NodeHasNoDiskPressure"),
        },
        NodeCondition::PidPressure => PressureText {
            type_: "PIDPressure",
            on: ("KubeletHasInsufficientPID", "kubelet has insufficient PID available", "NodeHasInsufficientPID"),
            off: ("KubeletHasSufficientPID", "kubelet has sufficient PID available", "NodeHasSufficientPID"),
        },
        NodeCondition::MemoryContention => PressureText {
            type_: "SystemMemoryContentionPressure",
            on: (
                "KubeletHasMemoryContentionPressure",
                "tasks on the node stall on memory (memory.pressure) above the configured threshold",
                "NodeHasMemoryContentionPressure",
            ),
            off: (
                "KubeletHasNoMemoryContentionPressure",
                "tasks on the node do not stall on memory above the configured threshold",
                "NodeHasNoMemoryContentionPressure",
            ),
        },
    }
}

/// Times in the API have second precision: compute with the same.
pub fn api_now(now: Timestamp) -> Time {
    Time(Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// The kubelet's runtime and network errors from a CRI Status answer
/// (`None`: the runtime did not answer).
pub fn runtime_errors(status: Option<&api::RuntimeStatus>) -> Vec<String> {
    let Some(status) = status else {
        return vec!["container runtime is down".into()];
    };
    let find = |t: &str| status.conditions.iter().find(|c| c.r#type == t);
    let show =
        |c: &api::RuntimeCondition| format!("{}={} reason:{} message:{}", c.r#type, c.status, c.reason, c.message);
    let mut errs = vec![];
    match find("RuntimeReady") {
        Some(c) if c.status => {}
        Some(c) => errs.push(format!("container runtime not ready: {}", show(c))),
        None => errs.push("container runtime not ready: <nil>".into()),
    }
    match find("NetworkReady") {
        Some(c) if c.status => {}
        Some(c) => errs.push(format!("container runtime network not ready: {}", show(c))),
        None => errs.push("container runtime network not ready: <nil>".into()),
    }
    errs
}

/// utilerrors.NewAggregate(errs).Error(): one error as is, several in brackets.
fn aggregate(errs: &[String]) -> String {
    match errs {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// `names` are the image's digests then tags, at most five (the kubelet's
/// maxNamesPerImageInNodeStatus); largest images first, at most
/// `max_images` (-1: all), as the kubelet's image status setter.
pub fn images_for_status(images: &[api::Image], max_images: i32) -> Vec<ContainerImage> {
    let mut sorted: Vec<&api::Image> = images.iter().collect();
    sorted.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| a.id.cmp(&b.id)));
    if max_images >= 0 {
        sorted.truncate(max_images as usize);
    }
    sorted
        .into_iter()
        .map(|i| {
            let mut names: Vec<String> = i.repo_digests.iter().chain(&i.repo_tags).cloned().collect();
            names.truncate(5);
            ContainerImage { names: Some(names), size_bytes: Some(i.size as i64) }
        })
        .collect()
}

/// The runtime handlers node status reports (CRI Status
/// runtime_handlers; the default handler is named "").
pub fn runtime_handlers(status: &api::StatusResponse) -> Vec<NodeRuntimeHandler> {
    status
        .runtime_handlers
        .iter()
        .map(|h| NodeRuntimeHandler {
            name: Some(h.name.clone()),
            features: h.features.as_ref().map(|f| NodeRuntimeHandlerFeatures {
                recursive_read_only_mounts: Some(f.recursive_read_only_mounts),
                user_namespaces: Some(f.user_namespaces),
            }),
        })
        .collect()
}

fn set_condition(
    conditions: &mut Vec<ApiCondition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: &Time,
) -> bool {
    let status = if status { "True" } else { "False" };
    let idx = match conditions.iter().position(|c| c.type_ == type_) {
        Some(i) => i,
        None => {
            conditions.push(ApiCondition { type_: type_.into(), status: "Unknown".into(), ..Default::default() });
            conditions.len() - 1
        }
    };
    let c = &mut conditions[idx];
    let transition = c.status != status;
    if transition {
        c.last_transition_time = Some(now.clone());
    }
    c.status = status.into();
    c.reason = Some(reason.into());
    c.message = Some(message.into());
    c.last_heartbeat_time = Some(now.clone());
    transition
}

/// The status to report, from the status the API server holds (None at
/// registration), and the events of the conditions that changed.
pub fn node_status(current: Option<&NodeStatus>, facts: &NodeFacts, now: Timestamp) -> (NodeStatus, Vec<NodeEvent>) {
    let now = api_now(now);
    let mut status = current.cloned().unwrap_or_default();
    let to_q = |m: &BTreeMap<String, String>| -> BTreeMap<String, Quantity> {
        m.iter().map(|(k, v)| (k.clone(), Quantity(v.clone()))).collect()
    };
    // Extended resources others put in capacity (device plugins) are kept.
    let mut capacity: BTreeMap<String, Quantity> = status.capacity.take().unwrap_or_default();
    let mut allocatable: BTreeMap<String, Quantity> = status.allocatable.take().unwrap_or_default();
    for k in ["cpu", "memory", "ephemeral-storage", "pods"] {
        capacity.remove(k);
        allocatable.remove(k);
    }
    capacity.extend(to_q(&facts.capacity));
    allocatable.extend(to_q(&facts.allocatable));
    // Device plugin resources: set from the device manager, deleted once
    // it dropped them (as the kubelet's setter does with its removed list).
    for r in &facts.extended.removed {
        capacity.remove(r);
        allocatable.remove(r);
    }
    for (r, n) in &facts.extended.capacity {
        capacity.insert(r.clone(), Quantity(n.to_string()));
    }
    for (r, n) in &facts.extended.allocatable {
        allocatable.insert(r.clone(), Quantity(n.to_string()));
    }
    status.capacity = Some(capacity);
    status.allocatable = Some(allocatable);
    status.addresses = Some(facts.addresses.clone());
    status.daemon_endpoints =
        Some(NodeDaemonEndpoints { kubelet_endpoint: Some(DaemonEndpoint { port: facts.kubelet_port }) });
    let m = &facts.machine;
    status.node_info = Some(NodeSystemInfo {
        architecture: m.architecture.clone(),
        boot_id: m.boot_id.clone(),
        container_runtime_version: facts.runtime_version.clone(),
        kernel_version: m.kernel_version.clone(),
        kube_proxy_version: String::new(),
        kubelet_version: facts.kubelet_version.clone(),
        machine_id: m.machine_id.clone(),
        operating_system: m.operating_system.clone(),
        os_image: m.os_image.clone(),
        swap: status.node_info.as_ref().and_then(|n| n.swap.clone()),
        system_uuid: m.system_uuid.clone(),
        ..Default::default()
    });
    status.images = Some(facts.images.clone());
    status.volumes_in_use = (!facts.volumes_in_use.is_empty()).then(|| facts.volumes_in_use.clone());
    status.runtime_handlers = (!facts.runtime_handlers.is_empty()).then(|| facts.runtime_handlers.clone());
    // Only what the runtime reports: a runtime without the feature (as
    // containerd 1.6) leaves it false, so Strict pods are not sent here.
    status.features = Some(NodeFeatures { supplemental_groups_policy: Some(facts.supplemental_groups_policy) });

    let mut conditions = status.conditions.take().unwrap_or_default();
    let mut events = vec![];
    for c in NodeCondition::ALL {
        let t = pressure_text(c);
        let on = facts.pressure.contains(&c);
        // swiftlet's own condition (the optional memory.pressure signal)
        // appears once it first holds, so nodes without the signal show
        // only the kubelet's conditions.
        if c == NodeCondition::MemoryContention && !on && !conditions.iter().any(|x| x.type_ == t.type_) {
            continue;
        }
        let (reason, message, event) = if on { t.on } else { t.off };
        if set_condition(&mut conditions, t.type_, on, reason, message, &now) {
            events.push(event);
        }
    }
    let ready = facts.runtime_errors.is_empty();
    let (reason, message, event) = if ready {
        ("KubeletReady", "kubelet is posting ready status".to_owned(), "NodeReady")
    } else {
        ("KubeletNotReady", aggregate(&facts.runtime_errors), "NodeNotReady")
    };
    if set_condition(&mut conditions, "Ready", ready, reason, &message, &now) {
        events.push(event);
    }
    status.conditions = Some(conditions);
    (status, events)
}

/// The kubelet's nodeStatusHasChanged: anything but the conditions'
/// heartbeat times.
pub fn status_changed(old: &NodeStatus, new: &NodeStatus) -> bool {
    let normalize = |s: &NodeStatus| {
        let mut s = s.clone();
        if let Some(cs) = s.conditions.as_mut() {
            for c in cs.iter_mut() {
                c.last_heartbeat_time = None;
            }
            cs.sort_by(|a, b| a.type_.cmp(&b.type_));
        }
        serde_json::to_value(&s).unwrap_or_default()
    };
    normalize(old) != normalize(new)
}

/// Send now? On a change, or when nodeStatusReportFrequency has passed
/// since the last report (`since_report`: None before the first one).
pub fn should_report(
    changed: bool,
    since_report: Option<std::time::Duration>,
    report_every: std::time::Duration,
) -> bool {
    changed || since_report.is_none_or(|d| d >= report_every)
}

/// The node's taints with a NoSchedule taint for each pressure condition
/// that holds and none for those that do not; None when nothing changes.
/// (In a cluster the node lifecycle controller keeps the same taints; the
/// two agree, so the taints are right with or without it.)
pub fn pressure_taints(current: &[Taint], pressure: &BTreeSet<NodeCondition>) -> Option<Vec<Taint>> {
    let mut taints: Vec<Taint> = current
        .iter()
        .filter(|t| {
            NodeCondition::ALL
                .iter()
                .find(|c| c.taint_key() == t.key)
                .is_none_or(|c| pressure.contains(c) && t.effect == "NoSchedule")
        })
        .cloned()
        .collect();
    for c in pressure {
        if !taints.iter().any(|t| t.key == c.taint_key() && t.effect == "NoSchedule") {
            taints.push(Taint { key: c.taint_key().into(), effect: "NoSchedule".into(), ..Default::default() });
        }
    }
    (taints != current).then_some(taints)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn facts() -> NodeFacts {
        NodeFacts {
            capacity: [("cpu", "2"), ("memory", "8Gi"), ("pods", "110")]
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            allocatable: [("cpu", "2"), ("memory", "7Gi"), ("pods", "110")]
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            runtime_version: "containerd://1.6.20".into(),
            kubelet_version: "v1.33.0-swiftlet.0.1.0".into(),
            kubelet_port: 10250,
            addresses: vec![NodeAddress { type_: "InternalIP".into(), address: "10.0.0.5".into() }],
            ..Default::default()
        }
    }

    fn cond<'a>(s: &'a NodeStatus, t: &str) -> &'a ApiCondition {
        s.conditions.as_ref().unwrap().iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn first_status_has_every_condition_and_its_event() {
        let (s, events) = node_status(None, &facts(), t(0));
        assert_eq!(
            events,
            vec!["NodeHasSufficientMemory", "NodeHasNoDiskPressure", "NodeHasSufficientPID", "NodeReady"]
        );
        let ready = cond(&s, "Ready");
        assert_eq!((ready.status.as_str(), ready.reason.as_deref()), ("True", Some("KubeletReady")));
        assert_eq!(ready.message.as_deref(), Some("kubelet is posting ready status"));
        let mem = cond(&s, "MemoryPressure");
        assert_eq!((mem.status.as_str(), mem.reason.as_deref()), ("False", Some("KubeletHasSufficientMemory")));
        assert_eq!(cond(&s, "PIDPressure").message.as_deref(), Some("kubelet has sufficient PID available"));
        assert_eq!(s.capacity.as_ref().unwrap()["memory"], Quantity("8Gi".into()));
        assert_eq!(s.allocatable.as_ref().unwrap()["memory"], Quantity("7Gi".into()));
        assert_eq!(s.daemon_endpoints.unwrap().kubelet_endpoint.unwrap().port, 10250);
        assert_eq!(s.node_info.unwrap().container_runtime_version, "containerd://1.6.20");
        assert_eq!(
            s.features.and_then(|f| f.supplemental_groups_policy),
            Some(false),
            "a runtime that does not report the feature does not have it"
        );
    }

    #[test]
    fn the_memory_pressure_signals_condition_appears_once_it_first_holds() {
        let (s, _) = node_status(None, &facts(), t(0));
        let has =
            |s: &NodeStatus| s.conditions.as_ref().unwrap().iter().any(|c| c.type_ == "SystemMemoryContentionPressure");
        assert!(!has(&s), "a node without the signal shows the kubelet's conditions only");
        let mut f = facts();
        f.pressure.insert(NodeCondition::MemoryContention);
        let (s, events) = node_status(Some(&s), &f, t(10));
        assert_eq!(events, vec!["NodeHasMemoryContentionPressure"]);
        let c = cond(&s, "SystemMemoryContentionPressure");
        assert_eq!((c.status.as_str(), c.reason.as_deref()), ("True", Some("KubeletHasMemoryContentionPressure")));
        let (s, events) = node_status(Some(&s), &facts(), t(20));
        assert_eq!(events, vec!["NodeHasNoMemoryContentionPressure"]);
        assert_eq!(cond(&s, "SystemMemoryContentionPressure").status, "False", "kept, False, once it has held");
    }

    #[test]
    fn transitions_table() {
        struct Case {
            name: &'static str,
            change: fn(&mut NodeFacts),
            events: Vec<&'static str>,
            check: fn(&NodeStatus),
        }
        let cases = vec![
            Case { name: "nothing", change: |_| {}, events: vec![], check: |_| {} },
            Case {
                name: "memory pressure",
                change: |f| {
                    f.pressure.insert(NodeCondition::MemoryPressure);
                },
                events: vec!["NodeHasInsufficientMemory"],
                check: |s| {
                    let c = cond(s, "MemoryPressure");
                    assert_eq!(c.status, "True");
                    assert_eq!(c.reason.as_deref(), Some("KubeletHasInsufficientMemory"));
                    assert_eq!(c.last_transition_time, Some(api_now(t(10))));
                },
            },
            Case {
                name: "disk and pid pressure",
                change: |f| {
                    f.pressure.extend([NodeCondition::DiskPressure, NodeCondition::PidPressure]);
                },
                events: vec!["NodeHasDiskPressure", "NodeHasInsufficientPID"],
                check: |s| assert_eq!(cond(s, "DiskPressure").message.as_deref(), Some("kubelet has disk pressure")),
            },
            Case {
                name: "runtime down",
                change: |f| f.runtime_errors = runtime_errors(None),
                events: vec!["NodeNotReady"],
                check: |s| {
                    let c = cond(s, "Ready");
                    assert_eq!(c.status, "False");
                    assert_eq!(c.reason.as_deref(), Some("KubeletNotReady"));
                    assert_eq!(c.message.as_deref(), Some("container runtime is down"));
                },
            },
            Case {
                name: "two errors aggregate",
                change: |f| f.runtime_errors = vec!["a".into(), "b".into()],
                events: vec!["NodeNotReady"],
                check: |s| assert_eq!(cond(s, "Ready").message.as_deref(), Some("[a, b]")),
            },
        ];
        let (base, _) = node_status(None, &facts(), t(0));
        for c in cases {
            let mut f = facts();
            (c.change)(&mut f);
            let (s, events) = node_status(Some(&base), &f, t(10));
            assert_eq!(events, c.events, "{}", c.name);
            (c.check)(&s);
            // Heartbeats move, transitions only with the status.
            let ready = cond(&s, "Ready");
            assert_eq!(ready.last_heartbeat_time, Some(api_now(t(10))), "{}", c.name);
            if !c.events.contains(&"NodeNotReady") {
                assert_eq!(ready.last_transition_time, Some(api_now(t(0))), "{}", c.name);
            }
            assert_eq!(status_changed(&base, &s), !c.events.is_empty(), "{}", c.name);
        }
    }

    #[test]
    fn foreign_conditions_and_extended_resources_are_kept() {
        let (mut base, _) = node_status(None, &facts(), t(0));
        base.conditions.as_mut().unwrap().insert(
            0,
            ApiCondition { type_: "NetworkUnavailable".into(), status: "False".into(), ..Default::default() },
        );
        base.capacity.as_mut().unwrap().insert("example.com/gpu".into(), Quantity("1".into()));
        let (s, _) = node_status(Some(&base), &facts(), t(5));
        assert_eq!(s.conditions.as_ref().unwrap()[0].type_, "NetworkUnavailable");
        assert_eq!(s.conditions.as_ref().unwrap().len(), 5);
        assert_eq!(s.capacity.as_ref().unwrap()["example.com/gpu"], Quantity("1".into()));
    }

    #[test]
    fn device_plugin_resources_are_set_and_removed() {
        use crate::deviceplugin::devices::ExtendedResources;
        // (name, (capacity, allocatable) in the API's status before, the
        // device manager's figures, what status reports then)
        type Counts<'a> = Option<(&'a str, &'a str)>;
        let cases: Vec<(&str, Counts, ExtendedResources, Counts)> = vec![
            ("none", None, ExtendedResources::default(), None),
            (
                "two devices, one healthy",
                None,
                ExtendedResources {
                    capacity: [("swiftlet.dev/fake".to_string(), 2)].into(),
                    allocatable: [("swiftlet.dev/fake".to_string(), 1)].into(),
                    ..Default::default()
                },
                Some(("2", "1")),
            ),
            (
                "plugin gone: 0 allocatable",
                Some(("2", "2")),
                ExtendedResources {
                    capacity: [("swiftlet.dev/fake".to_string(), 2)].into(),
                    allocatable: [("swiftlet.dev/fake".to_string(), 0)].into(),
                    ..Default::default()
                },
                Some(("2", "0")),
            ),
            (
                "removed after the grace period",
                Some(("2", "0")),
                ExtendedResources { removed: ["swiftlet.dev/fake".to_string()].into(), ..Default::default() },
                None,
            ),
        ];
        for (name, before, extended, want) in cases {
            let (mut base, _) = node_status(None, &facts(), t(0));
            if let Some((c, a)) = before {
                base.capacity.as_mut().unwrap().insert("swiftlet.dev/fake".into(), Quantity(c.into()));
                base.allocatable.as_mut().unwrap().insert("swiftlet.dev/fake".into(), Quantity(a.into()));
            }
            let f = NodeFacts { extended, ..facts() };
            let (s, _) = node_status(Some(&base), &f, t(5));
            let got = s
                .capacity
                .as_ref()
                .unwrap()
                .get("swiftlet.dev/fake")
                .map(|c| (c.0.clone(), s.allocatable.as_ref().unwrap()["swiftlet.dev/fake"].0.clone()));
            assert_eq!(got, want.map(|(c, a)| (c.to_string(), a.to_string())), "{name}");
            assert_eq!(s.capacity.as_ref().unwrap()["memory"], Quantity("8Gi".into()), "{name}: core resources stay");
        }
    }

    #[test]
    fn changes_and_report_frequency() {
        let (a, _) = node_status(None, &facts(), t(0));
        let (b, _) = node_status(Some(&a), &facts(), t(10));
        assert!(!status_changed(&a, &b), "only heartbeats moved");
        let mut f = facts();
        f.allocatable.insert("memory".into(), "6Gi".into());
        let (c, _) = node_status(Some(&a), &f, t(10));
        assert!(status_changed(&a, &c));
        let five_min = std::time::Duration::from_secs(300);
        assert!(should_report(false, None, five_min));
        assert!(!should_report(false, Some(std::time::Duration::from_secs(10)), five_min));
        assert!(should_report(true, Some(std::time::Duration::from_secs(10)), five_min));
        assert!(should_report(false, Some(five_min), five_min));
    }

    #[test]
    fn runtime_error_wording() {
        let cond = |t: &str, ok: bool, reason: &str, message: &str| api::RuntimeCondition {
            r#type: t.into(),
            status: ok,
            reason: reason.into(),
            message: message.into(),
        };
        let ready = api::RuntimeStatus {
            conditions: vec![cond("RuntimeReady", true, "", ""), cond("NetworkReady", true, "", "")],
        };
        assert!(runtime_errors(Some(&ready)).is_empty());
        let no_cni = api::RuntimeStatus {
            conditions: vec![
                cond("RuntimeReady", true, "", ""),
                cond(
                    "NetworkReady",
                    false,
                    "NetworkPluginNotReady",
                    "Network plugin returns error: cni plugin not initialized",
                ),
            ],
        };
        assert_eq!(
            runtime_errors(Some(&no_cni)),
            vec![
                "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized"
            ]
        );
        assert_eq!(runtime_errors(None), vec!["container runtime is down"]);
    }

    #[test]
    fn images_largest_first_limited() {
        let img = |id: &str, size: u64, tags: &[&str], digests: &[&str]| api::Image {
            id: id.into(),
            size,
            repo_tags: tags.iter().map(|s| (*s).into()).collect(),
            repo_digests: digests.iter().map(|s| (*s).into()).collect(),
            ..Default::default()
        };
        let images = vec![
            img("a", 10, &["pause:3.9"], &[]),
            img("b", 30, &["busybox:1.35", "busybox:latest"], &["busybox@sha256:1"]),
            img("c", 20, &["t1", "t2", "t3", "t4", "t5", "t6"], &[]),
        ];
        let s = images_for_status(&images, 2);
        assert_eq!(s.len(), 2);
        assert_eq!(
            s[0].names.as_ref().unwrap(),
            &vec!["busybox@sha256:1".to_owned(), "busybox:1.35".into(), "busybox:latest".into()]
        );
        assert_eq!(s[0].size_bytes, Some(30));
        assert_eq!(s[1].names.as_ref().unwrap().len(), 5);
        assert_eq!(images_for_status(&images, -1).len(), 3);
        assert_eq!(images_for_status(&images, 0).len(), 0);
    }

    #[test]
    fn pressure_taints_table() {
        let taint = |k: &str, e: &str| Taint { key: k.into(), effect: e.into(), ..Default::default() };
        let mem = NodeCondition::MemoryPressure;
        type Case = (&'static str, Vec<Taint>, BTreeSet<NodeCondition>, Option<Vec<Taint>>);
        let cases: Vec<Case> = vec![
            ("none, no pressure", vec![], BTreeSet::new(), None),
            (
                "add",
                vec![taint("x", "NoExecute")],
                [mem].into(),
                Some(vec![taint("x", "NoExecute"), taint(mem.taint_key(), "NoSchedule")]),
            ),
            ("already there", vec![taint(mem.taint_key(), "NoSchedule")], [mem].into(), None),
            (
                "remove",
                vec![taint(mem.taint_key(), "NoSchedule"), taint("x", "NoSchedule")],
                BTreeSet::new(),
                Some(vec![taint("x", "NoSchedule")]),
            ),
            (
                "swap one for another",
                vec![taint(NodeCondition::DiskPressure.taint_key(), "NoSchedule")],
                [NodeCondition::PidPressure].into(),
                Some(vec![taint(NodeCondition::PidPressure.taint_key(), "NoSchedule")]),
            ),
        ];
        for (name, current, pressure, want) in cases {
            assert_eq!(pressure_taints(&current, &pressure), want, "{name}");
        }
    }
}
