//! The admission plugins whose work the kubelet sees in a pod, as a
//! cluster's API server applies them on create: ServiceAccount (the
//! account's imagePullSecrets copied into a pod that has none) and
//! RuntimeClass (the class's overhead.podFixed set as spec.overhead; a
//! pod naming a class that does not exist is refused).

use serde_json::{Value, json};

use super::{
    resources::{RUNTIME_CLASSES, SERVICE_ACCOUNTS},
    store::{ApiError, Store},
};

pub fn pod(store: &Store, namespace: &str, obj: &mut Value) -> Result<(), ApiError> {
    let spec = &mut obj["spec"];
    let sa = spec.get("serviceAccountName").and_then(Value::as_str).unwrap_or("default").to_owned();
    let has_secrets = spec.get("imagePullSecrets").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
    if !has_secrets
        && let Ok(account) = store.get(&SERVICE_ACCOUNTS, namespace, &sa)
        && let Some(secrets) = account.get("imagePullSecrets").filter(|s| s.as_array().is_some_and(|a| !a.is_empty()))
    {
        spec["imagePullSecrets"] = secrets.clone();
    }
    if let Some(class) = spec.get("runtimeClassName").and_then(Value::as_str).filter(|c| !c.is_empty()) {
        let rc = store.get(&RUNTIME_CLASSES, "", class).map_err(|_| {
            ApiError::new(403, "Forbidden", format!("pod rejected: RuntimeClass \"{class}\" not found"))
        })?;
        if let Some(fixed) = rc.pointer("/overhead/podFixed")
            && spec.get("overhead").is_none_or(Value::is_null)
        {
            spec["overhead"] = fixed.clone();
        }
    }
    if spec.get("overhead").is_some_and(|o| o.as_object().is_some_and(|m| m.is_empty())) {
        spec["overhead"] = json!(null);
    }
    Ok(())
}
