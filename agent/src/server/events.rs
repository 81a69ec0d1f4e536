//! /debug/events: kernel events as JSON lines, as they happen: threshold
//! crossings, OOM kills, in-kernel kills and evictions, each with its
//! kernel timestamp (CLOCK_MONOTONIC, the clock `bpf_ktime_get_ns` reads),
//! the wall-clock time it corresponds to, and the pod it concerns.
//!
//! The hub takes the eviction manager's signal events
//! ([`DebugEvents::forward`]) and evictions through [`EvictionTap`], a
//! `PodEvictor` that reports each eviction before passing it on.

use std::sync::Arc;

use serde::Serialize;
use tokio::sync::broadcast;

use crate::{
    eviction::driver::{EvictionRequest, PodEvictor},
    pods::source::PodView,
    signals::{Direction, KillOutcome, Signal, SignalEvent, Target, monotonic_ns},
};

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// One line of /debug/events.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DebugEvent {
    /// crossing, oom_kill, kernel_kill, cgroup_removed or eviction.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// When it happened, wall clock (RFC 3339, UTC).
    pub time: String,
    /// When it happened, CLOCK_MONOTONIC nanoseconds (kernel time for the
    /// eBPF source).
    pub kernel_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub received_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// "node" or "cgroup" for crossings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<&'static str>,
    /// memory (working set), processes or inodes; for evictions the
    /// eviction signal (memory.available, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direction: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// How the victim's processes were ended (evictions: kernel, agent, graceful).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub killed: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Upward crossings of a line that kills: what the kernel did with the
    /// victim plan (executed, or the check that refused it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_plan: Option<&'static str>,
}

fn signal_name(s: Signal) -> &'static str {
    match s {
        Signal::MemoryWorkingSet => "memory",
        Signal::Processes => "processes",
        Signal::Inodes => "inodes",
    }
}

/// The wall-clock time of a CLOCK_MONOTONIC instant.
pub fn wall_time(mono_ns: u64) -> String {
    let now_mono = monotonic_ns();
    let now = k8s_openapi::jiff::Timestamp::now();
    let back = now_mono.saturating_sub(mono_ns);
    let t = now.checked_sub(k8s_openapi::jiff::SignedDuration::from_nanos(back as i64)).unwrap_or(now);
    super::logs::format_timestamp(t)
}

/// The pod uid a cgroup path belongs to: `pod<uid>` (cgroupfs) or
/// `…-pod<uid with _>.slice` (systemd), at any depth below it.
pub fn pod_uid_of_cgroup(path: &str) -> Option<String> {
    path.split('/').rev().find_map(|c| {
        if let Some(uid) = c.strip_prefix("pod") {
            return (!uid.is_empty()).then(|| uid.to_owned());
        }
        let slice = c.strip_suffix(".slice")?;
        let (_, uid) = slice.rsplit_once("-pod")?;
        (!uid.is_empty()).then(|| uid.replace('_', "-"))
    })
}

/// Converts a signal event; None for the source's internal ones.
pub fn from_signal(e: &SignalEvent, resolve: &dyn Fn(&str) -> Option<PodRef>) -> Option<DebugEvent> {
    let with_cgroup =
        |d: DebugEvent, cg: Option<&String>| DebugEvent { pod: cg.and_then(|c| resolve(c)), cgroup: cg.cloned(), ..d };
    Some(match e {
        SignalEvent::Crossing {
            target,
            signal,
            direction,
            value,
            threshold,
            at_ns,
            received_ns,
            pid,
            kernel_outcome,
            ..
        } => {
            let cg = match target {
                Target::Node => None,
                Target::Cgroup(c) => Some(c),
            };
            with_cgroup(
                DebugEvent {
                    kind: "crossing",
                    time: wall_time(*at_ns),
                    kernel_ns: *at_ns,
                    received_ns: Some(*received_ns),
                    target: Some(if cg.is_some() { "cgroup" } else { "node" }),
                    signal: Some(signal_name(*signal).into()),
                    direction: Some(match direction {
                        Direction::Up => "up",
                        Direction::Down => "down",
                    }),
                    value: Some(*value),
                    threshold: Some(*threshold),
                    pid: (*pid != 0).then_some(*pid),
                    kernel_plan: (*kernel_outcome != KillOutcome::NotAttempted).then(|| kernel_outcome.name()),
                    ..Default::default()
                },
                cg,
            )
        }
        SignalEvent::OomKill { cgroup, pid, at_ns, received_ns, .. } => with_cgroup(
            DebugEvent {
                kind: "oom_kill",
                time: wall_time(*at_ns),
                kernel_ns: *at_ns,
                received_ns: Some(*received_ns),
                pid: Some(*pid),
                ..Default::default()
            },
            cgroup.as_ref(),
        ),
        SignalEvent::KernelKill { cgroup, signal, pid, signal_error, crossing_value, at_ns, received_ns, .. } => {
            with_cgroup(
                DebugEvent {
                    kind: "kernel_kill",
                    time: wall_time(*at_ns),
                    kernel_ns: *at_ns,
                    received_ns: Some(*received_ns),
                    signal: Some(signal_name(*signal).into()),
                    value: Some(*crossing_value),
                    pid: (*pid != 0).then_some(*pid),
                    killed: Some("kernel"),
                    message: (*signal_error != 0).then(|| {
                        format!(
                            "the kernel could not signal the allocating task (bpf_send_signal: errno {})",
                            -signal_error
                        )
                    }),
                    ..Default::default()
                },
                cgroup.as_ref(),
            )
        }
        SignalEvent::CgroupRemoved { cgroup, at_ns } => with_cgroup(
            DebugEvent { kind: "cgroup_removed", time: wall_time(*at_ns), kernel_ns: *at_ns, ..Default::default() },
            Some(cgroup),
        ),
        SignalEvent::ProcessExit { .. } => return None,
    })
}

/// The events hub: publishers send, each /debug/events stream subscribes.
#[derive(Clone)]
pub struct DebugEvents {
    tx: broadcast::Sender<Arc<DebugEvent>>,
    pods: Arc<dyn PodView>,
}

impl DebugEvents {
    pub fn new(pods: Arc<dyn PodView>) -> DebugEvents {
        DebugEvents { tx: broadcast::channel(4096).0, pods }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<DebugEvent>> {
        self.tx.subscribe()
    }

    pub fn publish(&self, e: DebugEvent) {
        // No subscriber is fine: nobody is watching.
        let _ = self.tx.send(Arc::new(e));
    }

    /// The pod a cgroup belongs to, from the pods this node runs.
    pub fn resolve(&self, cgroup: &str) -> Option<PodRef> {
        let uid = pod_uid_of_cgroup(cgroup)?;
        let pod = self.pods.pods().into_iter().find(|p| p.metadata.uid.as_deref() == Some(&uid));
        Some(match pod {
            Some(p) => PodRef {
                namespace: p.metadata.namespace.unwrap_or_default(),
                name: p.metadata.name.unwrap_or_default(),
                uid,
            },
            None => PodRef { namespace: String::new(), name: String::new(), uid },
        })
    }

    pub fn publish_signal(&self, e: &SignalEvent) {
        if let Some(d) = from_signal(e, &|c| self.resolve(c)) {
            self.publish(d);
        }
    }

    /// Publishes the signal events of `rx` (the eviction manager's
    /// `events()`) until it closes.
    pub fn forward(&self, mut rx: broadcast::Receiver<SignalEvent>) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                match rx.recv().await {
                    Ok(e) => me.publish_signal(&e),
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::debug!("/debug/events fell behind by {n} signal events")
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                }
            }
        })
    }
}

/// A PodEvictor that reports each eviction on /debug/events, then hands
/// it to the real evictor.
pub struct EvictionTap {
    pub inner: Arc<dyn PodEvictor>,
    pub events: DebugEvents,
}

impl PodEvictor for EvictionTap {
    fn evict(&self, r: EvictionRequest) {
        let now = monotonic_ns();
        self.events.publish(DebugEvent {
            kind: "eviction",
            time: wall_time(now),
            kernel_ns: now,
            pod: Some(PodRef { namespace: r.namespace.clone(), name: r.name.clone(), uid: r.uid.clone() }),
            signal: Some(r.signal.name().to_owned()),
            killed: Some(r.killed.as_str()),
            message: Some(r.message.clone()),
            ..Default::default()
        });
        self.inner.evict(r);
    }

    fn termination_reported(&self, uid: &str) -> bool {
        self.inner.termination_reported(uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_uids_from_cgroup_paths() {
        assert_eq!(pod_uid_of_cgroup("kubepods/besteffort/pod1234-ab"), Some("1234-ab".into()));
        assert_eq!(pod_uid_of_cgroup("root/kubepods/pod1234/abcdef0123"), Some("1234".into()));
        assert_eq!(
            pod_uid_of_cgroup(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice/cri-containerd-x.scope"
            ),
            Some("12-34".into())
        );
        assert_eq!(pod_uid_of_cgroup("kubepods/burstable"), None);
        assert_eq!(pod_uid_of_cgroup("kubepods.slice"), None);
    }

    #[test]
    fn signal_events_become_json_lines() {
        let resolve =
            |c: &str| pod_uid_of_cgroup(c).map(|uid| PodRef { namespace: "ns".into(), name: "web".into(), uid });
        let now = monotonic_ns();
        let e = SignalEvent::Crossing {
            target: Target::Cgroup("kubepods/besteffort/podu1".into()),
            signal: Signal::MemoryWorkingSet,
            direction: Direction::Up,
            value: 200,
            threshold: 100,
            at_ns: now,
            received_ns: now + 1000,
            pid: 42,
            kernel_generation: 0,
            kernel_outcome: crate::signals::KillOutcome::NotAttempted,
        };
        let d = from_signal(&e, &resolve).unwrap();
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["type"], "crossing");
        assert_eq!(v["pod"], serde_json::json!({"namespace": "ns", "name": "web", "uid": "u1"}));
        assert_eq!((v["value"].as_u64(), v["threshold"].as_u64(), v["pid"].as_u64()), (Some(200), Some(100), Some(42)));
        assert_eq!(v["kernel_ns"].as_u64(), Some(now));
        assert_eq!(v["direction"], "up");
        assert_eq!(v["target"], "cgroup");
        assert!(v["time"].as_str().unwrap().ends_with('Z'));
        let oom = SignalEvent::OomKill { cgroup: None, cgroup_id: 7, pid: 9, at_ns: now, received_ns: now };
        let v = serde_json::to_value(from_signal(&oom, &resolve).unwrap()).unwrap();
        assert_eq!(v["type"], "oom_kill");
        assert!(v.get("pod").is_none());
        assert!(from_signal(&SignalEvent::ProcessExit { pid: 1, at_ns: 0, received_ns: 0 }, &resolve).is_none());
    }
}
