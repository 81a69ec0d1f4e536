//! The pod conditions the kubelet owns, from the container statuses it
//! generated (pkg/kubelet/status generate.go): Initialized (regular init
//! containers completed, sidecars started), ContainersReady (regular
//! containers and sidecars ready), and Ready (ContainersReady and every
//! readiness gate's condition True; the gates' conditions are set by
//! others through the API server and come with the pod). Pure.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodCondition};

use super::sidecars;

pub const CONTAINERS_NOT_INITIALIZED: &str = "ContainersNotInitialized";
pub const CONTAINERS_NOT_READY: &str = "ContainersNotReady";
pub const READINESS_GATES_NOT_READY: &str = "ReadinessGatesNotReady";
pub const POD_COMPLETED: &str = "PodCompleted";
pub const POD_FAILED: &str = "PodFailed";

/// A pod condition the kubelet sets, True or False.
pub(super) fn condition(type_: &str, ok: bool, reason: Option<&str>, message: Option<String>) -> PodCondition {
    PodCondition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.map(str::to_owned),
        message,
        ..Default::default()
    }
}

fn find<'a>(statuses: &'a [ContainerStatus], name: &str) -> Option<&'a ContainerStatus> {
    statuses.iter().find(|s| s.name == name)
}

/// `[a b]`, as Go prints a list of names.
fn list(names: &[&str]) -> String {
    format!("[{}]", names.join(" "))
}

fn unready_message(unknown: &[&str], unready: &[&str], what: &str) -> String {
    let mut parts = vec![];
    if !unknown.is_empty() {
        parts.push(format!("containers with unknown status: {}", list(unknown)));
    }
    if !unready.is_empty() {
        parts.push(format!("containers with {what} status: {}", list(unready)));
    }
    parts.join(", ")
}

/// Whether a regular container has run (HasAnyRegularContainerStarted).
fn any_regular_started(pod: &Pod, regular: &[ContainerStatus]) -> bool {
    regular.iter().any(|s| {
        pod.spec.as_ref().is_some_and(|sp| sp.containers.iter().any(|c| c.name == s.name))
            && s.state.as_ref().is_some_and(|x| x.running.is_some() || x.terminated.is_some())
    })
}

/// GeneratePodInitializedCondition.
pub fn initialized(pod: &Pod, init: &[ContainerStatus], regular: &[ContainerStatus], phase: &str) -> PodCondition {
    let inits = pod.spec.iter().flat_map(|s| s.init_containers.iter().flatten());
    let (mut unknown, mut incomplete) = (vec![], vec![]);
    for c in inits {
        match find(init, &c.name) {
            None => unknown.push(c.name.as_str()),
            Some(s) => {
                let done = if sidecars::is_sidecar(c) { s.started == Some(true) } else { s.ready };
                if !done {
                    incomplete.push(c.name.as_str());
                }
            }
        }
    }
    if phase == "Succeeded" && unknown.is_empty() {
        return condition("Initialized", true, Some(POD_COMPLETED), None);
    }
    if any_regular_started(pod, regular) {
        return condition("Initialized", true, None, None);
    }
    let message = unready_message(&unknown, &incomplete, "incomplete");
    if message.is_empty() {
        condition("Initialized", true, None, None)
    } else {
        condition("Initialized", false, Some(CONTAINERS_NOT_INITIALIZED), Some(message))
    }
}

/// GenerateContainersReadyCondition: regular containers and sidecars.
pub fn containers_ready(pod: &Pod, init: &[ContainerStatus], regular: &[ContainerStatus], phase: &str) -> PodCondition {
    let (mut unknown, mut unready) = (vec![], vec![]);
    let spec = pod.spec.as_ref();
    let sidecars =
        spec.into_iter().flat_map(|s| s.init_containers.iter().flatten()).filter(|c| sidecars::is_sidecar(c));
    for (c, statuses) in
        sidecars.map(|c| (c, init)).chain(spec.into_iter().flat_map(|s| &s.containers).map(|c| (c, regular)))
    {
        match find(statuses, &c.name) {
            None => unknown.push(c.name.as_str()),
            Some(s) if !s.ready => unready.push(c.name.as_str()),
            Some(_) => {}
        }
    }
    if phase == "Succeeded" && unknown.is_empty() {
        return condition("ContainersReady", false, Some(POD_COMPLETED), None);
    }
    if phase == "Failed" {
        return condition("ContainersReady", false, Some(POD_FAILED), None);
    }
    let message = unready_message(&unknown, &unready, "unready");
    if message.is_empty() {
        condition("ContainersReady", true, None, None)
    } else {
        condition("ContainersReady", false, Some(CONTAINERS_NOT_READY), Some(message))
    }
}

/// GeneratePodReadyCondition: ContainersReady, then every readiness gate's
/// condition (from `conditions`, the pod's own and others') True.
pub fn ready(pod: &Pod, containers_ready: &PodCondition, conditions: &[PodCondition]) -> PodCondition {
    if containers_ready.status != "True" {
        let mut c = containers_ready.clone();
        c.type_ = "Ready".into();
        return c;
    }
    let mut unready = vec![];
    for gate in pod.spec.iter().flat_map(|s| s.readiness_gates.iter().flatten()) {
        let t = &gate.condition_type;
        match conditions.iter().find(|c| c.type_ == *t) {
            None => unready.push(format!("corresponding condition of pod readiness gate {t:?} does not exist.")),
            Some(c) if c.status != "True" => {
                unready.push(format!("the status of pod readiness gate {t:?} is not \"True\", but {}", c.status))
            }
            Some(_) => {}
        }
    }
    if unready.is_empty() {
        condition("Ready", true, None, None)
    } else {
        condition("Ready", false, Some(READINESS_GATES_NOT_READY), Some(unready.join(", ")))
    }
}

/// The conditions of a pod that others set (readiness gates' among them):
/// every one of the pod's API status that the kubelet does not own.
pub fn foreign(pod: &Pod) -> Vec<PodCondition> {
    const OWNED: [&str; 8] = [
        "PodScheduled",
        "Ready",
        "Initialized",
        "ContainersReady",
        "PodReadyToStartContainers",
        "DisruptionTarget",
        "PodResizePending",
        "PodResizeInProgress",
    ];
    pod.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .filter(|c| !OWNED.contains(&c.type_.as_str()))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        Container, ContainerState, ContainerStateRunning, PodReadinessGate, PodSpec, PodStatus,
    };

    use super::*;

    fn running(name: &str, ready: bool, started: bool) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            ready,
            started: Some(started),
            state: Some(ContainerState { running: Some(ContainerStateRunning::default()), ..Default::default() }),
            ..Default::default()
        }
    }

    fn pod(gates: &[&str], conditions: &[(&str, &str)]) -> Pod {
        Pod {
            spec: Some(PodSpec {
                init_containers: Some(vec![Container {
                    name: "proxy".into(),
                    restart_policy: Some("Always".into()),
                    ..Default::default()
                }]),
                containers: vec![Container { name: "app".into(), ..Default::default() }],
                readiness_gates: Some(
                    gates.iter().map(|g| PodReadinessGate { condition_type: g.to_string() }).collect(),
                ),
                ..Default::default()
            }),
            status: Some(PodStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s)| PodCondition {
                            type_: t.to_string(),
                            status: s.to_string(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn readiness_gates_table() {
        let all_ready = [running("app", true, true)];
        let sidecar = [running("proxy", true, true)];
        type Want<'a> = (&'a str, Option<&'a str>, Option<&'a str>);
        let cases: Vec<(&str, Pod, Want)> = vec![
            ("no gates", pod(&[], &[]), ("True", None, None)),
            (
                "a gate without its condition",
                pod(&["example.com/lb"], &[]),
                (
                    "False",
                    Some("ReadinessGatesNotReady"),
                    Some("corresponding condition of pod readiness gate \"example.com/lb\" does not exist."),
                ),
            ),
            (
                "a gate False",
                pod(&["example.com/lb"], &[("example.com/lb", "False")]),
                (
                    "False",
                    Some("ReadinessGatesNotReady"),
                    Some("the status of pod readiness gate \"example.com/lb\" is not \"True\", but False"),
                ),
            ),
            ("a gate True", pod(&["example.com/lb"], &[("example.com/lb", "True")]), ("True", None, None)),
        ];
        for (name, p, want) in cases {
            let cr = containers_ready(&p, &sidecar, &all_ready, "Running");
            let r = ready(&p, &cr, &foreign(&p));
            assert_eq!((r.status.as_str(), r.reason.as_deref(), r.message.as_deref()), want, "{name}");
        }
    }

    #[test]
    fn sidecars_count_toward_readiness_and_initialization() {
        let p = pod(&[], &[]);
        let cr = containers_ready(&p, &[running("proxy", false, true)], &[running("app", true, true)], "Running");
        assert_eq!(cr.message.as_deref(), Some("containers with unready status: [proxy]"));
        let r = ready(&p, &cr, &[]);
        assert_eq!((r.type_.as_str(), r.status.as_str()), ("Ready", "False"), "Ready follows ContainersReady");
        let init = initialized(&p, &[running("proxy", false, false)], &[], "Pending");
        assert_eq!(init.message.as_deref(), Some("containers with incomplete status: [proxy]"));
        assert_eq!(initialized(&p, &[running("proxy", false, true)], &[], "Pending").status, "True");
        assert_eq!(
            containers_ready(&p, &[], &[], "Succeeded").reason.as_deref(),
            Some("ContainersNotReady"),
            "unknown containers are not completed"
        );
        assert_eq!(
            containers_ready(&p, &[running("proxy", false, true)], &[running("app", false, true)], "Failed")
                .reason
                .as_deref(),
            Some("PodFailed")
        );
    }
}
