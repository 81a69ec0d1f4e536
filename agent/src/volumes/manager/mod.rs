//! The volume manager: sets a pod's volumes up before its containers
//! start, keeps the API-backed ones (configMap, secret, projected with
//! service account tokens, downwardAPI) current, makes each container's
//! mounts (subPath included), and tears everything down once the pod is
//! gone, including what an agent killed mid-way left behind.
//!
//! Construct with [`VolumeManager::new`], call [`VolumeManager::start`]
//! once (it makes the root dir a shared mount, as the kubelet), give it
//! to the pod workers (`WorkerDeps::volumes`), and spawn
//! [`VolumeManager::run`] for the refresh loop and the orphan sweep.
//!
//! Layout (the kubelet's):
//!
//! ```text
//! <root>/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>    (tmpfs for medium: Memory)
//! <root>/pods/<uid>/volumes/kubernetes.io~configmap/<name>    (..data swaps)
//! <root>/pods/<uid>/volumes/kubernetes.io~secret/<name>       (tmpfs)
//! <root>/pods/<uid>/volumes/kubernetes.io~downward-api/<name>
//! <root>/pods/<uid>/volumes/kubernetes.io~projected/<name>    (tmpfs)
//! <root>/pods/<uid>/volume-subpaths/<volume>/<container>/<i>  (bind mounts)
//! ```
//!
//! hostPath volumes are the host path itself (checked, created for the
//! `OrCreate` types); nothing is made for them under the pod.
//!
//! Claims (`persistentVolumeClaim`, `ephemeral`) and inline `csi` volumes
//! are resolved through the API and set up by `persistent` (local volumes
//! under `kubernetes.io~local-volume`, CSI volumes as `volumes::csi`
//! lays them out); `storage` reports their stats, expands them online and
//! lists the attached ones in use.

mod containers;
mod kinds;
mod persistent;
mod refresh;
mod setup;
mod storage;
mod teardown;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, HashMap},
    fs,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;
use parking_lot::{Mutex, RwLock};
use tokio::sync::{Mutex as AsyncMutex, watch};
use tracing::{info, warn};

pub use self::kinds::{
    CONFIG_MAP, DOWNWARD_API, EMPTY_DIR, PROJECTED, SECRET, VolumeKind, kind_of, memory_volume_size,
    token_needs_refresh,
};
pub use self::storage::{ClaimStats, PERSISTENT_SYNC};

use super::downward::DownwardContext;
use super::{
    csi::CsiDrivers,
    mount,
    objects::{ObjectSource, Token, TokenSpec},
};
use crate::events::EventRecorder;

/// The event reason for volume set-up failures.
pub const FAILED_MOUNT: &str = "FailedMount";

#[derive(Clone, Debug)]
pub struct VolumeConfig {
    /// `<root-dir>/pods`.
    pub pods_dir: PathBuf,
    /// Node allocatable memory: the size of a memory-backed volume when
    /// neither the pod's limits nor the volume's sizeLimit are smaller.
    pub allocatable_memory: i64,
    /// For downwardAPI `resourceFieldRef` (limits that are not set read as
    /// node allocatable).
    pub downward: DownwardContext,
    /// How often API-backed volumes are re-read (the kubelet's
    /// syncFrequency).
    pub refresh_period: Duration,
    /// How often pod directories nobody owns are looked for.
    pub sweep_period: Duration,
    /// How often the usage of persistent volumes is read
    /// (volumeStatsAggPeriod; zero: never).
    pub stats_period: Duration,
    /// This node's name (VolumeAttachments, `vol_data.json`).
    pub node_name: String,
    /// This node's labels, for the node affinity of local volumes.
    pub node_labels: BTreeMap<String, String>,
}

/// A volume that could not be set up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("MountVolume.SetUp failed for volume \"{volume}\" : {message}")]
pub struct VolumeError {
    pub volume: String,
    pub message: String,
}

/// A set-up volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountedVolume {
    pub name: String,
    pub kind: VolumeKind,
    pub path: PathBuf,
    /// The last refresh error reported (not reported again until it changes).
    last_error: Option<String>,
    /// What a claim-backed or CSI volume came from.
    pub persistent: Option<PersistentInfo>,
}

impl MountedVolume {
    fn new(name: &str, kind: VolumeKind, path: PathBuf) -> MountedVolume {
        MountedVolume { name: name.to_owned(), kind, path, last_error: None, persistent: None }
    }

    fn persistent(name: &str, kind: VolumeKind, path: PathBuf, info: PersistentInfo) -> MountedVolume {
        MountedVolume { persistent: Some(info), ..MountedVolume::new(name, kind, path) }
    }

    /// A raw block device (`volumeMode: Block`), for `volumeDevices`.
    pub fn block(&self) -> bool {
        self.persistent.as_ref().is_some_and(|p| p.block)
    }
}

/// Where a claim-backed or CSI volume came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistentInfo {
    /// (namespace, name) of the claim.
    pub claim: Option<(String, String)>,
    pub pv: Option<String>,
    pub read_only: bool,
    pub block: bool,
    /// How the driver was asked (CSI volumes).
    pub csi: Option<crate::volumes::csi::mounter::CsiVolume>,
}

/// What the volume manager keeps for one pod.
struct PodState {
    pod: Pod,
    volumes: BTreeMap<String, MountedVolume>,
    tokens: HashMap<TokenSpec, Token>,
}

/// The claims' usage: when it was read (monotonic, and as a timestamp for
/// the summary), and what was read.
type ClaimStatsCache = (Option<std::time::Instant>, Option<k8s_openapi::jiff::Timestamp>, Vec<storage::ClaimStats>);

/// The pods that exist for the agent (the pod manager), for the orphan sweep.
pub trait PodsInUse: Send + Sync {
    /// Every pod source has delivered its pods at least once.
    fn sources_ready(&self) -> bool;
    /// The pod is known (running, terminating, or kept after finishing).
    fn in_use(&self, uid: &str) -> bool;
}

/// Disk use of one volume, for local storage limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeUsage {
    pub name: String,
    pub kind: VolumeKind,
    pub size_limit: Option<i64>,
    pub path: PathBuf,
}

pub struct VolumeManager {
    cfg: VolumeConfig,
    objects: RwLock<Arc<dyn ObjectSource>>,
    recorder: Arc<dyn EventRecorder>,
    pods: Mutex<HashMap<String, Arc<AsyncMutex<PodState>>>>,
    /// Bumped when a set of pods' volumes changes (for watchers such as
    /// the local storage monitor).
    generation: watch::Sender<u64>,
    /// storage_operation_* (set once by the composition root).
    metrics: std::sync::OnceLock<crate::metrics::storage::StorageMetrics>,
    /// The CSI drivers registered on this node (the plugin watcher's).
    csi: RwLock<Arc<CsiDrivers>>,
    /// CSI stage, publish and their undoing, one at a time: whether a
    /// volume is unstaged depends on the other pods' directories.
    csi_lock: AsyncMutex<()>,
    /// The attachable volumes in use (node.status.volumesInUse).
    in_use: watch::Sender<Vec<String>>,
    /// The claims' usage as last read, and when.
    claim_stats: Mutex<ClaimStatsCache>,
}

fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

fn namespace_of(pod: &Pod) -> String {
    pod.metadata.namespace.clone().unwrap_or_else(|| "default".into())
}

impl VolumeManager {
    pub fn new(cfg: VolumeConfig, objects: Arc<dyn ObjectSource>, recorder: Arc<dyn EventRecorder>) -> VolumeManager {
        VolumeManager {
            cfg,
            objects: RwLock::new(objects),
            recorder,
            pods: Mutex::new(HashMap::new()),
            generation: watch::channel(0).0,
            metrics: std::sync::OnceLock::new(),
            csi: RwLock::new(Arc::new(CsiDrivers::default())),
            csi_lock: AsyncMutex::new(()),
            in_use: watch::channel(vec![]).0,
            claim_stats: Mutex::new((None, None, vec![])),
        }
    }

    /// The registered CSI drivers (the plugin watcher fills them).
    pub fn set_csi_drivers(&self, drivers: Arc<CsiDrivers>) {
        *self.csi.write() = drivers;
    }

    pub fn csi_drivers(&self) -> Arc<CsiDrivers> {
        self.csi.read().clone()
    }

    /// The kubelet's root dir (the pods dir's parent).
    pub fn root_dir(&self) -> PathBuf {
        self.cfg.pods_dir.parent().map(Path::to_path_buf).unwrap_or_default()
    }

    /// Times every volume set-up and tear-down from now on in `metrics`
    /// (storage_operation_duration_seconds, storage_operation_errors_total).
    pub fn set_metrics(&self, metrics: crate::metrics::storage::StorageMetrics) {
        let _ = self.metrics.set(metrics);
    }

    fn observe(&self, kind: VolumeKind, op: crate::metrics::storage::VolumeOperation, took: Duration, failed: bool) {
        if let Some(m) = self.metrics.get() {
            m.observe(kind.plugin_name(), op, took, failed);
        }
    }

    /// The plugin of every volume set up now, one entry per volume
    /// (volume_manager_total_volumes' actual state). A pod whose volumes
    /// are being set up at this moment is left out rather than waited for.
    pub fn mounted_plugins(&self) -> Vec<&'static str> {
        let states: Vec<_> = self.pods.lock().values().cloned().collect();
        states
            .iter()
            .filter_map(|s| {
                s.try_lock().ok().map(|st| st.volumes.values().map(|m| m.kind.plugin_name()).collect::<Vec<_>>())
            })
            .flatten()
            .collect()
    }

    /// Makes the root dir (the parent of the pods dir) a shared mount so
    /// tmpfs volumes reach containers that mount with HostToContainer
    /// propagation, as the kubelet's `MakeRShared(rootDir)`.
    pub fn start(&self) {
        let Some(root) = self.cfg.pods_dir.parent() else { return };
        if let Err(e) = fs::create_dir_all(&self.cfg.pods_dir) {
            warn!("cannot create {}: {e}", self.cfg.pods_dir.display());
            return;
        }
        match mount::ensure_shared(root) {
            Ok(true) => info!(root = %root.display(), "made the root dir a shared mount"),
            Ok(false) => {}
            Err(e) => warn!(
                root = %root.display(),
                "cannot make the root dir a shared mount (HostToContainer propagation of pod volumes will fail): {e}"
            ),
        }
    }

    /// Where ConfigMaps, Secrets and tokens come from (the API server's
    /// client once it is connected).
    pub fn set_objects(&self, objects: Arc<dyn ObjectSource>) {
        *self.objects.write() = objects;
    }

    pub fn objects(&self) -> Arc<dyn ObjectSource> {
        self.objects.read().clone()
    }

    pub fn pods_dir(&self) -> &Path {
        &self.cfg.pods_dir
    }

    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.cfg.pods_dir.join(uid)
    }

    pub(super) fn volume_dir(&self, uid: &str, kind: VolumeKind, name: &str) -> Option<PathBuf> {
        kind.plugin_dir().map(|p| self.pod_dir(uid).join("volumes").join(p).join(name))
    }

    /// Changes whenever pods' volumes are set up or torn down.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    fn state(&self, uid: &str) -> Option<Arc<AsyncMutex<PodState>>> {
        self.pods.lock().get(uid).cloned()
    }

    /// The pods whose volumes are set up.
    pub fn pods(&self) -> Vec<String> {
        self.pods.lock().keys().cloned().collect()
    }
}

/// Pull secrets for the image credentials come from the same object source
/// the secret volumes read (the API server's, or none for static pods).
#[async_trait::async_trait]
impl crate::images::credentials::SecretSource for VolumeManager {
    async fn secret(&self, namespace: &str, name: &str) -> Result<k8s_openapi::api::core::v1::Secret, String> {
        self.objects().get_secret(namespace, name).await.map_err(|e| e.to_string())
    }
}
