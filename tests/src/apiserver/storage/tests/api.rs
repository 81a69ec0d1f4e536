//! Through HTTP: the API server's validation of claims (kube-rs) and its
//! printing of the storage kinds (kubectl).

use serde_json::{Value, json};

use super::fixture::{DRIVER, Fixture, static_pv};
use crate::apiserver::{
    Credentials, FakeApiServer,
    resources::{PVCS, PVS, STORAGE_CLASSES},
};

async fn client(server: &FakeApiServer) -> kube::Client {
    let path = server.dir().join("storage-tests.kubeconfig");
    server.write_kubeconfig(&path, &Credentials::None).unwrap();
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// The refusal a merge patch of the claim's spec gets: (code, message).
async fn patch_claim(
    api: &kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim>,
    spec: Value,
) -> Option<(u16, String)> {
    let p = kube::api::Patch::Merge(json!({"spec": spec}));
    match api.patch("data", &Default::default(), &p).await {
        Ok(_) => None,
        Err(kube::Error::Api(e)) => Some((e.code, e.message)),
        Err(e) => panic!("patch: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_updates_are_validated_as_the_api_server_does() {
    let f = Fixture::new();
    f.create(&PVS, "", static_pv("pv", "1Gi", "", &["ReadWriteOnce"], json!({})));
    let api: kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        kube::Api::namespaced(client(&f.server).await, "default");
    let pvc = serde_json::from_value(json!({"metadata": {"name": "data"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "storageClassName": "", "resources": {"requests": {"storage": "1Gi"}}}}))
    .unwrap();
    let created = api.create(&Default::default(), &pvc).await.unwrap();
    assert_eq!(created.status.unwrap().phase.as_deref(), Some("Pending"));
    f.wait_field(&PVCS, "default", "data", "/status/phase", "Bound");

    let name = "PersistentVolumeClaim \"data\" is invalid";
    assert_eq!(
        patch_claim(&api, json!({"resources": {"requests": {"storage": "512Mi"}}})).await,
        Some((
            422,
            format!("{name}: spec.resources.requests.storage: Forbidden: field can not be less than status.capacity")
        ))
    );
    assert_eq!(
        patch_claim(&api, json!({"accessModes": ["ReadWriteMany"]})).await,
        Some((
            422,
            format!(
                "{name}: spec: Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"
            )
        ))
    );
    assert_eq!(
        patch_claim(&api, json!({"resources": {"requests": {"storage": "2Gi"}}})).await,
        Some((403, "persistentvolumeclaims \"data\" is forbidden: only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize".to_owned()))
    );
    let bad =
        serde_json::from_value(json!({"metadata": {"name": "empty"}, "spec": {"accessModes": ["ReadWriteOnce"]}}))
            .unwrap();
    let Err(kube::Error::Api(e)) = api.create(&Default::default(), &bad).await else {
        panic!("created without storage")
    };
    assert_eq!(
        (e.code, e.message.as_str()),
        (422, "PersistentVolumeClaim \"empty\" is invalid: spec.resources[storage]: Required value")
    );

    // A class that allows expansion lets it grow.
    let class = json!({"metadata": {"name": "grow"}, "provisioner": DRIVER, "allowVolumeExpansion": true});
    f.create(&STORAGE_CLASSES, "", class);
    let grow = serde_json::from_value(json!({"metadata": {"name": "data"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "storageClassName": "grow", "resources": {"requests": {"storage": "64Mi"}}}}))
    .unwrap();
    let ns_api: kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        kube::Api::namespaced(client(&f.server).await, "kube-public");
    ns_api.create(&Default::default(), &grow).await.unwrap();
    f.wait_field(&PVCS, "kube-public", "data", "/status/phase", "Bound");
    assert_eq!(patch_claim(&ns_api, json!({"resources": {"requests": {"storage": "128Mi"}}})).await, None);
}

#[test]
fn kubectl_prints_claims_and_volumes() {
    let f = Fixture::new();
    f.class(
        "fast",
        json!({"metadata": {"name": "fast", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}}),
    );
    f.claim("data", None, "64Mi", json!({}));
    let pvc = f.wait_field(&PVCS, "default", "data", "/status/phase", "Bound");
    assert_eq!(pvc["spec"]["storageClassName"], "fast", "the default class");
    let pv = pvc["spec"]["volumeName"].as_str().unwrap().to_owned();
    let kubeconfig = f.server.dir().join("kubectl.kubeconfig");
    f.server.write_kubeconfig(&kubeconfig, &Credentials::None).unwrap();
    let k = crate::kubectl::Kubectl::current(&kubeconfig);
    let out = k.ok(&["get", "pvc,pv,sc"]);
    println!("$ kubectl get pvc,pv,sc ({})\n{out}", k.version());
    let rows = crate::kubectl::table(&out);
    let pvc_row =
        rows.iter().find(|r| r.first().is_some_and(|c| c == "persistentvolumeclaim/data")).expect("the claim's row");
    assert_eq!(pvc_row[1..6], ["Bound", pv.as_str(), "64Mi", "RWO", "fast"]);
    let pv_row = rows
        .iter()
        .find(|r| r.first().is_some_and(|c| *c == format!("persistentvolume/{pv}")))
        .expect("the volume's row");
    assert_eq!(pv_row[1..7], ["64Mi", "RWO", "Delete", "Bound", "default/data", "fast"]);
    let sc_row = rows
        .iter()
        .find(|r| r.first().is_some_and(|c| c == "storageclass.storage.k8s.io/fast"))
        .expect("the class's row");
    assert_eq!(sc_row[1..6], ["(default)", DRIVER, "Delete", "Immediate", "false"]);
}
