//! Starting the :10250/:10255/healthz servers from the composition root.

use std::{path::Path, sync::Arc};

use tokio_util::sync::CancellationToken;

use super::Agent;
use crate::{
    cri::RuntimeService,
    metrics::storage::{ClaimStatsRow, VolumeCount, VolumeStates},
    pods::{manager::PodManager, source::PodView},
    server::{
        Server, ServerError, ServerParts, Servers, auth_from_config,
        health::{RUNTIME_UNREACHABLE_BOUND, RuntimeCheck},
        stats::{StatsConfig, StatsProvider, StatsRuntime},
    },
    volumes::{VolumeManager, manager::kind_of},
};

/// volume_manager_total_volumes: the desired state is every volume of the
/// pods that run or may run, the actual state what the volume manager has
/// set up.
struct VolumeWorld {
    pods: PodManager,
    volumes: Arc<VolumeManager>,
}

impl VolumeStates for VolumeWorld {
    fn volume_counts(&self) -> Vec<VolumeCount> {
        let desired = self.pods.running_pods().into_iter().flat_map(|(_, pod)| {
            pod.spec.into_iter().flat_map(|s| s.volumes.into_iter().flatten()).filter_map(|v| kind_of(&v).ok())
        });
        let desired: Vec<&'static str> = desired.map(|k| k.plugin_name()).collect();
        let actual = self.volumes.mounted_plugins();
        volume_counts(&desired, &actual)
    }

    fn claim_stats(&self) -> Vec<ClaimStatsRow> {
        let (at, stats) = self.volumes.cached_claim_stats();
        stats
            .into_iter()
            .map(|c| ClaimStatsRow {
                namespace: c.namespace,
                persistentvolumeclaim: c.claim,
                pod_uid: c.pod_uid,
                volume: c.volume,
                time: at,
                capacity_bytes: c.stats.capacity_bytes,
                available_bytes: c.stats.available_bytes,
                used_bytes: c.stats.used_bytes,
                inodes: c.stats.inodes,
                inodes_free: c.stats.inodes_free,
                inodes_used: c.stats.inodes_used,
                abnormal: c.abnormal_known.then_some(c.stats.abnormal.is_some()),
            })
            .collect()
    }
}

/// Counts per plugin and state, sorted.
fn volume_counts(desired: &[&'static str], actual: &[&'static str]) -> Vec<VolumeCount> {
    let mut counts: std::collections::BTreeMap<(&'static str, &'static str), u64> = Default::default();
    for (state, plugins) in [("desired_state_of_world", desired), ("actual_state_of_world", actual)] {
        for p in plugins {
            *counts.entry((*p, state)).or_default() += 1;
        }
    }
    counts
        .into_iter()
        .map(|((plugin, state), count)| VolumeCount { plugin_name: plugin.into(), state, count })
        .collect()
}

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
    crate::server::tls::install_default_provider();
    let err = |e: &dyn std::fmt::Display| ServerError::ApiClient(format!("{}: {e}", path.display()));
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| err(&e))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| err(&e))?;
    // Unpaced, but counted in the REST client metrics as every client.
    crate::kubeapi::client::client_from(cfg, 0, 0).map_err(|e| err(&e))
}

/// Builds the servers' state from the agent and starts them.
pub async fn serve(agent: &Agent, shutdown: CancellationToken) -> Result<Servers, ServerError> {
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
    let client_ca = crate::server::client_ca(&config)?;
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
            sandbox_image: agent.cri.sandbox_image().await.unwrap_or_default(),
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
        volumes: Some(Arc::new(VolumeWorld { pods: agent.pods.clone(), volumes: agent.volumes.clone() })),
        running: Some(agent.running_configs()),
        client_ca,
        serving: agent.api.as_ref().and_then(|a| a.serving_certificate.clone()),
        certificates,
    }));
    server.streaming.set_runtime(agent.cri.clone());
    crate::server::start(server, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_counts_per_plugin_and_state() {
        let c = volume_counts(
            &["kubernetes.io/empty-dir", "kubernetes.io/configmap", "kubernetes.io/empty-dir"],
            &["kubernetes.io/empty-dir"],
        );
        let rows: Vec<(&str, &str, u64)> = c.iter().map(|c| (c.plugin_name.as_str(), c.state, c.count)).collect();
        assert_eq!(
            rows,
            vec![
                ("kubernetes.io/configmap", "desired_state_of_world", 1),
                ("kubernetes.io/empty-dir", "actual_state_of_world", 1),
                ("kubernetes.io/empty-dir", "desired_state_of_world", 2),
            ]
        );
    }
}
