//! What to do to bring a pod's runtime state to its spec: the kubelet's
//! computePodActions, pure. The worker executes the plan.
//!
//! The rules, as upstream: a pod gets a new sandbox (and all containers are
//! restarted) when it has none ready; init containers run one at a time,
//! in order, each to success; regular containers start after them and are
//! restarted by restartPolicy; a running container is restarted when its
//! spec hash changed or its liveness/startup probe failed; a pod with
//! nothing left to run has its sandbox stopped.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{
    observed::{ContainerRunState, ContainerState, ObservedPod},
    sidecars,
    spec::hash_matches,
};

/// Why a running container is killed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KillContainer {
    pub id: String,
    pub name: String,
    pub message: String,
    /// The probe that failed ("Liveness", "Startup"), for the event.
    pub probe: Option<&'static str>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodActions {
    /// Stop every container and the sandbox(es) first.
    pub kill_pod: bool,
    /// Create a sandbox with this attempt number.
    pub create_sandbox: Option<u32>,
    /// The ready sandbox to start containers in.
    pub sandbox_id: Option<String>,
    /// The next init container to start.
    pub next_init: Option<String>,
    /// Init containers to start, in spec order, for a pod with sidecars
    /// (init containers with restartPolicy Always): the next one to run and
    /// any sidecar that has stopped (the kubelet's InitContainersToStart).
    pub init_start: Vec<String>,
    /// Regular containers to start, in spec order.
    pub start: Vec<String>,
    /// Containers to kill (they may be in `start` too: a restart).
    pub kill: Vec<KillContainer>,
}

/// A probe verdict that ends a running container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeVerdict {
    LivenessFailed,
    StartupFailed,
    /// Its startup probe has not succeeded yet (a sidecar that is not
    /// started holds back the next init container).
    NotStarted,
}

fn restart_policy(pod: &Pod) -> &str {
    pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()).unwrap_or("Always")
}

fn restarts_on_failure(pod: &Pod) -> bool {
    restart_policy(pod) != "Never"
}

fn succeeded(s: Option<&ContainerState>) -> bool {
    s.is_some_and(|s| s.state == ContainerRunState::Exited && s.exit_code == 0)
}

fn init_failed(s: &ContainerState) -> bool {
    s.reason == "OOMKilled"
        || (s.state == ContainerRunState::Exited && s.exit_code != 0)
        || s.state == ContainerRunState::Unknown
}

/// Whether the restart policy restarts failed containers (not Never).
pub(super) fn restarts_on_failure_of(pod: &Pod) -> bool {
    restarts_on_failure(pod)
}

/// ShouldContainerBeRestarted.
pub fn should_start(pod: &Pod, latest: Option<&ContainerState>) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let Some(s) = latest else { return true };
    match s.state {
        ContainerRunState::Running => false,
        ContainerRunState::Unknown | ContainerRunState::Created => true,
        ContainerRunState::Exited => match restart_policy(pod) {
            "Never" => false,
            "OnFailure" => s.exit_code != 0,
            _ => true,
        },
    }
}

/// The status of the last failed init container, the next to run, and
/// whether initialization is done (findNextInitContainerToRun).
pub fn next_init_container<'a>(
    pod: &'a Pod,
    observed: &'a ObservedPod,
) -> (Option<&'a ContainerState>, Option<&'a Container>, bool) {
    let Some(spec) = pod.spec.as_ref() else { return (None, None, true) };
    let inits = spec.init_containers.as_deref().unwrap_or(&[]);
    if inits.is_empty() {
        return (None, None, true);
    }
    // A running regular container means initialization finished earlier.
    if spec.containers.iter().any(|c| observed.latest(&c.name).is_some_and(|s| s.state == ContainerRunState::Running)) {
        return (None, None, true);
    }
    for c in inits.iter().rev() {
        if let Some(s) = observed.latest(&c.name)
            && init_failed(s)
        {
            return (Some(s), Some(c), false);
        }
    }
    for (i, c) in inits.iter().enumerate().rev() {
        let Some(s) = observed.latest(&c.name) else { continue };
        match s.state {
            ContainerRunState::Running => return (None, None, false),
            ContainerRunState::Exited if i == inits.len() - 1 => return (None, None, true),
            ContainerRunState::Exited => return (None, Some(&inits[i + 1]), false),
            _ => {}
        }
    }
    (None, Some(&inits[0]), false)
}

/// podSandboxChanged: (create?, attempt, the sandbox to use).
fn sandbox_decision(observed: &ObservedPod) -> (bool, u32, Option<String>) {
    let Some(latest) = observed.sandboxes.first() else { return (true, 0, None) };
    let ready = observed.sandboxes.iter().filter(|s| s.ready).count();
    if ready > 1 || !latest.ready {
        return (true, latest.attempt + 1, None);
    }
    (false, latest.attempt, Some(latest.id.clone()))
}

pub fn compute(pod: &Pod, observed: &ObservedPod, probes: &HashMap<String, ProbeVerdict>) -> PodActions {
    let mut a = PodActions::default();
    let Some(spec) = pod.spec.as_ref() else { return a };
    let (create, attempt, sandbox_id) = sandbox_decision(observed);
    a.kill_pod = create;
    if create {
        if !restarts_on_failure(pod) && attempt != 0 && !observed.containers.is_empty() {
            // restartPolicy Never: a pod whose sandbox died after its
            // containers ran is not started again.
            return a;
        }
        let start: Vec<String> = spec
            .containers
            .iter()
            .filter(|c| !(restart_policy(pod) == "OnFailure" && succeeded(observed.latest(&c.name))))
            .map(|c| c.name.clone())
            .collect();
        // Initialization done (for a pod with sidecars: a regular
        // container was created, hasAnyRegularContainerCreated) and nothing
        // to start: no new sandbox.
        let initialized = if sidecars::has_sidecars(pod) {
            spec.containers.iter().any(|c| observed.latest(&c.name).is_some())
        } else {
            next_init_container(pod, observed).2
        };
        if start.is_empty() && initialized {
            // Everything already completed: nothing to create a sandbox for.
            return a;
        }
        a.create_sandbox = Some(attempt);
        match spec.init_containers.as_deref().and_then(|i| i.first()) {
            Some(first) => a.next_init = Some(first.name.clone()),
            None => a.start = start,
        }
        return a;
    }
    a.sandbox_id = sandbox_id;

    if sidecars::has_sidecars(pod) {
        let init = sidecars::init_actions(pod, observed, probes);
        a.init_start = init.start;
        a.kill.extend(init.kill);
        if init.kill_pod {
            a.kill_pod = true;
            return a;
        }
        if !init.initialized {
            return a;
        }
    } else {
        let (last_init, next, done) = next_init_container(pod, observed);
        if let Some(stop) = regular_init_actions(pod, &mut a, last_init, next, done) {
            return stop;
        }
    }
    regular_container_actions(pod, spec, observed, probes, &mut a);
    a
}

/// Init containers of a pod without sidecars; Some(actions) when the pod
/// is not initialized yet (or failed).
fn regular_init_actions(
    pod: &Pod,
    a: &mut PodActions,
    last_init: Option<&ContainerState>,
    next: Option<&Container>,
    done: bool,
) -> Option<PodActions> {
    if !done {
        if let Some(next) = next {
            let failed = last_init.is_some_and(init_failed);
            if failed && !restarts_on_failure(pod) {
                a.kill_pod = true;
            } else {
                if let Some(s) = last_init.filter(|s| s.state == ContainerRunState::Unknown) {
                    a.kill.push(KillContainer {
                        id: s.id.clone(),
                        name: s.name.clone(),
                        message: "Init container is in unknown state, it will be killed and re-created".into(),
                        probe: None,
                    });
                }
                a.next_init = Some(next.name.clone());
            }
        }
        return Some(a.clone());
    }
    None
}

/// The regular containers of an initialized pod.
fn regular_container_actions(
    pod: &Pod,
    spec: &k8s_openapi::api::core::v1::PodSpec,
    observed: &ObservedPod,
    probes: &HashMap<String, ProbeVerdict>,
    a: &mut PodActions,
) {
    let mut keep = 0;
    for c in &spec.containers {
        let latest = observed.latest(&c.name);
        match latest {
            Some(s) if s.state == ContainerRunState::Running => {
                let (message, probe, restart) = if !s.hash.is_empty() && !hash_matches(&s.hash, c) {
                    // A changed spec restarts the container whatever the policy.
                    (format!("Container {} definition changed, will be restarted", c.name), None, true)
                } else {
                    match probes.get(&s.id).filter(|v| **v != ProbeVerdict::NotStarted) {
                        Some(ProbeVerdict::LivenessFailed) => (
                            format!("Container {} failed liveness probe, will be restarted", c.name),
                            Some("Liveness"),
                            restarts_on_failure(pod),
                        ),
                        Some(ProbeVerdict::StartupFailed) => (
                            format!("Container {} failed startup probe, will be restarted", c.name),
                            Some("Startup"),
                            restarts_on_failure(pod),
                        ),
                        Some(ProbeVerdict::NotStarted) | None => {
                            keep += 1;
                            continue;
                        }
                    }
                };
                if restart {
                    a.start.push(c.name.clone());
                }
                a.kill.push(KillContainer { id: s.id.clone(), name: c.name.clone(), message, probe });
            }
            _ => {
                if should_start(pod, latest) {
                    a.start.push(c.name.clone());
                    if let Some(s) = latest.filter(|s| s.state == ContainerRunState::Unknown) {
                        a.kill.push(KillContainer {
                            id: s.id.clone(),
                            name: c.name.clone(),
                            message: "Container is in unknown state, it will be killed and re-created".into(),
                            probe: None,
                        });
                    }
                }
            }
        }
    }
    if keep == 0 && a.start.is_empty() {
        a.kill_pod = true;
        // Sidecars do not keep a pod whose containers are done alive.
        a.init_start.clear();
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodSpec;

    use super::*;
    use crate::pods::observed::SandboxState;

    fn pod(policy: &str, inits: &[&str], containers: &[&str]) -> Pod {
        let c = |n: &&str| Container { name: n.to_string(), image: Some("busybox".into()), ..Default::default() };
        let mut p = Pod::default();
        p.metadata.uid = Some("u".into());
        p.spec = Some(PodSpec {
            restart_policy: Some(policy.into()),
            init_containers: (!inits.is_empty()).then(|| inits.iter().map(c).collect()),
            containers: containers.iter().map(c).collect(),
            ..Default::default()
        });
        p
    }

    fn sandbox(ready: bool, attempt: u32) -> SandboxState {
        SandboxState { id: format!("sb{attempt}"), attempt, ready, created_at: attempt as i64, ip: None }
    }

    fn ctr(p: &Pod, name: &str, state: ContainerRunState, exit: i32, created: i64) -> ContainerState {
        let spec = p.spec.as_ref().unwrap();
        let c = spec.containers.iter().chain(spec.init_containers.iter().flatten()).find(|c| c.name == name).unwrap();
        ContainerState {
            id: format!("{name}-{created}"),
            sandbox_id: "sb0".into(),
            name: name.into(),
            attempt: 0,
            init: false,
            state,
            created_at: created,
            started_at: created,
            finished_at: created + 1,
            exit_code: exit,
            reason: String::new(),
            message: String::new(),
            image: "busybox".into(),
            image_ref: "sha256:x".into(),
            hash: crate::pods::spec::container_hash(c),
            grace_period_secs: None,
        }
    }

    fn observed(sandboxes: Vec<SandboxState>, mut containers: Vec<ContainerState>) -> ObservedPod {
        containers.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        ObservedPod { sandboxes, containers }
    }

    use ContainerRunState::{Exited, Running, Unknown};

    #[test]
    fn table() {
        let none = HashMap::new();
        struct Case {
            name: &'static str,
            pod: Pod,
            observed: Box<dyn Fn(&Pod) -> ObservedPod>,
            probes: HashMap<String, ProbeVerdict>,
            want: PodActions,
        }
        let cases = vec![
            Case {
                name: "new pod: sandbox, then the containers",
                pod: pod("Always", &[], &["a", "b"]),
                observed: Box::new(|_| ObservedPod::default()),
                probes: none.clone(),
                want: PodActions {
                    kill_pod: true,
                    create_sandbox: Some(0),
                    start: vec!["a".into(), "b".into()],
                    ..Default::default()
                },
            },
            Case {
                name: "new pod with init containers: the first init container only",
                pod: pod("Always", &["i1", "i2"], &["a"]),
                observed: Box::new(|_| ObservedPod::default()),
                probes: none.clone(),
                want: PodActions {
                    kill_pod: true,
                    create_sandbox: Some(0),
                    next_init: Some("i1".into()),
                    ..Default::default()
                },
            },
            Case {
                name: "dead sandbox: a new attempt",
                pod: pod("Always", &[], &["a"]),
                observed: Box::new(|p| observed(vec![sandbox(false, 0)], vec![ctr(p, "a", Exited, 137, 1)])),
                probes: none.clone(),
                want: PodActions {
                    kill_pod: true,
                    create_sandbox: Some(1),
                    start: vec!["a".into()],
                    ..Default::default()
                },
            },
            Case {
                name: "Never: a dead sandbox after containers ran is not recreated",
                pod: pod("Never", &[], &["a"]),
                observed: Box::new(|p| observed(vec![sandbox(false, 0)], vec![ctr(p, "a", Exited, 1, 1)])),
                probes: none.clone(),
                want: PodActions { kill_pod: true, ..Default::default() },
            },
            Case {
                name: "OnFailure: a dead sandbox restarts only the failed containers",
                pod: pod("OnFailure", &[], &["ok", "bad"]),
                observed: Box::new(|p| {
                    observed(vec![sandbox(false, 0)], vec![ctr(p, "ok", Exited, 0, 1), ctr(p, "bad", Exited, 2, 2)])
                }),
                probes: none.clone(),
                want: PodActions {
                    kill_pod: true,
                    create_sandbox: Some(1),
                    start: vec!["bad".into()],
                    ..Default::default()
                },
            },
            Case {
                name: "init containers run in order",
                pod: pod("Always", &["i1", "i2"], &["a"]),
                observed: Box::new(|p| observed(vec![sandbox(true, 0)], vec![ctr(p, "i1", Exited, 0, 1)])),
                probes: none.clone(),
                want: PodActions { sandbox_id: Some("sb0".into()), next_init: Some("i2".into()), ..Default::default() },
            },
            Case {
                name: "a running init container: wait",
                pod: pod("Always", &["i1", "i2"], &["a"]),
                observed: Box::new(|p| {
                    observed(vec![sandbox(true, 0)], vec![ctr(p, "i1", Exited, 0, 1), ctr(p, "i2", Running, 0, 2)])
                }),
                probes: none.clone(),
                want: PodActions { sandbox_id: Some("sb0".into()), ..Default::default() },
            },
            Case {
                name: "a failed init container is retried (Always)",
                pod: pod("Always", &["i1"], &["a"]),
                observed: Box::new(|p| observed(vec![sandbox(true, 0)], vec![ctr(p, "i1", Exited, 3, 1)])),
                probes: none.clone(),
                want: PodActions { sandbox_id: Some("sb0".into()), next_init: Some("i1".into()), ..Default::default() },
            },
            Case {
                name: "a failed init container fails the pod (Never)",
                pod: pod("Never", &["i1"], &["a"]),
                observed: Box::new(|p| observed(vec![sandbox(true, 0)], vec![ctr(p, "i1", Exited, 3, 1)])),
                probes: none.clone(),
                want: PodActions { kill_pod: true, sandbox_id: Some("sb0".into()), ..Default::default() },
            },
            Case {
                name: "init done: the regular containers start",
                pod: pod("Always", &["i1"], &["a", "b"]),
                observed: Box::new(|p| observed(vec![sandbox(true, 0)], vec![ctr(p, "i1", Exited, 0, 1)])),
                probes: none.clone(),
                want: PodActions {
                    sandbox_id: Some("sb0".into()),
                    start: vec!["a".into(), "b".into()],
                    ..Default::default()
                },
            },
            Case {
                name: "Always restarts a completed container",
                pod: pod("Always", &[], &["a"]),
                observed: Box::new(|p| observed(vec![sandbox(true, 0)], vec![ctr(p, "a", Exited, 0, 1)])),
                probes: none.clone(),
                want: PodActions { sandbox_id: Some("sb0".into()), start: vec!["a".into()], ..Default::default() },
            },
            Case {
                name: "OnFailure leaves a succeeded container; nothing left stops the pod",
                pod: pod("OnFailure", &[], &["a"]),
                observed: Box::new(|p| observed(vec![sandbox(true, 0)], vec![ctr(p, "a", Exited, 0, 1)])),
                probes: none.clone(),
                want: PodActions { kill_pod: true, sandbox_id: Some("sb0".into()), ..Default::default() },
            },
            Case {
                name: "OnFailure restarts a failed container",
                pod: pod("OnFailure", &[], &["a"]),
                observed: Box::new(|p| observed(vec![sandbox(true, 0)], vec![ctr(p, "a", Exited, 1, 1)])),
                probes: none.clone(),
                want: PodActions { sandbox_id: Some("sb0".into()), start: vec!["a".into()], ..Default::default() },
            },
            Case {
                name: "Never leaves a failed container; a running sibling keeps the pod",
                pod: pod("Never", &[], &["a", "b"]),
                observed: Box::new(|p| {
                    observed(vec![sandbox(true, 0)], vec![ctr(p, "a", Exited, 1, 1), ctr(p, "b", Running, 0, 2)])
                }),
                probes: none.clone(),
                want: PodActions { sandbox_id: Some("sb0".into()), ..Default::default() },
            },
            Case {
                name: "liveness failure restarts (Always)",
                pod: pod("Always", &[], &["a"]),
                observed: Box::new(|p| observed(vec![sandbox(true, 0)], vec![ctr(p, "a", Running, 0, 1)])),
                probes: [("a-1".to_string(), ProbeVerdict::LivenessFailed)].into(),
                want: PodActions {
                    sandbox_id: Some("sb0".into()),
                    start: vec!["a".into()],
                    kill: vec![KillContainer {
                        id: "a-1".into(),
                        name: "a".into(),
                        message: "Container a failed liveness probe, will be restarted".into(),
                        probe: Some("Liveness"),
                    }],
                    ..Default::default()
                },
            },
            Case {
                name: "liveness failure under Never kills without restart, and the pod stops",
                pod: pod("Never", &[], &["a"]),
                observed: Box::new(|p| observed(vec![sandbox(true, 0)], vec![ctr(p, "a", Running, 0, 1)])),
                probes: [("a-1".to_string(), ProbeVerdict::LivenessFailed)].into(),
                want: PodActions {
                    kill_pod: true,
                    sandbox_id: Some("sb0".into()),
                    kill: vec![KillContainer {
                        id: "a-1".into(),
                        name: "a".into(),
                        message: "Container a failed liveness probe, will be restarted".into(),
                        probe: Some("Liveness"),
                    }],
                    ..Default::default()
                },
            },
            Case {
                name: "a changed spec restarts the container",
                pod: pod("Never", &[], &["a"]),
                observed: Box::new(|p| {
                    let mut c = ctr(p, "a", Running, 0, 1);
                    c.hash = "old".into();
                    observed(vec![sandbox(true, 0)], vec![c])
                }),
                probes: none.clone(),
                want: PodActions {
                    sandbox_id: Some("sb0".into()),
                    start: vec!["a".into()],
                    kill: vec![KillContainer {
                        id: "a-1".into(),
                        name: "a".into(),
                        message: "Container a definition changed, will be restarted".into(),
                        probe: None,
                    }],
                    ..Default::default()
                },
            },
            Case {
                name: "an unknown container is killed and re-created",
                pod: pod("Always", &[], &["a"]),
                observed: Box::new(|p| observed(vec![sandbox(true, 0)], vec![ctr(p, "a", Unknown, 0, 1)])),
                probes: none.clone(),
                want: PodActions {
                    sandbox_id: Some("sb0".into()),
                    start: vec!["a".into()],
                    kill: vec![KillContainer {
                        id: "a-1".into(),
                        name: "a".into(),
                        message: "Container is in unknown state, it will be killed and re-created".into(),
                        probe: None,
                    }],
                    ..Default::default()
                },
            },
            Case {
                name: "steady state: nothing to do",
                pod: pod("Always", &["i1"], &["a"]),
                observed: Box::new(|p| {
                    observed(vec![sandbox(true, 0)], vec![ctr(p, "i1", Exited, 0, 1), ctr(p, "a", Running, 0, 2)])
                }),
                probes: none.clone(),
                want: PodActions { sandbox_id: Some("sb0".into()), ..Default::default() },
            },
        ];
        for c in cases {
            let obs = (c.observed)(&c.pod);
            assert_eq!(compute(&c.pod, &obs, &c.probes), c.want, "{}", c.name);
        }
    }

    #[test]
    fn a_pod_being_deleted_starts_nothing() {
        let mut p = pod("Always", &[], &["a"]);
        p.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let obs = observed(vec![sandbox(true, 0)], vec![ctr(&p, "a", Exited, 1, 1)]);
        assert_eq!(
            compute(&p, &obs, &HashMap::new()),
            PodActions { kill_pod: true, sandbox_id: Some("sb0".into()), ..Default::default() }
        );
    }
}
