//! Eviction signals: per-cgroup memory working set, processes and inodes,
//! and the node's totals, from the kernel (eBPF) or, as a fallback, from
//! cgroupfs and procfs.
//!
//! Both sources implement [`SignalSource`] and produce the same
//! [`Snapshot`]s and [`SignalEvent`]s, so the eviction manager cannot tell
//! them apart, except by how soon it hears of a crossing: the eBPF source
//! reports it from the kernel at the moment it happens; the cgroupfs source
//! when its next poll sees it.

pub mod btf;
pub mod cgroupfs;
pub mod ebpf;
pub mod hysteresis;
mod kfunc;
pub mod layout;
mod mapped;
#[cfg(test)]
pub mod memory;
pub mod node;
pub mod notify;
mod plans;
pub mod probe;
mod ring;

use std::{collections::HashMap, sync::Arc, time::Instant};

pub use swiftlet_common::{KillOutcome, Signal};
use thiserror::Error;

use crate::cgroups::CgroupError;

/// Page size the kernel counts memory in.
pub fn page_size() -> u64 {
    rustix::param::page_size() as u64
}

/// CLOCK_MONOTONIC in nanoseconds: the clock `bpf_ktime_get_ns` reads, so
/// kernel and agent timestamps compare directly.
pub fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[derive(Debug, Error)]
pub enum SignalError {
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("eBPF: {0}")]
    Ebpf(String),
    #[error("no free signal slot for {0} (all {max} in use)", max = swiftlet_common::MAX_SLOTS)]
    SlotsFull(String),
    #[error("{0} is not registered")]
    NotRegistered(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Where the signals come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceMode {
    Ebpf,
    Cgroupfs,
}

impl SourceMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceMode::Ebpf => "ebpf",
            SourceMode::Cgroupfs => "cgroupfs",
        }
    }
}

/// What kind of cgroup is registered (decides which slot flags it gets).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CgroupKind {
    Kubepods,
    Qos,
    Pod,
    Container,
    Other,
}

/// What a threshold applies to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    Node,
    /// A registered cgroup, by path relative to the hierarchy root.
    Cgroup(String),
}

/// A threshold in the signal's unit (bytes for memory, counts otherwise):
/// crossed upward when the value reaches `trigger`, cleared below `rearm`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Threshold {
    pub trigger: u64,
    pub rearm: u64,
}

/// One cgroup's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    pub usage_bytes: u64,
    pub inactive_file_bytes: u64,
    pub working_set_bytes: u64,
    pub processes: u64,
    /// Inodes created minus freed by the cgroup's tasks; None when the
    /// source cannot tell (cgroupfs).
    pub inodes: Option<i64>,
}

/// The node's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeUsage {
    /// Root-hierarchy memory usage (anon + file), as v1's root
    /// memory.usage_in_bytes reports it.
    pub usage_bytes: u64,
    pub inactive_file_bytes: u64,
    pub working_set_bytes: u64,
    /// Tasks (threads included), as sysinfo's procs.
    pub tasks: u64,
}

#[derive(Clone, Debug)]
pub struct Snapshot {
    pub node: NodeUsage,
    /// By cgroup path, for every registered cgroup.
    pub cgroups: HashMap<String, CgroupUsage>,
    pub taken_at: Instant,
}

impl Snapshot {
    /// No figures at all (for code that needs a snapshot's shape only).
    pub fn empty() -> Snapshot {
        Snapshot { node: NodeUsage::default(), cgroups: HashMap::new(), taken_at: Instant::now() }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Up,
    Down,
}

/// Something the signal source saw happen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SignalEvent {
    Crossing {
        target: Target,
        signal: Signal,
        direction: Direction,
        /// The value that crossed, in the signal's unit.
        value: u64,
        /// The trigger it crossed.
        threshold: u64,
        /// CLOCK_MONOTONIC ns when the crossing happened (kernel time for
        /// eBPF, poll time for cgroupfs).
        at_ns: u64,
        /// CLOCK_MONOTONIC ns when the agent received it.
        received_ns: u64,
        /// The task whose action crossed (eBPF only; 0 when unknown).
        pid: u32,
        /// Non-zero when the kernel executed the victim plan at this
        /// crossing (the plan generation); the agent's fast path stands down.
        kernel_generation: u32,
        /// What the kernel did with the victim plan at this crossing (always
        /// `NotAttempted` from sources that cannot kill).
        kernel_outcome: KillOutcome,
    },
    /// The kernel OOM killer chose a victim.
    OomKill {
        /// The victim's memory cgroup if it is registered.
        cgroup: Option<String>,
        cgroup_id: u64,
        pid: u32,
        at_ns: u64,
        received_ns: u64,
    },
    /// A registered cgroup disappeared.
    CgroupRemoved { cgroup: String, at_ns: u64 },
    /// A watched process exited ([`ebpf::EbpfSource::watch_exit`]).
    ProcessExit { pid: u32, at_ns: u64, received_ns: u64 },
    /// The kernel killed a planned victim at a crossing.
    KernelKill {
        /// The line that was crossed (its slot's target).
        target: Target,
        cgroup: Option<String>,
        cgroup_id: u64,
        signal: Signal,
        /// The task signalled as the current one (0 when the victim was not
        /// the allocating task, or the kernel refused the signal).
        pid: u32,
        /// When the allocating task was the victim's and the kernel refused
        /// to signal it: `bpf_send_signal`'s negative errno; 0 otherwise.
        signal_error: i32,
        generation: u32,
        /// When the line was crossed, and when the kill was done.
        crossing_ns: u64,
        /// The value that crossed the line, in the signal's unit.
        crossing_value: u64,
        at_ns: u64,
        received_ns: u64,
    },
}

/// A victim plan for the kernel (see [`SignalSource::set_kernel_victim`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelVictim<'a> {
    /// The victim pod's cgroup (registered).
    pub cgroup: &'a str,
    /// The victim's process with the most resident memory, 0 if none is
    /// known: the kernel signals it where it sees the crossing outside the
    /// victim's own context and can signal another task.
    pub tgid: u32,
    /// CLOCK_MONOTONIC ns when the pods were ranked for this plan.
    pub planned_ns: u64,
    /// How old the plan may be at the crossing; None: any age.
    pub max_age: Option<std::time::Duration>,
}

/// Receives events as the source sees them. Called on the source's reader
/// thread: implementations must be quick (hand work to a channel), except
/// for the eviction fast path, which acts right there on purpose.
pub trait EventSink: Send + Sync {
    fn on_event(&self, event: SignalEvent);
}

impl<F: Fn(SignalEvent) + Send + Sync> EventSink for F {
    fn on_event(&self, event: SignalEvent) {
        self(event)
    }
}

/// A source of eviction signals.
pub trait SignalSource: Send + Sync {
    fn mode(&self) -> SourceMode;

    /// Starts tracking a cgroup (relative path). Registering twice is fine.
    fn register(&self, cgroup: &str, kind: CgroupKind) -> Result<(), SignalError>;

    /// Stops tracking a cgroup; unknown cgroups are ignored.
    fn unregister(&self, cgroup: &str);

    /// Sets (Some) or clears (None) a threshold.
    fn set_threshold(&self, target: &Target, signal: Signal, threshold: Option<Threshold>) -> Result<(), SignalError>;

    /// Current figures for the node and every registered cgroup.
    fn snapshot(&self) -> Result<Snapshot, SignalError>;

    /// Starts delivering events to `sink` (replacing any earlier sink).
    fn subscribe(&self, sink: Arc<dyn EventSink>);

    /// Names the pod (registered cgroup) the kernel should kill the moment
    /// `target`'s `signal` line is crossed; None withdraws it. Returns false
    /// when this source cannot kill in the kernel.
    fn set_kernel_victim(
        &self,
        _target: &Target,
        _signal: Signal,
        _victim: Option<KernelVictim<'_>>,
    ) -> Result<bool, SignalError> {
        Ok(false)
    }

    /// The agent has finished an eviction the kernel started on the cgroup
    /// `cgroup_id`: stop signalling its tasks.
    fn kernel_kill_finished(&self, _cgroup_id: u64) {}

    /// The agent reclaims page cache before evicting for memory: the kernel
    /// then kills at a memory crossing only when the growth was anonymous,
    /// and leaves the others to the agent. Sources that never kill in the
    /// kernel have nothing to leave.
    fn set_reclaim_first(&self, _on: bool) {}

    /// Counters for the metrics endpoint: (name, value).
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }

    /// How each signal is obtained: (signal, strategy), for the log line and
    /// the `swiftlet_signal_strategy` metric.
    fn strategies(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }
}

/// Which source to use (`--signal-source`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SourceChoice {
    /// eBPF when it loads, cgroupfs otherwise.
    #[default]
    Auto,
    Ebpf,
    Cgroupfs,
}

impl std::str::FromStr for SourceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(SourceChoice::Auto),
            "ebpf" => Ok(SourceChoice::Ebpf),
            "cgroupfs" => Ok(SourceChoice::Cgroupfs),
            other => Err(format!("`{other}` is not one of auto, ebpf, cgroupfs")),
        }
    }
}

/// An opened source, keeping the eBPF one reachable for what only it does
/// (victim plans, program statistics).
pub struct OpenedSource {
    pub source: Arc<dyn SignalSource>,
    pub ebpf: Option<Arc<ebpf::EbpfSource>>,
    /// Why eBPF is not in use, when auto fell back.
    pub fallback_reason: Option<String>,
}

/// Opens the chosen source. In auto mode a failed eBPF load logs one line
/// and falls back to polling cgroupfs every `poll_interval`.
pub fn open(
    choice: SourceChoice,
    cgroupfs: crate::cgroups::CgroupFs,
    ebpf_opts: &ebpf::EbpfOptions,
    poll_interval: std::time::Duration,
) -> Result<OpenedSource, SignalError> {
    let polling = |reason| OpenedSource {
        source: Arc::new(cgroupfs::CgroupfsSource::start(cgroupfs.clone(), poll_interval)),
        ebpf: None,
        fallback_reason: reason,
    };
    let load_ebpf = |cgroupfs| {
        let loaded = ebpf::EbpfSource::load(cgroupfs, ebpf_opts);
        // The load parsed the kernel's BTF, tens of MiB that are free now.
        crate::heap::release_freed();
        loaded
    };
    match choice {
        SourceChoice::Cgroupfs => Ok(polling(None)),
        SourceChoice::Ebpf => {
            let e = Arc::new(load_ebpf(cgroupfs)?);
            Ok(OpenedSource { source: e.clone(), ebpf: Some(e), fallback_reason: None })
        }
        SourceChoice::Auto => match load_ebpf(cgroupfs.clone()) {
            Ok(e) => {
                let e = Arc::new(e);
                Ok(OpenedSource { source: e.clone(), ebpf: Some(e), fallback_reason: None })
            }
            Err(e) => {
                tracing::warn!(
                    "eBPF signal source unavailable, falling back to polling cgroupfs every {poll_interval:?}: {e}"
                );
                Ok(polling(Some(e.to_string())))
            }
        },
    }
}
