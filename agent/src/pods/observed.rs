//! What the runtime holds for one pod (the kubelet's PodStatus from
//! GetPodStatus): its sandboxes and every container instance, newest first,
//! read through CRI and reduced to what the decisions need.

use std::collections::HashMap;

use crate::cri::{self, RuntimeService, api, labels};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerRunState {
    Created,
    Running,
    Exited,
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxState {
    pub id: String,
    pub attempt: u32,
    pub ready: bool,
    /// ns since the epoch.
    pub created_at: i64,
    pub ip: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerState {
    pub id: String,
    pub sandbox_id: String,
    pub name: String,
    /// The restart count this instance was created with.
    pub attempt: u32,
    pub init: bool,
    pub state: ContainerRunState,
    /// ns since the epoch; 0 when not (yet) known.
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    /// The runtime's reason (OOMKilled, Error, Completed).
    pub reason: String,
    pub message: String,
    pub image: String,
    pub image_ref: String,
    pub hash: String,
    pub grace_period_secs: Option<u64>,
}

/// Everything the runtime has of one pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObservedPod {
    /// Newest first.
    pub sandboxes: Vec<SandboxState>,
    /// Every instance, newest first.
    pub containers: Vec<ContainerState>,
}

impl ObservedPod {
    /// The newest instance of a container.
    pub fn latest(&self, name: &str) -> Option<&ContainerState> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// The instance before the newest (for lastState).
    pub fn previous(&self, name: &str) -> Option<&ContainerState> {
        self.containers.iter().filter(|c| c.name == name).nth(1)
    }

    pub fn running(&self) -> impl Iterator<Item = &ContainerState> {
        self.containers.iter().filter(|c| c.state == ContainerRunState::Running)
    }

    pub fn ready_sandbox(&self) -> Option<&SandboxState> {
        self.sandboxes.first().filter(|s| s.ready)
    }

    /// Nothing runs: no ready sandbox and no running container.
    pub fn is_stopped(&self) -> bool {
        self.sandboxes.iter().all(|s| !s.ready) && self.running().next().is_none()
    }
}

fn run_state(state: i32) -> ContainerRunState {
    match cri::container_state(state) {
        api::ContainerState::ContainerCreated => ContainerRunState::Created,
        api::ContainerState::ContainerRunning => ContainerRunState::Running,
        api::ContainerState::ContainerExited => ContainerRunState::Exited,
        api::ContainerState::ContainerUnknown => ContainerRunState::Unknown,
    }
}

pub fn container_from_status(s: &api::ContainerStatus, sandbox_id: &str) -> ContainerState {
    let ann = &s.annotations;
    ContainerState {
        id: s.id.clone(),
        sandbox_id: sandbox_id.to_owned(),
        name: s.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default(),
        attempt: ann
            .get(labels::CONTAINER_RESTART_COUNT)
            .and_then(|v| v.parse().ok())
            .or(s.metadata.as_ref().map(|m| m.attempt))
            .unwrap_or(0),
        init: s.labels.get(labels::CONTAINER_TYPE).map(String::as_str) == Some("init"),
        state: run_state(s.state),
        created_at: s.created_at,
        started_at: s.started_at,
        finished_at: s.finished_at,
        exit_code: s.exit_code,
        reason: s.reason.clone(),
        message: s.message.clone(),
        image: s
            .image
            .as_ref()
            .map(|i| i.user_specified_image.clone())
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| s.image.as_ref().map(|i| i.image.clone()).unwrap_or_default()),
        image_ref: s.image_ref.clone(),
        hash: ann.get(labels::CONTAINER_HASH).cloned().unwrap_or_default(),
        grace_period_secs: ann.get(labels::POD_TERMINATION_GRACE_PERIOD).and_then(|v| v.parse().ok()),
    }
}

/// Reads the pod's sandboxes and containers (by its uid label).
pub async fn observe(rt: &dyn RuntimeService, uid: &str) -> cri::Result<ObservedPod> {
    let mut selector = labels::managed_selector();
    selector.insert(labels::POD_UID.into(), uid.to_owned());
    let sandboxes = rt
        .list_pod_sandbox(Some(api::PodSandboxFilter { label_selector: selector.clone(), ..Default::default() }))
        .await?;
    let mut out = ObservedPod::default();
    for sb in &sandboxes {
        let ip = match rt.pod_sandbox_status(&sb.id).await {
            Ok(st) => st.network.map(|n| n.ip).filter(|ip| !ip.is_empty()),
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        out.sandboxes.push(SandboxState {
            id: sb.id.clone(),
            attempt: sb.metadata.as_ref().map_or(0, |m| m.attempt),
            ready: cri::sandbox_ready(sb.state),
            created_at: sb.created_at,
            ip,
        });
    }
    out.sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    let containers =
        rt.list_containers(Some(api::ContainerFilter { label_selector: selector, ..Default::default() })).await?;
    let sandbox_of: HashMap<&str, &str> =
        containers.iter().map(|c| (c.id.as_str(), c.pod_sandbox_id.as_str())).collect();
    for c in &containers {
        match rt.container_status(&c.id).await {
            Ok(st) => {
                out.containers.push(container_from_status(&st, sandbox_of.get(c.id.as_str()).copied().unwrap_or("")))
            }
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        }
    }
    out.containers.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.attempt.cmp(&a.attempt)));
    Ok(out)
}
