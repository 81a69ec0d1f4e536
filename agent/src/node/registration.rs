//! Registration as the kubelet's registerWithAPIServer: the Node it
//! creates (labels, taints, annotation, status), and what it changes on a
//! Node that already exists with its name (adoption): the default labels
//! and the attach/detach annotation; --node-labels and taints apply only
//! at creation, as the kubelet.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Node, NodeSpec, NodeStatus, Taint},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde_json::{Map, Value, json};

pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
pub const LABEL_OS: &str = "kubernetes.io/os";
pub const LABEL_ARCH: &str = "kubernetes.io/arch";
pub const LABEL_OS_BETA: &str = "beta.kubernetes.io/os";
pub const LABEL_ARCH_BETA: &str = "beta.kubernetes.io/arch";
/// The default labels the kubelet keeps up to date on an existing Node.
const DEFAULT_LABELS: &[&str] = &[LABEL_HOSTNAME, LABEL_OS, LABEL_ARCH, LABEL_OS_BETA, LABEL_ARCH_BETA];
pub const ANNOTATION_ATTACH_DETACH: &str = "volumes.kubernetes.io/controller-managed-attach-detach";

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Registration {
    pub node_name: String,
    /// The host name label's value (the node name, lowercased).
    pub hostname: String,
    pub os: String,
    pub arch: String,
    /// --node-labels.
    pub labels: BTreeMap<String, String>,
    /// registerWithTaints.
    pub taints: Vec<Taint>,
    pub provider_id: Option<String>,
}

impl Registration {
    pub fn labels(&self) -> BTreeMap<String, String> {
        let mut l = BTreeMap::from([
            (LABEL_HOSTNAME.to_owned(), self.hostname.clone()),
            (LABEL_OS.to_owned(), self.os.clone()),
            (LABEL_ARCH.to_owned(), self.arch.clone()),
            (LABEL_OS_BETA.to_owned(), self.os.clone()),
            (LABEL_ARCH_BETA.to_owned(), self.arch.clone()),
        ]);
        l.extend(self.labels.clone());
        l
    }
}

/// The Node the kubelet creates.
pub fn initial_node(r: &Registration, status: NodeStatus) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(r.node_name.clone()),
            labels: Some(r.labels()),
            annotations: Some(BTreeMap::from([(ANNOTATION_ATTACH_DETACH.to_owned(), "true".to_owned())])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: (!r.taints.is_empty()).then(|| r.taints.clone()),
            provider_id: r.provider_id.clone(),
            ..Default::default()
        }),
        status: Some(status),
    }
}

/// The merge patch (metadata only) that adopts an existing Node, or None
/// when it is already right.
pub fn adoption_patch(existing: &Node, wanted: &Node) -> Option<Value> {
    let empty = BTreeMap::new();
    let have = existing.metadata.labels.as_ref().unwrap_or(&empty);
    let want = wanted.metadata.labels.as_ref().unwrap_or(&empty);
    let mut labels = Map::new();
    for key in DEFAULT_LABELS {
        let Some(v) = want.get(*key) else { continue };
        if have.get(*key) != Some(v) {
            labels.insert((*key).to_owned(), if v.is_empty() { Value::Null } else { v.clone().into() });
        }
    }
    let annotated =
        existing.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_ATTACH_DETACH)).map(String::as_str)
            == Some("true");
    if labels.is_empty() && annotated {
        return None;
    }
    let mut meta = json!({});
    if !labels.is_empty() {
        meta["labels"] = Value::Object(labels);
    }
    if !annotated {
        meta["annotations"] = json!({ ANNOTATION_ATTACH_DETACH: "true" });
    }
    Some(json!({ "metadata": meta }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg() -> Registration {
        Registration {
            node_name: "n1".into(),
            hostname: "n1".into(),
            os: "linux".into(),
            arch: "amd64".into(),
            labels: BTreeMap::from([("node-role.kubernetes.io/worker".into(), "".into()), ("zone".into(), "a".into())]),
            taints: vec![Taint {
                key: "dedicated".into(),
                value: Some("gpu".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            }],
            provider_id: None,
        }
    }

    #[test]
    fn the_node_created() {
        let n = initial_node(&reg(), NodeStatus::default());
        let l = n.metadata.labels.as_ref().unwrap();
        assert_eq!(l[LABEL_HOSTNAME], "n1");
        assert_eq!(l[LABEL_OS], "linux");
        assert_eq!(l[LABEL_ARCH], "amd64");
        assert_eq!(l[LABEL_ARCH_BETA], "amd64");
        assert_eq!(l["node-role.kubernetes.io/worker"], "");
        assert_eq!(l["zone"], "a");
        assert_eq!(n.spec.as_ref().unwrap().taints.as_ref().unwrap()[0].key, "dedicated");
        assert_eq!(n.metadata.annotations.as_ref().unwrap()[ANNOTATION_ATTACH_DETACH], "true");
    }

    #[test]
    fn adoption() {
        let wanted = initial_node(&reg(), NodeStatus::default());
        assert_eq!(adoption_patch(&wanted, &wanted), None);
        let mut existing = wanted.clone();
        existing.metadata.labels.as_mut().unwrap().insert(LABEL_ARCH.into(), "arm64".into());
        existing.metadata.labels.as_mut().unwrap().remove("zone");
        existing.metadata.annotations = None;
        let p = adoption_patch(&existing, &wanted).unwrap();
        // Default labels are fixed; --node-labels are not re-applied.
        assert_eq!(
            p,
            json!({"metadata": {"labels": {LABEL_ARCH: "amd64"}, "annotations": {ANNOTATION_ATTACH_DETACH: "true"}}})
        );
    }
}
