//! Whether a PersistentVolume may be used on this node: its
//! `spec.nodeAffinity.required` node selector against the node's labels,
//! as the kubelet checks local volumes before mounting them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, PersistentVolume};

/// `Ok` when the PV has no required node affinity or one of its terms
/// matches `labels`; otherwise the kubelet's reason.
pub fn check_node_affinity(pv: &PersistentVolume, labels: &BTreeMap<String, String>) -> Result<(), String> {
    let Some(required) = pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()).and_then(|a| a.required.as_ref())
    else {
        return Ok(());
    };
    if selector_matches(required, labels)? { Ok(()) } else { Err("no matching NodeSelectorTerms".into()) }
}

/// A node selector: any of its terms; a term is all of its expressions
/// (an empty term matches nothing, as upstream). Field expressions name
/// `metadata.name` only, which the caller folds into the labels as
/// `metadata.name`.
pub fn selector_matches(selector: &NodeSelector, labels: &BTreeMap<String, String>) -> Result<bool, String> {
    for term in &selector.node_selector_terms {
        let exprs = term.match_expressions.iter().flatten();
        let fields = term.match_fields.iter().flatten();
        let mut any = false;
        let mut all = true;
        for r in exprs {
            any = true;
            all &= requirement_matches(r, labels.get(&r.key).map(String::as_str))?;
        }
        for r in fields {
            any = true;
            if r.key != "metadata.name" {
                return Err(format!("not a valid field selector key: {:?}", r.key));
            }
            all &= requirement_matches(r, labels.get("metadata.name").map(String::as_str))?;
        }
        if any && all {
            return Ok(true);
        }
    }
    Ok(false)
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> Result<bool, String> {
    let values = r.values.as_deref().unwrap_or(&[]);
    let number = |s: &str| s.parse::<i64>().map_err(|_| format!("{:?}: {s:?} is not an integer", r.operator));
    Ok(match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let [bound] = values else {
                return Err(format!("{} needs exactly one value, got {}", r.operator, values.len()));
            };
            let bound = number(bound)?;
            match value.map(number) {
                None => false,
                Some(Err(_)) => false,
                Some(Ok(v)) if r.operator == "Gt" => v > bound,
                Some(Ok(v)) => v < bound,
            }
        }
        other => return Err(format!("{other:?} is not a valid node selector operator")),
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeSelectorTerm, PersistentVolumeSpec, VolumeNodeAffinity};

    use super::*;

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|s| s.to_string()).collect()),
        }
    }

    fn pv(terms: Vec<Vec<NodeSelectorRequirement>>) -> PersistentVolume {
        PersistentVolume {
            spec: Some(PersistentVolumeSpec {
                node_affinity: Some(VolumeNodeAffinity {
                    required: Some(NodeSelector {
                        node_selector_terms: terms
                            .into_iter()
                            .map(|e| NodeSelectorTerm { match_expressions: Some(e), match_fields: None })
                            .collect(),
                    }),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn operators_and_terms() {
        let labels: BTreeMap<String, String> = [("kubernetes.io/hostname", "node-a"), ("zone", "z1"), ("cores", "8")]
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        type Terms = Vec<Vec<NodeSelectorRequirement>>;
        let cases: Vec<(Terms, Result<(), &str>)> = vec![
            (vec![vec![req("kubernetes.io/hostname", "In", &["node-a"])]], Ok(())),
            (vec![vec![req("kubernetes.io/hostname", "In", &["node-b"])]], Err("no matching NodeSelectorTerms")),
            // Terms are ORed, expressions ANDed.
            (vec![vec![req("kubernetes.io/hostname", "In", &["node-b"])], vec![req("zone", "In", &["z1"])]], Ok(())),
            (
                vec![vec![req("zone", "In", &["z1"]), req("kubernetes.io/hostname", "NotIn", &["node-a"])]],
                Err("no matching NodeSelectorTerms"),
            ),
            (vec![vec![req("zone", "Exists", &[]), req("gpu", "DoesNotExist", &[])]], Ok(())),
            (vec![vec![req("cores", "Gt", &["4"]), req("cores", "Lt", &["16"])]], Ok(())),
            (vec![vec![req("cores", "Gt", &["8"])]], Err("no matching NodeSelectorTerms")),
            // An empty term matches nothing.
            (vec![vec![]], Err("no matching NodeSelectorTerms")),
            (vec![vec![req("zone", "Near", &["z1"])]], Err("\"Near\" is not a valid node selector operator")),
            (vec![vec![req("cores", "Gt", &["many"])]], Err("\"Gt\": \"many\" is not an integer")),
        ];
        for (terms, want) in cases {
            let got = check_node_affinity(&pv(terms.clone()), &labels);
            assert_eq!(got.as_ref().map(|_| ()).map_err(String::as_str), want, "{terms:?}");
        }
        assert_eq!(check_node_affinity(&PersistentVolume::default(), &labels), Ok(()));
    }
}
