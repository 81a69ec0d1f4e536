//! The kubelet's plugin manager reconciler, pure: the sockets on disk (the
//! desired state) against the plugins registered (the actual state). A
//! plugin whose socket is gone or was made again is deregistered first; a
//! socket with no plugin is registered, unless its last failure is still
//! backing off. One operation per socket at a time; the caller runs them
//! and reports back.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::{
    operation::{RegisterResult, Registered},
    scan::Stamp,
};
use crate::flowcontrol::{Backoff, BackoffPolicy};

/// The kubelet's retry back-off for plugin operations (exponentialbackoff:
/// 500 ms doubling to 2 min 2 s).
pub const RETRY_POLICY: BackoffPolicy =
    BackoffPolicy { initial: Duration::from_millis(500), max: Duration::from_millis(122_000) };

/// One operation to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Register { socket: PathBuf, stamp: Stamp },
    Deregister(Registered),
}

impl Op {
    pub fn socket(&self) -> &Path {
        match self {
            Op::Register { socket, .. } => socket,
            Op::Deregister(r) => &r.socket,
        }
    }
}

#[derive(Debug)]
struct Failure {
    stamp: Stamp,
    error: String,
}

pub struct Reconciler {
    desired: BTreeMap<PathBuf, Stamp>,
    actual: BTreeMap<PathBuf, Registered>,
    busy: BTreeSet<PathBuf>,
    backoff: Backoff,
    failures: HashMap<PathBuf, Failure>,
}

fn key(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

impl Reconciler {
    pub fn new(policy: BackoffPolicy) -> Reconciler {
        Reconciler {
            desired: BTreeMap::new(),
            actual: BTreeMap::new(),
            busy: BTreeSet::new(),
            backoff: Backoff::new(policy),
            failures: HashMap::new(),
        }
    }

    /// The sockets now on disk. A socket that changed or went away starts
    /// afresh: its back-off is forgotten.
    pub fn set_desired(&mut self, sockets: BTreeMap<PathBuf, Stamp>) {
        let backoff = &mut self.backoff;
        self.failures.retain(|path, f| {
            let same = sockets.get(path) == Some(&f.stamp);
            if !same {
                backoff.forget(&key(path));
            }
            same
        });
        self.desired = sockets;
    }

    /// The operations to start now; their sockets are busy until reported.
    pub fn next(&mut self, now: Instant) -> Vec<Op> {
        let mut ops = vec![];
        for (path, reg) in &self.actual {
            if !self.busy.contains(path) && self.desired.get(path) != Some(&reg.stamp) {
                ops.push(Op::Deregister(reg.clone()));
            }
        }
        for (path, stamp) in &self.desired {
            if !self.busy.contains(path) && !self.actual.contains_key(path) && !self.backoff.in_backoff(&key(path), now)
            {
                ops.push(Op::Register { socket: path.clone(), stamp: *stamp });
            }
        }
        for op in &ops {
            self.busy.insert(op.socket().to_path_buf());
        }
        ops
    }

    /// A registration ended. Returns the error to log when it is not the
    /// one already logged for this socket file (logged once per change).
    pub fn registered(&mut self, socket: &Path, stamp: Stamp, result: RegisterResult, now: Instant) -> Option<String> {
        self.busy.remove(socket);
        match result {
            Ok((reg, warning)) => {
                // Recorded even if the socket went away meanwhile: the next
                // round deregisters it, as the handler has it now.
                self.actual.insert(socket.to_path_buf(), reg);
                self.backoff.forget(&key(socket));
                self.failures.remove(socket);
                warning
            }
            Err(error) => {
                self.backoff.next(&key(socket), now);
                let repeated = self.failures.get(socket).is_some_and(|f| f.stamp == stamp && f.error == error);
                self.failures.insert(socket.to_path_buf(), Failure { stamp, error: error.clone() });
                (!repeated).then_some(error)
            }
        }
    }

    /// A deregistration ended.
    pub fn deregistered(&mut self, socket: &Path) {
        self.busy.remove(socket);
        self.actual.remove(socket);
    }

    /// An operation ended without telling how (its task panicked or was
    /// cancelled): the socket is free again, and a registration is retried
    /// after a back-off.
    pub fn abandoned(&mut self, socket: &Path, now: Instant) {
        self.busy.remove(socket);
        if !self.actual.contains_key(socket) {
            self.backoff.next(&key(socket), now);
        }
    }

    /// When the next registration held back by a back-off may start.
    pub fn next_retry(&self, now: Instant) -> Option<Instant> {
        self.desired
            .keys()
            .filter(|p| !self.busy.contains(*p) && !self.actual.contains_key(*p))
            .filter_map(|p| self.backoff.retry_at(&key(p), now))
            .min()
    }

    /// The sockets on disk.
    pub fn desired(&self) -> impl Iterator<Item = &Path> {
        self.desired.keys().map(PathBuf::as_path)
    }

    /// The plugins registered.
    pub fn actual(&self) -> impl Iterator<Item = &Registered> {
        self.actual.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn stamp(ino: u64) -> Stamp {
        Stamp { dev: 1, ino, ctime_ns: 0 }
    }

    fn reg(socket: &str, ino: u64) -> Registered {
        Registered {
            socket: socket.into(),
            stamp: stamp(ino),
            plugin_type: "CSIPlugin".into(),
            name: format!("{socket}-driver"),
            endpoint: socket.into(),
        }
    }

    fn desired(items: &[(&str, u64)]) -> BTreeMap<PathBuf, Stamp> {
        items.iter().map(|(p, i)| (PathBuf::from(p), stamp(*i))).collect()
    }

    #[test]
    fn new_sockets_register_gone_ones_deregister_and_remade_ones_do_both_in_order() {
        let mut r = Reconciler::new(RETRY_POLICY);
        let t = Instant::now();
        r.set_desired(desired(&[("/a", 1), ("/b", 2)]));
        let ops = r.next(t);
        assert_eq!(
            ops,
            [
                Op::Register { socket: "/a".into(), stamp: stamp(1) },
                Op::Register { socket: "/b".into(), stamp: stamp(2) }
            ]
        );
        // Busy sockets get nothing more until reported.
        assert!(r.next(t).is_empty());
        assert_eq!(r.registered(Path::new("/a"), stamp(1), Ok((reg("/a", 1), None)), t), None);
        assert_eq!(r.registered(Path::new("/b"), stamp(2), Ok((reg("/b", 2), None)), t), None);
        assert!(r.next(t).is_empty());

        // /a made again, /b gone.
        r.set_desired(desired(&[("/a", 3)]));
        let ops = r.next(t);
        assert_eq!(ops, [Op::Deregister(reg("/a", 1)), Op::Deregister(reg("/b", 2))]);
        // The new /a waits for its old registration to go.
        assert!(r.next(t).is_empty());
        r.deregistered(Path::new("/a"));
        r.deregistered(Path::new("/b"));
        assert_eq!(r.next(t), [Op::Register { socket: "/a".into(), stamp: stamp(3) }]);
        r.registered(Path::new("/a"), stamp(3), Ok((reg("/a", 3), None)), t);
        assert_eq!(r.actual().map(|p| p.socket.clone()).collect::<Vec<_>>(), [PathBuf::from("/a")]);
        assert_eq!(r.desired().collect::<Vec<_>>(), [Path::new("/a")]);
    }

    #[test]
    fn failures_back_off_log_once_and_start_afresh_when_the_socket_changes() {
        let mut r = Reconciler::new(RETRY_POLICY);
        let t = Instant::now();
        r.set_desired(desired(&[("/a", 1)]));
        assert_eq!(r.next(t).len(), 1);
        assert_eq!(r.registered(Path::new("/a"), stamp(1), Err("refused".into()), t).as_deref(), Some("refused"));
        // Backing off: nothing until the retry time.
        assert!(r.next(t + Duration::from_millis(100)).is_empty());
        assert_eq!(r.next_retry(t), Some(t + Duration::from_millis(500)));
        let t2 = t + S;
        assert_eq!(r.next(t2).len(), 1);
        // The same error again is not logged again; a different one is.
        assert_eq!(r.registered(Path::new("/a"), stamp(1), Err("refused".into()), t2), None);
        assert_eq!(r.next_retry(t2), Some(t2 + S));
        assert!(r.next(t2 + Duration::from_millis(900)).is_empty());
        assert_eq!(r.next(t2 + S).len(), 1);
        assert_eq!(r.registered(Path::new("/a"), stamp(1), Err("other".into()), t2 + S).as_deref(), Some("other"));
        // The driver restarts: no waiting, and its first error is logged.
        r.set_desired(desired(&[("/a", 2)]));
        assert_eq!(r.next(t2 + S), [Op::Register { socket: "/a".into(), stamp: stamp(2) }]);
        assert_eq!(r.registered(Path::new("/a"), stamp(2), Err("other".into()), t2 + S).as_deref(), Some("other"));
        // A task that vanished frees its socket and backs off.
        r.set_desired(desired(&[("/a", 2), ("/c", 5)]));
        let ops = r.next(t2 + 10 * S);
        assert_eq!(ops.len(), 2);
        r.abandoned(Path::new("/c"), t2 + 10 * S);
        assert!(r.next(t2 + 10 * S).is_empty());
        assert!(r.next_retry(t2 + 10 * S).is_some());
    }
}
