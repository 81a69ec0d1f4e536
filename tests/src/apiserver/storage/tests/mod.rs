//! The storage controllers against the in-process fake API server and a
//! fake CSI Controller service on a unix socket.

mod api;
mod fake_csi;
mod fixture;

use std::time::Duration;

use serde_json::json;

use self::{
    fake_csi::Call,
    fixture::{DRIVER, Fixture, static_pv},
};
use super::attacher::attachment_name;
use crate::apiserver::resources::{CSIDRIVERS, NODES, PODS, PVCS, PVS, VOLUME_ATTACHMENTS};

#[test]
fn static_volumes_bind_to_the_smallest_fit_and_are_released_on_retain() {
    let f = Fixture::new();
    for pv in [
        static_pv("pv-big", "5Gi", "", &["ReadWriteOnce"], json!({})),
        static_pv("pv-small", "1Gi", "", &["ReadWriteOnce", "ReadOnlyMany"], json!({})),
        static_pv("pv-tiny", "256Mi", "", &["ReadWriteOnce"], json!({})),
        static_pv("pv-fast", "1Gi", "fast", &["ReadWriteOnce"], json!({})),
        static_pv("pv-rox", "1Gi", "", &["ReadOnlyMany"], json!({})),
        static_pv("pv-gold", "2Gi", "", &["ReadWriteOnce"], json!({"labels": {"tier": "gold"}})),
    ] {
        f.create(&PVS, "", pv);
    }
    assert_eq!(f.get(&PVS, "", "pv-fast").unwrap()["spec"]["persistentVolumeReclaimPolicy"], "Retain");
    let claim = f.claim("data", Some(""), "512Mi", json!({}));
    assert_eq!(claim["status"]["phase"], "Pending");
    assert_eq!(claim["spec"]["volumeMode"], "Filesystem");

    let pvc = f.wait_field(&PVCS, "default", "data", "/status/phase", "Bound");
    assert_eq!(pvc["spec"]["volumeName"], "pv-small");
    assert_eq!(pvc["status"]["capacity"]["storage"], "1Gi");
    assert_eq!(pvc["status"]["accessModes"], json!(["ReadWriteOnce", "ReadOnlyMany"]));
    assert_eq!(pvc["metadata"]["annotations"]["pv.kubernetes.io/bind-completed"], "yes");
    assert_eq!(pvc["metadata"]["annotations"]["pv.kubernetes.io/bound-by-controller"], "yes");
    let pv = f.wait_field(&PVS, "", "pv-small", "/status/phase", "Bound");
    let r = &pv["spec"]["claimRef"];
    assert_eq!(
        (r["kind"].as_str(), r["namespace"].as_str(), r["name"].as_str()),
        (Some("PersistentVolumeClaim"), Some("default"), Some("data"))
    );
    assert_eq!(r["uid"], claim["metadata"]["uid"]);
    assert_eq!(r["apiVersion"], "v1");
    assert!(r["resourceVersion"].is_string());
    assert_eq!(pv["metadata"]["annotations"]["pv.kubernetes.io/bound-by-controller"], "yes");
    f.wait_field(&PVS, "", "pv-fast", "/status/phase", "Available");

    // A selector picks among the labelled volumes only.
    f.claim("gold", Some(""), "1Gi", json!({"selector": {"matchLabels": {"tier": "gold"}}}));
    assert_eq!(f.wait_field(&PVCS, "default", "gold", "/status/phase", "Bound")["spec"]["volumeName"], "pv-gold");

    // Pre-bound by the claim: the volume is the controller's to complete.
    f.claim("wants-big", Some(""), "1Gi", json!({"volumeName": "pv-big"}));
    let pvc = f.wait_field(&PVCS, "default", "wants-big", "/status/phase", "Bound");
    assert!(pvc["metadata"]["annotations"].get("pv.kubernetes.io/bound-by-controller").is_none());
    let pv = f.wait_field(&PVS, "", "pv-big", "/status/phase", "Bound");
    assert_eq!(pv["metadata"]["annotations"]["pv.kubernetes.io/bound-by-controller"], "yes");

    // Pre-bound by the volume: the claim is the controller's to complete.
    let reserved = static_pv(
        "pv-reserved",
        "1Gi",
        "",
        &["ReadWriteOnce"],
        json!({"claimRef": {"namespace": "default", "name": "mine"}}),
    );
    f.create(&PVS, "", reserved);
    f.wait_field(&PVS, "", "pv-reserved", "/status/phase", "Available");
    f.claim("mine", Some(""), "100Mi", json!({}));
    let pvc = f.wait_field(&PVCS, "default", "mine", "/status/phase", "Bound");
    assert_eq!(pvc["spec"]["volumeName"], "pv-reserved");
    assert_eq!(pvc["metadata"]["annotations"]["pv.kubernetes.io/bound-by-controller"], "yes");
    let pv = f.wait_field(&PVS, "", "pv-reserved", "/status/phase", "Bound");
    assert!(pv["metadata"].get("annotations").is_none_or(|a| a.get("pv.kubernetes.io/bound-by-controller").is_none()));

    // Nothing fits: the claim waits, and says why.
    f.claim("huge", Some(""), "100Gi", json!({}));
    let e = f.wait_event("huge", "FailedBinding");
    assert_eq!(e["message"], "no persistent volumes available for this claim and no storage class is set");
    assert_eq!(f.get(&PVCS, "default", "huge").unwrap()["status"]["phase"], "Pending");

    // Retain: Released, the claim reference kept, the volume kept.
    f.delete(&PVCS, "default", "data");
    let pv = f.wait_field(&PVS, "", "pv-small", "/status/phase", "Released");
    assert_eq!(pv["spec"]["claimRef"]["name"], "data");
    assert!(f.calls(|c| matches!(c, Call::Delete(_))).is_empty());
}

#[test]
fn immediate_classes_provision_through_the_driver_and_delete_on_reclaim() {
    let f = Fixture::new();
    f.node("n1", json!({"topology.fake/zone": "a"}));
    f.csinode("n1", "node-1", &["topology.fake/zone"]);
    f.class(
        "fast",
        json!({"mountOptions": ["noatime"], "parameters": {
            "type": "thin",
            "csi.storage.k8s.io/fstype": "xfs",
            "csi.storage.k8s.io/node-stage-secret-name": "stage-${pvc.name}",
            "csi.storage.k8s.io/node-stage-secret-namespace": "${pvc.namespace}",
        }}),
    );
    let claim = f.claim("data", Some("fast"), "64Mi", json!({}));
    let uid = claim["metadata"]["uid"].as_str().unwrap().to_owned();
    let pvc = f.wait_field(&PVCS, "default", "data", "/status/phase", "Bound");
    let pv_name = format!("pvc-{uid}");
    assert_eq!(pvc["spec"]["volumeName"], pv_name.as_str());
    assert_eq!(pvc["status"]["capacity"]["storage"], "64Mi");
    assert_eq!(pvc["metadata"]["annotations"]["volume.kubernetes.io/storage-provisioner"], DRIVER);

    let creates = f.calls(|c| matches!(c, Call::Create(_)));
    let Some(Call::Create(req)) = creates.first() else { panic!("no CreateVolume: {creates:?}") };
    assert_eq!(req.name, pv_name);
    assert_eq!(req.capacity_range.unwrap().required_bytes, 64 << 20);
    assert_eq!(req.parameters, [("type".to_owned(), "thin".to_owned())].into());
    let cap = &req.volume_capabilities[0];
    assert_eq!(cap.access_mode.as_ref().unwrap().mode, 1, "SINGLE_NODE_WRITER");
    match &cap.access_type {
        Some(swiftlet::volumes::csi::api::volume_capability::AccessType::Mount(m)) => {
            assert_eq!((m.fs_type.as_str(), m.mount_flags.clone()), ("xfs", vec!["noatime".to_owned()]));
        }
        other => panic!("not a mount capability: {other:?}"),
    }
    let topology = req.accessibility_requirements.clone().unwrap();
    assert_eq!(topology.requisite[0].segments["topology.fake/zone"], "a");

    let pv = f.wait_field(&PVS, "", &pv_name, "/status/phase", "Bound");
    let csi = &pv["spec"]["csi"];
    assert_eq!(csi["driver"], DRIVER);
    assert_eq!(csi["volumeHandle"], format!("vol-{pv_name}").as_str());
    assert_eq!(csi["fsType"], "xfs");
    assert_eq!(csi["volumeAttributes"]["backing"], "loop");
    assert!(
        csi["volumeAttributes"]["storage.kubernetes.io/csiProvisionerIdentity"].as_str().unwrap().ends_with(DRIVER)
    );
    assert_eq!(csi["nodeStageSecretRef"], json!({"name": "stage-data", "namespace": "default"}));
    assert_eq!(pv["spec"]["capacity"]["storage"], "64Mi");
    assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Delete");
    assert_eq!(pv["spec"]["storageClassName"], "fast");
    assert_eq!(pv["spec"]["mountOptions"], json!(["noatime"]));
    assert_eq!(pv["spec"]["claimRef"]["uid"], uid.as_str());
    assert_eq!(pv["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"], DRIVER);
    assert_eq!(
        pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0],
        json!({"key": "topology.fake/zone", "operator": "In", "values": ["a"]})
    );
    for reason in ["ExternalProvisioning", "Provisioning", "ProvisioningSucceeded"] {
        f.wait_event("data", reason);
    }

    // Delete: DeleteVolume, then the PV goes.
    f.delete(&PVCS, "default", "data");
    f.wait_gone(&PVS, "", &pv_name);
    let deletes = f.calls(|c| matches!(c, Call::Delete(_)));
    assert!(matches!(&deletes[..], [Call::Delete(d)] if d.volume_id == format!("vol-{pv_name}")), "{deletes:?}");
}

#[test]
fn a_failing_driver_is_reported_and_retried() {
    let f = Fixture::new();
    f.class("fast", json!({}));
    f.csi.fail("create_volume", Some(tonic::Status::resource_exhausted("no space left in the pool")));
    f.claim("data", Some("fast"), "64Mi", json!({}));
    let e = f.wait_event("data", "ProvisioningFailed");
    assert_eq!(e["type"], "Warning");
    assert_eq!(
        e["message"],
        "failed to provision volume with StorageClass \"fast\": rpc error: code = ResourceExhausted desc = no space left in the pool"
    );
    assert_eq!(f.get(&PVCS, "default", "data").unwrap()["status"]["phase"], "Pending");
    f.csi.fail("create_volume", None);
    f.wait_field(&PVCS, "default", "data", "/status/phase", "Bound");
    assert!(f.calls(|c| matches!(c, Call::Create(_))).len() >= 2);

    // A class that does not exist is the PV controller's answer.
    f.claim("lost", Some("nope"), "64Mi", json!({}));
    assert_eq!(f.wait_event("lost", "ProvisioningFailed")["message"], "storageclass.storage.k8s.io \"nope\" not found");
}

#[test]
fn wait_for_first_consumer_provisions_for_the_pods_node() {
    let f = Fixture::new();
    f.node("n1", json!({"topology.fake/zone": "b"}));
    f.node("n2", json!({"topology.fake/zone": "c"}));
    f.csinode("n1", "node-1", &["topology.fake/zone"]);
    f.csinode("n2", "node-2", &["topology.fake/zone"]);
    f.class("late", json!({"volumeBindingMode": "WaitForFirstConsumer"}));
    f.claim("data", Some("late"), "64Mi", json!({}));
    let e = f.wait_event("data", "WaitForFirstConsumer");
    assert_eq!(e["message"], "waiting for first consumer to be created before binding");
    std::thread::sleep(Duration::from_millis(300));
    assert!(f.calls(|c| matches!(c, Call::Create(_))).is_empty(), "provisioned without a consumer");

    f.pod("user", "n2", json!([{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]));
    let pvc = f.wait_field(&PVCS, "default", "data", "/status/phase", "Bound");
    assert_eq!(pvc["metadata"]["annotations"]["volume.kubernetes.io/selected-node"], "n2");
    let creates = f.calls(|c| matches!(c, Call::Create(_)));
    let Some(Call::Create(req)) = creates.first() else { panic!("no CreateVolume") };
    let topology = req.accessibility_requirements.clone().unwrap();
    assert_eq!(topology.requisite.len(), 1);
    assert_eq!(topology.requisite[0].segments["topology.fake/zone"], "c");

    // A local volume for that node is taken before provisioning.
    let local = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}});
    f.edit(&NODES, "", "n1", |n| n["metadata"]["labels"]["kubernetes.io/hostname"] = "n1".into());
    let mut pv = static_pv("local-n1", "1Gi", "late", &["ReadWriteOnce"], json!({"nodeAffinity": local}));
    pv["spec"]["local"] = json!({"path": "/mnt/disk"});
    pv["spec"].as_object_mut().unwrap().remove("hostPath");
    f.create(&PVS, "", pv);
    f.claim("local", Some("late"), "64Mi", json!({}));
    f.pod("local-user", "n1", json!([{"name": "d", "persistentVolumeClaim": {"claimName": "local"}}]));
    let pvc = f.wait_field(&PVCS, "default", "local", "/status/phase", "Bound");
    assert_eq!(pvc["spec"]["volumeName"], "local-n1");
    assert_eq!(f.calls(|c| matches!(c, Call::Create(_))).len(), 1);
}

#[test]
fn volumes_attach_for_pods_and_detach_once_no_longer_in_use() {
    let f = Fixture::new();
    f.node("n1", json!({}));
    f.class("fast", json!({}));
    f.claim("data", Some("fast"), "64Mi", json!({}));
    let pvc = f.wait_field(&PVCS, "default", "data", "/status/phase", "Bound");
    let pv_name = pvc["spec"]["volumeName"].as_str().unwrap().to_owned();
    let handle = format!("vol-{pv_name}");
    let va_name = attachment_name(&handle, DRIVER, "n1");
    let unique = format!("kubernetes.io/csi/{DRIVER}^{handle}");

    // Before the kubelet registered the driver (no CSINode): an error, retried.
    f.pod("user", "n1", json!([{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]));
    let va = f.wait(&format!("attachError on {va_name}"), |f| {
        f.get(&VOLUME_ATTACHMENTS, "", &va_name).filter(|v| v.pointer("/status/attachError/message").is_some())
    });
    assert_eq!(va["spec"], json!({"attacher": DRIVER, "nodeName": "n1", "source": {"persistentVolumeName": pv_name}}));
    assert_eq!(va["status"]["attachError"]["message"], "csinode.storage.k8s.io \"n1\" not found");
    let e = f.wait_event("user", "FailedAttachVolume");
    assert_eq!(
        e["message"],
        format!("AttachVolume.Attach failed for volume \"{pv_name}\" : csinode.storage.k8s.io \"n1\" not found")
            .as_str()
    );

    f.csinode("n1", "node-1", &[]);
    let va = f.wait(&format!("{va_name} attached"), |f| {
        f.get(&VOLUME_ATTACHMENTS, "", &va_name).filter(|v| v["status"]["attached"] == true)
    });
    assert_eq!(va["status"]["attachmentMetadata"], json!({"devicePath": format!("/dev/fake/{handle}")}));
    assert!(va["status"].get("attachError").is_none());
    let publishes = f.calls(|c| matches!(c, Call::Publish(_)));
    let Some(Call::Publish(p)) = publishes.last() else { panic!("no ControllerPublishVolume") };
    assert_eq!((p.volume_id.as_str(), p.node_id.as_str()), (handle.as_str(), "node-1"));
    assert_eq!(p.volume_context["backing"], "loop");
    let node = f.wait("volumesAttached", |f| {
        f.get(&NODES, "", "n1").filter(|n| n.pointer("/status/volumesAttached").is_some_and(|v| v != &json!([])))
    });
    assert_eq!(node["status"]["volumesAttached"], json!([{"name": unique, "devicePath": ""}]));
    f.wait_event("user", "SuccessfulAttachVolume");

    // The pod goes, the kubelet still has the volume mounted: it stays.
    f.edit(&NODES, "", "n1", |n| n["status"]["volumesInUse"] = json!([unique]));
    f.delete(&PODS, "default", "user");
    std::thread::sleep(Duration::from_millis(500));
    assert!(f.get(&VOLUME_ATTACHMENTS, "", &va_name).is_some(), "detached while in use");
    assert!(f.calls(|c| matches!(c, Call::Unpublish(_))).is_empty());

    // Unmounted: detached.
    f.edit(&NODES, "", "n1", |n| n["status"]["volumesInUse"] = json!([]));
    f.wait_gone(&VOLUME_ATTACHMENTS, "", &va_name);
    let unpublishes = f.calls(|c| matches!(c, Call::Unpublish(_)));
    assert!(matches!(&unpublishes[..], [Call::Unpublish(u)] if u.volume_id == handle && u.node_id == "node-1"));
    f.wait("volumesAttached emptied", |f| {
        f.get(&NODES, "", "n1").filter(|n| n["status"]["volumesAttached"] == json!([]))
    });

    // A driver that needs no attach gets no VolumeAttachment.
    f.create(&CSIDRIVERS, "", json!({"metadata": {"name": DRIVER}, "spec": {"attachRequired": false}}));
    f.pod("again", "n1", json!([{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]));
    std::thread::sleep(Duration::from_millis(400));
    assert!(f.server.list(&VOLUME_ATTACHMENTS, None).is_empty());
}

#[test]
fn a_grown_claim_is_expanded_by_the_driver_then_by_the_node() {
    let f = Fixture::new();
    f.class("grow", json!({"allowVolumeExpansion": true}));
    f.claim("data", Some("grow"), "64Mi", json!({}));
    let pvc = f.wait_field(&PVCS, "default", "data", "/status/phase", "Bound");
    let pv_name = pvc["spec"]["volumeName"].as_str().unwrap().to_owned();
    f.csi.set_node_expansion(true);
    f.edit(&PVCS, "default", "data", |c| c["spec"]["resources"]["requests"]["storage"] = "128Mi".into());
    let pvc = f.wait_field(&PVCS, "default", "data", "/status/conditions/0/type", "FileSystemResizePending");
    assert_eq!(pvc["status"]["conditions"][0]["status"], "True");
    assert_eq!(pvc["status"]["allocatedResources"]["storage"], "128Mi");
    assert_eq!(pvc["status"]["capacity"]["storage"], "64Mi", "the node has not grown the file system yet");
    assert_eq!(f.get(&PVS, "", &pv_name).unwrap()["spec"]["capacity"]["storage"], "128Mi");
    let expands = f.calls(|c| matches!(c, Call::Expand(_)));
    let [Call::Expand(e)] = &expands[..] else { panic!("{expands:?}") };
    assert_eq!(e.capacity_range.unwrap().required_bytes, 128 << 20);
    assert_eq!(e.volume_id, format!("vol-{pv_name}"));
    f.wait_event("data", "Resizing");
    f.wait_event("data", "FileSystemResizeRequired");

    // The kubelet finishes: nothing more for the driver.
    f.edit(&PVCS, "default", "data", |c| {
        c["status"]["capacity"]["storage"] = "128Mi".into();
        c["status"]["conditions"] = json!([]);
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(f.calls(|c| matches!(c, Call::Expand(_))).len(), 1);

    // Without node expansion the claim has its capacity at once.
    f.csi.set_node_expansion(false);
    f.edit(&PVCS, "default", "data", |c| c["spec"]["resources"]["requests"]["storage"] = "256Mi".into());
    f.wait_field(&PVCS, "default", "data", "/status/capacity/storage", "256Mi");
    f.wait_event("data", "VolumeResizeSuccessful");

    f.csi.fail("controller_expand_volume", Some(tonic::Status::out_of_range("too big")));
    f.edit(&PVCS, "default", "data", |c| c["spec"]["resources"]["requests"]["storage"] = "1Gi".into());
    let e = f.wait_event("data", "VolumeResizeFailed");
    assert_eq!(
        e["message"],
        format!(
            "resize volume \"{pv_name}\" by resizer \"{DRIVER}\" failed: rpc error: code = OutOfRange desc = too big"
        )
        .as_str()
    );
}

#[test]
fn generic_ephemeral_claims_come_and_go_with_their_pod() {
    let f = Fixture::new();
    f.class("fast", json!({}));
    let template = json!({"metadata": {"labels": {"app": "scratch"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast", "resources": {"requests": {"storage": "32Mi"}}}});
    let pod = f.pod("worker", "n1", json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": template}}]));
    let pvc = f.wait_field(&PVCS, "default", "worker-scratch", "/status/phase", "Bound");
    assert_eq!(pvc["metadata"]["labels"]["app"], "scratch");
    assert_eq!(
        pvc["metadata"]["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Pod", "name": "worker", "uid": pod["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}])
    );
    let pv_name = pvc["spec"]["volumeName"].as_str().unwrap().to_owned();
    f.delete(&PODS, "default", "worker");
    f.wait_gone(&PVCS, "default", "worker-scratch");
    f.wait_gone(&PVS, "", &pv_name);
    assert_eq!(f.calls(|c| matches!(c, Call::Delete(_))).len(), 1);
}
