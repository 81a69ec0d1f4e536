//! Credential provider plugins (the kubelet's exec plugins): for an image
//! one of its `matchImages` patterns matches, the plugin binary
//! `<bin-dir>/<name>` runs with the configured args and env (added to the
//! agent's own), gets a CredentialProviderRequest (`{"apiVersion":...,
//! "kind":"CredentialProviderRequest","image":"<repository>"}`) on stdin
//! and answers a CredentialProviderResponse on stdout: credentials per
//! registry key, a cacheKeyType (Image, Registry or Global) and an
//! optional cacheDuration. Answers are cached under that key for the
//! cacheDuration (or the provider's defaultCacheDuration; zero: not
//! cached), so the plugin runs again only once they expire. A plugin that
//! fails or answers nonsense gives no credentials (the pull goes on
//! without), as the kubelet's.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use parking_lot::Mutex;
use serde::Deserialize;
use tokio::io::AsyncWriteExt;

use super::{
    dockerconfig::{Credential, DockerConfig},
    keyring::urls_match,
    plugin_config::ProviderConfig,
};
use crate::config::duration;

/// How long a plugin may run (the kubelet's catch-all timeout).
const EXEC_TIMEOUT: Duration = Duration::from_secs(60);

/// What an answer is cached under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheKey {
    Image(String),
    Registry(String),
    Global,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawResponse {
    api_version: Option<String>,
    kind: Option<String>,
    cache_key_type: Option<String>,
    cache_duration: Option<String>,
    #[serde(default)]
    auth: BTreeMap<String, RawAuth>,
}

#[derive(Deserialize)]
struct RawAuth {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
}

/// A decoded CredentialProviderResponse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub cache_key: CacheKey,
    /// None: the provider's default.
    pub cache_duration: Option<Duration>,
    pub auth: DockerConfig,
}

/// The registry of a repository (its first path segment).
fn registry_of(image: &str) -> &str {
    image.split('/').next().unwrap_or(image)
}

/// Decodes a plugin's answer for `image`, checking it speaks `api_version`.
pub fn parse_response(api_version: &str, image: &str, data: &[u8]) -> Result<Response, String> {
    let raw: RawResponse =
        serde_json::from_slice(data).map_err(|e| format!("error decoding credential provider response: {e}"))?;
    let got = raw.api_version.unwrap_or_default();
    if got != api_version {
        return Err(format!(
            "apiVersion from credential plugin response did not match expected apiVersion:{api_version}, actual apiVersion:{got}"
        ));
    }
    if raw.kind.as_deref() != Some("CredentialProviderResponse") {
        return Err(format!("unexpected kind {:?} in the credential provider response", raw.kind.unwrap_or_default()));
    }
    let cache_key = match raw.cache_key_type.as_deref() {
        Some("Image") => CacheKey::Image(image.to_owned()),
        Some("Registry") => CacheKey::Registry(registry_of(image).to_owned()),
        Some("Global") => CacheKey::Global,
        other => return Err(format!("credential provider plugin did not return a valid cacheKeyType: {other:?}")),
    };
    let cache_duration = match raw.cache_duration {
        Some(d) => Some(
            duration::parse(&d).map_err(|_| format!("cacheDuration {d:?} is not a duration (such as 30s, 5m, 12h)"))?,
        ),
        None => None,
    };
    let auth =
        raw.auth.into_iter().map(|(k, a)| (k, Credential { username: a.username, password: a.password })).collect();
    Ok(Response { cache_key, cache_duration, auth })
}

/// The request a plugin reads on stdin.
pub fn request(api_version: &str, image: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": api_version,
        "kind": "CredentialProviderRequest",
        "image": image,
    }))
    .unwrap_or_default()
}

/// Cached answers with their expiry.
#[derive(Debug, Default)]
pub struct Cache {
    entries: Vec<(CacheKey, DockerConfig, Instant)>,
}

impl Cache {
    /// An unexpired answer for `image`: by image, then registry, then global.
    pub fn get(&mut self, image: &str, now: Instant) -> Option<DockerConfig> {
        self.entries.retain(|(_, _, until)| *until > now);
        let wanted =
            [CacheKey::Image(image.to_owned()), CacheKey::Registry(registry_of(image).to_owned()), CacheKey::Global];
        wanted.iter().find_map(|k| self.entries.iter().find(|(key, _, _)| key == k).map(|(_, c, _)| c.clone()))
    }

    /// Keeps an answer until `until`.
    pub fn put(&mut self, key: CacheKey, creds: DockerConfig, until: Instant) {
        self.entries.retain(|(k, _, _)| *k != key);
        self.entries.push((key, creds, until));
    }
}

/// One configured plugin.
pub struct Plugin {
    pub config: ProviderConfig,
    bin: PathBuf,
    cache: Mutex<Cache>,
    /// One run at a time, so concurrent pulls of one image run it once.
    running: tokio::sync::Mutex<()>,
}

impl Plugin {
    /// The plugin in `bin_dir`; its binary must exist (the kubelet checks
    /// at start).
    pub fn new(config: ProviderConfig, bin_dir: &Path) -> Result<Plugin, String> {
        let bin = bin_dir.join(&config.name);
        if !bin.is_file() {
            return Err(format!("plugin binary executable {} did not exist", bin.display()));
        }
        Ok(Plugin { config, bin, cache: Mutex::new(Cache::default()), running: tokio::sync::Mutex::new(()) })
    }

    pub fn matches(&self, image: &str) -> bool {
        self.config.match_images.iter().any(|m| urls_match(m, image))
    }

    fn cached(&self, image: &str) -> Option<DockerConfig> {
        self.cache.lock().get(image, Instant::now())
    }

    /// The plugin's credentials for an image repository (from the cache
    /// while they last).
    pub async fn provide(&self, image: &str) -> Result<DockerConfig, String> {
        if !self.matches(image) {
            return Ok(vec![]);
        }
        if let Some(c) = self.cached(image) {
            return Ok(c);
        }
        let _one = self.running.lock().await;
        if let Some(c) = self.cached(image) {
            return Ok(c);
        }
        let data = self.exec(image).await?;
        let response = parse_response(&self.config.api_version, image, &data)?;
        let ttl = response.cache_duration.unwrap_or(self.config.default_cache_duration);
        if !ttl.is_zero() {
            self.cache.lock().put(response.cache_key.clone(), response.auth.clone(), Instant::now() + ttl);
        }
        Ok(response.auth)
    }

    async fn exec(&self, image: &str) -> Result<Vec<u8>, String> {
        let name = &self.config.name;
        let mut child = tokio::process::Command::new(&self.bin)
            .args(&self.config.args)
            .envs(self.config.env.iter().map(|e| (e.name.as_str(), e.value.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("running credential provider {name}: {e}"))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(&request(&self.config.api_version, image))
                .await
                .map_err(|e| format!("writing to credential provider {name}: {e}"))?;
        }
        let out = tokio::time::timeout(EXEC_TIMEOUT, child.wait_with_output())
            .await
            .map_err(|_| format!("credential provider {name} did not answer within {EXEC_TIMEOUT:?}"))?
            .map_err(|e| format!("running credential provider {name}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "credential provider {name} failed: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(out.stdout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &str = "credentialprovider.kubelet.k8s.io/v1";

    #[test]
    fn responses_as_plugins_write_them() {
        let r = parse_response(
            V1,
            "123.dkr.ecr.eu-west-1.amazonaws.com/app",
            br#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"Registry","cacheDuration":"6h","auth":{"*.dkr.ecr.*.amazonaws.com":{"username":"AWS","password":"tok"}}}"#,
        )
        .unwrap();
        assert_eq!(r.cache_key, CacheKey::Registry("123.dkr.ecr.eu-west-1.amazonaws.com".into()));
        assert_eq!(r.cache_duration, Some(Duration::from_secs(6 * 3600)));
        assert_eq!(r.auth[0].1, Credential { username: "AWS".into(), password: "tok".into() });
        let wrong = parse_response(V1, "x/y", br#"{"apiVersion":"v9","kind":"CredentialProviderResponse"}"#);
        assert!(wrong.unwrap_err().starts_with("apiVersion from credential plugin response did not match"));
        let no_key = parse_response(
            V1,
            "x/y",
            br#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse"}"#,
        );
        assert!(no_key.unwrap_err().contains("cacheKeyType"));
        assert_eq!(
            String::from_utf8(request(V1, "r.io/a/b")).unwrap(),
            r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","image":"r.io/a/b","kind":"CredentialProviderRequest"}"#
        );
    }

    #[test]
    fn the_cache_looks_up_image_registry_then_global_and_expires() {
        let mut c = Cache::default();
        let t0 = Instant::now();
        let creds = |u: &str| vec![("k".to_string(), Credential { username: u.into(), password: String::new() })];
        c.put(CacheKey::Registry("r.io".into()), creds("registry"), t0 + Duration::from_secs(10));
        c.put(CacheKey::Image("r.io/a".into()), creds("image"), t0 + Duration::from_secs(5));
        assert_eq!(c.get("r.io/a", t0), Some(creds("image")));
        assert_eq!(c.get("r.io/b", t0), Some(creds("registry")));
        assert_eq!(c.get("r.io/a", t0 + Duration::from_secs(6)), Some(creds("registry")), "the image entry expired");
        assert_eq!(c.get("r.io/a", t0 + Duration::from_secs(11)), None);
        c.put(CacheKey::Global, creds("global"), t0 + Duration::from_secs(20));
        assert_eq!(c.get("q.io/z", t0 + Duration::from_secs(12)), Some(creds("global")));
    }
}
