//! Finding the running agent, so `swiftlet top` and `swiftlet events` look
//! where it looks without its flags being repeated (as `crictl` finds its
//! runtime): the agent's command line is read from /proc and loaded as the
//! agent loaded it, its relative paths resolved against its working
//! directory.

use std::{
    io,
    path::{Path, PathBuf},
};

use super::CliError;
use crate::config::{self, Config, ConfigFs};

/// A running swiftlet agent (not one of its subcommands).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningAgent {
    pub pid: u32,
    /// Its arguments, without the program name.
    pub args: Vec<String>,
    /// Its working directory, for relative paths in its arguments.
    pub cwd: PathBuf,
}

/// The subcommands of the binary: a process running one is not the agent.
const SUBCOMMANDS: &[&str] = &["top", "events"];

/// Whether a process whose executable is `exe` and whose arguments are
/// `argv` (program name first) is the agent.
pub fn is_agent(exe: &Path, argv: &[String]) -> bool {
    let name = exe.file_name().and_then(|n| n.to_str()).unwrap_or("");
    // A binary replaced while it runs reads as "swiftlet (deleted)".
    let name = name.strip_suffix(" (deleted)").unwrap_or(name);
    name == "swiftlet" && !argv.get(1).is_some_and(|a| SUBCOMMANDS.contains(&a.as_str()))
}

/// The agents running on this machine, found under `proc` (/proc), except
/// the process `own_pid`.
pub fn find(proc: &Path, own_pid: u32) -> Vec<RunningAgent> {
    let Ok(rd) = std::fs::read_dir(proc) else { return vec![] };
    let mut found: Vec<RunningAgent> = rd
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            if pid == own_pid {
                return None;
            }
            let exe = std::fs::read_link(e.path().join("exe")).ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let argv: Vec<String> = cmdline
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            if !is_agent(&exe, &argv) {
                return None;
            }
            let cwd = std::fs::read_link(e.path().join("cwd")).unwrap_or_else(|_| "/".into());
            Some(RunningAgent { pid, args: argv[1..].to_vec(), cwd })
        })
        .collect();
    found.sort_by_key(|a| a.pid);
    found
}

/// Which agent to follow: `wanted` (--agent-pid) among `found`, or the one
/// running. None when none runs (the kubelet's defaults then apply).
pub fn choose(found: &[RunningAgent], wanted: Option<u32>) -> Result<Option<RunningAgent>, CliError> {
    if let Some(pid) = wanted {
        return found
            .iter()
            .find(|a| a.pid == pid)
            .cloned()
            .map(Some)
            .ok_or_else(|| CliError::Usage(format!("--agent-pid {pid}: no swiftlet agent runs with that pid")));
    }
    match found {
        [] => Ok(None),
        [one] => Ok(Some(one.clone())),
        many => {
            let list: Vec<String> = many.iter().map(|a| format!("{} ({})", a.pid, a.args.join(" "))).collect();
            Err(CliError::Usage(format!(
                "{} swiftlet agents run here; choose one with --agent-pid or give its flags:\n  {}",
                many.len(),
                list.join("\n  ")
            )))
        }
    }
}

/// Reads configuration files as the agent would from its working directory.
struct FromCwd(PathBuf);

impl FromCwd {
    fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() { p.to_owned() } else { self.0.join(p) }
    }
}

impl ConfigFs for FromCwd {
    fn read_to_string(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(self.resolve(path))
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<(PathBuf, bool)>> {
        config::OsFs.read_dir(&self.resolve(dir))
    }
}

/// The running agent's configuration: its command line loaded as it was.
pub fn config_of(agent: &RunningAgent) -> Result<Config, CliError> {
    Ok(config::load_with(agent.args.clone(), &FromCwd(agent.cwd.clone()))?)
}

/// The configuration a subcommand looks with: the kubelet flags it was
/// given, or else those of the running agent (`agent_pid` picks one when
/// several run), or else the kubelet's defaults. Also says which it used.
pub fn subcommand_config(flags: Vec<String>, agent_pid: Option<u32>) -> Result<(Config, String), CliError> {
    if !flags.is_empty() && agent_pid.is_none() {
        return Ok((config::load(flags)?, "the flags given".into()));
    }
    let found = find(Path::new("/proc"), std::process::id());
    match choose(&found, agent_pid)? {
        Some(agent) if flags.is_empty() => Ok((config_of(&agent)?, format!("the agent's (pid {})", agent.pid))),
        Some(agent) => {
            let mut args = agent.args.clone();
            args.extend(flags);
            let cfg = config::load_with(args, &FromCwd(agent.cwd.clone()))?;
            Ok((cfg, format!("the agent's (pid {}) and the flags given", agent.pid)))
        }
        None => Ok((config::load(flags)?, "the kubelet's defaults (no agent runs)".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_proc(dir: &Path, pid: u32, exe: &str, argv: &[&str], cwd: &Path) {
        let p = dir.join(pid.to_string());
        std::fs::create_dir_all(&p).unwrap();
        std::os::unix::fs::symlink(exe, p.join("exe")).unwrap();
        std::os::unix::fs::symlink(cwd, p.join("cwd")).unwrap();
        let mut cmdline = argv.join("\0").into_bytes();
        cmdline.push(0);
        std::fs::write(p.join("cmdline"), cmdline).unwrap();
    }

    #[test]
    fn the_agent_is_found_and_its_subcommands_and_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = tempfile::tempdir().unwrap();
        let proc = dir.path();
        fake_proc(proc, 10, "/usr/bin/swiftlet", &["swiftlet", "--config=kubelet.yaml", "--root-dir=/r"], cwd.path());
        fake_proc(proc, 11, "/usr/bin/swiftlet", &["swiftlet", "top"], cwd.path());
        fake_proc(proc, 12, "/usr/bin/containerd", &["containerd"], cwd.path());
        fake_proc(proc, 13, "/opt/x/swiftlet (deleted)", &["/opt/x/swiftlet"], cwd.path());
        fake_proc(proc, 14, "/usr/bin/swiftlet", &["swiftlet", "--root-dir=/mine"], cwd.path());
        std::fs::create_dir_all(proc.join("self")).unwrap();
        let found = find(proc, 14);
        assert_eq!(found.iter().map(|a| a.pid).collect::<Vec<_>>(), vec![10, 13]);
        assert_eq!(found[0].args, vec!["--config=kubelet.yaml", "--root-dir=/r"]);
        assert_eq!(found[0].cwd, cwd.path());

        assert_eq!(choose(&found[..1], None).unwrap().map(|a| a.pid), Some(10));
        assert_eq!(choose(&[], None).unwrap(), None);
        let e = choose(&found, None).unwrap_err().to_string();
        assert!(e.starts_with("2 swiftlet agents run here; choose one with --agent-pid"), "{e}");
        assert_eq!(choose(&found, Some(13)).unwrap().map(|a| a.pid), Some(13));
        assert!(choose(&found, Some(99)).unwrap_err().to_string().contains("--agent-pid 99"));
    }

    #[test]
    fn the_agents_config_is_read_from_its_working_directory() {
        let cwd = tempfile::tempdir().unwrap();
        std::fs::write(
            cwd.path().join("kubelet.yaml"),
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupRoot: /from-file\n",
        )
        .unwrap();
        let agent = RunningAgent {
            pid: 10,
            args: vec!["--config=kubelet.yaml".into(), "--root-dir=/r".into()],
            cwd: cwd.path().to_owned(),
        };
        let c = config_of(&agent).unwrap();
        assert_eq!(c.kubelet.cgroup_root, "/from-file");
        assert_eq!(c.flags.root_dir, PathBuf::from("/r"));
    }
}
