//! A kubelet credential provider plugin for tests
//! (credentialprovider.kubelet.k8s.io/v1): it reads the
//! CredentialProviderRequest on stdin, appends it as one line to the file
//! named by `PROVIDER_LOG`, and answers credentials for the request's
//! registry: `PROVIDER_USER` and `PROVIDER_PASSWORD`, cached per
//! `PROVIDER_CACHE_KEY` (default Registry) for `PROVIDER_CACHE_DURATION`
//! (left out when unset). The variables come from the provider's `env` in
//! the CredentialProviderConfig, as a real plugin's settings would.

use std::io::{Read, Write};

fn main() -> anyhow::Result<()> {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let request: serde_json::Value = serde_json::from_str(&input)?;
    if let Ok(log) = std::env::var("PROVIDER_LOG") {
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        writeln!(f, "{}", serde_json::to_string(&request)?)?;
    }
    anyhow::ensure!(request["kind"] == "CredentialProviderRequest", "not a CredentialProviderRequest: {input}");
    let image = request["image"].as_str().unwrap_or_default();
    let registry = image.split('/').next().unwrap_or_default();
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let mut response = serde_json::json!({
        "apiVersion": request["apiVersion"],
        "kind": "CredentialProviderResponse",
        "cacheKeyType": std::env::var("PROVIDER_CACHE_KEY").unwrap_or_else(|_| "Registry".into()),
        "auth": {registry: {"username": env("PROVIDER_USER"), "password": env("PROVIDER_PASSWORD")}},
    });
    if let Ok(d) = std::env::var("PROVIDER_CACHE_DURATION") {
        response["cacheDuration"] = d.into();
    }
    println!("{response}");
    Ok(())
}
