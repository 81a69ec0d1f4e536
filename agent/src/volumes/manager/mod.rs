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

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, RwLock},
    time::{Duration, SystemTime},
};

use k8s_openapi::api::core::v1::{Container, Pod, Volume};
use tokio::sync::{Mutex as AsyncMutex, watch};
use tracing::{debug, info, warn};

use super::{
    atomic, hostpath, mount,
    mounts::{self, VolumePath},
    objects::{EnvObjects, ObjectError, ObjectKey, ObjectKind, ObjectSource, Token, TokenSpec},
    payload::{self, DEFAULT_MODE, Payload},
    subpath,
};
use crate::{
    cm::hierarchy::pod_limits,
    cri::{RuntimeService, api, labels},
    events::{EventRecorder, EventType, pod_ref},
    pods::env::DownwardContext,
};

/// The event reason for volume set-up failures.
pub const FAILED_MOUNT: &str = "FailedMount";

/// The kubelet's plugin directory names.
pub const EMPTY_DIR: &str = "kubernetes.io~empty-dir";
pub const CONFIG_MAP: &str = "kubernetes.io~configmap";
pub const SECRET: &str = "kubernetes.io~secret";
pub const DOWNWARD_API: &str = "kubernetes.io~downward-api";
pub const PROJECTED: &str = "kubernetes.io~projected";

/// A service account token's default lifetime (the API's
/// expirationSeconds default).
const DEFAULT_TOKEN_SECONDS: i64 = 3600;
/// The kubelet refreshes tokens older than a day whatever their lifetime.
const TOKEN_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

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
}

/// A volume that could not be set up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("MountVolume.SetUp failed for volume \"{volume}\" : {message}")]
pub struct VolumeError {
    pub volume: String,
    pub message: String,
}

/// What kind of volume, for set-up, refresh and accounting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeKind {
    HostPath,
    EmptyDir { memory: bool },
    ConfigMap,
    Secret,
    DownwardApi,
    Projected,
}

impl VolumeKind {
    fn plugin_dir(self) -> Option<&'static str> {
        match self {
            VolumeKind::HostPath => None,
            VolumeKind::EmptyDir { .. } => Some(EMPTY_DIR),
            VolumeKind::ConfigMap => Some(CONFIG_MAP),
            VolumeKind::Secret => Some(SECRET),
            VolumeKind::DownwardApi => Some(DOWNWARD_API),
            VolumeKind::Projected => Some(PROJECTED),
        }
    }

    /// Written from objects or the pod, so refreshed.
    fn refreshed(self) -> bool {
        matches!(self, VolumeKind::ConfigMap | VolumeKind::Secret | VolumeKind::DownwardApi | VolumeKind::Projected)
    }

    /// On a tmpfs of its own.
    fn tmpfs(self) -> bool {
        matches!(self, VolumeKind::EmptyDir { memory: true } | VolumeKind::Secret | VolumeKind::Projected)
    }

    /// The kubelet's plugin name for this kind (volume metrics' label).
    pub fn plugin_name(self) -> &'static str {
        match self {
            VolumeKind::HostPath => "kubernetes.io/host-path",
            VolumeKind::EmptyDir { .. } => "kubernetes.io/empty-dir",
            VolumeKind::ConfigMap => "kubernetes.io/configmap",
            VolumeKind::Secret => "kubernetes.io/secret",
            VolumeKind::DownwardApi => "kubernetes.io/downward-api",
            VolumeKind::Projected => "kubernetes.io/projected",
        }
    }

    /// Counts toward the pod's ephemeral storage (the kubelet's
    /// `localEphemeralVolumeNames`: disk emptyDir, configMap, downwardAPI).
    pub fn counts_as_ephemeral_storage(self) -> bool {
        matches!(self, VolumeKind::EmptyDir { memory: false } | VolumeKind::ConfigMap | VolumeKind::DownwardApi)
    }
}

/// The kind of a volume, or why this node cannot mount it.
pub fn kind_of(v: &Volume) -> Result<VolumeKind, String> {
    if v.host_path.is_some() {
        return Ok(VolumeKind::HostPath);
    }
    if let Some(e) = &v.empty_dir {
        return match e.medium.as_deref().unwrap_or("") {
            "" => Ok(VolumeKind::EmptyDir { memory: false }),
            "Memory" => Ok(VolumeKind::EmptyDir { memory: true }),
            other => Err(format!("emptyDir medium {other:?} is not supported by this node")),
        };
    }
    if v.config_map.is_some() {
        return Ok(VolumeKind::ConfigMap);
    }
    if v.secret.is_some() {
        return Ok(VolumeKind::Secret);
    }
    if v.downward_api.is_some() {
        return Ok(VolumeKind::DownwardApi);
    }
    if v.projected.is_some() {
        return Ok(VolumeKind::Projected);
    }
    let json = serde_json::to_value(v).unwrap_or_default();
    let source =
        json.as_object().and_then(|o| o.keys().find(|k| *k != "name").cloned()).unwrap_or_else(|| "none".into());
    Err(format!("volume type {source} is not supported by this node"))
}

/// The size of a memory-backed volume, as the kubelet's
/// `calculateEmptyDirMemorySize`: node allocatable, or the pod's memory
/// limit if it has one, or the volume's sizeLimit if smaller still.
pub fn memory_volume_size(pod: &Pod, size_limit: Option<i64>, allocatable: i64) -> u64 {
    let mut size = allocatable;
    if let Some(spec) = &pod.spec {
        let limit = pod_limits(spec).1;
        if limit > 0 {
            size = limit;
        }
    }
    if let Some(l) = size_limit.filter(|l| *l > 0 && *l < size) {
        size = l;
    }
    size.max(0) as u64
}

/// Whether a token must be requested again (the kubelet's token manager):
/// past 80% of its lifetime, or older than a day.
pub fn token_needs_refresh(token: &Token, ttl: Duration, now: SystemTime) -> bool {
    let issued = token.expires_at.checked_sub(ttl).unwrap_or(token.expires_at);
    if now >= issued + TOKEN_MAX_AGE {
        return true;
    }
    now + ttl / 5 >= token.expires_at
}

fn quantity_bytes(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> Option<i64> {
    q.and_then(|q| q.0.parse::<crate::quantity::Quantity>().ok()).map(|q| q.value())
}

/// A set-up volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountedVolume {
    pub name: String,
    pub kind: VolumeKind,
    pub path: PathBuf,
    /// The last refresh error reported (not reported again until it changes).
    last_error: Option<String>,
}

/// What the volume manager keeps for one pod.
struct PodState {
    pod: Pod,
    volumes: BTreeMap<String, MountedVolume>,
    tokens: HashMap<TokenSpec, Token>,
}

/// The pods that exist for the agent (the pod manager), for the orphan sweep.
pub trait PodsInUse: Send + Sync {
    /// Every pod source has delivered its pods at least once.
    fn sources_ready(&self) -> bool;
    /// The pod is known (running, terminating, or kept after finishing).
    fn in_use(&self, uid: &str) -> bool;
}

impl PodsInUse for crate::pods::manager::PodManager {
    fn sources_ready(&self) -> bool {
        crate::gc::ActivePods::all_sources_ready(self)
    }

    fn in_use(&self, uid: &str) -> bool {
        self.knows(uid)
    }
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
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
        }
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
        let states: Vec<_> = lock(&self.pods).values().cloned().collect();
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
        *self.objects.write().unwrap_or_else(|p| p.into_inner()) = objects;
    }

    pub fn objects(&self) -> Arc<dyn ObjectSource> {
        self.objects.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn pods_dir(&self) -> &Path {
        &self.cfg.pods_dir
    }

    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.cfg.pods_dir.join(uid)
    }

    fn volume_dir(&self, uid: &str, kind: VolumeKind, name: &str) -> Option<PathBuf> {
        kind.plugin_dir().map(|p| self.pod_dir(uid).join("volumes").join(p).join(name))
    }

    /// Changes whenever pods' volumes are set up or torn down.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    fn state(&self, uid: &str) -> Option<Arc<AsyncMutex<PodState>>> {
        lock(&self.pods).get(uid).cloned()
    }

    /// The pods whose volumes are set up.
    pub fn pods(&self) -> Vec<String> {
        lock(&self.pods).keys().cloned().collect()
    }

    /// Sets up every volume of `pod` not set up yet; idempotent, so it is
    /// called before each start of a container. Volumes set up before stay
    /// as they are (their refresh is the refresh loop's); a newer version
    /// of the pod updates downwardAPI files. Errors name the first volume
    /// that could not be set up; the others are still set up.
    pub async fn setup(&self, pod: &Pod) -> Result<(), VolumeError> {
        let uid = uid_of(pod);
        let state = {
            let mut pods = lock(&self.pods);
            pods.entry(uid.clone())
                .or_insert_with(|| {
                    Arc::new(AsyncMutex::new(PodState {
                        pod: pod.clone(),
                        volumes: BTreeMap::new(),
                        tokens: HashMap::new(),
                    }))
                })
                .clone()
        };
        let mut st = state.lock().await;
        let labels_changed =
            st.pod.metadata.labels != pod.metadata.labels || st.pod.metadata.annotations != pod.metadata.annotations;
        st.pod = pod.clone();
        let mut first_error = None;
        let mut added = false;
        for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            if st.volumes.contains_key(&v.name) {
                continue;
            }
            let started = std::time::Instant::now();
            let result = self.setup_volume(&mut st, v).await;
            if let Ok(kind) = kind_of(v) {
                self.observe(kind, crate::metrics::storage::VolumeOperation::Mount, started.elapsed(), result.is_err());
            }
            match result {
                Ok(m) => {
                    debug!(uid, volume = v.name, "volume set up");
                    st.volumes.insert(v.name.clone(), m);
                    added = true;
                }
                Err(message) => {
                    first_error.get_or_insert(VolumeError { volume: v.name.clone(), message });
                }
            }
        }
        if labels_changed {
            self.refresh_state(&mut st, |k| matches!(k, VolumeKind::DownwardApi | VolumeKind::Projected), None).await;
        }
        drop(st);
        if added {
            self.generation.send_modify(|g| *g += 1);
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn setup_volume(&self, st: &mut PodState, v: &Volume) -> Result<MountedVolume, String> {
        let kind = kind_of(v)?;
        let uid = uid_of(&st.pod);
        if let Some(h) = &v.host_path {
            let path = h.path.clone();
            let ty = h.type_.clone();
            tokio::task::spawn_blocking(move || hostpath::prepare(&path, ty.as_deref()))
                .await
                .map_err(|e| e.to_string())??;
            return Ok(MountedVolume { name: v.name.clone(), kind, path: h.path.clone().into(), last_error: None });
        }
        let dir = self.volume_dir(&uid, kind, &v.name).expect("every kind but hostPath has a directory");
        fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let mut mounted_here = false;
        if kind.tmpfs() {
            let table = mount::mount_table().map_err(|e| format!("reading the mount table: {e}"))?;
            if !mount::is_mount_point(&table, &dir) {
                let limit = v.empty_dir.as_ref().and_then(|e| quantity_bytes(e.size_limit.as_ref()));
                let size = memory_volume_size(&st.pod, limit, self.cfg.allocatable_memory);
                // Secrets and projections are read-only in containers: 0755
                // is enough; emptyDir is 0777, as the kubelet's.
                let mode = if matches!(kind, VolumeKind::EmptyDir { .. }) { 0o777 } else { 0o755 };
                mount::mount_tmpfs(&dir, (size > 0).then_some(size), mode)
                    .map_err(|e| format!("mounting a tmpfs at {}: {e}", dir.display()))?;
                mounted_here = true;
            }
        } else if matches!(kind, VolumeKind::EmptyDir { .. }) {
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).map_err(|e| e.to_string())?;
        }
        let mut m = MountedVolume { name: v.name.clone(), kind, path: dir.clone(), last_error: None };
        if kind.refreshed() {
            let written = match self.payload(st, v).await {
                Ok(p) => {
                    let d = dir.clone();
                    tokio::task::spawn_blocking(move || atomic::write(&d, &p))
                        .await
                        .map_err(|e| e.to_string())?
                        .map_err(|e| format!("writing the volume's files: {e}"))
                }
                Err(e) => Err(e),
            };
            if let Err(e) = written {
                // As the kubelet: a volume that failed is not left mounted.
                if mounted_here {
                    let _ = mount::unmount(&dir);
                }
                return Err(e);
            }
            m.last_error = None;
        }
        apply_fs_group(&st.pod, &m).await?;
        Ok(m)
    }

    /// The files a configMap/secret/downwardAPI/projected volume shows now.
    async fn payload(&self, st: &mut PodState, v: &Volume) -> Result<Payload, String> {
        let objects = self.objects();
        let ns = namespace_of(&st.pod);
        let fetch_cm = |name: String| {
            let objects = objects.clone();
            let ns = ns.clone();
            async move { objects.get_config_map(&ns, &name).await }
        };
        let fetch_secret = |name: String| {
            let objects = objects.clone();
            let ns = ns.clone();
            async move { objects.get_secret(&ns, &name).await }
        };
        if let Some(c) = &v.config_map {
            let mode = c.default_mode.map_or(DEFAULT_MODE, |m| m as u32 & 0o7777);
            let optional = c.optional.unwrap_or(false);
            return match fetch_cm(c.name.clone()).await {
                Ok(cm) => payload::config_map_files(&cm, c.items.as_deref(), mode, optional),
                Err(e) if e.is_not_found() && optional => Ok(Payload::new()),
                Err(e) => Err(e.to_string()),
            };
        }
        if let Some(s) = &v.secret {
            let mode = s.default_mode.map_or(DEFAULT_MODE, |m| m as u32 & 0o7777);
            let optional = s.optional.unwrap_or(false);
            let name = s.secret_name.clone().unwrap_or_default();
            return match fetch_secret(name).await {
                Ok(secret) => payload::secret_files(&secret, s.items.as_deref(), mode, optional),
                Err(e) if e.is_not_found() && optional => Ok(Payload::new()),
                Err(e) => Err(e.to_string()),
            };
        }
        if let Some(d) = &v.downward_api {
            let mode = d.default_mode.map_or(DEFAULT_MODE, |m| m as u32 & 0o7777);
            return payload::downward_files(&st.pod, d.items.as_deref().unwrap_or(&[]), mode, &self.cfg.downward);
        }
        if let Some(p) = &v.projected {
            let mode = p.default_mode.map_or(DEFAULT_MODE, |m| m as u32 & 0o7777);
            let mut out = Payload::new();
            for source in p.sources.iter().flatten() {
                if let Some(c) = &source.config_map {
                    let optional = c.optional.unwrap_or(false);
                    match fetch_cm(c.name.clone()).await {
                        Ok(cm) => payload::merge(
                            &mut out,
                            payload::config_map_files(&cm, c.items.as_deref(), mode, optional)?,
                        ),
                        Err(e) if e.is_not_found() && optional => {}
                        Err(e) => return Err(e.to_string()),
                    }
                } else if let Some(s) = &source.secret {
                    let optional = s.optional.unwrap_or(false);
                    match fetch_secret(s.name.clone()).await {
                        Ok(secret) => payload::merge(
                            &mut out,
                            payload::secret_files(&secret, s.items.as_deref(), mode, optional)?,
                        ),
                        Err(e) if e.is_not_found() && optional => {}
                        Err(e) => return Err(e.to_string()),
                    }
                } else if let Some(d) = &source.downward_api {
                    let files =
                        payload::downward_files(&st.pod, d.items.as_deref().unwrap_or(&[]), mode, &self.cfg.downward)?;
                    payload::merge(&mut out, files);
                } else if let Some(t) = &source.service_account_token {
                    let spec = TokenSpec {
                        namespace: ns.clone(),
                        service_account: st
                            .pod
                            .spec
                            .as_ref()
                            .and_then(|s| s.service_account_name.clone())
                            .filter(|s| !s.is_empty())
                            .unwrap_or_else(|| "default".into()),
                        audiences: t.audience.iter().filter(|a| !a.is_empty()).cloned().collect(),
                        expiration_seconds: t.expiration_seconds.unwrap_or(DEFAULT_TOKEN_SECONDS),
                        pod_name: st.pod.metadata.name.clone().unwrap_or_default(),
                        pod_uid: uid_of(&st.pod),
                    };
                    let ttl = Duration::from_secs(spec.expiration_seconds.max(0) as u64);
                    let cached = st.tokens.get(&spec).filter(|t| !token_needs_refresh(t, ttl, SystemTime::now()));
                    let token = match cached {
                        Some(t) => t.clone(),
                        None => {
                            let t = objects.request_token(&spec).await.map_err(|e| match e {
                                ObjectError::Unavailable(m) => m,
                                other => format!("failed to fetch token: {other}"),
                            })?;
                            st.tokens.insert(spec.clone(), t.clone());
                            t
                        }
                    };
                    out.insert(t.path.clone(), payload::FileProjection { data: token.token.into_bytes(), mode });
                } else if source.cluster_trust_bundle.is_some() {
                    return Err("clusterTrustBundle projections are not supported by this node".into());
                }
            }
            return Ok(out);
        }
        Ok(Payload::new())
    }

    /// Rewrites the volumes of one pod whose kind matches; `key`, when
    /// given, limits it to volumes that show that object.
    async fn refresh_state(&self, st: &mut PodState, which: impl Fn(VolumeKind) -> bool, key: Option<&ObjectKey>) {
        let volumes: Vec<Volume> = st.pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()).cloned().collect();
        for v in volumes {
            let Some(m) = st.volumes.get(&v.name).cloned() else { continue };
            if !m.kind.refreshed() || !which(m.kind) || key.is_some_and(|k| !shows(&v, k)) {
                continue;
            }
            let result = match self.payload(st, &v).await {
                Ok(p) => {
                    let dir = m.path.clone();
                    match tokio::task::spawn_blocking(move || atomic::write(&dir, &p)).await {
                        Ok(Ok(changed)) => Ok(changed),
                        Ok(Err(e)) => Err(format!("writing the volume's files: {e}")),
                        Err(e) => Err(e.to_string()),
                    }
                }
                Err(e) => Err(e),
            };
            // New files get the pod's fsGroup too.
            let result = match result {
                Ok(true) => apply_fs_group(&st.pod, &m).await.map(|()| true),
                other => other,
            };
            let entry = st.volumes.get_mut(&v.name).expect("listed above");
            match result {
                Ok(changed) => {
                    if changed {
                        debug!(pod = st.pod.metadata.name.as_deref().unwrap_or(""), volume = v.name, "volume updated");
                    }
                    entry.last_error = None;
                }
                Err(e) => {
                    // The files stay as they were; report once per distinct error.
                    if entry.last_error.as_deref() != Some(e.as_str()) {
                        let err = VolumeError { volume: v.name.clone(), message: e.clone() };
                        self.recorder.record(&pod_ref(&st.pod), EventType::Warning, FAILED_MOUNT, &err.to_string());
                        entry.last_error = Some(e);
                    }
                }
            }
        }
    }

    /// Re-reads every API-backed volume of every pod (or only those that
    /// show `key`).
    pub async fn refresh(&self, key: Option<&ObjectKey>) {
        let states: Vec<_> = lock(&self.pods).values().cloned().collect();
        for s in states {
            let mut st = s.lock().await;
            self.refresh_state(&mut st, |k| !matches!(k, VolumeKind::DownwardApi), key).await;
        }
    }

    /// When the next service account token needs refreshing.
    async fn next_token_refresh(&self) -> Option<SystemTime> {
        let states: Vec<_> = lock(&self.pods).values().cloned().collect();
        let mut next: Option<SystemTime> = None;
        for s in states {
            let st = s.lock().await;
            for (spec, t) in &st.tokens {
                let ttl = Duration::from_secs(spec.expiration_seconds.max(0) as u64);
                let at = t.expires_at.checked_sub(ttl / 5).unwrap_or(t.expires_at);
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        next
    }

    /// The container's mounts for the runtime: its volumeMounts, with
    /// subPath bind mounts made. The pod's volumes must be set up.
    pub async fn container_mounts(
        &self,
        pod: &Pod,
        c: &Container,
        env: &[(String, String)],
    ) -> Result<Vec<api::Mount>, String> {
        if c.volume_mounts.as_ref().is_none_or(|m| m.is_empty()) {
            return Ok(vec![]);
        }
        let uid = uid_of(pod);
        let Some(state) = self.state(&uid) else {
            return Err("the pod's volumes are not set up".into());
        };
        let volumes: BTreeMap<String, VolumePath> = {
            let st = state.lock().await;
            st.volumes
                .values()
                .map(|m| {
                    let read_only = matches!(
                        m.kind,
                        VolumeKind::ConfigMap | VolumeKind::Secret | VolumeKind::DownwardApi | VolumeKind::Projected
                    );
                    (m.name.clone(), VolumePath { path: m.path.clone(), read_only })
                })
                .collect()
        };
        let planned = mounts::plan(c, &volumes, env)?;
        let mut out = vec![];
        for p in planned {
            let host = match &p.sub_path {
                None => p.volume_path.clone(),
                Some(sub) => {
                    let target = self
                        .pod_dir(&uid)
                        .join("volume-subpaths")
                        .join(&p.volume)
                        .join(&c.name)
                        .join(p.index.to_string());
                    let (root, sub) = (p.volume_path.clone(), sub.clone());
                    tokio::task::spawn_blocking(move || subpath::prepare(&root, &sub, &target))
                        .await
                        .map_err(|e| e.to_string())?
                        .map_err(|e| {
                            format!(
                                "failed to prepare subPath for volumeMount {:?} of container {:?}: {e}",
                                p.volume, c.name
                            )
                        })?
                }
            };
            out.push(mounts::cri_mount(&p, &host));
        }
        Ok(out)
    }

    /// What a container's environment refers to, from the object source.
    pub async fn env_objects(&self, pod: &Pod, c: &Container) -> EnvObjects {
        EnvObjects::fetch(self.objects().as_ref(), pod, c).await
    }

    /// The volumes of a pod with their paths, for disk accounting.
    pub async fn usage_paths(&self, uid: &str) -> Vec<VolumeUsage> {
        let Some(state) = self.state(uid) else { return vec![] };
        let st = state.lock().await;
        let limits: HashMap<&str, Option<i64>> = st
            .pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .map(|v| (v.name.as_str(), v.empty_dir.as_ref().and_then(|e| quantity_bytes(e.size_limit.as_ref()))))
            .collect();
        st.volumes
            .values()
            .map(|m| VolumeUsage {
                name: m.name.clone(),
                kind: m.kind,
                size_limit: limits.get(m.name.as_str()).copied().flatten(),
                path: m.path.clone(),
            })
            .collect()
    }

    /// Unmounts everything the pod has under its directory (tmpfs volumes,
    /// subPath bind mounts) and removes its volume directories. Fails,
    /// leaving the directories, if something stays mounted.
    pub async fn teardown(&self, uid: &str) -> Result<(), String> {
        let state = lock(&self.pods).remove(uid);
        // Wait for a set-up or refresh in progress to finish.
        let mut kinds = vec![];
        if let Some(s) = &state {
            kinds = s.lock().await.volumes.values().map(|m| m.kind).collect();
        }
        let dir = self.pod_dir(uid);
        let started = std::time::Instant::now();
        let result = tokio::task::spawn_blocking(move || teardown_dir(&dir)).await.map_err(|e| e.to_string())?;
        // The pod's volumes go together: each is timed with the whole tear-down.
        for kind in kinds {
            self.observe(kind, crate::metrics::storage::VolumeOperation::Unmount, started.elapsed(), result.is_err());
        }
        if state.is_some() {
            self.generation.send_modify(|g| *g += 1);
        }
        result
    }

    /// [`VolumeManager::teardown`], then removes the whole pod directory.
    pub async fn remove_pod_dir(&self, uid: &str) -> Result<(), String> {
        self.teardown(uid).await?;
        let dir = self.pod_dir(uid);
        tokio::task::spawn_blocking(move || {
            let left = mount::mounts_under(&mount::mount_table().map_err(|e| e.to_string())?, &dir);
            if !left.is_empty() {
                return Err(format!("still mounted: {left:?}"));
            }
            match fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(format!("removing {}: {e}", dir.display())),
                _ => Ok(()),
            }
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// Removes the directories of pods nobody owns any more: not known to
    /// the pod manager and with nothing in the runtime (an agent killed
    /// while it cleaned up, a pod removed while the agent was down).
    pub async fn sweep(&self, in_use: &dyn PodsInUse, runtime: &dyn RuntimeService) -> Vec<String> {
        if !in_use.sources_ready() {
            return vec![];
        }
        let Ok(entries) = fs::read_dir(&self.cfg.pods_dir) else { return vec![] };
        let candidates: Vec<String> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            // Only names a pod uid can have: a podLogsDir pointed at the
            // same directory (`<ns>_<name>_<uid>`) must never be swept.
            .filter(|uid| !uid.contains('_'))
            .filter(|uid| !in_use.in_use(uid) && !lock(&self.pods).contains_key(uid))
            .collect();
        if candidates.is_empty() {
            return vec![];
        }
        let Ok(sandboxes) = runtime
            .list_pod_sandbox(Some(api::PodSandboxFilter {
                label_selector: labels::managed_selector(),
                ..Default::default()
            }))
            .await
        else {
            return vec![];
        };
        let in_runtime: BTreeSet<String> =
            sandboxes.iter().filter_map(|s| labels::identity(&s.labels)).map(|id| id.uid).collect();
        let mut removed = vec![];
        for uid in candidates.into_iter().filter(|u| !in_runtime.contains(u)) {
            // Known now? (a pod added since the listing)
            if in_use.in_use(&uid) {
                continue;
            }
            match self.remove_pod_dir(&uid).await {
                Ok(()) => {
                    info!(uid, "removed the directory of an orphaned pod");
                    removed.push(uid);
                }
                Err(e) => warn!(uid, "cannot clean up an orphaned pod's directory: {e}"),
            }
        }
        removed
    }

    /// Refreshes API-backed volumes every refresh period, when the object
    /// source reports a change, and before tokens expire; sweeps orphaned
    /// pod directories. Runs until shutdown.
    pub async fn run(
        self: Arc<Self>,
        in_use: Arc<dyn PodsInUse>,
        runtime: Arc<dyn RuntimeService>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut changes = self.objects().subscribe();
        let mut refresh = tokio::time::interval(self.cfg.refresh_period);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sweep = tokio::time::interval(self.cfg.sweep_period);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let token_due = self
                .next_token_refresh()
                .await
                .map(|at| tokio::time::Instant::now() + at.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO));
            tokio::select! {
                _ = refresh.tick() => self.refresh(None).await,
                _ = sweep.tick() => {
                    self.sweep(in_use.as_ref(), runtime.as_ref()).await;
                }
                key = async {
                    match changes.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                } => match key {
                    Ok(k) => self.refresh(Some(&k)).await,
                    // Missed some: refresh everything.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => self.refresh(None).await,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => changes = None,
                },
                _ = async {
                    match token_due {
                        Some(t) => tokio::time::sleep_until(t).await,
                        None => std::future::pending().await,
                    }
                } => self.refresh(None).await,
                _ = shutdown.changed() => if *shutdown.borrow() { break },
            }
        }
    }
}

/// Whether a volume shows `key`'s object.
/// Gives a volume to the pod's fsGroup (not hostPath volumes, as the
/// kubelet); API-backed volumes are read-only in containers.
async fn apply_fs_group(pod: &Pod, m: &MountedVolume) -> Result<(), String> {
    let Some(gid) = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()).and_then(|s| s.fs_group) else {
        return Ok(());
    };
    if m.kind == VolumeKind::HostPath {
        return Ok(());
    }
    let (dir, read_only) = (m.path.clone(), m.kind.refreshed());
    let gid = u32::try_from(gid).map_err(|_| format!("fsGroup {gid} is not a group id"))?;
    tokio::task::spawn_blocking(move || super::ownership::set_ownership(&dir, gid, read_only, None))
        .await
        .map_err(|e| e.to_string())?
        .map(drop)
        .map_err(|e| format!("setting the volume's group to fsGroup {gid}: {e}"))
}

fn shows(v: &Volume, key: &ObjectKey) -> bool {
    let cm = |n: &str| key.kind == ObjectKind::ConfigMap && key.name == n;
    let secret = |n: &str| key.kind == ObjectKind::Secret && key.name == n;
    if let Some(c) = &v.config_map {
        return cm(&c.name);
    }
    if let Some(s) = &v.secret {
        return secret(s.secret_name.as_deref().unwrap_or(""));
    }
    if let Some(p) = &v.projected {
        return p.sources.iter().flatten().any(|s| {
            s.config_map.as_ref().is_some_and(|c| cm(&c.name)) || s.secret.as_ref().is_some_and(|x| secret(&x.name))
        });
    }
    false
}

/// Unmounts everything under `<pod dir>` and removes its `volumes` and
/// `volume-subpaths` directories.
fn teardown_dir(pod_dir: &Path) -> Result<(), String> {
    if !pod_dir.exists() {
        return Ok(());
    }
    let left = mount::unmount_all_under(pod_dir).map_err(|e| format!("reading the mount table: {e}"))?;
    if !left.is_empty() {
        return Err(format!("still mounted after unmounting: {left:?}"));
    }
    for sub in ["volumes", "volume-subpaths"] {
        match fs::remove_dir_all(pod_dir.join(sub)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!("removing {}: {e}", pod_dir.join(sub).display()));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{
            ConfigMap, ConfigMapProjection, ConfigMapVolumeSource, Container as C, DownwardAPIVolumeFile,
            DownwardAPIVolumeSource, EmptyDirVolumeSource, HostPathVolumeSource, KeyToPath, ObjectFieldSelector,
            PersistentVolumeClaimVolumeSource, PodSpec, ProjectedVolumeSource, ResourceRequirements,
            ServiceAccountTokenProjection, VolumeMount, VolumeProjection,
        },
        apimachinery::pkg::api::resource::Quantity as Q,
    };

    use super::*;
    use crate::volumes::objects::MemoryObjects;

    #[derive(Default)]
    struct Events(Mutex<Vec<(String, String)>>);

    impl EventRecorder for Events {
        fn record(&self, _: &k8s_openapi::api::core::v1::ObjectReference, _: EventType, reason: &str, message: &str) {
            lock(&self.0).push((reason.into(), message.into()));
        }
    }

    fn manager(dir: &Path, objects: Arc<dyn ObjectSource>) -> (Arc<VolumeManager>, Arc<Events>) {
        let events = Arc::new(Events::default());
        let cfg = VolumeConfig {
            pods_dir: dir.join("pods"),
            allocatable_memory: 1 << 30,
            downward: DownwardContext::default(),
            refresh_period: Duration::from_secs(60),
            sweep_period: Duration::from_secs(60),
        };
        (Arc::new(VolumeManager::new(cfg, objects, events.clone())), events)
    }

    fn pod(volumes: Vec<Volume>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("web".into());
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some("uid-1".into());
        p.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
        p.spec = Some(PodSpec { volumes: Some(volumes), containers: vec![C::default()], ..Default::default() });
        p
    }

    fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.namespace = Some("ns".into());
        cm.metadata.name = Some(name.into());
        cm.data = Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        cm
    }

    fn cm_volume(name: &str, cm: &str, optional: Option<bool>) -> Volume {
        Volume {
            name: name.into(),
            config_map: Some(ConfigMapVolumeSource { name: cm.into(), optional, ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn kinds_and_unsupported_sources() {
        assert_eq!(kind_of(&cm_volume("a", "b", None)), Ok(VolumeKind::ConfigMap));
        let pvc = Volume {
            name: "data".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: "c".into(),
                read_only: None,
            }),
            ..Default::default()
        };
        assert_eq!(kind_of(&pvc).unwrap_err(), "volume type persistentVolumeClaim is not supported by this node");
        let huge = Volume {
            name: "h".into(),
            empty_dir: Some(EmptyDirVolumeSource { medium: Some("HugePages".into()), ..Default::default() }),
            ..Default::default()
        };
        assert!(kind_of(&huge).unwrap_err().contains("HugePages"));
    }

    #[test]
    fn memory_volume_sizes() {
        let mut p = pod(vec![]);
        assert_eq!(memory_volume_size(&p, None, 1000), 1000, "node allocatable");
        assert_eq!(memory_volume_size(&p, Some(300), 1000), 300, "a smaller sizeLimit");
        assert_eq!(memory_volume_size(&p, Some(3000), 1000), 1000, "a sizeLimit above what the pod can use");
        p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
            limits: Some([("memory".to_string(), Q("500".into()))].into()),
            ..Default::default()
        });
        assert_eq!(memory_volume_size(&p, None, 1000), 500, "the pod's memory limit");
        assert_eq!(memory_volume_size(&p, Some(200), 1000), 200);
    }

    #[test]
    fn token_refresh_at_80_percent_or_a_day() {
        let now = SystemTime::now();
        let ttl = Duration::from_secs(1000);
        let t = Token { token: "t".into(), expires_at: now + ttl };
        assert!(!token_needs_refresh(&t, ttl, now));
        assert!(!token_needs_refresh(&t, ttl, now + Duration::from_secs(799)));
        assert!(token_needs_refresh(&t, ttl, now + Duration::from_secs(800)));
        let long = Duration::from_secs(48 * 3600);
        let t = Token { token: "t".into(), expires_at: now + long };
        assert!(!token_needs_refresh(&t, long, now + Duration::from_secs(23 * 3600)));
        assert!(token_needs_refresh(&t, long, now + Duration::from_secs(24 * 3600)));
    }

    #[tokio::test]
    async fn config_maps_are_written_refreshed_and_reported() {
        let d = tempfile::tempdir().unwrap();
        let objects = Arc::new(MemoryObjects::new());
        let (vm, events) = manager(d.path(), objects.clone());
        let p = pod(vec![cm_volume("cfg", "settings", None), cm_volume("opt", "absent", Some(true))]);
        let e = vm.setup(&p).await.unwrap_err();
        assert_eq!(e.to_string(), "MountVolume.SetUp failed for volume \"cfg\" : configmap \"settings\" not found");
        let opt = d.path().join("pods/uid-1/volumes/kubernetes.io~configmap/opt");
        assert!(opt.join("..data").exists(), "an optional configMap that does not exist is an empty volume");

        objects.put_config_map(config_map("settings", &[("a", "1")]));
        vm.setup(&p).await.unwrap();
        let dir = d.path().join("pods/uid-1/volumes/kubernetes.io~configmap/cfg");
        assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "1");

        objects.put_config_map(config_map("settings", &[("a", "2"), ("b", "x")]));
        let key = ObjectKey { kind: ObjectKind::ConfigMap, namespace: "ns".into(), name: "settings".into() };
        vm.refresh(Some(&key)).await;
        assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "2");
        assert_eq!(fs::read_to_string(dir.join("b")).unwrap(), "x");

        // Deleted: the files stay, one event per distinct error.
        objects.delete_config_map("ns", "settings");
        vm.refresh(None).await;
        vm.refresh(None).await;
        assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "2");
        let failed: Vec<_> = lock(&events.0).iter().filter(|(r, _)| r == FAILED_MOUNT).cloned().collect();
        assert_eq!(failed.len(), 1, "{failed:?}");

        vm.teardown("uid-1").await.unwrap();
        assert!(!d.path().join("pods/uid-1/volumes").exists());
    }

    #[tokio::test]
    async fn downward_api_follows_label_changes_and_host_paths_are_checked() {
        let d = tempfile::tempdir().unwrap();
        let (vm, _) = manager(d.path(), Arc::new(MemoryObjects::new()));
        let host = d.path().join("host/data");
        let downward = Volume {
            name: "info".into(),
            downward_api: Some(DownwardAPIVolumeSource {
                items: Some(vec![DownwardAPIVolumeFile {
                    path: "labels".into(),
                    field_ref: Some(ObjectFieldSelector { field_path: "metadata.labels".into(), ..Default::default() }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let hp = |t: &str| Volume {
            name: "host".into(),
            host_path: Some(HostPathVolumeSource { path: host.to_string_lossy().into(), type_: Some(t.into()) }),
            ..Default::default()
        };
        let e = vm.setup(&pod(vec![downward.clone(), hp("Directory")])).await.unwrap_err();
        assert_eq!(e.volume, "host");
        assert!(e.message.ends_with("is not a directory"), "{e}");
        let mut p = pod(vec![downward, hp("DirectoryOrCreate")]);
        vm.setup(&p).await.unwrap();
        assert!(host.is_dir());
        let file = d.path().join("pods/uid-1/volumes/kubernetes.io~downward-api/info/labels");
        assert_eq!(fs::read_to_string(&file).unwrap(), "app=\"web\"");
        p.metadata.labels = Some([("app".to_string(), "web2".to_string())].into());
        vm.setup(&p).await.unwrap();
        assert_eq!(fs::read_to_string(&file).unwrap(), "app=\"web2\"");
        vm.teardown("uid-1").await.unwrap();
        assert!(host.is_dir(), "a hostPath is never removed");
    }

    #[tokio::test]
    async fn mounts_for_a_container_without_sub_paths() {
        let d = tempfile::tempdir().unwrap();
        let (vm, _) = manager(d.path(), Arc::new(MemoryObjects::new()));
        let empty = Volume { name: "scratch".into(), empty_dir: Some(Default::default()), ..Default::default() };
        let p = pod(vec![empty]);
        let c = C {
            name: "app".into(),
            volume_mounts: Some(vec![VolumeMount {
                name: "scratch".into(),
                mount_path: "/s".into(),
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert!(vm.container_mounts(&p, &c, &[]).await.is_err(), "not set up yet");
        vm.setup(&p).await.unwrap();
        let m = vm.container_mounts(&p, &c, &[]).await.unwrap();
        assert_eq!(m.len(), 1);
        assert!(m[0].host_path.ends_with("pods/uid-1/volumes/kubernetes.io~empty-dir/scratch"));
        assert!(!m[0].readonly);
        let dir = Path::new(&m[0].host_path);
        assert_eq!(fs::metadata(dir).unwrap().permissions().mode() & 0o777, 0o777);
        let usage = vm.usage_paths("uid-1").await;
        assert_eq!(usage.len(), 1);
        assert!(usage[0].kind.counts_as_ephemeral_storage());
    }

    #[tokio::test]
    async fn projected_tokens_are_requested_once_and_refreshed() {
        // Projected volumes live on tmpfs, which needs root; the payload is
        // checked here without mounting.
        let d = tempfile::tempdir().unwrap();
        let objects = Arc::new(MemoryObjects::new());
        objects.put_config_map(config_map("kube-root-ca.crt", &[("ca.crt", "CERT")]));
        let (vm, _) = manager(d.path(), objects.clone());
        let v = Volume {
            name: "kube-api-access".into(),
            projected: Some(ProjectedVolumeSource {
                default_mode: Some(0o644),
                sources: Some(vec![
                    VolumeProjection {
                        service_account_token: Some(ServiceAccountTokenProjection {
                            path: "token".into(),
                            expiration_seconds: Some(3607),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    VolumeProjection {
                        config_map: Some(ConfigMapProjection {
                            name: "kube-root-ca.crt".into(),
                            items: Some(vec![KeyToPath {
                                key: "ca.crt".into(),
                                path: "ca.crt".into(),
                                ..Default::default()
                            }]),
                            optional: None,
                        }),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut st = PodState { pod: pod(vec![v.clone()]), volumes: BTreeMap::new(), tokens: HashMap::new() };
        let p1 = vm.payload(&mut st, &v).await.unwrap();
        assert_eq!(p1["ca.crt"].data, b"CERT");
        assert_eq!(String::from_utf8(p1["token"].data.clone()).unwrap(), "ns:default:1");
        let p2 = vm.payload(&mut st, &v).await.unwrap();
        assert_eq!(p1, p2, "a fresh token is reused");
        assert_eq!(objects.token_requests().len(), 1);
        assert_eq!(objects.token_requests()[0].pod_uid, "uid-1");
        // Near expiry it is requested again.
        for t in st.tokens.values_mut() {
            t.expires_at = SystemTime::now() + Duration::from_secs(60);
        }
        let p3 = vm.payload(&mut st, &v).await.unwrap();
        assert_eq!(String::from_utf8(p3["token"].data.clone()).unwrap(), "ns:default:2");
    }
}
