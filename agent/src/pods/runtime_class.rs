//! RuntimeClass: a pod's `runtimeClassName` resolved to the CRI runtime
//! handler passed in RunPodSandbox, as the kubelet's runtimeclass manager
//! does (no class: the runtime's default handler ""). The classes come
//! from the API server ([`RuntimeClassSource`], installed once its client
//! exists); without one (standalone mode) a pod naming a class does not
//! start, rather than run on the default runtime unnoticed.

use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;

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

/// The source in use, replaceable once the API client exists.
#[derive(Clone)]
pub struct RuntimeClasses(Arc<RwLock<Arc<dyn RuntimeClassSource>>>);

impl Default for RuntimeClasses {
    fn default() -> Self {
        RuntimeClasses(Arc::new(RwLock::new(Arc::new(NoRuntimeClasses))))
    }
}

impl RuntimeClasses {
    pub fn set_source(&self, source: Arc<dyn RuntimeClassSource>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = source;
    }

    /// The handler a pod's sandbox is created with.
    pub async fn handler_for(&self, pod: &Pod) -> Result<String, String> {
        let name = pod.spec.as_ref().and_then(|s| s.runtime_class_name.as_deref()).unwrap_or("");
        if name.is_empty() {
            return Ok(String::new());
        }
        let source = self.0.read().unwrap_or_else(|p| p.into_inner()).clone();
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
}
