//! Stopping: preStop hooks within the grace period, StopContainer with what
//! remains of it, a pod's containers in termination order (sidecars last)
//! and then its sandboxes; and the clean-up after a pod that left.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Container;
use tracing::{debug, warn};

use super::{Worker, container_ref, find_container, pod_name};
use crate::{
    cm::qos::qos_class,
    cri::error::reason,
    events::EventType,
    pods::{
        metrics::CgroupOperation,
        observed::{self, ObservedPod},
        probe::{self, Target},
        spec,
    },
};

/// The kubelet's minimum grace for a container stop after its preStop hook.
const MIN_GRACE: Duration = Duration::from_secs(2);

impl Worker {
    /// preStop, then StopContainer with what remains of the grace period
    /// (whole seconds, as CRI takes it).
    pub(super) async fn stop_container(&self, id: &str, c: Option<&Container>, grace: Duration, pod_ip: Option<&str>) {
        let started = Instant::now();
        let mut hook_ran = false;
        if let Some(c) = c
            && let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref())
            && !grace.is_zero()
        {
            let ip = pod_ip.or(self.deps.settings.node_ip.as_deref()).and_then(|ip| ip.parse().ok());
            let t = Target { container_id: id, container: c, pod_ip: ip };
            hook_ran = true;
            let outcome =
                tokio::time::timeout(grace, probe::run_handler(self.deps.runtime.as_ref(), &t, hook, grace)).await;
            if !matches!(outcome, Ok(probe::Outcome::Success)) {
                let why = match outcome {
                    Err(_) => "the preStop hook did not finish within the grace period".to_owned(),
                    Ok(probe::Outcome::Failure(m) | probe::Outcome::Error(m)) => m,
                    Ok(probe::Outcome::Success) => String::new(),
                };
                self.deps.recorder.record(
                    &container_ref(&self.pod, c, false),
                    EventType::Warning,
                    reason::FAILED_PRE_STOP_HOOK,
                    &format!("PreStopHook failed: {why}"),
                );
            }
        }
        let remaining = if grace.is_zero() {
            Duration::ZERO
        } else if hook_ran {
            let left = grace.saturating_sub(started.elapsed());
            Duration::from_secs(left.as_secs_f64().ceil() as u64).max(MIN_GRACE)
        } else {
            grace
        };
        if let Err(e) = self.deps.runtime.stop_container(id, remaining).await
            && !e.is_not_found()
        {
            warn!(pod = pod_name(&self.pod), container = id, "stopping container failed: {e}");
        }
    }

    /// Stops every running container (in parallel, each with its preStop
    /// hook; sidecars after the others, one by one in reverse order, with
    /// what is left of the grace period) and then every sandbox.
    pub(super) async fn kill_pod(&self, observed: &ObservedPod, grace: Duration) -> crate::cri::Result<()> {
        let started = Instant::now();
        let running: Vec<&str> = observed.running().map(|c| c.name.as_str()).collect();
        let (first, sidecars) = crate::pods::sidecars::termination_order(&self.pod, &running);
        let in_group = |names: &[&str]| -> Vec<observed::ContainerState> {
            observed.running().filter(|c| names.contains(&c.name.as_str())).cloned().collect()
        };
        self.stop_containers(observed, &in_group(&first), grace).await;
        for name in sidecars {
            let left = grace.saturating_sub(started.elapsed()).max(MIN_GRACE.min(grace));
            self.stop_containers(observed, &in_group(&[name]), left).await;
        }
        for sb in observed.sandboxes.iter().filter(|s| s.ready) {
            if let Err(e) = self.deps.runtime.stop_pod_sandbox(&sb.id).await
                && !e.is_not_found()
            {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Stops `containers` in parallel, each with its preStop hook.
    pub(super) async fn stop_containers(
        &self,
        observed: &ObservedPod,
        containers: &[observed::ContainerState],
        grace: Duration,
    ) {
        let ip = self.pod_ip(observed);
        let stops = containers.iter().map(|c| {
            let spec = find_container(&self.pod, &c.name).map(|(s, _)| s);
            if let Some((s, init)) = find_container(&self.pod, &c.name) {
                self.deps.recorder.record(
                    &container_ref(&self.pod, s, init),
                    EventType::Normal,
                    reason::KILLING,
                    &format!("Stopping container {}", c.name),
                );
            }
            // A container the spec no longer names keeps the grace it was
            // created with.
            let grace = if spec.is_some() {
                grace
            } else {
                c.grace_period_secs.map_or(grace, Duration::from_secs).min(grace.max(MIN_GRACE))
            };
            self.stop_container(&c.id, spec, grace, ip.as_deref())
        });
        futures::future::join_all(stops).await;
    }

    /// Tears down the volumes of a pod that will not run again (once; a
    /// failure is retried with a back-off).
    pub(super) async fn release_volumes(&mut self) {
        if self.volumes_released {
            return;
        }
        match self.deps.volumes.teardown(&self.uid).await {
            Ok(()) => {
                self.volumes_released = true;
                self.teardown_retry = None;
            }
            Err(e) => {
                warn!(pod = pod_name(&self.pod), "releasing the volumes of a finished pod, retrying: {e}");
                let delay =
                    self.teardown_retry.map_or(super::TEARDOWN_RETRY_FIRST, |d| (d * 2).min(super::TEARDOWN_RETRY_MAX));
                self.teardown_retry = Some(delay);
                self.next_wake = Some(Instant::now() + delay);
            }
        }
    }

    pub(super) async fn terminate(&mut self, grace: Duration) -> crate::cri::Result<()> {
        for (_, t) in self.probes.drain() {
            t.abort();
        }
        let observed = observed::observe(self.deps.runtime.as_ref(), &self.uid).await?;
        self.kill_pod(&observed, grace).await
    }

    /// Removes what the pod left: sandboxes (and their containers), the
    /// pod cgroup, its directory and logs.
    pub(super) async fn cleanup(&mut self) {
        if let Ok(observed) = observed::observe(self.deps.runtime.as_ref(), &self.uid).await {
            for sb in &observed.sandboxes {
                if let Err(e) = self.deps.runtime.remove_pod_sandbox(&sb.id).await
                    && !e.is_not_found()
                {
                    warn!(pod = pod_name(&self.pod), "removing sandbox {}: {e}", sb.id);
                }
            }
        }
        let spec = self.pod.spec.clone().unwrap_or_default();
        let started = Instant::now();
        if let Err(e) = self.deps.cgroups.remove_pod_cgroup(qos_class(&spec), &self.uid, Duration::from_secs(10)).await
        {
            debug!(pod = pod_name(&self.pod), "removing the pod cgroup: {e}");
        }
        self.deps.metrics.observe_cgroup_operation(CgroupOperation::Destroy, started.elapsed());
        // Unmounts the pod's volumes first; a directory with something
        // still mounted is left for the orphan sweep.
        if let Err(e) = self.deps.volumes.remove_pod_dir(&self.uid).await {
            warn!(pod = pod_name(&self.pod), "removing the pod directory: {e}");
        }
        let _ = std::fs::remove_dir_all(spec::pod_log_dir(&self.deps.settings, &spec::identity(&self.pod)));
    }
}
