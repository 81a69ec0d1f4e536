//! A CSI driver for the integration tests, on the CSI v1 protos (the agent
//! crate's generated types and servers), with loop devices, ext4 or btrfs
//! (the capability's fs_type) and real mounts behind it. What it does is in
//! `swiftlet_tests::csi_driver`.
//!
//! `swiftlet-test-csi-driver --name csi.swiftlet.dev --node-id NODE
//!  --csi-socket PATH --registry-dir DIR --state DIR
//!  [--topology-key topology.swiftlet.dev/node] [--max-volumes N] [--no-stage]
//!  [--require-attach] [--fail METHOD]... [--delay METHOD=MILLIS]... [--no-register]`
//!
//! - Serves Identity, Controller and Node on `--csi-socket`.
//! - Unless `--no-register`, serves the kubelet's plugin registration on
//!   `<registry-dir>/<name>-reg.sock` (bound before the CSI socket, so a
//!   driver that answers Probe can be registered).
//! - SIGTERM or SIGINT: both sockets are removed and it exits 0. SIGKILL
//!   leaves them, as a crash does; the next start removes stale ones.

use std::path::{Path, PathBuf};

use anyhow::Context;
use swiftlet::{pluginwatcher::api::registration_server::RegistrationServer, volumes::csi::api};
use swiftlet_tests::csi_driver::{Config, Driver, config::USAGE, registration::Registration};
use tokio::{
    net::UnixListener,
    signal::unix::{SignalKind, signal},
    sync::watch,
};
use tokio_stream::wrappers::UnixListenerStream;

/// Binds `path`, making its directory and removing a stale socket first.
fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing the stale socket {}", path.display()));
        }
        _ => {}
    }
    UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let mut config = match Config::parse(std::env::args().skip(1)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("swiftlet-test-csi-driver: {e}\nusage: {USAGE}");
            std::process::exit(1);
        }
    };
    config.csi_socket = absolute(&config.csi_socket);
    config.state = absolute(&config.state);
    config.registry_dir = config.registry_dir.as_deref().map(absolute);
    if let Err(e) = run(config).await {
        eprintln!("swiftlet-test-csi-driver: {e:#}");
        std::process::exit(1);
    }
}

async fn run(config: Config) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.state).with_context(|| format!("creating {}", config.state.display()))?;
    let mut terminate = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let driver = Driver::new(config.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut servers = tokio::task::JoinSet::new();

    let registration = config.registration_socket();
    if let Some(socket) = &registration {
        let listener = bind(socket)?;
        let service = Registration { driver: driver.clone(), endpoint: config.csi_socket.clone() };
        servers.spawn(
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(service))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stopped(stop_rx.clone())),
        );
        tracing::info!("registration on {}", socket.display());
    }
    let listener = bind(&config.csi_socket)?;
    servers.spawn(
        tonic::transport::Server::builder()
            .add_service(api::identity_server::IdentityServer::new(driver.clone()))
            .add_service(api::controller_server::ControllerServer::new(driver.clone()))
            .add_service(api::node_server::NodeServer::new(driver.clone()))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stopped(stop_rx.clone())),
    );
    tracing::info!(name = config.name, node = config.node_id, "serving CSI on {}", config.csi_socket.display());

    let failed = tokio::select! {
        _ = terminate.recv() => None,
        _ = interrupt.recv() => None,
        Some(r) = servers.join_next() => Some(r),
    };
    for socket in registration.iter().chain([&config.csi_socket]) {
        let _ = std::fs::remove_file(socket);
    }
    let _ = stop_tx.send(true);
    match failed {
        Some(Ok(Ok(()))) => anyhow::bail!("a server stopped by itself"),
        Some(Ok(Err(e))) => Err(e).context("serving"),
        Some(Err(e)) => Err(e).context("a server task"),
        None => {
            tracing::info!("stopping");
            // In-flight calls finish (they run to completion anyway), briefly.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
                while servers.join_next().await.is_some() {}
            })
            .await;
            Ok(())
        }
    }
}
