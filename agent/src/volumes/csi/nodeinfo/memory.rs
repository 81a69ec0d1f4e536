//! An in-memory twin of the API server's Nodes and CSINodes for the
//! publisher's tests: resourceVersions bumped on every write and checked on
//! guarded ones, conflicts and failures injectable.

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::{api::core::v1::Node, api::storage::v1::CSINode, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use parking_lot::Mutex;

use super::{NodeMetaPatch, NodeObjects, ObjectError};

#[derive(Default)]
struct State {
    nodes: BTreeMap<String, Node>,
    csinodes: BTreeMap<String, CSINode>,
    version: u64,
    /// The next this many writes fail with a conflict.
    conflicts: usize,
    /// Every call fails with this.
    failing: Option<String>,
    writes: usize,
}

#[derive(Default)]
pub struct MemoryNodeObjects {
    state: Mutex<State>,
}

impl MemoryNodeObjects {
    /// With a Node `name` of uid `uid` and the given labels.
    pub fn with_node(name: &str, uid: &str, labels: &[(&str, &str)]) -> MemoryNodeObjects {
        let m = MemoryNodeObjects::default();
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(uid.into()),
                resource_version: Some("1".into()),
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            ..Default::default()
        };
        {
            let mut s = m.state.lock();
            s.version = 1;
            s.nodes.insert(name.into(), node);
        }
        m
    }

    pub fn node(&self, name: &str) -> Node {
        self.state.lock().nodes[name].clone()
    }

    pub fn csinode(&self, name: &str) -> Option<CSINode> {
        self.state.lock().csinodes.get(name).cloned()
    }

    pub fn set_annotation(&self, node: &str, key: &str, value: &str) {
        let mut s = self.state.lock();
        if let Some(n) = s.nodes.get_mut(node) {
            n.metadata.annotations.get_or_insert_default().insert(key.into(), value.into());
        }
    }

    pub fn inject_conflicts(&self, n: usize) {
        self.state.lock().conflicts = n;
    }

    pub fn set_failing(&self, why: Option<&str>) {
        self.state.lock().failing = why.map(str::to_owned);
    }

    /// Writes that went through.
    pub fn writes(&self) -> usize {
        self.state.lock().writes
    }
}

impl State {
    fn check(&self) -> Result<(), ObjectError> {
        match &self.failing {
            Some(why) => Err(ObjectError::Failed(why.clone())),
            None => Ok(()),
        }
    }

    /// The checks of a write; a new resourceVersion.
    fn write(&mut self, guard: Option<&String>, current: Option<&String>) -> Result<String, ObjectError> {
        self.check()?;
        if self.conflicts > 0 {
            self.conflicts -= 1;
            return Err(ObjectError::Conflict("injected".into()));
        }
        if guard.is_some() && guard != current {
            return Err(ObjectError::Conflict(format!("resourceVersion {guard:?} is not {current:?}")));
        }
        self.version += 1;
        self.writes += 1;
        Ok(self.version.to_string())
    }
}

#[async_trait]
impl NodeObjects for MemoryNodeObjects {
    async fn get_node(&self, name: &str) -> Result<Node, ObjectError> {
        let s = self.state.lock();
        s.check()?;
        s.nodes.get(name).cloned().ok_or_else(|| ObjectError::NotFound(format!("Node {name:?}")))
    }

    async fn patch_node(&self, name: &str, patch: &NodeMetaPatch) -> Result<(), ObjectError> {
        let mut s = self.state.lock();
        let current = s.nodes.get(name).ok_or_else(|| ObjectError::NotFound(format!("Node {name:?}")))?;
        let current_rv = current.metadata.resource_version.clone();
        let rv = s.write(patch.resource_version.as_ref(), current_rv.as_ref())?;
        let Some(n) = s.nodes.get_mut(name) else { return Err(ObjectError::NotFound(format!("Node {name:?}"))) };
        let labels = n.metadata.labels.get_or_insert_default();
        labels.extend(patch.labels.clone());
        let annotations = n.metadata.annotations.get_or_insert_default();
        for (k, v) in &patch.annotations {
            match v {
                Some(v) => annotations.insert(k.clone(), v.clone()),
                None => annotations.remove(k),
            };
        }
        n.metadata.resource_version = Some(rv);
        Ok(())
    }

    async fn get_csinode(&self, name: &str) -> Result<Option<CSINode>, ObjectError> {
        let s = self.state.lock();
        s.check()?;
        Ok(s.csinodes.get(name).cloned())
    }

    async fn create_csinode(&self, csinode: &CSINode) -> Result<CSINode, ObjectError> {
        let mut s = self.state.lock();
        let name = csinode.metadata.name.clone().unwrap_or_default();
        if s.csinodes.contains_key(&name) {
            return Err(ObjectError::Conflict(format!("CSINode {name:?} already exists")));
        }
        let rv = s.write(None, None)?;
        let mut c = csinode.clone();
        c.metadata.resource_version = Some(rv);
        c.metadata.uid = Some(format!("csinode-{name}"));
        s.csinodes.insert(name, c.clone());
        Ok(c)
    }

    async fn replace_csinode(&self, csinode: &CSINode) -> Result<CSINode, ObjectError> {
        let mut s = self.state.lock();
        let name = csinode.metadata.name.clone().unwrap_or_default();
        let current = s.csinodes.get(&name).ok_or_else(|| ObjectError::NotFound(format!("CSINode {name:?}")))?;
        let current_rv = current.metadata.resource_version.clone();
        let rv = s.write(csinode.metadata.resource_version.as_ref(), current_rv.as_ref())?;
        let mut c = csinode.clone();
        c.metadata.resource_version = Some(rv);
        s.csinodes.insert(name, c.clone());
        Ok(c)
    }
}
