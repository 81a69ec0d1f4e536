//! PATCH bodies: JSON patch (RFC 6902), JSON merge patch (RFC 7386) and
//! strategic merge patch for the fields of the core types we serve.
//!
//! Strategic merge follows the API server's rules for the fields whose Go
//! types carry `patchStrategy:"merge"`: lists of objects merge by their
//! `patchMergeKey` (conditions by `type`, containers by `name`, ...),
//! `finalizers` merge as a set, other lists are replaced; `null` deletes a
//! key; the directives `$patch: replace|delete`, `$retainKeys`,
//! `$deleteFromPrimitiveList/<field>` and `$setElementOrder/<field>` are
//! honoured.

use serde_json::{Map, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchKind {
    Json,
    Merge,
    Strategic,
}

impl PatchKind {
    pub fn from_content_type(ct: &str) -> Option<PatchKind> {
        match ct.split(';').next().unwrap_or("").trim() {
            "application/json-patch+json" => Some(PatchKind::Json),
            "application/merge-patch+json" => Some(PatchKind::Merge),
            "application/strategic-merge-patch+json" => Some(PatchKind::Strategic),
            _ => None,
        }
    }
}

/// The patch type a request's Content-Type names, or the API server's 415
/// for any other.
pub fn kind_of(content_type: &str) -> super::store::ApiResult<PatchKind> {
    PatchKind::from_content_type(content_type).ok_or_else(|| {
        super::store::ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {content_type:?})"),
        )
    })
}

/// How a list field merges in a strategic merge patch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ListStrategy {
    Replace,
    MergeByKey(&'static str),
    /// A list of scalars merged as a set (`finalizers`).
    MergeScalars,
}

/// The patch strategies of the list fields of Pod, Node, Event, Lease and
/// Namespace (the Go struct tags), by field name.
fn list_strategy(field: &str) -> ListStrategy {
    use ListStrategy::*;
    match field {
        "conditions" | "addresses" => MergeByKey("type"),
        "taints" => MergeByKey("key"),
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims"
        | "resourceClaimStatuses" => MergeByKey("name"),
        "ports" => MergeByKey("containerPort"),
        "volumeMounts" => MergeByKey("mountPath"),
        "volumeDevices" => MergeByKey("devicePath"),
        "podIPs" | "hostIPs" | "hostAliases" => MergeByKey("ip"),
        "ownerReferences" => MergeByKey("uid"),
        "topologySpreadConstraints" => MergeByKey("topologyKey"),
        "finalizers" => MergeScalars,
        _ => Replace,
    }
}

pub fn apply(kind: PatchKind, original: &Value, patch: &Value) -> Result<Value, String> {
    let mut out = original.clone();
    match kind {
        PatchKind::Json => {
            let p: json_patch::Patch =
                serde_json::from_value(patch.clone()).map_err(|e| format!("invalid JSON patch: {e}"))?;
            json_patch::patch(&mut out, &p).map_err(|e| format!("the JSON patch cannot be applied: {e}"))?;
        }
        PatchKind::Merge => json_patch::merge(&mut out, patch),
        PatchKind::Strategic => {
            if !patch.is_object() {
                return Err("a strategic merge patch must be a JSON object".into());
            }
            strategic(&mut out, patch)?;
        }
    }
    Ok(out)
}

fn strategic(original: &mut Value, patch: &Value) -> Result<(), String> {
    let Value::Object(p) = patch else {
        *original = patch.clone();
        return Ok(());
    };
    match p.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut m = p.clone();
            m.remove("$patch");
            *original = Value::Object(m);
            return Ok(());
        }
        Some("delete") => {
            *original = Value::Object(Map::new());
            return Ok(());
        }
        Some(other) if other != "merge" => return Err(format!("unknown patch directive {other:?}")),
        _ => {}
    }
    if !original.is_object() {
        *original = Value::Object(Map::new());
    }
    let o = original.as_object_mut().expect("object");
    if let Some(Value::Array(keep)) = p.get("$retainKeys") {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        o.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (k, v) in p {
        if k == "$patch" || k == "$retainKeys" || k.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(del)) = (o.get_mut(field), v) {
                list.retain(|x| !del.contains(x));
            }
            continue;
        }
        if v.is_null() {
            o.remove(k);
            continue;
        }
        match (o.get_mut(k), v) {
            (Some(cur @ Value::Object(_)), Value::Object(_)) => strategic(cur, v)?,
            (cur, Value::Array(items)) => {
                let merged = merge_list(k, cur.map(|c| c.take()), items)?;
                o.insert(k.clone(), merged);
            }
            (_, Value::Object(_)) => {
                let mut fresh = Value::Object(Map::new());
                strategic(&mut fresh, v)?;
                o.insert(k.clone(), fresh);
            }
            _ => {
                o.insert(k.clone(), v.clone());
            }
        }
    }
    if let Some(o) = original.as_object_mut() {
        for (k, v) in p {
            if let (Some(field), Value::Array(order)) = (k.strip_prefix("$setElementOrder/"), v)
                && let Some(Value::Array(list)) = o.get_mut(field)
            {
                reorder(field, list, order);
            }
        }
    }
    Ok(())
}

fn merge_list(field: &str, current: Option<Value>, patch: &[Value]) -> Result<Value, String> {
    let strategy = list_strategy(field);
    let replace = patch.iter().any(|x| x.get("$patch").and_then(Value::as_str) == Some("replace"));
    let mut cur = match current {
        Some(Value::Array(a)) if !replace => a,
        _ => vec![],
    };
    match strategy {
        ListStrategy::Replace => {
            return Ok(Value::Array(patch.iter().filter(|x| x.get("$patch").is_none()).cloned().collect()));
        }
        ListStrategy::MergeScalars => {
            for x in patch {
                if !cur.contains(x) {
                    cur.push(x.clone());
                }
            }
        }
        ListStrategy::MergeByKey(key) => {
            for item in patch {
                let directive = item.get("$patch").and_then(Value::as_str);
                if directive == Some("replace") {
                    continue;
                }
                let Some(kv) = item.get(key) else {
                    return Err(format!("{field}: an element lacks its merge key {key:?}"));
                };
                let pos = cur.iter().position(|c| c.get(key) == Some(kv));
                match (directive, pos) {
                    (Some("delete"), Some(i)) => {
                        cur.remove(i);
                    }
                    (Some("delete"), None) => {}
                    (_, Some(i)) => strategic(&mut cur[i], item)?,
                    (_, None) => {
                        let mut fresh = Value::Object(Map::new());
                        strategic(&mut fresh, item)?;
                        cur.push(fresh);
                    }
                }
            }
        }
    }
    Ok(Value::Array(cur))
}

fn reorder(field: &str, list: &mut [Value], order: &[Value]) {
    let ListStrategy::MergeByKey(key) = list_strategy(field) else {
        return;
    };
    let rank = |v: &Value| order.iter().position(|o| o.get(key) == v.get(key)).unwrap_or(usize::MAX);
    list.sort_by_key(rank);
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn strategic_merge_table() {
        let cases = [
            (
                "conditions merge by type",
                json!({"status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "MemoryPressure", "status": "False"}]}}),
                json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}),
                json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}, {"type": "MemoryPressure", "status": "False"}]}}),
            ),
            (
                "element order",
                json!({"status": {"conditions": [{"type": "A"}, {"type": "B"}]}}),
                json!({"status": {"$setElementOrder/conditions": [{"type": "B"}, {"type": "A"}], "conditions": [{"type": "A", "x": 1}]}}),
                json!({"status": {"conditions": [{"type": "B"}, {"type": "A", "x": 1}]}}),
            ),
            (
                "delete directive in a list",
                json!({"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoSchedule"}]}}),
                json!({"spec": {"taints": [{"key": "a", "$patch": "delete"}]}}),
                json!({"spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}}),
            ),
            (
                "replace directive in a list",
                json!({"spec": {"taints": [{"key": "a"}, {"key": "b"}]}}),
                json!({"spec": {"taints": [{"$patch": "replace"}, {"key": "c"}]}}),
                json!({"spec": {"taints": [{"key": "c"}]}}),
            ),
            (
                "atomic lists are replaced",
                json!({"status": {"images": [{"names": ["a"]}, {"names": ["b"]}]}}),
                json!({"status": {"images": [{"names": ["c"]}]}}),
                json!({"status": {"images": [{"names": ["c"]}]}}),
            ),
            (
                "container statuses are atomic",
                json!({"status": {"containerStatuses": [{"name": "a", "ready": false}, {"name": "b"}]}}),
                json!({"status": {"containerStatuses": [{"name": "a", "ready": true}]}}),
                json!({"status": {"containerStatuses": [{"name": "a", "ready": true}]}}),
            ),
            (
                "null deletes, maps merge",
                json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "status": {"capacity": {"cpu": "2", "hugepages-2Mi": "0"}}}),
                json!({"metadata": {"labels": {"a": null, "c": "3"}}, "status": {"capacity": {"hugepages-2Mi": null, "cpu": "4"}}}),
                json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "status": {"capacity": {"cpu": "4"}}}),
            ),
            (
                "finalizers merge as a set; deleteFromPrimitiveList",
                json!({"metadata": {"finalizers": ["a", "b"]}}),
                json!({"metadata": {"finalizers": ["c"], "$deleteFromPrimitiveList/finalizers": ["a"]}}),
                json!({"metadata": {"finalizers": ["b", "c"]}}),
            ),
            (
                "replace a map",
                json!({"spec": {"x": {"a": 1, "b": 2}}}),
                json!({"spec": {"x": {"$patch": "replace", "c": 3}}}),
                json!({"spec": {"x": {"c": 3}}}),
            ),
            (
                "retainKeys",
                json!({"spec": {"strategy": {"type": "A", "rolling": {"x": 1}}}}),
                json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "B"}}}),
                json!({"spec": {"strategy": {"type": "B"}}}),
            ),
            (
                "new nested object",
                json!({}),
                json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
                json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
            ),
        ];
        for (name, orig, patch, want) in cases {
            let got = apply(PatchKind::Strategic, &orig, &patch).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn merge_and_json_patch() {
        let orig = json!({"a": {"b": 1, "c": [1, 2]}});
        assert_eq!(
            apply(PatchKind::Merge, &orig, &json!({"a": {"b": null, "c": [3]}})).unwrap(),
            json!({"a": {"c": [3]}})
        );
        let p = json!([{"op": "replace", "path": "/a/b", "value": 5}, {"op": "add", "path": "/a/c/-", "value": 3}]);
        assert_eq!(apply(PatchKind::Json, &orig, &p).unwrap(), json!({"a": {"b": 5, "c": [1, 2, 3]}}));
        let failing = json!([{"op": "test", "path": "/a/b", "value": 2}]);
        assert!(apply(PatchKind::Json, &orig, &failing).is_err());
        assert_eq!(PatchKind::from_content_type("application/merge-patch+json; charset=utf-8"), Some(PatchKind::Merge));
        assert_eq!(PatchKind::from_content_type("application/apply-patch+yaml"), None);
    }
}
