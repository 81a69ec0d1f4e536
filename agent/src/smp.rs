//! Two-way strategic merge patches (what client-go's
//! `CreateTwoWayMergePatch` produces) for the fields of NodeStatus,
//! PodStatus and node spec that the kubelet writes: lists with a merge key
//! are patched element by element (`$setElementOrder`, `$patch: delete`),
//! other lists are replaced, removed keys become `null`. Pure, at the
//! crate's top level so node status and pod status (`kubeapi`) share it
//! without the node module reaching into the API plumbing that composes it.

use serde_json::{Map, Value};

/// How a list field is patched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ListPatch {
    Replace,
    MergeByKey(&'static str),
    /// Merge key "type", but several elements may share it (addresses): the
    /// whole list is sent with `$patch: replace`, as the kubelet does.
    ReplaceDirective,
}

fn list_patch(field: &str) -> ListPatch {
    match field {
        "conditions" => ListPatch::MergeByKey("type"),
        "addresses" => ListPatch::ReplaceDirective,
        "taints" => ListPatch::MergeByKey("key"),
        "podIPs" | "hostIPs" => ListPatch::MergeByKey("ip"),
        "resourceClaimStatuses" => ListPatch::MergeByKey("name"),
        _ => ListPatch::Replace,
    }
}

/// The patch that turns `old` into `new`; `None` when they are equal.
pub fn diff(old: &Value, new: &Value) -> Option<Value> {
    if old == new {
        return None;
    }
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut patch = Map::new();
            for (k, nv) in n {
                match o.get(k) {
                    None => {
                        patch.insert(k.clone(), nv.clone());
                    }
                    Some(ov) if ov == nv => {}
                    Some(ov) => match (ov, nv) {
                        (Value::Array(oa), Value::Array(na)) => {
                            for (pk, pv) in list_diff(k, oa, na) {
                                patch.insert(pk, pv);
                            }
                        }
                        (Value::Object(_), Value::Object(_)) => {
                            if let Some(d) = diff(ov, nv) {
                                patch.insert(k.clone(), d);
                            }
                        }
                        _ => {
                            patch.insert(k.clone(), nv.clone());
                        }
                    },
                }
            }
            for k in o.keys() {
                if !n.contains_key(k) {
                    patch.insert(k.clone(), Value::Null);
                }
            }
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        _ => Some(new.clone()),
    }
}

/// The entries a changed list contributes to its parent's patch.
fn list_diff(field: &str, old: &[Value], new: &[Value]) -> Vec<(String, Value)> {
    match list_patch(field) {
        ListPatch::Replace => vec![(field.to_owned(), Value::Array(new.to_vec()))],
        ListPatch::ReplaceDirective => {
            let mut items = vec![serde_json::json!({"$patch": "replace"})];
            items.extend(new.iter().cloned());
            vec![(field.to_owned(), Value::Array(items))]
        }
        ListPatch::MergeByKey(key) => {
            let mut items = vec![];
            for n in new {
                let k = n.get(key);
                match old.iter().find(|o| o.get(key) == k) {
                    Some(o) if o == n => {}
                    Some(o) => {
                        if let Some(Value::Object(mut d)) = diff(o, n) {
                            if let Some(k) = k {
                                d.insert(key.to_owned(), k.clone());
                            }
                            items.push(Value::Object(d));
                        }
                    }
                    None => items.push(n.clone()),
                }
            }
            for o in old {
                let k = o.get(key);
                if !new.iter().any(|n| n.get(key) == k) {
                    let mut d = Map::new();
                    if let Some(k) = k {
                        d.insert(key.to_owned(), k.clone());
                    }
                    d.insert("$patch".into(), "delete".into());
                    items.push(Value::Object(d));
                }
            }
            let order: Vec<Value> =
                new.iter().filter_map(|n| n.get(key).map(|k| serde_json::json!({ key: k }))).collect();
            vec![(format!("$setElementOrder/{field}"), Value::Array(order)), (field.to_owned(), Value::Array(items))]
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn diff_table() {
        let cases = [
            ("equal", json!({"a": 1}), json!({"a": 1}), None),
            ("scalar change", json!({"a": 1, "b": 2}), json!({"a": 1, "b": 3}), Some(json!({"b": 3}))),
            ("removed key", json!({"a": {"x": 1, "y": 2}}), json!({"a": {"x": 1}}), Some(json!({"a": {"y": null}}))),
            (
                "conditions by type, heartbeat only",
                json!({"conditions": [{"type": "Ready", "status": "True", "t": 1}, {"type": "M", "status": "False", "t": 1}]}),
                json!({"conditions": [{"type": "Ready", "status": "True", "t": 2}, {"type": "M", "status": "False", "t": 1}]}),
                Some(
                    json!({"$setElementOrder/conditions": [{"type": "Ready"}, {"type": "M"}], "conditions": [{"type": "Ready", "t": 2}]}),
                ),
            ),
            (
                "removed condition",
                json!({"conditions": [{"type": "A"}, {"type": "B"}]}),
                json!({"conditions": [{"type": "A"}]}),
                Some(
                    json!({"$setElementOrder/conditions": [{"type": "A"}], "conditions": [{"type": "B", "$patch": "delete"}]}),
                ),
            ),
            (
                "atomic list",
                json!({"images": [{"names": ["a"]}]}),
                json!({"images": [{"names": ["a"]}, {"names": ["b"]}]}),
                Some(json!({"images": [{"names": ["a"]}, {"names": ["b"]}]})),
            ),
            (
                "addresses replace",
                json!({"addresses": [{"type": "InternalIP", "address": "1"}]}),
                json!({"addresses": [{"type": "InternalIP", "address": "2"}, {"type": "Hostname", "address": "h"}]}),
                Some(
                    json!({"addresses": [{"$patch": "replace"}, {"type": "InternalIP", "address": "2"}, {"type": "Hostname", "address": "h"}]}),
                ),
            ),
        ];
        for (name, old, new, want) in cases {
            assert_eq!(diff(&old, &new), want, "{name}");
        }
    }
}
