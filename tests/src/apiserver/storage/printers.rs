//! The API server's printers (the Table columns kubectl shows) for
//! PersistentVolumes, PersistentVolumeClaims, StorageClasses, CSIDrivers,
//! CSINodes and VolumeAttachments.

use serde_json::{Value, json};

use super::objects::{ANN_DEFAULT_CLASS, access_modes, access_modes_short, annotation, claim_class, s, volume_class};
use crate::apiserver::table::{Column, NAME, age, col};

type Row = (Vec<Column>, Vec<Value>);

fn or_unset(v: &str) -> String {
    if v.is_empty() { "<unset>".into() } else { v.to_owned() }
}

/// A quantity as printed: as stored ("" when absent).
fn quantity(obj: &Value, pointer: &str) -> String {
    match obj.pointer(pointer) {
        Some(Value::String(q)) => q.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

fn phase(obj: &Value) -> String {
    if obj.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null()) {
        "Terminating".into()
    } else {
        s(obj, "/status/phase").to_owned()
    }
}

pub fn pv_row(pv: &Value) -> Row {
    let claim = match pv.pointer("/spec/claimRef").filter(|r| r.is_object()) {
        Some(r) => format!("{}/{}", s(r, "/namespace"), s(r, "/name")),
        None => String::new(),
    };
    let cols = vec![
        NAME,
        col("Capacity", "string", 0),
        col("Access Modes", "string", 0),
        col("Reclaim Policy", "string", 0),
        col("Status", "string", 0),
        col("Claim", "string", 0),
        col("StorageClass", "string", 0),
        col("VolumeAttributesClass", "string", 0),
        col("Reason", "string", 0),
        col("Age", "string", 0),
        col("VolumeMode", "string", 1),
    ];
    let cells = vec![
        json!(s(pv, "/metadata/name")),
        json!(quantity(pv, "/spec/capacity/storage")),
        json!(access_modes_short(&access_modes(pv, "/spec/accessModes"))),
        json!(s(pv, "/spec/persistentVolumeReclaimPolicy")),
        json!(phase(pv)),
        json!(claim),
        json!(volume_class(pv)),
        json!(or_unset(s(pv, "/spec/volumeAttributesClassName"))),
        json!(s(pv, "/status/reason")),
        json!(age(pv, "/metadata/creationTimestamp")),
        json!(or_unset(s(pv, "/spec/volumeMode"))),
    ];
    (cols, cells)
}

pub fn pvc_row(pvc: &Value) -> Row {
    // Capacity and access modes are the bound volume's, shown once bound.
    let bound = !s(pvc, "/spec/volumeName").is_empty();
    let (capacity, modes) = if bound {
        (quantity(pvc, "/status/capacity/storage"), access_modes_short(&access_modes(pvc, "/status/accessModes")))
    } else {
        (String::new(), String::new())
    };
    let cols = vec![
        NAME,
        col("Status", "string", 0),
        col("Volume", "string", 0),
        col("Capacity", "string", 0),
        col("Access Modes", "string", 0),
        col("StorageClass", "string", 0),
        col("VolumeAttributesClass", "string", 0),
        col("Age", "string", 0),
        col("VolumeMode", "string", 1),
    ];
    let cells = vec![
        json!(s(pvc, "/metadata/name")),
        json!(phase(pvc)),
        json!(s(pvc, "/spec/volumeName")),
        json!(capacity),
        json!(modes),
        json!(claim_class(pvc)),
        json!(or_unset(s(pvc, "/spec/volumeAttributesClassName"))),
        json!(age(pvc, "/metadata/creationTimestamp")),
        json!(or_unset(s(pvc, "/spec/volumeMode"))),
    ];
    (cols, cells)
}

pub fn storage_class_row(sc: &Value) -> Row {
    let mut name = s(sc, "/metadata/name").to_owned();
    if matches!(annotation(sc, ANN_DEFAULT_CLASS), Some("true")) {
        name.push_str(" (default)");
    }
    let or = |v: &str, d: &str| if v.is_empty() { d.to_owned() } else { v.to_owned() };
    let cols = vec![
        NAME,
        col("Provisioner", "string", 0),
        col("ReclaimPolicy", "string", 0),
        col("VolumeBindingMode", "string", 0),
        col("AllowVolumeExpansion", "string", 0),
        col("Age", "string", 0),
    ];
    let cells = vec![
        json!(name),
        json!(s(sc, "/provisioner")),
        json!(or(s(sc, "/reclaimPolicy"), "Delete")),
        json!(or(s(sc, "/volumeBindingMode"), "Immediate")),
        json!(sc.get("allowVolumeExpansion").and_then(Value::as_bool).unwrap_or(false)),
        json!(age(sc, "/metadata/creationTimestamp")),
    ];
    (cols, cells)
}

pub fn csi_driver_row(d: &Value) -> Row {
    let flag = |f: &str, default: bool| d.pointer(&format!("/spec/{f}")).and_then(Value::as_bool).unwrap_or(default);
    let audiences: Vec<String> = d
        .pointer("/spec/tokenRequests")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|t| s(t, "/audience").to_owned()).collect())
        .unwrap_or_default();
    let modes = access_modes(d, "/spec/volumeLifecycleModes");
    let cols = vec![
        NAME,
        col("AttachRequired", "boolean", 0),
        col("PodInfoOnMount", "boolean", 0),
        col("StorageCapacity", "boolean", 0),
        col("TokenRequests", "string", 0),
        col("RequiresRepublish", "boolean", 0),
        col("Modes", "string", 0),
        col("Age", "string", 0),
    ];
    let cells = vec![
        json!(s(d, "/metadata/name")),
        json!(flag("attachRequired", true)),
        json!(flag("podInfoOnMount", false)),
        json!(flag("storageCapacity", false)),
        json!(if audiences.is_empty() { "<unset>".to_owned() } else { audiences.join(",") }),
        json!(flag("requiresRepublish", false)),
        json!(if modes.is_empty() { "<none>".to_owned() } else { modes.join(",") }),
        json!(age(d, "/metadata/creationTimestamp")),
    ];
    (cols, cells)
}

pub fn csi_node_row(n: &Value) -> Row {
    let drivers = n.pointer("/spec/drivers").and_then(Value::as_array).map_or(0, Vec::len);
    (
        vec![NAME, col("Drivers", "integer", 0), col("Age", "string", 0)],
        vec![json!(s(n, "/metadata/name")), json!(drivers), json!(age(n, "/metadata/creationTimestamp"))],
    )
}

pub fn volume_attachment_row(va: &Value) -> Row {
    (
        vec![
            NAME,
            col("Attacher", "string", 0),
            col("PV", "string", 0),
            col("Node", "string", 0),
            col("Attached", "boolean", 0),
            col("Age", "string", 0),
        ],
        vec![
            json!(s(va, "/metadata/name")),
            json!(s(va, "/spec/attacher")),
            json!(s(va, "/spec/source/persistentVolumeName")),
            json!(s(va, "/spec/nodeName")),
            json!(va.pointer("/status/attached").and_then(Value::as_bool).unwrap_or(false)),
            json!(age(va, "/metadata/creationTimestamp")),
        ],
    )
}
