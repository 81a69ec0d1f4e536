//! Starting one container: the restart back-off, the image, environment,
//! mounts (volumes, then the managed /etc/hosts), devices, create, start and
//! the postStart hook. A step that fails leaves the container waiting with
//! the kubelet's reason and event, and the worker wakes to try again.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Container;

use super::{SYNC_RETRY, Worker, container_ref, find_container, instant_of, pod_name, spec_grace};
use crate::{
    cri::{api, error::reason},
    events::EventType,
    pods::{
        hosts,
        observed::{ContainerRunState, ObservedPod},
        probe::{self, Target},
        spec::{self, ContainerStart},
    },
};

impl Worker {
    pub(super) fn backoff_key(&self, c: &Container) -> String {
        format!("{}_{}", self.uid, c.name)
    }

    pub(super) fn set_waiting(
        &mut self,
        c: &Container,
        init: bool,
        reason: &str,
        message: String,
        event: Option<(&str, &str)>,
    ) {
        if let Some((ev_reason, text)) = event {
            self.deps.recorder.record(&container_ref(&self.pod, c, init), EventType::Warning, ev_reason, text);
        }
        self.waiting.insert(c.name.clone(), (reason.to_owned(), message));
    }

    pub(super) async fn start_container(
        &mut self,
        name: &str,
        sandbox_id: &str,
        sandbox_config: &api::PodSandboxConfig,
        observed: &ObservedPod,
        pod_ip: Option<String>,
    ) {
        let Some((c, init)) = find_container(&self.pod, name)
            .map(|(c, i)| (c.clone(), i))
            .or_else(|| crate::pods::ephemeral::find(&self.pod, name).map(|c| (c, false)))
        else {
            return;
        };
        let latest = observed.latest(name);
        // A container that exited, or that was created but never started
        // (a failed start), waits out the back-off before the next attempt.
        let failed = latest.and_then(|l| match l.state {
            ContainerRunState::Exited => Some(l.finished_at.max(l.created_at)),
            ContainerRunState::Created => Some(l.created_at),
            _ => None,
        });
        if let Some(failed_at) = failed {
            let key = self.backoff_key(&c);
            let failed_at = instant_of(failed_at);
            if let Some(wait) = self.backoff.remaining(&key, failed_at, Instant::now()) {
                let delay = self.backoff.delay(&key).unwrap_or_default();
                let message = format!(
                    "back-off {} restarting failed container={} pod={}",
                    humantime(delay),
                    c.name,
                    pod_name(&self.pod)
                );
                let event = format!("Back-off restarting failed container {} in pod {}", c.name, pod_name(&self.pod));
                self.set_waiting(&c, init, reason::CRASH_LOOP_BACK_OFF, message, Some((reason::BACK_OFF, &event)));
                self.next_wake = Some(self.next_wake.map_or(Instant::now() + wait, |w| w.min(Instant::now() + wait)));
                return;
            }
            self.backoff.next(&key, failed_at);
        }
        let restart_count = latest.map_or(0, |l| l.attempt + 1);
        let image = match self.deps.images.ensure(&self.pod, &c, sandbox_config).await {
            Ok(r) => r,
            Err(f) => {
                let reason = f.reason.clone();
                self.set_waiting(&c, init, &reason, f.message.clone(), None);
                // Image reasons come with their own back-off in the image
                // manager; look again soon.
                self.next_wake = Some(Instant::now() + Duration::from_secs(5));
                return;
            }
        };
        let pod_ips: Vec<String> = pod_ip.clone().into_iter().collect();
        let env_objects = self.deps.volumes.env_objects(&self.pod, &c).await;
        let mut start = ContainerStart {
            pod: &self.pod,
            container: &c,
            init,
            restart_count,
            image_ref: &image.image_ref,
            pod_ips: pod_ips.clone(),
            env_objects: &env_objects,
            mounts: &[],
            image_user: &image.user,
        };
        // The environment first: subPathExpr expands from it.
        let mounts = match spec::container_env(&start, &self.deps.settings) {
            Ok(env) => self.deps.volumes.container_mounts(&self.pod, &c, &env).await,
            Err(e) => Err(e.to_string()),
        };
        // Then the managed /etc/hosts, after the volumes as the kubelet.
        let mounts = mounts.and_then(|mut m| {
            if hosts::mounts_hosts_file(&c, &pod_ips) {
                m.push(self.write_hosts_file(&pod_ips)?);
            }
            Ok(m)
        });
        let config = match mounts {
            Ok(m) => {
                start.mounts = &m;
                spec::container_config(&start, &self.deps.settings).map_err(|e| e.to_string())
            }
            Err(e) => Err(e),
        };
        // Block volumes (volumeDevices) as devices.
        let config = match config {
            Ok(mut cfg) => match self.deps.volumes.container_devices(&self.pod, &c).await {
                Ok(devices) => {
                    cfg.devices.extend(devices);
                    Ok(cfg)
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        // Devices from the device plugins (Allocate, PreStartContainer).
        let config = match (config, &self.deps.devices) {
            (Ok(mut cfg), Some(devices)) => match devices.container_options(&self.pod, &c.name).await {
                Ok(Some(o)) => {
                    crate::deviceplugin::container::apply(&mut cfg, &o);
                    Ok(cfg)
                }
                Ok(None) => Ok(cfg),
                Err(e) => Err(e),
            },
            (config, _) => config,
        };
        // An ephemeral container's target process namespace.
        let config = config.and_then(|mut cfg| {
            crate::pods::ephemeral::apply_target(&mut cfg, &self.pod, name, observed).map(|()| cfg)
        });
        let config = match config {
            Ok(cfg) => cfg,
            Err(e) => {
                let text = format!("Error: {e}");
                self.set_waiting(&c, init, reason::CREATE_CONTAINER_CONFIG_ERROR, e, Some((reason::FAILED, &text)));
                self.next_wake = Some(Instant::now() + SYNC_RETRY);
                return;
            }
        };
        // The termination message file must exist before the runtime
        // bind-mounts it.
        let message_file = spec::termination_message_file(&self.deps.settings, &self.uid, &c.name, restart_count);
        if let Some(dir) = message_file.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if std::fs::write(&message_file, b"").is_ok() {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&message_file, std::fs::Permissions::from_mode(0o666));
        }
        let resources = config.linux.as_ref().and_then(|l| l.resources.clone());
        let id = match self.deps.runtime.create_container(sandbox_id, config, sandbox_config.clone()).await {
            Ok(id) => {
                self.created_with(&id, resources);
                id
            }
            Err(e) => {
                let text = format!("Error: {}", e.message());
                self.set_waiting(&c, init, reason::CREATE_CONTAINER_ERROR, e.message(), Some((reason::FAILED, &text)));
                self.next_wake = Some(Instant::now() + SYNC_RETRY);
                return;
            }
        };
        let cref = container_ref(&self.pod, &c, init);
        self.deps.recorder.record(&cref, EventType::Normal, reason::CREATED, &format!("Created container {}", c.name));
        if let Err(e) = self.deps.runtime.start_container(&id).await {
            let text = format!("Error: {}", e.message());
            self.set_waiting(&c, init, reason::RUN_CONTAINER_ERROR, e.message(), Some((reason::FAILED, &text)));
            self.next_wake = Some(Instant::now() + SYNC_RETRY);
            return;
        }
        self.deps.recorder.record(&cref, EventType::Normal, reason::STARTED, &format!("Started container {}", c.name));
        self.waiting.remove(&c.name);
        if c.startup_probe.is_some() {
            self.results.lock().not_started.insert(id.clone(), true);
        }
        if let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            let ip = pod_ip.and_then(|ip| ip.parse::<IpAddr>().ok());
            let t = Target { container_id: &id, container: &c, pod_ip: ip };
            let outcome = probe::run_handler(self.deps.runtime.as_ref(), &t, hook, spec_grace(&self.pod)).await;
            if !outcome.ok() {
                let msg = match &outcome {
                    probe::Outcome::Failure(m) | probe::Outcome::Error(m) => m.clone(),
                    probe::Outcome::Success => String::new(),
                };
                let text = format!("PostStartHook failed: {msg}");
                self.deps.recorder.record(&cref, EventType::Warning, reason::FAILED_POST_START_HOOK, &text);
                self.stop_container(&id, Some(&c), spec_grace(&self.pod), None).await;
                self.waiting.insert(c.name.clone(), (reason::POST_START_HOOK_ERROR.into(), text));
            }
        }
    }

    /// Writes `<pod dir>/etc-hosts` (the kubelet's managed hosts file) and
    /// returns its mount.
    pub(super) fn write_hosts_file(&self, pod_ips: &[String]) -> Result<api::Mount, String> {
        let node_hosts = std::fs::read_to_string(hosts::ETC_HOSTS).unwrap_or_default();
        let text = hosts::hosts_file(&self.pod, pod_ips, self.deps.settings.cluster_domain.as_deref(), &node_hosts);
        let path = self.deps.settings.pods_dir.join(&self.uid).join("etc-hosts");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        crate::host::write_atomic(&path, text.as_bytes(), 0o644)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok(api::Mount {
            container_path: hosts::ETC_HOSTS.into(),
            host_path: path.to_string_lossy().into_owned(),
            ..Default::default()
        })
    }
}

/// A whole-second delay as Go's time.Duration prints it (the kubelet's
/// back-off message).
fn humantime(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 && s.is_multiple_of(60) {
        format!("{}m0s", s / 60)
    } else if s >= 60 {
        format!("{}m{}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_go_prints_them() {
        assert_eq!(humantime(Duration::from_secs(10)), "10s");
        assert_eq!(humantime(Duration::from_secs(80)), "1m20s");
        assert_eq!(humantime(Duration::from_secs(300)), "5m0s");
    }
}
