//! [`ObjectSource`] over the API server: GETs of ConfigMaps and Secrets in
//! the pod's namespace, TokenRequests (`POST
//! .../serviceaccounts/<name>/token`) bound to the pod, and the storage
//! objects persistent volumes are resolved through (claims, volumes, CSI
//! drivers, attachments; a claim's status patched after a node expansion). Build it with the
//! agent's `kube::Client` and hand it to `VolumeManager::set_objects`.
//!
//! The kubelet watches each referenced object; here the volume manager
//! re-reads them every refresh period (syncFrequency) instead, which costs
//! one GET per API-backed volume per period and needs no watch state.

use async_trait::async_trait;
use k8s_openapi::api::{
    authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
    core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Secret, Service, ServiceAccount},
    storage::v1::{CSIDriver, VolumeAttachment},
};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use parking_lot::Mutex;

use super::objects::{ObjectError, ObjectKind, ObjectSource, Token, TokenSpec};

pub struct KubeObjects {
    client: kube::Client,
    /// The last services listed per namespace: what the kubelet's lister
    /// would still hold while the API server is unreachable.
    services: Mutex<std::collections::HashMap<String, Vec<Service>>>,
}

impl KubeObjects {
    pub fn new(client: kube::Client) -> KubeObjects {
        KubeObjects { client, services: Default::default() }
    }

    /// The services of `ns`, or the last ones listed when the API server
    /// cannot be reached.
    async fn services_in(&self, ns: &str) -> Result<Vec<Service>, ObjectError> {
        let got = Api::<Service>::namespaced(self.client.clone(), ns).list(&ListParams::default()).await;
        let mut cache = self.services.lock();
        match got {
            Ok(list) => {
                cache.insert(ns.to_owned(), list.items.clone());
                Ok(list.items)
            }
            Err(kube::Error::HyperError(_) | kube::Error::Service(_)) if cache.contains_key(ns) => {
                Ok(cache[ns].clone())
            }
            Err(e @ (kube::Error::HyperError(_) | kube::Error::Service(_))) => Err(ObjectError::Unavailable(format!(
                "services have not yet been read at least once, cannot construct envvars: {e}"
            ))),
            Err(other) => Err(ObjectError::Failed(other.to_string())),
        }
    }
}

fn map_err(kind: ObjectKind, name: &str, e: kube::Error) -> ObjectError {
    match e {
        kube::Error::Api(s) if s.code == 404 => ObjectError::NotFound { kind, name: name.into() },
        kube::Error::Api(s) => ObjectError::Failed(format!("{} {name:?}: {} ({})", kind.noun(), s.message, s.code)),
        kube::Error::HyperError(_) | kube::Error::Service(_) => ObjectError::Unavailable(e.to_string()),
        other => ObjectError::Failed(other.to_string()),
    }
}

#[async_trait]
impl ObjectSource for KubeObjects {
    async fn get_config_map(&self, namespace: &str, name: &str) -> Result<ConfigMap, ObjectError> {
        Api::<ConfigMap>::namespaced(self.client.clone(), namespace)
            .get(name)
            .await
            .map_err(|e| map_err(ObjectKind::ConfigMap, name, e))
    }

    async fn get_secret(&self, namespace: &str, name: &str) -> Result<Secret, ObjectError> {
        Api::<Secret>::namespaced(self.client.clone(), namespace)
            .get(name)
            .await
            .map_err(|e| map_err(ObjectKind::Secret, name, e))
    }

    async fn request_token(&self, spec: &TokenSpec) -> Result<Token, ObjectError> {
        let req = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(spec.audiences.clone()),
                expiration_seconds: Some(spec.expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(spec.pod_name.clone()),
                    uid: Some(spec.pod_uid.clone()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let got = Api::<ServiceAccount>::namespaced(self.client.clone(), &spec.namespace)
            .create_token_request(&spec.service_account, &PostParams::default(), &req)
            .await
            .map_err(|e| match e {
                kube::Error::Api(s) => ObjectError::Failed(format!(
                    "failed to fetch token: serviceaccounts \"{}\" token request: {} ({})",
                    spec.service_account, s.message, s.code
                )),
                kube::Error::HyperError(_) | kube::Error::Service(_) => {
                    ObjectError::Unavailable(format!("failed to fetch token: {e}"))
                }
                other => ObjectError::Failed(format!("failed to fetch token: {other}")),
            })?;
        let status = got.status.ok_or_else(|| ObjectError::Failed("failed to fetch token: no status".into()))?;
        let (Some(token), Some(exp)) = (status.token, status.expiration_timestamp) else {
            return Err(ObjectError::Failed("failed to fetch token: the answer has no token or expiry".into()));
        };
        let expires_at =
            std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(exp.0.as_second().max(0) as u64);
        Ok(Token { token, expires_at })
    }

    /// A LIST per namespace at each container start (the kubelet keeps a
    /// watch-fed lister instead); while the API server is away the last
    /// lists stand in, as the lister's cache would.
    async fn list_services(&self, namespace: &str) -> Result<Vec<Service>, ObjectError> {
        let mut out = vec![];
        let namespaces = if namespace == "default" { vec!["default"] } else { vec![namespace, "default"] };
        for ns in namespaces {
            out.extend(self.services_in(ns).await?);
        }
        Ok(out)
    }

    async fn get_pvc(&self, namespace: &str, name: &str) -> Result<PersistentVolumeClaim, ObjectError> {
        Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace)
            .get(name)
            .await
            .map_err(|e| map_err(ObjectKind::PersistentVolumeClaim, name, e))
    }

    async fn get_pv(&self, name: &str) -> Result<PersistentVolume, ObjectError> {
        Api::<PersistentVolume>::all(self.client.clone())
            .get(name)
            .await
            .map_err(|e| map_err(ObjectKind::PersistentVolume, name, e))
    }

    async fn get_csi_driver(&self, name: &str) -> Result<CSIDriver, ObjectError> {
        Api::<CSIDriver>::all(self.client.clone()).get(name).await.map_err(|e| map_err(ObjectKind::CsiDriver, name, e))
    }

    async fn get_volume_attachment(&self, name: &str) -> Result<VolumeAttachment, ObjectError> {
        Api::<VolumeAttachment>::all(self.client.clone())
            .get(name)
            .await
            .map_err(|e| map_err(ObjectKind::VolumeAttachment, name, e))
    }

    async fn patch_pvc_status(&self, namespace: &str, name: &str, patch: serde_json::Value) -> Result<(), ObjectError> {
        Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map(drop)
            .map_err(|e| map_err(ObjectKind::PersistentVolumeClaim, name, e))
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, convert::Infallible, sync::Arc};

    use parking_lot::Mutex;

    use hyper::{Request, Response};
    use kube::client::Body;
    use serde_json::json;

    use super::*;

    /// An in-memory API server: GET of configmaps/secrets from a map, POST
    /// of serviceaccounts/<sa>/token, 404 otherwise; it records requests.
    #[derive(Clone, Default)]
    struct FakeApi {
        objects: Arc<Mutex<HashMap<String, serde_json::Value>>>,
        seen: Arc<Mutex<Vec<(String, String, serde_json::Value)>>>,
    }

    impl FakeApi {
        fn client(&self) -> kube::Client {
            let me = self.clone();
            let svc = tower::service_fn(move |req: Request<Body>| {
                let me = me.clone();
                async move { Ok::<_, Infallible>(me.answer(req).await) }
            });
            kube::Client::new(svc, "default")
        }

        async fn answer(&self, req: Request<Body>) -> Response<Body> {
            let method = req.method().to_string();
            let path = req.uri().path().to_owned();
            let body = req.into_body().collect_bytes().await.unwrap_or_default();
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
            self.seen.lock().push((method.clone(), path.clone(), body.clone()));
            let reply = |code: u16, v: serde_json::Value| {
                Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&v).unwrap()))
                    .unwrap()
            };
            if method == "POST" && path.ends_with("/token") {
                let mut out = body.clone();
                out["status"] = json!({"token": "jwt-for-test", "expirationTimestamp": "2030-01-01T00:00:00Z"});
                return reply(201, out);
            }
            match self.objects.lock().get(&path) {
                Some(v) => reply(200, v.clone()),
                None => reply(
                    404,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                           "message": format!("{path} not found"), "code": 404}),
                ),
            }
        }
    }

    #[tokio::test]
    async fn reads_objects_and_requests_bound_tokens() {
        let api = FakeApi::default();
        api.objects.lock().insert(
            "/api/v1/namespaces/ns/configmaps/settings".into(),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": "ns"},
                   "data": {"a": "1"}}),
        );
        api.objects.lock().insert(
            "/api/v1/namespaces/ns/secrets/creds".into(),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds", "namespace": "ns"},
                   "data": {"pw": "aHVudGVyMg=="}}),
        );
        let objects = KubeObjects::new(api.client());
        let cm = objects.get_config_map("ns", "settings").await.unwrap();
        assert_eq!(cm.data.unwrap()["a"], "1");
        let s = objects.get_secret("ns", "creds").await.unwrap();
        assert_eq!(s.data.unwrap()["pw"].0, b"hunter2");
        let e = objects.get_config_map("ns", "absent").await.unwrap_err();
        assert_eq!(e.to_string(), "configmap \"absent\" not found");
        assert!(objects.get_secret("other", "creds").await.unwrap_err().is_not_found());

        let spec = TokenSpec {
            namespace: "ns".into(),
            service_account: "builder".into(),
            audiences: vec!["vault".into()],
            expiration_seconds: 3607,
            pod_name: "web".into(),
            pod_uid: "uid-1".into(),
        };
        let t = objects.request_token(&spec).await.unwrap();
        assert_eq!(t.token, "jwt-for-test");
        assert_eq!(t.expires_at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs(), 1_893_456_000);
        let seen = api.seen.lock().clone();
        let (method, path, body) = seen.last().unwrap();
        assert_eq!((method.as_str(), path.as_str()), ("POST", "/api/v1/namespaces/ns/serviceaccounts/builder/token"));
        assert_eq!(body["spec"]["audiences"], json!(["vault"]));
        assert_eq!(body["spec"]["expirationSeconds"], json!(3607));
        assert_eq!(
            body["spec"]["boundObjectRef"],
            json!({"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "uid-1"})
        );
    }

    #[tokio::test]
    async fn an_unreachable_api_server_is_unavailable_not_missing() {
        let svc = tower::service_fn(|_req: Request<Body>| async {
            Err::<Response<Body>, _>(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused"))
        });
        let objects = KubeObjects::new(kube::Client::new(svc, "default"));
        let e = objects.get_config_map("ns", "x").await.unwrap_err();
        assert!(matches!(e, ObjectError::Unavailable(_)), "{e:?}");
        assert!(!e.is_not_found());
    }

    #[tokio::test]
    async fn services_listed_before_an_outage_stand_in_during_it() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let down = Arc::new(AtomicBool::new(false));
        let svc = {
            let down = down.clone();
            tower::service_fn(move |req: Request<Body>| {
                let down = down.load(Ordering::SeqCst);
                async move {
                    if down {
                        return Err(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused"));
                    }
                    let ns = req.uri().path().split('/').nth(4).unwrap_or_default().to_owned();
                    let list = json!({"apiVersion": "v1", "kind": "ServiceList", "metadata": {},
                        "items": [{"metadata": {"name": format!("svc-{ns}"), "namespace": ns},
                                   "spec": {"clusterIP": "10.0.0.1", "ports": [{"port": 80}]}}]});
                    Ok(Response::builder()
                        .header("content-type", "application/json")
                        .body(Body::from(serde_json::to_vec(&list).unwrap()))
                        .unwrap())
                }
            })
        };
        let objects = KubeObjects::new(kube::Client::new(svc, "default"));
        down.store(true, Ordering::SeqCst);
        let e = objects.list_services("ns").await.unwrap_err();
        assert!(matches!(e, ObjectError::Unavailable(_)), "{e:?}");
        assert!(e.to_string().contains("services have not yet been read at least once"), "{e}");
        down.store(false, Ordering::SeqCst);
        let names = |v: Vec<Service>| v.into_iter().map(|s| s.metadata.name.unwrap()).collect::<Vec<_>>();
        assert_eq!(names(objects.list_services("ns").await.unwrap()), ["svc-ns", "svc-default"]);
        down.store(true, Ordering::SeqCst);
        assert_eq!(names(objects.list_services("ns").await.unwrap()), ["svc-ns", "svc-default"]);
        assert!(objects.list_services("other").await.is_err(), "nothing cached for a namespace never listed");
    }
}
