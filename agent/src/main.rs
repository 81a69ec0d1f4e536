//! The `swiftlet` binary: reads the configuration as the kubelet does, then
//! runs the agent.

use std::{process::ExitCode, time::Duration};

use anyhow::{Context as _, Result};
use swiftlet::{
    cgroups::CgroupFs,
    config::{self, Config, Invocation},
    signals::{self, ebpf::EbpfOptions},
};
use tracing::{info, warn};

fn main() -> ExitCode {
    let config = match config::invocation(std::env::args().skip(1)) {
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
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| level.into()))
        .init();
}

fn run(config: Config) -> Result<()> {
    let cgroupfs = CgroupFs::detect().context("cgroup filesystem")?;
    let opened = signals::open(
        config.swiftlet.signal_source,
        cgroupfs,
        &EbpfOptions::default(),
        config.swiftlet.housekeeping_interval,
    )?;
    info!(mode = opened.source.mode().as_str(), standalone = config.standalone(), "swiftlet started");
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
