//! The fallback signal source: reads cgroupfs (v1 or v2) and procfs on a
//! timer, as the kubelet does, and reports crossings with the same
//! hysteresis rule as the kernel programs.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tracing::{debug, warn};

use super::{
    CgroupKind, CgroupUsage, EventSink, NodeUsage, Signal, SignalError, SignalEvent, SignalSource, Snapshot,
    SourceMode, Target, Threshold, hysteresis, monotonic_ns, node,
};
use crate::cgroups::CgroupFs;

struct State {
    registered: HashSet<String>,
    thresholds: HashMap<(Target, Signal), (Threshold, bool)>,
}

struct Shared {
    cgroupfs: CgroupFs,
    state: Mutex<State>,
    sink: RwLock<Option<Arc<dyn EventSink>>>,
    vanished_reads: AtomicU64,
    polls: AtomicU64,
}

pub struct CgroupfsSource {
    shared: Arc<Shared>,
    stop: Mutex<Option<mpsc::Sender<()>>>,
    poller: Option<JoinHandle<()>>,
}

impl CgroupfsSource {
    /// Starts the poller; `interval` is the kubelet's housekeeping period
    /// (10 s upstream).
    pub fn start(cgroupfs: CgroupFs, interval: Duration) -> CgroupfsSource {
        let shared = Arc::new(Shared {
            cgroupfs,
            state: Mutex::new(State { registered: HashSet::new(), thresholds: HashMap::new() }),
            sink: RwLock::new(None),
            vanished_reads: AtomicU64::new(0),
            polls: AtomicU64::new(0),
        });
        let (tx, rx) = mpsc::channel::<()>();
        let s = shared.clone();
        let poller = std::thread::Builder::new()
            .name("swiftlet-cgpoll".into())
            .spawn(move || {
                // recv_timeout is both the sleep and the stop signal.
                while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(interval) {
                    poll_once(&s);
                }
            })
            .ok();
        if poller.is_none() {
            warn!("cannot start the cgroupfs poller thread; crossings are seen only on snapshots");
        }
        CgroupfsSource { shared, stop: Mutex::new(Some(tx)), poller }
    }

    /// Polls now (tests and the periodic safety net).
    pub fn poll_now(&self) {
        poll_once(&self.shared);
    }
}

impl Drop for CgroupfsSource {
    fn drop(&mut self) {
        self.stop.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(p) = self.poller.take() {
            let _ = p.join();
        }
    }
}

fn read_cgroup(cgroupfs: &CgroupFs, cgroup: &str) -> Result<CgroupUsage, SignalError> {
    let usage = cgroupfs.memory_usage(cgroup)?;
    let stat = cgroupfs.memory_stat(cgroup)?;
    Ok(CgroupUsage {
        usage_bytes: usage,
        inactive_file_bytes: stat.inactive_file,
        working_set_bytes: usage.saturating_sub(stat.inactive_file),
        processes: cgroupfs.procs_recursive(cgroup)?.len() as u64,
        inodes: None,
    })
}

fn read_node(cgroupfs: &CgroupFs) -> Result<NodeUsage, SignalError> {
    let stat = cgroupfs.memory_stat("")?;
    let usage = stat.anon + stat.file;
    Ok(NodeUsage {
        usage_bytes: usage,
        inactive_file_bytes: stat.inactive_file,
        working_set_bytes: usage.saturating_sub(stat.inactive_file),
        tasks: node::tasks()?,
    })
}

fn snapshot(shared: &Shared) -> Result<Snapshot, SignalError> {
    let registered: Vec<String> =
        shared.state.lock().unwrap_or_else(|p| p.into_inner()).registered.iter().cloned().collect();
    let node = read_node(&shared.cgroupfs)?;
    let mut cgroups = HashMap::with_capacity(registered.len());
    for c in registered {
        match read_cgroup(&shared.cgroupfs, &c) {
            Ok(u) => {
                cgroups.insert(c, u);
            }
            // A cgroup removed mid-read is normal churn: leave it out.
            Err(SignalError::Cgroup(e)) if e.is_not_found() => {
                shared.vanished_reads.fetch_add(1, Ordering::Relaxed);
                debug!(cgroup = c, "cgroup vanished while reading it");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Snapshot { node, cgroups, taken_at: Instant::now() })
}

fn value_of(snap: &Snapshot, target: &Target, signal: Signal) -> Option<u64> {
    match (target, signal) {
        (Target::Node, Signal::MemoryWorkingSet) => Some(snap.node.working_set_bytes),
        (Target::Node, Signal::Processes) => Some(snap.node.tasks),
        (Target::Node, Signal::Inodes) => None,
        (Target::Cgroup(c), s) => {
            let u = snap.cgroups.get(c)?;
            match s {
                Signal::MemoryWorkingSet => Some(u.working_set_bytes),
                Signal::Processes => Some(u.processes),
                Signal::Inodes => u.inodes.map(|i| i.max(0) as u64),
            }
        }
    }
}

fn poll_once(shared: &Shared) {
    shared.polls.fetch_add(1, Ordering::Relaxed);
    let snap = match snapshot(shared) {
        Ok(s) => s,
        Err(e) => {
            warn!("cgroupfs poll failed: {e}");
            return;
        }
    };
    let now = monotonic_ns();
    let mut events = vec![];
    {
        let mut state = shared.state.lock().unwrap_or_else(|p| p.into_inner());
        for ((target, signal), (threshold, above)) in state.thresholds.iter_mut() {
            let Some(value) = value_of(&snap, target, *signal) else { continue };
            if let Some(direction) = hysteresis::crossing(*above, value, *threshold) {
                *above = direction == super::Direction::Up;
                events.push(SignalEvent::Crossing {
                    target: target.clone(),
                    signal: *signal,
                    direction,
                    value,
                    threshold: threshold.trigger,
                    at_ns: now,
                    received_ns: now,
                    pid: 0,
                    kernel_generation: 0,
                });
            }
        }
    }
    let sink = shared.sink.read().unwrap_or_else(|p| p.into_inner()).clone();
    if let Some(sink) = sink {
        for e in events {
            sink.on_event(e);
        }
    }
}

impl SignalSource for CgroupfsSource {
    fn mode(&self) -> SourceMode {
        SourceMode::Cgroupfs
    }

    fn register(&self, cgroup: &str, _kind: CgroupKind) -> Result<(), SignalError> {
        let cgroup = cgroup.trim_matches('/');
        if !self.shared.cgroupfs.exists(cgroup) {
            return Err(SignalError::Cgroup(crate::cgroups::CgroupError::Io {
                path: self.shared.cgroupfs.memory_dir(cgroup),
                source: std::io::ErrorKind::NotFound.into(),
            }));
        }
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner()).registered.insert(cgroup.to_owned());
        Ok(())
    }

    fn unregister(&self, cgroup: &str) {
        let cgroup = cgroup.trim_matches('/');
        let mut state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        state.registered.remove(cgroup);
        state.thresholds.retain(|(t, _), _| !matches!(t, Target::Cgroup(c) if c == cgroup));
    }

    fn set_threshold(&self, target: &Target, signal: Signal, threshold: Option<Threshold>) -> Result<(), SignalError> {
        let mut state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Target::Cgroup(c) = target
            && !state.registered.contains(c)
        {
            return Err(SignalError::NotRegistered(c.clone()));
        }
        match threshold {
            Some(t) if t.trigger > 0 => {
                state.thresholds.insert((target.clone(), signal), (t, false));
            }
            _ => {
                state.thresholds.remove(&(target.clone(), signal));
            }
        }
        Ok(())
    }

    fn snapshot(&self) -> Result<Snapshot, SignalError> {
        snapshot(&self.shared)
    }

    fn subscribe(&self, sink: Arc<dyn EventSink>) {
        *self.shared.sink.write().unwrap_or_else(|p| p.into_inner()) = Some(sink);
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("vanished_reads", self.shared.vanished_reads.load(Ordering::Relaxed)),
            ("polls", self.shared.polls.load(Ordering::Relaxed)),
        ]
    }
}
