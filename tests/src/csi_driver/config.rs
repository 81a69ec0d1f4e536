//! The driver's command line.

use std::{path::PathBuf, time::Duration};

pub const USAGE: &str = "swiftlet-test-csi-driver --name NAME --node-id NODE --csi-socket PATH \
--registry-dir DIR --state DIR [--topology-key KEY] [--max-volumes N] [--no-stage] [--require-attach] \
[--fail METHOD]... [--delay METHOD=MILLIS]... [--no-register]";

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub name: String,
    pub node_id: String,
    pub csi_socket: PathBuf,
    /// None with --no-register.
    pub registry_dir: Option<PathBuf>,
    pub state: PathBuf,
    pub topology_key: Option<String>,
    pub max_volumes: i64,
    /// No STAGE_UNSTAGE_VOLUME: NodePublishVolume attaches and mounts.
    pub no_stage: bool,
    /// NodeStageVolume refuses without ControllerPublishVolume's context.
    pub require_attach: bool,
    /// Methods that always fail.
    pub fail: Vec<String>,
    /// Methods that sleep first.
    pub delay: Vec<(String, Duration)>,
}

impl Config {
    /// `<registry-dir>/<name>-reg.sock`, as node-driver-registrar names it.
    pub fn registration_socket(&self) -> Option<PathBuf> {
        self.registry_dir.as_ref().map(|d| d.join(format!("{}-reg.sock", self.name)))
    }

    /// Parses the arguments after the program name.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Config, String> {
        let mut c = Config {
            name: "csi.swiftlet.dev".into(),
            node_id: String::new(),
            csi_socket: PathBuf::new(),
            registry_dir: None,
            state: PathBuf::new(),
            topology_key: None,
            max_volumes: 0,
            no_stage: false,
            require_attach: false,
            fail: Vec::new(),
            delay: Vec::new(),
        };
        let mut no_register = false;
        let mut it = args.into_iter();
        while let Some(flag) = it.next() {
            let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "--name" => c.name = value()?,
                "--node-id" => c.node_id = value()?,
                "--csi-socket" => c.csi_socket = value()?.into(),
                "--registry-dir" => c.registry_dir = Some(value()?.into()),
                "--state" => c.state = value()?.into(),
                "--topology-key" => c.topology_key = Some(value()?),
                "--max-volumes" => c.max_volumes = value()?.parse().map_err(|e| format!("--max-volumes: {e}"))?,
                "--no-stage" => c.no_stage = true,
                "--require-attach" => c.require_attach = true,
                "--no-register" => no_register = true,
                "--fail" => c.fail.push(value()?),
                "--delay" => {
                    let v = value()?;
                    c.delay.push(parse_delay(&v).ok_or_else(|| format!("--delay {v:?}: want METHOD=MILLIS"))?);
                }
                other => return Err(format!("unknown flag {other}")),
            }
        }
        if no_register {
            c.registry_dir = None;
        } else if c.registry_dir.is_none() {
            return Err("--registry-dir is required (or --no-register)".into());
        }
        for (flag, missing) in [
            ("--node-id", c.node_id.is_empty()),
            ("--csi-socket", c.csi_socket.as_os_str().is_empty()),
            ("--state", c.state.as_os_str().is_empty()),
            ("--name", c.name.is_empty()),
        ] {
            if missing {
                return Err(format!("{flag} is required"));
            }
        }
        Ok(c)
    }
}

/// `METHOD=MILLIS`.
pub fn parse_delay(s: &str) -> Option<(String, Duration)> {
    let (method, ms) = s.trim().split_once('=')?;
    let ms: u64 = ms.trim().parse().ok()?;
    let method = method.trim();
    (!method.is_empty()).then(|| (method.to_owned(), Duration::from_millis(ms)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn parses_every_flag() {
        let c = Config::parse(args(
            "--name d.example --node-id n1 --csi-socket /s/csi.sock --registry-dir /r --state /st \
             --topology-key t/k --max-volumes 3 --no-stage --require-attach --fail NodeGetInfo \
             --fail Probe --delay NodeStageVolume=250",
        ))
        .unwrap();
        assert_eq!(c.name, "d.example");
        assert_eq!(c.node_id, "n1");
        assert_eq!(c.registration_socket(), Some(PathBuf::from("/r/d.example-reg.sock")));
        assert_eq!(c.topology_key.as_deref(), Some("t/k"));
        assert_eq!(c.max_volumes, 3);
        assert!(c.no_stage && c.require_attach);
        assert_eq!(c.fail, ["NodeGetInfo", "Probe"]);
        assert_eq!(c.delay, [("NodeStageVolume".to_owned(), Duration::from_millis(250))]);
    }

    #[test]
    fn defaults_and_no_register() {
        let c = Config::parse(args("--node-id n --csi-socket /s --state /st --no-register")).unwrap();
        assert_eq!(c.name, "csi.swiftlet.dev");
        assert_eq!(c.registration_socket(), None);
        assert_eq!(c.topology_key, None);
        assert!(!c.no_stage);
    }

    #[test]
    fn refuses_bad_input() {
        for bad in [
            "--node-id n --csi-socket /s --state /st",
            "--csi-socket /s --state /st --no-register",
            "--node-id n --csi-socket /s --state /st --no-register --delay NodeStageVolume",
            "--node-id n --csi-socket /s --state /st --no-register --max-volumes x",
            "--node-id n --csi-socket /s --state /st --no-register --bogus",
            "--node-id",
        ] {
            assert!(Config::parse(args(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn delays() {
        assert_eq!(parse_delay(" Probe = 10 "), Some(("Probe".into(), Duration::from_millis(10))));
        assert_eq!(parse_delay("=10"), None);
        assert_eq!(parse_delay("Probe=-1"), None);
    }
}
