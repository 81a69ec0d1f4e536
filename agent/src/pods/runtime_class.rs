//! RuntimeClass: a pod's `runtimeClassName` resolved to the CRI runtime
//! handler passed in RunPodSandbox, as the kubelet's runtimeclass manager
//! does (no class: the runtime's default handler ""). The classes come
//! from the API server ([`RuntimeClassSource`], installed once its client
//! exists); without one (standalone mode) a pod naming a class does not
//! start, rather than run on the default runtime unnoticed.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;

/// Looks a RuntimeClass up by name.
#[async_trait]
pub trait RuntimeClassSource: Send + Sync {
    /// The class's handler, or why there is none (the kubelet's wording:
    /// `runtimeclass.node.k8s.io "x" not found`).
    async fn handler(&self, class: &str) -> Result<String, String>;
}

/// Standalone mode: no class can be resolved.
pub struct NoRuntimeClasses;

#[async_trait]
impl RuntimeClassSource for NoRuntimeClasses {
    async fn handler(&self, class: &str) -> Result<String, String> {
        Err(format!("cannot resolve RuntimeClass {class:?}: no API server to read it from (standalone mode)"))
    }
}

/// How long a sync waits for the API client before giving up for now
/// (the next sync asks again).
const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// The source in use, installed once the API client exists. Until then
/// (when an API server is configured) lookups wait for it, so a pod that
/// arrives with the first watch is not failed for a client about to be
/// installed.
#[derive(Clone)]
pub struct RuntimeClasses(Arc<watch::Sender<Option<Arc<dyn RuntimeClassSource>>>>);

impl Default for RuntimeClasses {
    /// Standalone mode: no class can be resolved.
    fn default() -> Self {
        RuntimeClasses(Arc::new(watch::Sender::new(Some(Arc::new(NoRuntimeClasses)))))
    }
}

impl RuntimeClasses {
    /// An API server is configured; its source comes with `set_source`.
    pub fn awaiting_api() -> Self {
        RuntimeClasses(Arc::new(watch::Sender::new(None)))
    }

    pub fn set_source(&self, source: Arc<dyn RuntimeClassSource>) {
        self.0.send_replace(Some(source));
    }

    /// The handler a pod's sandbox is created with.
    pub async fn handler_for(&self, pod: &Pod) -> Result<String, String> {
        self.handler_within(pod, CONNECT_WAIT).await
    }

    async fn handler_within(&self, pod: &Pod, wait: Duration) -> Result<String, String> {
        let name = pod.spec.as_ref().and_then(|s| s.runtime_class_name.as_deref()).unwrap_or("");
        if name.is_empty() {
            return Ok(String::new());
        }
        let mut rx = self.0.subscribe();
        let source = match tokio::time::timeout(wait, rx.wait_for(Option::is_some)).await {
            Ok(Ok(got)) => got.clone().expect("waited for a source"),
            _ => return Err(format!("cannot resolve RuntimeClass {name:?}: not connected to the API server yet")),
        };
        source.handler(name).await
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodSpec;

    use super::*;

    struct Fixed;

    #[async_trait]
    impl RuntimeClassSource for Fixed {
        async fn handler(&self, class: &str) -> Result<String, String> {
            match class {
                "gvisor" => Ok("runsc".into()),
                other => Err(format!("runtimeclass.node.k8s.io {other:?} not found")),
            }
        }
    }

    fn pod(class: Option<&str>) -> Pod {
        Pod {
            spec: Some(PodSpec { runtime_class_name: class.map(str::to_owned), ..Default::default() }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn classes_resolve_to_handlers() {
        let classes = RuntimeClasses::default();
        assert_eq!(classes.handler_for(&pod(None)).await, Ok(String::new()), "no class: the default handler");
        let standalone = classes.handler_for(&pod(Some("gvisor"))).await.unwrap_err();
        assert!(standalone.contains("standalone mode"), "{standalone}");
        classes.set_source(Arc::new(Fixed));
        assert_eq!(classes.handler_for(&pod(Some("gvisor"))).await, Ok("runsc".into()));
        assert_eq!(
            classes.handler_for(&pod(Some("kata"))).await,
            Err("runtimeclass.node.k8s.io \"kata\" not found".into())
        );
    }

    #[tokio::test]
    async fn lookups_wait_for_the_api_client() {
        let classes = RuntimeClasses::awaiting_api();
        assert_eq!(classes.handler_for(&pod(None)).await, Ok(String::new()));
        let early = classes.handler_within(&pod(Some("gvisor")), Duration::from_millis(20)).await.unwrap_err();
        assert!(early.contains("not connected to the API server yet"), "{early}");
        let waiting = {
            let classes = classes.clone();
            tokio::spawn(async move { classes.handler_for(&pod(Some("gvisor"))).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        classes.set_source(Arc::new(Fixed));
        assert_eq!(waiting.await.unwrap(), Ok("runsc".into()));
    }
}
