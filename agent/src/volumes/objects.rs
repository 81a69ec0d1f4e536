//! Where the API-backed volume sources and environment references get
//! their objects: ConfigMaps, Secrets and service account tokens
//! (TokenRequest), and what persistent volumes are resolved through
//! (PersistentVolumeClaims, PersistentVolumes, CSIDrivers,
//! VolumeAttachments), behind one small trait.
//!
//! - [`NoApiServer`]: standalone mode. Objects are not found (with the
//!   kubelet's wording, `configmap "x" not found`), so `optional` sources
//!   are empty and the others fail the way the kubelet reports them;
//!   tokens cannot be had.
//! - [`MemoryObjects`]: an in-memory store with change notifications, for
//!   tests and for embedding the agent.
//! - `kube::KubeObjects` (`volumes/kube.rs`): the API server, through the
//!   agent's `kube::Client`.

use std::{
    collections::HashMap,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, SystemTime},
};

use async_trait::async_trait;
use k8s_openapi::api::{
    core::v1::{ConfigMap, Container, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service},
    storage::v1::{CSIDriver, VolumeAttachment},
};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::broadcast;

/// The kinds of object volumes and environments read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    ConfigMap,
    Secret,
    PersistentVolumeClaim,
    PersistentVolume,
    CsiDriver,
    VolumeAttachment,
}

impl ObjectKind {
    /// The word the kubelet's errors use (`configmap "x" not found`).
    /// The storage objects' errors are the API server's, which names the
    /// resource (`persistentvolumeclaims "x" not found`).
    pub fn noun(self) -> &'static str {
        match self {
            ObjectKind::ConfigMap => "configmap",
            ObjectKind::Secret => "secret",
            ObjectKind::PersistentVolumeClaim => "persistentvolumeclaims",
            ObjectKind::PersistentVolume => "persistentvolumes",
            ObjectKind::CsiDriver => "csidrivers.storage.k8s.io",
            ObjectKind::VolumeAttachment => "volumeattachments.storage.k8s.io",
        }
    }
}

/// Names one object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub kind: ObjectKind,
    pub namespace: String,
    pub name: String,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    /// The object does not exist (an `optional` reference is then skipped).
    #[error("{} \"{name}\" not found", kind.noun())]
    NotFound { kind: ObjectKind, name: String },
    /// The API server cannot be reached (or there is none).
    #[error("{0}")]
    Unavailable(String),
    /// Any other answer (forbidden, malformed, ...).
    #[error("{0}")]
    Failed(String),
}

impl ObjectError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, ObjectError::NotFound { .. })
    }
}

/// A TokenRequest for a pod's service account (projected
/// `serviceAccountToken` sources).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenSpec {
    pub namespace: String,
    pub service_account: String,
    /// Empty: the API server's own audiences.
    pub audiences: Vec<String>,
    pub expiration_seconds: i64,
    /// The pod the token is bound to (name, uid).
    pub pod_name: String,
    pub pod_uid: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    pub token: String,
    pub expires_at: SystemTime,
}

/// Reads the objects pods refer to.
#[async_trait]
pub trait ObjectSource: Send + Sync {
    async fn get_config_map(&self, namespace: &str, name: &str) -> Result<ConfigMap, ObjectError>;
    async fn get_secret(&self, namespace: &str, name: &str) -> Result<Secret, ObjectError>;
    async fn request_token(&self, spec: &TokenSpec) -> Result<Token, ObjectError>;

    /// The services of `namespace` and of `default` (service environment
    /// variables). Without an API server there are none, as the kubelet's
    /// "kubelets without masters" set no service variables.
    async fn list_services(&self, _namespace: &str) -> Result<Vec<Service>, ObjectError> {
        Ok(vec![])
    }

    /// Changed objects, when the source can tell (the volume manager then
    /// updates the volumes that show them at once instead of at its next
    /// periodic refresh).
    fn subscribe(&self) -> Option<broadcast::Receiver<ObjectKey>> {
        None
    }

    async fn get_pvc(&self, _namespace: &str, _name: &str) -> Result<PersistentVolumeClaim, ObjectError> {
        Err(no_storage_api())
    }

    async fn get_pv(&self, _name: &str) -> Result<PersistentVolume, ObjectError> {
        Err(no_storage_api())
    }

    /// NotFound is an answer: a driver without a CSIDriver object gets the
    /// defaults (attach required, no pod info).
    async fn get_csi_driver(&self, _name: &str) -> Result<CSIDriver, ObjectError> {
        Err(no_storage_api())
    }

    async fn get_volume_attachment(&self, _name: &str) -> Result<VolumeAttachment, ObjectError> {
        Err(no_storage_api())
    }

    /// A JSON merge patch of the claim's status subresource (the node's
    /// part of a volume expansion).
    async fn patch_pvc_status(&self, _namespace: &str, _name: &str, _patch: Value) -> Result<(), ObjectError> {
        Err(no_storage_api())
    }
}

fn no_storage_api() -> ObjectError {
    ObjectError::Unavailable("persistent volumes need the API server (this node runs standalone)".into())
}

/// Standalone mode: no API server.
pub struct NoApiServer;

#[async_trait]
impl ObjectSource for NoApiServer {
    async fn get_config_map(&self, _namespace: &str, name: &str) -> Result<ConfigMap, ObjectError> {
        Err(ObjectError::NotFound { kind: ObjectKind::ConfigMap, name: name.into() })
    }

    async fn get_secret(&self, _namespace: &str, name: &str) -> Result<Secret, ObjectError> {
        Err(ObjectError::NotFound { kind: ObjectKind::Secret, name: name.into() })
    }

    async fn request_token(&self, spec: &TokenSpec) -> Result<Token, ObjectError> {
        Err(ObjectError::Unavailable(format!(
            "failed to fetch token: no API server to request a token for service account {}/{} from (standalone mode)",
            spec.namespace, spec.service_account
        )))
    }
}

/// An in-memory object store. Tokens it issues are
/// `<namespace>:<serviceaccount>:<n>` with the asked lifetime.
pub struct MemoryObjects {
    config_maps: Mutex<HashMap<(String, String), ConfigMap>>,
    secrets: Mutex<HashMap<(String, String), Secret>>,
    issued: AtomicU64,
    token_requests: Mutex<Vec<TokenSpec>>,
    services: Mutex<Vec<Service>>,
    changes: broadcast::Sender<ObjectKey>,
    storage: Mutex<StorageObjects>,
}

/// The storage objects of a [`MemoryObjects`], by namespace and name (""
/// for the cluster-scoped ones).
#[derive(Default)]
struct StorageObjects {
    claims: HashMap<(String, String), PersistentVolumeClaim>,
    volumes: HashMap<String, PersistentVolume>,
    drivers: HashMap<String, CSIDriver>,
    attachments: HashMap<String, VolumeAttachment>,
    status_patches: Vec<(String, String, Value)>,
}

impl Default for MemoryObjects {
    fn default() -> Self {
        MemoryObjects {
            config_maps: Mutex::default(),
            secrets: Mutex::default(),
            issued: AtomicU64::new(0),
            token_requests: Mutex::default(),
            services: Mutex::default(),
            changes: broadcast::channel(256).0,
            storage: Mutex::default(),
        }
    }
}

fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (String, String) {
    (meta.namespace.clone().unwrap_or_else(|| "default".into()), meta.name.clone().unwrap_or_default())
}

impl MemoryObjects {
    pub fn new() -> MemoryObjects {
        MemoryObjects::default()
    }

    /// Creates or replaces a ConfigMap (namespace "default" when unset).
    pub fn put_config_map(&self, cm: ConfigMap) {
        let (namespace, name) = key_of(&cm.metadata);
        self.config_maps.lock().insert((namespace.clone(), name.clone()), cm);
        let _ = self.changes.send(ObjectKey { kind: ObjectKind::ConfigMap, namespace, name });
    }

    pub fn delete_config_map(&self, namespace: &str, name: &str) {
        self.config_maps.lock().remove(&(namespace.to_owned(), name.to_owned()));
        let _ = self.changes.send(ObjectKey {
            kind: ObjectKind::ConfigMap,
            namespace: namespace.into(),
            name: name.into(),
        });
    }

    pub fn put_secret(&self, s: Secret) {
        let (namespace, name) = key_of(&s.metadata);
        self.secrets.lock().insert((namespace.clone(), name.clone()), s);
        let _ = self.changes.send(ObjectKey { kind: ObjectKind::Secret, namespace, name });
    }

    /// Creates or replaces a Service (namespace "default" when unset).
    pub fn put_service(&self, s: Service) {
        let key = key_of(&s.metadata);
        let mut all = self.services.lock();
        all.retain(|x| key_of(&x.metadata) != key);
        all.push(s);
    }

    /// Every TokenRequest made so far.
    pub fn token_requests(&self) -> Vec<TokenSpec> {
        self.token_requests.lock().clone()
    }

    pub fn put_pvc(&self, c: PersistentVolumeClaim) {
        self.storage.lock().claims.insert(key_of(&c.metadata), c);
    }

    pub fn put_pv(&self, v: PersistentVolume) {
        self.storage.lock().volumes.insert(v.metadata.name.clone().unwrap_or_default(), v);
    }

    pub fn put_csi_driver(&self, d: CSIDriver) {
        self.storage.lock().drivers.insert(d.metadata.name.clone().unwrap_or_default(), d);
    }

    pub fn put_volume_attachment(&self, a: VolumeAttachment) {
        self.storage.lock().attachments.insert(a.metadata.name.clone().unwrap_or_default(), a);
    }

    /// The claim status patches made so far: (namespace, name, patch).
    pub fn pvc_status_patches(&self) -> Vec<(String, String, Value)> {
        self.storage.lock().status_patches.clone()
    }
}

#[async_trait]
impl ObjectSource for MemoryObjects {
    async fn get_config_map(&self, namespace: &str, name: &str) -> Result<ConfigMap, ObjectError> {
        self.config_maps
            .lock()
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
            .ok_or_else(|| ObjectError::NotFound { kind: ObjectKind::ConfigMap, name: name.into() })
    }

    async fn get_secret(&self, namespace: &str, name: &str) -> Result<Secret, ObjectError> {
        self.secrets
            .lock()
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
            .ok_or_else(|| ObjectError::NotFound { kind: ObjectKind::Secret, name: name.into() })
    }

    async fn request_token(&self, spec: &TokenSpec) -> Result<Token, ObjectError> {
        self.token_requests.lock().push(spec.clone());
        let n = self.issued.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Token {
            token: format!("{}:{}:{n}", spec.namespace, spec.service_account),
            expires_at: SystemTime::now() + Duration::from_secs(spec.expiration_seconds.max(0) as u64),
        })
    }

    async fn list_services(&self, namespace: &str) -> Result<Vec<Service>, ObjectError> {
        let all = self.services.lock();
        Ok(all
            .iter()
            .filter(|s| {
                let ns = key_of(&s.metadata).0;
                ns == namespace || ns == "default"
            })
            .cloned()
            .collect())
    }

    fn subscribe(&self) -> Option<broadcast::Receiver<ObjectKey>> {
        Some(self.changes.subscribe())
    }

    async fn get_pvc(&self, namespace: &str, name: &str) -> Result<PersistentVolumeClaim, ObjectError> {
        let found = self.storage.lock().claims.get(&(namespace.to_owned(), name.to_owned())).cloned();
        found.ok_or_else(|| ObjectError::NotFound { kind: ObjectKind::PersistentVolumeClaim, name: name.into() })
    }

    async fn get_pv(&self, name: &str) -> Result<PersistentVolume, ObjectError> {
        let found = self.storage.lock().volumes.get(name).cloned();
        found.ok_or_else(|| ObjectError::NotFound { kind: ObjectKind::PersistentVolume, name: name.into() })
    }

    async fn get_csi_driver(&self, name: &str) -> Result<CSIDriver, ObjectError> {
        let found = self.storage.lock().drivers.get(name).cloned();
        found.ok_or_else(|| ObjectError::NotFound { kind: ObjectKind::CsiDriver, name: name.into() })
    }

    async fn get_volume_attachment(&self, name: &str) -> Result<VolumeAttachment, ObjectError> {
        let found = self.storage.lock().attachments.get(name).cloned();
        found.ok_or_else(|| ObjectError::NotFound { kind: ObjectKind::VolumeAttachment, name: name.into() })
    }

    async fn patch_pvc_status(&self, namespace: &str, name: &str, patch: Value) -> Result<(), ObjectError> {
        let mut st = self.storage.lock();
        let key = (namespace.to_owned(), name.to_owned());
        let Some(claim) = st.claims.get(&key).cloned() else {
            return Err(ObjectError::NotFound { kind: ObjectKind::PersistentVolumeClaim, name: name.into() });
        };
        let mut json = serde_json::to_value(&claim).map_err(|e| ObjectError::Failed(e.to_string()))?;
        if let Some(status) = patch.get("status") {
            merge(&mut json["status"], status);
        }
        let patched = serde_json::from_value(json).map_err(|e| ObjectError::Failed(e.to_string()))?;
        st.claims.insert(key, patched);
        st.status_patches.push((namespace.to_owned(), name.to_owned(), patch));
        Ok(())
    }
}

/// A JSON merge patch (RFC 7386) of `patch` into `target`.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let t = target.as_object_mut().expect("made an object above");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// The ConfigMaps and Secrets one container's environment refers to
/// (`configMapKeyRef`, `secretKeyRef`, `envFrom`), fetched before its
/// config is built so that building it stays pure. A name missing here
/// reads as not found.
#[derive(Clone, Debug, Default)]
pub struct EnvObjects {
    pub config_maps: HashMap<String, Result<ConfigMap, ObjectError>>,
    pub secrets: HashMap<String, Result<Secret, ObjectError>>,
    /// The services of the pod's namespace and of `default`, for service
    /// environment variables.
    pub services: Vec<Service>,
    /// Why the services could not be listed (the container cannot start).
    pub services_error: Option<ObjectError>,
}

impl EnvObjects {
    pub fn config_map(&self, name: &str) -> Result<&ConfigMap, ObjectError> {
        match self.config_maps.get(name) {
            Some(Ok(cm)) => Ok(cm),
            Some(Err(e)) => Err(e.clone()),
            None => Err(ObjectError::NotFound { kind: ObjectKind::ConfigMap, name: name.into() }),
        }
    }

    pub fn secret(&self, name: &str) -> Result<&Secret, ObjectError> {
        match self.secrets.get(name) {
            Some(Ok(s)) => Ok(s),
            Some(Err(e)) => Err(e.clone()),
            None => Err(ObjectError::NotFound { kind: ObjectKind::Secret, name: name.into() }),
        }
    }

    /// The names a container's environment refers to: (configMaps, secrets).
    pub fn references(c: &Container) -> (Vec<String>, Vec<String>) {
        let (mut cms, mut secrets) = (vec![], vec![]);
        for e in c.env_from.iter().flatten() {
            cms.extend(e.config_map_ref.as_ref().map(|r| r.name.clone()));
            secrets.extend(e.secret_ref.as_ref().map(|r| r.name.clone()));
        }
        for e in c.env.iter().flatten() {
            let Some(from) = &e.value_from else { continue };
            cms.extend(from.config_map_key_ref.as_ref().map(|r| r.name.clone()));
            secrets.extend(from.secret_key_ref.as_ref().map(|r| r.name.clone()));
        }
        cms.sort();
        cms.dedup();
        secrets.sort();
        secrets.dedup();
        (cms, secrets)
    }

    /// Fetches what `c` refers to, each object once.
    pub async fn fetch(source: &dyn ObjectSource, pod: &Pod, c: &Container) -> EnvObjects {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let (cms, secrets) = EnvObjects::references(c);
        let mut out = EnvObjects::default();
        for name in cms {
            let got = source.get_config_map(ns, &name).await;
            out.config_maps.insert(name, got);
        }
        for name in secrets {
            let got = source.get_secret(ns, &name).await;
            out.secrets.insert(name, got);
        }
        match source.list_services(ns).await {
            Ok(services) => out.services = services,
            Err(e) => out.services_error = Some(e),
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMapEnvSource, EnvFromSource, EnvVar, EnvVarSource, SecretKeySelector};

    use super::*;

    fn cm(ns: &str, name: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.namespace = Some(ns.into());
        c.metadata.name = Some(name.into());
        c
    }

    #[tokio::test]
    async fn standalone_objects_are_not_found_in_the_kubelets_words() {
        let e = NoApiServer.get_config_map("default", "x").await.unwrap_err();
        assert_eq!(e.to_string(), "configmap \"x\" not found");
        assert!(e.is_not_found());
        assert_eq!(NoApiServer.get_secret("default", "s").await.unwrap_err().to_string(), "secret \"s\" not found");
        let spec = TokenSpec {
            namespace: "ns".into(),
            service_account: "sa".into(),
            audiences: vec![],
            expiration_seconds: 3600,
            pod_name: "p".into(),
            pod_uid: "u".into(),
        };
        let e = NoApiServer.request_token(&spec).await.unwrap_err();
        assert!(!e.is_not_found());
        assert!(e.to_string().contains("ns/sa"), "{e}");
    }

    #[tokio::test]
    async fn memory_objects_store_notify_and_issue_tokens() {
        let m = MemoryObjects::new();
        let mut rx = m.subscribe().unwrap();
        m.put_config_map(cm("ns", "a"));
        assert_eq!(
            rx.recv().await.unwrap(),
            ObjectKey { kind: ObjectKind::ConfigMap, namespace: "ns".into(), name: "a".into() }
        );
        assert!(m.get_config_map("ns", "a").await.is_ok());
        assert!(m.get_config_map("other", "a").await.unwrap_err().is_not_found());
        m.delete_config_map("ns", "a");
        assert!(m.get_config_map("ns", "a").await.is_err());
        let spec = TokenSpec {
            namespace: "ns".into(),
            service_account: "sa".into(),
            audiences: vec!["api".into()],
            expiration_seconds: 600,
            pod_name: "p".into(),
            pod_uid: "u".into(),
        };
        let t1 = m.request_token(&spec).await.unwrap();
        let t2 = m.request_token(&spec).await.unwrap();
        assert_ne!(t1.token, t2.token);
        assert!(t1.expires_at > SystemTime::now() + Duration::from_secs(590));
        assert_eq!(m.token_requests().len(), 2);
    }

    #[tokio::test]
    async fn env_references_are_fetched_once_each() {
        let m = MemoryObjects::new();
        m.put_config_map(cm("ns", "settings"));
        let c = Container {
            env_from: Some(vec![EnvFromSource {
                config_map_ref: Some(ConfigMapEnvSource { name: "settings".into(), optional: None }),
                ..Default::default()
            }]),
            env: Some(vec![EnvVar {
                name: "PW".into(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector { name: "creds".into(), key: "pw".into(), optional: None }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let mut pod = Pod::default();
        pod.metadata.namespace = Some("ns".into());
        let got = EnvObjects::fetch(&m, &pod, &c).await;
        assert!(got.config_map("settings").is_ok());
        assert_eq!(got.secret("creds").unwrap_err().to_string(), "secret \"creds\" not found");
        assert!(got.config_map("unreferenced").unwrap_err().is_not_found());
    }
}
