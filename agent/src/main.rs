//! The `swiftlet` binary: reads the configuration as the kubelet does, then
//! runs the agent.

use std::{process::ExitCode, sync::Arc};

use anyhow::{Context as _, Result};
use swiftlet::{
    app::Agent,
    config::{self, Config, Invocation},
};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::watch,
};
use tracing::{info, warn};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `swiftlet top`, `swiftlet events`.
    if let Some(code) = swiftlet::cli::dispatch(&args) {
        return code;
    }
    let config = match config::invocation(args) {
        Ok(Invocation::Run(config)) => *config,
        Ok(Invocation::Help(text)) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Ok(Invocation::Version(text)) => {
            println!("{text}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // One line naming the file and line (or flag) and the field.
            eprintln!("swiftlet: {e}");
            return ExitCode::from(1);
        }
    };
    init_logging(&config);
    for w in &config.warnings {
        warn!("{w}");
    }
    match run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::from(1)
        }
    }
}

/// RUST_LOG if set, else the kubelet's `--v` mapped onto levels.
fn init_logging(config: &Config) {
    let level = match config.kubelet.logging.verbosity {
        0..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    };
    // kube-rs logs every failed request as an error; the API loops say
    // once what failed and that they retry.
    let default = format!("{level},kube_client::client::builder=off");
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default.into()))
        .init();
}

fn run(config: Config) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let (stop, shutdown) = watch::channel(false);
        let agent = Arc::new(Agent::build(config, shutdown).await.context("cannot start")?);
        let running = tokio::spawn(agent.run());
        let mut term = signal(SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => info!("SIGINT: stopping"),
            _ = term.recv() => info!("SIGTERM: stopping"),
        }
        let _ = stop.send(true);
        running.await?.context("agent")?;
        anyhow::Ok(())
    })
}
