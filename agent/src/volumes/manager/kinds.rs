//! Volume kinds and the pure rules about them: which plugin directory a
//! kind has, which are refreshed from the API, which are tmpfs, the size of
//! a memory-backed volume, and when a service account token is refreshed.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Pod, Volume};

use crate::{cm::hierarchy::pod_limits, volumes::objects::Token};

/// The kubelet's plugin directory names.
pub const EMPTY_DIR: &str = "kubernetes.io~empty-dir";
pub const CONFIG_MAP: &str = "kubernetes.io~configmap";
pub const SECRET: &str = "kubernetes.io~secret";
pub const DOWNWARD_API: &str = "kubernetes.io~downward-api";
pub const PROJECTED: &str = "kubernetes.io~projected";
pub const CSI: &str = "kubernetes.io~csi";
pub const LOCAL_VOLUME: &str = "kubernetes.io~local-volume";

/// A service account token's default lifetime (the API's
/// expirationSeconds default).
pub(super) const DEFAULT_TOKEN_SECONDS: i64 = 3600;
/// The kubelet refreshes tokens older than a day whatever their lifetime.
const TOKEN_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// What kind of volume, for set-up, refresh and accounting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeKind {
    HostPath,
    EmptyDir {
        memory: bool,
    },
    ConfigMap,
    Secret,
    DownwardApi,
    Projected,
    /// A claim (or generic ephemeral volume) before its PV is known.
    Claim,
    Local,
    Csi,
}

impl VolumeKind {
    pub(super) fn plugin_dir(self) -> Option<&'static str> {
        match self {
            VolumeKind::HostPath => None,
            VolumeKind::EmptyDir { .. } => Some(EMPTY_DIR),
            VolumeKind::ConfigMap => Some(CONFIG_MAP),
            VolumeKind::Secret => Some(SECRET),
            VolumeKind::DownwardApi => Some(DOWNWARD_API),
            VolumeKind::Projected => Some(PROJECTED),
            VolumeKind::Claim => None,
            VolumeKind::Local => Some(LOCAL_VOLUME),
            VolumeKind::Csi => Some(CSI),
        }
    }

    /// Written from objects or the pod, so refreshed.
    pub(super) fn refreshed(self) -> bool {
        matches!(self, VolumeKind::ConfigMap | VolumeKind::Secret | VolumeKind::DownwardApi | VolumeKind::Projected)
    }

    /// On a tmpfs of its own.
    pub(super) fn tmpfs(self) -> bool {
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
            VolumeKind::Claim => "kubernetes.io/persistent-claim",
            VolumeKind::Local => "kubernetes.io/local-volume",
            VolumeKind::Csi => "kubernetes.io/csi",
        }
    }

    /// Lives on a volume of its own, not on the node's ephemeral storage
    /// (never measured by walking it).
    pub fn persistent(self) -> bool {
        matches!(self, VolumeKind::Claim | VolumeKind::Local | VolumeKind::Csi)
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
    if v.persistent_volume_claim.is_some() || v.ephemeral.is_some() {
        return Ok(VolumeKind::Claim);
    }
    if v.csi.is_some() {
        return Ok(VolumeKind::Csi);
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

pub(super) fn quantity_bytes(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> Option<i64> {
    q.and_then(|q| q.0.parse::<crate::quantity::Quantity>().ok()).map(|q| q.value())
}
