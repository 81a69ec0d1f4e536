//! What the API server does to storage objects on the way in: defaults
//! (SetDefaults_*), the status a new PV or PVC starts with, the
//! DefaultStorageClass admission plugin, the validation of a claim's
//! update (422 Invalid) and the PersistentVolumeClaimResize admission
//! plugin (403 Forbidden).

use serde_json::{Map, Value, json};

use super::{
    objects::{ANN_BETA_STORAGE_CLASS, ANN_DEFAULT_CLASS, annotation, name, s},
    quantity,
};
use crate::apiserver::{
    resources::{CSIDRIVERS, PVCS, PVS, ResourceType, STORAGE_CLASSES},
    store::{ApiError, ApiResult, Store},
};

/// The volume sources a PV may have (one is required).
const PV_SOURCES: &[&str] = &[
    "hostPath",
    "local",
    "csi",
    "nfs",
    "iscsi",
    "fc",
    "rbd",
    "cephfs",
    "cinder",
    "flexVolume",
    "azureFile",
    "azureDisk",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "vsphereVolume",
    "glusterfs",
    "flocker",
    "quobyte",
    "portworxVolume",
    "scaleIO",
    "storageos",
    "photonPersistentDisk",
];

fn default(obj: &mut Value, field: &str, v: Value) {
    if obj.get(field).is_none_or(Value::is_null) {
        obj[field] = v;
    }
}

fn ensure_spec(obj: &mut Value) {
    if !obj.get("spec").is_some_and(Value::is_object) {
        obj["spec"] = json!({});
    }
}

fn invalid(kind: &str, obj: &Value, errors: &[String]) -> ApiError {
    let what = match errors {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    ApiError::new(422, "Invalid", format!("{kind} \"{}\" is invalid: {what}", name(obj)))
}

fn apply_defaults(rt: &ResourceType, obj: &mut Value) {
    ensure_spec(obj);
    let spec = &mut obj["spec"];
    match rt.kind {
        "PersistentVolumeClaim" => default(spec, "volumeMode", "Filesystem".into()),
        "PersistentVolume" => {
            default(spec, "persistentVolumeReclaimPolicy", "Retain".into());
            default(spec, "volumeMode", "Filesystem".into());
            if let Some(hp) = spec.get_mut("hostPath").filter(|h| h.is_object()) {
                default(hp, "type", "".into());
            }
        }
        "CSIDriver" => {
            default(spec, "attachRequired", true.into());
            default(spec, "podInfoOnMount", false.into());
            default(spec, "requiresRepublish", false.into());
            default(spec, "storageCapacity", false.into());
            default(spec, "seLinuxMount", false.into());
            default(spec, "fsGroupPolicy", "ReadWriteOnceWithFSType".into());
            default(spec, "volumeLifecycleModes", json!(["Persistent"]));
        }
        _ => {}
    }
}

/// Whether `rt` is one of the kinds this module defaults and checks.
pub fn applies_to(rt: &ResourceType) -> bool {
    [PVCS.kind, PVS.kind, STORAGE_CLASSES.kind, CSIDRIVERS.kind].contains(&rt.kind)
}

/// On create: defaults, validation, the starting status, and the default
/// class for a claim that names none.
pub fn on_create(store: &Store, rt: &ResourceType, obj: &mut Value) -> ApiResult<()> {
    if !applies_to(rt) {
        return Ok(());
    }
    if rt.kind == STORAGE_CLASSES.kind {
        default(obj, "reclaimPolicy", "Delete".into());
        default(obj, "volumeBindingMode", "Immediate".into());
        if s(obj, "/provisioner").is_empty() {
            return Err(invalid(rt.kind, obj, &["provisioner: Required value".into()]));
        }
        return Ok(());
    }
    apply_defaults(rt, obj);
    let mut errors = vec![];
    let no_modes = obj.pointer("/spec/accessModes").and_then(Value::as_array).is_none_or(Vec::is_empty);
    match rt.kind {
        "PersistentVolumeClaim" => {
            if no_modes {
                errors.push("spec.accessModes: Required value: at least 1 access mode is required".to_owned());
            }
            match obj.pointer("/spec/resources/requests/storage") {
                None => errors.push("spec.resources[storage]: Required value".to_owned()),
                Some(q) if quantity::value_bytes(q).is_none() => {
                    errors.push(format!("spec.resources.requests[storage]: Invalid value: {q}: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"));
                }
                Some(_) => {}
            }
            // DefaultStorageClass: a claim naming no class gets the default one.
            if obj.pointer("/spec/storageClassName").is_none_or(Value::is_null)
                && annotation(obj, ANN_BETA_STORAGE_CLASS).is_none()
                && let Some(class) = default_class(store)
            {
                obj["spec"]["storageClassName"] = class.into();
            }
            obj["status"] = json!({"phase": "Pending"});
        }
        "PersistentVolume" => {
            if obj.pointer("/spec/capacity/storage").is_none() {
                errors.push("spec.capacity: Required value".to_owned());
            }
            if no_modes {
                errors.push("spec.accessModes: Required value: at least 1 access mode is required".to_owned());
            }
            let spec = &obj["spec"];
            if !PV_SOURCES.iter().any(|k| spec.get(*k).is_some_and(|v| !v.is_null())) {
                errors.push("spec: Required value: must specify a volume type".to_owned());
            }
            obj["status"] = json!({"phase": "Pending"});
        }
        _ => {}
    }
    if errors.is_empty() { Ok(()) } else { Err(invalid(rt.kind, obj, &errors)) }
}

/// The class marked default (the newest one when several are).
pub fn default_class(store: &Store) -> Option<String> {
    let (classes, _) = store.list(&STORAGE_CLASSES, None);
    classes
        .iter()
        .filter(|c| annotation(c, ANN_DEFAULT_CLASS) == Some("true"))
        .max_by_key(|c| s(c, "/metadata/creationTimestamp").to_owned())
        .map(|c| name(c).to_owned())
}

/// JSON without nulls (a null field is an absent one).
fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            Value::Object(m.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), strip_nulls(v))).collect())
        }
        Value::Array(a) => Value::Array(a.iter().map(strip_nulls).collect()),
        other => other.clone(),
    }
}

fn remove(spec: &mut Value, path: &[&str]) {
    let Some((last, parents)) = path.split_last() else { return };
    let mut at = spec;
    for p in parents {
        match at.get_mut(*p) {
            Some(next) => at = next,
            None => return,
        }
    }
    if let Some(m) = at.as_object_mut() {
        m.remove(*last);
    }
}

/// On update of the main resource (`sub` None): the claim's validation
/// and the resize admission. Status updates are not checked.
pub fn on_update(store: &Store, rt: &ResourceType, sub: Option<&str>, old: &Value, new: &mut Value) -> ApiResult<()> {
    if !applies_to(rt) || sub.is_some() {
        return Ok(());
    }
    if rt.kind == STORAGE_CLASSES.kind {
        default(new, "reclaimPolicy", "Delete".into());
        default(new, "volumeBindingMode", "Immediate".into());
        return Ok(());
    }
    apply_defaults(rt, new);
    if rt.kind != PVCS.kind {
        return Ok(());
    }
    // ValidatePersistentVolumeClaimUpdate; the status is the stored one.
    let bound = s(old, "/status/phase") == "Bound";
    let mut old_spec = strip_nulls(old.get("spec").unwrap_or(&Value::Null));
    let mut new_spec = strip_nulls(new.get("spec").unwrap_or(&Value::Null));
    // The PV controller sets volumeName once.
    if s(old, "/spec/volumeName").is_empty() {
        match new_spec.get("volumeName") {
            Some(v) => old_spec["volumeName"] = v.clone(),
            None => remove(&mut old_spec, &["volumeName"]),
        }
    }
    // A class may be set on a claim that had none.
    if old.pointer("/spec/storageClassName").is_none_or(Value::is_null) {
        remove(&mut new_spec, &["storageClassName"]);
        remove(&mut old_spec, &["storageClassName"]);
    }
    if bound {
        for spec in [&mut old_spec, &mut new_spec] {
            remove(spec, &["resources", "requests", "storage"]);
            remove(spec, &["volumeAttributesClassName"]);
            // `requests: {}` left behind is the same as none.
            if spec.pointer("/resources/requests").and_then(Value::as_object).is_some_and(Map::is_empty) {
                remove(spec, &["resources", "requests"]);
            }
            if spec.pointer("/resources").and_then(Value::as_object).is_some_and(Map::is_empty) {
                remove(spec, &["resources"]);
            }
        }
    }
    let mut errors = vec![];
    if old_spec != new_spec {
        errors.push(
            "spec: Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"
                .to_owned(),
        );
    }
    let size = |v: &Value| v.pointer("/spec/resources/requests/storage").and_then(quantity::value_bytes);
    let (old_size, new_size) = (size(old), size(new));
    let status_size = old.pointer("/status/capacity/storage").and_then(quantity::value_bytes).unwrap_or(0);
    // RecoverVolumeExpansionFailure (on by default): a request may go down
    // again, but not to the capacity already there.
    if let (Some(o), Some(n)) = (old_size, new_size)
        && n < o
        && n <= status_size
    {
        errors.push("spec.resources.requests.storage: Forbidden: field can not be less than status.capacity".into());
    }
    if !errors.is_empty() {
        return Err(invalid(rt.kind, old, &errors));
    }
    // PersistentVolumeClaimResize: growing needs a class that allows it.
    if let (Some(o), Some(n)) = (old_size, new_size)
        && n > o
    {
        let class = super::objects::claim_class(new);
        let allowed = !class.is_empty()
            && class == super::objects::claim_class(old)
            && store
                .get(&STORAGE_CLASSES, "", class)
                .is_ok_and(|c| c.get("allowVolumeExpansion").and_then(Value::as_bool) == Some(true));
        if !allowed {
            return Err(ApiError::new(
                403,
                "Forbidden",
                format!(
                    "persistentvolumeclaims \"{}\" is forbidden: only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize",
                    name(old)
                ),
            ));
        }
    }
    Ok(())
}
