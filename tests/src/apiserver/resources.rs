//! The resources the fake serves and the discovery documents describing
//! them (/api, /apis, /api/v1, /apis/<group>/<version>).

use serde_json::{Value, json};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResourceType {
    /// "" for the core group.
    pub group: &'static str,
    pub version: &'static str,
    /// The plural (URL) name.
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    /// Has a `/status` subresource (status is only written through it).
    pub status: bool,
    /// Only `create` (reviews): nothing is stored.
    pub create_only: bool,
}

impl ResourceType {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.to_owned() } else { format!("{}/{}", self.group, self.version) }
    }

    /// The key objects are stored under.
    pub fn key(&self) -> String {
        if self.group.is_empty() { self.plural.to_owned() } else { format!("{}.{}", self.plural, self.group) }
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }
}

#[allow(clippy::too_many_arguments)]
const fn rt(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    status: bool,
) -> ResourceType {
    ResourceType { group, version, plural, singular, kind, namespaced, short_names, status, create_only: false }
}

pub const NAMESPACES: ResourceType = rt("", "v1", "namespaces", "namespace", "Namespace", false, &["ns"], true);
pub const NODES: ResourceType = rt("", "v1", "nodes", "node", "Node", false, &["no"], true);
pub const PODS: ResourceType = rt("", "v1", "pods", "pod", "Pod", true, &["po"], true);
pub const EVENTS: ResourceType = rt("", "v1", "events", "event", "Event", true, &["ev"], false);
pub const CONFIGMAPS: ResourceType = rt("", "v1", "configmaps", "configmap", "ConfigMap", true, &["cm"], false);
pub const LEASES: ResourceType = rt("coordination.k8s.io", "v1", "leases", "lease", "Lease", true, &[], false);
pub const CSRS: ResourceType = rt(
    "certificates.k8s.io",
    "v1",
    "certificatesigningrequests",
    "certificatesigningrequest",
    "CertificateSigningRequest",
    false,
    &["csr"],
    true,
);
pub const TOKEN_REVIEWS: ResourceType = ResourceType {
    create_only: true,
    ..rt("authentication.k8s.io", "v1", "tokenreviews", "tokenreview", "TokenReview", false, &[], false)
};
pub const SUBJECT_ACCESS_REVIEWS: ResourceType = ResourceType {
    create_only: true,
    ..rt(
        "authorization.k8s.io",
        "v1",
        "subjectaccessreviews",
        "subjectaccessreview",
        "SubjectAccessReview",
        false,
        &[],
        false,
    )
};

pub const SECRETS: ResourceType = rt("", "v1", "secrets", "secret", "Secret", true, &[], false);
pub const SERVICES: ResourceType = rt("", "v1", "services", "service", "Service", true, &["svc"], true);
pub const SERVICE_ACCOUNTS: ResourceType =
    rt("", "v1", "serviceaccounts", "serviceaccount", "ServiceAccount", true, &["sa"], false);
pub const RUNTIME_CLASSES: ResourceType =
    rt("node.k8s.io", "v1", "runtimeclasses", "runtimeclass", "RuntimeClass", false, &[], false);

pub const PVS: ResourceType =
    rt("", "v1", "persistentvolumes", "persistentvolume", "PersistentVolume", false, &["pv"], true);
pub const PVCS: ResourceType =
    rt("", "v1", "persistentvolumeclaims", "persistentvolumeclaim", "PersistentVolumeClaim", true, &["pvc"], true);
pub const STORAGE_CLASSES: ResourceType =
    rt("storage.k8s.io", "v1", "storageclasses", "storageclass", "StorageClass", false, &["sc"], false);
pub const CSIDRIVERS: ResourceType =
    rt("storage.k8s.io", "v1", "csidrivers", "csidriver", "CSIDriver", false, &[], false);
pub const CSINODES: ResourceType = rt("storage.k8s.io", "v1", "csinodes", "csinode", "CSINode", false, &[], false);
pub const VOLUME_ATTACHMENTS: ResourceType =
    rt("storage.k8s.io", "v1", "volumeattachments", "volumeattachment", "VolumeAttachment", false, &[], true);

pub const ALL: &[ResourceType] = &[
    NAMESPACES,
    NODES,
    PODS,
    EVENTS,
    CONFIGMAPS,
    SECRETS,
    SERVICES,
    SERVICE_ACCOUNTS,
    PVS,
    PVCS,
    LEASES,
    CSRS,
    RUNTIME_CLASSES,
    // One group's resources stay together: discovery lists each group once.
    STORAGE_CLASSES,
    CSIDRIVERS,
    CSINODES,
    VOLUME_ATTACHMENTS,
    TOKEN_REVIEWS,
    SUBJECT_ACCESS_REVIEWS,
];

pub fn find(group: &str, version: &str, plural: &str) -> Option<ResourceType> {
    ALL.iter().copied().find(|r| r.group == group && r.version == version && r.plural == plural)
}

pub fn by_key(key: &str) -> Option<ResourceType> {
    ALL.iter().copied().find(|r| r.key() == key)
}

/// Groups other than core, with their one version.
fn groups() -> Vec<(&'static str, &'static str)> {
    let mut g: Vec<(&str, &str)> = ALL.iter().filter(|r| !r.group.is_empty()).map(|r| (r.group, r.version)).collect();
    g.dedup();
    g
}

pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_doc(group: &str, version: &str) -> Value {
    let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
    json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})
}

pub fn api_group_list() -> Value {
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": groups().into_iter().map(|(g, v)| group_doc(g, v)).collect::<Vec<_>>(),
    })
}

pub fn api_group(group: &str) -> Option<Value> {
    let (g, v) = groups().into_iter().find(|(g, _)| *g == group)?;
    let mut doc = group_doc(g, v);
    doc["kind"] = "APIGroup".into();
    doc["apiVersion"] = "v1".into();
    Some(doc)
}

pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut resources = vec![];
    for r in ALL.iter().filter(|r| r.group == group && r.version == version) {
        let verbs: &[&str] = if r.create_only {
            &["create"]
        } else {
            &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        };
        resources.push(json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": verbs,
            "shortNames": r.short_names,
        }));
        if r.status {
            resources.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if r.kind == "CertificateSigningRequest" {
            resources.push(json!({
                "name": "certificatesigningrequests/approval",
                "singularName": "",
                "namespaced": false,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() { version.to_owned() } else { format!("{group}/{version}") };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}))
}
