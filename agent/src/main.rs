//! The `swiftlet` binary: reads the configuration as the kubelet does, then
//! runs the agent.

use std::{process::ExitCode, sync::Arc};

use anyhow::{Context as _, Result};
use swiftlet::{
    app::{Agent, LogLevelHook},
    config::{self, Config, Invocation},
};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

fn main() -> ExitCode {
    swiftlet::heap::configure();
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `swiftlet top`, `swiftlet events`.
    if let Some(code) = swiftlet::cli::dispatch(&args) {
        return code;
    }
    let config = match config::invocation(args.iter()) {
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
    let log_level = init_logging(&config);
    for w in &config.warnings {
        warn!("{w}");
    }
    for problem in swiftlet::startup::apply_process_settings(&config.kubelet) {
        warn!("{problem}");
    }
    match run(config, args, log_level) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::from(1)
        }
    }
}

fn level(verbosity: u32) -> &'static str {
    match verbosity {
        0..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    }
}

/// kube-rs logs every failed request as an error; the API loops say once
/// what failed and that they retry.
fn default_filter(verbosity: u32) -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::new(format!("{},kube_client::client::builder=off", level(verbosity)))
}

/// RUST_LOG if set, else the kubelet's `--v` mapped onto levels; in the
/// latter case a reload can change the verbosity (the returned hook).
fn init_logging(config: &Config) -> Option<LogLevelHook> {
    use tracing_subscriber::{EnvFilter, layer::SubscriberExt, reload, util::SubscriberInitExt};
    if let Ok(filter) = EnvFilter::try_from_default_env() {
        tracing_subscriber::fmt().with_env_filter(filter).init();
        return None;
    }
    let (filter, handle) = reload::Layer::new(default_filter(config.kubelet.logging.verbosity));
    tracing_subscriber::registry().with(filter).with(tracing_subscriber::fmt::layer()).init();
    Some(Box::new(move |v| {
        if let Err(e) = handle.modify(|f| *f = default_filter(v)) {
            warn!("cannot change the log level: {e}");
        }
    }))
}

fn run(config: Config, args: Vec<String>, log_level: Option<LogLevelHook>) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let stop = CancellationToken::new();
let shutdown = stop.clone();
        let agent = Arc::new(Agent::build(config, shutdown).await.context("cannot start")?);
        if let Some(hook) = log_level {
            agent.set_log_level_hook(hook);
        }
        let running = tokio::spawn(agent.clone().run());
        let mut term = signal(SignalKind::terminate())?;
        let mut hup = signal(SignalKind::hangup())?;
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {
                    info!("SIGINT: stopping");
                    break;
                }
                _ = term.recv() => {
                    // During a node shutdown the pods stop first (in priority
                    // order, within shutdownGracePeriod); otherwise they keep
                    // running for the next start to adopt.
                    if agent.node_shutdown.on_sigterm().await {
                        info!("SIGTERM during a node shutdown: pods stopped, stopping");
                    } else {
                        info!("SIGTERM: stopping (pods keep running)");
                    }
                    break;
                }
                _ = hup.recv() => match config::load(args.iter()) {
                    Ok(new) => {
                        let diff = agent.reload(new);
                        info!(applied = ?diff.applied, needs_restart = ?diff.needs_restart, "SIGHUP: configuration reloaded");
                    }
                    // Nothing changes.
                    Err(e) => tracing::error!("SIGHUP: the configuration does not load, keeping the running one: {e}"),
                },
            }
        }
        stop.cancel();
        running.await?.context("agent")?;
        anyhow::Ok(())
    })
}
