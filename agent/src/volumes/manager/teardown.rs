//! Tearing volumes down: a pod's mounts and volume directories once it is
//! gone (CSI volumes unpublished and unstaged by their drivers first), its
//! whole directory, and the sweep of directories no pod owns (an agent
//! killed mid-way, a pod removed while the agent was down).

use std::{collections::BTreeSet, fs, path::Path};

use tracing::{info, warn};

use super::{PodsInUse, VolumeManager};
use crate::{
    cri::{RuntimeService, api, labels},
    volumes::mount,
};

impl VolumeManager {
    /// Unmounts everything the pod has under its directory (tmpfs volumes,
    /// subPath bind mounts) and removes its volume directories. Fails,
    /// leaving the directories, if something stays mounted.
    pub async fn teardown(&self, uid: &str) -> Result<(), String> {
        let state = self.pods.lock().remove(uid);
        // Wait for a set-up or refresh in progress to finish.
        let mut kinds = vec![];
        if let Some(s) = &state {
            kinds = s.lock().await.volumes.values().map(|m| m.kind).collect();
        }
        let dir = self.pod_dir(uid);
        let started = std::time::Instant::now();
        // CSI volumes through their drivers first: what the driver mounted
        // is the driver's to unmount (and the staged volume goes when no
        // other pod has it). What is left is unmounted below.
        let csi = {
            let _serial = self.csi_lock.lock().await;
            crate::volumes::csi::mounter::unmount_pod(&self.csi_drivers(), &self.root_dir(), &dir).await
        };
        let result = match csi {
            Ok(()) => tokio::task::spawn_blocking(move || teardown_dir(&dir)).await.map_err(|e| e.to_string())?,
            Err(e) => Err(e),
        };
        self.refresh_in_use().await;
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
            .filter(|uid| !in_use.in_use(uid) && !self.pods.lock().contains_key(uid))
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
