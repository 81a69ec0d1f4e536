//! The figures behind /stats/summary, /metrics/resource and
//! /metrics/cadvisor: per node, pod, sandbox and container CPU, memory,
//! tasks, block I/O, network, OOM kills and filesystems, read from
//! cgroupfs, procfs, statfs and the runtime (sandboxes, containers,
//! writable layers, image filesystem).
//!
//! Like cAdvisor's housekeeping, a background loop samples every interval
//! and requests are served from the latest sample, so a scrape costs an
//! encode, not a walk of the cgroup tree (with 110 pods the walk is a few
//! thousand file reads). The first request before any sample waits for
//! one. CPU rates (`usageNanoCores`) come from consecutive samples. The
//! pass itself is `stats_read`.

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::jiff::Timestamp;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use super::cgroup_sample::{CgroupSample, InterfaceSample};
use super::{
    cgroup_sample::{DeviceNames, SpecCache},
    stats_read::{MachineSample, read_cgroups},
};
use crate::{
    cgroups::CgroupFs,
    cm::naming::CgroupNaming,
    cri::{self, ImageService, RuntimeService, api, labels},
    metrics::{ContainerStateLabels, Metrics},
    pods::source::PodView,
};

/// A pass re-reads every cgroup's spec (quotas, shares, limits) once in
/// this many passes; the others reuse what it read.
const SPEC_REFRESH_PASSES: u64 = 6;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsSample {
    pub capacity: Option<u64>,
    pub available: Option<u64>,
    pub used: Option<u64>,
    pub inodes: Option<u64>,
    pub inodes_free: Option<u64>,
    pub inodes_used: Option<u64>,
}

impl FsSample {
    /// `used` bytes and inodes on a filesystem described by `fs`.
    pub(super) fn usage_on(fs: Option<FsSample>, used: u64, inodes_used: Option<u64>) -> FsSample {
        let fs = fs.unwrap_or_default();
        FsSample { used: Some(used), inodes_used, ..fs }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ContainerSample {
    pub name: String,
    pub id: String,
    pub image: String,
    pub start_time: Timestamp,
    pub cgroup: CgroupSample,
    pub rootfs: Option<FsSample>,
    pub logs: Option<FsSample>,
}

/// The pod's sandbox: its (pause) cgroup and its network namespace.
#[derive(Clone, Debug, PartialEq)]
pub struct SandboxSample {
    pub id: String,
    pub image: String,
    pub start_time: Timestamp,
    pub cgroup: CgroupSample,
    /// The interfaces of the sandbox's network namespace.
    pub interfaces: Vec<InterfaceSample>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PodSample {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub start_time: Timestamp,
    pub cgroup: Option<CgroupSample>,
    pub sandbox: Option<SandboxSample>,
    pub containers: Vec<ContainerSample>,
    pub ephemeral: Option<FsSample>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NodeSample {
    pub start_time: Timestamp,
    pub root: CgroupSample,
    pub memory_capacity: u64,
    pub fs: Option<FsSample>,
    pub imagefs: Option<FsSample>,
    /// Where containers' writable layers live, when the runtime keeps
    /// them apart from images (CRI ImageFsInfo's container filesystems);
    /// None: on the image filesystem.
    pub containerfs: Option<FsSample>,
    pub maxpid: Option<u64>,
    pub curproc: Option<u64>,
    pub interfaces: Vec<InterfaceSample>,
    /// (name, cgroup) of the system containers (`pods`).
    pub system: Vec<(String, CgroupSample)>,
    /// The QoS cgroups under kubepods (burstable, besteffort).
    pub qos: Vec<CgroupSample>,
    pub machine: Arc<MachineSample>,
}

/// Everything one housekeeping pass read.
#[derive(Clone, Debug, PartialEq)]
pub struct StatsSnapshot {
    pub time: Timestamp,
    pub node_name: String,
    pub node: NodeSample,
    pub pods: Vec<PodSample>,
    /// What could not be read (a non-empty list sets `scrape_error`).
    pub errors: Vec<String>,
}

/// Where the provider looks.
#[derive(Clone, Debug)]
pub struct StatsConfig {
    pub node_name: String,
    /// The kubelet root dir: nodefs is its filesystem.
    pub root_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
    pub naming: CgroupNaming,
    /// How often the background loop samples.
    pub interval: Duration,
    /// The image sandboxes are made from (cAdvisor's `image` of a
    /// sandbox's cgroup).
    pub sandbox_image: String,
}

/// The runtime calls the provider makes.
pub trait StatsRuntime: RuntimeService + ImageService {}
impl<T: RuntimeService + ImageService> StatsRuntime for T {}

pub struct StatsProvider {
    cfg: StatsConfig,
    cgroupfs: CgroupFs,
    pods: Arc<dyn PodView>,
    runtime: Option<Arc<dyn StatsRuntime>>,
    metrics: Option<Arc<Metrics>>,
    latest: watch::Sender<Option<Arc<StatsSnapshot>>>,
    /// One collection at a time.
    collecting: tokio::sync::Mutex<()>,
    /// Cumulative CPU per cgroup path at the previous sample, for rates.
    previous_cpu: Mutex<HashMap<String, (u64, Instant)>>,
    /// Specs from earlier passes, and block device names.
    specs: Arc<Mutex<SpecCache>>,
    devices: Arc<Mutex<DeviceNames>>,
    machine: Arc<MachineSample>,
    passes: std::sync::atomic::AtomicU64,
}

pub(super) fn from_unix_nanos(ns: i64) -> Timestamp {
    Timestamp::from_nanosecond(ns as i128).unwrap_or(Timestamp::UNIX_EPOCH)
}

impl StatsProvider {
    pub fn new(
        cfg: StatsConfig,
        cgroupfs: CgroupFs,
        pods: Arc<dyn PodView>,
        runtime: Option<Arc<dyn StatsRuntime>>,
        metrics: Option<Arc<Metrics>>,
    ) -> StatsProvider {
        StatsProvider {
            cfg,
            cgroupfs,
            pods,
            runtime,
            metrics,
            latest: watch::channel(None).0,
            collecting: tokio::sync::Mutex::new(()),
            previous_cpu: Mutex::new(HashMap::new()),
            specs: Arc::default(),
            devices: Arc::default(),
            machine: Arc::new(MachineSample::read()),
            passes: Default::default(),
        }
    }

    pub fn node_name(&self) -> &str {
        &self.cfg.node_name
    }

    /// Each new pass as it is taken.
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<StatsSnapshot>>> {
        self.latest.subscribe()
    }

    /// Samples every interval until `shutdown` is cancelled.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.cfg.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => { self.refresh().await; }
                _ = shutdown.cancelled() => break,
            }
        }
    }

    /// The latest sample, taking one if there is none yet.
    pub async fn latest(&self) -> Arc<StatsSnapshot> {
        let current = self.latest.borrow().clone();
        match current {
            Some(s) => s,
            None => self.refresh().await,
        }
    }

    fn current_time(&self) -> Option<Timestamp> {
        self.latest.borrow().as_ref().map(|s| s.time)
    }

    /// Takes a sample now (callers that arrive during a collection share it).
    pub async fn refresh(&self) -> Arc<StatsSnapshot> {
        let started = self.current_time();
        let _guard = self.collecting.lock().await;
        let current = self.latest.borrow().clone();
        if let Some(s) = current
            && Some(s.time) != started
        {
            return s;
        }
        let snap = Arc::new(self.collect().await);
        self.latest.send_replace(Some(snap.clone()));
        snap
    }

    async fn collect(&self) -> StatsSnapshot {
        let mut errors = vec![];
        let pods = self.pods.pods();
        let mut runtime = RuntimeView::default();
        if let Some(rt) = &self.runtime {
            runtime = RuntimeView::read(rt.as_ref(), &mut errors).await;
            if let Some(m) = &self.metrics {
                m.kubelet.running_pods.set(runtime.running_sandboxes as i64);
                for state in ["created", "running", "exited", "unknown"] {
                    let n = runtime.containers_by_state.get(state).copied().unwrap_or(0);
                    m.kubelet
                        .running_containers
                        .get_or_create(&ContainerStateLabels { container_state: state.into() })
                        .set(n as i64);
                }
            }
        }
        let cgroupfs = self.cgroupfs.clone();
        let cfg = self.cfg.clone();
        let pass = self.passes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (specs, devices, machine) = (self.specs.clone(), self.devices.clone(), self.machine.clone());
        let read = tokio::task::spawn_blocking(move || {
            let mut specs = specs.lock();
            specs.refresh = pass.is_multiple_of(SPEC_REFRESH_PASSES);
            let mut devices = devices.lock();
            let read = read_cgroups(&cgroupfs, &cfg, &pods, &runtime, &mut specs, &mut devices, machine);
            // What the pass read (the pods' copies, the runtime's lists,
            // every file's text) is garbage now: hand its pages back (see
            // `heap::release_freed`), on this thread, so that the trim
            // adds no thread to the blocking pool.
            drop((pods, runtime));
            crate::heap::release_freed();
            read
        });
        let (mut node, mut pod_samples, mut errs) = match read.await {
            Ok(r) => r,
            Err(e) => {
                errors.push(format!("reading cgroups: {e}"));
                return StatsSnapshot {
                    time: Timestamp::now(),
                    node_name: self.cfg.node_name.clone(),
                    node: NodeSample {
                        start_time: Timestamp::UNIX_EPOCH,
                        root: CgroupSample::default(),
                        memory_capacity: 0,
                        fs: None,
                        imagefs: None,
                        containerfs: None,
                        maxpid: None,
                        curproc: None,
                        interfaces: vec![],
                        system: vec![],
                        qos: vec![],
                        machine: self.machine.clone(),
                    },
                    pods: vec![],
                    errors,
                };
            }
        };
        errors.append(&mut errs);
        self.rates(&mut node, &mut pod_samples);
        StatsSnapshot { time: Timestamp::now(), node_name: self.cfg.node_name.clone(), node, pods: pod_samples, errors }
    }

    /// Fills usageNanoCores from the previous sample of each cgroup.
    fn rates(&self, node: &mut NodeSample, pods: &mut [PodSample]) {
        let now = Instant::now();
        let mut prev = self.previous_cpu.lock();
        let mut next = HashMap::new();
        let mut rate = |s: &mut CgroupSample| {
            let Some(cum) = s.cpu_usage_ns else { return };
            if let Some((pcum, pt)) = prev.get(&s.path) {
                let wall = now.saturating_duration_since(*pt).as_nanos() as u64;
                if wall > 0 && cum >= *pcum {
                    s.cpu_nano_cores = Some(((cum - pcum) as u128 * 1_000_000_000 / wall as u128) as u64);
                }
            }
            next.insert(s.path.clone(), (cum, now));
        };
        rate(&mut node.root);
        for (_, s) in &mut node.system {
            rate(s);
        }
        for s in &mut node.qos {
            rate(s);
        }
        for p in pods {
            if let Some(c) = &mut p.cgroup {
                rate(c);
            }
            if let Some(s) = &mut p.sandbox {
                rate(&mut s.cgroup);
            }
            for c in &mut p.containers {
                rate(&mut c.cgroup);
            }
        }
        *prev = next;
    }
}

/// What the runtime says runs here.
#[derive(Debug, Default)]
pub(super) struct RuntimeView {
    /// Our sandboxes by pod uid (newest first).
    pub sandboxes: HashMap<String, Vec<api::PodSandbox>>,
    /// Our running containers by pod uid.
    pub containers: HashMap<String, Vec<api::Container>>,
    /// Writable layer (bytes, inodes) by container id.
    pub writable: HashMap<String, (u64, Option<u64>)>,
    pub imagefs: Option<(String, u64, Option<u64>)>,
    /// The container filesystem, in the same form, when the runtime reports one.
    pub containerfs: Option<(String, u64, Option<u64>)>,
    running_sandboxes: u64,
    containers_by_state: BTreeMap<&'static str, u64>,
}

impl RuntimeView {
    async fn read(rt: &dyn StatsRuntime, errors: &mut Vec<String>) -> RuntimeView {
        let mut v = RuntimeView::default();
        match rt.list_pod_sandbox(None).await {
            Ok(list) => {
                for s in list {
                    let Some(id) = labels::identity(&s.labels) else { continue };
                    if cri::sandbox_ready(s.state) {
                        v.running_sandboxes += 1;
                    }
                    v.sandboxes.entry(id.uid).or_default().push(s);
                }
                for l in v.sandboxes.values_mut() {
                    l.sort_by_key(|s| std::cmp::Reverse(s.created_at));
                }
            }
            Err(e) => errors.push(format!("listing pod sandboxes: {e}")),
        }
        match rt.list_containers(None).await {
            Ok(list) => {
                for c in list {
                    let Some(id) = labels::identity(&c.labels) else { continue };
                    let state = match cri::container_state(c.state) {
                        api::ContainerState::ContainerCreated => "created",
                        api::ContainerState::ContainerRunning => "running",
                        api::ContainerState::ContainerExited => "exited",
                        api::ContainerState::ContainerUnknown => "unknown",
                    };
                    *v.containers_by_state.entry(state).or_default() += 1;
                    if state == "running" {
                        v.containers.entry(id.uid).or_default().push(c);
                    }
                }
            }
            Err(e) => errors.push(format!("listing containers: {e}")),
        }
        match rt.list_container_stats(None).await {
            Ok(stats) => {
                for s in stats {
                    let (Some(attr), Some(w)) = (s.attributes, s.writable_layer) else { continue };
                    if let Some(used) = w.used_bytes {
                        v.writable.insert(attr.id, (used.value, w.inodes_used.map(|i| i.value)));
                    }
                }
            }
            Err(e) => errors.push(format!("listing container stats: {e}")),
        }
        // The first of each list, as the kubelet's CRI stats provider
        // takes them; no container filesystem means the image one.
        let usage = |f: api::FilesystemUsage| {
            (
                f.fs_id.map(|i| i.mountpoint).unwrap_or_default(),
                f.used_bytes.map(|u| u.value).unwrap_or(0),
                f.inodes_used.map(|i| i.value),
            )
        };
        match rt.filesystems().await {
            Ok(fss) => {
                v.imagefs = fss.image_filesystems.into_iter().next().map(usage);
                v.containerfs = fss.container_filesystems.into_iter().next().map(usage);
            }
            Err(e) => errors.push(format!("image filesystem: {e}")),
        }
        v
    }
}

/// Seconds since the epoch, for metrics.
pub fn unix_seconds(ts: Timestamp) -> f64 {
    ts.as_nanosecond() as f64 / 1e9
}
