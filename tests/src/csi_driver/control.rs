//! What the driver tells the test (`<state>/calls.log`) and what the test
//! tells the driver, in files re-read on every call so a running test can
//! change them: `fail` (method names, one a line), `delay`
//! (`METHOD=MILLIS` lines) and `abnormal` (`<volume id>[ <message>]`
//! lines: NodeGetVolumeStats reports that volume's condition abnormal).

use std::{
    io::Write,
    path::{Path, PathBuf},
    time::Duration,
};

use super::config::parse_delay;

pub const CALLS_FILE: &str = "calls.log";
pub const FAIL_FILE: &str = "fail";
pub const DELAY_FILE: &str = "delay";
pub const ABNORMAL_FILE: &str = "abnormal";

pub struct Control {
    state: PathBuf,
    fail: Vec<String>,
    delay: Vec<(String, Duration)>,
    log: parking_lot::Mutex<()>,
}

impl Control {
    /// `fail` and `delay` come from the command line and always apply.
    pub fn new(state: &Path, fail: &[String], delay: &[(String, Duration)]) -> Control {
        Control {
            state: state.to_owned(),
            fail: fail.to_vec(),
            delay: delay.to_vec(),
            log: parking_lot::Mutex::new(()),
        }
    }

    /// Appends one line to calls.log.
    pub fn log(&self, line: &str) {
        tracing::info!("{line}");
        let _serial = self.log.lock();
        let path = self.state.join(CALLS_FILE);
        match std::fs::OpenOptions::new().create(true).append(true).open(&path) {
            // One write per line, so concurrent calls never interleave.
            Ok(mut f) => {
                if let Err(e) = f.write_all(format!("{line}\n").as_bytes()) {
                    tracing::warn!("cannot write {}: {e}", path.display());
                }
            }
            Err(e) => tracing::warn!("cannot open {}: {e}", path.display()),
        }
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.state.join(file)).unwrap_or_default()
    }

    /// Whether `method` is to fail now.
    pub fn fails(&self, method: &str) -> bool {
        self.fail.iter().any(|m| m == method) || self.read(FAIL_FILE).lines().any(|l| l.trim() == method)
    }

    /// How long `method` is to wait first (the longest of what is asked).
    pub fn delay(&self, method: &str) -> Option<Duration> {
        let from_file = self.read(DELAY_FILE).lines().filter_map(parse_delay).collect::<Vec<_>>();
        self.delay.iter().chain(from_file.iter()).filter(|(m, _)| m == method).map(|(_, d)| *d).max()
    }

    /// The message when `volume_id`'s condition is to be abnormal.
    pub fn abnormal(&self, volume_id: &str) -> Option<String> {
        self.read(ABNORMAL_FILE).lines().find_map(|l| {
            let l = l.trim();
            let (id, message) = l.split_once(char::is_whitespace).unwrap_or((l, ""));
            let message = message.trim();
            (id == volume_id)
                .then(|| if message.is_empty() { "injected abnormal condition".to_owned() } else { message.to_owned() })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_read_on_every_call() {
        let dir = tempfile::tempdir().unwrap();
        let c = Control::new(dir.path(), &["Probe".into()], &[("Probe".into(), Duration::from_millis(5))]);
        assert!(c.fails("Probe"));
        assert!(!c.fails("NodeStageVolume"));
        std::fs::write(dir.path().join(FAIL_FILE), "NodeStageVolume\n").unwrap();
        assert!(c.fails("NodeStageVolume"));
        std::fs::write(dir.path().join(FAIL_FILE), "").unwrap();
        assert!(!c.fails("NodeStageVolume"));

        assert_eq!(c.delay("Probe"), Some(Duration::from_millis(5)));
        assert_eq!(c.delay("NodeGetInfo"), None);
        std::fs::write(dir.path().join(DELAY_FILE), "Probe=50\nNodeGetInfo=7\nbad line\n").unwrap();
        assert_eq!(c.delay("Probe"), Some(Duration::from_millis(50)));
        assert_eq!(c.delay("NodeGetInfo"), Some(Duration::from_millis(7)));

        assert_eq!(c.abnormal("v1"), None);
        std::fs::write(dir.path().join(ABNORMAL_FILE), "v1\nv2 disk on fire\n").unwrap();
        assert_eq!(c.abnormal("v1").as_deref(), Some("injected abnormal condition"));
        assert_eq!(c.abnormal("v2").as_deref(), Some("disk on fire"));
        assert_eq!(c.abnormal("v3"), None);

        c.log("one");
        c.log("two");
        assert_eq!(std::fs::read_to_string(dir.path().join(CALLS_FILE)).unwrap(), "one\ntwo\n");
    }
}
