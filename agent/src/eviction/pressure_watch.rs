//! The memory-pressure signal's edge: a thread that writes a PSI trigger
//! into the node's `memory.pressure` and each pod's (cgroup v2), sleeps in
//! poll(2) until the kernel says stalls piled up (POLLPRI), then reads
//! `some avg10` and feeds the pure [`PressureState`] of each scope. It
//! wakes without a trigger only when a verdict asks to (the end of a grace
//! or transition period, or a recheck while the pressure is above the
//! threshold), and every few seconds to follow the pods.
//!
//! The files are behind [`PressureFiles`]: the kernel's triggers
//! ([`KernelTriggers`], through `signals::notify`) or an in-memory twin
//! for tests. What a verdict means (a node condition and an eviction, or a
//! pod's warning) is the [`PressureSink`]'s.

use std::{
    collections::HashMap,
    io,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use parking_lot::{Mutex, MutexGuard};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    driver::{EvictionPod, PodProvider},
    pressure::{PressureConfig, PressureState, Reading, Verdict},
};
use crate::{psi, signals::notify};

/// How often the pods are listed again (new pods get a trigger).
pub const POD_REFRESH: Duration = Duration::from_secs(2);

/// What ended a wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// A trigger fired.
    Fired,
    Timeout,
    Stop,
}

/// Pressure files with triggers.
pub trait PressureFiles: Send {
    /// Arms a trigger on each file, replacing the previous set; returns
    /// those that could not be armed, with why.
    fn arm(&mut self, files: &[PathBuf]) -> Vec<(PathBuf, String)>;
    /// Blocks until a trigger fires, `timeout` passes or a stop is asked.
    fn wait(&mut self, timeout: Duration) -> io::Result<Wait>;
    /// The file's `some` line.
    fn read(&self, file: &Path) -> Result<Reading, psi::PsiError>;
}

/// Reports what the readings mean.
pub trait PressureSink: Send + Sync {
    /// The node's reading.
    fn node(&self, avg10: f64, verdict: &Verdict);
    /// A pod's reading.
    fn pod(&self, pod: &EvictionPod, avg10: f64, verdict: &Verdict);
    /// The highest of the pods' readings in a pass (None: no pod has one).
    fn pods_highest(&self, avg10: Option<f64>);
}

/// The kernel's PSI triggers (`signals::notify`).
pub struct KernelTriggers {
    trigger: String,
    watches: Vec<notify::Watch>,
    control: OwnedFd,
}

/// Stops a [`KernelTriggers`]' wait from another thread.
pub struct StopHandle(OwnedFd);

impl StopHandle {
    pub fn stop(&self) {
        notify::signal(&self.0);
    }
}

impl KernelTriggers {
    /// Triggers that fire when some task stalled for the threshold's share
    /// of a one-second window.
    pub fn new(threshold_percent: f64) -> io::Result<(KernelTriggers, StopHandle)> {
        let control = notify::eventfd()?;
        let stop = StopHandle(control.try_clone()?);
        Ok((KernelTriggers { trigger: notify::psi_trigger(threshold_percent), watches: vec![], control }, stop))
    }
}

impl PressureFiles for KernelTriggers {
    fn arm(&mut self, files: &[PathBuf]) -> Vec<(PathBuf, String)> {
        self.watches.clear();
        let mut failed = vec![];
        for f in files {
            match notify::Watch::psi_with(f, &self.trigger) {
                Ok(w) => self.watches.push(w),
                Err(e) => failed.push((f.clone(), e.to_string())),
            }
        }
        failed
    }

    fn wait(&mut self, timeout: Duration) -> io::Result<Wait> {
        Ok(match notify::wait(&self.watches, &self.control, timeout)? {
            notify::Woken::Fired(_) => Wait::Fired,
            notify::Woken::Timeout => Wait::Timeout,
            notify::Woken::Control => Wait::Stop,
        })
    }

    fn read(&self, file: &Path) -> Result<Reading, psi::PsiError> {
        psi::read_file(file).map(|p| Reading { avg10: p.some.avg10, total_us: p.some.total_us })
    }
}

/// Where a pod's `memory.pressure` is (None on cgroup v1, which has none).
pub type PodPressureFile = Box<dyn Fn(&EvictionPod) -> Option<PathBuf> + Send>;

/// The watching loop.
pub struct PressureWatcher<F: PressureFiles> {
    files: F,
    cfg: PressureConfig,
    node_file: PathBuf,
    pods: Arc<dyn PodProvider>,
    pod_file: PodPressureFile,
    sink: Arc<dyn PressureSink>,
    node: PressureState,
    /// By pod uid: the pod, its file and its state.
    pod_states: HashMap<String, (Arc<EvictionPod>, PathBuf, PressureState)>,
    armed: Vec<PathBuf>,
}

impl<F: PressureFiles> PressureWatcher<F> {
    pub fn new(
        files: F,
        cfg: PressureConfig,
        node_file: PathBuf,
        pods: Arc<dyn PodProvider>,
        pod_file: PodPressureFile,
        sink: Arc<dyn PressureSink>,
    ) -> Self {
        PressureWatcher {
            files,
            cfg,
            node_file,
            pods,
            pod_file,
            sink,
            node: PressureState::default(),
            pod_states: HashMap::new(),
            armed: vec![],
        }
    }

    /// Follows the pods: new ones get a trigger, gone ones lose theirs.
    pub fn refresh_pods(&mut self) {
        let mut next = HashMap::new();
        for p in self.pods.eviction_pods() {
            let Some(file) = (self.pod_file)(&p) else { continue };
            let state = self.pod_states.remove(&p.uid).map(|(_, _, s)| s).unwrap_or_default();
            next.insert(p.uid.clone(), (p, file, state));
        }
        self.pod_states = next;
        let mut want = vec![self.node_file.clone()];
        let mut pod_files: Vec<PathBuf> = self.pod_states.values().map(|(_, f, _)| f.clone()).collect();
        pod_files.sort();
        want.extend(pod_files);
        if want != self.armed {
            let failed = self.files.arm(&want);
            for (file, why) in &failed {
                // A pod whose cgroup is being created or removed: next time.
                if *file == self.node_file {
                    warn!("memory.pressure signal: cannot arm a trigger on {}: {why}", file.display());
                } else {
                    debug!("memory.pressure signal: cannot arm a trigger on {}: {why}", file.display());
                }
            }
            // What is armed, so a file that failed is tried again.
            self.armed = want.into_iter().filter(|f| !failed.iter().any(|(x, _)| x == f)).collect();
        }
    }

    /// Reads every scope at `now`; returns when to read again without a
    /// trigger.
    pub fn step(&mut self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut earliest = |v: &Verdict| {
            if let Some(t) = v.next_check {
                next = Some(next.map_or(t, |n: Instant| n.min(t)));
            }
        };
        match self.files.read(&self.node_file) {
            Ok(r) => {
                let v = self.node.observe(&self.cfg, now, r);
                self.sink.node(r.avg10, &v);
                earliest(&v);
            }
            Err(e) => debug!("memory.pressure signal: {e}"),
        }
        let mut highest: Option<f64> = None;
        let mut gone = false;
        for (pod, file, state) in self.pod_states.values_mut() {
            // A pod without the file (not created yet, or gone): no reading.
            let Ok(r) = self.files.read(file) else {
                gone = true;
                continue;
            };
            let v = state.observe(&self.cfg, now, r);
            self.sink.pod(pod, r.avg10, &v);
            highest = Some(highest.map_or(r.avg10, |h: f64| h.max(r.avg10)));
            earliest(&v);
        }
        self.sink.pods_highest(highest);
        // A removed cgroup's trigger reports an error at every poll: drop
        // it now rather than at the next refresh.
        if gone {
            self.refresh_pods();
        }
        next
    }

    /// Runs until a stop is asked (or the wait fails).
    pub fn run(mut self) {
        info!(
            threshold = self.cfg.threshold_percent,
            grace_period = ?self.cfg.grace_period,
            node = %self.node_file.display(),
            "memory.pressure eviction signal: watching PSI triggers"
        );
        self.refresh_pods();
        let mut next = self.step(Instant::now());
        let mut refreshed = Instant::now();
        loop {
            let now = Instant::now();
            let until_due = next.map_or(POD_REFRESH, |t| t.saturating_duration_since(now));
            let until_refresh = (refreshed + POD_REFRESH).saturating_duration_since(now);
            let woken = match self.files.wait(until_due.min(until_refresh)) {
                Ok(w) => w,
                Err(e) => {
                    warn!("memory.pressure signal stopped: poll failed: {e}");
                    return;
                }
            };
            if woken == Wait::Stop {
                debug!("memory.pressure signal stopped");
                return;
            }
            let now = Instant::now();
            if now >= refreshed + POD_REFRESH {
                self.refresh_pods();
                refreshed = now;
            }
            // Event-driven: read only when the kernel said so or a verdict
            // asked for it, not at every pod refresh.
            if woken == Wait::Fired || next.is_some_and(|t| t <= now) {
                next = self.step(now);
            }
        }
    }
}

/// Starts the watcher on the kernel's triggers on a thread of its own;
/// it stops when `shutdown` is cancelled. Errors when the kernel has no PSI
/// or refuses a trigger on the node's file.
pub fn spawn(
    cfg: PressureConfig,
    pods: Arc<dyn PodProvider>,
    pod_file: PodPressureFile,
    sink: Arc<dyn PressureSink>,
    shutdown: CancellationToken,
) -> io::Result<tokio::task::JoinHandle<()>> {
    let node_file = psi::node_memory_file();
    // Fail at start, with the reason, rather than watch nothing.
    notify::Watch::psi_with(&node_file, &notify::psi_trigger(cfg.threshold_percent))
        .map_err(|e| io::Error::new(e.kind(), format!("{}: cannot write a PSI trigger: {e}", node_file.display())))?;
    let (files, stop) = KernelTriggers::new(cfg.threshold_percent)?;
    let watcher = PressureWatcher::new(files, cfg, node_file, pods, pod_file, sink);
    let thread = std::thread::Builder::new().name("memory-pressure".into()).spawn(move || watcher.run())?;
    Ok(tokio::spawn(async move {
        shutdown.cancelled().await;
        stop.stop();
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }))
}

/// An in-memory twin of the pressure files: each file's avg10 as set, and
/// waits that return what the test queued (a stop when nothing is queued).
#[derive(Clone, Default)]
pub struct MemoryPressureFiles {
    inner: Arc<Mutex<MemoryFilesInner>>,
}

#[derive(Default)]
struct MemoryFilesInner {
    avg10: HashMap<PathBuf, f64>,
    armed: Vec<PathBuf>,
    waits: std::collections::VecDeque<Wait>,
}

impl MemoryPressureFiles {
    fn inner(&self) -> MutexGuard<'_, MemoryFilesInner> {
        self.inner.lock()
    }

    pub fn set(&self, file: &Path, avg10: f64) {
        self.inner().avg10.insert(file.to_owned(), avg10);
    }

    pub fn queue(&self, w: Wait) {
        self.inner().waits.push_back(w);
    }

    pub fn armed(&self) -> Vec<PathBuf> {
        self.inner().armed.clone()
    }
}

impl PressureFiles for MemoryPressureFiles {
    fn arm(&mut self, files: &[PathBuf]) -> Vec<(PathBuf, String)> {
        let mut inner = self.inner();
        let (ok, missing): (Vec<PathBuf>, Vec<PathBuf>) =
            files.iter().cloned().partition(|f| inner.avg10.contains_key(f));
        inner.armed = ok;
        missing.into_iter().map(|f| (f, "no such file".to_owned())).collect()
    }

    fn wait(&mut self, _timeout: Duration) -> io::Result<Wait> {
        Ok(self.inner().waits.pop_front().unwrap_or(Wait::Stop))
    }

    fn read(&self, file: &Path) -> Result<Reading, psi::PsiError> {
        let avg10 = self.inner().avg10.get(file).copied();
        avg10.map(|avg10| Reading { avg10, total_us: 0 }).ok_or_else(|| psi::PsiError::Read {
            file: file.display().to_string(),
            source: io::Error::from(io::ErrorKind::NotFound),
        })
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    struct Pods(Mutex<Vec<EvictionPod>>);
    impl PodProvider for Pods {
        fn eviction_pods(&self) -> Vec<Arc<EvictionPod>> {
            self.0.lock().iter().cloned().map(Arc::new).collect()
        }
    }

    #[derive(Default)]
    struct Seen(Mutex<Vec<String>>);
    impl PressureSink for Seen {
        fn node(&self, avg10: f64, v: &Verdict) {
            self.0.lock().push(format!("node {avg10} fire={} condition={}", v.fire, v.condition));
        }
        fn pod(&self, pod: &EvictionPod, avg10: f64, v: &Verdict) {
            self.0.lock().push(format!("{} {avg10} fire={}", pod.name, v.fire));
        }
        fn pods_highest(&self, _: Option<f64>) {}
    }

    fn pod(name: &str) -> EvictionPod {
        EvictionPod {
            uid: format!("u-{name}"),
            name: name.into(),
            cgroup: format!("kubepods/{name}"),
            ..Default::default()
        }
    }

    const CFG: PressureConfig = PressureConfig {
        threshold_percent: 10.0,
        grace_period: Duration::ZERO,
        transition_period: Duration::from_secs(30),
    };

    fn watcher(
        files: &MemoryPressureFiles,
        pods: Vec<EvictionPod>,
        seen: Arc<Seen>,
    ) -> PressureWatcher<MemoryPressureFiles> {
        PressureWatcher::new(
            files.clone(),
            CFG,
            "/proc/pressure/memory".into(),
            Arc::new(Pods(Mutex::new(pods))),
            Box::new(|p: &EvictionPod| Some(PathBuf::from(format!("/cg/{}/memory.pressure", p.cgroup)))),
            seen,
        )
    }

    #[test]
    fn triggers_on_the_node_and_each_pod_and_verdicts_to_the_sink() {
        let files = MemoryPressureFiles::default();
        files.set(Path::new("/proc/pressure/memory"), 50.0);
        files.set(Path::new("/cg/kubepods/stalled/memory.pressure"), 80.0);
        files.set(Path::new("/cg/kubepods/idle/memory.pressure"), 0.0);
        let seen = Arc::new(Seen::default());
        let mut w = watcher(&files, vec![pod("stalled"), pod("idle"), pod("starting")], seen.clone());
        w.refresh_pods();
        // The starting pod's file does not exist yet: not armed, no reading.
        assert_eq!(files.armed().len(), 3, "{:?}", files.armed());
        let next = w.step(Instant::now());
        assert!(next.is_some(), "above the threshold: read again soon");
        let mut got = seen.0.lock().clone();
        got.sort();
        assert_eq!(got, ["idle 0 fire=false", "node 50 fire=true condition=true", "stalled 80 fire=true"]);
    }

    #[test]
    fn the_loop_reads_at_start_and_on_a_trigger_only() {
        let files = MemoryPressureFiles::default();
        files.set(Path::new("/proc/pressure/memory"), 1.0);
        let seen = Arc::new(Seen::default());
        let w = watcher(&files, vec![], seen.clone());
        files.queue(Wait::Timeout);
        files.queue(Wait::Fired);
        // Then nothing queued: the twin's wait says stop.
        w.run();
        let got = seen.0.lock().clone();
        // One reading at start, one for the trigger; none for the timeout
        // (idle below the threshold: nothing due).
        assert_eq!(got, ["node 1 fire=false condition=false", "node 1 fire=false condition=false"]);
    }
}
