//! What the kubelet publishes about this node's CSI drivers (its
//! nodeinfomanager): the `CSINode` object named after the node (owned by
//! the Node, one `spec.drivers[]` entry per driver: node ID, topology keys,
//! volume limit), the Node's `csi.volume.kubernetes.io/nodeid` annotation
//! (a JSON object driver → node ID) and the Node's topology labels.
//!
//! The logic is written once over [`NodeObjects`] (get, merge-patch the
//! Node's metadata, get/create/replace the CSINode); [`KubeNodeObjects`]
//! implements it with kube-rs, and an in-memory twin the tests. Each update
//! reads the object, changes it and writes it back guarded by its
//! resourceVersion, retried a few times on a conflict (the kubelet's
//! updateBackoff).

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use async_trait::async_trait;
use k8s_openapi::{
    api::{
        core::v1::Node,
        storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources},
    },
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use thiserror::Error;
use tokio_util::sync::CancellationToken;

use crate::flowcontrol::{Backoff, BackoffPolicy};

#[cfg(test)]
pub(crate) mod memory;

/// The Node annotation mapping driver names to their node IDs.
pub const ANNOTATION_NODE_ID: &str = "csi.volume.kubernetes.io/nodeid";

#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ObjectError {
    #[error("{0} not found")]
    NotFound(String),
    /// A write lost against another (409: a stale resourceVersion, or an
    /// object created meanwhile).
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("{0}")]
    Failed(String),
}

/// Changes to the Node's metadata, sent as a merge patch guarded by the
/// resourceVersion they were computed from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeMetaPatch {
    pub resource_version: Option<String>,
    /// Labels to set.
    pub labels: BTreeMap<String, String>,
    /// Annotations to set, or (None) to remove.
    pub annotations: BTreeMap<String, Option<String>>,
}

/// The API calls the publisher makes.
#[async_trait]
pub trait NodeObjects: Send + Sync {
    async fn get_node(&self, name: &str) -> Result<Node, ObjectError>;
    async fn patch_node(&self, name: &str, patch: &NodeMetaPatch) -> Result<(), ObjectError>;
    async fn get_csinode(&self, name: &str) -> Result<Option<CSINode>, ObjectError>;
    async fn create_csinode(&self, csinode: &CSINode) -> Result<CSINode, ObjectError>;
    /// An update guarded by `csinode`'s resourceVersion.
    async fn replace_csinode(&self, csinode: &CSINode) -> Result<CSINode, ObjectError>;
}

/// [`NodeObjects`] over the API server.
pub struct KubeNodeObjects {
    client: kube::Client,
}

impl KubeNodeObjects {
    pub fn new(client: kube::Client) -> KubeNodeObjects {
        KubeNodeObjects { client }
    }
}

fn map_err(kind: &str, name: &str, e: kube::Error) -> ObjectError {
    match e {
        kube::Error::Api(s) if s.code == 404 => ObjectError::NotFound(format!("{kind} {name:?}")),
        kube::Error::Api(s) if s.code == 409 => ObjectError::Conflict(format!("{kind} {name:?}: {}", s.message)),
        kube::Error::Api(s) => ObjectError::Failed(format!("{kind} {name:?}: {} ({})", s.message, s.code)),
        other => ObjectError::Failed(format!("{kind} {name:?}: {other}")),
    }
}

#[async_trait]
impl NodeObjects for KubeNodeObjects {
    async fn get_node(&self, name: &str) -> Result<Node, ObjectError> {
        Api::<Node>::all(self.client.clone()).get(name).await.map_err(|e| map_err("Node", name, e))
    }

    async fn patch_node(&self, name: &str, patch: &NodeMetaPatch) -> Result<(), ObjectError> {
        let mut meta = serde_json::Map::new();
        if let Some(rv) = &patch.resource_version {
            meta.insert("resourceVersion".into(), rv.clone().into());
        }
        if !patch.labels.is_empty() {
            meta.insert("labels".into(), serde_json::json!(patch.labels));
        }
        if !patch.annotations.is_empty() {
            // None serializes as null: a merge patch removes the key.
            meta.insert("annotations".into(), serde_json::json!(patch.annotations));
        }
        let body = serde_json::json!({ "metadata": meta });
        Api::<Node>::all(self.client.clone())
            .patch(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .map(drop)
            .map_err(|e| map_err("Node", name, e))
    }

    async fn get_csinode(&self, name: &str) -> Result<Option<CSINode>, ObjectError> {
        Api::<CSINode>::all(self.client.clone()).get_opt(name).await.map_err(|e| map_err("CSINode", name, e))
    }

    async fn create_csinode(&self, csinode: &CSINode) -> Result<CSINode, ObjectError> {
        let name = csinode.metadata.name.clone().unwrap_or_default();
        Api::<CSINode>::all(self.client.clone())
            .create(&PostParams::default(), csinode)
            .await
            .map_err(|e| map_err("CSINode", &name, e))
    }

    async fn replace_csinode(&self, csinode: &CSINode) -> Result<CSINode, ObjectError> {
        let name = csinode.metadata.name.clone().unwrap_or_default();
        Api::<CSINode>::all(self.client.clone())
            .replace(&name, &PostParams::default(), csinode)
            .await
            .map_err(|e| map_err("CSINode", &name, e))
    }
}

/// The waits between the tries of one update (the kubelet's updateBackoff:
/// 4 steps from 10 ms, factor 5).
const UPDATE_RETRIES: [Duration; 3] =
    [Duration::from_millis(10), Duration::from_millis(50), Duration::from_millis(250)];

/// Why one try failed: worth another try, or not (bad data on the Node).
enum Failure {
    Retry(String),
    Fatal(String),
}

impl From<ObjectError> for Failure {
    fn from(e: ObjectError) -> Failure {
        Failure::Retry(e.to_string())
    }
}

/// The node IDs in the Node's annotation (empty without it).
pub fn node_ids(node: &Node) -> Result<BTreeMap<String, String>, String> {
    let Some(value) = node.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_NODE_ID)) else {
        return Ok(BTreeMap::new());
    };
    if value.is_empty() {
        return Ok(BTreeMap::new());
    }
    serde_json::from_str(value)
        .map_err(|e| format!("failed to parse node's {ANNOTATION_NODE_ID:?} annotation value ({value:?}) err={e}"))
}

/// The labels `topology` adds to `node`; a label already set to another
/// value is the kubelet's collision error.
pub fn topology_labels(node: &Node, topology: &BTreeMap<String, String>) -> Result<BTreeMap<String, String>, String> {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let mut add = BTreeMap::new();
    for (k, v) in topology {
        match labels.get(k) {
            Some(cur) if cur == v => {}
            Some(cur) => {
                return Err(format!(
                    "detected topology value collision: driver reported {k:?}:{v:?} but existing label is {k:?}:{cur:?}"
                ));
            }
            None => {
                add.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(add)
}

/// The CSINode entry of a driver.
pub fn driver_entry(name: &str, node_id: &str, max_volumes: i64, topology: &BTreeMap<String, String>) -> CSINodeDriver {
    let keys: Vec<String> = topology.keys().cloned().collect();
    let allocatable = (max_volumes > 0).then(|| {
        if max_volumes > i64::from(i32::MAX) {
            tracing::warn!(driver = name, max_volumes, "volume limit above the largest CSINode count; truncated");
        }
        VolumeNodeResources { count: Some(max_volumes.min(i64::from(i32::MAX)) as i32) }
    });
    CSINodeDriver {
        name: name.to_owned(),
        node_id: node_id.to_owned(),
        topology_keys: (!keys.is_empty()).then_some(keys),
        allocatable,
    }
}

fn sorted_keys(d: &CSINodeDriver) -> Vec<String> {
    let mut k = d.topology_keys.clone().unwrap_or_default();
    k.sort();
    k
}

/// `drivers` with `want` in place of any entry of its name; None when
/// it is already there as wanted.
pub fn with_driver(drivers: &[CSINodeDriver], want: &CSINodeDriver) -> Option<Vec<CSINodeDriver>> {
    let same = |d: &CSINodeDriver| {
        d.name == want.name
            && d.node_id == want.node_id
            && sorted_keys(d) == sorted_keys(want)
            && d.allocatable == want.allocatable
    };
    if drivers.iter().any(same) && drivers.iter().filter(|d| d.name == want.name).count() == 1 {
        return None;
    }
    let mut out: Vec<CSINodeDriver> = drivers.iter().filter(|d| d.name != want.name).cloned().collect();
    out.push(want.clone());
    Some(out)
}

/// `drivers` without the entry of `name`; None when it has none.
pub fn without_driver(drivers: &[CSINodeDriver], name: &str) -> Option<Vec<CSINodeDriver>> {
    drivers.iter().any(|d| d.name == name).then(|| drivers.iter().filter(|d| d.name != name).cloned().collect())
}

/// A CSINode for `node`, owned by it, with no driver.
pub fn new_csinode(node: &Node) -> CSINode {
    let name = node.metadata.name.clone().unwrap_or_default();
    CSINode {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name,
                uid: node.metadata.uid.clone().unwrap_or_default(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: CSINodeSpec { drivers: vec![] },
        ..Default::default()
    }
}

/// Publishes the node's CSI drivers for the node `node_name`.
pub struct NodeInfoManager {
    objects: Arc<dyn NodeObjects>,
    node_name: String,
    /// One update at a time: install and uninstall of two drivers would
    /// otherwise conflict with each other on every try.
    lock: tokio::sync::Mutex<()>,
}

impl NodeInfoManager {
    pub fn new(objects: Arc<dyn NodeObjects>, node_name: impl Into<String>) -> NodeInfoManager {
        NodeInfoManager { objects, node_name: node_name.into(), lock: tokio::sync::Mutex::new(()) }
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    async fn retry<F, Fut>(f: F) -> Result<(), String>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<(), Failure>>,
    {
        let mut errors = vec![];
        for wait in UPDATE_RETRIES.iter().map(Some).chain([None]) {
            match f().await {
                Ok(()) => return Ok(()),
                Err(Failure::Fatal(e)) => return Err(e),
                Err(Failure::Retry(e)) => errors.push(e),
            }
            if let Some(w) = wait {
                tokio::time::sleep(*w).await;
            }
        }
        Err(format!("gave up after {} tries: [{}]", errors.len(), errors.join(", ")))
    }

    /// The CSINode, created (owned by the Node) when missing.
    async fn csinode(&self) -> Result<CSINode, Failure> {
        if let Some(c) = self.objects.get_csinode(&self.node_name).await? {
            return Ok(c);
        }
        let node = self.objects.get_node(&self.node_name).await?;
        Ok(self.objects.create_csinode(&new_csinode(&node)).await?)
    }

    /// Makes sure the CSINode exists (the kubelet's
    /// InitializeCSINodeWithAnnotation, without the migrated-plugins
    /// annotation: swiftlet migrates no in-tree plugin).
    pub async fn initialize(&self) -> Result<(), String> {
        let _g = self.lock.lock().await;
        Self::retry(|| async { self.csinode().await.map(drop) })
            .await
            .map_err(|e| format!("error initializing CSINode {:?}: {e}", self.node_name))
    }

    /// [`NodeInfoManager::initialize`] until it succeeds or `shutdown`
    /// (the kubelet exits after 140 s of failures; swiftlet keeps trying).
    /// True once done.
    pub async fn initialize_until_done(&self, shutdown: &CancellationToken) -> bool {
        let mut backoff = Backoff::new(BackoffPolicy { initial: Duration::from_secs(1), max: Duration::from_secs(30) });
        let mut last = String::new();
        loop {
            match self.initialize().await {
                Ok(()) => {
                    tracing::debug!(node = self.node_name, "CSINode initialized");
                    return true;
                }
                Err(e) => {
                    if e != last {
                        tracing::warn!("{e} (retrying)");
                    }
                    last = e;
                }
            }
            let now = std::time::Instant::now();
            backoff.next("init", now);
            let wait = backoff.delay("init").unwrap_or(Duration::from_secs(1));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.cancelled() => return false,
            }
        }
    }

    /// Records the driver on the Node (node ID annotation, topology labels),
    /// then in the CSINode (InstallCSIDriver).
    pub async fn install_driver(
        &self,
        driver: &str,
        node_id: &str,
        max_volumes: i64,
        topology: &BTreeMap<String, String>,
    ) -> Result<(), String> {
        if node_id.is_empty() {
            return Err("error adding CSI driver node info: driverNodeID must not be empty".into());
        }
        let _g = self.lock.lock().await;
        Self::retry(|| self.try_install_on_node(driver, node_id, topology))
            .await
            .map_err(|e| format!("error updating Node object with CSI driver node info: {e}"))?;
        let want = driver_entry(driver, node_id, max_volumes, topology);
        Self::retry(|| async {
            let mut c = self.csinode().await?;
            if let Some(drivers) = with_driver(&c.spec.drivers, &want) {
                c.spec.drivers = drivers;
                self.objects.replace_csinode(&c).await?;
            }
            Ok(())
        })
        .await
        .map_err(|e| format!("error updating CSINode object with CSI driver node info: {e}"))
    }

    async fn try_install_on_node(
        &self,
        driver: &str,
        node_id: &str,
        topology: &BTreeMap<String, String>,
    ) -> Result<(), Failure> {
        let node = self.objects.get_node(&self.node_name).await?;
        let mut ids = node_ids(&node).map_err(Failure::Fatal)?;
        let labels = topology_labels(&node, topology).map_err(Failure::Fatal)?;
        let mut patch =
            NodeMetaPatch { resource_version: node.metadata.resource_version.clone(), labels, ..Default::default() };
        if ids.get(driver).map(String::as_str) != Some(node_id) {
            ids.insert(driver.to_owned(), node_id.to_owned());
            patch.annotations.insert(ANNOTATION_NODE_ID.into(), Some(annotation_value(&ids)));
        }
        if patch.labels.is_empty() && patch.annotations.is_empty() {
            return Ok(());
        }
        Ok(self.objects.patch_node(&self.node_name, &patch).await?)
    }

    /// Removes the driver from the CSINode, then its node ID from the Node
    /// (UninstallCSIDriver). Its topology labels stay, as the kubelet's.
    pub async fn uninstall_driver(&self, driver: &str) -> Result<(), String> {
        let _g = self.lock.lock().await;
        Self::retry(|| async {
            let Some(mut c) = self.objects.get_csinode(&self.node_name).await? else { return Ok(()) };
            if let Some(drivers) = without_driver(&c.spec.drivers, driver) {
                c.spec.drivers = drivers;
                self.objects.replace_csinode(&c).await?;
            }
            Ok(())
        })
        .await
        .map_err(|e| format!("error uninstalling CSI driver from CSINode object {e}"))?;
        Self::retry(|| async {
            let node = self.objects.get_node(&self.node_name).await?;
            let mut ids = node_ids(&node).map_err(Failure::Fatal)?;
            if ids.remove(driver).is_none() {
                return Ok(());
            }
            let value = (!ids.is_empty()).then(|| annotation_value(&ids));
            let patch = NodeMetaPatch {
                resource_version: node.metadata.resource_version.clone(),
                annotations: [(ANNOTATION_NODE_ID.to_owned(), value)].into(),
                ..Default::default()
            };
            Ok(self.objects.patch_node(&self.node_name, &patch).await?)
        })
        .await
        .map_err(|e| format!("error removing CSI driver node info from Node object {e}"))
    }
}

/// The annotation's JSON (keys sorted, as Go's encoding/json writes maps).
fn annotation_value(ids: &BTreeMap<String, String>) -> String {
    serde_json::to_string(ids).unwrap_or_default()
}

#[cfg(test)]
mod tests;
