//! Starting the servers from the composition root (`app.rs`).

use std::{path::Path, sync::Arc};

use tokio::sync::watch;

use super::{
    Server, ServerError, ServerParts, Servers, auth_from_config,
    health::{RUNTIME_UNREACHABLE_BOUND, RuntimeCheck},
    stats::{StatsConfig, StatsProvider, StatsRuntime},
};
use crate::{app::Agent, cri::RuntimeService, pods::source::PodView};

/// The API server client for the webhooks, from `--kubeconfig` (None in
/// standalone mode).
pub async fn api_client(config: &crate::config::Config) -> Result<Option<kube::Client>, ServerError> {
    if config.standalone() {
        return Ok(None);
    }
    // Before TLS bootstrap has written the kubeconfig, the bootstrap one.
    let kubeconfig = config.flags.kubeconfig.as_deref().filter(|p| p.exists());
    let Some(path) = kubeconfig.or(config.flags.bootstrap_kubeconfig.as_deref()) else {
        return Ok(None);
    };
    client_from_kubeconfig(path).await.map(Some)
}

pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client, ServerError> {
    super::tls::install_default_provider();
    let err = |e: &dyn std::fmt::Display| ServerError::ApiClient(format!("{}: {e}", path.display()));
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| err(&e))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| err(&e))?;
    kube::Client::try_from(cfg).map_err(|e| err(&e))
}

/// Builds the servers' state from the agent and starts them.
pub async fn serve(agent: &Agent, shutdown: watch::Receiver<bool>) -> Result<Servers, ServerError> {
    let config = Arc::new(agent.config.clone());
    let k = &config.kubelet;
    agent.health.register(Arc::new(RuntimeCheck { cri: agent.cri.clone(), bound: RUNTIME_UNREACHABLE_BOUND }));
    // The API agent's review client: the node's current credentials
    // (never the bootstrap kubeconfig's), and not the kubeAPIQPS bucket
    // the Lease and node status wait on. Without an API agent
    // (standalone), one of our own from the kubeconfig, if any.
    let client = match agent.api.as_ref() {
        Some(a) => Some(a.review_client()),
        None => api_client(&config).await?,
    };
    let client_ca = super::client_ca(&config)?;
    let (authn, authz) = auth_from_config(&config, client, client_ca.clone())?;
    let certificates = crate::certs::CertificateMetrics {
        client: agent.api.as_ref().and_then(|a| a.client_certificate.clone()),
        serving: agent.api.as_ref().and_then(|a| a.serving_certificate.clone()),
    };
    let runtime: Arc<dyn StatsRuntime> = agent.cri.clone();
    let pods: Arc<dyn PodView> = Arc::new(agent.pods.clone());
    let mut probes = prometheus_client::registry::Registry::default();
    agent.pod_metrics.register_probes(&mut probes);
    let stats = Arc::new(StatsProvider::new(
        StatsConfig {
            node_name: agent.node_name.clone(),
            root_dir: config.flags.root_dir.clone(),
            pod_logs_dir: k.pod_logs_dir.clone(),
            naming: k.cgroup_naming(),
            interval: config.swiftlet.housekeeping_interval,
        },
        agent.cgroupfs.clone(),
        pods.clone(),
        Some(runtime),
        Some(agent.metrics.clone()),
    ));
    let rt: Arc<dyn RuntimeService> = agent.cri.clone();
    let server = Arc::new(Server::new(ServerParts {
        node_name: agent.node_name.clone(),
        config: config.clone(),
        pods,
        stats,
        metrics: agent.metrics.clone(),
        health: agent.health.clone(),
        events: agent.debug_events.clone(),
        runtime: Some(rt),
        source: Some(agent.signals.source.clone()),
        ebpf: agent.signals.ebpf.clone(),
        authn,
        authz,
        probes,
        client_ca,
        serving: agent.api.as_ref().and_then(|a| a.serving_certificate.clone()),
        certificates,
    }));
    server.streaming.set_runtime(agent.cri.clone());
    super::start(server, shutdown).await
}
