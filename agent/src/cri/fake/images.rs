//! The fake's ImageService: lookups by id, normalized name or unique id
//! prefix, pulls as scripted (with credentials for private images), and the
//! image filesystem's usage.

use async_trait::async_trait;

use super::state::image_view;
use super::{FakeRuntime, Method, Pullable, err, normalize};
use crate::cri::{ImageService, Result, api};

#[async_trait]
impl ImageService for FakeRuntime {
    async fn list_images(&self) -> Result<Vec<api::Image>> {
        let _g = self.enter(Method::ListImages, "", &[]).await?;
        Ok(self.state.lock().images.iter().map(image_view).collect())
    }

    async fn image_status(&self, image: &str) -> Result<Option<api::Image>> {
        let _g = self.enter(Method::ImageStatus, image, &[]).await?;
        let s = self.state.lock();
        if s.ambiguous(image) {
            return Err(err(
                Method::ImageStatus,
                tonic::Code::Unknown,
                format!("can not resolve {image:?} locally: ambiguous digest string"),
            ));
        }
        Ok(s.find_image(image).map(|i| image_view(&s.images[i])))
    }

    async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        _sandbox_config: Option<api::PodSandboxConfig>,
    ) -> Result<String> {
        let _g = self.enter(Method::PullImage, image, &[]).await?;
        let normalized = normalize(image);
        let mut s = self.state.lock();
        s.pull_auths.push((image.to_owned(), auth.clone()));
        match s.pullable.get(&normalized).cloned() {
            Some(Pullable::Ok { size }) => {
                drop(s);
                Ok(self.add_image(&normalized, size))
            }
            Some(Pullable::Private { size, username, password }) => {
                let given = auth.map(|a| {
                    if a.username.is_empty() && !a.auth.is_empty() {
                        use base64::Engine;
                        let decoded = base64::engine::general_purpose::STANDARD.decode(&a.auth).unwrap_or_default();
                        let text = String::from_utf8_lossy(&decoded).into_owned();
                        let (u, p) = text.split_once(':').unwrap_or((&text, ""));
                        (u.to_owned(), p.to_owned())
                    } else {
                        (a.username, a.password)
                    }
                });
                drop(s);
                if given == Some((username, password)) {
                    return Ok(self.add_image(&normalized, size));
                }
                let host = normalized.split('/').next().unwrap_or("");
                Err(err(
                    Method::PullImage,
                    tonic::Code::Unknown,
                    format!(
                        "failed to pull and unpack image {normalized:?}: failed to resolve reference {normalized:?}: \
                         pulling from host {host} failed with status code [manifests]: 401 Unauthorized"
                    ),
                ))
            }
            Some(Pullable::Err { code, message }) => Err(err(Method::PullImage, code, message)),
            None => Err(err(
                Method::PullImage,
                tonic::Code::Unknown,
                format!(
                    "failed to pull and unpack image {normalized:?}: failed to resolve reference {normalized:?}: {normalized}: not found"
                ),
            )),
        }
    }

    async fn remove_image(&self, image: &str) -> Result<()> {
        let _g = self.enter(Method::RemoveImage, image, &[]).await?;
        let mut s = self.state.lock();
        if let Some(i) = s.find_image(image) {
            s.images.remove(i);
        }
        Ok(())
    }

    async fn image_fs_info(&self) -> Result<Vec<api::FilesystemUsage>> {
        let _g = self.enter(Method::ImageFsInfo, "", &[]).await?;
        let now = self.now_ns();
        let s = self.state.lock();
        let (mountpoint, used, inodes) = s.image_fs.clone().unwrap_or_else(|| {
            ("/fake/imagefs".into(), Some(s.images.iter().map(|i| i.size).sum()), Some(s.images.len() as u64))
        });
        Ok(vec![api::FilesystemUsage {
            timestamp: now,
            fs_id: Some(api::FilesystemIdentifier { mountpoint }),
            used_bytes: used.map(|value| api::UInt64Value { value }),
            inodes_used: inodes.map(|value| api::UInt64Value { value }),
        }])
    }
}
