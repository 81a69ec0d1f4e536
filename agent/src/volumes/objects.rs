//! Where the API-backed volume sources and environment references get
//! their objects: ConfigMaps, Secrets and service account tokens
//! (TokenRequest), behind one small trait.
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
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret, Service};
use parking_lot::Mutex;
use tokio::sync::broadcast;

/// The kinds of object volumes and environments read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    ConfigMap,
    Secret,
}

impl ObjectKind {
    /// The word the kubelet's errors use (`configmap "x" not found`).
    pub fn noun(self) -> &'static str {
        match self {
            ObjectKind::ConfigMap => "configmap",
            ObjectKind::Secret => "secret",
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
