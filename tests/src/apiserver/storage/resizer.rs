//! The external-resizer: a bound claim on a CSI volume whose request grew
//! past its capacity gets ControllerExpandVolume, the PV the new size, and
//! the claim either its new capacity or, when the driver needs the node to
//! finish, the FileSystemResizePending condition the kubelet acts on.

use std::sync::Arc;

use serde_json::{Value, json};
use swiftlet::volumes::csi::api::{CapacityRange, ControllerExpandVolumeRequest};

use super::{
    Ctx, Snapshot, csi,
    events::{NORMAL, WARNING},
    objects::{deleting, name, namespace, pv_capacity_bytes, request_bytes, s, status_capacity_bytes, uid},
    quantity,
};
use crate::apiserver::{
    resources::{PVCS, PVS},
    store::now_rfc3339,
};

fn component(driver: &str) -> String {
    format!("external-resizer {driver}")
}

/// What the claim still needs from the controller side: its request is
/// above its capacity, and the volume (or the size handed to the node) is
/// below the request.
fn needs_expansion(pvc: &Value, pv: &Value) -> Option<u128> {
    let request = request_bytes(pvc)?;
    if request <= status_capacity_bytes(pvc).unwrap_or(0) {
        return None;
    }
    let allocated = pvc.pointer("/status/allocatedResources/storage").and_then(quantity::value_bytes);
    (pv_capacity_bytes(pv).unwrap_or(0) < request || allocated.is_none_or(|a| a < request)).then_some(request)
}

pub(super) fn sync(ctx: &Arc<Ctx>, snap: &Snapshot) {
    for pvc in &snap.pvcs {
        if deleting(pvc) || s(pvc, "/status/phase") != "Bound" {
            continue;
        }
        let Some(pv) = snap.pv(s(pvc, "/spec/volumeName")) else { continue };
        let driver = s(pv, "/spec/csi/driver");
        if driver.is_empty() || !ctx.drivers.has(driver) || needs_expansion(pvc, pv).is_none() {
            continue;
        }
        let (c, ns, n, u) = (ctx.clone(), namespace(pvc).to_owned(), name(pvc).to_owned(), uid(pvc).to_owned());
        ctx.spawn(format!("expand/{u}"), async move { expand(&c, &ns, &n, &u).await });
    }
}

async fn expand(ctx: &Ctx, ns: &str, claim: &str, claim_uid: &str) -> bool {
    let Ok(pvc) = ctx.store().get(&PVCS, ns, claim) else { return true };
    let Ok(pv) = ctx.store().get(&PVS, "", s(&pvc, "/spec/volumeName")) else { return true };
    if uid(&pvc) != claim_uid {
        return true;
    }
    let Some(request) = needs_expansion(&pvc, &pv) else { return true };
    let (driver, pv_name) = (s(&pv, "/spec/csi/driver"), name(&pv));
    let component = component(driver);
    ctx.event(&pvc, NORMAL, "Resizing", &format!("External resizer is resizing volume {pv_name}"), &component);
    let result = async {
        let required = i64::try_from(request).map_err(|_| "the request is too large".to_owned())?;
        let req = ControllerExpandVolumeRequest {
            volume_id: s(&pv, "/spec/csi/volumeHandle").to_owned(),
            capacity_range: Some(CapacityRange { required_bytes: required, limit_bytes: 0 }),
            secrets: csi::secret_data(ctx.store(), pv.pointer("/spec/csi/controllerExpandSecretRef"))?,
            volume_capability: Some(csi::pv_capability(&pv)),
        };
        let mut client = csi::dial(&ctx.drivers, driver).await?;
        csi::call(client.controller_expand_volume(req)).await
    }
    .await;
    let answer = match result {
        Ok(a) => a,
        Err(e) => {
            let message = format!("resize volume \"{pv_name}\" by resizer \"{driver}\" failed: {e}");
            ctx.event(&pvc, WARNING, "VolumeResizeFailed", &message, &component);
            return false;
        }
    };
    let new_size = if answer.capacity_bytes > 0 { (answer.capacity_bytes as u128).max(request) } else { request };
    let new_quantity = quantity::format_bytes(new_size);
    let written = ctx.modify(&PVS, "", pv_name, |v| {
        if v.pointer("/spec/capacity/storage").and_then(quantity::value_bytes) == Some(new_size) {
            return false;
        }
        v["spec"]["capacity"]["storage"] = new_quantity.clone().into();
        true
    });
    if written.is_err() {
        return false;
    }
    let requested = pvc.pointer("/spec/resources/requests/storage").cloned().unwrap_or_default();
    let written = ctx.modify(&PVCS, ns, claim, |c| {
        if uid(c) != claim_uid {
            return false;
        }
        if !c["status"].is_object() {
            c["status"] = json!({});
        }
        let st = &mut c["status"];
        st["allocatedResources"]["storage"] = requested.clone();
        let mut conditions: Vec<Value> = st
            .get("conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|c| !matches!(s(c, "/type"), "Resizing" | "FileSystemResizePending"))
            .collect();
        if answer.node_expansion_required {
            conditions.push(json!({
                "type": "FileSystemResizePending",
                "status": "True",
                "lastProbeTime": null,
                "lastTransitionTime": now_rfc3339(),
                "message": "Waiting for user to (re-)start a pod to finish file system resize of volume on node.",
            }));
            st["allocatedResourceStatuses"]["storage"] = "NodeResizePending".into();
        } else {
            st["capacity"]["storage"] = new_quantity.clone().into();
            if let Some(m) = st.get_mut("allocatedResourceStatuses").and_then(Value::as_object_mut) {
                m.remove("storage");
            }
        }
        st["conditions"] = Value::Array(conditions);
        true
    });
    match written {
        Ok(updated) if answer.node_expansion_required => {
            let message = "Require file system resize of volume on node";
            ctx.event(&updated, NORMAL, "FileSystemResizeRequired", message, &component);
            true
        }
        Ok(updated) => {
            ctx.event(&updated, NORMAL, "VolumeResizeSuccessful", "Resize volume succeeded", &component);
            true
        }
        Err(_) => false,
    }
}
