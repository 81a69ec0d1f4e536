//! The PV controller: volumes Available, Bound, Released (and reclaimed),
//! claims bound to the smallest volume that fits or sent to their class's
//! provisioner, Lost when their volume is gone. WaitForFirstConsumer
//! claims wait for a pod with a node (there is no scheduler: a pod's
//! spec.nodeName is its node) and then take a volume that fits that node,
//! as the scheduler's volume binder does.

use std::{collections::HashSet, sync::Arc};

use serde_json::Value;

use super::{
    Ctx, Snapshot,
    events::{NORMAL, WARNING},
    objects::{
        ANN_BETA_STORAGE_PROVISIONER, ANN_BIND_COMPLETED, ANN_BOUND_BY_CONTROLLER, ANN_PROVISIONED_BY,
        ANN_SELECTED_NODE, ANN_STORAGE_PROVISIONER, NO_PROVISIONER, access_modes, annotation, bound_to_claim,
        claim_class, claim_ref, deleting, label_selector, name, namespace, pv_capacity_bytes, pv_fits_node, reference,
        request_bytes, s, set_annotation, uid, volume_class, volume_mode,
    },
    provisioner,
};
use crate::apiserver::{
    resources::{PVCS, PVS},
    store::now_rfc3339,
};

const COMPONENT: &str = "persistentvolume-controller";

pub(super) fn sync(ctx: &Arc<Ctx>, snap: &Snapshot) {
    for pv in &snap.pvs {
        sync_volume(ctx, snap, pv);
    }
    let mut taken = HashSet::new();
    for pvc in &snap.pvcs {
        sync_claim(ctx, snap, pvc, &mut taken);
    }
}

/// Sets a PV's phase (and its message, cleared when None).
fn set_phase(ctx: &Ctx, pv: &str, phase: &str, message: Option<&str>) {
    let r = ctx.modify(&PVS, "", pv, |v| {
        if s(v, "/status/phase") == phase && v.pointer("/status/message").and_then(Value::as_str) == message {
            return false;
        }
        if !v["status"].is_object() {
            v["status"] = serde_json::json!({});
        }
        if s(v, "/status/phase") != phase {
            v["status"]["lastPhaseTransitionTime"] = now_rfc3339().into();
        }
        v["status"]["phase"] = phase.into();
        match message {
            Some(m) => v["status"]["message"] = m.into(),
            None => {
                if let Some(st) = v["status"].as_object_mut() {
                    st.remove("message");
                }
            }
        }
        true
    });
    if let Err(e) = r {
        tracing::debug!(pv, phase, error = %e.message, "cannot set the volume's phase");
    }
}

fn sync_volume(ctx: &Arc<Ctx>, snap: &Snapshot, pv: &Value) {
    if deleting(pv) {
        return;
    }
    let phase = s(pv, "/status/phase");
    let Some((cns, cname, cuid)) = claim_ref(pv) else {
        if phase != "Available" {
            set_phase(ctx, name(pv), "Available", None);
        }
        return;
    };
    if cuid.is_empty() {
        // Reserved for a claim not bound yet: the claim's sync binds it.
        if phase != "Available" {
            set_phase(ctx, name(pv), "Available", None);
        }
        return;
    }
    match snap.pvc(cns, cname).filter(|c| uid(c) == cuid) {
        None => {
            if phase != "Released" && phase != "Failed" {
                set_phase(ctx, name(pv), "Released", None);
            }
            if phase != "Failed" {
                reclaim(ctx, snap, pv);
            }
        }
        Some(claim) => {
            let volume_name = s(claim, "/spec/volumeName");
            if volume_name == name(pv) {
                if phase != "Bound" {
                    set_phase(ctx, name(pv), "Bound", None);
                }
            } else if !volume_name.is_empty() && annotation(pv, ANN_BOUND_BY_CONTROLLER) == Some("yes") {
                // The claim went to another volume: undo our reservation.
                let _ = ctx.modify(&PVS, "", name(pv), |v| {
                    if let Some(spec) = v["spec"].as_object_mut() {
                        spec.remove("claimRef");
                    }
                    if let Some(a) = v["metadata"]["annotations"].as_object_mut() {
                        a.remove(ANN_BOUND_BY_CONTROLLER);
                    }
                    v["status"]["phase"] = "Available".into();
                    true
                });
            }
        }
    }
}

/// A Released volume, by its reclaim policy.
fn reclaim(ctx: &Arc<Ctx>, snap: &Snapshot, pv: &Value) {
    match s(pv, "/spec/persistentVolumeReclaimPolicy") {
        "Delete" => {
            let driver = s(pv, "/spec/csi/driver");
            if driver.is_empty() {
                let message = format!(
                    "error getting deleter volume plugin for volume \"{}\": no deletable volume plugin matched",
                    name(pv)
                );
                set_phase(ctx, name(pv), "Failed", Some(&message));
                ctx.event(pv, WARNING, "VolumeFailedDelete", &message, COMPONENT);
            } else if annotation(pv, ANN_PROVISIONED_BY) == Some(driver) && ctx.drivers.has(driver) {
                // The external-attacher's finalizer keeps an attached volume.
                let attached = snap.vas.iter().any(|va| s(va, "/spec/source/persistentVolumeName") == name(pv));
                if !attached {
                    provisioner::delete(ctx, pv);
                }
            }
            // Otherwise it waits for its driver's provisioner.
        }
        "Recycle" => {
            let message = "No recycler plugin found for the volume!";
            set_phase(ctx, name(pv), "Failed", Some(message));
            ctx.event(pv, WARNING, "VolumeFailedRecycle", message, COMPONENT);
        }
        _ => {}
    }
}

fn set_claim_phase(ctx: &Ctx, pvc: &Value, phase: &str) {
    let _ = ctx.modify(&PVCS, namespace(pvc), name(pvc), |c| {
        if s(c, "/status/phase") == phase || uid(c) != uid(pvc) {
            return false;
        }
        c["status"]["phase"] = phase.into();
        true
    });
}

fn sync_claim(ctx: &Arc<Ctx>, snap: &Snapshot, pvc: &Value, taken: &mut HashSet<String>) {
    if deleting(pvc) {
        return;
    }
    let volume_name = s(pvc, "/spec/volumeName");
    if volume_name.is_empty() {
        return sync_unbound(ctx, snap, pvc, taken);
    }
    taken.insert(volume_name.to_owned());
    let completed = annotation(pvc, ANN_BIND_COMPLETED).is_some();
    let Some(pv) = snap.pv(volume_name) else {
        if completed && s(pvc, "/status/phase") != "Lost" {
            set_claim_phase(ctx, pvc, "Lost");
            let message = "Bound claim has lost its PersistentVolume. Data on the volume is lost!";
            ctx.event(pvc, WARNING, "ClaimLost", message, COMPONENT);
        }
        // Pre-bound to a volume not made yet: it waits.
        return;
    };
    if bound_to_claim(pv, pvc) {
        bind(ctx, pv, pvc);
    } else if claim_ref(pv).is_none() {
        if completed {
            bind(ctx, pv, pvc);
        } else if let Some(why) = mismatch(pv, pvc) {
            let message = format!("Cannot bind to requested volume \"{volume_name}\": {why}");
            ctx.event(pvc, WARNING, "VolumeMismatch", &message, COMPONENT);
        } else {
            bind(ctx, pv, pvc);
        }
    } else if completed {
        if s(pvc, "/status/phase") != "Lost" {
            set_claim_phase(ctx, pvc, "Lost");
            let message = "Two claims are bound to the same volume, this one is bound incorrectly";
            ctx.event(pvc, WARNING, "ClaimMisbound", message, COMPONENT);
        }
    } else {
        let message = format!("volume \"{volume_name}\" already bound to a different claim.");
        ctx.event(pvc, WARNING, "FailedBinding", &message, COMPONENT);
    }
}

/// Why a volume the claim asked for by name does not satisfy it.
fn mismatch(pv: &Value, pvc: &Value) -> Option<&'static str> {
    if pv_capacity_bytes(pv).unwrap_or(0) < request_bytes(pvc).unwrap_or(0) {
        return Some("requested PV is too small");
    }
    if volume_class(pv) != claim_class(pvc) {
        return Some("storageClassName does not match");
    }
    if volume_mode(pv) != volume_mode(pvc) {
        return Some("incompatible volumeMode");
    }
    let have = access_modes(pv, "/spec/accessModes");
    if !access_modes(pvc, "/spec/accessModes").iter().all(|m| have.contains(m)) {
        return Some("incompatible accessMode");
    }
    None
}

fn sync_unbound(ctx: &Arc<Ctx>, snap: &Snapshot, pvc: &Value, taken: &mut HashSet<String>) {
    let class_name = claim_class(pvc);
    let class = snap.classes.get(class_name).filter(|_| !class_name.is_empty());
    let delayed = class.is_some_and(|c| s(c, "/volumeBindingMode") == "WaitForFirstConsumer");
    let node_name = if delayed {
        annotation(pvc, ANN_SELECTED_NODE).map(str::to_owned).or_else(|| snap.consumer_node(pvc))
    } else {
        None
    };
    // A node without an object has no labels: only volumes without
    // affinity fit it.
    let node = node_name
        .as_deref()
        .map(|n| snap.nodes.get(n).cloned().unwrap_or_else(|| serde_json::json!({"metadata": {"name": n}})));
    if let Some(pv) = find_volume(snap, pvc, delayed, node.as_ref(), taken) {
        taken.insert(name(pv).to_owned());
        bind(ctx, pv, pvc);
        return;
    }
    if delayed && node_name.is_none() {
        let message = "waiting for first consumer to be created before binding";
        ctx.event(pvc, NORMAL, "WaitForFirstConsumer", message, COMPONENT);
        return;
    }
    if class_name.is_empty() {
        let message = "no persistent volumes available for this claim and no storage class is set";
        ctx.event(pvc, NORMAL, "FailedBinding", message, COMPONENT);
        return;
    }
    let Some(class) = class else {
        let message = format!("storageclass.storage.k8s.io \"{class_name}\" not found");
        ctx.event(pvc, WARNING, "ProvisioningFailed", &message, COMPONENT);
        return;
    };
    let provisioner_name = s(class, "/provisioner");
    if provisioner_name == NO_PROVISIONER {
        // Only a volume made by hand will do.
        return;
    }
    let selected = node_name.clone();
    let updated = ctx.modify(&PVCS, namespace(pvc), name(pvc), |c| {
        if uid(c) != uid(pvc) || !s(c, "/spec/volumeName").is_empty() {
            return false;
        }
        let mut changed = false;
        for key in [ANN_STORAGE_PROVISIONER, ANN_BETA_STORAGE_PROVISIONER] {
            if annotation(c, key) != Some(provisioner_name) {
                set_annotation(c, key, provisioner_name);
                changed = true;
            }
        }
        if let Some(n) = &selected
            && annotation(c, ANN_SELECTED_NODE).is_none()
        {
            set_annotation(c, ANN_SELECTED_NODE, n);
            changed = true;
        }
        changed
    });
    let message = format!(
        "Waiting for a volume to be created either by the external provisioner '{provisioner_name}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered."
    );
    ctx.event(pvc, NORMAL, "ExternalProvisioning", &message, COMPONENT);
    if let Ok(current) = updated {
        provisioner::start(ctx, snap, &current, class);
    }
}

/// The volume for an unbound claim: one reserved for it, else the smallest
/// Available one with its class, mode, access modes, size and labels (and,
/// for a node, its node affinity). A `delayed` claim without a node yet
/// takes only a volume reserved for it.
fn find_volume<'a>(
    snap: &'a Snapshot,
    pvc: &Value,
    delayed: bool,
    node: Option<&Value>,
    taken: &HashSet<String>,
) -> Option<&'a Value> {
    let request = request_bytes(pvc).unwrap_or(0);
    let wanted = access_modes(pvc, "/spec/accessModes");
    let selector = pvc.pointer("/spec/selector").filter(|v| v.is_object()).map(label_selector);
    let mut best: Option<(&Value, u128)> = None;
    for pv in &snap.pvs {
        if deleting(pv) || taken.contains(name(pv)) {
            continue;
        }
        let capacity = pv_capacity_bytes(pv).unwrap_or(0);
        let modes = access_modes(pv, "/spec/accessModes");
        if capacity < request || volume_mode(pv) != volume_mode(pvc) || !wanted.iter().all(|m| modes.contains(m)) {
            continue;
        }
        let fits = node.is_none_or(|n| pv_fits_node(pv, n));
        if bound_to_claim(pv, pvc) {
            return fits.then_some(pv);
        }
        if delayed && node.is_none() {
            continue;
        }
        if claim_ref(pv).is_some() || matches!(s(pv, "/status/phase"), "Released" | "Failed" | "Bound") {
            continue;
        }
        if volume_class(pv) != claim_class(pvc) || !fits {
            continue;
        }
        match &selector {
            Some(Some(sel)) if sel.matches(pv) => {}
            Some(_) => continue,
            None => {}
        }
        if best.is_none_or(|(_, c)| capacity < c) {
            best = Some((pv, capacity));
        }
    }
    best.map(|(pv, _)| pv)
}

/// Binds both ways: the volume's claimRef and phase, then the claim's
/// volumeName, annotations and status, each write only when needed.
fn bind(ctx: &Ctx, pv: &Value, pvc: &Value) {
    let pv_name = name(pv).to_owned();
    let claim_uid = uid(pvc).to_owned();
    let mut refused = false;
    let bound = ctx.modify(&PVS, "", &pv_name, |v| {
        let mut changed = false;
        match claim_ref(v) {
            None => {
                v["spec"]["claimRef"] = reference(pvc);
                set_annotation(v, ANN_BOUND_BY_CONTROLLER, "yes");
                changed = true;
            }
            Some(_) if bound_to_claim(v, pvc) => {
                if claim_ref(v).is_some_and(|(_, _, u)| u.is_empty()) {
                    v["spec"]["claimRef"] = reference(pvc);
                    changed = true;
                }
            }
            Some(_) => {
                refused = true;
                return false;
            }
        }
        if s(v, "/status/phase") != "Bound" {
            v["status"]["phase"] = "Bound".into();
            v["status"]["lastPhaseTransitionTime"] = now_rfc3339().into();
            changed = true;
        }
        changed
    });
    let volume = match bound {
        Ok(v) if !refused => v,
        Ok(_) => return,
        Err(e) => {
            tracing::debug!(pv = pv_name, error = %e.message, "cannot bind the volume");
            return;
        }
    };
    let r = ctx.modify(&PVCS, namespace(pvc), name(pvc), |c| {
        if uid(c) != claim_uid {
            return false;
        }
        let mut changed = false;
        match s(c, "/spec/volumeName") {
            "" => {
                c["spec"]["volumeName"] = pv_name.clone().into();
                set_annotation(c, ANN_BOUND_BY_CONTROLLER, "yes");
                changed = true;
            }
            n if n != pv_name => return false,
            _ => {}
        }
        if annotation(c, ANN_BIND_COMPLETED) != Some("yes") {
            set_annotation(c, ANN_BIND_COMPLETED, "yes");
            changed = true;
        }
        // The capacity is the volume's when the claim becomes Bound, and
        // the resizer's and the kubelet's after.
        if s(c, "/status/phase") != "Bound" {
            c["status"]["phase"] = "Bound".into();
            c["status"]["capacity"] = volume.pointer("/spec/capacity").cloned().unwrap_or_default();
            changed = true;
        }
        let modes = volume.pointer("/spec/accessModes").cloned().unwrap_or_default();
        if c.pointer("/status/accessModes") != Some(&modes) {
            c["status"]["accessModes"] = modes;
            changed = true;
        }
        changed
    });
    if let Err(e) = r {
        tracing::debug!(pvc = name(pvc), error = %e.message, "cannot bind the claim");
    }
}
