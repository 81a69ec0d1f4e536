//! The seam between the pod worker and image management: before creating
//! a container the worker asks for its image by the container's pull
//! policy, and gets the image reference or the kubelet's reason.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Container, Pod};

use crate::cri::api;

/// Why a container's image is not available: the kubelet's waiting reason
/// (ErrImagePull, ImagePullBackOff, ErrImageNeverPull, InvalidImageName,
/// RegistryUnavailable, ImageInspectError) and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageFailure {
    pub reason: String,
    pub message: String,
}

#[async_trait]
pub trait ImageEnsurer: Send + Sync {
    /// Makes the container's image present according to its pull policy;
    /// returns the image reference to create the container with.
    async fn ensure(
        &self,
        pod: &Pod,
        container: &Container,
        sandbox: &api::PodSandboxConfig,
    ) -> Result<String, ImageFailure>;
}

/// Pull policy over the ImageService, without back-off: the image manager
/// (`images/`) replaces it where it is available.
pub struct PolicyPuller {
    pub images: std::sync::Arc<dyn crate::cri::ImageService>,
}

#[async_trait]
impl ImageEnsurer for PolicyPuller {
    async fn ensure(&self, _pod: &Pod, c: &Container, sandbox: &api::PodSandboxConfig) -> Result<String, ImageFailure> {
        let image = c.image.clone().unwrap_or_default();
        let policy = c.image_pull_policy.as_deref().unwrap_or("IfNotPresent");
        let fail = |reason: &str, message: String| ImageFailure { reason: reason.into(), message };
        if policy != "Always" {
            match self.images.image_status(&image).await {
                Ok(Some(img)) => return Ok(img.id),
                Ok(None) if policy == "Never" => {
                    return Err(fail(
                        "ErrImageNeverPull",
                        format!("Container image \"{image}\" is not present with pull policy of Never"),
                    ));
                }
                Ok(None) => {}
                Err(e) => return Err(fail("ImageInspectError", format!("Failed to inspect image \"{image}\": {e}"))),
            }
        }
        self.images
            .pull_image(&image, Some(sandbox.clone()))
            .await
            .map_err(|e| fail("ErrImagePull", format!("Failed to pull image \"{image}\": {}", e.message())))
    }
}
