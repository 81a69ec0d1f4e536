//! The credential provider configuration the kubelet reads from
//! `--image-credential-provider-config` (kind CredentialProviderConfig,
//! `kubelet.config.k8s.io/v1`, also v1beta1 and v1alpha1), checked as the
//! kubelet checks it before it starts: every provider needs a name that is
//! a plain file name of `--image-credential-provider-bin-dir`, at least one
//! `matchImages` pattern, a `defaultCacheDuration` and an `apiVersion` of
//! `credentialprovider.kubelet.k8s.io`. Errors name the file and provider.

use std::{path::Path, time::Duration};

use serde::Deserialize;

use crate::config::duration;

/// The request/response versions a plugin may speak.
pub const PLUGIN_API_VERSIONS: [&str; 3] = [
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
];
const CONFIG_API_VERSIONS: [&str; 3] =
    ["kubelet.config.k8s.io/v1", "kubelet.config.k8s.io/v1beta1", "kubelet.config.k8s.io/v1alpha1"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawConfig {
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    providers: Vec<RawProvider>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawProvider {
    #[serde(default)]
    name: String,
    #[serde(default)]
    match_images: Vec<String>,
    default_cache_duration: Option<String>,
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<EnvVar>,
    token_attributes: Option<serde::de::IgnoredAny>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EnvVar {
    pub name: String,
    pub value: String,
}

/// One plugin as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderConfig {
    pub name: String,
    pub match_images: Vec<String>,
    pub default_cache_duration: Duration,
    pub api_version: String,
    pub args: Vec<String>,
    pub env: Vec<EnvVar>,
}

/// Parses and validates a CredentialProviderConfig (YAML or JSON).
pub fn parse(path: &Path, text: &str) -> Result<Vec<ProviderConfig>, String> {
    let at = |msg: String| format!("{}: {msg}", path.display());
    let raw: RawConfig = serde_saphyr::from_str_with_options(text, crate::yaml_read::options())
        .map_err(|e| at(crate::yaml_read::YamlError::new(&e, text).to_string()))?;
    match raw.kind.as_deref() {
        Some("CredentialProviderConfig") => {}
        other => return Err(at(format!("kind: {other:?} is not \"CredentialProviderConfig\""))),
    }
    let version = raw.api_version.unwrap_or_default();
    if !CONFIG_API_VERSIONS.contains(&version.as_str()) {
        return Err(at(format!("apiVersion: {version:?} is not one of {}", CONFIG_API_VERSIONS.join(", "))));
    }
    if raw.providers.is_empty() {
        return Err(at("providers: at least 1 item in plugins is required".into()));
    }
    let mut out: Vec<ProviderConfig> = vec![];
    for (i, p) in raw.providers.into_iter().enumerate() {
        let field = |f: &str, msg: &str| at(format!("providers[{i}].{f}: {msg}"));
        if p.name.is_empty() {
            return Err(field("name", "name is required"));
        }
        if p.name.contains(['/', '\\']) {
            return Err(field("name", "provider name cannot contain '/'"));
        }
        if p.name.contains(' ') {
            return Err(field("name", "provider name cannot contain spaces"));
        }
        if p.name == "." || p.name == ".." {
            return Err(field("name", "provider name cannot be '.' or '..'"));
        }
        if out.iter().any(|o| o.name == p.name) {
            return Err(field("name", "duplicate provider name"));
        }
        if p.match_images.is_empty() {
            return Err(field("matchImages", "at least 1 item in matchImages is required"));
        }
        for m in &p.match_images {
            if m.is_empty() || m.contains("://") || m.contains(char::is_whitespace) {
                return Err(field("matchImages", &format!("match image {m:?} is invalid")));
            }
        }
        let Some(raw_duration) = p.default_cache_duration else {
            return Err(field("defaultCacheDuration", "defaultCacheDuration is required"));
        };
        let default_cache_duration = duration::parse(&raw_duration).map_err(|_| {
            field("defaultCacheDuration", &format!("{raw_duration:?} is not a duration (such as 30s, 5m, 12h)"))
        })?;
        if p.api_version.is_empty() {
            return Err(field("apiVersion", "apiVersion is required"));
        }
        if !PLUGIN_API_VERSIONS.contains(&p.api_version.as_str()) {
            return Err(field(
                "apiVersion",
                &format!("{:?} is not one of {}", p.api_version, PLUGIN_API_VERSIONS.join(", ")),
            ));
        }
        if p.token_attributes.is_some() {
            return Err(field(
                "tokenAttributes",
                "service account tokens for credential providers are not supported by this node",
            ));
        }
        out.push(ProviderConfig {
            name: p.name,
            match_images: p.match_images,
            default_cache_duration,
            api_version: p.api_version,
            args: p.args,
            env: p.env,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: ecr-credential-provider
    matchImages: ["*.dkr.ecr.*.amazonaws.com", "*.dkr.ecr.*.amazonaws.com.cn"]
    defaultCacheDuration: 12h
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: [get-credentials]
    env: [{name: AWS_PROFILE, value: temp}]
"#;

    #[test]
    fn reads_the_kubelets_format() {
        let p = parse(Path::new("/etc/cp.yaml"), GOOD).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].name, "ecr-credential-provider");
        assert_eq!(p[0].default_cache_duration, Duration::from_secs(12 * 3600));
        assert_eq!(p[0].env, vec![EnvVar { name: "AWS_PROFILE".into(), value: "temp".into() }]);
    }

    #[test]
    fn errors_name_the_file_and_field() {
        let cases = [
            (
                GOOD.replace("    defaultCacheDuration: 12h\n", ""),
                "/etc/cp.yaml: providers[0].defaultCacheDuration: defaultCacheDuration is required",
            ),
            (
                GOOD.replace("name: ecr-credential-provider", "name: ../bin/x"),
                "/etc/cp.yaml: providers[0].name: provider name cannot contain '/'",
            ),
            (
                GOOD.replace("credentialprovider.kubelet.k8s.io/v1\n", "v2\n"),
                "/etc/cp.yaml: providers[0].apiVersion: \"v2\" is not one of",
            ),
            (GOOD.replace("kind: CredentialProviderConfig", "kind: Other"), "/etc/cp.yaml: kind: Some(\"Other\")"),
            (
                GOOD.replace("[\"*.dkr.ecr.*.amazonaws.com\", \"*.dkr.ecr.*.amazonaws.com.cn\"]", "[]"),
                "at least 1 item in matchImages is required",
            ),
        ];
        for (text, want) in cases {
            let e = parse(Path::new("/etc/cp.yaml"), &text).unwrap_err();
            assert!(e.contains(want), "{e} should contain {want}");
        }
    }
}
