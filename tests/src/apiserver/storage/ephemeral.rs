//! The ephemeral volume controller: the claim `<pod>-<volume>` of each
//! generic ephemeral volume, made from its template and owned by the pod;
//! and the garbage collector's part for claims: one whose owning pod is
//! gone is deleted.

use std::{collections::HashSet, sync::Arc};

use serde_json::{Value, json};

use super::{
    Ctx, Snapshot, admission,
    events::WARNING,
    objects::{deleting, name, namespace, s, uid},
};
use crate::apiserver::{
    resources::{PODS, PVCS},
    store::DeleteOptions,
};

const COMPONENT: &str = "ephemeral_volume";

pub(super) fn sync(ctx: &Arc<Ctx>, snap: &Snapshot) {
    for pod in snap.pods.iter().filter(|p| !deleting(p)) {
        for volume in pod.pointer("/spec/volumes").and_then(Value::as_array).into_iter().flatten() {
            let Some(template) = volume.pointer("/ephemeral/volumeClaimTemplate") else { continue };
            let claim = format!("{}-{}", name(pod), s(volume, "/name"));
            match snap.pvc(namespace(pod), &claim) {
                None => create(ctx, pod, &claim, template),
                Some(pvc) if !owned_by(pvc, uid(pod)) => {
                    // The kubelet refuses such a pod; say why on the pod.
                    let message = format!("PVC {}/{claim} was not created for the pod", namespace(pod));
                    ctx.event(pod, WARNING, "FailedBinding", &message, COMPONENT);
                }
                Some(_) => {}
            }
        }
    }
    collect_garbage(ctx, snap);
}

fn owned_by(obj: &Value, owner_uid: &str) -> bool {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| refs.iter().any(|r| s(r, "/uid") == owner_uid && r["controller"] == true))
}

fn create(ctx: &Ctx, pod: &Value, claim: &str, template: &Value) {
    let mut metadata = json!({
        "name": claim,
        "ownerReferences": [{
            "apiVersion": "v1", "kind": "Pod", "name": name(pod), "uid": uid(pod),
            "controller": true, "blockOwnerDeletion": true,
        }],
    });
    for field in ["labels", "annotations"] {
        if let Some(v) = template.pointer(&format!("/metadata/{field}")).filter(|v| v.is_object()) {
            metadata[field] = v.clone();
        }
    }
    let mut pvc = json!({"metadata": metadata, "spec": template.get("spec").cloned().unwrap_or(json!({}))});
    let made = admission::on_create(ctx.store(), &PVCS, &mut pvc)
        .and_then(|()| ctx.store().create(&PVCS, namespace(pod), pvc));
    match made {
        Ok(_) => {}
        Err(e) if e.code == 409 => {}
        Err(e) => {
            let message = format!("create PVC {claim}: {}", e.message);
            ctx.event(pod, WARNING, "FailedCreate", &message, COMPONENT);
        }
    }
}

/// Claims owned by a pod that no longer exists go, as the garbage
/// collector's background deletion has it.
fn collect_garbage(ctx: &Ctx, snap: &Snapshot) {
    let pods: HashSet<&str> = snap.pods.iter().map(uid).collect();
    for pvc in snap.pvcs.iter().filter(|c| !deleting(c)) {
        let owners = pvc.pointer("/metadata/ownerReferences").and_then(Value::as_array);
        let Some(owner) = owners.into_iter().flatten().find(|r| s(r, "/kind") == "Pod" && s(r, "/apiVersion") == "v1")
        else {
            continue;
        };
        if pods.contains(s(owner, "/uid")) {
            continue;
        }
        // The snapshot may predate the pod: ask the store.
        let alive =
            ctx.store().get(&PODS, namespace(pvc), s(owner, "/name")).is_ok_and(|p| uid(&p) == s(owner, "/uid"));
        if alive {
            continue;
        }
        let opts = DeleteOptions { precondition_uid: Some(uid(pvc).to_owned()), ..Default::default() };
        if let Err(e) = ctx.store().delete(&PVCS, namespace(pvc), name(pvc), &opts) {
            tracing::debug!(pvc = name(pvc), error = %e.message, "cannot collect the claim");
        }
    }
}
