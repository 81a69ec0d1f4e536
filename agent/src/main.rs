//! The `swiftlet` binary.

use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Parser;
use swiftlet::{
    cgroups::CgroupFs,
    signals::{self, SourceChoice, ebpf::EbpfOptions},
};
use tracing::info;

/// A Kubernetes node agent with event-driven, in-kernel eviction.
#[derive(Parser, Debug)]
#[command(name = "swiftlet", version, about, long_about = None)]
struct Cli {
    /// KubeletConfiguration file (kubelet.config.k8s.io/v1beta1).
    #[arg(long)]
    config: Option<std::path::PathBuf>,
    /// Static pod manifests directory.
    #[arg(long)]
    pod_manifest_path: Option<std::path::PathBuf>,
    /// CRI endpoint.
    #[arg(long)]
    container_runtime_endpoint: Option<String>,
    /// Directory for swiftlet's state.
    #[arg(long)]
    root_dir: Option<std::path::PathBuf>,
    /// Parent cgroup of kubepods.
    #[arg(long)]
    cgroup_root: Option<String>,
    /// Register the node with the API server.
    #[arg(long)]
    register_node: Option<bool>,
    /// Where eviction signals come from: auto, ebpf or cgroupfs.
    #[arg(long, default_value = "auto")]
    signal_source: SourceChoice,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let cgroupfs = CgroupFs::detect().context("cgroup filesystem")?;
    let opened = signals::open(cli.signal_source, cgroupfs, &EbpfOptions::default(), Duration::from_secs(10))?;
    info!(mode = opened.source.mode().as_str(), "swiftlet started");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let s = opened.source.snapshot()?;
                    info!(working_set_mib = s.node.working_set_bytes >> 20, tasks = s.node.tasks, "node");
                }
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
            }
        }
        info!("swiftlet stopped");
        anyhow::Ok(())
    })
}
