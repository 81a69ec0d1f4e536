//! The pod calls the status manager and mirror pods make, behind a small
//! trait so their logic runs against an in-memory API in unit tests.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    NotFound,
    /// 409: a stale resourceVersion or a failed uid precondition.
    Conflict(String),
    AlreadyExists(String),
    /// Anything else (unreachable server, timeouts, refusals).
    Other(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::NotFound => f.write_str("not found"),
            CallError::Conflict(m) | CallError::AlreadyExists(m) | CallError::Other(m) => f.write_str(m),
        }
    }
}

impl From<kube::Error> for CallError {
    fn from(e: kube::Error) -> CallError {
        match e {
            kube::Error::Api(s) if s.code == 404 => CallError::NotFound,
            kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists" => CallError::AlreadyExists(s.message),
            kube::Error::Api(s) if s.code == 409 => CallError::Conflict(s.message),
            other => CallError::Other(other.to_string()),
        }
    }
}

#[async_trait]
pub trait PodApi: Send + Sync {
    async fn get(&self, namespace: &str, name: &str) -> Result<Pod, CallError>;
    /// A strategic merge patch of pods/<name>/status.
    async fn patch_status(&self, namespace: &str, name: &str, patch: &Value) -> Result<Pod, CallError>;
    async fn create(&self, namespace: &str, pod: &Pod) -> Result<Pod, CallError>;
    /// Deletes with a grace period and a uid precondition.
    async fn delete(&self, namespace: &str, name: &str, uid: &str, grace_seconds: i64) -> Result<(), CallError>;
}

/// The pod calls through kube's client, each bounded by `timeout`.
pub struct KubePodApi {
    pub client: kube::Client,
    pub timeout: std::time::Duration,
}

impl KubePodApi {
    fn api(&self, namespace: &str) -> kube::Api<Pod> {
        kube::Api::namespaced(self.client.clone(), namespace)
    }

    async fn bounded<T>(&self, f: impl std::future::Future<Output = Result<T, kube::Error>>) -> Result<T, CallError> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(r) => r.map_err(CallError::from),
            Err(_) => Err(CallError::Other(format!("no answer within {:?}", self.timeout))),
        }
    }
}

#[async_trait]
impl PodApi for KubePodApi {
    async fn get(&self, namespace: &str, name: &str) -> Result<Pod, CallError> {
        self.bounded(self.api(namespace).get(name)).await
    }

    async fn patch_status(&self, namespace: &str, name: &str, patch: &Value) -> Result<Pod, CallError> {
        self.bounded(self.api(namespace).patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))).await
    }

    async fn create(&self, namespace: &str, pod: &Pod) -> Result<Pod, CallError> {
        self.bounded(self.api(namespace).create(&PostParams::default(), pod)).await
    }

    async fn delete(&self, namespace: &str, name: &str, uid: &str, grace_seconds: i64) -> Result<(), CallError> {
        let params = DeleteParams {
            grace_period_seconds: Some(grace_seconds.max(0) as u32),
            preconditions: Some(Preconditions { uid: Some(uid.into()), resource_version: None }),
            ..Default::default()
        };
        self.bounded(self.api(namespace).delete(name, &params)).await.map(|_| ())
    }
}
