//! `pods/<name>/resize`, the subresource an in-place resize goes through
//! (`kubectl patch pod X --subresource resize`): GET returns the pod; PUT
//! and PATCH (JSON, merge, strategic merge) change only the containers'
//! `resources` and `resizePolicy`, with the API server's ValidatePodResize
//! checks: only cpu and memory may change, limits and requests may not be
//! removed, requests stay within limits, the QoS class stays, resizePolicy
//! RestartContainer is refused under restartPolicy Never, and a pod that
//! finished is not resized.

use serde_json::{Value, json};

use super::{
    defaults::qos_class,
    patch,
    resources::ResourceType,
    server::State,
    store::{ApiError, ApiResult},
};

fn invalid(name: &str, detail: String) -> ApiError {
    ApiError::new(422, "Invalid", format!("Pod \"{name}\" is invalid: {detail}"))
}

/// A quantity in thousandths of a unit, for comparisons (None: unparsable).
fn milli(q: &Value) -> Option<i128> {
    let s = q.as_str().map(str::to_owned).or_else(|| q.as_i64().map(|i| i.to_string()))?;
    let (num, mult): (&str, f64) = [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("m", 0.001),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ]
    .iter()
    .find_map(|(suffix, m)| s.strip_suffix(suffix).map(|n| (n, *m)))
    .unwrap_or((s.as_str(), 1.0));
    let v: f64 = num.parse().ok()?;
    Some((v * mult * 1000.0).round() as i128)
}

/// What a resize may change of a container: its resources' cpu and memory
/// and its resizePolicy. Everything else must stay.
fn without_mutable(c: &Value) -> Value {
    let mut c = c.clone();
    if let Some(m) = c.as_object_mut() {
        m.remove("resizePolicy");
        if let Some(r) = m.get_mut("resources").and_then(Value::as_object_mut) {
            for k in ["requests", "limits"] {
                if let Some(list) = r.get_mut(k).and_then(Value::as_object_mut) {
                    list.remove("cpu");
                    list.remove("memory");
                    if list.is_empty() {
                        r.remove(k);
                    }
                }
            }
            if r.is_empty() {
                m.remove("resources");
            }
        }
    }
    c
}

fn without_containers_mutable(spec: &Value) -> Value {
    let mut spec = spec.clone();
    for f in ["containers", "initContainers"] {
        if let Some(cs) = spec.get_mut(f).and_then(Value::as_array_mut) {
            for c in cs.iter_mut() {
                *c = without_mutable(c);
            }
        }
    }
    spec
}

/// The API server's ValidatePodResize.
pub fn validate(old: &Value, new: &Value) -> ApiResult<()> {
    let name = old.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    let phase = old.pointer("/status/phase").and_then(Value::as_str).unwrap_or("");
    if matches!(phase, "Succeeded" | "Failed") {
        return Err(invalid(name, "spec: Forbidden: Pod resize may not be done on a terminated pod".into()));
    }
    let (old_spec, new_spec) = (&old["spec"], &new["spec"]);
    if without_containers_mutable(old_spec) != without_containers_mutable(new_spec) {
        return Err(invalid(name, "spec: Forbidden: only cpu and memory resources are mutable".into()));
    }
    let never = new_spec["restartPolicy"] == "Never";
    for f in ["containers", "initContainers"] {
        let olds = old_spec.get(f).and_then(Value::as_array).cloned().unwrap_or_default();
        let news = new_spec.get(f).and_then(Value::as_array).cloned().unwrap_or_default();
        for (i, (o, n)) in olds.iter().zip(&news).enumerate() {
            let path = format!("spec.{f}[{i}]");
            if f == "initContainers" && n["restartPolicy"] != "Always" && o["resources"] != n["resources"] {
                return Err(invalid(
                    name,
                    format!("{path}.resources: Forbidden: resources for non-sidecar init containers are immutable"),
                ));
            }
            for (k, what) in [("limits", "limits"), ("requests", "requests")] {
                for r in ["cpu", "memory"] {
                    let had = o.pointer(&format!("/resources/{k}/{r}")).is_some();
                    let has = n.pointer(&format!("/resources/{k}/{r}")).is_some();
                    if had && !has {
                        return Err(invalid(
                            name,
                            format!("{path}.resources.{k}[{r}]: Forbidden: resource {what} cannot be removed"),
                        ));
                    }
                }
            }
            for r in ["cpu", "memory"] {
                let (req, lim) =
                    (n.pointer(&format!("/resources/requests/{r}")), n.pointer(&format!("/resources/limits/{r}")));
                if let (Some(req), Some(lim)) = (req, lim)
                    && milli(req) > milli(lim)
                {
                    return Err(invalid(
                        name,
                        format!(
                            "{path}.resources.requests: Invalid value: {}: must be less than or equal to {r} limit of {}",
                            req.as_str().map_or(req.to_string(), |s| format!("\"{s}\"")),
                            lim.as_str().unwrap_or("")
                        ),
                    ));
                }
            }
            if never
                && n["resizePolicy"]
                    .as_array()
                    .is_some_and(|ps| ps.iter().any(|p| p["restartPolicy"] == "RestartContainer"))
            {
                return Err(invalid(
                    name,
                    format!(
                        "{path}.resizePolicy: Invalid value: \"RestartContainer\": must be 'NotRequired' when \
                         `restartPolicy` is 'Never'"
                    ),
                ));
            }
        }
    }
    let (was, will) = (qos_class(old_spec), qos_class(new_spec));
    if was != will {
        return Err(invalid(
            name,
            format!("spec: Invalid value: \"{will}\": Pod QOS Class may not change as a result of resizing"),
        ));
    }
    Ok(())
}

/// The spec a resize request asks for.
fn requested(current: &Value, method: &http::Method, content_type: &str, body: &Value) -> ApiResult<Value> {
    match *method {
        http::Method::PUT => Ok(body.clone()),
        http::Method::PATCH => {
            let kind = patch::kind_of(content_type)?;
            patch::apply(kind, current, body).map_err(|e| ApiError::new(422, "Invalid", e))
        }
        ref m => Err(ApiError::new(405, "MethodNotAllowed", format!("{m} is not supported on pods/resize"))),
    }
}

pub fn serve(
    state: &State,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    method: &http::Method,
    content_type: &str,
    body: Value,
) -> ApiResult<Value> {
    let current = state.store.get(rt, ns, name)?;
    if *method == http::Method::GET {
        return Ok(current);
    }
    let wanted = requested(&current, method, content_type, &body)?;
    validate(&current, &wanted)?;
    // Only the containers' resources and resizePolicy are taken.
    let mut spec = current["spec"].clone();
    for f in ["containers", "initContainers"] {
        let news = wanted["spec"].get(f).and_then(Value::as_array).cloned().unwrap_or_default();
        if let Some(cs) = spec.get_mut(f).and_then(Value::as_array_mut) {
            for (c, n) in cs.iter_mut().zip(&news) {
                for k in ["resources", "resizePolicy"] {
                    match n.get(k) {
                        Some(v) => c[k] = v.clone(),
                        None => {
                            if let Some(m) = c.as_object_mut() {
                                m.remove(k);
                            }
                        }
                    }
                }
            }
        }
    }
    let rv = if *method == http::Method::PUT { wanted["metadata"]["resourceVersion"].clone() } else { json!(null) };
    let mut obj = current.clone();
    if !rv.is_null() {
        obj["metadata"]["resourceVersion"] = rv;
    }
    state.store.update(rt, ns, name, obj, move |old: &Value, new: &mut Value| {
        *new = old.clone();
        new["spec"] = spec;
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(requests: Value, limits: Value, policy: &str) -> Value {
        json!({
            "metadata": {"name": "web"},
            "spec": {"restartPolicy": policy, "containers": [{
                "name": "app", "image": "busybox",
                "resources": {"requests": requests, "limits": limits},
            }]},
            "status": {"phase": "Running"},
        })
    }

    #[test]
    fn validation_table() {
        let burstable =
            pod(json!({"cpu": "100m", "memory": "32Mi"}), json!({"cpu": "200m", "memory": "64Mi"}), "Always");
        let patched = |p: Value| patch::apply(patch::PatchKind::Strategic, &burstable, &p).unwrap();
        let resources = |r: Value| json!({"spec": {"containers": [{"name": "app", "resources": r}]}});
        let cases: Vec<(&str, Value, Option<&str>)> = vec![
            ("grow both", patched(resources(json!({"requests": {"cpu": "200m"}, "limits": {"cpu": "400m"}}))), None),
            (
                "to Guaranteed",
                patched(resources(json!({"requests": {"cpu": "200m", "memory": "64Mi"}}))),
                Some("Pod QOS Class may not change as a result of resizing"),
            ),
            (
                "a limit removed",
                patched(resources(json!({"limits": {"memory": null}}))),
                Some("spec.containers[0].resources.limits[memory]: Forbidden: resource limits cannot be removed"),
            ),
            (
                "request over limit",
                patched(resources(json!({"requests": {"cpu": "500m"}}))),
                Some("must be less than or equal to cpu limit of 200m"),
            ),
            (
                "the image",
                patched(json!({"spec": {"containers": [{"name": "app", "image": "nginx"}]}})),
                Some("only cpu and memory resources are mutable"),
            ),
            (
                "ephemeral storage",
                patched(resources(json!({"requests": {"ephemeral-storage": "1Gi"}}))),
                Some("only cpu and memory resources are mutable"),
            ),
        ];
        for (name, new, want) in cases {
            let got = validate(&burstable, &new);
            match want {
                None => assert!(got.is_ok(), "{name}: {:?}", got.err().map(|e| e.message)),
                Some(w) => {
                    let e = got.expect_err(name).message;
                    assert!(e.contains(w) && e.starts_with("Pod \"web\" is invalid: "), "{name}: {e}");
                }
            }
        }
        let never = pod(json!({"cpu": "100m"}), json!({"cpu": "200m"}), "Never");
        let mut restart = never.clone();
        restart["spec"]["containers"][0]["resizePolicy"] =
            json!([{"resourceName": "cpu", "restartPolicy": "RestartContainer"}]);
        assert!(validate(&never, &restart).unwrap_err().message.contains("must be 'NotRequired'"));
        let mut done = burstable.clone();
        done["status"]["phase"] = "Succeeded".into();
        assert!(validate(&done, &burstable).unwrap_err().message.contains("terminated pod"));
    }
}
