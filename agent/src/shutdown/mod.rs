//! Graceful node shutdown (the kubelet's shutdownManager). When the node
//! is going down and `shutdownGracePeriod` is set, pods stop in priority
//! groups (`plan`): regular pods first within `shutdownGracePeriod −
//! shutdownGracePeriodCriticalPods`, critical pods last within
//! `shutdownGracePeriodCriticalPods`. Each ends Failed with reason
//! `Terminated`, the kubelet's message and a DisruptionTarget condition;
//! new pods are refused; the node reports NotReady ("node is shutting
//! down") through [`NodeShutdownManager::shutting_down`].
//!
//! How the shutdown is noticed: on a systemd node, as the kubelet does,
//! from systemd-logind (`logind`: a delay inhibitor lock and
//! PrepareForShutdown); anywhere, `trigger`'s marker file (polled by
//! [`NodeShutdownManager::run`]), or SIGTERM while systemd, SysV init or
//! the marker say the system is stopping (the binary calls
//! [`NodeShutdownManager::on_sigterm`]). A plain SIGTERM stops only the
//! agent and leaves the pods running.

pub mod logind;
pub mod plan;
pub mod trigger;

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::ObjectReference;
use parking_lot::Mutex;
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use self::{
    plan::{PriorityPeriod, ShutdownPod, groups},
    trigger::Detector,
};
use crate::{
    cm::qos::priority,
    events::{EventRecorder, EventType},
    pods::{admission::Rejection, manager::PodManager, status::TerminalReason},
};

/// The kubelet's status reason and message for pods stopped by a node shutdown.
pub const SHUTDOWN_REASON: &str = "Terminated";
pub const SHUTDOWN_MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// For pods that arrive once the shutdown started.
pub const NOT_ADMITTED_REASON: &str = "NodeShutdown";
pub const NOT_ADMITTED_MESSAGE: &str = "Pod was rejected as the node is shutting down.";
/// The Ready condition's message while shutting down.
pub const NOT_READY_MESSAGE: &str = "node is shutting down";

/// What the shutdown manager needs from the pod manager.
pub trait ShutdownPods: Send + Sync {
    /// Pods that run (or may run again).
    fn pods(&self) -> Vec<ShutdownPod>;
    /// Stop a pod for good within `grace`, leaving it Failed with `reason`.
    fn kill(&self, uid: &str, grace: Duration, reason: TerminalReason);
    /// Its containers and sandbox have stopped.
    fn stopped(&self, uid: &str) -> bool;
    /// Refuse pods that arrive from now on.
    fn refuse_new(&self);
    /// Every pod source has been heard from since the agent started, so
    /// `pods` lists every pod the node runs (an agent that just restarted
    /// may not know its pods yet).
    fn synced(&self) -> bool {
        true
    }
}

/// How long a shutdown waits for the pod sources to report before it lists
/// the pods to stop (at most the grace period).
const SYNC_WAIT: Duration = Duration::from_secs(10);

impl ShutdownPods for PodManager {
    fn pods(&self) -> Vec<ShutdownPod> {
        self.running_pods()
            .into_iter()
            .map(|(uid, pod)| ShutdownPod {
                uid,
                name: format!(
                    "{}/{}",
                    pod.metadata.namespace.as_deref().unwrap_or("default"),
                    pod.metadata.name.as_deref().unwrap_or("")
                ),
                priority: priority(&pod),
                termination_grace: pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
                    .map(|s| Duration::from_secs(s.max(0) as u64)),
            })
            .collect()
    }

    fn kill(&self, uid: &str, grace: Duration, reason: TerminalReason) {
        self.terminate_pod(uid, grace, reason);
    }

    fn stopped(&self, uid: &str) -> bool {
        self.is_stopped(uid)
    }

    fn synced(&self) -> bool {
        crate::gc::ActivePods::all_sources_ready(self)
    }

    fn refuse_new(&self) {
        self.refuse_new_pods(Some(Rejection {
            reason: NOT_ADMITTED_REASON.into(),
            message: NOT_ADMITTED_MESSAGE.into(),
        }));
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Idle,
    /// Pods are being stopped.
    InProgress,
    /// Every group was stopped (or its time ran out).
    Done,
}

pub struct NodeShutdownManager {
    grace: Duration,
    steps: Vec<PriorityPeriod>,
    detector: Detector,
    pods: Arc<dyn ShutdownPods>,
    recorder: Arc<dyn EventRecorder>,
    node: ObjectReference,
    phase: watch::Sender<Phase>,
    started: Mutex<bool>,
}

impl NodeShutdownManager {
    pub fn new(
        grace: Duration,
        critical: Duration,
        detector: Detector,
        pods: Arc<dyn ShutdownPods>,
        recorder: Arc<dyn EventRecorder>,
        node: ObjectReference,
    ) -> NodeShutdownManager {
        NodeShutdownManager {
            grace,
            steps: plan::steps(grace, critical),
            detector,
            pods,
            recorder,
            node,
            phase: watch::channel(Phase::Idle).0,
            started: Mutex::new(false),
        }
    }

    /// shutdownGracePeriod: how long the whole shutdown may take.
    pub fn grace_period(&self) -> Duration {
        self.grace
    }

    /// Graceful node shutdown is on (shutdownGracePeriod > 0).
    pub fn enabled(&self) -> bool {
        !self.steps.is_empty()
    }

    /// The phase; anything but Idle means the node is NotReady with
    /// [`NOT_READY_MESSAGE`].
    pub fn shutting_down(&self) -> watch::Receiver<Phase> {
        self.phase.subscribe()
    }

    /// Stops the pods group by group; returns when done. A second call
    /// waits for the first.
    pub async fn shutdown(&self, why: &str) {
        let first = {
            let mut started = self.started.lock();
            !std::mem::replace(&mut *started, true)
        };
        if !first {
            let mut rx = self.phase.subscribe();
            let _ = rx.wait_for(|p| *p == Phase::Done).await;
            return;
        }
        info!("node shutdown: {why}; stopping pods");
        self.phase.send_replace(Phase::InProgress);
        self.recorder.record(&self.node, EventType::Normal, "Shutdown", "Shutdown manager detected shutdown event");
        // Pods that run must be stopped even when the agent has only just
        // started: wait for its sources before refusing what they bring.
        let sync_deadline = Instant::now() + SYNC_WAIT.min(self.grace);
        while !self.pods.synced() && Instant::now() < sync_deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if !self.pods.synced() {
            warn!("node shutdown: the pod sources have not all reported; stopping the pods known so far");
        }
        self.pods.refuse_new();
        let reason =
            TerminalReason { reason: SHUTDOWN_REASON.into(), message: SHUTDOWN_MESSAGE.into(), disruption: true };
        for group in groups(&self.steps, &self.pods.pods()) {
            let started = Instant::now();
            info!(
                priority = group.priority,
                period = ?group.period,
                pods = ?group.pods.iter().map(|(p, _)| p.name.as_str()).collect::<Vec<_>>(),
                "node shutdown: stopping a priority group"
            );
            for (p, grace) in &group.pods {
                self.pods.kill(&p.uid, *grace, reason.clone());
            }
            let deadline = started + group.period;
            loop {
                if group.pods.iter().all(|(p, _)| self.pods.stopped(&p.uid)) {
                    info!(priority = group.priority, took = ?started.elapsed(), "node shutdown: group stopped");
                    break;
                }
                if Instant::now() >= deadline {
                    warn!(priority = group.priority, period = ?group.period, "node shutdown: the group's period ran out");
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        info!("node shutdown: pods stopped");
        self.phase.send_replace(Phase::Done);
    }

    /// For the binary's SIGTERM: if the node is shutting down (and the
    /// feature is on), stops the pods first; returns whether it did.
    pub async fn on_sigterm(&self) -> bool {
        if !self.enabled() {
            return false;
        }
        let in_progress = *self.phase.borrow() != Phase::Idle;
        match self.detector.check() {
            Some(why) => {
                self.shutdown(&why).await;
                true
            }
            None if in_progress => {
                self.shutdown("SIGTERM during the node shutdown").await;
                true
            }
            None => false,
        }
    }

    /// Polls the marker file and starts the shutdown when it appears.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        if !self.enabled() || self.detector.marker.is_none() {
            return;
        }
        if self.detector.marker().is_some() {
            warn!("the node shutdown marker exists at start: shutting down");
        }
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => return,
            }
            if let Some(why) = self.detector.marker() {
                self.shutdown(&why).await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::cm::qos::SYSTEM_NODE_CRITICAL_PRIORITY;

    /// Pods that stop after a scripted delay (capped by the grace given).
    #[derive(Default)]
    struct Pods {
        pods: Vec<ShutdownPod>,
        stop_after: HashMap<String, Duration>,
        killed: Mutex<Vec<(String, Duration, Instant)>>,
        refused: Mutex<bool>,
        /// Sources report (and the pods appear) this long after the start.
        synced_after: Option<(Instant, Duration)>,
    }

    impl Pods {
        fn is_synced(&self) -> bool {
            self.synced_after.is_none_or(|(start, after)| start.elapsed() >= after)
        }
    }

    impl ShutdownPods for Pods {
        fn pods(&self) -> Vec<ShutdownPod> {
            if self.is_synced() { self.pods.clone() } else { vec![] }
        }

        fn synced(&self) -> bool {
            self.is_synced()
        }

        fn kill(&self, uid: &str, grace: Duration, reason: TerminalReason) {
            assert_eq!((reason.reason.as_str(), reason.message.as_str()), (SHUTDOWN_REASON, SHUTDOWN_MESSAGE));
            assert!(reason.disruption);
            self.killed.lock().push((uid.into(), grace, Instant::now()));
        }

        fn stopped(&self, uid: &str) -> bool {
            let killed = self.killed.lock();
            let Some((_, grace, at)) = killed.iter().find(|(u, _, _)| u == uid) else { return false };
            at.elapsed() >= self.stop_after[uid].min(*grace)
        }

        fn refuse_new(&self) {
            assert!(self.is_synced(), "new pods refused before the sources reported: re-adopted pods would be refused");
            *self.refused.lock() = true;
        }
    }

    struct NoEvents;
    impl EventRecorder for NoEvents {
        fn record(&self, _: &ObjectReference, _: EventType, _: &str, _: &str) {}
    }

    fn pod(uid: &str, priority: i32, grace: u64) -> ShutdownPod {
        ShutdownPod { uid: uid.into(), name: uid.into(), priority, termination_grace: Some(Duration::from_secs(grace)) }
    }

    #[tokio::test(start_paused = true)]
    async fn regular_pods_stop_before_critical_ones_within_their_budgets() {
        let pods = Arc::new(Pods {
            pods: vec![pod("web", 0, 30), pod("dns", SYSTEM_NODE_CRITICAL_PRIORITY, 30), pod("quick", 0, 1)],
            // web ignores SIGTERM: it stops only when its grace runs out.
            stop_after: [
                ("web".into(), Duration::from_secs(3600)),
                ("dns".into(), Duration::from_secs(1)),
                ("quick".into(), Duration::ZERO),
            ]
            .into(),
            ..Default::default()
        });
        let m = NodeShutdownManager::new(
            Duration::from_secs(10),
            Duration::from_secs(4),
            Detector { marker: None, system: false },
            pods.clone(),
            Arc::new(NoEvents),
            ObjectReference::default(),
        );
        assert!(m.enabled());
        let phase = m.shutting_down();
        let t0 = Instant::now();
        m.shutdown("test").await;
        assert_eq!(*phase.borrow(), Phase::Done);
        assert!(*pods.refused.lock());
        let killed = pods.killed.lock().clone();
        let grace: HashMap<&str, u64> = killed.iter().map(|(u, g, _)| (u.as_str(), g.as_secs())).collect();
        assert_eq!(grace, HashMap::from([("web", 6), ("quick", 1), ("dns", 4)]));
        let dns_at = killed.iter().find(|k| k.0 == "dns").unwrap().2 - t0;
        // web's 6 s budget runs out before the critical group starts.
        assert!(dns_at >= Duration::from_secs(6) && dns_at < Duration::from_secs(7), "{dns_at:?}");
        assert!(t0.elapsed() < Duration::from_secs(8), "critical pods took their time only: {:?}", t0.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_shutdown_right_after_start_waits_for_the_pod_sources() {
        let pods = Arc::new(Pods {
            pods: vec![pod("web", 0, 30)],
            stop_after: [("web".into(), Duration::ZERO)].into(),
            synced_after: Some((Instant::now(), Duration::from_secs(2))),
            ..Default::default()
        });
        let m = NodeShutdownManager::new(
            Duration::from_secs(30),
            Duration::from_secs(10),
            Detector { marker: None, system: false },
            pods.clone(),
            Arc::new(NoEvents),
            ObjectReference::default(),
        );
        m.shutdown("test").await;
        let killed: Vec<String> = pods.killed.lock().iter().map(|k| k.0.clone()).collect();
        assert_eq!(killed, ["web"], "the pod the sources brought late was stopped, not refused");
    }

    #[tokio::test]
    async fn a_plain_sigterm_stops_nothing() {
        let pods = Arc::new(Pods { pods: vec![pod("web", 0, 30)], ..Default::default() });
        let d = tempfile::tempdir().unwrap();
        let marker = d.path().join("node-shutdown");
        let m = NodeShutdownManager::new(
            Duration::from_secs(10),
            Duration::from_secs(4),
            Detector { marker: Some(marker.clone()), system: false },
            pods.clone(),
            Arc::new(NoEvents),
            ObjectReference::default(),
        );
        assert!(!m.on_sigterm().await);
        assert!(pods.killed.lock().is_empty());
        let off = NodeShutdownManager::new(
            Duration::ZERO,
            Duration::ZERO,
            Detector { marker: Some(marker.clone()), system: false },
            pods.clone(),
            Arc::new(NoEvents),
            ObjectReference::default(),
        );
        std::fs::write(&marker, "").unwrap();
        assert!(!off.on_sigterm().await, "shutdownGracePeriod 0: the feature is off");
        assert!(pods.killed.lock().is_empty());
    }
}
