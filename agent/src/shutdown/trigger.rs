//! How the agent learns that the node is shutting down without logind
//! (`logind` is the systemd node's way, as the kubelet's), and as a safety
//! net beside it:
//!
//! 1. the shutdown marker file (`--node-shutdown-marker`, default
//!    `/run/swiftlet/node-shutdown`), created by whatever knows the node
//!    is going down (a systemd unit ordered before shutdown.target, an
//!    ACPI or UPS handler, an operator, a test). It counts only if it was
//!    made since the last boot, so a stale one left on a disk-backed
//!    /run does not stop the next start's pods;
//! 2. systemd, where it runs: `systemctl is-system-running` says
//!    `stopping`;
//! 3. SysV init: the utmp run-level record says 0 (halt) or 6 (reboot).
//!
//! The marker is polled (a stat every half second) and acts on its own;
//! the other two are asked when SIGTERM arrives.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, SystemTime},
};

/// Where the node's shutdown can be read from.
#[derive(Clone, Debug)]
pub struct Detector {
    pub marker: Option<PathBuf>,
    /// Ask systemd and utmp as well (off in tests, which run on a machine
    /// that is not shutting down).
    pub system: bool,
}

/// The boot time (btime in /proc/stat).
fn boot_time() -> Option<SystemTime> {
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(procfs::boot_time_secs().ok()?))
}

/// Whether the marker exists and was made since boot.
pub fn marker_present(path: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(path) else { return false };
    match (meta.modified(), boot_time()) {
        (Ok(m), Some(boot)) => m >= boot,
        _ => true,
    }
}

/// The run level in a utmp file's last RUN_LVL record (glibc x86-64
/// layout: 384-byte records, ut_type at 0, ut_pid at 4 holding the level's
/// character in its low byte).
pub fn utmp_runlevel(bytes: &[u8]) -> Option<char> {
    const RECORD: usize = 384;
    const RUN_LVL: i16 = 1;
    bytes.chunks_exact(RECORD).rfind(|r| i16::from_ne_bytes([r[0], r[1]]) == RUN_LVL).map(|r| char::from(r[4]))
}

impl Detector {
    /// Why the node is shutting down, or None.
    pub fn check(&self) -> Option<String> {
        if let Some(m) = &self.marker
            && marker_present(m)
        {
            return Some(format!("the shutdown marker {} exists", m.display()));
        }
        if !self.system {
            return None;
        }
        if Path::new("/run/systemd/system").exists()
            && let Ok(out) = Command::new("systemctl").arg("is-system-running").output()
            && String::from_utf8_lossy(&out.stdout).trim() == "stopping"
        {
            return Some("systemd is stopping the system".into());
        }
        for utmp in ["/run/utmp", "/var/run/utmp"] {
            if let Ok(b) = std::fs::read(utmp) {
                if let Some(level @ ('0' | '6')) = utmp_runlevel(&b) {
                    return Some(format!("the run level is {level}"));
                }
                break;
            }
        }
        None
    }

    /// Only the marker (cheap: polled).
    pub fn marker(&self) -> Option<String> {
        let m = self.marker.as_ref()?;
        marker_present(m).then(|| format!("the shutdown marker {} exists", m.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ty: i16, pid: i32) -> Vec<u8> {
        let mut r = vec![0u8; 384];
        r[0..2].copy_from_slice(&ty.to_ne_bytes());
        r[4..8].copy_from_slice(&pid.to_ne_bytes());
        r
    }

    #[test]
    fn run_level_from_utmp() {
        let mut b = record(2, 0); // BOOT_TIME
        b.extend(record(1, i32::from(b'N') * 256 + i32::from(b'3')));
        b.extend(record(7, 1234)); // USER_PROCESS
        assert_eq!(utmp_runlevel(&b), Some('3'));
        b.extend(record(1, i32::from(b'3') * 256 + i32::from(b'6')));
        assert_eq!(utmp_runlevel(&b), Some('6'));
        assert_eq!(utmp_runlevel(&record(7, 1)), None);
        assert_eq!(utmp_runlevel(&[0u8; 10]), None);
    }

    #[test]
    fn the_marker_counts_when_made_since_boot() {
        let d = tempfile::tempdir().unwrap();
        let m = d.path().join("node-shutdown");
        let det = Detector { marker: Some(m.clone()), system: false };
        assert_eq!(det.check(), None);
        std::fs::write(&m, "").unwrap();
        assert!(det.check().unwrap().contains("node-shutdown"));
        // Older than the boot: stale.
        let f = std::fs::File::options().write(true).open(&m).unwrap();
        f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1)).unwrap();
        assert_eq!(det.marker(), None);
    }
}
