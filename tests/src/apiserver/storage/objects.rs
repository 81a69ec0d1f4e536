//! Reading the storage objects as the controllers read them: a claim's
//! class, request, access modes and consumers; a volume's capacity, claim
//! reference and node affinity.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::quantity;
use crate::apiserver::selectors::{LabelRequirement, LabelSelector};

pub const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
pub const ANN_BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
pub const ANN_DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
pub const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";

/// The string at a JSON pointer, "" when absent.
pub fn s<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

pub fn name(v: &Value) -> &str {
    s(v, "/metadata/name")
}

pub fn namespace(v: &Value) -> &str {
    s(v, "/metadata/namespace")
}

pub fn uid(v: &Value) -> &str {
    s(v, "/metadata/uid")
}

pub fn annotation<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.pointer("/metadata/annotations").and_then(|a| a.get(key)).and_then(Value::as_str)
}

pub fn set_annotation(v: &mut Value, key: &str, value: &str) {
    if !v["metadata"]["annotations"].is_object() {
        v["metadata"]["annotations"] = json!({});
    }
    v["metadata"]["annotations"][key] = value.into();
}

pub fn deleting(v: &Value) -> bool {
    v.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null())
}

/// A claim's class: spec.storageClassName, else the beta annotation; ""
/// for none.
pub fn claim_class(pvc: &Value) -> &str {
    match pvc.pointer("/spec/storageClassName").and_then(Value::as_str) {
        Some(c) => c,
        None => annotation(pvc, ANN_BETA_STORAGE_CLASS).unwrap_or(""),
    }
}

pub fn volume_class(pv: &Value) -> &str {
    match pv.pointer("/spec/storageClassName").and_then(Value::as_str) {
        Some(c) => c,
        None => annotation(pv, ANN_BETA_STORAGE_CLASS).unwrap_or(""),
    }
}

/// volumeMode, Filesystem when unset.
pub fn volume_mode(obj: &Value) -> &str {
    match s(obj, "/spec/volumeMode") {
        "" => "Filesystem",
        m => m,
    }
}

/// The strings of the array at a JSON pointer (access modes, mount
/// options, topology keys).
pub fn strings_at(obj: &Value, pointer: &str) -> Vec<String> {
    strings(obj.pointer(pointer))
}

pub fn access_modes(obj: &Value, pointer: &str) -> Vec<String> {
    obj.pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

pub fn request_bytes(pvc: &Value) -> Option<u128> {
    pvc.pointer("/spec/resources/requests/storage").and_then(quantity::value_bytes)
}

pub fn status_capacity_bytes(pvc: &Value) -> Option<u128> {
    pvc.pointer("/status/capacity/storage").and_then(quantity::value_bytes)
}

pub fn pv_capacity_bytes(pv: &Value) -> Option<u128> {
    pv.pointer("/spec/capacity/storage").and_then(quantity::value_bytes)
}

/// The claim reference a PV holds: (namespace, name, uid).
pub fn claim_ref(pv: &Value) -> Option<(&str, &str, &str)> {
    let r = pv.pointer("/spec/claimRef").filter(|r| r.is_object())?;
    Some((s(r, "/namespace"), s(r, "/name"), s(r, "/uid")))
}

/// The PV is reserved for this claim (by name, and by uid once known).
pub fn bound_to_claim(pv: &Value, pvc: &Value) -> bool {
    claim_ref(pv).is_some_and(|(ns, n, u)| ns == namespace(pvc) && n == name(pvc) && (u.is_empty() || u == uid(pvc)))
}

/// The reference a PV keeps to its claim, as the PV controller writes it.
pub fn reference(pvc: &Value) -> Value {
    json!({
        "kind": "PersistentVolumeClaim",
        "namespace": namespace(pvc),
        "name": name(pvc),
        "uid": uid(pvc),
        "apiVersion": "v1",
        "resourceVersion": s(pvc, "/metadata/resourceVersion"),
    })
}

/// kubectl's and the printers' short access modes: RWO,ROX,RWX,RWOP.
pub fn access_modes_short(modes: &[String]) -> String {
    [("ReadWriteOnce", "RWO"), ("ReadOnlyMany", "ROX"), ("ReadWriteMany", "RWX"), ("ReadWriteOncePod", "RWOP")]
        .iter()
        .filter(|(long, _)| modes.iter().any(|m| m == long))
        .map(|(_, short)| *short)
        .collect::<Vec<_>>()
        .join(",")
}

fn labels(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|l| l.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned()))).collect())
        .unwrap_or_default()
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

/// A metav1.LabelSelector (matchLabels, matchExpressions) as a selector;
/// None when it cannot be read (it then selects nothing).
pub fn label_selector(sel: &Value) -> Option<LabelSelector> {
    let mut reqs = vec![];
    if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in m {
            reqs.push(LabelRequirement::Equals(k.clone(), v.as_str()?.to_owned()));
        }
    }
    for e in sel.get("matchExpressions").and_then(Value::as_array).into_iter().flatten() {
        let key = s(e, "/key").to_owned();
        let values = strings(e.get("values")).into_iter().collect();
        reqs.push(match s(e, "/operator") {
            "In" => LabelRequirement::In(key, values),
            "NotIn" => LabelRequirement::NotIn(key, values),
            "Exists" => LabelRequirement::Exists(key),
            "DoesNotExist" => LabelRequirement::DoesNotExist(key),
            _ => return None,
        });
    }
    Some(LabelSelector(reqs))
}

/// One node selector requirement against a node's labels (or, for
/// matchFields, its name).
fn requirement_holds(req: &Value, value: Option<&str>) -> bool {
    let values = strings(req.get("values"));
    let number = |v: &str| v.parse::<i64>().ok();
    match s(req, "/operator") {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(a), Some(b)) if a > b),
        "Lt" => matches!((value.and_then(number), values.first().and_then(|x| number(x))), (Some(a), Some(b)) if a < b),
        _ => false,
    }
}

/// nodeSelectorTerms (ORed; each term's requirements ANDed) against a node.
pub fn node_selector_matches(terms: &[Value], node: &Value) -> bool {
    let labels = labels(node);
    terms.iter().any(|t| {
        let exprs = t.get("matchExpressions").and_then(Value::as_array);
        let fields = t.get("matchFields").and_then(Value::as_array);
        if exprs.is_none_or(Vec::is_empty) && fields.is_none_or(Vec::is_empty) {
            // An empty term matches nothing, as the scheduler has it.
            return false;
        }
        exprs.into_iter().flatten().all(|r| requirement_holds(r, labels.get(s(r, "/key")).map(String::as_str)))
            && fields.into_iter().flatten().all(|r| {
                let v = (s(r, "/key") == "metadata.name").then(|| name(node));
                requirement_holds(r, v)
            })
    })
}

/// The PV may be used on this node (no affinity: anywhere).
pub fn pv_fits_node(pv: &Value, node: &Value) -> bool {
    match pv.pointer("/spec/nodeAffinity/required/nodeSelectorTerms").and_then(Value::as_array) {
        Some(terms) => node_selector_matches(terms, node),
        None => true,
    }
}

/// The pod still counts for its volumes: not finished. (A pod being
/// deleted still holds them until it is gone.)
pub fn pod_active(pod: &Value) -> bool {
    !matches!(s(pod, "/status/phase"), "Succeeded" | "Failed")
}

/// The claim names a pod's volume refers to: `persistentVolumeClaim`
/// volumes and generic ephemeral volumes (`<pod>-<volume>`).
pub fn pod_claims(pod: &Value) -> Vec<String> {
    let mut out = vec![];
    for v in pod.pointer("/spec/volumes").and_then(Value::as_array).into_iter().flatten() {
        if let Some(c) = v.pointer("/persistentVolumeClaim/claimName").and_then(Value::as_str) {
            out.push(c.to_owned());
        } else if v.pointer("/ephemeral/volumeClaimTemplate").is_some() {
            out.push(format!("{}-{}", name(pod), s(v, "/name")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_affinity_and_selectors() {
        let node = json!({"metadata": {"name": "n1", "labels": {"zone": "a", "rank": "5"}}});
        let term = |e: Value| json!([{"matchExpressions": [e]}]);
        let fits = |terms: Value| node_selector_matches(terms.as_array().unwrap(), &node);
        assert!(fits(term(json!({"key": "zone", "operator": "In", "values": ["a", "b"]}))));
        assert!(!fits(term(json!({"key": "zone", "operator": "NotIn", "values": ["a"]}))));
        assert!(fits(term(json!({"key": "rank", "operator": "Gt", "values": ["3"]}))));
        assert!(!fits(term(json!({"key": "gone", "operator": "Exists"}))));
        assert!(fits(json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}])));
        assert!(!fits(json!([{}])));
        let sel = label_selector(
            &json!({"matchLabels": {"tier": "fast"}, "matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}),
        )
        .unwrap();
        assert!(sel.matches(&json!({"metadata": {"labels": {"tier": "fast"}}})));
        assert!(!sel.matches(&json!({"metadata": {"labels": {"tier": "fast", "x": "1"}}})));
        assert_eq!(access_modes_short(&["ReadWriteMany".into(), "ReadWriteOnce".into()]), "RWO,RWX");
    }
}
