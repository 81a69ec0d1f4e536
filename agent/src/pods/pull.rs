//! The seam between the pod worker and image management: before creating
//! a container the worker asks for its image by the container's pull
//! policy, and gets the image reference or the kubelet's reason.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Container, Pod};

use super::security::ImageUser;
use crate::{cri::api, images::ImageManager};

/// Why a container's image is not available: the kubelet's waiting reason
/// (ErrImagePull, ImagePullBackOff, ErrImageNeverPull, InvalidImageName,
/// RegistryUnavailable, ImageInspectError) and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageFailure {
    pub reason: String,
    pub message: String,
}

/// A present image: the reference to create the container with and the
/// user it runs as (for runAsNonRoot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnsuredImage {
    pub image_ref: String,
    pub user: ImageUser,
}

#[async_trait]
pub trait ImageEnsurer: Send + Sync {
    /// Makes the container's image present according to its pull policy
    /// (with the pod's pull credentials).
    async fn ensure(
        &self,
        pod: &Pod,
        container: &Container,
        sandbox: &api::PodSandboxConfig,
    ) -> Result<EnsuredImage, ImageFailure>;
}

/// The pod worker's seam: the image manager in place of the plain
/// policy puller. The impl lives with the trait so the image module need
/// not know the pod worker.
#[async_trait]
impl ImageEnsurer for ImageManager {
    async fn ensure(
        &self,
        pod: &Pod,
        container: &Container,
        sandbox: &api::PodSandboxConfig,
    ) -> Result<EnsuredImage, ImageFailure> {
        self.ensure_image_status(pod, container, Some(sandbox))
            .await
            .map(|(r, status)| EnsuredImage { image_ref: r.0, user: ImageUser::of(status.as_ref()) })
            .map_err(|e| ImageFailure { reason: e.reason.as_str().to_owned(), message: e.message })
    }
}
