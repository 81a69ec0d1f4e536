//! The pod manager as the eviction manager sees it: the pods it may rank
//! (`PodProvider`, each built once per change of the pod or its running
//! containers), the kill it asks for (`PodEvictor`), and which pods count as
//! active for garbage collection (`ActivePods`).

use std::{sync::Arc, time::Duration};

use tracing::warn;

use super::{Entry, PodManager, is_mirror};
use crate::{
    cm::{
        hierarchy::pod_requests,
        pod_cgroups::PodCgroups,
        qos::{SYSTEM_CRITICAL_PRIORITY, priority, qos_class},
    },
    events::{EventType, pod_ref},
    eviction::driver::{EvictionContainer, EvictionPod, EvictionRequest, PodEvictor, PodProvider},
    gc::ActivePods,
    pods::{status::TerminalReason, worker::Msg},
};

impl PodProvider for PodManager {
    fn eviction_pods(&self) -> Vec<Arc<EvictionPod>> {
        let mut pods = self.inner.pods.lock();
        let cgroups = &self.inner.deps.cgroups;
        let evict_static = self.inner.evict_static.load(std::sync::atomic::Ordering::Relaxed);
        let mut out = Vec::with_capacity(pods.len());
        for (id, e) in pods.iter_mut().filter(|(_, e)| e.active && !e.orphan && e.handle.is_some()) {
            if e.eviction.is_none() {
                e.eviction = eviction_pod(id, e, cgroups, evict_static).map(Arc::new);
            }
            out.extend(e.eviction.clone());
        }
        out
    }
}

fn eviction_pod(id: &str, e: &Entry, cgroups: &PodCgroups, evict_static: bool) -> Option<EvictionPod> {
    let spec = e.allocated.as_ref().or(e.pod.spec.as_ref())?;
    let pod_cgroup = cgroups.pod_cgroup(qos_class(spec), id);
    let prio = priority(&e.pod);
    let ephemeral = spec
        .containers
        .iter()
        .filter_map(|c| c.resources.as_ref()?.requests.as_ref()?.get("ephemeral-storage"))
        .filter_map(|q| q.0.parse::<crate::quantity::Quantity>().ok())
        .map(|q| q.value().max(0) as u64)
        .sum();
    Some(EvictionPod {
        uid: id.to_owned(),
        namespace: e.pod.metadata.namespace.clone().unwrap_or_default(),
        name: e.pod.metadata.name.clone().unwrap_or_default(),
        cgroup: pod_cgroup.clone(),
        priority: prio,
        // The kubelet's IsCriticalPod: static and mirror pods too, unless
        // static pods were let go (mirror pods are never ours to evict).
        critical: if evict_static {
            prio >= SYSTEM_CRITICAL_PRIORITY || is_mirror(&e.pod)
        } else {
            crate::cm::qos::is_critical(&e.pod)
        },
        termination_grace_secs: spec.termination_grace_period_seconds.unwrap_or(30).max(0) as u64,
        memory_request: pod_requests(spec).1.max(0) as u64,
        ephemeral_storage_request: ephemeral,
        containers: spec
            .containers
            .iter()
            .map(|c| EvictionContainer {
                name: c.name.clone(),
                memory_request: crate::cm::qos::container_resources(c)
                    .memory_request
                    .map_or(0, |q| q.value().max(0) as u64),
                cgroup: e.running.iter().find(|(n, _)| *n == c.name).map(|(_, cid)| format!("{pod_cgroup}/{cid}")),
            })
            .collect(),
        disk_usage: None,
        inodes_used: None,
    })
}

impl PodEvictor for PodManager {
    fn evict(&self, request: EvictionRequest) {
        let mut pods = self.inner.pods.lock();
        let Some(e) = pods.get_mut(&request.uid) else {
            warn!(uid = request.uid, "cannot evict an unknown pod");
            return;
        };
        e.active = false;
        e.evicted = true;
        // One Evicted event, with the kubelet's annotations (the starved
        // resource, the offending containers and their usage).
        self.inner.deps.recorder.record_annotated(
            &pod_ref(&e.pod),
            EventType::Warning,
            "Evicted",
            &request.message,
            &request.annotations,
        );
        if let Some(h) = &e.handle {
            let _ = h.tx.send(Msg::Evict {
                grace: Duration::from_secs(request.grace_period_secs),
                reason: TerminalReason { reason: "Evicted".into(), message: request.message, disruption: true },
            });
        }
    }

    fn termination_reported(&self, uid: &str) -> bool {
        self.inner.pods.lock().get(uid).is_none_or(|e| {
            e.status.as_ref().and_then(|s| s.phase.as_deref()).is_some_and(|p| p == "Failed" || p == "Succeeded")
        })
    }
}

impl ActivePods for PodManager {
    fn all_sources_ready(&self) -> bool {
        self.inner.sources_ready()
    }

    /// Known and kept: running, or finished but not deleted (its last
    /// containers hold its logs and exit status).
    fn is_active(&self, uid: &str) -> bool {
        self.inner
            .pods
            .lock()
            .get(uid)
            .is_some_and(|e| !e.orphan && !e.evicted && (e.pod.metadata.deletion_timestamp.is_none() || e.active))
    }

    fn is_terminated(&self, uid: &str) -> bool {
        self.inner.pods.lock().get(uid).is_none_or(|e| !e.active)
    }
}
