//! `pods/<name>/ephemeralcontainers`, the subresource `kubectl debug`
//! adds a container through: since 1.22 a Pod (a strategic merge patch or
//! an update of the whole pod, of which only `spec.ephemeralContainers`
//! is taken); before, the `EphemeralContainers` kind (kubectl 1.20 reads
//! it, appends, and writes it back). Existing ephemeral containers cannot
//! be changed or removed, as the API server's validation says.

use serde_json::{Value, json};

use super::{
    patch,
    resources::ResourceType,
    server::State,
    store::{ApiError, ApiResult},
};

fn legacy(pod: &Value) -> Value {
    json!({
        "kind": "EphemeralContainers",
        "apiVersion": "v1",
        "metadata": pod["metadata"].clone(),
        "ephemeralContainers": pod.pointer("/spec/ephemeralContainers").cloned().unwrap_or(json!([])),
    })
}

/// The new list, checked against the old one.
fn checked(old: &Value, new: Value) -> ApiResult<Value> {
    let old = old.as_array().cloned().unwrap_or_default();
    let new_list = new.as_array().cloned().unwrap_or_default();
    for o in &old {
        match new_list.iter().find(|n| n["name"] == o["name"]) {
            Some(n) if n == o => {}
            _ => {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    format!(
                        "Pod spec.ephemeralContainers[{}]: Forbidden: existing ephemeral containers may not be changed",
                        o["name"]
                    ),
                ));
            }
        }
    }
    Ok(Value::Array(new_list))
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
    let wants_legacy = body["kind"] == "EphemeralContainers";
    let list = match *method {
        http::Method::GET => return Ok(legacy(&current)),
        http::Method::PUT if wants_legacy => body["ephemeralContainers"].clone(),
        http::Method::PUT => body.pointer("/spec/ephemeralContainers").cloned().unwrap_or(json!([])),
        http::Method::PATCH => {
            let kind = patch::kind_of(content_type)?;
            let base = if body.get("ephemeralContainers").is_some() { legacy(&current) } else { current.clone() };
            let patched = patch::apply(kind, &base, &body).map_err(|e| ApiError::new(422, "Invalid", e))?;
            patched
                .get("ephemeralContainers")
                .or_else(|| patched.pointer("/spec/ephemeralContainers"))
                .cloned()
                .unwrap_or(json!([]))
        }
        ref m => {
            return Err(ApiError::new(
                405,
                "MethodNotAllowed",
                format!("{m} is not supported on pods/ephemeralcontainers"),
            ));
        }
    };
    let old = current.pointer("/spec/ephemeralContainers").cloned().unwrap_or(json!([]));
    let mut list = checked(&old, list)?;
    // The API server's defaults for what kubectl leaves out.
    for c in list.as_array_mut().into_iter().flatten() {
        for (k, v) in [
            ("terminationMessagePath", json!("/dev/termination-log")),
            ("terminationMessagePolicy", json!("File")),
            ("imagePullPolicy", json!("IfNotPresent")),
        ] {
            if c.get(k).is_none() {
                c[k] = v;
            }
        }
    }
    let updated = state.store.update(rt, ns, name, current, move |old: &Value, new: &mut Value| {
        *new = old.clone();
        new["spec"]["ephemeralContainers"] = list;
    })?;
    Ok(if wants_legacy { legacy(&updated) } else { updated })
}
