//! Wake-ups for the cgroupfs source, so that without eBPF a crossing is
//! still seen when the kernel says something changed, not at the next poll.
//!
//! - `memory.events` (cgroup v2): the kernel notifies pollers (POLLPRI) when
//!   one of its counters moves: `high`, `max`, `oom`, `oom_kill`.
//! - `memory.high` as a tripwire (cgroup v2): set to a memory line's trigger
//!   on a cgroup whose `memory.high` nobody else set, it makes the kernel
//!   raise a `high` event the moment usage reaches the line. Usage includes
//!   page cache, so it fires at or before the working set crosses; the
//!   source then reads the working set. Side effect, deliberate: above the
//!   line the kernel reclaims the cgroup's cache and slows its allocations,
//!   which buys the eviction time. Restored to `max` when the line goes.
//! - PSI triggers (`memory.pressure` of a cgroup, or the node's): the kernel
//!   notifies when tasks stall on memory for 150 ms within 1 s.
//!
//! Everything else (process counts, cgroup v1 cgroups) is still polled.

use std::{
    fs::{File, OpenOptions},
    io::{self, Read, Seek, Write},
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    time::Duration,
};

use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec};

use crate::cgroups::Version;

/// The PSI trigger: some task stalled on memory 150 ms in a 1 s window.
pub const PSI_TRIGGER: &str = "some 150000 1000000";

/// The window of [`psi_trigger`]'s triggers: the shortest the kernel takes
/// from root (500 ms) doubled, so a trigger fires at most twice a second.
pub const PSI_TRIGGER_WINDOW: Duration = Duration::from_secs(1);

/// A PSI trigger that fires when some task stalled for `percent` of the
/// window (at least 1 ms: the kernel refuses a zero stall).
pub fn psi_trigger(percent: f64) -> String {
    let window_us = PSI_TRIGGER_WINDOW.as_micros() as u64;
    let stall_us = ((percent.clamp(0.0, 100.0) / 100.0) * window_us as f64) as u64;
    format!("some {} {window_us}", stall_us.clamp(1000, window_us))
}

/// What to watch for one memory line (pure; see [`plan`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchSpec {
    /// A PSI trigger on this pressure file.
    Psi(PathBuf),
    /// A cgroup's `memory.events`.
    Events(PathBuf),
    /// Set the cgroup's `memory.high` (this file) to the trigger, in bytes.
    Tripwire(PathBuf, u64),
}

/// A memory line the source watches: `cgroup_dir` None for the node.
pub struct Line<'a> {
    pub cgroup_dir: Option<&'a Path>,
    pub trigger_bytes: u64,
    /// The cgroup's current `memory.high` as read (None when unreadable).
    pub current_high: Option<&'a str>,
    /// Whether the tripwire there is already ours (we set it earlier).
    pub tripwire_is_ours: bool,
}

/// The watches for memory lines on this layout. `root` is the cgroup mount;
/// `psi_available` says whether the kernel has PSI (`/proc/pressure`).
pub fn plan(version: Version, root: &Path, psi_available: bool, lines: &[Line<'_>]) -> Vec<WatchSpec> {
    let mut out = vec![];
    for l in lines {
        match (l.cgroup_dir, version) {
            (None, Version::V2) if psi_available => out.push(WatchSpec::Psi(root.join("memory.pressure"))),
            (None, Version::V1) if psi_available => out.push(WatchSpec::Psi("/proc/pressure/memory".into())),
            (Some(dir), Version::V2) => {
                out.push(WatchSpec::Events(dir.join("memory.events")));
                if psi_available {
                    out.push(WatchSpec::Psi(dir.join("memory.pressure")));
                }
                // Never overwrite a memory.high someone else chose. One at
                // exactly the trigger is ours from an earlier run that ended
                // without restoring it: take it back (and restore it later).
                let high = l.current_high.map(str::trim);
                if l.tripwire_is_ours || high == Some("max") || high == Some(l.trigger_bytes.to_string().as_str()) {
                    out.push(WatchSpec::Tripwire(dir.join("memory.high"), l.trigger_bytes));
                }
            }
            // cgroup v1 cgroups have neither memory.events nor per-cgroup PSI.
            _ => {}
        }
    }
    out.dedup();
    out
}

/// The strategy name for what [`plan`] would watch on this layout.
pub fn strategy_name(version: Version, psi_available: bool, interval: Duration) -> String {
    let poll = format!("poll {}", humantime(interval));
    match (version, psi_available) {
        (Version::V2, true) => format!("cgroupfs:memory.events+memory.high+psi, {poll}"),
        (Version::V2, false) => format!("cgroupfs:memory.events+memory.high, {poll}"),
        (Version::V1, true) => format!("cgroupfs:psi (node), {poll}"),
        (Version::V1, false) => format!("cgroupfs:{poll}"),
    }
}

fn humantime(d: Duration) -> String {
    if d.as_millis().is_multiple_of(1000) { format!("{}s", d.as_secs()) } else { format!("{}ms", d.as_millis()) }
}

/// True when the kernel has PSI.
pub fn psi_available() -> bool {
    Path::new("/proc/pressure/memory").exists()
}

/// An open watch: a file whose poll(2) says something changed.
pub struct Watch {
    file: File,
    pub path: PathBuf,
    psi: bool,
}

impl Watch {
    /// Registers a PSI trigger on `path` (the trigger lives while the file
    /// is open).
    pub fn psi(path: &Path) -> io::Result<Watch> {
        Watch::psi_with(path, PSI_TRIGGER)
    }

    /// Registers `trigger` (`some <stall µs> <window µs>`) on `path`.
    pub fn psi_with(path: &Path, trigger: &str) -> io::Result<Watch> {
        let mut file = OpenOptions::new().read(true).write(true).open(path)?;
        file.write_all(trigger.as_bytes())?;
        Ok(Watch { file, path: path.to_owned(), psi: true })
    }

    /// Watches a cgroupfs file for change notifications.
    pub fn events(path: &Path) -> io::Result<Watch> {
        let w = Watch { file: File::open(path)?, path: path.to_owned(), psi: false };
        w.rearm();
        Ok(w)
    }

    /// After a notification: a cgroupfs file stays "changed" until read.
    pub fn rearm(&self) {
        if !self.psi {
            let mut buf = [0u8; 512];
            let mut f = &self.file;
            let _ = f.seek(io::SeekFrom::Start(0));
            while matches!(f.read(&mut buf), Ok(n) if n > 0) {}
        }
    }
}

/// What ended a [`wait`].
#[derive(Debug, PartialEq, Eq)]
pub enum Woken {
    /// These watches fired (indices).
    Fired(Vec<usize>),
    /// The control eventfd was written.
    Control,
    Timeout,
}

/// Blocks until a watch fires, `control` is written, or `timeout` passes.
pub fn wait(watches: &[Watch], control: &OwnedFd, timeout: Duration) -> io::Result<Woken> {
    let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(watches.len() + 1);
    fds.push(PollFd::new(control, PollFlags::IN));
    for w in watches {
        fds.push(PollFd::new(&w.file, PollFlags::PRI));
    }
    let timeout = Timespec::try_from(timeout).unwrap_or(Timespec { tv_sec: i64::MAX, tv_nsec: 0 });
    let n = loop {
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(n) => break n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    if n == 0 {
        return Ok(Woken::Timeout);
    }
    if !fds[0].revents().is_empty() {
        // Drain the eventfd; it is non-blocking, so an empty one (another
        // waiter drained it) is no error worth reporting.
        let mut v = [0u8; 8];
        let _ = rustix::io::read(control, &mut v);
        return Ok(Woken::Control);
    }
    let fired: Vec<usize> = fds[1..]
        .iter()
        .enumerate()
        .filter(|(_, p)| p.revents().intersects(PollFlags::PRI | PollFlags::ERR))
        .map(|(i, _)| i)
        .collect();
    Ok(if fired.is_empty() { Woken::Timeout } else { Woken::Fired(fired) })
}

/// A fresh eventfd (for stopping and reconfiguring the waiter).
pub fn eventfd() -> io::Result<OwnedFd> {
    Ok(rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?)
}

/// Writes to an eventfd.
pub fn signal(fd: &OwnedFd) {
    // Adding 1 cannot fail short of the counter's overflow, which would
    // wake the waiter all the same.
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_per_layout() {
        let root = Path::new("/cg");
        let kubepods = Path::new("/cg/kubepods");
        let line = |dir: Option<&'static Path>, high: Option<&'static str>, ours: bool| Line {
            cgroup_dir: dir,
            trigger_bytes: 768 << 20,
            current_high: high,
            tripwire_is_ours: ours,
        };
        let v2 = plan(Version::V2, root, true, &[line(None, None, false), line(Some(kubepods), Some("max\n"), false)]);
        assert_eq!(
            v2,
            vec![
                WatchSpec::Psi("/cg/memory.pressure".into()),
                WatchSpec::Events("/cg/kubepods/memory.events".into()),
                WatchSpec::Psi("/cg/kubepods/memory.pressure".into()),
                WatchSpec::Tripwire("/cg/kubepods/memory.high".into(), 768 << 20),
            ]
        );
        // Someone else's memory.high is left alone; ours is kept.
        let theirs = plan(Version::V2, root, true, &[line(Some(kubepods), Some("1073741824"), false)]);
        assert!(!theirs.iter().any(|w| matches!(w, WatchSpec::Tripwire(..))), "{theirs:?}");
        let ours = plan(Version::V2, root, true, &[line(Some(kubepods), Some("805306368"), true)]);
        assert!(ours.iter().any(|w| matches!(w, WatchSpec::Tripwire(..))), "{ours:?}");
        // Left at the trigger by an earlier run: ours again.
        let left = plan(Version::V2, root, true, &[line(Some(kubepods), Some("805306368\n"), false)]);
        assert!(left.iter().any(|w| matches!(w, WatchSpec::Tripwire(..))), "{left:?}");
        // No PSI: events and the tripwire only.
        assert_eq!(plan(Version::V2, root, false, &[line(Some(kubepods), Some("max"), false)]).len(), 2);
        // cgroup v1: only the node's pressure, from procfs.
        let v1 = plan(Version::V1, root, true, &[line(None, None, false), line(Some(kubepods), None, false)]);
        assert_eq!(v1, vec![WatchSpec::Psi("/proc/pressure/memory".into())]);
        assert!(plan(Version::V1, root, false, &[line(None, None, false)]).is_empty());
    }

    #[test]
    fn names() {
        assert_eq!(
            strategy_name(Version::V2, true, Duration::from_secs(10)),
            "cgroupfs:memory.events+memory.high+psi, poll 10s"
        );
        assert_eq!(strategy_name(Version::V1, false, Duration::from_millis(100)), "cgroupfs:poll 100ms");
    }

    #[test]
    fn triggers_for_a_threshold() {
        assert_eq!(psi_trigger(15.0), "some 150000 1000000");
        assert_eq!(psi_trigger(0.0), "some 1000 1000000", "the kernel refuses a zero stall");
        assert_eq!(psi_trigger(250.0), "some 1000000 1000000");
    }

    #[test]
    fn waiting_on_a_control_fd() {
        let c = eventfd().unwrap();
        assert_eq!(wait(&[], &c, Duration::from_millis(1)).unwrap(), Woken::Timeout);
        signal(&c);
        assert_eq!(wait(&[], &c, Duration::from_secs(5)).unwrap(), Woken::Control);
    }
}
