//! Native sidecars: init containers with `restartPolicy: Always`. The
//! kubelet's computeInitContainerActions for a pod that has them:
//!
//! - init containers start in order; a sidecar counts as done once it is
//!   running and started (its startup probe passed), and the next one
//!   starts then, while it keeps running;
//! - a sidecar that exits (whatever its code) or is in an unknown state is
//!   started again, also after the pod is initialized; a failed liveness
//!   or startup probe or a changed definition restarts it;
//! - a regular init container that fails restarts under Always and
//!   OnFailure and fails the pod under Never;
//! - once a regular container has been created the pod is initialized and
//!   regular init containers are not run again.
//!
//! Sidecars do not keep a pod alive: when its regular containers are done
//! the pod is killed, sidecars included (see `plan`), and they are stopped
//! after the regular containers, in reverse order ([`termination_order`]).
//! Pure.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{
    observed::{ContainerRunState, ObservedPod},
    plan::{KillContainer, ProbeVerdict, restarts_on_failure_of},
    spec::hash_matches,
};

/// Whether an init container is a sidecar.
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

pub fn has_sidecars(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|s| s.init_containers.iter().flatten().any(is_sidecar))
}

/// What to do with the init containers of a pod with sidecars.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InitActions {
    /// Every init container is done (regular ones succeeded, sidecars
    /// started), now or before.
    pub initialized: bool,
    /// A regular init container failed under restartPolicy Never.
    pub kill_pod: bool,
    /// Init containers to start, in spec order.
    pub start: Vec<String>,
    pub kill: Vec<KillContainer>,
}

pub fn init_actions(pod: &Pod, observed: &ObservedPod, probes: &HashMap<String, ProbeVerdict>) -> InitActions {
    let mut out = InitActions::default();
    let Some(spec) = pod.spec.as_ref() else { return out };
    let inits = spec.init_containers.as_deref().unwrap_or(&[]);
    if inits.is_empty() {
        out.initialized = true;
        return out;
    }
    // A regular container created or running: initialized earlier, even if
    // the init containers' records were removed since.
    let mut initialized = spec.containers.iter().any(|c| {
        observed
            .latest(&c.name)
            .is_some_and(|s| matches!(s.state, ContainerRunState::Created | ContainerRunState::Running))
    });
    let mut previously = initialized;
    let restart_on_failure = restarts_on_failure_of(pod);
    let mut start: Vec<usize> = vec![];
    let kill = |out: &mut InitActions, id: &str, c: &Container, message: String, probe: Option<&'static str>| {
        out.kill.push(KillContainer { id: id.to_owned(), name: c.name.clone(), message, probe });
    };
    for (i, c) in inits.iter().enumerate().rev() {
        let sidecar = is_sidecar(c);
        let Some(s) = observed.latest(&c.name) else {
            if previously && sidecar {
                start.push(i);
            }
            continue;
        };
        if previously && !sidecar {
            continue;
        }
        match s.state {
            // Created but never started: start it (again).
            ContainerRunState::Created => start.push(i),
            ContainerRunState::Running if sidecar => match probes.get(&s.id) {
                Some(ProbeVerdict::NotStarted) => {}
                Some(ProbeVerdict::StartupFailed) => {
                    kill(
                        &mut out,
                        &s.id,
                        c,
                        format!("Init container {} failed startup probe", c.name),
                        Some("Startup"),
                    );
                    start.push(i);
                }
                verdict => {
                    if i == inits.len() - 1 {
                        initialized = true;
                    } else if !previously {
                        start.push(i + 1);
                    }
                    if !s.hash.is_empty() && !hash_matches(&s.hash, c) {
                        kill(&mut out, &s.id, c, format!("Init container {} definition changed", c.name), None);
                        start.push(i);
                    } else if verdict == Some(&ProbeVerdict::LivenessFailed) {
                        let message = format!("Init container {} failed liveness probe", c.name);
                        kill(&mut out, &s.id, c, message, Some("Liveness"));
                        start.push(i);
                    }
                }
            },
            // A regular init container still running: wait for it.
            ContainerRunState::Running => {}
            ContainerRunState::Exited if sidecar => start.push(i),
            ContainerRunState::Exited if s.exit_code != 0 || s.reason == "OOMKilled" => {
                if !restart_on_failure {
                    return InitActions { kill_pod: true, kill: out.kill, ..Default::default() };
                }
                start.push(i);
            }
            ContainerRunState::Exited => {
                if i == inits.len() - 1 {
                    initialized = true;
                } else {
                    start.push(i + 1);
                }
            }
            ContainerRunState::Unknown => {
                if !sidecar && !restart_on_failure {
                    return InitActions { kill_pod: true, kill: out.kill, ..Default::default() };
                }
                kill(
                    &mut out,
                    &s.id,
                    c,
                    "Init container is in \"unknown\" state, try killing it before restart".into(),
                    None,
                );
                start.push(i);
            }
        }
        previously = true;
    }
    if !previously {
        start.push(0);
    }
    start.sort_unstable();
    start.dedup();
    out.start = start.into_iter().map(|i| inits[i].name.clone()).collect();
    out.initialized = initialized;
    out
}

/// How a pod's running containers stop: first every regular container
/// (and regular init container) together, then the sidecars one by one in
/// reverse order, as the kubelet's termination ordering.
pub fn termination_order<'a>(pod: &Pod, running: &[&'a str]) -> (Vec<&'a str>, Vec<&'a str>) {
    let sidecars: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| is_sidecar(c))
        .map(|c| c.name.as_str())
        .collect();
    let first = running.iter().copied().filter(|n| !sidecars.contains(n)).collect();
    let last = sidecars.iter().rev().filter_map(|s| running.iter().copied().find(|n| n == s)).collect();
    (first, last)
}

#[cfg(test)]
#[path = "sidecars_tests.rs"]
mod tests;
