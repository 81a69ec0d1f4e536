//! The API client: kube-rs from `--kubeconfig` (after a TLS bootstrap from
//! `--bootstrap-kubeconfig` when the kubeconfig does not exist yet, as the
//! kubelet), every request paced by kubeAPIQPS/kubeAPIBurst.
//!
//! The agent's clients sit on a [`SwappableClient`]: with
//! rotateCertificates, each renewed client certificate gets a new
//! connection (pool) to the API server, in use at once; requests in flight
//! finish on the old one.
//!
//! [`SwappableClient`]: crate::certs::SwappableClient

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use kube::config::{KubeConfigOptions, Kubeconfig};

use super::{
    ApiError, bootstrap,
    instrument::RestClientLayer,
    ratelimit::{RateLimitLayer, RateLimiter},
};
use crate::{config::Config, metrics::rest_client::RestClientMetrics};

/// Where the client comes from.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientSettings {
    pub kubeconfig: Option<PathBuf>,
    pub bootstrap_kubeconfig: Option<PathBuf>,
    pub cert_dir: PathBuf,
    pub node_name: String,
    pub qps: u32,
    pub burst: u32,
    /// rotateCertificates.
    pub rotate_certificates: bool,
}

impl ClientSettings {
    pub fn from_config(config: &Config, node_name: &str) -> ClientSettings {
        ClientSettings {
            kubeconfig: config.flags.kubeconfig.clone(),
            bootstrap_kubeconfig: config.flags.bootstrap_kubeconfig.clone(),
            cert_dir: config.flags.cert_dir.clone(),
            node_name: node_name.into(),
            qps: config.kubelet.kube_api_qps,
            burst: config.kubelet.kube_api_burst,
            rotate_certificates: config.kubelet.rotate_certificates,
        }
    }
}

/// Reads a kubeconfig into kube's Config; errors name the file.
pub async fn load_kubeconfig(path: &Path) -> Result<kube::Config, ApiError> {
    let kc = Kubeconfig::read_from(path)
        .map_err(|e| ApiError::Kubeconfig { path: path.to_owned(), message: e.to_string() })?;
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| ApiError::Kubeconfig { path: path.to_owned(), message: e.to_string() })?;
    cfg.connect_timeout = Some(Duration::from_secs(10));
    Ok(cfg)
}

/// A client from a kube Config, paced by `qps`/`burst` (0 qps: unlimited),
/// every request counted in the REST client metrics.
pub fn client_from(cfg: kube::Config, qps: u32, burst: u32) -> Result<kube::Client, ApiError> {
    let limiter = Arc::new(RateLimiter::new(f64::from(qps), burst));
    let host = cfg.cluster_url.authority().map(|a| a.to_string()).unwrap_or_default();
    let builder = kube::client::ClientBuilder::try_from(cfg).map_err(|e| ApiError::Client(e.to_string()))?;
    // Inside the rate limiter: the latency is the request's, not its wait.
    let instrumented = builder.with_layer(&RestClientLayer { metrics: RestClientMetrics::global().clone(), host });
    Ok(instrumented.with_layer(&RateLimitLayer(limiter)).build())
}

/// A client with no rate limit of its own (the agent's clients put theirs
/// in front of the swappable one), every request counted in the REST
/// client metrics.
pub fn unlimited(cfg: kube::Config) -> Result<kube::Client, ApiError> {
    let host = cfg.cluster_url.authority().map(|a| a.to_string()).unwrap_or_default();
    let builder = kube::client::ClientBuilder::try_from(cfg).map_err(|e| ApiError::Client(e.to_string()))?;
    Ok(builder.with_layer(&RestClientLayer { metrics: RestClientMetrics::global().clone(), host }).build())
}

/// The kubeconfig the kubelet would use: bootstrapped first when it is
/// missing and a bootstrap kubeconfig is given.
pub async fn prepare(settings: &ClientSettings) -> Result<kube::Config, ApiError> {
    let Some(kubeconfig) = &settings.kubeconfig else {
        return Err(ApiError::Kubeconfig {
            path: PathBuf::new(),
            message: "no --kubeconfig: the path for the client kubeconfig is required".into(),
        });
    };
    if !kubeconfig.exists() {
        match &settings.bootstrap_kubeconfig {
            Some(b) => bootstrap::bootstrap(b, kubeconfig, &settings.cert_dir, &settings.node_name).await?,
            None => {
                return Err(ApiError::Kubeconfig {
                    path: kubeconfig.clone(),
                    message: "the file does not exist (and no --bootstrap-kubeconfig to create it)".into(),
                });
            }
        }
    }
    load_kubeconfig(kubeconfig).await
}

/// `cfg` authenticating with the pair in `pem_file` (certificate and key
/// in one file, as the certificate store keeps them).
pub fn with_identity(mut cfg: kube::Config, pem_file: &Path) -> kube::Config {
    let file = pem_file.display().to_string();
    cfg.auth_info.client_certificate = Some(file.clone());
    cfg.auth_info.client_key = Some(file);
    cfg.auth_info.client_certificate_data = None;
    cfg.auth_info.client_key_data = None;
    cfg.auth_info.token = None;
    cfg.auth_info.token_file = None;
    cfg
}
