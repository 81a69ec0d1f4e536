//! Setting a pod's volumes up: each volume's directory (tmpfs where the
//! kubelet uses one), its files from the object source (configMap, secret,
//! downwardAPI, projected with service account tokens), and the fsGroup.

use std::{
    collections::{BTreeMap, HashMap},
    fs,
    os::unix::fs::PermissionsExt,
    sync::Arc,
    time::{Duration, SystemTime},
};

use k8s_openapi::api::core::v1::{Pod, Volume};
use tokio::sync::Mutex as AsyncMutex;
use tracing::debug;

use super::{
    MountedVolume, PodState, VolumeError, VolumeKind, VolumeManager, kind_of,
    kinds::{DEFAULT_TOKEN_SECONDS, quantity_bytes},
    memory_volume_size, namespace_of, token_needs_refresh, uid_of,
};
use crate::volumes::{
    atomic, hostpath, mount,
    objects::{ObjectError, TokenSpec},
    payload::{self, DEFAULT_MODE, Payload},
};

impl VolumeManager {
    /// Sets up every volume of `pod` not set up yet; idempotent, so it is
    /// called before each start of a container. Volumes set up before stay
    /// as they are (their refresh is the refresh loop's); a newer version
    /// of the pod updates downwardAPI files. Errors name the first volume
    /// that could not be set up; the others are still set up.
    pub async fn setup(&self, pod: &Pod) -> Result<(), VolumeError> {
        let uid = uid_of(pod);
        let state = {
            let mut pods = self.pods.lock();
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
            let kind = result.as_ref().map(|m| m.kind).ok().or_else(|| kind_of(v).ok());
            if let Some(kind) = kind {
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
            self.refresh_in_use().await;
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    pub(super) async fn setup_volume(&self, st: &mut PodState, v: &Volume) -> Result<MountedVolume, String> {
        if let Some(resolved) = self.resolve(&st.pod, v).await {
            let pod = st.pod.clone();
            return self.setup_resolved(&pod, v, resolved?).await;
        }
        let kind = kind_of(v)?;
        let uid = uid_of(&st.pod);
        if let Some(h) = &v.host_path {
            let path = h.path.clone();
            let ty = h.type_.clone();
            tokio::task::spawn_blocking(move || hostpath::prepare(&path, ty.as_deref()))
                .await
                .map_err(|e| e.to_string())??;
            return Ok(MountedVolume::new(&v.name, kind, h.path.clone().into()));
        }
        let Some(dir) = self.volume_dir(&uid, kind, &v.name) else {
            return Err(format!("volume {:?} has no directory of its own", v.name));
        };
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
        let mut m = MountedVolume::new(&v.name, kind, dir.clone());
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
    pub(super) async fn payload(&self, st: &mut PodState, v: &Volume) -> Result<Payload, String> {
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
}

/// Gives a volume to the pod's fsGroup (not hostPath volumes, as the
/// kubelet); API-backed volumes are read-only in containers.
pub(super) async fn apply_fs_group(pod: &Pod, m: &MountedVolume) -> Result<(), String> {
    let Some(gid) = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()).and_then(|s| s.fs_group) else {
        return Ok(());
    };
    if m.kind == VolumeKind::HostPath {
        return Ok(());
    }
    let (dir, read_only) = (m.path.clone(), m.kind.refreshed());
    let gid = u32::try_from(gid).map_err(|_| format!("fsGroup {gid} is not a group id"))?;
    tokio::task::spawn_blocking(move || crate::volumes::ownership::set_ownership(&dir, gid, read_only, None))
        .await
        .map_err(|e| e.to_string())?
        .map(drop)
        .map_err(|e| format!("setting the volume's group to fsGroup {gid}: {e}"))
}
