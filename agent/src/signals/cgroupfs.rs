//! The fallback signal source: reads cgroupfs (v1 or v2) and procfs, and
//! reports crossings with the same hysteresis rule as the kernel programs.
//!
//! It reads on a timer, as the kubelet does, and also the moment the kernel
//! says memory changed ([`super::notify`]: `memory.events`, a `memory.high`
//! tripwire at each cgroup line and PSI triggers on cgroup v2; the node's
//! PSI on v1), so a crossing does not wait for the next period.

use std::{
    collections::{HashMap, HashSet},
    os::fd::OwnedFd,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use parking_lot::{Mutex, RwLock};
use tracing::{debug, info, warn};

use super::{
    CgroupKind, CgroupUsage, EventSink, NodeUsage, Signal, SignalError, SignalEvent, SignalSource, Snapshot,
    SourceMode, Target, Threshold, hysteresis, monotonic_ns, node,
    notify::{self, Watch, WatchSpec, Woken},
};
use crate::cgroups::CgroupFs;

struct State {
    registered: HashSet<String>,
    thresholds: HashMap<(Target, Signal), (Threshold, bool)>,
    /// Cgroups whose memory.high we set as a tripwire.
    tripwires: HashSet<String>,
}

struct Shared {
    cgroupfs: CgroupFs,
    state: Mutex<State>,
    sink: RwLock<Option<Arc<dyn EventSink>>>,
    /// What the waiter thread polls on; replaced whole when lines change.
    watches: Mutex<Arc<Vec<Watch>>>,
    /// Written to stop the waiter (`stopping` set) or to make it pick up new
    /// watches.
    control: OwnedFd,
    stopping: AtomicBool,
    psi: bool,
    vanished_reads: AtomicU64,
    polls: AtomicU64,
    wakeups: AtomicU64,
    watch_errors: AtomicU64,
}

pub struct CgroupfsSource {
    shared: Arc<Shared>,
    strategy: String,
    waiter: Option<JoinHandle<()>>,
}

impl CgroupfsSource {
    /// Starts the waiter; `interval` is the kubelet's housekeeping period
    /// (10 s upstream), the longest a crossing waits when no kernel
    /// notification covers it.
    pub fn start(cgroupfs: CgroupFs, interval: Duration) -> CgroupfsSource {
        let psi = notify::psi_available();
        let strategy = notify::strategy_name(cgroupfs.version(), psi, interval);
        let control = match notify::eventfd() {
            Ok(fd) => fd,
            // Without an eventfd (fd exhaustion) the source still answers
            // snapshots; poll(2) on a closed-on-drop pipe would do as well,
            // but this is not worth more than a clear line.
            Err(e) => panic!("cannot create an eventfd for the cgroupfs source: {e}"),
        };
        let shared = Arc::new(Shared {
            cgroupfs,
            state: Mutex::new(State {
                registered: HashSet::new(),
                thresholds: HashMap::new(),
                tripwires: HashSet::new(),
            }),
            sink: RwLock::new(None),
            watches: Mutex::new(Arc::new(vec![])),
            control,
            stopping: AtomicBool::new(false),
            psi,
            vanished_reads: AtomicU64::new(0),
            polls: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            watch_errors: AtomicU64::new(0),
        });
        let s = shared.clone();
        let waiter =
            std::thread::Builder::new().name("swiftlet-cgpoll".into()).spawn(move || wait_loop(&s, interval)).ok();
        if waiter.is_none() {
            warn!("cannot start the cgroupfs poller thread; crossings are seen only on snapshots");
        }
        info!(strategy, "cgroupfs signal source started");
        CgroupfsSource { shared, strategy, waiter }
    }

    /// Polls now (tests and the periodic safety net).
    pub fn poll_now(&self) {
        poll_once(&self.shared);
    }

    /// How crossings are noticed (also in [`SignalSource::strategies`]).
    pub fn strategy(&self) -> &str {
        &self.strategy
    }
}

/// Polls every `interval`, and at once whenever a watch fires.
fn wait_loop(shared: &Shared, interval: Duration) {
    let mut next_poll = Instant::now() + interval;
    loop {
        let watches = shared.watches.lock().clone();
        let timeout = next_poll.saturating_duration_since(Instant::now());
        match notify::wait(&watches, &shared.control, timeout) {
            Ok(Woken::Control) => {
                if shared.stopping.load(Ordering::SeqCst) {
                    return;
                }
            }
            Ok(Woken::Fired(which)) => {
                for i in which {
                    watches[i].rearm();
                }
                shared.wakeups.fetch_add(1, Ordering::Relaxed);
                poll_once(shared);
            }
            Ok(Woken::Timeout) => {
                poll_once(shared);
                next_poll = Instant::now() + interval;
            }
            Err(e) => {
                warn!("waiting on cgroupfs notifications failed, polling only: {e}");
                std::thread::sleep(timeout);
            }
        }
    }
}

impl Shared {
    /// Rebuilds the watches (and tripwires) from the current memory lines.
    fn rewatch(&self) {
        struct Line {
            cgroup: Option<String>,
            dir: Option<PathBuf>,
            trigger: u64,
            high: Option<String>,
            ours: bool,
        }
        let fs = &self.cgroupfs;
        let mut state = self.state.lock();
        let lines: Vec<Line> = state
            .thresholds
            .iter()
            .filter(|((_, signal), _)| *signal == Signal::MemoryWorkingSet)
            .map(|((target, _), (t, _))| match target {
                Target::Node => Line { cgroup: None, dir: None, trigger: t.trigger, high: None, ours: false },
                Target::Cgroup(c) => {
                    let dir = fs.memory_dir(c);
                    Line {
                        high: std::fs::read_to_string(dir.join("memory.high")).ok(),
                        ours: state.tripwires.contains(c),
                        cgroup: Some(c.clone()),
                        dir: Some(dir),
                        trigger: t.trigger,
                    }
                }
            })
            .collect();
        let specs = notify::plan(
            fs.version(),
            fs.root(),
            self.psi,
            &lines
                .iter()
                .map(|l| notify::Line {
                    cgroup_dir: l.dir.as_deref(),
                    trigger_bytes: l.trigger,
                    current_high: l.high.as_deref(),
                    tripwire_is_ours: l.ours,
                })
                .collect::<Vec<_>>(),
        );
        // The cgroup each tripwire file belongs to.
        let tripwire_owner = |path: &PathBuf| {
            lines
                .iter()
                .find(|l| l.dir.as_ref().is_some_and(|d| d.join("memory.high") == *path))
                .and_then(|l| l.cgroup.clone())
        };
        let wanted: HashSet<String> = specs
            .iter()
            .filter_map(|w| match w {
                WatchSpec::Tripwire(p, _) => tripwire_owner(p),
                _ => None,
            })
            .collect();
        // Tripwires no longer wanted go back to `max`.
        for gone in state.tripwires.difference(&wanted).cloned().collect::<Vec<_>>() {
            let _ = std::fs::write(fs.memory_dir(&gone).join("memory.high"), "max");
            state.tripwires.remove(&gone);
        }
        let mut watches = vec![];
        for spec in specs {
            let r = match &spec {
                WatchSpec::Psi(p) => Watch::psi(p).map(|w| watches.push(w)),
                WatchSpec::Events(p) => Watch::events(p).map(|w| watches.push(w)),
                WatchSpec::Tripwire(p, bytes) => std::fs::write(p, bytes.to_string()).map(|()| {
                    if let Some(c) = tripwire_owner(p) {
                        state.tripwires.insert(c);
                    }
                }),
            };
            if let Err(e) = r {
                self.watch_errors.fetch_add(1, Ordering::Relaxed);
                debug!("cannot watch {spec:?}: {e}");
            }
        }
        drop(state);
        *self.watches.lock() = Arc::new(watches);
        notify::signal(&self.control);
    }
}

impl Drop for CgroupfsSource {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        notify::signal(&self.shared.control);
        if let Some(p) = self.waiter.take() {
            let _ = p.join();
        }
        let state = self.shared.state.lock();
        for c in &state.tripwires {
            let _ = std::fs::write(self.shared.cgroupfs.memory_dir(c).join("memory.high"), "max");
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
    let registered: Vec<String> = shared.state.lock().registered.iter().cloned().collect();
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
        let mut state = shared.state.lock();
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
                    kernel_outcome: crate::signals::KillOutcome::NotAttempted,
                });
            }
        }
    }
    let sink = shared.sink.read().clone();
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
        self.shared.state.lock().registered.insert(cgroup.to_owned());
        Ok(())
    }

    fn unregister(&self, cgroup: &str) {
        let cgroup = cgroup.trim_matches('/');
        let mut state = self.shared.state.lock();
        state.registered.remove(cgroup);
        let before = state.thresholds.len();
        state.thresholds.retain(|(t, _), _| !matches!(t, Target::Cgroup(c) if c == cgroup));
        let changed = state.thresholds.len() != before;
        drop(state);
        if changed {
            self.shared.rewatch();
        }
    }

    fn set_threshold(&self, target: &Target, signal: Signal, threshold: Option<Threshold>) -> Result<(), SignalError> {
        let mut state = self.shared.state.lock();
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
        drop(state);
        if signal == Signal::MemoryWorkingSet {
            self.shared.rewatch();
        }
        Ok(())
    }

    fn snapshot(&self) -> Result<Snapshot, SignalError> {
        snapshot(&self.shared)
    }

    fn subscribe(&self, sink: Arc<dyn EventSink>) {
        *self.shared.sink.write() = Some(sink);
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("vanished_reads", self.shared.vanished_reads.load(Ordering::Relaxed)),
            ("polls", self.shared.polls.load(Ordering::Relaxed)),
            ("wakeups", self.shared.wakeups.load(Ordering::Relaxed)),
            ("watch_errors", self.shared.watch_errors.load(Ordering::Relaxed)),
        ]
    }

    fn strategies(&self) -> Vec<(&'static str, String)> {
        vec![
            ("memory", self.strategy.clone()),
            ("processes", "cgroupfs:cgroup.procs".to_owned()),
            ("inodes", super::probe::NONE.to_owned()),
            ("oom", super::probe::NONE.to_owned()),
            ("kill", super::probe::NONE.to_owned()),
        ]
    }
}
