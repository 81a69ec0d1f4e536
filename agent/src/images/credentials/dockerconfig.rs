//! Registry credentials in Docker's config formats, as pull secrets hold
//! them: `kubernetes.io/dockerconfigjson` (`.dockerconfigjson`, with an
//! `auths` map) and `kubernetes.io/dockercfg` (`.dockercfg`, the map
//! itself). An entry's `auth` (base64 of `username:password`) takes the
//! place of its username and password, as the kubelet reads it. Pure.

use std::collections::BTreeMap;

use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use serde::Deserialize;

/// One registry's credentials.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Credential {
    pub username: String,
    pub password: String,
}

#[derive(Deserialize, Default)]
struct Entry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    auth: String,
}

#[derive(Deserialize)]
struct ConfigJson {
    #[serde(default)]
    auths: BTreeMap<String, Entry>,
}

fn credential(e: Entry) -> Result<Credential, String> {
    if e.auth.is_empty() {
        return Ok(Credential { username: e.username, password: e.password });
    }
    let bad = || "unable to parse auth field, must be formatted as base64(username:password)".to_owned();
    let decoded = base64::engine::general_purpose::STANDARD.decode(e.auth.trim()).map_err(|_| bad())?;
    let text = String::from_utf8(decoded).map_err(|_| bad())?;
    let (u, p) = text.split_once(':').ok_or_else(bad)?;
    Ok(Credential { username: u.to_owned(), password: p.trim_end_matches('\n').to_owned() })
}

/// A docker config: registry key (as written) → credential.
pub type DockerConfig = Vec<(String, Credential)>;

fn entries(map: BTreeMap<String, Entry>) -> Result<DockerConfig, String> {
    map.into_iter().map(|(k, e)| Ok((k, credential(e)?))).collect()
}

/// The credentials of a pull secret; a secret of another type holds none.
pub fn from_secret(secret: &Secret) -> Result<DockerConfig, String> {
    let data =
        |key: &str| secret.data.as_ref().and_then(|d| d.get(key)).map(|b| b.0.as_slice()).filter(|b| !b.is_empty());
    match secret.type_.as_deref() {
        Some("kubernetes.io/dockerconfigjson") => match data(".dockerconfigjson") {
            Some(bytes) => {
                let c: ConfigJson = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
                entries(c.auths)
            }
            None => Ok(vec![]),
        },
        Some("kubernetes.io/dockercfg") => match data(".dockercfg") {
            Some(bytes) => entries(serde_json::from_slice(bytes).map_err(|e| e.to_string())?),
            None => Ok(vec![]),
        },
        _ => Ok(vec![]),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;

    use super::*;

    fn secret(type_: &str, key: &str, json: &str) -> Secret {
        Secret {
            type_: Some(type_.into()),
            data: Some([(key.to_string(), ByteString(json.as_bytes().to_vec()))].into()),
            ..Default::default()
        }
    }

    #[test]
    fn both_formats_and_the_auth_field() {
        let s = secret(
            "kubernetes.io/dockerconfigjson",
            ".dockerconfigjson",
            r#"{"auths":{"registry.example.com":{"username":"u","password":"p"},"https://index.docker.io/v1/":{"auth":"dXNlcjpwYTpzcw=="}}}"#,
        );
        assert_eq!(
            from_secret(&s).unwrap(),
            vec![
                (
                    "https://index.docker.io/v1/".to_string(),
                    Credential { username: "user".into(), password: "pa:ss".into() }
                ),
                ("registry.example.com".to_string(), Credential { username: "u".into(), password: "p".into() }),
            ]
        );
        let old = secret("kubernetes.io/dockercfg", ".dockercfg", r#"{"quay.io":{"username":"q","password":"w"}}"#);
        assert_eq!(from_secret(&old).unwrap().len(), 1);
        let opaque = secret("Opaque", ".dockerconfigjson", "{}");
        assert!(from_secret(&opaque).unwrap().is_empty(), "only the docker types hold credentials");
        let broken = secret("kubernetes.io/dockerconfigjson", ".dockerconfigjson", r#"{"auths":{"r":{"auth":"!!"}}}"#);
        assert!(from_secret(&broken).unwrap_err().contains("base64(username:password)"));
        assert!(from_secret(&secret("kubernetes.io/dockerconfigjson", ".dockerconfigjson", "{")).is_err());
    }
}
