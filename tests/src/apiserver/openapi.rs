//! OpenAPI for kubectl, and the field validation it relies on.
//!
//! kubectl (1.27 on) asks `/openapi/v3` whether the API server validates
//! fields itself: when the PATCH operation of a kind lists the
//! `fieldValidation` query parameter, it sends `fieldValidation=Strict`
//! (its default `--validate=strict`) and leaves validation to the server;
//! otherwise it downloads `/openapi/v2` (protobuf) and validates on the
//! client, failing with `failed to download openapi` when there is none.
//! The fake serves the v3 index and, per group version, the paths of the
//! kinds it stores with their operations (`x-kubernetes-group-version-kind`,
//! `x-kubernetes-action`, the query parameters), and validates fields as
//! the API server does: an object with a field its kind does not have is
//! refused (`Strict`), or accepted with a `Warning` header (`Warn`, the
//! server's default), or accepted as it is (`Ignore`).
//!
//! Which fields a kind has is k8s-openapi's knowledge: the object is read
//! into its type and written back, and a field of the request that does
//! not come back is unknown.

use serde_json::{Map, Value, json};

use super::resources::{self, ResourceType};

/// The hash the index gives each document (kubectl caches by it; the
/// documents only change with the code).
const HASH: &str = "swiftlet-fake-1";

/// The group versions the fake serves: `api/v1`, `apis/<group>/<version>`.
fn group_versions() -> Vec<(&'static str, &'static str)> {
    let mut gvs: Vec<(&str, &str)> = resources::ALL.iter().map(|r| (r.group, r.version)).collect();
    gvs.sort();
    gvs.dedup();
    gvs
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() { format!("api/{version}") } else { format!("apis/{group}/{version}") }
}

/// GET /openapi/v3.
pub fn v3_index() -> Value {
    let paths: Map<String, Value> = group_versions()
        .into_iter()
        .map(|(g, v)| {
            let p = gv_path(g, v);
            (p.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={HASH}")}))
        })
        .collect();
    json!({ "paths": paths })
}

fn query_param(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": "string", "uniqueItems": true}})
}

/// The query parameters of a write (create, update, patch).
fn write_params(patch: bool) -> Vec<Value> {
    let mut p = vec![
        query_param("dryRun", "When present, indicates that modifications should not be persisted."),
        query_param(
            "fieldManager",
            "fieldManager is a name associated with the actor or entity that is making these changes.",
        ),
        query_param(
            "fieldValidation",
            "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields. Valid values are: Ignore, Warn (the default), Strict.",
        ),
    ];
    if patch {
        p.push(json!({"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": true}}));
    }
    p
}

fn operation(r: &ResourceType, action: &str, verb: &str, params: Vec<Value>) -> Value {
    let scope = if r.namespaced { "Namespaced" } else { "" };
    let group = r.group.split('.').next().unwrap_or("").to_owned();
    let group = group.char_indices().map(|(i, c)| if i == 0 { c.to_ascii_uppercase() } else { c }).collect::<String>();
    let version = r.version.to_owned();
    let prefix = if r.group.is_empty() { "Core".to_owned() } else { group };
    let version =
        version.char_indices().map(|(i, c)| if i == 0 { c.to_ascii_uppercase() } else { c }).collect::<String>();
    json!({
        "operationId": format!("{verb}{prefix}{version}{scope}{}", r.kind),
        "parameters": params,
        "responses": {"200": {"description": "OK"}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": r.group, "version": r.version, "kind": r.kind},
    })
}

/// GET /openapi/v3/<api/v1 | apis/group/version>: None for one the fake
/// does not serve.
pub fn v3_group_version(path: &str) -> Option<Value> {
    let (group, version) = group_versions().into_iter().find(|(g, v)| gv_path(g, v) == path.trim_matches('/'))?;
    let mut paths = Map::new();
    for r in resources::ALL.iter().filter(|r| r.group == group && r.version == version) {
        let base = format!("/{}", gv_path(r.group, r.version));
        let collection = if r.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("{base}/{}", r.plural)
        };
        if r.create_only {
            // kubectl decides where validation happens from PATCH
            // operations only, so a review (create only; a PATCH gets 405)
            // lists one too, or `kubectl create -f review.yaml` would
            // look for /openapi/v2.
            paths.insert(
                collection,
                json!({
                    "post": operation(r, "post", "create", write_params(false)),
                    "patch": operation(r, "patch", "patch", write_params(true)),
                }),
            );
            continue;
        }
        paths.insert(
            collection.clone(),
            json!({
                "get": operation(r, "list", "list", vec![]),
                "post": operation(r, "post", "create", write_params(false)),
                "delete": operation(r, "deletecollection", "deletecollection", vec![]),
            }),
        );
        paths.insert(
            format!("{collection}/{{name}}"),
            json!({
                "get": operation(r, "get", "read", vec![]),
                "put": operation(r, "put", "replace", write_params(false)),
                "patch": operation(r, "patch", "patch", write_params(true)),
                "delete": operation(r, "delete", "delete", vec![]),
            }),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.34.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

/// How unknown fields are treated (the `fieldValidation` query parameter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

impl FieldValidation {
    /// The parameter's value; absent is the API server's default, Warn.
    pub fn parse(v: Option<&str>) -> Result<FieldValidation, String> {
        match v {
            None | Some("") | Some("Warn") => Ok(FieldValidation::Warn),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some(other) => Err(format!(
                "fieldValidation: Invalid value: \"{other}\": field validation directive must be one of: Ignore, Warn, Strict"
            )),
        }
    }
}

/// `obj` read into `T` and written back.
fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(obj: &Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(obj.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(typed).map_err(|e| e.to_string())
}

/// The fields of `given` that `known` (its round trip) does not have, as
/// the API server names them (`spec.containers[0].imagee`). Strategic
/// merge directives (`$patch`, `$setElementOrder/…`) are not fields.
fn missing(given: &Value, known: &Value, at: &str, out: &mut Vec<String>) {
    match (given, known) {
        (Value::Object(g), Value::Object(k)) => {
            for (key, v) in g.iter().filter(|(k, _)| !k.starts_with('$')) {
                let path = if at.is_empty() { key.clone() } else { format!("{at}.{key}") };
                match k.get(key) {
                    Some(kv) => missing(v, kv, &path, out),
                    // A null is the same as leaving the field out.
                    None if v.is_null() => {}
                    None => out.push(path),
                }
            }
        }
        (Value::Array(g), Value::Array(k)) => {
            for (i, (gv, kv)) in g.iter().zip(k).enumerate() {
                missing(gv, kv, &format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// The unknown fields of an object of `kind` (none for a kind the fake
/// does not type), or why it cannot be read at all.
pub fn unknown_fields(kind: &str, obj: &Value) -> Result<Vec<String>, String> {
    use k8s_openapi::api::{
        certificates::v1::CertificateSigningRequest,
        coordination::v1::Lease,
        core::v1::{ConfigMap, Event, Namespace, Node, Pod},
    };
    let known = match kind {
        "Pod" => round_trip::<Pod>(obj)?,
        "Node" => round_trip::<Node>(obj)?,
        "Namespace" => round_trip::<Namespace>(obj)?,
        "ConfigMap" => round_trip::<ConfigMap>(obj)?,
        "Event" => round_trip::<Event>(obj)?,
        "Lease" => round_trip::<Lease>(obj)?,
        "CertificateSigningRequest" => round_trip::<CertificateSigningRequest>(obj)?,
        _ => return Ok(vec![]),
    };
    let mut out = vec![];
    missing(obj, &known, "", &mut out);
    Ok(out)
}

/// What a write of `obj` (a whole object, or a merge patch's body when
/// `patch`) does with unknown fields under `mode`: Ok with the warnings to
/// send (`Warn`), or the API server's error (`Strict`; an object that is
/// not one of its kind at all, whatever the mode).
pub fn check_fields(
    rt: &ResourceType,
    obj: &Value,
    mode: FieldValidation,
    patch: bool,
) -> Result<Vec<String>, super::store::ApiError> {
    let cannot = |why: String| {
        super::store::ApiError::new(
            400,
            "BadRequest",
            format!("{} in version \"{}\" cannot be handled as a {}: {why}", rt.kind, rt.version, rt.kind),
        )
    };
    let unknown = match unknown_fields(rt.kind, obj) {
        Ok(u) => u,
        // A patch is a fragment, which may lack what an object must have:
        // what it sets is checked once applied, by the store's decoding.
        Err(_) if patch => return Ok(vec![]),
        Err(e) => return Err(cannot(e)),
    };
    let messages: Vec<String> = unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect();
    match mode {
        _ if messages.is_empty() => Ok(vec![]),
        FieldValidation::Ignore => Ok(vec![]),
        FieldValidation::Warn => Ok(messages),
        FieldValidation::Strict => Err(cannot(format!("strict decoding error: {}", messages.join(", ")))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_named_as_the_api_server_names_them() {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"any": "label"}, "annotations": null},
            "spec": {"containers": [{"name": "c", "image": "busybox", "imagee": "typo"}], "nodeSelectorr": {}},
        });
        assert_eq!(
            unknown_fields("Pod", &pod).unwrap(),
            vec!["spec.containers[0].imagee".to_owned(), "spec.nodeSelectorr".to_owned()]
        );
        let ok = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                        "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"cpu": "1"}}}]}});
        assert_eq!(unknown_fields("Pod", &ok).unwrap(), Vec::<String>::new());
        assert!(unknown_fields("Pod", &json!({"spec": {"containers": "no"}})).is_err());
        assert_eq!(unknown_fields("TokenReview", &json!({"x": 1})).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn the_v3_documents_tell_kubectl_the_server_validates_fields() {
        let index = v3_index();
        let url = index["paths"]["api/v1"]["serverRelativeURL"].as_str().unwrap();
        assert!(url.starts_with("/openapi/v3/api/v1?hash="));
        assert!(index["paths"]["apis/coordination.k8s.io/v1"].is_object());
        let doc = v3_group_version("api/v1").unwrap();
        let patch = &doc["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"];
        assert_eq!(patch["x-kubernetes-group-version-kind"], json!({"group": "", "version": "v1", "kind": "Pod"}));
        assert!(patch["parameters"].as_array().unwrap().iter().any(|p| p["name"] == "fieldValidation"));
        assert_eq!(patch["operationId"], "patchCoreV1NamespacedPod");
        assert!(doc["paths"]["/api/v1/nodes/{name}"]["patch"].is_object());
        assert!(v3_group_version("apis/apps/v1").is_none());
        assert_eq!(FieldValidation::parse(None), Ok(FieldValidation::Warn));
        let typo = json!({"spec": {"containers": [{"name": "c", "imagee": "x"}]}, "$setElementOrder/containers": []});
        assert_eq!(
            check_fields(&resources::PODS, &typo, FieldValidation::Warn, true).unwrap(),
            vec!["unknown field \"spec.containers[0].imagee\"".to_owned()]
        );
        let e = check_fields(&resources::PODS, &typo, FieldValidation::Strict, true).unwrap_err();
        assert_eq!(
            e.message,
            "Pod in version \"v1\" cannot be handled as a Pod: strict decoding error: unknown field \"spec.containers[0].imagee\""
        );
        assert!(FieldValidation::parse(Some("strict")).is_err());
    }
}
