//! An in-memory signal source for unit tests: the test sets the figures a
//! snapshot returns and injects events, which reach the subscribed sink on
//! the caller's thread, as the eBPF source's reader thread delivers them.
//! What the code under test asks of it (registrations, lines, kernel plans)
//! is recorded for assertions.

use parking_lot::{Mutex, MutexGuard};

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Instant,
};

use super::{
    CgroupKind, CgroupUsage, EventSink, KernelVictim, NodeUsage, Signal, SignalError, SignalEvent, SignalSource,
    Snapshot, SourceMode, Target, Threshold,
};

/// A victim plan as the code under test handed it over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedPlan {
    pub cgroup: String,
    pub tgid: u32,
    pub planned_ns: u64,
    pub max_age: Option<std::time::Duration>,
}

#[derive(Default)]
struct State {
    node: NodeUsage,
    cgroups: HashMap<String, CgroupUsage>,
    registered: BTreeMap<String, CgroupKind>,
    lines: HashMap<(Target, Signal), Threshold>,
    plans: HashMap<(Target, Signal), RecordedPlan>,
    kills_finished: Vec<u64>,
    reclaim_first: bool,
    sink: Option<Arc<dyn EventSink>>,
}

#[derive(Default)]
pub struct MemorySource {
    state: Mutex<State>,
    /// Whether it claims to kill in the kernel (accepts victim plans).
    kernel_kills: bool,
}

impl MemorySource {
    /// A source that accepts victim plans (as the eBPF source) when
    /// `kernel_kills`, or refuses them (as the cgroupfs source).
    pub fn new(kernel_kills: bool) -> MemorySource {
        MemorySource { kernel_kills, ..Default::default() }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    pub fn node(&self) -> NodeUsage {
        self.state().node
    }

    /// The figures set for a cgroup (zeros when none were).
    pub fn cgroup(&self, cgroup: &str) -> CgroupUsage {
        self.state().cgroups.get(cgroup).copied().unwrap_or_default()
    }

    pub fn set_node(&self, node: NodeUsage) {
        self.state().node = node;
    }

    /// The figures of a cgroup (registered or not: a snapshot reports only
    /// registered ones).
    pub fn set_cgroup(&self, cgroup: &str, usage: CgroupUsage) {
        self.state().cgroups.insert(cgroup.to_owned(), usage);
    }

    /// Delivers an event to the sink, on this thread.
    pub fn inject(&self, event: SignalEvent) {
        let sink = self.state().sink.clone();
        if let Some(sink) = sink {
            sink.on_event(event);
        }
    }

    pub fn registered(&self) -> BTreeMap<String, CgroupKind> {
        self.state().registered.clone()
    }

    pub fn line(&self, target: &Target, signal: Signal) -> Option<Threshold> {
        self.state().lines.get(&(target.clone(), signal)).copied()
    }

    pub fn plan(&self, target: &Target, signal: Signal) -> Option<RecordedPlan> {
        self.state().plans.get(&(target.clone(), signal)).cloned()
    }

    /// Whether the code under test turned reclaim-first on.
    pub fn reclaim_first(&self) -> bool {
        self.state().reclaim_first
    }

    pub fn kills_finished(&self) -> Vec<u64> {
        self.state().kills_finished.clone()
    }
}

impl SignalSource for MemorySource {
    fn mode(&self) -> SourceMode {
        SourceMode::Ebpf
    }

    fn register(&self, cgroup: &str, kind: CgroupKind) -> Result<(), SignalError> {
        self.state().registered.insert(cgroup.to_owned(), kind);
        Ok(())
    }

    fn unregister(&self, cgroup: &str) {
        let mut s = self.state();
        s.registered.remove(cgroup);
        s.plans.retain(|(t, _), _| !matches!(t, Target::Cgroup(c) if c == cgroup));
    }

    fn set_threshold(&self, target: &Target, signal: Signal, threshold: Option<Threshold>) -> Result<(), SignalError> {
        let mut s = self.state();
        match threshold {
            Some(t) => s.lines.insert((target.clone(), signal), t),
            None => s.lines.remove(&(target.clone(), signal)),
        };
        Ok(())
    }

    fn snapshot(&self) -> Result<Snapshot, SignalError> {
        let s = self.state();
        let cgroups = s.registered.keys().map(|c| (c.clone(), s.cgroups.get(c).copied().unwrap_or_default())).collect();
        Ok(Snapshot { node: s.node, cgroups, taken_at: Instant::now() })
    }

    fn subscribe(&self, sink: Arc<dyn EventSink>) {
        self.state().sink = Some(sink);
    }

    fn set_kernel_victim(
        &self,
        target: &Target,
        signal: Signal,
        victim: Option<KernelVictim<'_>>,
    ) -> Result<bool, SignalError> {
        if !self.kernel_kills {
            return Ok(false);
        }
        let mut s = self.state();
        match victim {
            Some(v) => s.plans.insert(
                (target.clone(), signal),
                RecordedPlan {
                    cgroup: v.cgroup.to_owned(),
                    tgid: v.tgid,
                    planned_ns: v.planned_ns,
                    max_age: v.max_age,
                },
            ),
            None => s.plans.remove(&(target.clone(), signal)),
        };
        Ok(true)
    }

    fn kernel_kill_finished(&self, cgroup_id: u64) {
        self.state().kills_finished.push(cgroup_id);
    }

    fn set_reclaim_first(&self, on: bool) {
        self.state().reclaim_first = on;
    }
}
