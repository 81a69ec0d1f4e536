//! The pod status the kubelet reports (generateAPIPodStatus, getPhase,
//! convertToAPIContainerStatuses, the condition generators), computed from
//! the runtime state, the probe results and what the last sync learnt.
//! Pure: the same inputs give the same status, so only real changes are
//! reported.

use std::collections::HashMap;

use k8s_openapi::{
    api::core::v1::{
        Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
        ContainerStatus, HostIP, Pod, PodIP, PodStatus,
    },
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};

use super::{
    conditions::{self, condition},
    observed::{self, ContainerRunState, ObservedPod},
    sidecars,
};
use crate::{cm::qos::qos_class, cri::error::reason};

/// A status the kubelet imposes on the pod (eviction, admission failure,
/// node shutdown): phase Failed with a reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TerminalReason {
    pub reason: String,
    pub message: String,
    /// Adds the DisruptionTarget condition (evictions and shutdown).
    pub disruption: bool,
}

pub struct StatusInput<'a> {
    pub pod: &'a Pod,
    pub observed: &'a ObservedPod,
    /// Why a container is not running, from the last sync (CrashLoopBackOff,
    /// ErrImagePull, CreateContainerConfigError, ...): name → (reason, message).
    pub waiting: &'a HashMap<String, (String, String)>,
    /// Readiness results by container id (absent: not yet probed).
    pub readiness: &'a HashMap<String, bool>,
    /// Containers (by id) whose startup probe has not succeeded yet.
    pub not_started: &'a HashMap<String, bool>,
    /// Termination messages by container id.
    pub messages: &'a HashMap<String, String>,
    pub previous: Option<&'a PodStatus>,
    pub host_ip: Option<&'a str>,
    /// "containerd", for container ids (`containerd://<id>`).
    pub runtime_name: &'a str,
    pub now: Timestamp,
    /// The pod will not run again (finished, killed for good).
    pub terminal: bool,
    pub terminal_reason: Option<&'a TerminalReason>,
}

fn time(ns: i64) -> Option<Time> {
    (ns > 0).then(|| Timestamp::from_nanosecond(i128::from(ns)).ok().map(Time)).flatten()
}

fn terminated(c: &observed::ContainerState, runtime: &str, message: Option<&String>) -> ContainerStateTerminated {
    let reason = if !c.reason.is_empty() {
        c.reason.clone()
    } else if c.exit_code == 0 {
        reason::COMPLETED.into()
    } else {
        reason::ERROR.into()
    };
    ContainerStateTerminated {
        exit_code: c.exit_code,
        reason: Some(reason),
        message: message
            .cloned()
            .filter(|m| !m.is_empty())
            .or_else(|| Some(c.message.clone()).filter(|m| !m.is_empty())),
        started_at: time(c.started_at),
        finished_at: time(c.finished_at),
        container_id: Some(format!("{runtime}://{}", c.id)),
        signal: None,
    }
}

fn waiting(reason: &str, message: Option<&str>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.into()),
            message: message.map(str::to_owned).filter(|m| !m.is_empty()),
        }),
        ..Default::default()
    }
}

pub(super) fn container_status(input: &StatusInput<'_>, c: &Container, default_waiting: &str) -> ContainerStatus {
    let obs = input.observed;
    let latest = obs.latest(&c.name);
    let mut s = ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        image_id: String::new(),
        ready: false,
        restart_count: 0,
        started: Some(false),
        ..Default::default()
    };
    let waiting_reason = input.waiting.get(&c.name);
    let Some(latest) = latest else {
        // The runtime no longer has the container (garbage collection
        // removes a finished pod's containers: containerd 2 lists them
        // gone while the pod's status is still reported). As the kubelet's
        // convertToAPIContainerStatuses: a termination reported before
        // stays; otherwise the restart count and last state carry over.
        if let Some(old) = previous_container_status(input.previous, &c.name) {
            if old.state.as_ref().is_some_and(|st| st.terminated.is_some()) {
                return old.clone();
            }
            s.restart_count = old.restart_count;
            s.last_state = old.last_state.clone();
        }
        let (r, m) = waiting_reason.map(|(r, m)| (r.as_str(), Some(m.as_str()))).unwrap_or((default_waiting, None));
        s.state = Some(waiting(r, m));
        return s;
    };
    s.restart_count = latest.attempt as i32;
    s.image_id = latest.image_ref.clone();
    s.container_id = Some(format!("{}://{}", input.runtime_name, latest.id));
    let last = |x: Option<&observed::ContainerState>| {
        x.filter(|p| p.state == ContainerRunState::Exited).map(|p| ContainerState {
            terminated: Some(terminated(p, input.runtime_name, input.messages.get(&p.id))),
            ..Default::default()
        })
    };
    match latest.state {
        ContainerRunState::Running => {
            let started = !input.not_started.get(&latest.id).copied().unwrap_or(false);
            s.state = Some(ContainerState {
                running: Some(ContainerStateRunning { started_at: time(latest.started_at) }),
                ..Default::default()
            });
            s.started = Some(started);
            s.ready = started
                && if c.readiness_probe.is_some() {
                    input.readiness.get(&latest.id).copied().unwrap_or(false)
                } else {
                    true
                };
            s.last_state = last(obs.previous(&c.name));
        }
        ContainerRunState::Exited => match waiting_reason {
            // Waiting to be restarted: the exit is the last state.
            Some((r, m)) if !input.terminal => {
                s.state = Some(waiting(r, Some(m)));
                s.last_state = last(Some(latest));
            }
            _ => {
                s.state = Some(ContainerState {
                    terminated: Some(terminated(latest, input.runtime_name, input.messages.get(&latest.id))),
                    ..Default::default()
                });
                s.last_state = last(obs.previous(&c.name));
            }
        },
        ContainerRunState::Created => {
            // Created but not started: a failed start says why.
            let (r, m) = waiting_reason
                .map(|(r, m)| (r.as_str(), Some(m.as_str())))
                .unwrap_or((reason::CONTAINER_CREATING, None));
            s.state = Some(waiting(r, m));
        }
        ContainerRunState::Unknown => {
            s.state = Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 137,
                    reason: Some(reason::CONTAINER_STATUS_UNKNOWN.into()),
                    message: Some("The container could not be located when the pod was terminated".into()),
                    container_id: s.container_id.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
    }
    s
}

/// The status reported before for the container of that name (names are
/// unique across a pod's init, regular and ephemeral containers).
fn previous_container_status<'a>(previous: Option<&'a PodStatus>, name: &str) -> Option<&'a ContainerStatus> {
    let p = previous?;
    [&p.init_container_statuses, &p.container_statuses, &p.ephemeral_container_statuses]
        .into_iter()
        .flat_map(|l| l.iter().flatten())
        .find(|s| s.name == name)
}

/// HasAnyRegularContainerStarted.
fn any_regular_started(pod: &Pod, statuses: &[ContainerStatus]) -> bool {
    let spec = pod.spec.as_ref();
    statuses.iter().any(|s| {
        spec.is_some_and(|sp| sp.containers.iter().any(|c| c.name == s.name))
            && s.state.as_ref().is_some_and(|x| x.running.is_some() || x.terminated.is_some())
    })
}

fn last_terminated(s: &ContainerStatus) -> Option<&k8s_openapi::api::core::v1::ContainerStateTerminated> {
    s.last_state.as_ref().and_then(|l| l.terminated.as_ref())
}

/// getPhase, with sidecars: a sidecar that has not started is pending
/// initialization; terminated sidecars do not count.
pub fn phase(pod: &Pod, init: &[ContainerStatus], regular: &[ContainerStatus], terminal: bool) -> &'static str {
    let spec = pod.spec.as_ref();
    let policy = spec.and_then(|s| s.restart_policy.as_deref()).unwrap_or("Always");
    let is_sidecar = |name: &str| {
        spec.into_iter()
            .flat_map(|s| s.init_containers.iter().flatten())
            .any(|c| c.name == name && sidecars::is_sidecar(c))
    };
    let (mut pending_init, mut failed_init) = (0, 0);
    let (mut unknown, mut running, mut waiting_n, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for s in init {
        let st = s.state.as_ref();
        if is_sidecar(&s.name) {
            if st.and_then(|x| x.running.as_ref()).is_some() {
                if s.started != Some(true) {
                    pending_init += 1;
                }
                running += 1;
            } else if st.and_then(|x| x.terminated.as_ref()).is_some() {
            } else if st.and_then(|x| x.waiting.as_ref()).is_some() {
                if last_terminated(s).is_none() {
                    pending_init += 1;
                    waiting_n += 1;
                }
            } else {
                pending_init += 1;
                unknown += 1;
            }
            continue;
        }
        if st.and_then(|x| x.running.as_ref()).is_some() {
            pending_init += 1;
        } else if let Some(t) = st.and_then(|x| x.terminated.as_ref()) {
            if t.exit_code != 0 {
                failed_init += 1;
            }
        } else if st.and_then(|x| x.waiting.as_ref()).is_some() {
            match last_terminated(s) {
                Some(t) if t.exit_code != 0 => failed_init += 1,
                Some(_) => {}
                None => pending_init += 1,
            }
        } else {
            pending_init += 1;
        }
    }
    for s in regular {
        let st = s.state.as_ref();
        if st.and_then(|x| x.running.as_ref()).is_some() {
            running += 1;
        } else if let Some(t) = st.and_then(|x| x.terminated.as_ref()) {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if st.and_then(|x| x.waiting.as_ref()).is_some() {
            if last_terminated(s).is_some() {
                stopped += 1;
            } else {
                waiting_n += 1;
            }
        } else {
            unknown += 1;
        }
    }
    if failed_init > 0 && policy == "Never" {
        return "Failed";
    }
    if pending_init > 0 && !terminal && !any_regular_started(pod, regular) || waiting_n > 0 {
        return "Pending";
    }
    if running > 0 && unknown == 0 {
        return "Running";
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        if terminal {
            return if stopped == succeeded { "Succeeded" } else { "Failed" };
        }
        return match policy {
            "Always" => "Running",
            _ if stopped == succeeded => "Succeeded",
            "Never" => "Failed",
            _ => "Running",
        };
    }
    "Pending"
}

pub fn generate(input: &StatusInput<'_>) -> PodStatus {
    let pod = input.pod;
    let empty = vec![];
    let spec = pod.spec.as_ref();
    let inits = spec.and_then(|s| s.init_containers.as_ref()).unwrap_or(&empty);
    let containers = spec.map(|s| &s.containers).unwrap_or(&empty);
    let mut init_statuses: Vec<ContainerStatus> =
        inits.iter().map(|c| container_status(input, c, reason::POD_INITIALIZING)).collect();
    // A regular init container that completed is ready (the prober
    // manager's rule); sidecars are ready by their probes, like the app.
    for (c, st) in inits.iter().zip(init_statuses.iter_mut()) {
        if !sidecars::is_sidecar(c) {
            st.ready = st.state.as_ref().and_then(|x| x.terminated.as_ref()).is_some_and(|t| t.exit_code == 0);
        }
    }
    let initialized_now = inits
        .iter()
        .zip(&init_statuses)
        .all(|(c, s)| if sidecars::is_sidecar(c) { s.started == Some(true) } else { s.ready })
        || containers.iter().any(|c| input.observed.latest(&c.name).is_some());
    let default_waiting = if initialized_now { reason::CONTAINER_CREATING } else { reason::POD_INITIALIZING };
    let statuses: Vec<ContainerStatus> =
        containers.iter().map(|c| container_status(input, c, default_waiting)).collect();

    let mut phase = phase(pod, &init_statuses, &statuses, input.terminal).to_owned();
    if input.terminal_reason.is_some() {
        phase = "Failed".into();
    }
    let sandbox_ready = input.observed.ready_sandbox().is_some();
    // Conditions others set (readiness gates') are kept as the API has
    // them; the status manager merges them back.
    let foreign = conditions::foreign(pod);
    let mut all_conditions = vec![];
    if input.terminal_reason.is_some_and(|t| t.disruption) {
        let t = input.terminal_reason.expect("checked");
        all_conditions.push(condition("DisruptionTarget", true, Some("TerminationByKubelet"), Some(t.message.clone())));
    }
    all_conditions.push(condition("PodReadyToStartContainers", sandbox_ready, None, None));
    all_conditions.push(conditions::initialized(pod, &init_statuses, &statuses, &phase));
    let containers_ready = conditions::containers_ready(pod, &init_statuses, &statuses, &phase);
    all_conditions.push(conditions::ready(pod, &containers_ready, &foreign));
    all_conditions.push(containers_ready);
    all_conditions.push(condition("PodScheduled", true, None, None));
    let mut conditions = all_conditions;
    // A condition keeps its transition time until its status changes.
    let previous = input.previous.and_then(|p| p.conditions.as_ref());
    for c in &mut conditions {
        let prev = previous.and_then(|list| list.iter().find(|p| p.type_ == c.type_));
        c.last_transition_time = match prev {
            Some(p) if p.status == c.status => p.last_transition_time.clone(),
            _ => Some(Time(input.now)),
        };
    }

    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let pod_ip = if host_network {
        input.host_ip.map(str::to_owned)
    } else {
        input.observed.sandboxes.first().and_then(|s| s.ip.clone())
    };
    PodStatus {
        phase: Some(phase),
        conditions: Some(conditions),
        host_ip: input.host_ip.map(str::to_owned),
        host_ips: input.host_ip.map(|ip| vec![HostIP { ip: ip.to_owned() }]),
        pod_ip: pod_ip.clone(),
        pod_ips: pod_ip.map(|ip| vec![PodIP { ip }]),
        start_time: input.previous.and_then(|p| p.start_time.clone()).or(Some(Time(input.now))),
        init_container_statuses: (!inits.is_empty()).then_some(init_statuses),
        container_statuses: Some(statuses),
        qos_class: spec.map(|s| qos_class(s).as_str().to_owned()),
        reason: input.terminal_reason.map(|t| t.reason.clone()),
        message: input.terminal_reason.map(|t| t.message.clone()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec, Probe};

    use super::*;
    use crate::pods::observed::{ContainerState as Obs, SandboxState};

    fn pod(policy: &str, inits: &[&str], containers: &[&str]) -> Pod {
        let c = |n: &&str| Container { name: n.to_string(), image: Some("busybox".into()), ..Default::default() };
        Pod {
            spec: Some(PodSpec {
                restart_policy: Some(policy.into()),
                init_containers: (!inits.is_empty()).then(|| inits.iter().map(c).collect()),
                containers: containers.iter().map(c).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn obs(name: &str, state: ContainerRunState, exit: i32, attempt: u32, created: i64) -> Obs {
        Obs {
            id: format!("{name}{attempt}"),
            sandbox_id: "sb".into(),
            name: name.into(),
            attempt,
            init: false,
            state,
            created_at: created,
            started_at: 1_700_000_000_000_000_000,
            finished_at: if state == ContainerRunState::Exited { 1_700_000_001_000_000_000 } else { 0 },
            exit_code: exit,
            reason: String::new(),
            message: String::new(),
            image: "busybox".into(),
            image_ref: "sha256:abc".into(),
            hash: String::new(),
            grace_period_secs: None,
        }
    }

    struct World {
        observed: ObservedPod,
        waiting: HashMap<String, (String, String)>,
        readiness: HashMap<String, bool>,
        not_started: HashMap<String, bool>,
        messages: HashMap<String, String>,
    }

    impl World {
        fn new(mut containers: Vec<Obs>) -> World {
            containers.sort_by_key(|c| std::cmp::Reverse(c.created_at));
            World {
                observed: ObservedPod {
                    sandboxes: vec![SandboxState {
                        id: "sb".into(),
                        attempt: 0,
                        ready: true,
                        created_at: 0,
                        ip: Some("10.1.0.2".into()),
                    }],
                    containers,
                },
                waiting: HashMap::new(),
                readiness: HashMap::new(),
                not_started: HashMap::new(),
                messages: HashMap::new(),
            }
        }

        fn status(&self, pod: &Pod, terminal: bool) -> PodStatus {
            generate(&StatusInput {
                pod,
                observed: &self.observed,
                waiting: &self.waiting,
                readiness: &self.readiness,
                not_started: &self.not_started,
                messages: &self.messages,
                previous: None,
                host_ip: Some("10.0.0.1"),
                runtime_name: "containerd",
                now: Timestamp::UNIX_EPOCH,
                terminal,
                terminal_reason: None,
            })
        }
    }

    fn cond<'a>(s: &'a PodStatus, t: &str) -> &'a PodCondition {
        s.conditions.as_ref().unwrap().iter().find(|c| c.type_ == t).unwrap()
    }

    use ContainerRunState::{Exited, Running};

    #[test]
    fn phases() {
        let cases: Vec<(&str, Pod, Vec<Obs>, bool, &str)> = vec![
            ("nothing yet", pod("Always", &[], &["a"]), vec![], false, "Pending"),
            ("running", pod("Always", &[], &["a"]), vec![obs("a", Running, 0, 0, 1)], false, "Running"),
            ("init running", pod("Always", &["i"], &["a"]), vec![obs("i", Running, 0, 0, 1)], false, "Pending"),
            ("init failed, Never", pod("Never", &["i"], &["a"]), vec![obs("i", Exited, 1, 0, 1)], false, "Failed"),
            ("all succeeded, Never", pod("Never", &[], &["a"]), vec![obs("a", Exited, 0, 0, 1)], false, "Succeeded"),
            (
                "one failed, Never",
                pod("Never", &[], &["a", "b"]),
                vec![obs("a", Exited, 0, 0, 1), obs("b", Exited, 1, 0, 2)],
                false,
                "Failed",
            ),
            (
                "failed, OnFailure (restarting)",
                pod("OnFailure", &[], &["a"]),
                vec![obs("a", Exited, 1, 0, 1)],
                false,
                "Running",
            ),
            (
                "exited, Always (restarting)",
                pod("Always", &[], &["a"]),
                vec![obs("a", Exited, 0, 0, 1)],
                false,
                "Running",
            ),
            ("terminal with a failure", pod("Always", &[], &["a"]), vec![obs("a", Exited, 137, 0, 1)], true, "Failed"),
            ("terminal all succeeded", pod("Always", &[], &["a"]), vec![obs("a", Exited, 0, 0, 1)], true, "Succeeded"),
        ];
        for (name, p, containers, terminal, want) in cases {
            let w = World::new(containers);
            assert_eq!(w.status(&p, terminal).phase.as_deref(), Some(want), "{name}");
        }
    }

    #[test]
    fn crash_loop_back_off_shows_waiting_with_the_last_exit() {
        let p = pod("Always", &[], &["a"]);
        let mut w = World::new(vec![obs("a", Exited, 2, 3, 5), obs("a", Exited, 2, 2, 4)]);
        w.waiting
            .insert("a".into(), ("CrashLoopBackOff".into(), "back-off 40s restarting failed container=a pod=p".into()));
        let s = w.status(&p, false);
        let cs = &s.container_statuses.as_ref().unwrap()[0];
        assert_eq!(cs.restart_count, 3);
        assert_eq!(cs.state.as_ref().unwrap().waiting.as_ref().unwrap().reason.as_deref(), Some("CrashLoopBackOff"));
        let last = cs.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!((last.exit_code, last.reason.as_deref()), (2, Some("Error")));
        assert_eq!(last.container_id.as_deref(), Some("containerd://a3"));
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(cond(&s, "Ready").reason.as_deref(), Some("ContainersNotReady"));
    }

    #[test]
    fn oom_killed_and_termination_messages() {
        let p = pod("Never", &[], &["a"]);
        let mut o = obs("a", Exited, 137, 0, 1);
        o.reason = "OOMKilled".into();
        let mut w = World::new(vec![o]);
        w.messages.insert("a0".into(), "out of memory at step 3".into());
        let s = w.status(&p, true);
        let t = s.container_statuses.unwrap()[0].state.clone().unwrap().terminated.unwrap();
        assert_eq!(
            (t.exit_code, t.reason.as_deref(), t.message.as_deref()),
            (137, Some("OOMKilled"), Some("out of memory at step 3"))
        );
    }

    #[test]
    fn readiness_and_conditions() {
        let mut p = pod("Always", &["i"], &["a", "b"]);
        p.spec.as_mut().unwrap().containers[1].readiness_probe = Some(Probe::default());
        let mut w = World::new(vec![obs("i", Exited, 0, 0, 1), obs("a", Running, 0, 0, 2), obs("b", Running, 0, 0, 3)]);
        let s = w.status(&p, false);
        assert_eq!(cond(&s, "Initialized").status, "True");
        assert_eq!(cond(&s, "Ready").message.as_deref(), Some("containers with unready status: [b]"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.1.0.2"));
        assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
        w.readiness.insert("b0".into(), true);
        let s = w.status(&p, false);
        assert_eq!((cond(&s, "Ready").status.as_str(), cond(&s, "ContainersReady").status.as_str()), ("True", "True"));
        // An unfinished startup probe keeps the container not started and not ready.
        w.not_started.insert("a0".into(), true);
        let s = w.status(&p, false);
        let a = &s.container_statuses.as_ref().unwrap()[0];
        assert_eq!((a.started, a.ready), (Some(false), false));
    }

    #[test]
    fn init_containers_pending() {
        let p = pod("Always", &["i1", "i2"], &["a"]);
        let w = World::new(vec![obs("i1", Exited, 0, 0, 1), obs("i2", Running, 0, 0, 2)]);
        let s = w.status(&p, false);
        let init = cond(&s, "Initialized");
        assert_eq!(
            (init.status.as_str(), init.message.as_deref()),
            ("False", Some("containers with incomplete status: [i2]"))
        );
        let a = &s.container_statuses.as_ref().unwrap()[0];
        assert_eq!(a.state.as_ref().unwrap().waiting.as_ref().unwrap().reason.as_deref(), Some("PodInitializing"));
    }

    #[test]
    fn transition_times_survive_unchanged_conditions_and_evictions_are_terminal() {
        let p = pod("Always", &[], &["a"]);
        let w = World::new(vec![obs("a", Running, 0, 0, 1)]);
        let first = w.status(&p, false);
        let mut input = StatusInput {
            pod: &p,
            observed: &w.observed,
            waiting: &w.waiting,
            readiness: &w.readiness,
            not_started: &w.not_started,
            messages: &w.messages,
            previous: Some(&first),
            host_ip: Some("10.0.0.1"),
            runtime_name: "containerd",
            now: Timestamp::from_second(100).unwrap(),
            terminal: false,
            terminal_reason: None,
        };
        let second = generate(&input);
        assert_eq!(first, second, "nothing changed, so nothing is reported");
        let evicted = TerminalReason {
            reason: "Evicted".into(),
            message: "The node was low on resource: memory.".into(),
            disruption: true,
        };
        input.terminal = true;
        input.terminal_reason = Some(&evicted);
        let s = generate(&input);
        assert_eq!((s.phase.as_deref(), s.reason.as_deref()), (Some("Failed"), Some("Evicted")));
        assert_eq!(cond(&s, "DisruptionTarget").reason.as_deref(), Some("TerminationByKubelet"));
        assert_eq!(cond(&s, "PodScheduled").last_transition_time, cond(&first, "PodScheduled").last_transition_time);
    }

    #[test]
    fn a_reported_termination_outlives_the_removed_container() {
        let p = pod("Never", &[], &["a", "b"]);
        let w = World::new(vec![obs("a", Exited, 137, 0, 1), obs("b", Exited, 1, 2, 2)]);
        let evicted = TerminalReason { reason: "Evicted".into(), message: "low on memory".into(), disruption: true };
        let input = |observed, previous| StatusInput {
            pod: &p,
            observed,
            waiting: &w.waiting,
            readiness: &w.readiness,
            not_started: &w.not_started,
            messages: &w.messages,
            previous,
            host_ip: Some("10.0.0.1"),
            runtime_name: "containerd",
            now: Timestamp::UNIX_EPOCH,
            terminal: true,
            terminal_reason: Some(&evicted),
        };
        let before = generate(&input(&w.observed, None));
        // Garbage collection removed the containers and the sandbox.
        let gone = ObservedPod::default();
        let after = generate(&input(&gone, Some(&before)));
        assert_eq!(after.container_statuses, before.container_statuses, "the terminations stay as reported");
        let a = &after.container_statuses.as_ref().unwrap()[0];
        assert_eq!(a.state.as_ref().unwrap().terminated.as_ref().map(|t| t.exit_code), Some(137));
        assert!(!a.image_id.is_empty(), "the image id stays");
        // Without a previous status there is nothing to keep.
        let fresh = generate(&input(&gone, None));
        let a = &fresh.container_statuses.as_ref().unwrap()[0];
        assert_eq!(a.state.as_ref().unwrap().waiting.as_ref().unwrap().reason.as_deref(), Some("ContainerCreating"));
    }

    #[test]
    fn sidecars_and_phase() {
        let mut p = pod("Never", &["proxy"], &["app"]);
        p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].restart_policy = Some("Always".into());
        // The sidecar runs, the app runs: Running, and both count for Ready.
        let w = World::new(vec![obs("proxy", Running, 0, 0, 1), obs("app", Running, 0, 0, 2)]);
        let s = w.status(&p, false);
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(cond(&s, "Initialized").status, "True");
        assert_eq!(cond(&s, "Ready").status, "True");
        // Only the sidecar so far, its startup probe pending: Pending, not initialized.
        let mut w = World::new(vec![obs("proxy", Running, 0, 0, 1)]);
        w.not_started.insert("proxy0".into(), true);
        let s = w.status(&p, false);
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        assert_eq!(cond(&s, "Initialized").message.as_deref(), Some("containers with incomplete status: [proxy]"));
        // The app completed and the sidecar was stopped with the pod: the
        // pod succeeded, whatever the sidecar's exit code.
        let w = World::new(vec![obs("proxy", Exited, 137, 0, 1), obs("app", Exited, 0, 0, 2)]);
        let s = w.status(&p, true);
        assert_eq!(s.phase.as_deref(), Some("Succeeded"));
        assert_eq!(cond(&s, "Ready").reason.as_deref(), Some("PodCompleted"));
    }
}
