//! Keeping API-backed volumes current: the refresh of one pod's volumes,
//! of all pods (or those showing a changed object), the next token
//! refresh, and the loop that drives them and the orphan sweep.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use k8s_openapi::api::core::v1::Volume;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::{FAILED_MOUNT, PodState, PodsInUse, VolumeError, VolumeKind, VolumeManager, setup::apply_fs_group};
use crate::{
    cri::RuntimeService,
    events::{EventType, pod_ref},
    volumes::{
        atomic,
        objects::{ObjectKey, ObjectKind},
    },
};

impl VolumeManager {
    /// Rewrites the volumes of one pod whose kind matches; `key`, when
    /// given, limits it to volumes that show that object.
    pub(super) async fn refresh_state(
        &self,
        st: &mut PodState,
        which: impl Fn(VolumeKind) -> bool,
        key: Option<&ObjectKey>,
    ) {
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
        let states: Vec<_> = self.pods.lock().values().cloned().collect();
        for s in states {
            let mut st = s.lock().await;
            self.refresh_state(&mut st, |k| !matches!(k, VolumeKind::DownwardApi), key).await;
        }
    }

    /// When the next service account token needs refreshing.
    pub(super) async fn next_token_refresh(&self) -> Option<SystemTime> {
        let states: Vec<_> = self.pods.lock().values().cloned().collect();
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

    /// Refreshes API-backed volumes every refresh period, when the object
    /// source reports a change, and before tokens expire; sweeps orphaned
    /// pod directories. Runs until shutdown.
    pub async fn run(
        self: Arc<Self>,
        in_use: Arc<dyn PodsInUse>,
        runtime: Arc<dyn RuntimeService>,
        shutdown: CancellationToken,
    ) {
        let mut changes = self.objects().subscribe();
        let mut refresh = tokio::time::interval(self.cfg.refresh_period);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sweep = tokio::time::interval(self.cfg.sweep_period);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut persistent = tokio::time::interval(super::storage::PERSISTENT_SYNC);
        persistent.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let token_due = self
                .next_token_refresh()
                .await
                .map(|at| tokio::time::Instant::now() + at.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO));
            tokio::select! {
                _ = refresh.tick() => self.refresh(None).await,
                _ = persistent.tick() => self.sync_persistent().await,
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
                _ = shutdown.cancelled() => break,
            }
        }
    }
}

/// Whether a volume shows `key`'s object.
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
