//! Probe tasks: one per probe of every running container, each feeding the
//! results the sync round and the status read (readiness, started, and the
//! liveness and startup verdicts that restart a container).

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::{Worker, WorkerDeps, container_ref, find_container, instant_of};
use crate::{
    cri::error::reason,
    events::EventType,
    pods::{
        observed::ObservedPod,
        plan::ProbeVerdict,
        probe::{self, ProbeType, Target, Tracker},
    },
};

/// What the probe tasks found, read by the sync round (verdicts, started)
/// and the status (readiness); keyed by container id.
#[derive(Default)]
pub(super) struct ProbeResults {
    pub(super) readiness: HashMap<String, bool>,
    pub(super) not_started: HashMap<String, bool>,
    pub(super) verdicts: HashMap<String, ProbeVerdict>,
}

impl Worker {
    /// One probe task per probe of every running container; tasks of
    /// containers that stopped are ended.
    pub(super) fn reconcile_probes(&mut self, observed: &ObservedPod) {
        let mut want: HashSet<(String, ProbeType)> = HashSet::new();
        let pod_ip = self.pod_ip(observed).and_then(|ip| ip.parse::<IpAddr>().ok());
        for c in observed.running() {
            let Some((spec, _)) = find_container(&self.pod, &c.name) else { continue };
            for (kind, p) in [
                (ProbeType::Startup, &spec.startup_probe),
                (ProbeType::Liveness, &spec.liveness_probe),
                (ProbeType::Readiness, &spec.readiness_probe),
            ] {
                let Some(p) = p else { continue };
                let key = (c.id.clone(), kind);
                want.insert(key.clone());
                if self.probes.contains_key(&key) {
                    continue;
                }
                if kind == ProbeType::Startup && !self.results.lock().not_started.contains_key(&c.id) {
                    // Re-adopted after a restart: assume it started only if
                    // it has been running longer than the probe's budget.
                    let budget = p.initial_delay_seconds.unwrap_or(0) as u64
                        + p.period_seconds.unwrap_or(10) as u64 * p.failure_threshold.unwrap_or(3) as u64;
                    let running_for = instant_of(c.started_at).elapsed();
                    if running_for < Duration::from_secs(budget) {
                        self.results.lock().not_started.insert(c.id.clone(), true);
                    } else {
                        continue;
                    }
                }
                let task = ProbeTask {
                    deps: self.deps.clone(),
                    pod: self.pod.clone(),
                    container: spec.clone(),
                    id: c.id.clone(),
                    kind,
                    probe: p.clone(),
                    pod_ip,
                    results: self.results.clone(),
                    wake: self.wake.clone(),
                };
                self.probes.insert(key, tokio::spawn(task.run()));
            }
        }
        self.probes.retain(|k, t| {
            let keep = want.contains(k);
            if !keep {
                t.abort();
            }
            keep
        });
        let live: HashSet<&String> = observed.running().map(|c| &c.id).collect();
        let mut r = self.results.lock();
        r.readiness.retain(|id, _| live.contains(id));
        r.not_started.retain(|id, _| live.contains(id));
        r.verdicts.retain(|id, _| live.contains(id));
    }
}

/// One probe of one container, run every periodSeconds until its result
/// is final for the container (a failed liveness or startup probe, a
/// passed startup probe).
struct ProbeTask {
    deps: Arc<WorkerDeps>,
    pod: Pod,
    container: Container,
    id: String,
    kind: ProbeType,
    probe: Probe,
    pod_ip: Option<IpAddr>,
    results: Arc<Mutex<ProbeResults>>,
    wake: Arc<Notify>,
}

impl ProbeTask {
    async fn run(self) {
        let initial = Duration::from_secs(self.probe.initial_delay_seconds.unwrap_or(0).max(0) as u64);
        let period = Duration::from_secs(self.probe.period_seconds.unwrap_or(10).max(1) as u64);
        tokio::time::sleep(initial).await;
        let mut tracker = Tracker::new(&self.probe);
        let target = Target { container_id: &self.id, container: &self.container, pod_ip: self.pod_ip };
        // Sidecars' events name them under spec.initContainers.
        let init = find_container(&self.pod, &self.container.name).is_some_and(|(_, init)| init);
        let cref = container_ref(&self.pod, &self.container, init);
        loop {
            let waiting_for_startup = self.kind != ProbeType::Startup
                && self.results.lock().not_started.get(&self.id).copied().unwrap_or(false);
            if !waiting_for_startup {
                let outcome = probe::run(self.deps.runtime.as_ref(), &target, &self.probe).await;
                if let Some(f) = &self.deps.probe_results {
                    f(&self.pod, &self.container.name, self.kind, &outcome);
                }
                match &outcome {
                    probe::Outcome::Failure(m) => self.deps.recorder.record(
                        &cref,
                        EventType::Warning,
                        reason::UNHEALTHY,
                        &format!("{} probe failed: {m}", self.kind.as_str()),
                    ),
                    probe::Outcome::Error(m) => self.deps.recorder.record(
                        &cref,
                        EventType::Warning,
                        reason::UNHEALTHY,
                        &format!("{} probe errored: {m}", self.kind.as_str()),
                    ),
                    probe::Outcome::Success => {}
                }
                if let Some(v) = tracker.record(outcome.ok()) {
                    let mut r = self.results.lock();
                    let stop = match (self.kind, v) {
                        (ProbeType::Readiness, v) => {
                            r.readiness.insert(self.id.clone(), v);
                            false
                        }
                        (ProbeType::Liveness, true) => false,
                        (ProbeType::Liveness, false) => {
                            r.verdicts.insert(self.id.clone(), ProbeVerdict::LivenessFailed);
                            true
                        }
                        (ProbeType::Startup, true) => {
                            r.not_started.remove(&self.id);
                            true
                        }
                        (ProbeType::Startup, false) => {
                            r.verdicts.insert(self.id.clone(), ProbeVerdict::StartupFailed);
                            true
                        }
                    };
                    drop(r);
                    self.wake.notify_one();
                    if stop {
                        return;
                    }
                }
            }
            tokio::time::sleep(period).await;
        }
    }
}
