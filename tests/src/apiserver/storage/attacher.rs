//! The attach-detach controller and the external-attacher: a
//! VolumeAttachment for every CSI volume a pod on a node uses (unless its
//! CSIDriver says attachRequired: false), ControllerPublishVolume into its
//! status, the node's status.volumesAttached; and the reverse once no pod
//! on the node needs the volume and the kubelet no longer lists it in
//! status.volumesInUse.

use std::{collections::BTreeMap, sync::Arc};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use swiftlet::volumes::csi::api::{ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest};

use super::{
    Ctx, Snapshot, csi,
    events::{NORMAL, WARNING},
    objects::{annotation, deleting, name, namespace, pod_active, pod_claims, s, set_annotation},
};
use crate::apiserver::{
    resources::{CSINODES, NODES, PODS, PVCS, PVS, VOLUME_ATTACHMENTS},
    store::{DeleteOptions, now_rfc3339},
};

const COMPONENT: &str = "attachdetach-controller";
/// Where the external-attacher keeps the node ID it attached to.
const ANN_NODE_ID: &str = "csi.alpha.kubernetes.io/node-id";

/// The name the attach-detach controller gives a CSI volume's attachment.
pub fn attachment_name(volume_handle: &str, driver: &str, node: &str) -> String {
    let digest = Sha256::digest(format!("{volume_handle}{driver}{node}").as_bytes());
    format!("csi-{}", digest.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// The volume's name in node.status.volumesInUse and volumesAttached.
pub fn unique_name(driver: &str, volume_handle: &str) -> String {
    format!("kubernetes.io/csi/{driver}^{volume_handle}")
}

struct Wanted {
    pv: String,
    driver: String,
    node: String,
}

fn attach_required(snap: &Snapshot, driver: &str) -> bool {
    snap.csidrivers
        .get(driver)
        .is_none_or(|d| d.pointer("/spec/attachRequired").and_then(Value::as_bool) != Some(false))
}

/// The CSI PV a pod's claim is bound to.
fn bound_csi_pv<'a>(snap: &'a Snapshot, ns: &str, claim: &str) -> Option<&'a Value> {
    let pvc = snap.pvc(ns, claim)?;
    let volume = s(pvc, "/spec/volumeName");
    if volume.is_empty() || s(pvc, "/status/phase") != "Bound" {
        return None;
    }
    snap.pv(volume).filter(|pv| !s(pv, "/spec/csi/driver").is_empty())
}

pub(super) fn sync(ctx: &Arc<Ctx>, snap: &Snapshot) {
    let mut wanted: BTreeMap<String, Wanted> = BTreeMap::new();
    for pod in &snap.pods {
        let node = s(pod, "/spec/nodeName");
        if node.is_empty() || !pod_active(pod) {
            continue;
        }
        for claim in pod_claims(pod) {
            let Some(pv) = bound_csi_pv(snap, namespace(pod), &claim) else { continue };
            let driver = s(pv, "/spec/csi/driver");
            if !attach_required(snap, driver) {
                continue;
            }
            let va = attachment_name(s(pv, "/spec/csi/volumeHandle"), driver, node);
            wanted.insert(va, Wanted { pv: name(pv).to_owned(), driver: driver.to_owned(), node: node.to_owned() });
        }
    }
    for (va_name, w) in &wanted {
        match snap.vas.iter().find(|va| name(va) == va_name) {
            None => {
                let va = json!({
                    "metadata": {"name": va_name},
                    "spec": {"attacher": w.driver, "nodeName": w.node, "source": {"persistentVolumeName": w.pv}},
                    "status": {"attached": false},
                });
                if let Err(e) = ctx.store().create(&VOLUME_ATTACHMENTS, "", va) {
                    tracing::debug!(va = va_name, error = %e.message, "cannot create the VolumeAttachment");
                }
            }
            Some(va) if va.pointer("/status/attached").and_then(Value::as_bool) == Some(true) => {
                if let Some(pv) = snap.pv(&w.pv) {
                    report_attached(ctx, &w.node, &unique_name(&w.driver, s(pv, "/spec/csi/volumeHandle")), true);
                }
            }
            Some(va) if !deleting(va) && ctx.drivers.has(&w.driver) => {
                let (c, n) = (ctx.clone(), va_name.clone());
                ctx.spawn(format!("attach/{va_name}"), async move { attach(&c, &n).await });
            }
            Some(_) => {}
        }
    }
    for va in &snap.vas {
        if wanted.contains_key(name(va)) || !ctx.drivers.has(s(va, "/spec/attacher")) {
            continue;
        }
        if ctx.ops.running(&format!("attach/{}", name(va))) {
            continue;
        }
        let node = s(va, "/spec/nodeName");
        let in_use = snap.pv(s(va, "/spec/source/persistentVolumeName")).is_some_and(|pv| {
            let unique = unique_name(s(va, "/spec/attacher"), s(pv, "/spec/csi/volumeHandle"));
            snap.nodes.get(node).is_some_and(|n| {
                n.pointer("/status/volumesInUse")
                    .and_then(Value::as_array)
                    .is_some_and(|a| a.iter().any(|v| v.as_str() == Some(&unique)))
            })
        });
        if !in_use {
            let (c, n) = (ctx.clone(), name(va).to_owned());
            ctx.spawn(format!("detach/{}", name(va)), async move { detach(&c, &n).await });
        }
    }
}

/// Adds (or removes) the volume in node.status.volumesAttached.
fn report_attached(ctx: &Ctx, node: &str, unique: &str, attached: bool) {
    let r = ctx.modify(&NODES, "", node, |n| {
        let list = n.pointer("/status/volumesAttached").and_then(Value::as_array).cloned().unwrap_or_default();
        let present = list.iter().any(|v| s(v, "/name") == unique);
        if present == attached {
            return false;
        }
        let list: Vec<Value> = if attached {
            list.into_iter().chain([json!({"name": unique, "devicePath": ""})]).collect()
        } else {
            list.into_iter().filter(|v| s(v, "/name") != unique).collect()
        };
        if !n["status"].is_object() {
            n["status"] = json!({});
        }
        n["status"]["volumesAttached"] = Value::Array(list);
        true
    });
    if let Err(e) = r
        && e.code != 404
    {
        tracing::debug!(node, error = %e.message, "cannot report the attached volumes");
    }
}

/// The node ID the CSINode of `node` lists for `driver`.
fn node_id(ctx: &Ctx, node: &str, driver: &str) -> Result<String, String> {
    let csinode =
        ctx.store().get(&CSINODES, "", node).map_err(|_| format!("csinode.storage.k8s.io \"{node}\" not found"))?;
    csinode
        .pointer("/spec/drivers")
        .and_then(Value::as_array)
        .and_then(|d| d.iter().find(|d| s(d, "/name") == driver))
        .map(|d| s(d, "/nodeID").to_owned())
        .filter(|id| !id.is_empty())
        .ok_or_else(|| format!("CSINode {node} does not contain driver {driver}"))
}

/// The pods on `node` whose claims are bound to `pv` (for the events).
fn pods_using(ctx: &Ctx, pv: &str, node: &str) -> Vec<Value> {
    let pvcs = ctx.store().list(&PVCS, None).0;
    ctx.store()
        .list(&PODS, None)
        .0
        .into_iter()
        .filter(|p| s(p, "/spec/nodeName") == node && pod_active(p))
        .filter(|p| {
            pod_claims(p).iter().any(|c| {
                pvcs.iter().any(|v| namespace(v) == namespace(p) && name(v) == c && s(v, "/spec/volumeName") == pv)
            })
        })
        .collect()
}

async fn attach(ctx: &Ctx, va_name: &str) -> bool {
    let Ok(va) = ctx.store().get(&VOLUME_ATTACHMENTS, "", va_name) else { return true };
    if va.pointer("/status/attached").and_then(Value::as_bool) == Some(true) {
        return true;
    }
    let (driver, node, pv_name) =
        (s(&va, "/spec/attacher"), s(&va, "/spec/nodeName"), s(&va, "/spec/source/persistentVolumeName"));
    let result = async {
        let pv = ctx.store().get(&PVS, "", pv_name).map_err(|_| format!("persistentvolume \"{pv_name}\" not found"))?;
        let id = node_id(ctx, node, driver)?;
        let readonly = pv.pointer("/spec/csi/readOnly").and_then(Value::as_bool).unwrap_or(false);
        let req = ControllerPublishVolumeRequest {
            volume_id: s(&pv, "/spec/csi/volumeHandle").to_owned(),
            node_id: id.clone(),
            volume_capability: Some(csi::pv_capability(&pv)),
            readonly,
            secrets: csi::secret_data(ctx.store(), pv.pointer("/spec/csi/controllerPublishSecretRef"))?,
            volume_context: pv
                .pointer("/spec/csi/volumeAttributes")
                .and_then(Value::as_object)
                .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned())).collect())
                .unwrap_or_default(),
        };
        let mut client = csi::dial(&ctx.drivers, driver).await?;
        let answer = csi::call(client.controller_publish_volume(req)).await?;
        Ok::<_, String>((pv, id, answer.publish_context))
    }
    .await;
    match result {
        Ok((pv, id, publish_context)) => {
            let written = ctx.modify(&VOLUME_ATTACHMENTS, "", va_name, |v| {
                set_annotation(v, ANN_NODE_ID, &id);
                v["status"] = json!({"attached": true, "attachmentMetadata": publish_context});
                true
            });
            if written.is_err() {
                return false;
            }
            report_attached(ctx, node, &unique_name(driver, s(&pv, "/spec/csi/volumeHandle")), true);
            for pod in pods_using(ctx, pv_name, node) {
                let message = format!("AttachVolume.Attach succeeded for volume \"{pv_name}\"");
                ctx.event(&pod, NORMAL, "SuccessfulAttachVolume", &message, COMPONENT);
            }
            true
        }
        Err(e) => {
            let _ = ctx.modify(&VOLUME_ATTACHMENTS, "", va_name, |v| {
                v["status"]["attached"] = false.into();
                v["status"]["attachError"] = json!({"time": now_rfc3339(), "message": e});
                true
            });
            for pod in pods_using(ctx, pv_name, node) {
                let message = format!("AttachVolume.Attach failed for volume \"{pv_name}\" : {e}");
                ctx.event(&pod, WARNING, "FailedAttachVolume", &message, COMPONENT);
            }
            false
        }
    }
}

async fn detach(ctx: &Ctx, va_name: &str) -> bool {
    let Ok(va) = ctx.store().get(&VOLUME_ATTACHMENTS, "", va_name) else { return true };
    let (driver, node, pv_name) =
        (s(&va, "/spec/attacher"), s(&va, "/spec/nodeName"), s(&va, "/spec/source/persistentVolumeName"));
    // A pod came for it meanwhile: it stays.
    if !pods_using(ctx, pv_name, node).is_empty() {
        return true;
    }
    let pv = ctx.store().get(&PVS, "", pv_name).ok();
    let id = annotation(&va, ANN_NODE_ID).map(str::to_owned).or_else(|| node_id(ctx, node, driver).ok());
    // Without the volume or the node's ID there is nothing to unpublish.
    if let (Some(pv), Some(id)) = (&pv, id) {
        let result = async {
            let req = ControllerUnpublishVolumeRequest {
                volume_id: s(pv, "/spec/csi/volumeHandle").to_owned(),
                node_id: id,
                secrets: csi::secret_data(ctx.store(), pv.pointer("/spec/csi/controllerPublishSecretRef"))?,
            };
            let mut client = csi::dial(&ctx.drivers, driver).await?;
            csi::call(client.controller_unpublish_volume(req)).await?;
            Ok::<_, String>(())
        }
        .await;
        if let Err(e) = result {
            let _ = ctx.modify(&VOLUME_ATTACHMENTS, "", va_name, |v| {
                v["status"]["detachError"] = json!({"time": now_rfc3339(), "message": e});
                true
            });
            return false;
        }
    }
    let opts = DeleteOptions { precondition_uid: Some(s(&va, "/metadata/uid").to_owned()), ..Default::default() };
    if let Err(e) = ctx.store().delete(&VOLUME_ATTACHMENTS, "", va_name, &opts)
        && e.code != 404
    {
        return false;
    }
    if let Some(pv) = &pv {
        report_attached(ctx, node, &unique_name(driver, s(pv, "/spec/csi/volumeHandle")), false);
    }
    true
}
