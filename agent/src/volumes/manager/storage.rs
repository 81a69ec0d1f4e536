//! What the node does for persistent volumes after they are mounted: the
//! attachable volumes in use (node.status.volumesInUse, which the
//! attach-detach controller reads before it detaches), their stats
//! (kubelet_volume_stats_*, the summary's PVC entries), online expansion
//! (NodeExpandVolume once the controller grew the volume) and the
//! republish of `requiresRepublish` drivers.

use std::{collections::BTreeSet, path::Path, time::Duration};

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use serde_json::json;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::{MountedVolume, VolumeKind, VolumeManager, kinds::quantity_bytes};
use crate::{
    events::{EventType, pod_ref},
    volumes::csi::{client::VolumeStats, mounter, paths},
};

/// How often mounted claims are checked for a grown size and stats are
/// read (the kubelet's reconciler reacts within a second through its
/// informers; one GET per claim every period is the cost here).
pub const PERSISTENT_SYNC: Duration = Duration::from_secs(5);

/// The kubelet's event reasons for node expansion.
pub const FILE_SYSTEM_RESIZE_SUCCESSFUL: &str = "FileSystemResizeSuccessful";
pub const FILE_SYSTEM_RESIZE_FAILED: &str = "VolumeResizeFailed";

/// One mounted claim's usage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimStats {
    pub namespace: String,
    pub claim: String,
    pub pod_uid: String,
    pub volume: String,
    pub stats: VolumeStats,
    /// The driver reports a volume condition (VOLUME_CONDITION): the
    /// health gauge has a series for it.
    pub abnormal_known: bool,
}

/// The attachable (CSI, persistent) volumes with a directory under any
/// pod, as volumesInUse names them.
pub fn in_use_on_disk(pods_dir: &Path) -> Vec<String> {
    let Ok(pods) = std::fs::read_dir(pods_dir) else { return vec![] };
    let mut out = BTreeSet::new();
    for p in pods.flatten() {
        for (_, data) in paths::pod_volumes(&p.path()) {
            if let Ok(d) = data
                && d.volume_lifecycle_mode != paths::EPHEMERAL
            {
                out.insert(paths::unique_name(&d.driver_name, &d.volume_handle));
            }
        }
    }
    out.into_iter().collect()
}

/// The size the claim asks the node to grow its filesystem to, if any:
/// the controller has grown the volume (`FileSystemResizePending`, or
/// allocated more than the claim's current capacity).
pub fn pending_node_expansion(pvc: &PersistentVolumeClaim, pv_capacity: Option<i64>) -> Option<i64> {
    let status = pvc.status.as_ref()?;
    let capacity = quantity_bytes(status.capacity.as_ref().and_then(|c| c.get("storage")))?;
    let pending =
        status.conditions.iter().flatten().any(|c| c.type_ == "FileSystemResizePending" && c.status == "True");
    let allocated = quantity_bytes(status.allocated_resources.as_ref().and_then(|a| a.get("storage")));
    let target = pv_capacity.or(allocated)?;
    (target > capacity && (pending || allocated.is_some_and(|a| a > capacity))).then_some(target)
}

/// The claim status patch after a node expansion: the new capacity, the
/// pending condition and resize status gone.
pub fn expanded_status_patch(pvc: &PersistentVolumeClaim, bytes: i64) -> serde_json::Value {
    let conditions: Vec<_> = pvc
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .filter(|c| c.type_ != "FileSystemResizePending")
        .cloned()
        .collect();
    json!({"status": {
        "capacity": {"storage": bytes.to_string()},
        "conditions": conditions,
        "allocatedResourceStatuses": {"storage": null},
    }})
}

impl VolumeManager {
    /// The attachable volumes in use, kept current (node status reads it).
    pub fn volumes_in_use(&self) -> watch::Receiver<Vec<String>> {
        self.in_use.subscribe()
    }

    /// Reads the volumes in use from the pods' directories again.
    pub(super) async fn refresh_in_use(&self) {
        let dir = self.cfg.pods_dir.clone();
        if let Ok(now) = tokio::task::spawn_blocking(move || in_use_on_disk(&dir)).await {
            self.in_use.send_if_modified(|v| {
                let changed = *v != now;
                *v = now;
                changed
            });
        }
    }

    /// Every mounted claim-backed or CSI volume, with its pod.
    async fn persistent_volumes(&self) -> Vec<(Pod, MountedVolume)> {
        let states: Vec<_> = self.pods.lock().values().cloned().collect();
        let mut out = vec![];
        for s in states {
            let st = s.lock().await;
            out.extend(st.volumes.values().filter(|m| m.persistent.is_some()).map(|m| (st.pod.clone(), m.clone())));
        }
        out
    }

    /// The claims' usage as last read (every volumeStatsAggPeriod), and
    /// when it was read.
    pub fn cached_claim_stats(&self) -> (Option<k8s_openapi::jiff::Timestamp>, Vec<ClaimStats>) {
        let c = self.claim_stats.lock();
        (c.1, c.2.clone())
    }

    /// The usage of every mounted claim: NodeGetVolumeStats for CSI drivers
    /// that have it, statfs for local volumes (hostPath volumes have none,
    /// as the kubelet's).
    pub async fn claim_stats(&self) -> Vec<ClaimStats> {
        let mut out = vec![];
        let drivers = self.csi_drivers();
        for (pod, m) in self.persistent_volumes().await {
            let Some(info) = &m.persistent else { continue };
            let Some((namespace, claim)) = info.claim.clone() else { continue };
            let mut abnormal_known = false;
            let stats = match (&info.csi, m.kind) {
                (Some(csi), VolumeKind::Csi) => {
                    let Ok(client) = drivers.client(&csi.driver).await else { continue };
                    let Ok(caps) = client.capabilities().await else { continue };
                    if !caps.get_volume_stats {
                        continue;
                    }
                    abnormal_known = caps.volume_condition;
                    let staging = paths::staging_path(&self.root_dir(), &csi.driver, &csi.volume_handle);
                    let staging = staging.exists().then_some(staging);
                    match client.volume_stats(&csi.volume_handle, &m.path, staging.as_deref()).await {
                        Ok(s) => s,
                        Err(e) => {
                            debug!(volume = m.name, "volume stats: {e}");
                            continue;
                        }
                    }
                }
                (_, VolumeKind::Local) if !info.block => match statfs(&m.path).await {
                    Some(s) => s,
                    None => continue,
                },
                _ => continue,
            };
            out.push(ClaimStats {
                namespace,
                claim,
                pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
                volume: m.name.clone(),
                stats,
                abnormal_known,
            });
        }
        out
    }

    /// One round of the persistent volumes' upkeep: volumes in use, node
    /// expansion, republish.
    pub(super) async fn sync_persistent(&self) {
        self.refresh_in_use().await;
        let period = self.cfg.stats_period;
        let due = self.claim_stats.lock().0.is_none_or(|at| at.elapsed() >= period);
        if !period.is_zero() && due {
            let stats = self.claim_stats().await;
            *self.claim_stats.lock() =
                (Some(std::time::Instant::now()), Some(k8s_openapi::jiff::Timestamp::now()), stats);
        }
        // The driver is dialed only when there is something to ask it: a
        // claim the controller grew, or a volume to publish again.
        let drivers = self.csi_drivers();
        for (pod, m) in self.persistent_volumes().await {
            let (Some(info), VolumeKind::Csi) = (&m.persistent, m.kind) else { continue };
            let Some(csi) = &info.csi else { continue };
            let grown = match &info.claim {
                Some((ns, claim)) => self.grown_size(&m, ns, claim).await,
                None => None,
            };
            if grown.is_none() && !csi.requires_republish {
                continue;
            }
            let Ok(client) = drivers.client(&csi.driver).await else { continue };
            let Ok(caps) = client.capabilities().await else { continue };
            if let (Some((pvc, bytes)), Some((ns, claim))) = (grown, &info.claim)
                && caps.expand
            {
                self.expand(&pod, &m, ns, claim, &pvc, bytes, &client, caps).await;
            }
            if csi.requires_republish {
                let _serial = self.csi_lock.lock().await;
                let pod_dir = self.pod_dir(pod.metadata.uid.as_deref().unwrap_or_default());
                if let Err(e) = mounter::republish(&client, caps, &self.root_dir(), &pod_dir, csi).await {
                    warn!(volume = m.name, "republishing: {e}");
                }
            }
        }
    }

    /// The claim and the size to grow its filesystem to, when the
    /// controller has grown the volume.
    async fn grown_size(&self, m: &MountedVolume, ns: &str, claim: &str) -> Option<(PersistentVolumeClaim, i64)> {
        let objects = self.objects();
        let pvc = objects.get_pvc(ns, claim).await.ok()?;
        let pv_name = m.persistent.as_ref().and_then(|p| p.pv.clone()).unwrap_or_default();
        let pv = objects.get_pv(&pv_name).await.ok()?;
        let pv_capacity =
            quantity_bytes(pv.spec.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage")));
        pending_node_expansion(&pvc, pv_capacity).map(|bytes| (pvc, bytes))
    }

    /// NodeExpandVolume to `bytes`, then the claim's status.
    #[allow(clippy::too_many_arguments)]
    async fn expand(
        &self,
        pod: &Pod,
        m: &MountedVolume,
        ns: &str,
        claim: &str,
        pvc: &PersistentVolumeClaim,
        bytes: i64,
        client: &crate::volumes::csi::client::CsiClient,
        caps: crate::volumes::csi::client::NodeCapabilities,
    ) {
        let Some(csi) = m.persistent.as_ref().and_then(|p| p.csi.as_ref()) else { return };
        let objects = self.objects();
        let pv_name = m.persistent.as_ref().and_then(|p| p.pv.clone()).unwrap_or_default();
        let staging =
            caps.stage_unstage.then(|| paths::staging_path(&self.root_dir(), &csi.driver, &csi.volume_handle));
        let result = client.expand(&csi.request, &m.path, staging.as_deref(), &csi.capability, bytes).await;
        match result {
            Ok(got) => {
                // The claim's capacity is the volume's (the PV's), whatever
                // the filesystem rounded it to.
                debug!(claim, bytes, reported = got, "NodeExpandVolume");
                let patch = expanded_status_patch(pvc, bytes);
                if let Err(e) = objects.patch_pvc_status(ns, claim, patch).await {
                    warn!(claim, "the volume grew, but the claim's status could not be updated: {e}");
                    return;
                }
                info!(claim, bytes, "volume expanded on the node");
                self.recorder.record(
                    &pod_ref(pod),
                    EventType::Normal,
                    FILE_SYSTEM_RESIZE_SUCCESSFUL,
                    &format!("MountVolume.NodeExpandVolume succeeded for volume {pv_name:?} {}", self.cfg.node_name),
                );
            }
            Err(e) => self.recorder.record(
                &pod_ref(pod),
                EventType::Warning,
                FILE_SYSTEM_RESIZE_FAILED,
                &format!("MountVolume.NodeExpandVolume failed for volume {pv_name:?} : {e}"),
            ),
        }
    }
}

/// statfs of a mounted volume, as VolumeStats.
async fn statfs(path: &Path) -> Option<VolumeStats> {
    let p = path.to_owned();
    let s = tokio::task::spawn_blocking(move || rustix::fs::statvfs(&p).ok()).await.ok()??;
    let frsize = s.f_frsize as i64;
    let total = s.f_blocks as i64 * frsize;
    let available = s.f_bavail as i64 * frsize;
    Some(VolumeStats {
        capacity_bytes: Some(total),
        available_bytes: Some(available),
        used_bytes: Some(total - s.f_bfree as i64 * frsize),
        inodes: Some(s.f_files as i64),
        inodes_free: Some(s.f_ffree as i64),
        inodes_used: Some(s.f_files.saturating_sub(s.f_ffree) as i64),
        abnormal: None,
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{PersistentVolumeClaimCondition, PersistentVolumeClaimStatus},
        apimachinery::pkg::api::resource::Quantity,
    };

    use super::*;

    fn claim(capacity: &str, allocated: Option<&str>, pending: bool) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            status: Some(PersistentVolumeClaimStatus {
                capacity: Some([("storage".to_string(), Quantity(capacity.into()))].into()),
                allocated_resources: allocated.map(|a| [("storage".to_string(), Quantity(a.into()))].into()),
                conditions: pending.then(|| {
                    vec![PersistentVolumeClaimCondition {
                        type_: "FileSystemResizePending".into(),
                        status: "True".into(),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn node_expansion_is_due_once_the_controller_grew_the_volume() {
        let mi = 1 << 20;
        assert_eq!(pending_node_expansion(&claim("64Mi", None, true), Some(128 * mi)), Some(128 * mi));
        assert_eq!(pending_node_expansion(&claim("64Mi", Some("128Mi"), false), None), Some(128 * mi));
        assert_eq!(pending_node_expansion(&claim("64Mi", None, false), Some(128 * mi)), None, "nothing asked");
        assert_eq!(pending_node_expansion(&claim("128Mi", None, true), Some(128 * mi)), None, "already there");
        assert_eq!(pending_node_expansion(&PersistentVolumeClaim::default(), Some(mi)), None);
        let patch = expanded_status_patch(&claim("64Mi", None, true), 128 * mi);
        assert_eq!(patch["status"]["capacity"]["storage"], "134217728");
        assert_eq!(patch["status"]["conditions"], json!([]));
    }

    #[test]
    fn volumes_in_use_are_the_persistent_csi_volumes_on_disk() {
        let pods = tempfile::tempdir().unwrap();
        let data = |handle: &str, mode: &str| paths::PodVolumeData {
            spec_vol_id: "pv".into(),
            volume_handle: handle.into(),
            driver_name: "d".into(),
            node_name: "n".into(),
            attachment_id: String::new(),
            volume_lifecycle_mode: mode.into(),
        };
        data("v1", paths::PERSISTENT).write(&paths::pod_volume_dir(&pods.path().join("a"), "pv1")).unwrap();
        data("v1", paths::PERSISTENT).write(&paths::pod_volume_dir(&pods.path().join("b"), "pv1")).unwrap();
        data("v2", paths::EPHEMERAL).write(&paths::pod_volume_dir(&pods.path().join("b"), "scratch")).unwrap();
        assert_eq!(in_use_on_disk(pods.path()), ["kubernetes.io/csi/d^v1"]);
    }
}
