//! Mounting and unmounting one CSI volume for one pod, in the kubelet's
//! order: NodeStageVolume into the global mount (drivers with
//! STAGE_UNSTAGE_VOLUME), then NodePublishVolume into the pod's volume
//! directory; NodeUnpublishVolume, then NodeUnstageVolume once no other pod
//! has the volume.
//!
//! What is already mounted is not mounted again: after a restart the
//! mount table and the `vol_data.json` files say what the agent did before
//! (the kubelet's reconstruction), so a volume staged before a SIGKILL is
//! published without a second stage, and a published one is kept.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
};

use tracing::{debug, info};

use super::{
    client::{Capability, CsiClient, NodeCapabilities, VolumeRequest},
    drivers::CsiDrivers,
    paths::{self, GlobalVolumeData, PodVolumeData},
};
use crate::volumes::mount;

/// One CSI volume of one pod, resolved from its PV (or the inline source).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsiVolume {
    pub driver: String,
    pub volume_handle: String,
    /// The directory name under the pod's `kubernetes.io~csi` (the PV's
    /// name, or the inline volume's).
    pub spec_name: String,
    pub read_only: bool,
    pub capability: Capability,
    /// The publish context, the volume context (with pod info when the
    /// driver asks for it) and the publish secrets.
    pub request: VolumeRequest,
    pub stage_secrets: HashMap<String, String>,
    pub ephemeral: bool,
    /// The VolumeAttachment's name when the driver needs one.
    pub attachment_id: Option<String>,
    /// The CSIDriver's `requiresRepublish`: NodePublishVolume again every
    /// few seconds while mounted.
    pub requires_republish: bool,
}

fn is_mounted(path: &Path) -> Result<bool, String> {
    let table = mount::mount_table().map_err(|e| format!("reading the mount table: {e}"))?;
    Ok(mount::is_mount_point(&table, path))
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, String> + Send + 'static) -> Result<T, String> {
    tokio::task::spawn_blocking(f).await.map_err(|e| e.to_string())?
}

/// Stages (once per node) and publishes (once per pod) `v`; returns the
/// directory the containers mount.
pub async fn mount_volume(
    client: &CsiClient,
    caps: NodeCapabilities,
    root_dir: &Path,
    pod_dir: &Path,
    node_name: &str,
    v: &CsiVolume,
) -> Result<PathBuf, String> {
    let staging =
        (caps.stage_unstage && !v.ephemeral).then(|| paths::staging_path(root_dir, &v.driver, &v.volume_handle));
    if let Some(staging) = &staging {
        let global = paths::global_dir(root_dir, &v.driver, &v.volume_handle);
        let data = GlobalVolumeData { driver_name: v.driver.clone(), volume_handle: v.volume_handle.clone() };
        let s = staging.clone();
        let staged = blocking(move || {
            data.write(&global)?;
            fs::create_dir_all(&s).map_err(|e| format!("creating {}: {e}", s.display()))?;
            is_mounted(&s)
        })
        .await?;
        if staged {
            debug!(driver = v.driver, volume = v.volume_handle, "already staged");
        } else {
            let stage_request = VolumeRequest { secrets: v.stage_secrets.clone(), ..v.request.clone() };
            client
                .stage(&stage_request, staging, &v.capability)
                .await
                .map_err(|e| format!("MountVolume.MountDevice failed for volume {:?} : {e}", v.spec_name))?;
            info!(driver = v.driver, volume = v.volume_handle, path = %staging.display(), "volume staged");
        }
    }
    let vdir = paths::pod_volume_dir(pod_dir, &v.spec_name);
    let target = paths::publish_path(pod_dir, &v.spec_name);
    // The data first: an agent killed during the publish finds the volume
    // again and unpublishes it.
    let data = PodVolumeData {
        spec_vol_id: v.spec_name.clone(),
        volume_handle: v.volume_handle.clone(),
        driver_name: v.driver.clone(),
        node_name: node_name.to_owned(),
        attachment_id: v.attachment_id.clone().unwrap_or_default(),
        volume_lifecycle_mode: if v.ephemeral { paths::EPHEMERAL } else { paths::PERSISTENT }.to_owned(),
    };
    let t = target.clone();
    let published = blocking(move || {
        data.write(&vdir)?;
        fs::create_dir_all(&t).map_err(|e| format!("creating {}: {e}", t.display()))?;
        is_mounted(&t)
    })
    .await?;
    if !published {
        client.publish(&v.request, staging.as_deref(), &target, &v.capability, v.read_only).await?;
        info!(driver = v.driver, volume = v.volume_handle, path = %target.display(), "volume published");
    }
    Ok(target)
}

/// Calls NodePublishVolume again on a published volume (`requiresRepublish`
/// drivers, each refresh period).
pub async fn republish(
    client: &CsiClient,
    caps: NodeCapabilities,
    root_dir: &Path,
    pod_dir: &Path,
    v: &CsiVolume,
) -> Result<(), String> {
    let staging =
        (caps.stage_unstage && !v.ephemeral).then(|| paths::staging_path(root_dir, &v.driver, &v.volume_handle));
    let target = paths::publish_path(pod_dir, &v.spec_name);
    client.publish(&v.request, staging.as_deref(), &target, &v.capability, v.read_only).await
}

/// Unpublishes every CSI volume of the pod whose directory is under
/// `pod_dir` (read from its `vol_data.json`, so it works for pods the agent
/// no longer knows), then unstages those no other pod has. Directories
/// whose data cannot be read are left in place, named in the error.
pub async fn unmount_pod(drivers: &CsiDrivers, root_dir: &Path, pod_dir: &Path) -> Result<(), String> {
    let dir = pod_dir.to_owned();
    let volumes = blocking(move || Ok(paths::pod_volumes(&dir))).await?;
    let uid = pod_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let pods_dir = pod_dir.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut errors = vec![];
    for (vdir, data) in volumes {
        let data = match data {
            Ok(d) => d,
            Err(e) => {
                // Nothing says which driver: only an empty, unmounted
                // directory can go (an agent killed before writing it).
                let target = vdir.join("mount");
                let d = vdir.clone();
                let removed = blocking(move || {
                    if is_mounted(&target)? {
                        return Ok(false);
                    }
                    let _ = fs::remove_dir(&target);
                    Ok(fs::remove_dir(&d).is_ok() || !d.exists())
                })
                .await?;
                if !removed {
                    errors.push(e);
                }
                continue;
            }
        };
        if let Err(e) = unmount_one(drivers, root_dir, &pods_dir, &uid, &vdir, &data).await {
            errors.push(format!(
                "UnmountVolume.TearDown failed for volume {:?} (driver {}): {e}",
                data.spec_vol_id, data.driver_name
            ));
        }
    }
    if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) }
}

async fn unmount_one(
    drivers: &CsiDrivers,
    root_dir: &Path,
    pods_dir: &Path,
    uid: &str,
    vdir: &Path,
    data: &PodVolumeData,
) -> Result<(), String> {
    let target = vdir.join("mount");
    let t = target.clone();
    let (exists, mounted) = blocking(move || Ok((t.exists(), is_mounted(&t)?))).await?;
    let client = drivers.client(&data.driver_name).await;
    if exists || mounted {
        // The driver unpublishes even a directory that is no longer a mount
        // point: it may hold its own state for it.
        let client = client.as_ref().map_err(Clone::clone)?;
        client.unpublish(&data.volume_handle, &target).await?;
        info!(driver = data.driver_name, volume = data.volume_handle, path = %target.display(), "volume unpublished");
    }
    let (t, d) = (target.clone(), vdir.to_owned());
    blocking(move || {
        if is_mounted(&t)? {
            return Err(format!("{} is still mounted after NodeUnpublishVolume", t.display()));
        }
        let _ = fs::remove_dir(&t);
        let _ = fs::remove_file(d.join(paths::DATA_FILE));
        fs::remove_dir(&d)
            .or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
            .map_err(|e| format!("removing {}: {e}", d.display()))
    })
    .await?;
    if data.volume_lifecycle_mode == paths::EPHEMERAL {
        return Ok(());
    }
    unstage_if_unused(client, root_dir, pods_dir, uid, &data.driver_name, &data.volume_handle).await
}

async fn unstage_if_unused(
    client: Result<CsiClient, String>,
    root_dir: &Path,
    pods_dir: &Path,
    uid: &str,
    driver: &str,
    handle: &str,
) -> Result<(), String> {
    let global = paths::global_dir(root_dir, driver, handle);
    let staging = paths::staging_path(root_dir, driver, handle);
    let (pods, uid_s, d, h, g) =
        (pods_dir.to_owned(), uid.to_owned(), driver.to_owned(), handle.to_owned(), global.clone());
    let (others, staged_dir) =
        blocking(move || Ok((paths::other_pods_using(&pods, &uid_s, &d, &h), g.exists()))).await?;
    if others > 0 || !staged_dir {
        return Ok(());
    }
    let client = client?;
    if client.capabilities().await?.stage_unstage {
        client.unstage(handle, &staging).await.map_err(|e| format!("UnmountDevice failed: {e}"))?;
        info!(driver, volume = handle, "volume unstaged");
    }
    let s = staging.clone();
    blocking(move || {
        if is_mounted(&s)? {
            return Err(format!("{} is still mounted after NodeUnstageVolume", s.display()));
        }
        let _ = fs::remove_dir(&s);
        let _ = fs::remove_file(global.join(paths::DATA_FILE));
        let _ = fs::remove_dir(&global);
        Ok(())
    })
    .await
}
