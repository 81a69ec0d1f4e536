//! The figures behind /stats/summary, /metrics/resource and
//! /metrics/cadvisor: per node, pod and container CPU, memory, processes,
//! OOM kills and filesystems, read from cgroupfs, procfs, statfs and the
//! runtime (sandboxes, containers, writable layers, image filesystem).
//!
//! Like cAdvisor's housekeeping, a background loop samples every interval
//! and requests are served from the latest sample, so a scrape costs an
//! encode, not a walk of the cgroup tree (with 110 pods the walk is a few
//! thousand file reads). The first request before any sample waits for
//! one. CPU rates (`usageNanoCores`) come from consecutive samples.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use tokio::sync::watch;

use super::summary::{
    ContainerStats, CpuStats, FsStats, InterfaceStats, MemoryStats, NetworkStats, NodeStats, PodReference, PodStats,
    ProcessStats, RlimitStats, RuntimeStats, SYSTEM_CONTAINER_PODS, Summary,
};
use crate::{
    cgroups::{CgroupDir, CgroupFs, MemoryStat, Version, subtree_processes},
    cm::{
        naming::{CgroupDriver, CgroupNaming},
        qos::{QosClass, qos_class},
    },
    cri::{self, ImageService, RuntimeService, api, labels},
    metrics::{ContainerStateLabels, Metrics},
    pods::source::PodView,
    signals::node,
};

/// One cgroup's figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CgroupSample {
    /// Relative path in the hierarchy ("" for the root).
    pub path: String,
    pub cpu_usage_ns: Option<u64>,
    pub cpu_nano_cores: Option<u64>,
    pub memory_usage: Option<u64>,
    pub working_set: Option<u64>,
    pub rss: Option<u64>,
    pub page_faults: Option<u64>,
    pub major_page_faults: Option<u64>,
    pub memory_limit: Option<u64>,
    pub processes: Option<u64>,
    pub oom_kills: Option<u64>,
}

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
    fn of(fs: node::FsStats) -> FsSample {
        FsSample {
            capacity: Some(fs.capacity_bytes),
            available: Some(fs.available_bytes),
            used: Some(fs.capacity_bytes.saturating_sub(fs.available_bytes)),
            inodes: Some(fs.inodes),
            inodes_free: Some(fs.inodes_free),
            inodes_used: Some(fs.inodes.saturating_sub(fs.inodes_free)),
        }
    }

    /// `used` bytes and inodes on a filesystem described by `fs`.
    fn usage_on(fs: Option<FsSample>, used: u64, inodes_used: Option<u64>) -> FsSample {
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

#[derive(Clone, Debug, PartialEq)]
pub struct PodSample {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub start_time: Timestamp,
    pub cgroup: Option<CgroupSample>,
    pub containers: Vec<ContainerSample>,
    pub ephemeral: Option<FsSample>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct InterfaceSample {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_errors: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NodeSample {
    pub start_time: Timestamp,
    pub root: CgroupSample,
    pub memory_capacity: u64,
    pub fs: Option<FsSample>,
    pub imagefs: Option<FsSample>,
    pub maxpid: Option<u64>,
    pub curproc: Option<u64>,
    pub interfaces: Vec<InterfaceSample>,
    /// (name, cgroup) of the system containers (`pods`).
    pub system: Vec<(String, CgroupSample)>,
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
}

fn from_unix_nanos(ns: i64) -> Timestamp {
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
        }
    }

    pub fn node_name(&self) -> &str {
        &self.cfg.node_name
    }

    /// Each new pass as it is taken.
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<StatsSnapshot>>> {
        self.latest.subscribe()
    }

    /// Samples every interval until `shutdown` turns true.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.cfg.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => { self.refresh().await; }
                _ = super::http::stopped(&mut shutdown) => break,
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
        let read = tokio::task::spawn_blocking(move || read_cgroups(&cgroupfs, &cfg, &pods, &runtime));
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
                        maxpid: None,
                        curproc: None,
                        interfaces: vec![],
                        system: vec![],
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
        let mut prev = self.previous_cpu.lock().unwrap_or_else(|p| p.into_inner());
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
        for p in pods {
            if let Some(c) = &mut p.cgroup {
                rate(c);
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
struct RuntimeView {
    /// Our sandboxes by pod uid (newest first).
    sandboxes: HashMap<String, Vec<api::PodSandbox>>,
    /// Our running containers by pod uid.
    containers: HashMap<String, Vec<api::Container>>,
    /// Writable layer (bytes, inodes) by container id.
    writable: HashMap<String, (u64, Option<u64>)>,
    imagefs: Option<(String, u64, Option<u64>)>,
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
        match rt.image_fs_info().await {
            Ok(fss) => {
                v.imagefs = fss.into_iter().next().map(|f| {
                    (
                        f.fs_id.map(|i| i.mountpoint).unwrap_or_default(),
                        f.used_bytes.map(|u| u.value).unwrap_or(0),
                        f.inodes_used.map(|i| i.value),
                    )
                })
            }
            Err(e) => errors.push(format!("image filesystem: {e}")),
        }
        v
    }
}

fn read_to_string(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// `key value` lines (cpu.stat, memory.events, memory.oom_control).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Cumulative CPU time of a cgroup in nanoseconds; `memory` is its open
/// memory directory, which on v2 is also its cpu directory.
pub fn cpu_usage_ns(fs: &CgroupFs, rel: &str, memory: &CgroupDir) -> Option<u64> {
    match fs.version() {
        Version::V1 => read_to_string(&fs.controller_dir("cpuacct", rel).join("cpuacct.usage"))?.trim().parse().ok(),
        Version::V2 => keyed(&memory.read("cpu.stat").ok()?, "usage_usec").map(|us| us * 1000),
    }
}

/// OOM kills inside a cgroup (memory.oom_control on v1, memory.events on v2).
pub fn oom_kills(fs: &CgroupFs, memory: &CgroupDir) -> Option<u64> {
    let file = match fs.version() {
        Version::V1 => "memory.oom_control",
        Version::V2 => "memory.events",
    };
    keyed(&memory.read(file).ok()?, "oom_kill")
}

/// What cgroupfs says about one cgroup, its process count aside (one walk
/// per pod counts those: [`CgroupFs::process_tree`]); None when it does not
/// exist. Its memory files are read through one open of its directory.
pub fn sample_cgroup(fs: &CgroupFs, rel: &str) -> Option<CgroupSample> {
    let memory = fs.open_memory_dir(rel).ok()?;
    let mut s =
        CgroupSample { path: rel.to_owned(), cpu_usage_ns: cpu_usage_ns(fs, rel, &memory), ..Default::default() };
    if let Ok(text) = memory.read("memory.stat") {
        let stat = MemoryStat::parse(&text, fs.version());
        let pgfault_key = if fs.version() == Version::V1 { "total_pgfault" } else { "pgfault" };
        s.page_faults = keyed(&text, pgfault_key);
        s.major_page_faults = Some(stat.pgmajfault);
        s.rss = Some(stat.rss);
        if let Ok(usage) = fs.memory_usage_in(&memory, rel.trim_matches('/').is_empty()) {
            s.memory_usage = Some(usage);
            s.working_set = Some(usage.saturating_sub(stat.inactive_file));
        }
    }
    if !rel.is_empty() {
        s.memory_limit = fs.memory_limit_in(&memory).ok().flatten();
        s.oom_kills = oom_kills(fs, &memory);
    }
    Some(s)
}

/// Bytes and inodes of the files under `dir` (a container's log directory).
fn du(dir: &Path) -> Option<(u64, u64)> {
    let mut bytes = 0;
    let mut inodes = 0;
    let mut stack = vec![dir.to_owned()];
    let mut found = false;
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        found = true;
        inodes += 1;
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else {
                inodes += 1;
                bytes += m.len();
            }
        }
    }
    found.then_some((bytes, inodes))
}

/// The kubelet's pod log directory: `<podLogsDir>/<ns>_<name>_<uid>`.
pub fn pod_log_dir(pod_logs_dir: &Path, namespace: &str, name: &str, uid: &str) -> PathBuf {
    pod_logs_dir.join(format!("{namespace}_{name}_{uid}"))
}

/// Where the runtime puts a container's cgroup under its pod's: containerd
/// names it by id with cgroupfs, `cri-containerd-<id>.scope` with systemd.
/// `exists` says which cgroups there are.
fn container_cgroup(driver: CgroupDriver, pod_cgroup: &str, id: &str, exists: impl Fn(&str) -> bool) -> Option<String> {
    let candidates = match driver {
        CgroupDriver::Cgroupfs => [format!("{pod_cgroup}/{id}"), format!("{pod_cgroup}/cri-containerd-{id}.scope")],
        CgroupDriver::Systemd => [format!("{pod_cgroup}/cri-containerd-{id}.scope"), format!("{pod_cgroup}/{id}")],
    };
    candidates.into_iter().find(|c| exists(c))
}

/// The QoS class a pod's cgroup sits under.
pub fn pod_qos(pod: &Pod) -> QosClass {
    match pod.status.as_ref().and_then(|s| s.qos_class.as_deref()) {
        Some("Guaranteed") => QosClass::Guaranteed,
        Some("Burstable") => QosClass::Burstable,
        Some("BestEffort") => QosClass::BestEffort,
        _ => pod.spec.as_ref().map(qos_class).unwrap_or(QosClass::BestEffort),
    }
}

/// Boot time (btime of /proc/stat), the node's and root cgroup's start.
fn boot_time() -> Option<Timestamp> {
    let s = read_to_string(Path::new("/proc/stat"))?;
    let secs: i64 = s.lines().find_map(|l| l.strip_prefix("btime "))?.trim().parse().ok()?;
    Timestamp::from_second(secs).ok()
}

/// Interfaces from /proc/net/dev, loopback excluded.
pub fn parse_net_dev(text: &str) -> Vec<InterfaceSample> {
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let name = name.trim();
            let f: Vec<u64> = rest.split_whitespace().filter_map(|x| x.parse().ok()).collect();
            (name != "lo" && f.len() >= 16).then(|| InterfaceSample {
                name: name.to_owned(),
                rx_bytes: f[0],
                rx_errors: f[2],
                tx_bytes: f[8],
                tx_errors: f[10],
            })
        })
        .collect()
}

fn read_cgroups(
    fs: &CgroupFs,
    cfg: &StatsConfig,
    pods: &[Pod],
    rt: &RuntimeView,
) -> (NodeSample, Vec<PodSample>, Vec<String>) {
    let mut errors = vec![];
    let memory_capacity = node::mem_total().unwrap_or(0);
    let root = sample_cgroup(fs, "").unwrap_or_default();
    let nodefs = match node::statfs(&cfg.root_dir) {
        Ok(s) => Some(FsSample::of(s)),
        Err(e) => {
            errors.push(format!("statfs {}: {e}", cfg.root_dir.display()));
            None
        }
    };
    let imagefs = rt.imagefs.as_ref().map(|(mountpoint, used, inodes_used)| {
        let base =
            (!mountpoint.is_empty()).then(|| node::statfs(Path::new(mountpoint)).ok()).flatten().map(FsSample::of);
        FsSample::usage_on(base, *used, *inodes_used)
    });
    let logs_fs = node::statfs(&cfg.pod_logs_dir).ok().map(FsSample::of).or(nodefs);
    let kubepods = cfg.naming.kubepods();
    let system = sample_cgroup(fs, &kubepods).map(|s| vec![(SYSTEM_CONTAINER_PODS.to_owned(), s)]).unwrap_or_default();
    let node = NodeSample {
        start_time: boot_time().unwrap_or(Timestamp::UNIX_EPOCH),
        root,
        memory_capacity,
        fs: nodefs,
        imagefs,
        maxpid: node::pid_max().ok(),
        curproc: node::tasks().ok(),
        interfaces: read_to_string(Path::new("/proc/net/dev")).map(|t| parse_net_dev(&t)).unwrap_or_default(),
        system,
    };
    let mut out = vec![];
    for pod in pods {
        let m = &pod.metadata;
        let (Some(uid), Some(name)) = (m.uid.clone(), m.name.clone()) else { continue };
        let namespace = m.namespace.clone().unwrap_or_else(|| "default".into());
        let pod_cgroup_path = cfg.naming.pod(pod_qos(pod), &uid);
        // One walk counts the processes of the pod and of each container.
        let tree = fs.process_tree(&pod_cgroup_path).ok();
        let sample = |rel: &str| {
            sample_cgroup(fs, rel).map(|mut s| {
                s.processes = tree.as_deref().map(|t| subtree_processes(t, rel));
                s
            })
        };
        let pod_cgroup = sample(&pod_cgroup_path);
        let log_dir = pod_log_dir(&cfg.pod_logs_dir, &namespace, &name, &uid);
        let mut containers: Vec<ContainerSample> = vec![];
        let mut listed: Vec<&api::Container> = rt.containers.get(&uid).map(|v| v.iter().collect()).unwrap_or_default();
        // The newest container of each name.
        listed.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        for c in listed {
            let cname = c.metadata.as_ref().map(|md| md.name.clone()).unwrap_or_default();
            if containers.iter().any(|x| x.name == cname) {
                continue;
            }
            // The walk listed the pod's cgroups; without it, ask cgroupfs.
            let exists = |rel: &str| match &tree {
                Some(t) => t.iter().any(|(p, _)| p == rel.trim_matches('/')),
                None => fs.exists(rel),
            };
            let cgroup = container_cgroup(cfg.naming.driver, &pod_cgroup_path, &c.id, exists)
                .and_then(|p| sample(&p))
                .unwrap_or_default();
            let rootfs =
                rt.writable.get(&c.id).map(|(used, inodes)| FsSample::usage_on(imagefs_base(&node), *used, *inodes));
            let logs = du(&log_dir.join(&cname)).map(|(b, i)| FsSample::usage_on(logs_fs, b, Some(i)));
            containers.push(ContainerSample {
                name: cname,
                id: c.id.clone(),
                image: c.image.as_ref().map(|i| i.image.clone()).unwrap_or_else(|| c.image_ref.clone()),
                start_time: from_unix_nanos(c.created_at),
                cgroup,
                rootfs,
                logs,
            });
        }
        containers.sort_by(|a, b| a.name.cmp(&b.name));
        let start_time = pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0)
            .or_else(|| rt.sandboxes.get(&uid).and_then(|s| s.first()).map(|s| from_unix_nanos(s.created_at)))
            .unwrap_or(Timestamp::UNIX_EPOCH);
        // Ephemeral storage: writable layers plus logs (emptyDir volumes
        // are not measured yet).
        let mut used = 0;
        let mut inodes = 0;
        let mut measured = false;
        for c in &containers {
            for f in [c.rootfs, c.logs].into_iter().flatten() {
                measured = true;
                used += f.used.unwrap_or(0);
                inodes += f.inodes_used.unwrap_or(0);
            }
        }
        let ephemeral = measured.then(|| FsSample::usage_on(nodefs, used, Some(inodes)));
        out.push(PodSample { namespace, name, uid, start_time, cgroup: pod_cgroup, containers, ephemeral });
    }
    (node, out, errors)
}

/// The image filesystem's capacity and free space, without its usage.
fn imagefs_base(node: &NodeSample) -> Option<FsSample> {
    node.imagefs.map(|f| FsSample { used: None, inodes_used: None, ..f })
}

fn t(ts: Timestamp) -> Time {
    Time(ts)
}

fn cpu(s: &CgroupSample, at: Timestamp) -> Option<CpuStats> {
    s.cpu_usage_ns.map(|u| CpuStats {
        time: t(at),
        usage_nano_cores: s.cpu_nano_cores,
        usage_core_nano_seconds: Some(u),
    })
}

fn memory(s: &CgroupSample, at: Timestamp, capacity: Option<u64>) -> Option<MemoryStats> {
    s.working_set?;
    let available = match (s.memory_limit.or(capacity), s.working_set) {
        (Some(limit), Some(ws)) => Some(limit.saturating_sub(ws)),
        _ => None,
    };
    Some(MemoryStats {
        time: t(at),
        available_bytes: available,
        usage_bytes: s.memory_usage,
        working_set_bytes: s.working_set,
        rss_bytes: s.rss,
        page_faults: s.page_faults,
        major_page_faults: s.major_page_faults,
    })
}

fn fs_stats(f: &FsSample, at: Timestamp) -> FsStats {
    FsStats {
        time: t(at),
        available_bytes: f.available,
        capacity_bytes: f.capacity,
        used_bytes: f.used,
        inodes_free: f.inodes_free,
        inodes: f.inodes,
        inodes_used: f.inodes_used,
    }
}

/// The Summary API response for a sample.
pub fn summary(s: &StatsSnapshot) -> Summary {
    let at = s.time;
    let n = &s.node;
    let network = n.interfaces.iter().max_by_key(|i| i.rx_bytes + i.tx_bytes).map(|default| {
        let conv = |i: &InterfaceSample| InterfaceStats {
            name: i.name.clone(),
            rx_bytes: Some(i.rx_bytes),
            rx_errors: Some(i.rx_errors),
            tx_bytes: Some(i.tx_bytes),
            tx_errors: Some(i.tx_errors),
        };
        NetworkStats { time: t(at), interface: conv(default), interfaces: n.interfaces.iter().map(conv).collect() }
    });
    let node = NodeStats {
        node_name: s.node_name.clone(),
        system_containers: n
            .system
            .iter()
            .map(|(name, c)| ContainerStats {
                name: name.clone(),
                start_time: t(n.start_time),
                cpu: cpu(c, at),
                memory: memory(c, at, None),
                rootfs: None,
                logs: None,
            })
            .collect(),
        start_time: t(n.start_time),
        cpu: cpu(&n.root, at),
        memory: memory(&n.root, at, Some(n.memory_capacity)),
        network,
        fs: n.fs.as_ref().map(|f| fs_stats(f, at)),
        runtime: n
            .imagefs
            .as_ref()
            .map(|f| RuntimeStats { image_fs: Some(fs_stats(f, at)), container_fs: Some(fs_stats(f, at)) }),
        rlimit: Some(RlimitStats {
            time: t(at),
            maxpid: n.maxpid.map(|v| v as i64),
            curproc: n.curproc.map(|v| v as i64),
        }),
    };
    let pods = s
        .pods
        .iter()
        .map(|p| PodStats {
            pod_ref: PodReference { name: p.name.clone(), namespace: p.namespace.clone(), uid: p.uid.clone() },
            start_time: t(p.start_time),
            containers: p
                .containers
                .iter()
                .map(|c| ContainerStats {
                    name: c.name.clone(),
                    start_time: t(c.start_time),
                    cpu: cpu(&c.cgroup, at),
                    memory: memory(&c.cgroup, at, None),
                    rootfs: c.rootfs.as_ref().map(|f| fs_stats(f, at)),
                    logs: c.logs.as_ref().map(|f| fs_stats(f, at)),
                })
                .collect(),
            cpu: p.cgroup.as_ref().and_then(|c| cpu(c, at)),
            memory: p.cgroup.as_ref().and_then(|c| memory(c, at, None)),
            network: None,
            volume_stats: vec![],
            ephemeral_storage: p.ephemeral.as_ref().map(|f| fs_stats(f, at)),
            process_stats: p.cgroup.as_ref().and_then(|c| c.processes).map(|n| ProcessStats { process_count: Some(n) }),
        })
        .collect();
    Summary { node, pods }
}

/// Seconds since the epoch, for metrics.
pub fn unix_seconds(ts: Timestamp) -> f64 {
    ts.as_nanosecond() as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_files() {
        assert_eq!(keyed("usage_usec 1500\nuser_usec 1000\n", "usage_usec"), Some(1500));
        assert_eq!(keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill"), Some(3));
        assert_eq!(keyed("low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\noom_group_kill 0\n", "oom_kill"), Some(1));
        assert_eq!(keyed("x 1\n", "oom_kill"), None);
    }

    #[test]
    fn net_dev() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
                    face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
                    lo: 100 1 0 0 0 0 0 0 100 1 0 0 0 0 0 0\n  \
                    eth0: 5000 40 2 0 0 0 0 0 7000 50 1 0 0 0 0 0\n";
        assert_eq!(
            parse_net_dev(text),
            vec![InterfaceSample { name: "eth0".into(), rx_bytes: 5000, rx_errors: 2, tx_bytes: 7000, tx_errors: 1 }]
        );
    }

    fn snapshot() -> StatsSnapshot {
        let at = Timestamp::from_second(1_700_000_060).unwrap();
        let cg = |path: &str, ws: u64| CgroupSample {
            path: path.into(),
            cpu_usage_ns: Some(2_500_000_000),
            cpu_nano_cores: Some(250_000_000),
            memory_usage: Some(ws + 10),
            working_set: Some(ws),
            rss: Some(ws / 2),
            page_faults: Some(7),
            major_page_faults: Some(1),
            memory_limit: None,
            processes: Some(3),
            oom_kills: Some(0),
        };
        StatsSnapshot {
            time: at,
            node_name: "n1".into(),
            node: NodeSample {
                start_time: Timestamp::from_second(1_600_000_000).unwrap(),
                root: cg("", 1000),
                memory_capacity: 4000,
                fs: Some(FsSample {
                    capacity: Some(100),
                    available: Some(60),
                    used: Some(40),
                    inodes: Some(10),
                    inodes_free: Some(4),
                    inodes_used: Some(6),
                }),
                imagefs: None,
                maxpid: Some(4_194_304),
                curproc: Some(321),
                interfaces: vec![],
                system: vec![("pods".into(), cg("kubepods", 500))],
            },
            pods: vec![PodSample {
                namespace: "default".into(),
                name: "web".into(),
                uid: "u1".into(),
                start_time: Timestamp::from_second(1_700_000_000).unwrap(),
                cgroup: Some(CgroupSample { memory_limit: Some(800), ..cg("kubepods/podu1", 300) }),
                containers: vec![ContainerSample {
                    name: "nginx".into(),
                    id: "abc".into(),
                    image: "nginx:1".into(),
                    start_time: Timestamp::from_second(1_700_000_001).unwrap(),
                    cgroup: cg("kubepods/podu1/abc", 200),
                    rootfs: Some(FsSample { used: Some(4096), inodes_used: Some(2), ..Default::default() }),
                    logs: None,
                }],
                ephemeral: Some(FsSample { used: Some(4096), ..Default::default() }),
            }],
            errors: vec![],
        }
    }

    #[test]
    fn summary_json_has_the_kubelet_shape() {
        let v = serde_json::to_value(summary(&snapshot())).unwrap();
        let node = &v["node"];
        assert_eq!(node["nodeName"], "n1");
        assert_eq!(node["startTime"], "2020-09-13T12:26:40Z");
        assert_eq!(node["cpu"]["usageCoreNanoSeconds"], 2_500_000_000u64);
        assert_eq!(node["cpu"]["usageNanoCores"], 250_000_000u64);
        assert_eq!(node["cpu"]["time"], "2023-11-14T22:14:20Z");
        assert_eq!(node["memory"]["workingSetBytes"], 1000);
        assert_eq!(node["memory"]["availableBytes"], 3000);
        assert_eq!(node["rlimit"]["maxpid"], 4_194_304);
        assert_eq!(node["rlimit"]["curproc"], 321);
        assert_eq!(node["fs"]["inodesUsed"], 6);
        assert_eq!(node["systemContainers"][0]["name"], "pods");
        let pod = &v["pods"][0];
        assert_eq!(pod["podRef"], serde_json::json!({"name": "web", "namespace": "default", "uid": "u1"}));
        assert_eq!(pod["memory"]["availableBytes"], 500, "limit − working set");
        assert_eq!(pod["process_stats"]["process_count"], 3);
        assert_eq!(pod["ephemeral-storage"]["usedBytes"], 4096);
        let c = &pod["containers"][0];
        assert_eq!(c["name"], "nginx");
        assert_eq!(c["rootfs"]["usedBytes"], 4096);
        assert!(c["memory"].get("availableBytes").is_none(), "no limit, no available");
        assert!(c.get("logs").is_none());
        // And it reads back.
        let back: Summary = serde_json::from_value(v).unwrap();
        assert_eq!(back, summary(&snapshot()));
    }
}
