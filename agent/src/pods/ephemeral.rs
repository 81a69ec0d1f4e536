//! Ephemeral containers (`kubectl debug`): added to a running pod through
//! its `ephemeralcontainers` subresource, started once in the pod's
//! sandbox and never restarted, reported in `ephemeralContainerStatuses`.
//! With `targetContainerName` the container joins the target's process
//! namespace (CRI NamespaceMode TARGET), so it sees the target's
//! processes. The decisions here are pure; the pod worker runs them.

use k8s_openapi::api::core::v1::{Container, ContainerStatus, EphemeralContainer, Pod};

use super::{
    observed::{ContainerRunState, ObservedPod},
    status::{self, StatusInput},
};
use crate::cri::{api, error::reason};

/// An ephemeral container as a Container: the same fields (what an
/// ephemeral container may not have, such as ports and probes, the API
/// server refuses before it gets here).
pub fn as_container(e: &EphemeralContainer) -> Container {
    Container {
        name: e.name.clone(),
        image: e.image.clone(),
        image_pull_policy: e.image_pull_policy.clone(),
        command: e.command.clone(),
        args: e.args.clone(),
        working_dir: e.working_dir.clone(),
        env: e.env.clone(),
        env_from: e.env_from.clone(),
        volume_mounts: e.volume_mounts.clone(),
        volume_devices: e.volume_devices.clone(),
        security_context: e.security_context.clone(),
        stdin: e.stdin,
        stdin_once: e.stdin_once,
        tty: e.tty,
        termination_message_path: e.termination_message_path.clone(),
        termination_message_policy: e.termination_message_policy.clone(),
        ..Default::default()
    }
}

fn specs(pod: &Pod) -> &[EphemeralContainer] {
    pod.spec.as_ref().and_then(|s| s.ephemeral_containers.as_deref()).unwrap_or(&[])
}

/// The ephemeral container `name` of `pod`, as a Container.
pub fn find(pod: &Pod, name: &str) -> Option<Container> {
    specs(pod).iter().find(|e| e.name == name).map(as_container)
}

/// Those to start now: in the spec and never created (they run once).
/// None while the pod is being deleted.
pub fn to_start(pod: &Pod, observed: &ObservedPod) -> Vec<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return vec![];
    }
    specs(pod).iter().filter(|e| observed.latest(&e.name).is_none()).map(|e| e.name.clone()).collect()
}

/// Puts the container in its target's process namespace. Err when the
/// target is not running (the container then waits, as with the kubelet,
/// whose CreateContainer would fail the same way).
pub fn apply_target(
    config: &mut api::ContainerConfig,
    pod: &Pod,
    name: &str,
    observed: &ObservedPod,
) -> Result<(), String> {
    let Some(target) = specs(pod).iter().find(|e| e.name == name).and_then(|e| e.target_container_name.as_deref())
    else {
        return Ok(());
    };
    let running = observed.latest(target).filter(|c| c.state == ContainerRunState::Running);
    let Some(t) = running else {
        return Err(format!("the target container {target:?} is not running"));
    };
    let ns = config
        .linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .namespace_options
        .get_or_insert_with(Default::default);
    ns.pid = api::NamespaceMode::Target as i32;
    ns.target_id = t.id.clone();
    Ok(())
}

/// `ephemeralContainerStatuses` (None when the pod has none).
pub fn statuses(input: &StatusInput<'_>) -> Option<Vec<ContainerStatus>> {
    let list = specs(input.pod);
    if list.is_empty() {
        return None;
    }
    Some(list.iter().map(|e| status::container_status(input, &as_container(e), reason::CONTAINER_CREATING)).collect())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use k8s_openapi::{api::core::v1::PodSpec, jiff::Timestamp};

    use super::*;
    use crate::pods::observed::{ContainerState, SandboxState};

    fn pod() -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container { name: "app".into(), ..Default::default() }],
                ephemeral_containers: Some(vec![
                    EphemeralContainer {
                        name: "debugger".into(),
                        image: Some("busybox".into()),
                        target_container_name: Some("app".into()),
                        stdin: Some(true),
                        tty: Some(true),
                        ..Default::default()
                    },
                    EphemeralContainer { name: "plain".into(), ..Default::default() },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn ctr(name: &str, state: ContainerRunState) -> ContainerState {
        ContainerState {
            id: format!("{name}-id"),
            sandbox_id: "sb".into(),
            name: name.into(),
            attempt: 0,
            init: false,
            state,
            created_at: 1,
            started_at: 1,
            finished_at: 2,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            image: "busybox".into(),
            image_ref: "sha256:x".into(),
            hash: String::new(),
            grace_period_secs: None,
        }
    }

    fn observed(containers: Vec<ContainerState>) -> ObservedPod {
        let sandbox = SandboxState { id: "sb".into(), attempt: 0, ready: true, created_at: 0, ip: None };
        ObservedPod { sandboxes: vec![sandbox], containers }
    }

    #[test]
    fn started_once_never_again() {
        let p = pod();
        assert_eq!(to_start(&p, &observed(vec![])), ["debugger", "plain"]);
        let o = observed(vec![ctr("debugger", ContainerRunState::Exited), ctr("plain", ContainerRunState::Running)]);
        assert!(to_start(&p, &o).is_empty(), "an exited ephemeral container is not restarted");
        let mut deleting = pod();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH));
        assert!(to_start(&deleting, &observed(vec![])).is_empty());
        let c = find(&p, "debugger").unwrap();
        assert_eq!((c.stdin, c.tty, c.image.as_deref()), (Some(true), Some(true), Some("busybox")));
        assert!(find(&p, "app").is_none());
    }

    #[test]
    fn the_target_shares_its_process_namespace() {
        let p = pod();
        let mut cfg = api::ContainerConfig::default();
        assert!(apply_target(&mut cfg, &p, "debugger", &observed(vec![])).is_err(), "target not running");
        apply_target(&mut cfg, &p, "debugger", &observed(vec![ctr("app", ContainerRunState::Running)])).unwrap();
        let ns = cfg.linux.unwrap().security_context.unwrap().namespace_options.unwrap();
        assert_eq!((ns.pid, ns.target_id.as_str()), (api::NamespaceMode::Target as i32, "app-id"));
        let mut plain = api::ContainerConfig::default();
        apply_target(&mut plain, &p, "plain", &observed(vec![])).unwrap();
        assert!(plain.linux.is_none(), "no target: the pod's own namespaces");
    }

    #[test]
    fn statuses_for_each_ephemeral_container() {
        let p = pod();
        let o = observed(vec![ctr("debugger", ContainerRunState::Running)]);
        let empty = HashMap::new();
        let input = StatusInput {
            pod: &p,
            observed: &o,
            waiting: &HashMap::new(),
            readiness: &empty,
            not_started: &empty,
            messages: &HashMap::new(),
            previous: None,
            host_ip: None,
            runtime_name: "containerd",
            now: Timestamp::UNIX_EPOCH,
            terminal: false,
            terminal_reason: None,
        };
        let s = statuses(&input).unwrap();
        assert_eq!(s.len(), 2);
        assert!(s[0].state.as_ref().unwrap().running.is_some());
        assert_eq!(s[0].container_id.as_deref(), Some("containerd://debugger-id"));
        assert_eq!(s[1].state.as_ref().unwrap().waiting.as_ref().unwrap().reason.as_deref(), Some("ContainerCreating"));
    }
}
