//! `cargo xtask`: the project's build, test, demo and benchmark driver, and
//! the only place that installs prerequisites.

mod bench;
mod cmd;
mod containerd;
mod debian;
mod fuzz;
mod images;
mod modgraph;
mod package;
mod run;
mod setup;
mod test;
mod vm;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "swiftlet's build, test, demo and bench driver")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install every prerequisite (Debian packages, rust-src, bpf-linker).
    Setup,
    /// Build the eBPF programs (the agent's build script does this too).
    BuildEbpf,
    /// The module-graph check: no import cycle between the agent's
    /// top-level modules (`--graph` prints the graph as mermaid text).
    Lint(modgraph::Args),
    /// Install what is missing, then fmt, clippy, unit and integration tests.
    Test(test::Args),
    /// Start our own containerd and swiftlet on the static pods in examples/.
    Run(run::Args),
    /// Run the benchmarks and write target/bench/report.md and results.json.
    Bench(bench::Args),
    /// Run the parsers' property tests with fresh seeds for a bounded time.
    Fuzz(fuzz::Args),
    /// Build the Debian package (binary, systemd unit and drop-in, alerts,
    /// dashboard, maintainer scripts) into target/package.
    Package(package::Args),
    /// Start a project-local containerd and wait (for manual experiments).
    Containerd(ContainerdArgs),
    /// The kernel matrix: signal, eviction and kill tests on Debian's 6.1 and
    /// 6.12 kernels in qemu, and on this host.
    Vmtest(vm::Args),
}

#[derive(clap::Args)]
struct ContainerdArgs {
    /// Which containerd: 2.1 (Debian sid's), 1.7 (Debian 13's), both
    /// unpacked under ~/.cache/swiftlet, or 1.6 (this host's package).
    /// Default: $SWIFTLET_CONTAINERD_VERSION, else 2.1.
    #[arg(long, value_enum)]
    version: Option<containerd::Version>,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli.task) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\x1b[1;31merror:\x1b[0m {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(task: Task) -> Result<()> {
    match task {
        Task::Setup => setup::all().map(|_| ()),
        Task::BuildEbpf => {
            let tc = setup::ensure_ebpf_toolchain()?;
            setup::build_ebpf(&tc)
        }
        Task::Lint(args) => modgraph::run(args),
        Task::Test(args) => test::run(args),
        Task::Run(args) => run::run(args),
        Task::Bench(args) => bench::run(args),
        Task::Fuzz(args) => fuzz::run(args),
        Task::Vmtest(args) => vm::run(args),
        Task::Package(args) => package::run(args).map(|_| ()),
        Task::Containerd(args) => {
            setup::all()?;
            let version = match args.version {
                Some(v) => v,
                None => containerd::Version::from_env()?,
            };
            // Ctrl-C from here on stops the containers, then containerd.
            run::install_handlers();
            let c = containerd::Containerd::start_version_interruptible(cmd::workspace_root(), "manual", version)?;
            cmd::step(format!(
                "containerd {} is running: CONTAINER_RUNTIME_ENDPOINT={}",
                c.version.name(),
                c.endpoint()
            ));
            cmd::note("press Ctrl-C to stop it");
            run::wait_for_interrupt();
            Ok(())
        }
    }
}
