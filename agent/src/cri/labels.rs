//! The labels and annotations the kubelet puts on sandboxes and containers
//! (pkg/kubelet/types/labels.go, kuberuntime/labels.go). Tools such as
//! crictl, and users' scripts, read them; we read them back to re-adopt
//! what runs after a restart, and touch nothing that lacks them.

use std::collections::HashMap;

pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// The kubelet's value of CONTAINER_NAME on sandboxes.
pub const POD_INFRA_CONTAINER_NAME: &str = "POD";
/// Present on everything swiftlet creates: the runtime may hold sandboxes
/// that some other kubelet or tool made in the same namespace.
pub const MANAGED_BY: &str = "io.swiftlet.managed";

pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
pub const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub const CONTAINER_TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
pub const CONTAINER_TERMINATION_MESSAGE_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";
pub const CONTAINER_PRE_STOP_HANDLER: &str = "io.kubernetes.container.preStopHandler";
pub const CONTAINER_PORTS: &str = "io.kubernetes.container.ports";
pub const POD_DELETION_GRACE_PERIOD: &str = "io.kubernetes.pod.deletionGracePeriod";
pub const POD_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Whether the container is an init container (swiftlet's own; the
/// kubelet tells them apart by name against the spec, which a restarted
/// agent may no longer have).
pub const CONTAINER_TYPE: &str = "io.swiftlet.container.type";

/// The identity of a pod, as its sandbox and containers carry it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PodIdentity {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

/// Labels for a pod sandbox: the pod's own labels plus the identity keys.
pub fn sandbox_labels(
    id: &PodIdentity,
    pod_labels: &std::collections::BTreeMap<String, String>,
) -> HashMap<String, String> {
    let mut l: HashMap<String, String> = pod_labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    l.insert(POD_NAME.into(), id.name.clone());
    l.insert(POD_NAMESPACE.into(), id.namespace.clone());
    l.insert(POD_UID.into(), id.uid.clone());
    l.insert(MANAGED_BY.into(), "true".into());
    l
}

/// Labels for a container of the pod.
pub fn container_labels(id: &PodIdentity, container: &str) -> HashMap<String, String> {
    HashMap::from([
        (POD_NAME.into(), id.name.clone()),
        (POD_NAMESPACE.into(), id.namespace.clone()),
        (POD_UID.into(), id.uid.clone()),
        (CONTAINER_NAME.into(), container.to_owned()),
        (MANAGED_BY.into(), "true".into()),
    ])
}

/// The selector that lists only what swiftlet created.
pub fn managed_selector() -> HashMap<String, String> {
    HashMap::from([(MANAGED_BY.into(), "true".into())])
}

/// The pod identity a sandbox or container carries, if it is ours.
pub fn identity(labels: &HashMap<String, String>) -> Option<PodIdentity> {
    identity_by(|key| labels.get(key).map(String::as_str))
}

/// The pod identity from labels looked up by `label`, if it is ours.
pub fn identity_by<'a>(label: impl Fn(&str) -> Option<&'a str>) -> Option<PodIdentity> {
    if label(MANAGED_BY) != Some("true") {
        return None;
    }
    Some(PodIdentity {
        uid: label(POD_UID)?.to_owned(),
        namespace: label(POD_NAMESPACE)?.to_owned(),
        name: label(POD_NAME)?.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_foreign_objects() {
        let id = PodIdentity { uid: "u1".into(), namespace: "ns".into(), name: "web".into() };
        let pod_labels = [("app".to_string(), "web".to_string())].into_iter().collect();
        let l = sandbox_labels(&id, &pod_labels);
        assert_eq!(l["app"], "web");
        assert_eq!(identity(&l), Some(id.clone()));
        let c = container_labels(&id, "nginx");
        assert_eq!(c[CONTAINER_NAME], "nginx");
        assert_eq!(identity(&c), Some(id));
        // A sandbox made by something else (no managed label) is not ours,
        // even with the kubelet's keys.
        let mut foreign = c.clone();
        foreign.remove(MANAGED_BY);
        assert_eq!(identity(&foreign), None);
        let mut partial = c;
        partial.remove(POD_UID);
        assert_eq!(identity(&partial), None);
    }
}
