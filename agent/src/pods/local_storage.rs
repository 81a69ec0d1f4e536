//! Local ephemeral storage isolation (the kubelet's
//! `localStorageEviction`): a pod whose emptyDir outgrows its sizeLimit,
//! whose ephemeral storage outgrows the sum of its containers'
//! `ephemeral-storage` limits, or with a container over its own limit, is
//! evicted at once (grace period 0) with the kubelet's message.
//!
//! Usage counts as the kubelet counts it: a container's writable layer
//! (CRI container stats) and its logs; the pod's disk emptyDirs,
//! configMap and downwardAPI volumes (memory-backed ones are memory, not
//! disk). The decision ([`evaluate`]) is pure.
//!
//! [`LocalStorageMonitor::run`] checks the pods that have something to
//! enforce every period and, between periods, shortly after inotify sees
//! a write in one of their disk emptyDirs, so a runaway writer is caught
//! within a fraction of a second rather than at the next period.

use std::{
    collections::{HashMap, HashSet},
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::io::unix::AsyncFd;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::{source::PodView, spec};
use crate::{
    cm::qos::{SYSTEM_CRITICAL_PRIORITY, priority},
    config::format_quantity,
    cri::{RuntimeService, api, labels},
    eviction::{
        driver::{DiskUsageMeter, EvictionRequest, KillPath, PodDiskUsage, PodEvictor},
        signal::EvictionSignal,
    },
    quantity::Quantity,
    volumes::manager::{VolumeKind, VolumeManager, VolumeUsage},
};

/// What one pod uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodStorageUsage {
    /// Per volume name: bytes used.
    pub volumes: HashMap<String, u64>,
    /// Per container name: writable layer + logs.
    pub containers: HashMap<String, u64>,
}

impl PodStorageUsage {
    /// The pod's local ephemeral storage: its containers' writable layers
    /// and logs plus the volumes of the kinds that count toward it.
    pub fn ephemeral_bytes(&self, kinds: &HashMap<String, VolumeKind>) -> u64 {
        let volumes: u64 = self
            .volumes
            .iter()
            .filter(|(name, _)| kinds.get(*name).is_some_and(|k| k.counts_as_ephemeral_storage()))
            .map(|(_, b)| *b)
            .sum();
        volumes + self.containers.values().sum::<u64>()
    }
}

fn parse(q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> Option<Quantity> {
    q.0.parse::<Quantity>().ok()
}

fn ephemeral_limit(c: &Container) -> Option<Quantity> {
    c.resources.as_ref()?.limits.as_ref()?.get("ephemeral-storage").and_then(parse)
}

/// The pod's ephemeral-storage limit (the kubelet's PodLimits: the sum of
/// the app containers', or the largest init container's if more); None
/// when no container sets one.
pub fn pod_ephemeral_limit(pod: &Pod) -> Option<Quantity> {
    let spec = pod.spec.as_ref()?;
    let sum: Option<i64> =
        spec.containers.iter().filter_map(ephemeral_limit).map(|q| q.milli_value()).reduce(|a, b| a + b);
    let init = spec.init_containers.iter().flatten().filter_map(ephemeral_limit).map(|q| q.milli_value()).max();
    let total = match (sum, init) {
        (None, None) => return None,
        (a, b) => a.unwrap_or(0).max(b.unwrap_or(0)),
    };
    (total > 0).then(|| Quantity::from_milli(total))
}

/// Whether a pod has a local storage limit to enforce.
pub fn has_limits(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else { return false };
    spec.volumes.iter().flatten().any(|v| v.empty_dir.as_ref().is_some_and(|e| e.size_limit.is_some()))
        || spec.containers.iter().chain(spec.init_containers.iter().flatten()).any(|c| ephemeral_limit(c).is_some())
}

/// The kubelet's local storage decision for one pod: the eviction
/// message, or None. `volumes` says which volumes count toward the pod's
/// ephemeral storage.
pub fn evaluate(pod: &Pod, kinds: &HashMap<String, VolumeKind>, usage: &PodStorageUsage) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    for v in spec.volumes.iter().flatten() {
        let Some(limit) = v.empty_dir.as_ref().and_then(|e| e.size_limit.as_ref()).and_then(parse) else { continue };
        if limit.value() <= 0 {
            continue;
        }
        if let Some(used) = usage.volumes.get(&v.name)
            && *used as i64 > limit.value()
        {
            return Some(format!(
                "Usage of EmptyDir volume {:?} exceeds the limit {:?}. ",
                v.name,
                format_quantity(&limit)
            ));
        }
    }
    if let Some(limit) = pod_ephemeral_limit(pod) {
        let total = usage.ephemeral_bytes(kinds);
        if total as i64 > limit.value() {
            return Some(format!(
                "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
                format_quantity(&limit)
            ));
        }
    }
    for c in spec.containers.iter() {
        let Some(limit) = ephemeral_limit(c) else { continue };
        if let Some(used) = usage.containers.get(&c.name)
            && *used as i64 > limit.value()
        {
            return Some(format!(
                "Container {} exceeded its local ephemeral storage limit {:?}. ",
                c.name,
                format_quantity(&limit)
            ));
        }
    }
    None
}

/// Bytes a directory tree takes on disk (`du`): allocated blocks, each
/// inode once, not crossing into other filesystems or mounts of the same
/// one except the tree's own.
pub fn disk_usage(root: &Path) -> u64 {
    disk_usage_and_inodes(root).0
}

/// [`disk_usage`] and the number of inodes the tree holds (each once).
pub fn disk_usage_and_inodes(root: &Path) -> (u64, u64) {
    let Ok(meta) = fs::symlink_metadata(root) else { return (0, 0) };
    let dev = meta.dev();
    let mut seen = HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![root.to_path_buf()];
    seen.insert(meta.ino());
    total += meta.blocks() * 512;
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.dev() != dev || !seen.insert(m.ino()) {
                continue;
            }
            total += m.blocks() * 512;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    (total, seen.len() as u64)
}

/// Watches directories for writes (inotify), to check soon after one.
struct Writes {
    fd: AsyncFd<inotify::Inotify>,
    watched: HashSet<PathBuf>,
}

const WATCH_LIMIT: usize = 4096;

impl Writes {
    fn new() -> std::io::Result<Writes> {
        let inotify = inotify::Inotify::init()?;
        // SAFETY: the Inotify owns its descriptor and keeps it open, the
        // same one, until it is dropped with the AsyncFd.
        let fd = unsafe { AsyncFd::register_with_interest(inotify, tokio::io::Interest::READABLE) }
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(Writes { fd, watched: HashSet::new() })
    }

    /// Adds watches for `root` and every directory under it (up to a limit).
    fn watch_tree(&mut self, root: &Path) {
        use inotify::WatchMask;
        let mask = WatchMask::MODIFY | WatchMask::CLOSE_WRITE | WatchMask::CREATE | WatchMask::MOVED_TO;
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            if self.watched.len() >= WATCH_LIMIT {
                return;
            }
            if !self.watched.contains(&dir) && self.fd.get_ref().watches().add(&dir, mask).is_ok() {
                self.watched.insert(dir.clone());
            }
            if let Ok(entries) = fs::read_dir(&dir) {
                stack.extend(entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()));
            }
        }
    }

    /// Waits for at least one event and reads all that are pending.
    async fn wait(&mut self) {
        let mut buf = [0u8; 4096];
        loop {
            let Ok(mut guard) = self.fd.readable_mut().await else { return std::future::pending().await };
            let mut any = false;
            while guard.get_inner_mut().read_events(&mut buf).is_ok() {
                any = true;
            }
            guard.clear_ready();
            if any {
                return;
            }
        }
    }
}

/// Enforces local storage limits for the pods of a [`PodView`].
pub struct LocalStorageMonitor {
    pub pods: Arc<dyn PodView>,
    pub evictor: Arc<dyn PodEvictor>,
    pub runtime: Arc<dyn RuntimeService>,
    pub volumes: Arc<VolumeManager>,
    /// The kubelet's pod log directory root (`podLogsDir`).
    pub pod_logs_dir: PathBuf,
    /// The periodic check (the kubelet's eviction monitoring period).
    pub period: Duration,
}

/// The eviction manager measures pods through the same accounting as the
/// local storage limits.
impl DiskUsageMeter for LocalStorageMonitor {
    fn measure<'a>(
        &'a self,
        uids: &'a [String],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = HashMap<String, PodDiskUsage>> + Send + 'a>> {
        Box::pin(self.nodefs_usage(uids))
    }
}

impl LocalStorageMonitor {
    /// Measures and decides for every pod with a limit; evicts the
    /// offenders. Returns the uids evicted.
    pub async fn check(&self, already: &mut HashSet<String>) -> Vec<String> {
        let pods: Vec<Pod> = self
            .pods
            .pods()
            .into_iter()
            .filter(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
                has_limits(p) && phase != "Failed" && phase != "Succeeded"
            })
            .collect();
        already.retain(|uid| pods.iter().any(|p| p.metadata.uid.as_deref() == Some(uid)));
        if pods.is_empty() {
            return vec![];
        }
        let stats = self.runtime.list_container_stats(None).await.unwrap_or_default();
        let mut evicted = vec![];
        for pod in pods {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if already.contains(&uid) || priority(&pod) >= SYSTEM_CRITICAL_PRIORITY {
                continue;
            }
            let vols = self.volumes.usage_paths(&uid).await;
            let usage = self.measure(&pod, &vols, &stats).await;
            let kinds: HashMap<String, VolumeKind> = vols.iter().map(|v| (v.name.clone(), v.kind)).collect();
            debug!(pod = pod.metadata.name.as_deref().unwrap_or(""), ?usage, "local storage");
            if let Some(message) = evaluate(&pod, &kinds, &usage) {
                info!(pod = pod.metadata.name.as_deref().unwrap_or(""), "evicting: {message}");
                self.evictor.evict(EvictionRequest {
                    uid: uid.clone(),
                    namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                    name: pod.metadata.name.clone().unwrap_or_default(),
                    // Local storage evictions have no node signal; nodefs is
                    // the filesystem they protect.
                    signal: EvictionSignal::NodeFsAvailable,
                    grace_period_secs: 0,
                    message,
                    annotations: Default::default(),
                    killed: KillPath::Graceful,
                });
                already.insert(uid.clone());
                evicted.push(uid);
            }
        }
        evicted
    }

    async fn measure(&self, pod: &Pod, vols: &[VolumeUsage], stats: &[api::ContainerStats]) -> PodStorageUsage {
        self.measure_with_inodes(pod, vols, stats).await.0
    }

    /// The pod's usage and the inodes it holds on nodefs (writable layers,
    /// logs, and the volumes that count as ephemeral storage).
    async fn measure_with_inodes(
        &self,
        pod: &Pod,
        vols: &[VolumeUsage],
        stats: &[api::ContainerStats],
    ) -> (PodStorageUsage, u64) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let id = spec::identity(pod);
        let log_dir = self.pod_logs_dir.join(format!("{}_{}_{}", id.namespace, id.name, id.uid));
        let paths: Vec<(String, PathBuf, bool)> = vols
            .iter()
            // Persistent volumes are not the node's ephemeral storage.
            .filter(|v| v.kind != VolumeKind::HostPath && !v.kind.persistent())
            .map(|v| (v.name.clone(), v.path.clone(), v.kind.counts_as_ephemeral_storage()))
            .collect();
        let names: Vec<String> = pod.spec.iter().flat_map(|s| s.containers.iter()).map(|c| c.name.clone()).collect();
        let (volumes, logs, mut inodes) = tokio::task::spawn_blocking(move || {
            let mut inodes = 0;
            let mut volumes = HashMap::new();
            for (n, p, counts) in paths {
                let (bytes, i) = disk_usage_and_inodes(&p);
                if counts {
                    inodes += i;
                }
                volumes.insert(n, bytes);
            }
            let mut logs = HashMap::new();
            for n in names {
                let (bytes, i) = disk_usage_and_inodes(&log_dir.join(&n));
                inodes += i;
                logs.insert(n, bytes);
            }
            (volumes, logs, inodes)
        })
        .await
        .unwrap_or_default();
        let mut containers = logs;
        for s in stats {
            let Some(attrs) = &s.attributes else { continue };
            if attrs.labels.get(labels::POD_UID) != Some(&uid) {
                continue;
            }
            let name = attrs.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
            let layer = s.writable_layer.as_ref().and_then(|w| w.used_bytes.as_ref()).map_or(0, |u| u.value);
            inodes += s.writable_layer.as_ref().and_then(|w| w.inodes_used.as_ref()).map_or(0, |u| u.value);
            *containers.entry(name).or_default() += layer;
        }
        (PodStorageUsage { volumes, containers }, inodes)
    }

    /// Each listed pod's nodefs usage, for the eviction manager's
    /// disk-pressure ranking (pods it cannot find are left out).
    pub async fn nodefs_usage(&self, uids: &[String]) -> HashMap<String, PodDiskUsage> {
        let pods: Vec<Pod> = self
            .pods
            .pods()
            .into_iter()
            .filter(|p| p.metadata.uid.as_ref().is_some_and(|u| uids.contains(u)))
            .collect();
        if pods.is_empty() {
            return HashMap::new();
        }
        let stats = self.runtime.list_container_stats(None).await.unwrap_or_default();
        let mut out = HashMap::new();
        for pod in pods {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let vols = self.volumes.usage_paths(&uid).await;
            let kinds: HashMap<String, VolumeKind> = vols.iter().map(|v| (v.name.clone(), v.kind)).collect();
            let (usage, inodes) = self.measure_with_inodes(&pod, &vols, &stats).await;
            out.insert(uid, PodDiskUsage { bytes: usage.ephemeral_bytes(&kinds), inodes });
        }
        out
    }

    /// Checks every period and soon after writes to watched emptyDirs.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut changes = self.volumes.subscribe();
        let mut writes = Writes::new().ok();
        let mut evicted = HashSet::new();
        loop {
            if let Some(w) = writes.as_mut() {
                for p in self.pods.pods().iter().filter(|p| has_limits(p)) {
                    for v in self.volumes.usage_paths(p.metadata.uid.as_deref().unwrap_or("")).await {
                        if v.kind == (VolumeKind::EmptyDir { memory: false }) {
                            w.watch_tree(&v.path);
                        }
                    }
                }
                w.watched.retain(|d| d.exists());
            }
            tokio::select! {
                _ = tick.tick() => {}
                _ = changes.changed() => {}
                _ = async {
                    match writes.as_mut() {
                        Some(w) => {
                            w.wait().await;
                            // Let a burst of writes land before measuring.
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        None => std::future::pending().await,
                    }
                } => {}
                _ = shutdown.cancelled() => break,
            }
            self.check(&mut evicted).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{EmptyDirVolumeSource, PodSpec, ResourceRequirements, Volume},
        apimachinery::pkg::api::resource::Quantity as Q,
    };

    use super::*;

    fn limit(c: &str, l: Option<&str>) -> Container {
        Container {
            name: c.into(),
            resources: l.map(|l| ResourceRequirements {
                limits: Some([("ephemeral-storage".to_string(), Q(l.into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(containers: Vec<Container>, volumes: Vec<Volume>) -> Pod {
        Pod { spec: Some(PodSpec { containers, volumes: Some(volumes), ..Default::default() }), ..Default::default() }
    }

    fn empty_dir(name: &str, size: Option<&str>, memory: bool) -> Volume {
        Volume {
            name: name.into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: memory.then(|| "Memory".into()),
                size_limit: size.map(|s| Q(s.into())),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    const MI: u64 = 1 << 20;

    #[test]
    fn the_kubelets_three_checks_in_its_order() {
        let kinds: HashMap<String, VolumeKind> = [
            ("scratch".to_string(), VolumeKind::EmptyDir { memory: false }),
            ("ram".to_string(), VolumeKind::EmptyDir { memory: true }),
        ]
        .into();
        let p = pod(
            vec![limit("a", Some("2Mi")), limit("b", Some("2Mi"))],
            vec![empty_dir("scratch", Some("1Mi"), false), empty_dir("ram", None, true)],
        );
        let usage = |scratch: u64, ram: u64, a: u64, b: u64| PodStorageUsage {
            volumes: [("scratch".to_string(), scratch), ("ram".to_string(), ram)].into(),
            containers: [("a".to_string(), a), ("b".to_string(), b)].into(),
        };
        assert_eq!(evaluate(&p, &kinds, &usage(MI / 2, 0, 0, 0)), None);
        assert_eq!(
            evaluate(&p, &kinds, &usage(2 * MI, 0, 3 * MI, 0)).as_deref(),
            Some("Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". "),
            "the emptyDir check comes first"
        );
        // Memory volumes do not count toward ephemeral storage.
        assert_eq!(evaluate(&p, &kinds, &usage(MI, 100 * MI, MI, MI)), None);
        assert_eq!(
            evaluate(&p, &kinds, &usage(MI, 0, 2 * MI, MI + 1)).as_deref(),
            Some("Pod ephemeral local storage usage exceeds the total limit of containers 4Mi. ")
        );
        assert_eq!(
            evaluate(&p, &kinds, &usage(0, 0, 2 * MI + 1, 0)).as_deref(),
            Some("Container a exceeded its local ephemeral storage limit \"2Mi\". ")
        );
        let unlimited = pod(vec![limit("a", None)], vec![empty_dir("scratch", None, false)]);
        assert!(!has_limits(&unlimited));
        assert_eq!(evaluate(&unlimited, &kinds, &usage(100 * MI, 0, 100 * MI, 0)), None);
        assert!(has_limits(&p));
    }

    #[test]
    fn pod_limit_is_the_sum_or_the_largest_init_container() {
        let mut p = pod(vec![limit("a", Some("1Mi")), limit("b", Some("1Mi")), limit("c", None)], vec![]);
        assert_eq!(pod_ephemeral_limit(&p).map(|q| q.value()), Some(2 * MI as i64));
        p.spec.as_mut().unwrap().init_containers = Some(vec![limit("i", Some("5Mi"))]);
        assert_eq!(pod_ephemeral_limit(&p).map(|q| q.value()), Some(5 * MI as i64));
        assert_eq!(pod_ephemeral_limit(&pod(vec![limit("a", None)], vec![])), None);
    }

    #[test]
    fn disk_usage_counts_blocks_once() {
        let d = tempfile::tempdir().unwrap();
        let base = disk_usage(d.path());
        fs::write(d.path().join("a"), vec![1u8; 256 << 10]).unwrap();
        fs::create_dir(d.path().join("sub")).unwrap();
        fs::write(d.path().join("sub/b"), vec![1u8; 256 << 10]).unwrap();
        fs::hard_link(d.path().join("a"), d.path().join("sub/a-again")).unwrap();
        let used = disk_usage(d.path()) - base;
        assert!((512 << 10..(512 << 10) + (64 << 10)).contains(&used), "{used}");
        assert_eq!(disk_usage(&d.path().join("missing")), 0);
    }
}
