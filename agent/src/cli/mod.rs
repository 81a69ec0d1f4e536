//! swiftlet's subcommands for the node's operator, beside the agent:
//!
//! - `swiftlet top`: a live per-pod, per-container view of working set,
//!   headroom to the limit, processes and inodes, from the BPF maps.
//! - `swiftlet events`: kernel events as JSON lines, from the running
//!   agent's /debug/events, or from the kernel directly.
//!
//! Both look where the running agent looks (its command line, read from
//! /proc: `running`), or where the kubelet flags they are given say
//! (`--config`, `--cgroup-root`, `--container-runtime-endpoint`,
//! `--root-dir`, `--eviction-hard`, ...), and work without the agent
//! running by loading their own instance of the kernel programs
//! ("attaching").

pub mod attach;
pub mod events;
pub mod running;
pub mod top;

use std::process::ExitCode;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("signals: {0}")]
    Signals(#[from] crate::signals::SignalError),
    #[error("cgroups: {0}")]
    Cgroup(#[from] crate::cgroups::CgroupError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Runs a subcommand when `args` (without the program name) starts with
/// one; None for the agent itself.
pub fn dispatch(args: &[String]) -> Option<ExitCode> {
    let (cmd, rest) = args.split_first()?;
    let result = match cmd.as_str() {
        "top" => top::run(rest),
        "events" => events::run(rest),
        _ => return None,
    };
    Some(match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("swiftlet {cmd}: {e}");
            ExitCode::from(1)
        }
    })
}

/// A subcommand's own options (name, value) and the kubelet flags left over.
pub type SplitArgs = (Vec<(String, String)>, Vec<String>);

/// Splits the subcommand's own options (`--name value` or `--name=value`,
/// and the boolean `switches`) from the kubelet flags, which pass through.
pub fn split_args(args: &[String], valued: &[&str], switches: &[&str]) -> Result<SplitArgs, CliError> {
    let mut own = vec![];
    let mut rest = vec![];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let Some(body) = a.strip_prefix("--") else {
            rest.push(a.clone());
            continue;
        };
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v.to_owned())),
            None => (body, None),
        };
        if valued.contains(&name) {
            let v = match inline {
                Some(v) => v,
                None => it.next().cloned().ok_or_else(|| CliError::Usage(format!("--{name} needs a value")))?,
            };
            own.push((name.to_owned(), v));
        } else if switches.contains(&name) {
            own.push((name.to_owned(), inline.unwrap_or_else(|| "true".into())));
        } else {
            rest.push(a.clone());
        }
    }
    Ok((own, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_options_and_kubelet_flags() {
        let args: Vec<String> =
            ["--sort", "memory", "--cgroup-root=/x", "--once", "--filter=web", "--v", "4"].map(String::from).to_vec();
        let (own, rest) = split_args(&args, &["sort", "filter"], &["once"]).unwrap();
        assert_eq!(
            own,
            vec![("sort".into(), "memory".into()), ("once".into(), "true".into()), ("filter".into(), "web".into())]
        );
        assert_eq!(rest, vec!["--cgroup-root=/x", "--v", "4"]);
        assert!(split_args(&["--sort".to_owned()], &["sort"], &[]).is_err());
    }
}
