//! The running pod's round (the kubelet's SyncPod): observe, plan, set up
//! volumes and the sandbox, kill what the plan kills, start what it starts,
//! then reconcile the probes and report.

use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::{SYNC_RETRY, Worker, container_ref, find_container, pod_name, spec_grace};
use crate::{
    cm::{
        hierarchy::{pod_cgroup_config, pod_hugetlb_limits},
        qos::qos_class,
    },
    cri::error::reason,
    events::{EventType, pod_ref},
    pods::{
        metrics::CgroupOperation,
        observed::{self, ObservedPod},
        plan::{self, ProbeVerdict},
        spec,
    },
    volumes::manager::FAILED_MOUNT,
};

/// Volume set-up retries: 1 s doubling to 1 min.
const MOUNT_RETRY_FIRST: Duration = Duration::from_secs(1);
const MOUNT_RETRY_MAX: Duration = Duration::from_secs(60);

impl Worker {
    pub(super) fn pod_ip(&self, observed: &ObservedPod) -> Option<String> {
        if spec::host_network(&self.pod) {
            return self.deps.settings.node_ip.clone();
        }
        observed.ready_sandbox().and_then(|s| s.ip.clone())
    }

    pub(super) async fn sync(&mut self) -> crate::cri::Result<()> {
        // A pod whose containers finished for good (Succeeded, or Failed
        // under restartPolicy Never) is terminal, as the kubelet's pod
        // worker: garbage collection or disk reclaim may remove its dead
        // containers and sandbox, which must not read as "never ran" and
        // start it again. Its last status stands, and its volumes are
        // released (the API server deletes a terminal pod at once).
        if self.finished {
            self.deps.allocations.deactivate(&self.uid);
            self.release_volumes().await;
            return Ok(());
        }
        // The resources the pod runs with, a resize admitted or not.
        self.admit_resize();
        let rt = self.deps.runtime.clone();
        let mut observed = observed::observe(rt.as_ref(), &self.uid).await?;
        let ip = self.pod_ip(&observed);
        if self.actuate_resize(&observed, ip.as_deref()).await {
            observed = observed::observe(rt.as_ref(), &self.uid).await?;
        }
        let verdicts = {
            let r = self.results.lock();
            let mut v = r.verdicts.clone();
            // Containers still waiting for their startup probe (a sidecar
            // not started holds the next init container back).
            for (id, _) in r.not_started.iter().filter(|(_, waiting)| **waiting) {
                v.entry(id.clone()).or_insert(ProbeVerdict::NotStarted);
            }
            v
        };
        let actions = plan::compute(&self.pod, &observed, &verdicts);
        let acted = actions.kill_pod
            || actions.create_sandbox.is_some()
            || !actions.start.is_empty()
            || actions.next_init.is_some()
            || !actions.init_start.is_empty()
            || !actions.kill.is_empty();
        if actions.kill_pod {
            self.kill_pod(&observed, spec_grace(&self.pod)).await?;
            if actions.create_sandbox.is_none() && !observed.containers.is_empty() {
                // Nothing left to run and nothing to restart.
                self.finished = true;
            }
        }
        let mut sandbox_id = actions.sandbox_id.clone();
        let mut sandbox_ip = observed.ready_sandbox().and_then(|s| s.ip.clone());
        // Volumes before the sandbox and any container (the kubelet's
        // WaitForAttachAndMount); what is already running keeps running.
        let needs_volumes = actions.create_sandbox.is_some()
            || actions.next_init.is_some()
            || !actions.init_start.is_empty()
            || !actions.start.is_empty();
        let volumes_ready = if needs_volumes {
            self.mount_volumes().await
        } else {
            // Running containers (re-adopted after a restart, say): register
            // their volumes for updates; a failure here blocks nothing.
            if let Err(e) = self.deps.volumes.setup(&self.pod).await {
                debug!(pod = pod_name(&self.pod), "volumes of running containers: {e}");
            }
            true
        };
        if let Some(attempt) = actions.create_sandbox.filter(|_| volumes_ready) {
            match self.create_sandbox(attempt).await {
                Ok((id, ip)) => {
                    sandbox_id = Some(id);
                    sandbox_ip = ip;
                    self.finished = false;
                    self.volumes_released = false;
                }
                Err(e) => {
                    self.next_wake = Some(Instant::now() + SYNC_RETRY);
                    self.report(&observed).await;
                    return Err(e);
                }
            }
        }
        for k in &actions.kill {
            let (c, init) = find_container(&self.pod, &k.name).map(|(c, i)| (c.clone(), i)).unzip();
            if let Some(probe) = k.probe {
                info!(pod = pod_name(&self.pod), container = k.name, "{probe} probe failed: restarting");
            }
            let grace = c
                .as_ref()
                .and_then(|c| match k.probe {
                    Some("Liveness") => c.liveness_probe.as_ref(),
                    Some("Startup") => c.startup_probe.as_ref(),
                    _ => None,
                })
                .and_then(|p| p.termination_grace_period_seconds)
                .map(|s| Duration::from_secs(s.max(0) as u64))
                .unwrap_or_else(|| spec_grace(&self.pod));
            if let (Some(c), Some(init)) = (&c, init) {
                self.deps.recorder.record(
                    &container_ref(&self.pod, c, init),
                    EventType::Normal,
                    reason::KILLING,
                    &k.message,
                );
            }
            self.stop_container(&k.id, c.as_ref(), grace, sandbox_ip.as_deref()).await;
            self.results.lock().verdicts.remove(&k.id);
        }
        if let Some(sandbox_id) = sandbox_id.filter(|_| volumes_ready) {
            let sandbox_config = spec::sandbox_config(
                &self.pod,
                observed.sandboxes.first().map_or(0, |s| s.attempt),
                &self.deps.settings,
            );
            let pod_ip =
                if spec::host_network(&self.pod) { self.deps.settings.node_ip.clone() } else { sandbox_ip.clone() };
            let mut names: Vec<String> =
                actions.next_init.iter().chain(&actions.init_start).chain(&actions.start).cloned().collect();
            names.extend(crate::pods::ephemeral::to_start(&self.pod, &observed));
            for name in names {
                self.start_container(&name, &sandbox_id, &sandbox_config, &observed, pod_ip.clone()).await;
            }
        }
        if acted || !crate::pods::ephemeral::to_start(&self.pod, &observed).is_empty() {
            observed = observed::observe(rt.as_ref(), &self.uid).await?;
        }
        self.reconcile_probes(&observed);
        self.report(&observed).await;
        if self.finished {
            self.release_volumes().await;
        }
        Ok(())
    }

    /// Sets up the pod's volumes; on failure records FailedMount, shows
    /// ContainerCreating with the reason on the containers not running,
    /// and retries with a back-off. True when every volume is ready.
    pub(super) async fn mount_volumes(&mut self) -> bool {
        match self.deps.volumes.setup(&self.pod).await {
            Ok(()) => {
                if self.mount_retry.take().is_some() {
                    self.waiting.retain(|_, (r, m)| !(r == reason::CONTAINER_CREATING && m.starts_with("MountVolume")));
                }
                true
            }
            Err(e) => {
                let message = e.to_string();
                warn!(pod = pod_name(&self.pod), "{message}");
                self.deps.recorder.record(&pod_ref(&self.pod), EventType::Warning, FAILED_MOUNT, &message);
                self.wait_creating(&message);
                let delay = self.mount_retry.map_or(MOUNT_RETRY_FIRST, |d| (d * 2).min(MOUNT_RETRY_MAX));
                self.mount_retry = Some(delay);
                let at = Instant::now() + delay;
                self.next_wake = Some(self.next_wake.map_or(at, |w| w.min(at)));
                false
            }
        }
    }

    pub(super) async fn create_sandbox(&mut self, attempt: u32) -> crate::cri::Result<(String, Option<String>)> {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let mut limits =
            pod_cgroup_config(&spec, self.deps.cpu_cfs_quota, self.deps.cpu_cfs_quota_period, self.deps.pod_pids_limit);
        limits.hugetlb = pod_hugetlb_limits(&spec, &self.deps.settings.features.hugepage_sizes);
        let qos = qos_class(&spec);
        let op = if self.deps.cgroups.fs().exists(&self.deps.cgroups.pod_cgroup(qos, &self.uid)) {
            CgroupOperation::Update
        } else {
            CgroupOperation::Create
        };
        let started = Instant::now();
        let ensured = self.deps.cgroups.ensure_pod_cgroup(qos, &self.uid, &limits).await;
        self.deps.metrics.observe_cgroup_operation(op, started.elapsed());
        if let Err(e) = ensured {
            // As the kubelet: no sandbox for a pod whose cgroup (and so its
            // limits) is not in place; the worker retries after its back-off.
            let message = format!("unable to ensure pod container exists: {e}");
            warn!(pod = pod_name(&self.pod), "{message}");
            self.deps.recorder.record(
                &pod_ref(&self.pod),
                EventType::Warning,
                reason::FAILED_CREATE_POD_CONTAINER,
                &message,
            );
            self.wait_creating(&message);
            return Err(crate::cri::CriError::Status {
                call: "the pod cgroup",
                code: tonic::Code::FailedPrecondition,
                message,
            });
        }
        self.waiting.retain(|_, (r, m)| {
            !(r == reason::CONTAINER_CREATING && m.starts_with("unable to ensure pod container exists"))
        });
        self.pod_cgroup_set(&limits);
        let config = spec::sandbox_config(&self.pod, attempt, &self.deps.settings);
        let _ = std::fs::create_dir_all(&config.log_directory);
        if attempt > 0 {
            self.deps.recorder.record(
                &pod_ref(&self.pod),
                EventType::Normal,
                reason::SANDBOX_CHANGED,
                "Pod sandbox changed, it will be killed and re-created.",
            );
        }
        // The RuntimeClass's handler; a class that cannot be resolved fails
        // the sandbox as the runtime would fail an unknown handler.
        let handler = self.deps.runtime_classes.handler_for(&self.pod).await.map_err(|message| {
            crate::cri::CriError::Status { call: "RunPodSandbox", code: tonic::Code::NotFound, message }
        });
        let created = match handler {
            Ok(handler) => self.deps.runtime.run_pod_sandbox(config, &handler).await,
            Err(e) => Err(e),
        };
        let id = match created {
            Ok(id) => id,
            Err(e) => {
                let message = format!("Failed to create pod sandbox: {}", e.message());
                self.deps.recorder.record(
                    &pod_ref(&self.pod),
                    EventType::Warning,
                    reason::FAILED_CREATE_POD_SANDBOX,
                    &message,
                );
                // The containers wait on the sandbox, with the runtime's word.
                self.wait_creating(&message);
                return Err(e);
            }
        };
        self.waiting
            .retain(|_, (r, m)| !(r == reason::CONTAINER_CREATING && m.starts_with("Failed to create pod sandbox")));
        let ip = self
            .deps
            .runtime
            .pod_sandbox_status(&id)
            .await
            .ok()
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .filter(|ip| !ip.is_empty());
        debug!(pod = pod_name(&self.pod), sandbox = id, attempt, "sandbox created");
        Ok((id, ip))
    }

    /// Every container of the pod, init containers included, shows
    /// ContainerCreating with `message`: what holds them all back (the
    /// volumes, the sandbox) is the pod's, not one container's.
    fn wait_creating(&mut self, message: &str) {
        let names: Vec<String> = self
            .pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(s.containers.iter()))
            .map(|c| c.name.clone())
            .collect();
        for name in names {
            self.waiting.insert(name, (reason::CONTAINER_CREATING.into(), message.to_owned()));
        }
    }
}
