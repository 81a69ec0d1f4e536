//! The external-provisioner: CreateVolume for a claim whose class names a
//! driver added with `add_csi_controller`, the PV it makes from the answer
//! (bound to the claim by claimRef; the binder completes the binding), and
//! DeleteVolume for a Released PV it made whose policy is Delete.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use serde_json::{Value, json};
use swiftlet::volumes::csi::api::{CreateVolumeRequest, DeleteVolumeRequest, TopologyRequirement};

use super::{
    Ctx, Snapshot, admission, csi,
    events::{NORMAL, WARNING},
    objects::{
        ANN_PROVISIONED_BY, ANN_SELECTED_NODE, access_modes, annotation, deleting, name, namespace, reference,
        request_bytes, s, strings_at, uid, volume_mode,
    },
    quantity,
};
use crate::apiserver::resources::{CSINODES, NODES, PVCS, PVS, STORAGE_CLASSES};

const PREFIX: &str = "csi.storage.k8s.io/";
const ANN_DELETION_SECRET_NAME: &str = "volume.kubernetes.io/provisioner-deletion-secret-name";
const ANN_DELETION_SECRET_NAMESPACE: &str = "volume.kubernetes.io/provisioner-deletion-secret-namespace";

/// The class parameter prefix of each secret reference the PV gets.
const SECRET_REFS: &[(&str, &str)] = &[
    ("controller-publish", "controllerPublishSecretRef"),
    ("node-stage", "nodeStageSecretRef"),
    ("node-publish", "nodePublishSecretRef"),
    ("controller-expand", "controllerExpandSecretRef"),
    ("node-expand", "nodeExpandSecretRef"),
];

fn component(driver: &str) -> String {
    format!("{driver}_fake-apiserver")
}

/// Starts provisioning for an unbound claim of `class`, when its driver was
/// added and its volume is not made yet.
pub(super) fn start(ctx: &Arc<Ctx>, snap: &Snapshot, pvc: &Value, class: &Value) {
    let driver = s(class, "/provisioner").to_owned();
    if !ctx.drivers.has(&driver) || snap.pv(&format!("pvc-{}", uid(pvc))).is_some() {
        return;
    }
    let key = format!("provision/{}", uid(pvc));
    let (c, ns, n, u) = (ctx.clone(), namespace(pvc).to_owned(), name(pvc).to_owned(), uid(pvc).to_owned());
    ctx.spawn(key, async move { provision(&c, &ns, &n, &u, &driver).await });
}

async fn provision(ctx: &Ctx, ns: &str, claim: &str, claim_uid: &str, driver: &str) -> bool {
    let Ok(pvc) = ctx.store().get(&PVCS, ns, claim) else { return true };
    if uid(&pvc) != claim_uid || deleting(&pvc) || !s(&pvc, "/spec/volumeName").is_empty() {
        return true;
    }
    // Made by an earlier attempt: the binder's to bind.
    if ctx.store().get(&PVS, "", &format!("pvc-{claim_uid}")).is_ok() {
        return true;
    }
    let class_name = super::objects::claim_class(&pvc).to_owned();
    let Ok(class) = ctx.store().get(&STORAGE_CLASSES, "", &class_name) else { return true };
    let component = component(driver);
    let message = format!("External provisioner is provisioning volume for claim \"{ns}/{claim}\"");
    ctx.event(&pvc, NORMAL, "Provisioning", &message, &component);
    match create(ctx, &pvc, &class, driver).await {
        Ok(pv) => {
            ctx.event(
                &pvc,
                NORMAL,
                "ProvisioningSucceeded",
                &format!("Successfully provisioned volume {pv}"),
                &component,
            );
            true
        }
        Err(e) => {
            let message = format!("failed to provision volume with StorageClass \"{class_name}\": {e}");
            ctx.event(&pvc, WARNING, "ProvisioningFailed", &message, &component);
            false
        }
    }
}

/// `${pvc.namespace}`, `${pvc.name}`, `${pv.name}` and
/// `${pvc.annotations['key']}` in a secret parameter.
fn resolve(template: &str, pvc: &Value, pv_name: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find('}').ok_or_else(|| format!("{template:?}: unterminated ${{"))?;
        let key = &after[..end];
        let value = match key {
            "pvc.namespace" => namespace(pvc).to_owned(),
            "pvc.name" => name(pvc).to_owned(),
            "pv.name" => pv_name.to_owned(),
            k => match k.strip_prefix("pvc.annotations['").and_then(|k| k.strip_suffix("']")) {
                Some(a) => annotation(pvc, a).unwrap_or("").to_owned(),
                None => return Err(format!("{template:?}: unknown template ${{{k}}}")),
            },
        };
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The `{name, namespace}` reference the class parameters give for
/// `which` ("node-stage", "provisioner", ...).
fn secret_ref(params: &Value, which: &str, pvc: &Value, pv_name: &str) -> Result<Option<Value>, String> {
    let n = params.get(format!("{PREFIX}{which}-secret-name")).and_then(Value::as_str);
    let ns = params.get(format!("{PREFIX}{which}-secret-namespace")).and_then(Value::as_str);
    match (n, ns) {
        (None, None) => Ok(None),
        (Some(n), Some(ns)) => {
            Ok(Some(json!({"name": resolve(n, pvc, pv_name)?, "namespace": resolve(ns, pvc, pv_name)?})))
        }
        _ => Err(format!(
            "failed to get name and namespace template from params: either name and namespace for {which} secrets specified, Both must be specified"
        )),
    }
}

/// The topology the volume must be reachable from: the selected node's
/// (WaitForFirstConsumer), else every node's that runs the driver.
fn topology(ctx: &Ctx, pvc: &Value, driver: &str) -> Result<Option<TopologyRequirement>, String> {
    let keys_of = |csinode: &Value| -> Vec<String> {
        csinode
            .pointer("/spec/drivers")
            .and_then(Value::as_array)
            .and_then(|d| d.iter().find(|d| s(d, "/name") == driver))
            .map(|d| strings_at(d, "/topologyKeys"))
            .unwrap_or_default()
    };
    let segments = |node: &Value, keys: &[String]| -> Option<HashMap<String, String>> {
        keys.iter()
            .map(|k| {
                node.pointer("/metadata/labels")
                    .and_then(|l| l.get(k))
                    .and_then(Value::as_str)
                    .map(|v| (k.clone(), v.to_owned()))
            })
            .collect()
    };
    let mut found: Vec<BTreeMap<String, String>> = vec![];
    if let Some(selected) = annotation(pvc, ANN_SELECTED_NODE) {
        let Ok(csinode) = ctx.store().get(&CSINODES, "", selected) else { return Ok(None) };
        let keys = keys_of(&csinode);
        if keys.is_empty() {
            return Ok(None);
        }
        let node = ctx.store().get(&NODES, "", selected).map_err(|e| e.message)?;
        let seg = segments(&node, &keys).ok_or_else(|| {
            format!(
                "topology labels from selected node {selected} do not match the topology keys {keys:?} from CSINode"
            )
        })?;
        found.push(seg.into_iter().collect());
    } else {
        for csinode in ctx.store().list(&CSINODES, None).0 {
            let keys = keys_of(&csinode);
            if keys.is_empty() {
                continue;
            }
            if let Ok(node) = ctx.store().get(&NODES, "", name(&csinode))
                && let Some(seg) = segments(&node, &keys)
            {
                found.push(seg.into_iter().collect());
            }
        }
        found.sort();
        found.dedup();
    }
    if found.is_empty() {
        return Ok(None);
    }
    let topologies: Vec<_> = found
        .into_iter()
        .map(|seg| swiftlet::volumes::csi::api::Topology { segments: seg.into_iter().collect() })
        .collect();
    Ok(Some(TopologyRequirement { requisite: topologies.clone(), preferred: topologies }))
}

/// CreateVolume, then the PV. Returns the PV's name.
async fn create(ctx: &Ctx, pvc: &Value, class: &Value, driver: &str) -> Result<String, String> {
    if pvc.pointer("/spec/selector").is_some_and(|v| !v.is_null()) {
        return Err("claim Selector is not supported".into());
    }
    let pv_name = format!("pvc-{}", uid(pvc));
    let request = request_bytes(pvc).ok_or("the claim requests no storage")?;
    let params = class.get("parameters").cloned().unwrap_or(json!({}));
    let block = volume_mode(pvc) == "Block";
    let fs_type = if block {
        String::new()
    } else {
        params.get(format!("{PREFIX}fstype")).and_then(Value::as_str).unwrap_or("ext4").to_owned()
    };
    let mount_options = strings_at(class, "/mountOptions");
    let capabilities = access_modes(pvc, "/spec/accessModes")
        .iter()
        .map(|m| csi::capability(block, &fs_type, mount_options.clone(), csi::mode_of(m)))
        .collect();
    let parameters = params
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| !k.starts_with(PREFIX))
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
        .collect();
    let provisioner_secret = secret_ref(&params, "provisioner", pvc, &pv_name)?;
    let secrets = csi::secret_data(ctx.store(), provisioner_secret.as_ref())?;
    let mut refs = vec![];
    for (which, field) in SECRET_REFS {
        if let Some(r) = secret_ref(&params, which, pvc, &pv_name)? {
            refs.push((*field, r));
        }
    }
    let request_i64 = i64::try_from(request).map_err(|_| "the request is too large")?;
    let req = CreateVolumeRequest {
        name: pv_name.clone(),
        capacity_range: Some(capacity_range(request_i64)),
        volume_capabilities: capabilities,
        parameters,
        secrets,
        accessibility_requirements: topology(ctx, pvc, driver)?,
        ..Default::default()
    };
    let mut client = csi::dial(&ctx.drivers, driver).await?;
    let answer = csi::call(client.create_volume(req)).await?;
    let volume = answer.volume.ok_or("the driver answered without a volume")?;
    let capacity = if volume.capacity_bytes > 0 { volume.capacity_bytes as u128 } else { request };
    let mut attributes: serde_json::Map<String, Value> =
        volume.volume_context.into_iter().map(|(k, v)| (k, v.into())).collect();
    attributes
        .insert("storage.kubernetes.io/csiProvisionerIdentity".into(), format!("{}-{driver}", ctx.identity).into());
    let mut source = json!({"driver": driver, "volumeHandle": volume.volume_id, "volumeAttributes": attributes});
    if !block {
        source["fsType"] = fs_type.into();
    }
    for (field, r) in refs {
        source[field] = r;
    }
    let mut pv = json!({
        "metadata": {"name": pv_name, "annotations": {ANN_PROVISIONED_BY: driver}},
        "spec": {
            "capacity": {"storage": quantity::format_bytes(capacity)},
            "accessModes": pvc.pointer("/spec/accessModes").cloned().unwrap_or(json!([])),
            "persistentVolumeReclaimPolicy": match s(class, "/reclaimPolicy") { "" => "Delete", p => p },
            "storageClassName": name(class),
            "volumeMode": volume_mode(pvc),
            "claimRef": reference(pvc),
            "csi": source,
        },
    });
    if !mount_options.is_empty() {
        pv["spec"]["mountOptions"] = json!(mount_options);
    }
    if let Some(r) = &provisioner_secret {
        pv["metadata"]["annotations"][ANN_DELETION_SECRET_NAME] = r["name"].clone();
        pv["metadata"]["annotations"][ANN_DELETION_SECRET_NAMESPACE] = r["namespace"].clone();
    }
    if !volume.accessible_topology.is_empty() {
        let terms: Vec<Value> = volume
            .accessible_topology
            .iter()
            .map(|t| {
                let sorted: BTreeMap<_, _> = t.segments.iter().collect();
                let exprs: Vec<Value> =
                    sorted.into_iter().map(|(k, v)| json!({"key": k, "operator": "In", "values": [v]})).collect();
                json!({"matchExpressions": exprs})
            })
            .collect();
        pv["spec"]["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": terms}});
    }
    admission::on_create(ctx.store(), &PVS, &mut pv).map_err(|e| e.message)?;
    match ctx.store().create(&PVS, "", pv) {
        Ok(_) => Ok(pv_name),
        // Made by an earlier attempt whose answer was lost.
        Err(e) if e.code == 409 => Ok(pv_name),
        Err(e) => Err(format!("cannot create the PersistentVolume: {}", e.message)),
    }
}

fn capacity_range(required: i64) -> swiftlet::volumes::csi::api::CapacityRange {
    swiftlet::volumes::csi::api::CapacityRange { required_bytes: required, limit_bytes: 0 }
}

/// DeleteVolume for a Released volume this provisioner made, then the PV.
pub(super) fn delete(ctx: &Arc<Ctx>, pv: &Value) {
    let key = format!("delete/{}", name(pv));
    let (c, pv_name) = (ctx.clone(), name(pv).to_owned());
    ctx.spawn(key, async move { delete_volume(&c, &pv_name).await });
}

async fn delete_volume(ctx: &Ctx, pv_name: &str) -> bool {
    let Ok(pv) = ctx.store().get(&PVS, "", pv_name) else { return true };
    if s(&pv, "/status/phase") != "Released" || s(&pv, "/spec/persistentVolumeReclaimPolicy") != "Delete" {
        return true;
    }
    let driver = s(&pv, "/spec/csi/driver");
    let result = async {
        let secret = annotation(&pv, ANN_DELETION_SECRET_NAME)
            .map(|n| json!({"name": n, "namespace": annotation(&pv, ANN_DELETION_SECRET_NAMESPACE).unwrap_or("")}));
        let secrets = csi::secret_data(ctx.store(), secret.as_ref())?;
        let mut client = csi::dial(&ctx.drivers, driver).await?;
        let req = DeleteVolumeRequest { volume_id: s(&pv, "/spec/csi/volumeHandle").to_owned(), secrets };
        csi::call(client.delete_volume(req)).await?;
        Ok::<_, String>(())
    }
    .await;
    match result {
        Ok(()) => {
            let opts = crate::apiserver::store::DeleteOptions {
                precondition_uid: Some(uid(&pv).to_owned()),
                ..Default::default()
            };
            let _ = ctx.store().delete(&PVS, "", pv_name, &opts);
            true
        }
        Err(e) => {
            ctx.event(&pv, WARNING, "VolumeFailedDelete", &e, &component(driver));
            false
        }
    }
}
