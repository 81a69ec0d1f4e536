//! RuntimeClasses read from the API server (`node.k8s.io/v1`): one GET per
//! sandbox creation, which is rare enough not to need the kubelet's
//! informer.

use async_trait::async_trait;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::Api;

use crate::pods::runtime_class::RuntimeClassSource;

pub struct KubeRuntimeClasses {
    client: kube::Client,
}

impl KubeRuntimeClasses {
    pub fn new(client: kube::Client) -> KubeRuntimeClasses {
        KubeRuntimeClasses { client }
    }
}

#[async_trait]
impl RuntimeClassSource for KubeRuntimeClasses {
    async fn handler(&self, class: &str) -> Result<String, String> {
        match Api::<RuntimeClass>::all(self.client.clone()).get(class).await {
            Ok(rc) => Ok(rc.handler),
            Err(kube::Error::Api(s)) if s.code == 404 => Err(format!("runtimeclass.node.k8s.io {class:?} not found")),
            Err(e) => Err(format!("failed to lookup RuntimeClass {class}: {e}")),
        }
    }
}
