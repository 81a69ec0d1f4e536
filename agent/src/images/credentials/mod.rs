//! Registry credentials for image pulls, as the kubelet finds them: the
//! pod's `imagePullSecrets` first (Docker config secrets, matched by
//! registry key; the service account's are copied into the pod by the API
//! server's ServiceAccount admission), then the node's own Docker config
//! (`<root-dir>/config.json`, `$HOME/.docker/config.json`) and the
//! credential provider plugins (`--image-credential-provider-config`).
//! The image manager pulls with each credential found until one works,
//! and without credentials when there are none.
//!
//! How to construct (the composition root does it):
//!
//! ```text
//! let plugins = match (&flags.image_credential_provider_config, &flags.image_credential_provider_bin_dir) {
//!     (Some(cfg), Some(dir)) => credentials::load_plugins(cfg, dir)?, // refuses to start on error
//!     _ => vec![],
//! };
//! let creds = PullCredentials::new(volumes.clone(), plugins).with_node_config(&root_dir);
//! let images = ImageManager::new(...).with_credentials(Arc::new(creds));
//! ```

pub mod dockerconfig;
pub mod keyring;
pub mod plugin;
pub mod plugin_config;

use std::{path::Path, sync::Arc};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, Secret};

pub use self::{dockerconfig::Credential, keyring::Keyring, plugin::Plugin};
use crate::cri::api;

/// Where pull secrets are read from.
#[async_trait]
pub trait SecretSource: Send + Sync {
    async fn secret(&self, namespace: &str, name: &str) -> Result<Secret, String>;
}

/// Reads the plugins of a CredentialProviderConfig file; any error stops
/// the agent from starting, as the kubelet.
pub fn load_plugins(config: &Path, bin_dir: &Path) -> Result<Vec<Plugin>, String> {
    let text = std::fs::read_to_string(config).map_err(|e| format!("{}: {e}", config.display()))?;
    plugin_config::parse(config, &text)?.into_iter().map(|p| Plugin::new(p, bin_dir)).collect()
}

/// What a lookup found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// In the order to try them.
    pub credentials: Vec<Credential>,
    /// Pull secrets that could not be read (the FailedToRetrieveImagePullSecret event).
    pub missing_secrets: Vec<String>,
    /// Plugins that failed (logged; the pull goes on without them).
    pub plugin_errors: Vec<String>,
}

impl Found {
    /// The CRI credentials to try, in order.
    pub fn auth_configs(&self) -> Vec<api::AuthConfig> {
        self.credentials
            .iter()
            .map(|c| api::AuthConfig {
                username: c.username.clone(),
                password: c.password.clone(),
                ..Default::default()
            })
            .collect()
    }
}

pub struct PullCredentials {
    secrets: Arc<dyn SecretSource>,
    node: Keyring,
    plugins: Vec<Plugin>,
}

impl PullCredentials {
    pub fn new(secrets: Arc<dyn SecretSource>, plugins: Vec<Plugin>) -> PullCredentials {
        PullCredentials { secrets, node: Keyring::default(), plugins }
    }

    /// Adds the node's Docker config files, where they exist (a file that
    /// does not parse is logged and left out).
    pub fn with_node_config(mut self, root_dir: &Path) -> PullCredentials {
        let home = std::env::var_os("HOME").map(|h| Path::new(&h).join(".docker").join("config.json"));
        for path in std::iter::once(root_dir.join("config.json")).chain(home) {
            let Ok(text) = std::fs::read(&path) else { continue };
            let secret = Secret {
                type_: Some("kubernetes.io/dockerconfigjson".into()),
                data: Some([(".dockerconfigjson".to_string(), k8s_openapi::ByteString(text))].into()),
                ..Default::default()
            };
            match dockerconfig::from_secret(&secret) {
                Ok(c) => self.node.add(&c),
                Err(e) => tracing::warn!(file = %path.display(), "registry credentials not read: {e}"),
            }
        }
        self
    }

    /// The credentials for pulling `repository` (`registry/path`, no tag)
    /// for `pod`; Err when a pull secret is not a valid Docker config.
    pub async fn lookup(&self, pod: &Pod, repository: &str) -> Result<Found, String> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let mut found = Found::default();
        let mut secrets = Keyring::default();
        let names = pod.spec.iter().flat_map(|s| s.image_pull_secrets.iter().flatten()).map(|r| r.name.as_str());
        for name in names.filter(|n| !n.is_empty()) {
            match self.secrets.secret(ns, name).await {
                Ok(s) => secrets.add(&dockerconfig::from_secret(&s).map_err(|e| format!("pull secret {name:?}: {e}"))?),
                Err(_) => found.missing_secrets.push(name.to_owned()),
            }
        }
        found.credentials.extend(secrets.lookup(repository));
        let mut node = self.node.clone();
        for p in &self.plugins {
            match p.provide(repository).await {
                Ok(c) => node.add(&c),
                Err(e) => found.plugin_errors.push(format!("credential provider {}: {e}", p.config.name)),
            }
        }
        found.credentials.extend(node.lookup(repository));
        Ok(found)
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod lookup_tests {
    use std::collections::HashMap;

    use k8s_openapi::{
        ByteString,
        api::core::v1::{LocalObjectReference, PodSpec},
    };

    use super::*;

    struct Secrets(HashMap<String, Secret>);

    #[async_trait]
    impl SecretSource for Secrets {
        async fn secret(&self, _ns: &str, name: &str) -> Result<Secret, String> {
            self.0.get(name).cloned().ok_or_else(|| format!("secret {name:?} not found"))
        }
    }

    fn pull_secret(registry: &str, user: &str) -> Secret {
        let json = format!(r#"{{"auths":{{"{registry}":{{"username":"{user}","password":"pw"}}}}}}"#);
        Secret {
            type_: Some("kubernetes.io/dockerconfigjson".into()),
            data: Some([(".dockerconfigjson".to_string(), ByteString(json.into_bytes()))].into()),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn pull_secrets_by_registry_and_missing_ones() {
        let secrets = Secrets(HashMap::from([
            ("private".to_string(), pull_secret("registry.example.com", "alice")),
            ("other".to_string(), pull_secret("quay.io", "bob")),
        ]));
        let creds = PullCredentials::new(Arc::new(secrets), vec![]);
        let pod = Pod {
            spec: Some(PodSpec {
                image_pull_secrets: Some(
                    ["private", "other", "gone"].iter().map(|n| LocalObjectReference { name: n.to_string() }).collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        let found = creds.lookup(&pod, "registry.example.com/team/app").await.unwrap();
        assert_eq!(found.credentials, vec![Credential { username: "alice".into(), password: "pw".into() }]);
        assert_eq!(found.missing_secrets, vec!["gone"]);
        assert_eq!(found.auth_configs()[0].username, "alice");
        assert!(creds.lookup(&pod, "ghcr.io/x/y").await.unwrap().credentials.is_empty());
    }
}
