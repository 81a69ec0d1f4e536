//! The fake's RuntimeService: sandboxes and containers as containerd
//! treats them, each call through the fault, latency and call-log gate.

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::state::{container_view, finish, labels_match, sandbox_state};
use super::{Behavior, FakeContainer, FakeRuntime, FakeSandbox, Method, err};
use crate::cri::{Result, RuntimeService, api};

#[async_trait]
impl RuntimeService for FakeRuntime {
    async fn version(&self) -> Result<api::VersionResponse> {
        let _g = self.enter(Method::Version, "", &[]).await?;
        Ok(api::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "fake".into(),
            runtime_version: "0.1.0".into(),
            runtime_api_version: "v1".into(),
        })
    }

    async fn status(&self) -> Result<api::StatusResponse> {
        let _g = self.enter(Method::Status, "", &[]).await?;
        let s = self.state.lock();
        let cond = |t: &str, ok: bool| api::RuntimeCondition {
            r#type: t.into(),
            status: ok,
            reason: if ok { String::new() } else { format!("{t}False") },
            message: String::new(),
        };
        Ok(api::StatusResponse {
            status: Some(api::RuntimeStatus {
                conditions: vec![cond("RuntimeReady", s.runtime_ready), cond("NetworkReady", s.network_ready)],
            }),
            ..Default::default()
        })
    }

    async fn runtime_config(&self) -> Result<api::RuntimeConfigResponse> {
        let _g = self.enter(Method::RuntimeConfig, "", &[]).await?;
        let answer = self.state.lock().runtime_config;
        answer.ok_or_else(|| err(Method::RuntimeConfig, tonic::Code::Unimplemented, "unknown method RuntimeConfig"))
    }

    async fn run_pod_sandbox(&self, config: api::PodSandboxConfig, _runtime_handler: &str) -> Result<String> {
        let name = config.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
        let _g = self.enter(Method::RunPodSandbox, &name, &[]).await?;
        let now = self.now_ns();
        let mut s = self.state.lock();
        let id = s.new_id("sandbox-");
        let host_network = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|c| c.namespace_options.as_ref())
            .is_some_and(|n| n.network == api::NamespaceMode::Node as i32);
        // Host-network sandboxes report no IP (the node's is used), as
        // containerd does.
        let ip =
            if host_network { String::new() } else { format!("10.88.{}.{}", s.next_id / 250, s.next_id % 250 + 2) };
        s.sandboxes.insert(id.clone(), FakeSandbox { id: id.clone(), config, ready: true, created_at: now, ip });
        Ok(id)
    }

    async fn stop_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        let _g = self.enter(Method::StopPodSandbox, sandbox_id, &[]).await?;
        let now = self.now_ns();
        let mut s = self.state.lock();
        let Some(sb) = s.sandboxes.get_mut(sandbox_id) else {
            return Err(err(Method::StopPodSandbox, tonic::Code::NotFound, format!("sandbox {sandbox_id} not found")));
        };
        sb.ready = false;
        for c in s.containers.values_mut().filter(|c| c.sandbox_id == sandbox_id) {
            if c.state == api::ContainerState::ContainerRunning {
                let code = match c.behavior {
                    Behavior::Run { stop_exit_code } => stop_exit_code,
                    _ => 137,
                };
                finish(c, now, code, "");
            }
        }
        Ok(())
    }

    async fn remove_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        let _g = self.enter(Method::RemovePodSandbox, sandbox_id, &[]).await?;
        let mut s = self.state.lock();
        if let Some(sb) = s.sandboxes.get(sandbox_id)
            && sb.ready
        {
            return Err(err(
                Method::RemovePodSandbox,
                tonic::Code::Unknown,
                format!("sandbox container {sandbox_id:?} is not fully stopped"),
            ));
        }
        s.sandboxes.remove(sandbox_id);
        s.containers.retain(|_, c| c.sandbox_id != sandbox_id);
        Ok(())
    }

    async fn pod_sandbox_status(&self, sandbox_id: &str) -> Result<api::PodSandboxStatus> {
        let _g = self.enter(Method::PodSandboxStatus, sandbox_id, &[]).await?;
        let s = self.state.lock();
        let sb = s.sandboxes.get(sandbox_id).ok_or_else(|| {
            err(
                Method::PodSandboxStatus,
                tonic::Code::NotFound,
                format!("an error occurred when try to find sandbox {sandbox_id:?}: not found"),
            )
        })?;
        Ok(api::PodSandboxStatus {
            id: sb.id.clone(),
            metadata: sb.config.metadata.clone(),
            state: sandbox_state(sb.ready),
            created_at: sb.created_at,
            network: Some(api::PodSandboxNetworkStatus { ip: sb.ip.clone(), additional_ips: vec![] }),
            labels: sb.config.labels.clone(),
            annotations: sb.config.annotations.clone(),
            ..Default::default()
        })
    }

    async fn list_pod_sandbox(&self, filter: Option<api::PodSandboxFilter>) -> Result<Vec<api::PodSandbox>> {
        let _g = self.enter(Method::ListPodSandbox, "", &[]).await?;
        let s = self.state.lock();
        let f = filter.unwrap_or_default();
        Ok(s.sandboxes
            .values()
            .filter(|sb| f.id.is_empty() || sb.id == f.id)
            .filter(|sb| f.state.as_ref().is_none_or(|st| st.state == sandbox_state(sb.ready)))
            .filter(|sb| labels_match(&f.label_selector, &sb.config.labels))
            .map(|sb| api::PodSandbox {
                id: sb.id.clone(),
                metadata: sb.config.metadata.clone(),
                state: sandbox_state(sb.ready),
                created_at: sb.created_at,
                labels: sb.config.labels.clone(),
                annotations: sb.config.annotations.clone(),
                runtime_handler: String::new(),
            })
            .collect())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        _sandbox_config: api::PodSandboxConfig,
    ) -> Result<String> {
        let name = config.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
        let _g = self.enter(Method::CreateContainer, &name, &[sandbox_id]).await?;
        let now = self.now_ns();
        let mut s = self.state.lock();
        let log_dir = match s.sandboxes.get(sandbox_id) {
            None => {
                return Err(err(
                    Method::CreateContainer,
                    tonic::Code::NotFound,
                    format!("failed to find sandbox id {sandbox_id:?}: not found"),
                ));
            }
            Some(sb) if !sb.ready => {
                return Err(err(
                    Method::CreateContainer,
                    tonic::Code::Unknown,
                    format!("sandbox {sandbox_id:?} is not running"),
                ));
            }
            Some(sb) => sb.config.log_directory.clone(),
        };
        let image = config.image.as_ref().map(|i| i.image.clone()).unwrap_or_default();
        let Some(idx) = s.find_image(&image) else {
            return Err(err(
                Method::CreateContainer,
                tonic::Code::NotFound,
                format!("failed to resolve image {image:?}: not found"),
            ));
        };
        let image_ref = s.images[idx].id.clone();
        let behavior = match s.scripts.get_mut(&name) {
            Some(list) if list.len() > 1 => list.remove(0),
            Some(list) if list.len() == 1 => list[0].clone(),
            _ => Behavior::run(),
        };
        let id = s.new_id("container-");
        let log_path = if log_dir.is_empty() || config.log_path.is_empty() {
            String::new()
        } else {
            std::path::Path::new(&log_dir).join(&config.log_path).display().to_string()
        };
        s.containers.insert(
            id.clone(),
            FakeContainer {
                id: id.clone(),
                sandbox_id: sandbox_id.to_owned(),
                config,
                image_ref,
                state: api::ContainerState::ContainerCreated,
                created_at: now,
                started_at: 0,
                finished_at: 0,
                exit_code: 0,
                reason: String::new(),
                message: String::new(),
                log_path,
                behavior,
                exit_at: None,
                stop_timeouts: vec![],
            },
        );
        Ok(id)
    }

    async fn start_container(&self, container_id: &str) -> Result<()> {
        let name = self.container_name(container_id);
        let _g = self.enter(Method::StartContainer, container_id, &[&name]).await?;
        let now = Instant::now();
        let now_ns = self.ns_at(now);
        let mut s = self.state.lock();
        let Some(c) = s.containers.get_mut(container_id) else {
            return Err(err(
                Method::StartContainer,
                tonic::Code::NotFound,
                format!("container {container_id} not found"),
            ));
        };
        if c.state != api::ContainerState::ContainerCreated {
            return Err(err(
                Method::StartContainer,
                tonic::Code::Unknown,
                format!("container {container_id} is in {:?} state, not created", c.state),
            ));
        }
        if let Behavior::FailStart { message } = &c.behavior {
            let message = message.clone();
            c.state = api::ContainerState::ContainerExited;
            c.started_at = 0;
            c.finished_at = now_ns;
            c.exit_code = 128;
            c.reason = "StartError".into();
            c.message = message.clone();
            return Err(err(Method::StartContainer, tonic::Code::Unknown, message));
        }
        c.state = api::ContainerState::ContainerRunning;
        c.started_at = now_ns;
        c.exit_at = match &c.behavior {
            Behavior::Exit { after, .. } | Behavior::OomKill { after } => Some(now + *after),
            _ => None,
        };
        if !c.log_path.is_empty() {
            // The runtime opens the log file when the container starts.
            let _ = std::fs::OpenOptions::new().create(true).append(true).open(&c.log_path);
        }
        drop(s);
        self.refresh();
        Ok(())
    }

    async fn stop_container(&self, container_id: &str, timeout: Duration) -> Result<()> {
        let name = self.container_name(container_id);
        let _g = self.enter(Method::StopContainer, container_id, &[&name]).await?;
        let now = self.now_ns();
        let mut s = self.state.lock();
        let Some(c) = s.containers.get_mut(container_id) else {
            return Err(err(
                Method::StopContainer,
                tonic::Code::NotFound,
                format!("an error occurred when try to find container {container_id:?}: not found"),
            ));
        };
        c.stop_timeouts.push(timeout);
        match c.state {
            api::ContainerState::ContainerRunning => {
                let code = match c.behavior {
                    Behavior::Run { stop_exit_code } => stop_exit_code,
                    _ => 137,
                };
                finish(c, now, code, "");
            }
            api::ContainerState::ContainerCreated => {
                // containerd leaves a never-started container as it is.
            }
            _ => {}
        }
        Ok(())
    }

    async fn remove_container(&self, container_id: &str) -> Result<()> {
        let name = self.container_name(container_id);
        let _g = self.enter(Method::RemoveContainer, container_id, &[&name]).await?;
        let mut s = self.state.lock();
        if let Some(c) = s.containers.get(container_id)
            && c.state == api::ContainerState::ContainerRunning
        {
            return Err(err(
                Method::RemoveContainer,
                tonic::Code::Unknown,
                format!("container {container_id:?} is running, stop it first"),
            ));
        }
        s.containers.remove(container_id);
        Ok(())
    }

    async fn list_containers(&self, filter: Option<api::ContainerFilter>) -> Result<Vec<api::Container>> {
        let _g = self.enter(Method::ListContainers, "", &[]).await?;
        let s = self.state.lock();
        let f = filter.unwrap_or_default();
        Ok(s.containers
            .values()
            .filter(|c| f.id.is_empty() || c.id == f.id)
            .filter(|c| f.pod_sandbox_id.is_empty() || c.sandbox_id == f.pod_sandbox_id)
            .filter(|c| f.state.as_ref().is_none_or(|st| st.state == c.state as i32))
            .filter(|c| labels_match(&f.label_selector, &c.config.labels))
            .map(container_view)
            .collect())
    }

    async fn container_status(&self, container_id: &str) -> Result<api::ContainerStatus> {
        let name = self.container_name(container_id);
        let _g = self.enter(Method::ContainerStatus, container_id, &[&name]).await?;
        let s = self.state.lock();
        let c = s.containers.get(container_id).ok_or_else(|| {
            err(
                Method::ContainerStatus,
                tonic::Code::NotFound,
                format!("an error occurred when try to find container {container_id:?}: not found"),
            )
        })?;
        Ok(api::ContainerStatus {
            id: c.id.clone(),
            metadata: c.config.metadata.clone(),
            state: c.state as i32,
            created_at: c.created_at,
            started_at: c.started_at,
            finished_at: c.finished_at,
            exit_code: c.exit_code,
            image: c.config.image.clone(),
            image_ref: c.image_ref.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            labels: c.config.labels.clone(),
            annotations: c.config.annotations.clone(),
            log_path: c.log_path.clone(),
            image_id: c.image_ref.clone(),
            ..Default::default()
        })
    }

    async fn exec_sync(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        _timeout: Duration,
    ) -> Result<api::ExecSyncResponse> {
        let name = self.container_name(container_id);
        let _g = self.enter(Method::ExecSync, container_id, &[&name]).await?;
        let f = {
            let s = self.state.lock();
            match s.containers.get(container_id) {
                None => {
                    return Err(err(
                        Method::ExecSync,
                        tonic::Code::NotFound,
                        format!("container {container_id} not found"),
                    ));
                }
                Some(c) if c.state != api::ContainerState::ContainerRunning => {
                    return Err(err(
                        Method::ExecSync,
                        tonic::Code::Unknown,
                        format!("container {container_id} is not running"),
                    ));
                }
                Some(_) => s.exec.get(&name).cloned(),
            }
        };
        match f {
            Some(f) => f(&cmd).map_err(|(code, m)| err(Method::ExecSync, code, m)),
            None => Ok(api::ExecSyncResponse::default()),
        }
    }

    async fn reopen_container_log(&self, container_id: &str) -> Result<()> {
        let name = self.container_name(container_id);
        let _g = self.enter(Method::ReopenContainerLog, container_id, &[&name]).await?;
        let s = self.state.lock();
        let c = s.containers.get(container_id).ok_or_else(|| {
            err(Method::ReopenContainerLog, tonic::Code::NotFound, format!("container {container_id} not found"))
        })?;
        if c.state != api::ContainerState::ContainerRunning {
            return Err(err(
                Method::ReopenContainerLog,
                tonic::Code::FailedPrecondition,
                "container is not running".to_string(),
            ));
        }
        if !c.log_path.is_empty() {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&c.log_path)
                .map_err(|e| err(Method::ReopenContainerLog, tonic::Code::Unknown, format!("{}: {e}", c.log_path)))?;
        }
        Ok(())
    }

    async fn list_container_stats(
        &self,
        filter: Option<api::ContainerStatsFilter>,
    ) -> Result<Vec<api::ContainerStats>> {
        let _g = self.enter(Method::ListContainerStats, "", &[]).await?;
        let now = self.now_ns();
        let s = self.state.lock();
        let f = filter.unwrap_or_default();
        Ok(s.containers
            .values()
            .filter(|c| c.state == api::ContainerState::ContainerRunning)
            .filter(|c| f.id.is_empty() || c.id == f.id)
            .filter(|c| f.pod_sandbox_id.is_empty() || c.sandbox_id == f.pod_sandbox_id)
            .filter(|c| labels_match(&f.label_selector, &c.config.labels))
            .map(|c| {
                let canned = s.stats.get(&c.id).copied().unwrap_or_default();
                api::ContainerStats {
                    attributes: Some(api::ContainerAttributes {
                        id: c.id.clone(),
                        metadata: c.config.metadata.clone(),
                        labels: c.config.labels.clone(),
                        annotations: c.config.annotations.clone(),
                    }),
                    cpu: Some(api::CpuUsage {
                        timestamp: now,
                        usage_core_nano_seconds: Some(api::UInt64Value { value: canned.cpu_usage_core_ns }),
                        usage_nano_cores: None,
                    }),
                    memory: Some(api::MemoryUsage {
                        timestamp: now,
                        working_set_bytes: Some(api::UInt64Value { value: canned.memory_working_set_bytes }),
                        ..Default::default()
                    }),
                    writable_layer: canned.writable_layer.map(|(used, inodes)| api::FilesystemUsage {
                        timestamp: now,
                        used_bytes: Some(api::UInt64Value { value: used }),
                        inodes_used: Some(api::UInt64Value { value: inodes }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }
            })
            .collect())
    }
}
