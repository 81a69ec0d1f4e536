//! The status manager: takes every pod status the kubelet computes
//! (`StatusReporter::report`) and writes it to the API server as the
//! kubelet's status manager does:
//!
//! - the status is merged with the API's: conditions the kubelet does not
//!   own (readiness gates, DisruptionTarget, ...), nominatedNodeName and
//!   resource claim statuses are kept; a terminal phase in the API is never
//!   turned back;
//! - only changes are sent, as a two-way strategic merge patch of
//!   pods/<name>/status with the pod's uid as precondition;
//! - a conflict re-reads the pod and retries at once; other failures are
//!   retried by the periodic resync (every 10 s), so an API outage loses
//!   nothing: the latest status goes out when the server is back;
//! - static pods' statuses go to their mirror pod (when it exists and
//!   mirrors this version of the static pod);
//! - `terminated` for a pod the API is deleting (deletionTimestamp) deletes
//!   it with grace period 0, once its final status is written.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    CONFIG_HASH, CONFIG_MIRROR, CONFIG_SOURCE,
    pod_api::{CallError, PodApi},
    smp,
};
use crate::pods::source::StatusReporter;

/// The kubelet's resync period for statuses not yet written.
pub const RESYNC: Duration = Duration::from_secs(10);
/// Conflicts retried at once before leaving it to the resync.
const CONFLICT_RETRIES: usize = 3;

/// The condition types the kubelet owns (kubetypes.PodConditionsByKubelet).
const KUBELET_CONDITIONS: &[&str] =
    &["PodScheduled", "Ready", "Initialized", "ContainersReady", "PodReadyToStartContainers"];

fn terminal(phase: Option<&str>) -> bool {
    matches!(phase, Some("Succeeded") | Some("Failed"))
}

/// The status to write, from the API's and the kubelet's (mergePodStatus).
pub fn merge_status(api: &PodStatus, kubelet: &PodStatus) -> PodStatus {
    let mut merged = kubelet.clone();
    let mut conditions: Vec<PodCondition> =
        api.conditions.iter().flatten().filter(|c| !KUBELET_CONDITIONS.contains(&c.type_.as_str())).cloned().collect();
    for c in kubelet.conditions.iter().flatten() {
        match conditions.iter_mut().find(|x| x.type_ == c.type_) {
            // DisruptionTarget and the like: the kubelet's version wins.
            Some(x) => *x = c.clone(),
            None => conditions.push(c.clone()),
        }
    }
    merged.conditions = (!conditions.is_empty()).then_some(conditions);
    merged.nominated_node_name = api.nominated_node_name.clone();
    merged.resource_claim_statuses = api.resource_claim_statuses.clone();
    merged.extended_resource_claim_status = api.extended_resource_claim_status.clone();
    if merged.qos_class.is_none() {
        merged.qos_class = api.qos_class.clone();
    }
    // A pod the API already has as terminal stays terminal.
    if terminal(api.phase.as_deref()) && !terminal(merged.phase.as_deref()) {
        merged.phase = api.phase.clone();
        merged.reason = api.reason.clone();
        merged.message = api.message.clone();
    }
    merged
}

/// Compares statuses as the kubelet's isPodStatusByKubeletEqual: order of
/// conditions and container statuses does not matter.
fn normalized(s: &PodStatus) -> Value {
    let mut s = s.clone();
    if let Some(c) = s.conditions.as_mut() {
        c.sort_by(|a, b| a.type_.cmp(&b.type_));
    }
    for list in [&mut s.container_statuses, &mut s.init_container_statuses, &mut s.ephemeral_container_statuses] {
        if let Some(l) = list.as_mut() {
            l.sort_by(|a, b| a.name.cmp(&b.name));
        }
    }
    serde_json::to_value(&s).unwrap_or_default()
}

/// The patch for pods/<name>/status, or None when the API has it already.
pub fn status_patch(uid: &str, api: &PodStatus, merged: &PodStatus) -> Option<Value> {
    if normalized(api) == normalized(merged) {
        return None;
    }
    let old = serde_json::to_value(api).unwrap_or_default();
    let new = serde_json::to_value(merged).unwrap_or_default();
    let diff = smp::diff(&old, &new)?;
    Some(json!({"metadata": {"uid": uid}, "status": diff}))
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str)
}

/// A static pod (from the manifest directory): its status lives on its
/// mirror pod.
pub fn is_static(pod: &Pod) -> bool {
    matches!(annotation(pod, CONFIG_SOURCE), Some("file") | Some("http"))
}

/// The hash that identifies a static pod's version (its mirror pod carries
/// it as kubernetes.io/config.mirror).
pub fn static_hash(pod: &Pod) -> Option<&str> {
    annotation(pod, CONFIG_HASH).or(pod.metadata.uid.as_deref())
}

#[derive(Clone, Debug)]
struct Entry {
    pod: Pod,
    status: Option<PodStatus>,
    version: u64,
    synced: u64,
    terminated: bool,
    /// When it last changed, in the manager's order of changes: a pass
    /// writes the oldest first, so pods ended one after the other (an
    /// eviction's victims) reach the API in that order.
    changed: u64,
}

/// What one sync did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncResult {
    /// Written, or the API had it already.
    Synced,
    /// Gone from the API (or replaced by a pod with another uid): forget it.
    Gone,
    /// Deleted with grace 0 after its termination.
    Deleted,
    /// Try again at the next resync.
    Retry(String),
}

pub struct StatusManager {
    entries: Mutex<HashMap<String, Entry>>,
    /// The last `Entry::changed` given out.
    changes: AtomicU64,
    notify: Notify,
}

impl Default for StatusManager {
    fn default() -> Self {
        StatusManager { entries: Mutex::new(HashMap::new()), changes: AtomicU64::new(0), notify: Notify::new() }
    }
}

fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_else(|| {
        format!("{}/{}", pod.metadata.namespace.as_deref().unwrap_or(""), pod.metadata.name.as_deref().unwrap_or(""))
    })
}

impl StatusManager {
    /// Pods whose latest status is not written yet (or whose deletion is due).
    pub fn pending(&self) -> usize {
        self.entries.lock().values().filter(|e| e.synced < e.version || e.terminated).count()
    }

    /// Stops tracking a pod the kubelet no longer has.
    pub fn forget(&self, uid: &str) {
        self.entries.lock().remove(uid);
    }

    /// Syncs every pod that needs it once.
    pub async fn sync_all(&self, api: &dyn PodApi) {
        let mut due: Vec<(String, Entry)> = self
            .entries
            .lock()
            .iter()
            .filter(|(_, e)| e.synced < e.version || e.terminated)
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect();
        due.sort_by_key(|(_, e)| e.changed);
        for (uid, entry) in due {
            let result = sync_pod(api, &entry).await;
            let mut entries = self.entries.lock();
            match &result {
                SyncResult::Synced => {
                    if let Some(e) = entries.get_mut(&uid) {
                        e.synced = e.synced.max(entry.version);
                        // A static pod that ended has nothing left to do.
                        if e.terminated && is_static(&e.pod) && e.synced >= e.version {
                            entries.remove(&uid);
                        }
                    }
                }
                SyncResult::Gone | SyncResult::Deleted => {
                    // Unless a newer report came in meanwhile.
                    if entries.get(&uid).is_some_and(|e| e.version == entry.version) {
                        entries.remove(&uid);
                    }
                }
                SyncResult::Retry(why) => debug!(pod = uid, "status not written yet: {why}"),
            }
        }
    }

    /// Runs until `shutdown`: syncs at every report and every `resync`.
    pub async fn run(&self, api: Arc<dyn PodApi>, resync: Duration, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(resync);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.sync_all(&*api).await;
            tokio::select! {
                _ = self.notify.notified() => {}
                _ = tick.tick() => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }
}

impl StatusReporter for StatusManager {
    fn report(&self, pod: &Pod, status: &PodStatus) {
        self.update(pod, |e| {
            e.pod = pod.clone();
            e.status = Some(status.clone());
            e.version += 1;
        });
    }

    fn terminated(&self, pod: &Pod) {
        self.update(pod, |e| e.terminated = true);
    }
}

impl StatusManager {
    /// Changes the pod's entry (made on first sight) and wakes the syncer.
    fn update(&self, pod: &Pod, change: impl FnOnce(&mut Entry)) {
        let mut entries = self.entries.lock();
        let e = entries.entry(uid_of(pod)).or_insert_with(|| Entry {
            pod: pod.clone(),
            status: None,
            version: 0,
            synced: 0,
            terminated: false,
            changed: 0,
        });
        change(e);
        e.changed = self.changes.fetch_add(1, Ordering::Relaxed) + 1;
        drop(entries);
        self.notify.notify_one();
    }
}

/// Writes one pod's status (and deletes it when its termination is done).
async fn sync_pod(api: &dyn PodApi, entry: &Entry) -> SyncResult {
    let ns = entry.pod.metadata.namespace.as_deref().unwrap_or("default");
    let Some(name) = entry.pod.metadata.name.as_deref() else {
        return SyncResult::Gone;
    };
    let is_static = is_static(&entry.pod);
    for _ in 0..=CONFLICT_RETRIES {
        let current = match api.get(ns, name).await {
            Ok(p) => p,
            Err(CallError::NotFound) if is_static => return SyncResult::Retry("no mirror pod yet".into()),
            Err(CallError::NotFound) => return SyncResult::Gone,
            Err(e) => return SyncResult::Retry(e.to_string()),
        };
        let api_uid = current.metadata.uid.clone().unwrap_or_default();
        if is_static {
            if annotation(&current, CONFIG_MIRROR) != static_hash(&entry.pod) {
                return SyncResult::Retry("the mirror pod does not mirror this static pod (yet)".into());
            }
        } else if entry.pod.metadata.uid.as_deref().is_some_and(|u| u != api_uid) {
            // Deleted and recreated under the same name: not ours any more.
            return SyncResult::Gone;
        }
        if let Some(status) = &entry.status {
            let api_status = current.status.clone().unwrap_or_default();
            let merged = merge_status(&api_status, status);
            if let Some(patch) = status_patch(&api_uid, &api_status, &merged) {
                match api.patch_status(ns, name, &patch).await {
                    Ok(_) => debug!(pod = name, "status written"),
                    Err(CallError::Conflict(why)) => {
                        debug!(pod = name, "status conflict, retrying: {why}");
                        continue;
                    }
                    Err(CallError::NotFound) if !is_static => return SyncResult::Gone,
                    Err(e) => return SyncResult::Retry(e.to_string()),
                }
            }
        }
        if entry.terminated && !is_static && current.metadata.deletion_timestamp.is_some() {
            return match api.delete(ns, name, &api_uid, 0).await {
                Ok(()) => {
                    info!(pod = name, namespace = ns, "pod terminated; deleted from the API server");
                    SyncResult::Deleted
                }
                Err(CallError::NotFound) => SyncResult::Deleted,
                Err(CallError::Conflict(_)) => SyncResult::Gone,
                Err(e) => SyncResult::Retry(e.to_string()),
            };
        }
        return SyncResult::Synced;
    }
    warn!(pod = name, "status still conflicting after {CONFLICT_RETRIES} retries; next resync");
    SyncResult::Retry("conflicts".into())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use async_trait::async_trait;
    use k8s_openapi::{
        api::core::v1::{ContainerState, ContainerStateRunning, ContainerStatus},
        apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
        jiff::Timestamp,
    };

    use super::*;

    fn cond(t: &str, s: &str) -> PodCondition {
        PodCondition { type_: t.into(), status: s.into(), ..Default::default() }
    }

    fn running(name: &str, ready: bool) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            ready,
            image: "busybox".into(),
            image_id: "sha256:1".into(),
            state: Some(ContainerState { running: Some(ContainerStateRunning::default()), ..Default::default() }),
            ..Default::default()
        }
    }

    fn status(phase: &str, conditions: Vec<PodCondition>, containers: Vec<ContainerStatus>) -> PodStatus {
        PodStatus {
            phase: Some(phase.into()),
            conditions: Some(conditions),
            container_statuses: Some(containers),
            ..Default::default()
        }
    }

    #[test]
    fn merge_table() {
        type Case = (&'static str, PodStatus, PodStatus, fn(&PodStatus));
        let cases: Vec<Case> = vec![
            (
                "foreign conditions are kept, kubelet's replaced",
                status(
                    "Pending",
                    vec![cond("PodScheduled", "True"), cond("example.com/gate", "True"), cond("Ready", "False")],
                    vec![],
                ),
                status("Running", vec![cond("Ready", "True"), cond("PodScheduled", "True")], vec![running("c", true)]),
                |m| {
                    let types: Vec<(&str, &str)> =
                        m.conditions.as_ref().unwrap().iter().map(|c| (c.type_.as_str(), c.status.as_str())).collect();
                    assert_eq!(types, vec![("example.com/gate", "True"), ("Ready", "True"), ("PodScheduled", "True")]);
                    assert_eq!(m.phase.as_deref(), Some("Running"));
                },
            ),
            (
                "terminal stays terminal",
                PodStatus { phase: Some("Failed".into()), reason: Some("Evicted".into()), ..Default::default() },
                status("Running", vec![], vec![]),
                |m| {
                    assert_eq!(m.phase.as_deref(), Some("Failed"));
                    assert_eq!(m.reason.as_deref(), Some("Evicted"));
                },
            ),
            (
                "scheduler and claim fields are not the kubelet's",
                PodStatus {
                    nominated_node_name: Some("n2".into()),
                    qos_class: Some("BestEffort".into()),
                    ..Default::default()
                },
                status("Running", vec![], vec![]),
                |m| {
                    assert_eq!(m.nominated_node_name.as_deref(), Some("n2"));
                    assert_eq!(m.qos_class.as_deref(), Some("BestEffort"));
                },
            ),
        ];
        for (name, api, kubelet, check) in cases {
            println!("case: {name}");
            check(&merge_status(&api, &kubelet));
        }
    }

    #[test]
    fn patches_only_changes() {
        let api = status(
            "Running",
            vec![cond("Ready", "True"), cond("ContainersReady", "True")],
            vec![running("a", true), running("b", true)],
        );
        // Same content, other order: nothing to send.
        let same = status(
            "Running",
            vec![cond("ContainersReady", "True"), cond("Ready", "True")],
            vec![running("b", true), running("a", true)],
        );
        assert_eq!(status_patch("u1", &api, &merge_status(&api, &same)), None);
        // Ready flips: a patch with the uid precondition and the condition by type.
        let flip = status(
            "Running",
            vec![cond("Ready", "False"), cond("ContainersReady", "True")],
            vec![running("a", false), running("b", true)],
        );
        let p = status_patch("u1", &api, &merge_status(&api, &flip)).unwrap();
        assert_eq!(p["metadata"]["uid"], "u1");
        assert_eq!(p["status"]["conditions"], json!([{"type": "Ready", "status": "False"}]));
        assert_eq!(p["status"]["$setElementOrder/conditions"], json!([{"type": "Ready"}, {"type": "ContainersReady"}]));
        assert_eq!(p["status"]["containerStatuses"][0]["ready"], false, "container statuses are sent whole");
        assert!(p["status"].get("phase").is_none());
    }

    /// An in-memory API: pods by name, with injected conflicts and outages.
    #[derive(Default)]
    struct FakeApi {
        pods: Mutex<BTreeMap<String, Pod>>,
        conflicts: Mutex<usize>,
        down: Mutex<bool>,
        patches: Mutex<Vec<Value>>,
        deletes: Mutex<Vec<(String, String, i64)>>,
    }

    #[async_trait]
    impl PodApi for FakeApi {
        async fn get(&self, _ns: &str, name: &str) -> Result<Pod, CallError> {
            if *self.down.lock() {
                return Err(CallError::Other("connection refused".into()));
            }
            self.pods.lock().get(name).cloned().ok_or(CallError::NotFound)
        }

        async fn patch_status(&self, _ns: &str, name: &str, patch: &Value) -> Result<Pod, CallError> {
            {
                let mut c = self.conflicts.lock();
                if *c > 0 {
                    *c -= 1;
                    return Err(CallError::Conflict("the object has been modified".into()));
                }
            }
            self.patches.lock().push(patch.clone());
            let mut pods = self.pods.lock();
            let pod = pods.get_mut(name).ok_or(CallError::NotFound)?;
            // Good enough for these tests: take the whole status the patch names.
            let mut st = serde_json::to_value(pod.status.clone().unwrap_or_default()).unwrap();
            for (k, v) in patch["status"].as_object().unwrap() {
                if !k.starts_with('$') {
                    st[k] = v.clone();
                }
            }
            st.as_object_mut().unwrap().retain(|_, v| !v.is_null());
            if let Some(cs) = st.get_mut("conditions").and_then(Value::as_array_mut) {
                cs.retain(|c| c.get("$patch").is_none());
            }
            pod.status = serde_json::from_value(st).ok();
            Ok(pod.clone())
        }

        async fn create(&self, _ns: &str, pod: &Pod) -> Result<Pod, CallError> {
            Ok(pod.clone())
        }

        async fn delete(&self, ns: &str, name: &str, uid: &str, grace: i64) -> Result<(), CallError> {
            let mut pods = self.pods.lock();
            if pods.get(name).and_then(|p| p.metadata.uid.as_deref()) != Some(uid) {
                return Err(CallError::Conflict("uid precondition".into()));
            }
            pods.remove(name);
            self.deletes.lock().push((ns.into(), name.into(), grace));
            Ok(())
        }
    }

    fn api_pod(name: &str, uid: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            status: Some(PodStatus { phase: Some("Pending".into()), ..Default::default() }),
            ..Default::default()
        }
    }

    fn running_status() -> PodStatus {
        status("Running", vec![cond("Ready", "True")], vec![running("c", true)])
    }

    #[tokio::test]
    async fn writes_once_and_retries_conflicts() {
        let api = FakeApi::default();
        api.pods.lock().insert("web".into(), api_pod("web", "u1"));
        *api.conflicts.lock() = 2;
        let sm = StatusManager::default();
        let pod = api_pod("web", "u1");
        sm.report(&pod, &running_status());
        sm.sync_all(&api).await;
        assert_eq!(sm.pending(), 0);
        assert_eq!(api.patches.lock().len(), 1, "two conflicts retried, one write");
        assert_eq!(api.pods.lock()["web"].status.as_ref().unwrap().phase.as_deref(), Some("Running"));
        // The same status again: nothing sent.
        sm.report(&pod, &running_status());
        sm.sync_all(&api).await;
        assert_eq!(api.patches.lock().len(), 1);
    }

    #[tokio::test]
    async fn an_outage_keeps_the_latest_status_for_later() {
        let api = FakeApi::default();
        api.pods.lock().insert("web".into(), api_pod("web", "u1"));
        *api.down.lock() = true;
        let sm = StatusManager::default();
        let pod = api_pod("web", "u1");
        sm.report(&pod, &status("Pending", vec![], vec![]));
        sm.report(&pod, &running_status());
        sm.sync_all(&api).await;
        assert_eq!(sm.pending(), 1);
        *api.down.lock() = false;
        sm.sync_all(&api).await;
        assert_eq!(sm.pending(), 0);
        let patches = api.patches.lock();
        assert_eq!(patches.len(), 1, "only the latest status is written");
        assert_eq!(patches[0]["status"]["phase"], "Running");
    }

    #[tokio::test]
    async fn a_pass_writes_in_the_order_of_the_reports() {
        let api = FakeApi::default();
        let names: Vec<String> = (0..16).map(|i| format!("pod-{i:02}")).collect();
        for (i, n) in names.iter().enumerate() {
            api.pods.lock().insert(n.clone(), api_pod(n, &format!("u{i}")));
        }
        let sm = StatusManager::default();
        // Reported newest name first, so that neither the names nor a hash
        // of the uids give the order by chance.
        for (i, n) in names.iter().enumerate().rev() {
            sm.report(&api_pod(n, &format!("u{i}")), &status("Failed", vec![], vec![]));
        }
        sm.sync_all(&api).await;
        let written: Vec<String> =
            api.patches.lock().iter().map(|p| p["metadata"]["uid"].as_str().unwrap().into()).collect();
        let want: Vec<String> = (0..16).rev().map(|i| format!("u{i}")).collect();
        assert_eq!(written, want);
    }

    #[tokio::test]
    async fn recreated_pods_are_not_ours() {
        let api = FakeApi::default();
        api.pods.lock().insert("web".into(), api_pod("web", "other-uid"));
        let sm = StatusManager::default();
        sm.report(&api_pod("web", "u1"), &running_status());
        sm.sync_all(&api).await;
        assert_eq!(sm.pending(), 0);
        assert!(api.patches.lock().is_empty());
    }

    #[tokio::test]
    async fn terminated_deleting_pods_are_deleted_with_grace_zero() {
        let api = FakeApi::default();
        let mut deleting = api_pod("web", "u1");
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        deleting.metadata.deletion_grace_period_seconds = Some(30);
        api.pods.lock().insert("web".into(), deleting.clone());
        let sm = StatusManager::default();
        let done = status("Running", vec![cond("Ready", "False")], vec![]);
        sm.report(&deleting, &done);
        sm.terminated(&deleting);
        sm.sync_all(&api).await;
        assert_eq!(api.patches.lock().len(), 1, "the final status is written first");
        assert_eq!(*api.deletes.lock(), vec![("default".into(), "web".into(), 0)]);
        assert_eq!(sm.pending(), 0);
        // A terminated pod the API is not deleting (restartPolicy Never) stays.
        api.pods.lock().insert("job".into(), api_pod("job", "u2"));
        sm.report(&api_pod("job", "u2"), &status("Succeeded", vec![], vec![]));
        sm.terminated(&api_pod("job", "u2"));
        sm.sync_all(&api).await;
        assert!(api.pods.lock().contains_key("job"));
    }

    #[tokio::test]
    async fn static_pods_write_to_their_mirror() {
        let api = FakeApi::default();
        let annotations =
            |pairs: &[(&str, &str)]| Some(pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
        let mut static_pod = api_pod("etcd-n1", "hash1");
        static_pod.metadata.annotations = annotations(&[(CONFIG_SOURCE, "file"), (CONFIG_HASH, "hash1")]);
        let sm = StatusManager::default();
        sm.report(&static_pod, &running_status());
        sm.sync_all(&api).await;
        assert_eq!(sm.pending(), 1, "no mirror pod yet: kept");
        let mut mirror = api_pod("etcd-n1", "mirror-uid");
        mirror.metadata.annotations = annotations(&[(CONFIG_MIRROR, "hash1")]);
        api.pods.lock().insert("etcd-n1".into(), mirror);
        sm.sync_all(&api).await;
        assert_eq!(sm.pending(), 0);
        let patches = api.patches.lock();
        assert_eq!(patches[0]["metadata"]["uid"], "mirror-uid");
    }
}
