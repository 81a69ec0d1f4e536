//! Mirror pods: for each static pod, a pod in the API server that shows it
//! (`kubernetes.io/config.mirror: <config hash>`, owned by the Node), as
//! the kubelet's mirror client keeps them:
//!
//! - created once the Node exists;
//! - deleted (grace 0, uid precondition) and created again when it
//!   mirrors another version of the static pod, or when someone deletes
//!   it (deletionTimestamp) while the static pod is still there;
//! - deleted when its static pod is gone (an orphan), but only once the
//!   file source has reported its pods (the kubelet waits for every pod
//!   source): at a restart whose first manifest scan is slow, every mirror
//!   pod would otherwise be deleted and created again with a new uid.
//!
//! The file source's snapshots come in through `PodSink`; the mirror pods
//! the API has come from the pod watch. [`reconcile`] decides, pure.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::{
    api::core::v1::Pod,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    CONFIG_MIRROR,
    pod_api::{CallError, PodApi},
    status::{is_static, static_hash},
};
use crate::pods::source::{PodSink, PodSnapshot, SourceKind};

#[derive(Clone, Debug, PartialEq)]
pub enum MirrorAction {
    Create(Box<Pod>),
    Delete { namespace: String, name: String, uid: String },
}

fn full_name(p: &Pod) -> (String, String) {
    (p.metadata.namespace.clone().unwrap_or_else(|| "default".into()), p.metadata.name.clone().unwrap_or_default())
}

/// The kubelet's mirror pod for `static_pod`.
pub fn mirror_pod(static_pod: &Pod, node_name: &str, node_uid: &str) -> Pod {
    let mut annotations = static_pod.metadata.annotations.clone().unwrap_or_default();
    annotations.insert(CONFIG_MIRROR.into(), static_hash(static_pod).unwrap_or_default().into());
    let mut spec = static_pod.spec.clone().unwrap_or_default();
    spec.node_name = Some(node_name.into());
    let (namespace, name) = full_name(static_pod);
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace),
            labels: static_pod.metadata.labels.clone(),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node_name.into(),
                uid: node_uid.into(),
                controller: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// What to do so that every static pod has exactly one current mirror
/// pod. `node_uid`: None until the Node exists (no creations before).
pub fn reconcile(static_pods: &[Pod], mirrors: &[Pod], node_name: &str, node_uid: Option<&str>) -> Vec<MirrorAction> {
    let mirrors_by_name: BTreeMap<(String, String), &Pod> = mirrors.iter().map(|m| (full_name(m), m)).collect();
    let mut actions = vec![];
    let delete = |m: &Pod| MirrorAction::Delete {
        namespace: full_name(m).0,
        name: full_name(m).1,
        uid: m.metadata.uid.clone().unwrap_or_default(),
    };
    for s in static_pods {
        let hash = static_hash(s);
        let create = node_uid.map(|uid| MirrorAction::Create(Box::new(mirror_pod(s, node_name, uid))));
        match mirrors_by_name.get(&full_name(s)) {
            None => actions.extend(create),
            Some(m) => {
                let current = m.metadata.annotations.as_ref().and_then(|a| a.get(CONFIG_MIRROR)).map(String::as_str);
                if m.metadata.deletion_timestamp.is_some() || current != hash {
                    actions.push(delete(m));
                    actions.extend(create);
                }
            }
        }
    }
    let statics: Vec<(String, String)> = static_pods.iter().map(full_name).collect();
    for m in mirrors {
        if !statics.contains(&full_name(m)) {
            actions.push(delete(m));
        }
    }
    actions
}

/// Keeps the mirror pods; takes the file source's snapshots.
pub struct MirrorPods {
    node_name: String,
    /// None until the file source's first snapshot.
    static_pods: Mutex<Option<Vec<Pod>>>,
    mirrors: Mutex<Option<Vec<Pod>>>,
    notify: Notify,
}

impl MirrorPods {
    /// `file_source`: a static pod path is configured, whose first
    /// snapshot is waited for.
    pub fn new(node_name: &str, file_source: bool) -> MirrorPods {
        MirrorPods {
            node_name: node_name.into(),
            static_pods: Mutex::new((!file_source).then(Vec::new)),
            mirrors: Mutex::new(None),
            notify: Notify::new(),
        }
    }

    /// The mirror pods the API server has for this node (from the pod
    /// watch, after each change).
    pub fn set_mirrors(&self, mirrors: Vec<Pod>) {
        *self.mirrors.lock() = Some(mirrors);
        self.notify.notify_one();
    }

    /// The API's mirror pods as last seen (None before the first list).
    pub fn mirrors(&self) -> Option<Vec<Pod>> {
        self.mirrors.lock().clone()
    }

    /// One round: decide and act. Nothing before the pod watch has listed
    /// the API's pods once (it would recreate mirror pods that exist), nor
    /// before the file source has reported (every mirror would look like an
    /// orphan).
    pub async fn sync(&self, api: &dyn PodApi, node_uid: Option<&str>) {
        let Some(mirrors) = self.mirrors.lock().clone() else {
            return;
        };
        let Some(statics) = self.static_pods.lock().clone() else {
            return;
        };
        for action in reconcile(&statics, &mirrors, &self.node_name, node_uid) {
            match action {
                MirrorAction::Create(pod) => {
                    let (ns, name) = full_name(&pod);
                    match api.create(&ns, &pod).await {
                        Ok(_) => info!(pod = name, namespace = ns, "mirror pod created"),
                        Err(CallError::AlreadyExists(_)) => debug!(pod = name, "mirror pod exists already"),
                        Err(e) => warn!(pod = name, namespace = ns, "cannot create the mirror pod: {e}"),
                    }
                }
                MirrorAction::Delete { namespace, name, uid } => match api.delete(&namespace, &name, &uid, 0).await {
                    Ok(()) | Err(CallError::NotFound) => info!(pod = name, namespace, "mirror pod deleted"),
                    Err(e) => warn!(pod = name, namespace, "cannot delete the mirror pod: {e}"),
                },
            }
        }
    }

    /// Runs until `shutdown`: after every change and every `resync`.
    pub async fn run(
        &self,
        api: Arc<dyn PodApi>,
        mut node_uid: watch::Receiver<Option<String>>,
        resync: Duration,
        shutdown: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(resync);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let uid = node_uid.borrow_and_update().clone();
            self.sync(&*api, uid.as_deref()).await;
            tokio::select! {
                _ = self.notify.notified() => {}
                _ = node_uid.changed() => {}
                _ = tick.tick() => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }
}

impl PodSink for MirrorPods {
    fn set(&self, snapshot: PodSnapshot) {
        if snapshot.source != SourceKind::File {
            return;
        }
        let statics: Vec<Pod> = snapshot.pods.into_iter().filter(is_static).collect();
        *self.static_pods.lock() = Some(statics);
        self.notify.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{api::core::v1::PodSpec, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};

    use super::*;
    use crate::kubeapi::{CONFIG_HASH, CONFIG_SEEN, CONFIG_SOURCE};

    fn static_pod(name: &str, hash: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(format!("{name}-n1")),
                namespace: Some("kube-system".into()),
                uid: Some(hash.into()),
                labels: Some([("app".to_owned(), name.to_owned())].into()),
                annotations: Some(
                    [(CONFIG_HASH, hash), (CONFIG_SOURCE, "file"), (CONFIG_SEEN, "2024-01-01T00:00:00Z")]
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(PodSpec { containers: vec![], ..Default::default() }),
            ..Default::default()
        }
    }

    fn mirror(name: &str, hash: &str, uid: &str) -> Pod {
        let mut m = mirror_pod(&static_pod(name, hash), "n1", "node-uid");
        m.metadata.uid = Some(uid.into());
        m
    }

    fn names(actions: &[MirrorAction]) -> Vec<String> {
        actions
            .iter()
            .map(|a| match a {
                MirrorAction::Create(p) => format!("create {}", p.metadata.name.as_deref().unwrap()),
                MirrorAction::Delete { name, uid, .. } => format!("delete {name} {uid}"),
            })
            .collect()
    }

    #[test]
    fn mirror_pod_shape() {
        let m = mirror_pod(&static_pod("etcd", "h1"), "n1", "node-uid");
        let a = m.metadata.annotations.as_ref().unwrap();
        assert_eq!(a[CONFIG_MIRROR], "h1");
        assert_eq!(a[CONFIG_HASH], "h1");
        assert_eq!(a[CONFIG_SOURCE], "file");
        assert!(m.metadata.uid.is_none(), "the server gives the mirror pod its own uid");
        assert_eq!(m.spec.as_ref().unwrap().node_name.as_deref(), Some("n1"));
        let owner = &m.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()), ("Node", "n1", "node-uid"));
        assert_eq!(owner.controller, Some(true));
        assert_eq!(m.metadata.labels.as_ref().unwrap()["app"], "etcd");
    }

    #[test]
    fn reconcile_table() {
        let mut deleted = mirror("etcd", "h1", "m1");
        deleted.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        type Case<'a> = (&'a str, Vec<Pod>, Vec<Pod>, Option<&'a str>, Vec<&'a str>);
        let cases: Vec<Case> = vec![
            ("nothing", vec![], vec![], Some("node-uid"), vec![]),
            ("missing mirror", vec![static_pod("etcd", "h1")], vec![], Some("node-uid"), vec!["create etcd-n1"]),
            ("no node yet: wait", vec![static_pod("etcd", "h1")], vec![], None, vec![]),
            ("up to date", vec![static_pod("etcd", "h1")], vec![mirror("etcd", "h1", "m1")], Some("node-uid"), vec![]),
            (
                "static pod changed",
                vec![static_pod("etcd", "h2")],
                vec![mirror("etcd", "h1", "m1")],
                Some("node-uid"),
                vec!["delete etcd-n1 m1", "create etcd-n1"],
            ),
            (
                "someone deleted the mirror",
                vec![static_pod("etcd", "h1")],
                vec![deleted],
                Some("node-uid"),
                vec!["delete etcd-n1 m1", "create etcd-n1"],
            ),
            ("orphan", vec![], vec![mirror("etcd", "h1", "m1")], Some("node-uid"), vec!["delete etcd-n1 m1"]),
            (
                "mixed",
                vec![static_pod("etcd", "h1"), static_pod("api", "h3")],
                vec![mirror("etcd", "h1", "m1"), mirror("old", "h9", "m9")],
                Some("node-uid"),
                vec!["create api-n1", "delete old-n1 m9"],
            ),
        ];
        for (name, statics, mirrors, uid, want) in cases {
            assert_eq!(names(&reconcile(&statics, &mirrors, "n1", uid)), want, "{name}");
        }
    }

    /// Records what the mirror manager asks of the API.
    #[derive(Default)]
    struct Calls(Mutex<Vec<String>>);

    #[async_trait::async_trait]
    impl PodApi for Calls {
        async fn get(&self, _: &str, _: &str) -> Result<Pod, CallError> {
            Err(CallError::NotFound)
        }
        async fn patch_status(&self, _: &str, _: &str, _: &serde_json::Value) -> Result<Pod, CallError> {
            Err(CallError::NotFound)
        }
        async fn create(&self, _: &str, pod: &Pod) -> Result<Pod, CallError> {
            self.0.lock().push(format!("create {}", pod.metadata.name.as_deref().unwrap_or("")));
            Ok(pod.clone())
        }
        async fn delete(&self, _: &str, name: &str, uid: &str, _: i64) -> Result<(), CallError> {
            self.0.lock().push(format!("delete {name} {uid}"));
            Ok(())
        }
    }

    /// At a restart the API's mirror pods are listed before a slow first
    /// scan of the manifests: none may be taken for an orphan (deleted and
    /// created again with a new uid) until the file source has spoken.
    #[tokio::test]
    async fn no_mirror_pod_is_an_orphan_before_the_file_source_has_reported() {
        let m = MirrorPods::new("n1", true);
        let api = Calls::default();
        m.set_mirrors(vec![mirror("etcd", "h1", "m1")]);
        m.sync(&api, Some("node-uid")).await;
        assert!(api.0.lock().is_empty(), "{:?}", api.0.lock());
        // The first scan: etcd is still there, old is gone.
        m.set(PodSnapshot { source: SourceKind::File, pods: vec![static_pod("etcd", "h1")] });
        m.sync(&api, Some("node-uid")).await;
        assert!(api.0.lock().is_empty(), "the mirror is up to date: {:?}", api.0.lock());
        m.set(PodSnapshot { source: SourceKind::File, pods: vec![] });
        m.sync(&api, Some("node-uid")).await;
        assert_eq!(*api.0.lock(), vec!["delete etcd-n1 m1"]);

        // Without a static pod path there is no file source to wait for.
        let m = MirrorPods::new("n1", false);
        let api = Calls::default();
        m.set_mirrors(vec![mirror("etcd", "h1", "m1")]);
        m.sync(&api, Some("node-uid")).await;
        assert_eq!(*api.0.lock(), vec!["delete etcd-n1 m1"]);
    }

    #[test]
    fn only_the_file_source_counts() {
        let m = MirrorPods::new("n1", true);
        m.set(PodSnapshot { source: SourceKind::Api, pods: vec![static_pod("x", "h")] });
        assert!(m.static_pods.lock().is_none());
        m.set(PodSnapshot { source: SourceKind::File, pods: vec![static_pod("x", "h")] });
        assert_eq!(m.static_pods.lock().as_ref().map(Vec::len), Some(1));
    }
}
