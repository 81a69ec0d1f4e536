//! Reconciling the pods this node should run with what runs: the sources'
//! snapshots merged, new pods admitted and given a worker, changed specs
//! handed to their workers, pods gone from every source removed; and the
//! relist (the kubelet's generic PLEG) that wakes the workers whose pods
//! changed in the runtime and stops what runs there without a pod.

use std::{
    collections::{BTreeMap, HashMap},
    time::Instant,
};

use k8s_openapi::{
    api::core::v1::{Pod, PodStatus},
    jiff::Timestamp,
};
use tracing::{info, warn};

use super::{Entry, Inner, TOMBSTONE_TTL, same_spec, uid};
use crate::{
    cm::{hierarchy::burstable_cpu_request, qos::qos_class},
    cri::{api, labels},
    events::{EventType, pod_ref},
    pods::{
        admission, defaults,
        manifest::CONFIG_SEEN,
        worker::{Msg, Worker},
    },
};

impl Inner {
    /// One pass over the merged sources: admits new pods, updates and
    /// stops workers, removes the pods gone from every source.
    pub(super) fn reconcile(&self) {
        let mut desired: BTreeMap<String, Pod> = BTreeMap::new();
        for pods in self.sources.lock().values() {
            for p in pods {
                let mut p = p.clone();
                defaults::apply(&mut p);
                desired.entry(uid(&p)).or_insert(p);
            }
        }
        let mut pods = self.pods.lock();
        // Pods of this round not admitted yet keep their devices while
        // earlier ones are admitted (an agent restart re-admits them all).
        let mut pending: std::collections::BTreeSet<String> =
            desired.keys().filter(|id| !pods.contains_key(*id)).cloned().collect();
        let sources_ready = self.sources_ready();
        for (id, pod) in &desired {
            if let Some(e) = pods.get_mut(id) {
                if e.orphan {
                    continue;
                }
                if !same_spec(&e.pod, pod) {
                    e.pod = pod.clone();
                    e.burstable_cpu_milli = e.pod.spec.as_ref().map_or(0, burstable_cpu_request);
                    e.eviction = None;
                    if let Some(h) = &e.handle {
                        let _ = h.tx.send(Msg::Update(Box::new(pod.clone())));
                    }
                }
                continue;
            }
            let seen = Instant::now();
            let mut pod = pod.clone();
            pod.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .entry(CONFIG_SEEN.into())
                .or_insert_with(|| Timestamp::now().to_string());
            let active: Vec<&Pod> = pods.values().filter(|e| e.active && !e.orphan).map(|e| &e.pod).collect();
            pending.remove(id);
            let pressure = self.pressure.lock().as_ref().map(|c| c.borrow().clone()).unwrap_or_default();
            // Admitted beside what the other pods were allocated: a resize
            // not admitted (Deferred, Infeasible) holds nothing.
            let alloc = &self.deps.allocations;
            let allocated: Vec<std::borrow::Cow<'_, Pod>> = active.iter().map(|p| alloc.as_allocated(p)).collect();
            let allocated: Vec<&Pod> = allocated.iter().map(|p| p.as_ref()).collect();
            let admitted_as = alloc.as_allocated(&pod);
            let verdict = match self.refuse_new.lock().clone() {
                Some(r) => Err(r),
                None => admission::admit_host(&pod, &self.host.read())
                    .and_then(|()| admission::admit_under_pressure(&pod, &pressure))
                    .and_then(|()| admission::admit(&admitted_as, &allocated, &self.capacity.lock())),
            };
            // The device manager's admit handler: devices for every
            // container, or UnexpectedAdmissionError. Devices of pods no
            // longer active are freed first, once every source has spoken.
            let verdict = match (verdict, &self.deps.devices) {
                (Ok(()), Some(devices)) => {
                    let keep = sources_ready.then(|| {
                        let mut keep: std::collections::BTreeSet<String> =
                            active.iter().filter_map(|p| p.metadata.uid.clone()).collect();
                        keep.extend(pending.iter().cloned());
                        keep
                    });
                    devices.admit(&pod, keep.as_ref()).map_err(|e| admission::Rejection {
                        reason: admission::UNEXPECTED_ADMISSION_ERROR.into(),
                        message: format!("Allocate failed due to {e}, which is unexpected"),
                    })
                }
                (verdict, _) => verdict,
            };
            match verdict {
                Ok(()) => {
                    info!(
                        pod = format!(
                            "{}/{}",
                            pod.metadata.namespace.as_deref().unwrap_or(""),
                            pod.metadata.name.as_deref().unwrap_or("")
                        ),
                        uid = id,
                        "pod added"
                    );
                    let handle = Worker::spawn(self.deps.clone(), self.sink(), pod.clone(), self.shutdown.clone());
                    self.metrics.pod_worker_start_duration.observe(seen.elapsed().as_secs_f64());
                    pods.insert(id.clone(), Entry::new(pod, Some(handle)));
                }
                Err(r) => {
                    warn!(
                        pod = pod.metadata.name.as_deref().unwrap_or(""),
                        "pod rejected: {}: {}", r.reason, r.message
                    );
                    self.deps.recorder.record(&pod_ref(&pod), EventType::Warning, &r.reason, &r.message);
                    let status = rejected_status(&pod, &r);
                    self.reporter().report(&pod, &status);
                    let mut e = Entry::new(pod, None);
                    e.active = false;
                    e.status = Some(status);
                    pods.insert(id.clone(), e);
                }
            }
        }
        let gone: Vec<String> =
            pods.iter().filter(|(id, e)| !e.orphan && !desired.contains_key(*id)).map(|(id, _)| id.clone()).collect();
        for id in gone {
            let e = pods.get_mut(&id).expect("listed above");
            e.active = false;
            match &e.handle {
                Some(h) => {
                    let _ = h.tx.send(Msg::Remove);
                }
                None => {
                    pods.remove(&id);
                }
            }
        }
        self.metrics.pod_workers.set(pods.values().filter(|e| e.handle.is_some()).count() as i64);
    }

    /// Lists the runtime's sandboxes and containers, wakes the workers
    /// whose pods changed since `previous`, and stops orphans.
    pub(super) async fn relist(&self, previous: &mut HashMap<String, Vec<(String, i32)>>) -> crate::cri::Result<()> {
        let rt = &self.deps.runtime;
        let sel = labels::managed_selector();
        let (sandboxes, containers) = rt
            .list_states(
                Some(api::PodSandboxFilter { label_selector: sel.clone(), ..Default::default() }),
                Some(api::ContainerFilter { label_selector: sel, ..Default::default() }),
            )
            .await?;
        let ready = self.sources_ready();
        let mut tombstones = self.tombstones.lock();
        tombstones.retain(|_, at| at.elapsed() < TOMBSTONE_TTL);
        let mut pods = self.pods.lock();
        // What runs, per pod, moved out of the listing: the relist runs
        // every second and copies nothing of the common case.
        let mut now: HashMap<String, Vec<(String, i32)>> = HashMap::with_capacity(previous.len());
        let mut orphans: Vec<labels::PodIdentity> = vec![];
        for item in sandboxes.into_iter().chain(containers) {
            let Some(pod) = item.pod else { continue };
            if ready
                && !pods.contains_key(&pod.uid)
                && !tombstones.contains_key(&pod.uid)
                && !orphans.iter().any(|o| o.uid == pod.uid)
            {
                orphans.push(pod.clone());
            }
            now.entry(pod.uid).or_default().push((item.id, item.state));
        }
        for (uid, fp) in now.iter_mut() {
            fp.sort();
            if previous.get(uid) != Some(fp)
                && let Some(h) = pods.get(uid).and_then(|e| e.handle.as_ref())
            {
                h.wake.notify_one();
            }
        }
        for id in orphans {
            info!(
                pod = format!("{}/{}", id.namespace, id.name),
                uid = id.uid,
                "stopping what runs for a pod no source wants"
            );
            let uid = id.uid.clone();
            let mut pod = Pod::default();
            pod.metadata.uid = Some(id.uid);
            pod.metadata.name = Some(id.name);
            pod.metadata.namespace = Some(id.namespace);
            let handle = Worker::spawn(self.deps.clone(), self.sink(), pod.clone(), self.shutdown.clone());
            let _ = handle.tx.send(Msg::Remove);
            let mut e = Entry::new(pod, Some(handle));
            e.orphan = true;
            e.active = false;
            pods.insert(uid, e);
        }
        *previous = now;
        Ok(())
    }
}

/// The status of a pod admission refused: Failed, with the admit
/// handler's reason and message, as the kubelet reports it.
fn rejected_status(pod: &Pod, r: &admission::Rejection) -> PodStatus {
    PodStatus {
        phase: Some("Failed".into()),
        reason: Some(r.reason.clone()),
        message: Some(r.message.clone()),
        qos_class: pod.spec.as_ref().map(|s| qos_class(s).as_str().to_owned()),
        start_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now())),
        ..Default::default()
    }
}
