//! The Node service: staging attaches a volume's image to a loop device
//! and mounts its filesystem (ext4 or btrfs, as the capability asks, made
//! on first use) on the staging path (a block volume stays the bare
//! device, remembered in `<state>/staged/<id>`); publishing bind-mounts
//! that onto the target. Inline ephemeral volumes get an image of their
//! own under `<state>/ephemeral/`, gone when they are unpublished.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use swiftlet::volumes::csi::api::{self, *};
use tonic::{Request, Response, Status};

use super::{
    ATTACHED_KEY, Driver, EPHEMERAL_KEY, HostError, MIN_SIZE, check_path, check_volume_id,
    filesystems::{self, BTRFS_MIN_RESIZE, FsType},
    image_size, loopdev, mounts, sorted_keys, sorted_pairs,
};

/// What a volume capability asks for.
#[derive(Debug, Clone, PartialEq)]
enum Access {
    Mount { fs: FsType, flags: Vec<String> },
    Block,
}

fn access(cap: Option<&VolumeCapability>) -> Result<Access, Status> {
    match cap.and_then(|c| c.access_type.as_ref()) {
        None => Err(Status::invalid_argument("volume_capability with an access type is required")),
        Some(volume_capability::AccessType::Block(_)) => Ok(Access::Block),
        Some(volume_capability::AccessType::Mount(m)) => {
            let fs = FsType::parse(&m.fs_type).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "fs_type {:?} is not supported: this driver makes ext4 and btrfs",
                    m.fs_type
                ))
            })?;
            Ok(Access::Mount { fs, flags: m.mount_flags.clone() })
        }
    }
}

/// A Kubernetes quantity (`16Mi`, `1G`, `1.5Gi`, `1048576`) in bytes.
pub fn parse_quantity(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let multiplier: u64 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        _ => return None,
    };
    if let Ok(n) = number.parse::<u64>() {
        return n.checked_mul(multiplier);
    }
    let n: f64 = number.parse().ok()?;
    let v = (n * multiplier as f64).ceil();
    (v.is_finite() && v >= 0.0 && v < u64::MAX as f64).then_some(v as u64)
}

/// Formats a fresh device as `fs`, refuses one holding another
/// filesystem (never reformatting it), and grows an ext4 that its device
/// outgrew (an expansion that could not happen online) while nothing
/// mounts it. A btrfs grows only once mounted: [`grow_btrfs`].
fn prepare(device: &Path, fs: FsType) -> Result<(), Status> {
    let found = filesystems::format_unless_formatted(device, fs)?;
    if found != fs.name() {
        return Err(Status::failed_precondition(format!(
            "the volume on {} holds {found}, not the {} asked for",
            device.display(),
            fs.name()
        )));
    }
    let in_use = mounts::device_node(device).is_some_and(|d| !mounts::of_device(&mounts::table(), d).is_empty());
    if fs == FsType::Ext4 && !in_use {
        filesystems::grow_ext4_offline(device)?;
    }
    Ok(())
}

/// Grows the btrfs mounted (writable) at `path` to the size of `device`
/// when the device outgrew it.
fn grow_btrfs(path: &Path, device: &Path) -> Result<(), Status> {
    if !filesystems::btrfs_outgrown(path, device)? {
        return Ok(());
    }
    let size = loopdev::size_bytes(device)?;
    if size < BTRFS_MIN_RESIZE {
        return Err(Status::out_of_range(format!(
            "a btrfs grows only to {} MiB or more (the kernel's limit), not to {size} bytes",
            BTRFS_MIN_RESIZE >> 20
        )));
    }
    tracing::info!("growing the btrfs at {} to {size} bytes", path.display());
    filesystems::resize_btrfs(path)?;
    Ok(())
}

/// After mounting a btrfs: grows it when its device grew while it was
/// not mounted. The volume is usable either way, so a failure is logged
/// (NodeExpandVolume reports it).
fn grow_btrfs_after_mount(fs: FsType, path: &Path, device: &Path) {
    if fs == FsType::Btrfs
        && let Err(e) = grow_btrfs(path, device)
    {
        tracing::warn!("the btrfs at {} stays smaller than its device: {}", path.display(), e.message());
    }
}

fn mkdir(path: &Path) -> Result<(), HostError> {
    std::fs::create_dir_all(path).map_err(|e| HostError::io("cannot create", path, e))
}

/// Read-only as a mount option, then the capability's flags.
fn mount_options(read_only: bool, flags: &[String]) -> Vec<String> {
    read_only.then(|| "ro".to_owned()).into_iter().chain(flags.iter().cloned()).collect()
}

fn ignore_not_found(r: std::io::Result<()>, what: &'static str, path: &Path) -> Result<(), HostError> {
    match r {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(HostError::io(what, path, e)),
        _ => Ok(()),
    }
}

impl Driver {
    fn staged_record(&self, id: &str) -> PathBuf {
        self.state().join("staged").join(id)
    }

    /// The loop device NodeStageVolume attached for `id`, if it still is.
    fn staged_device(&self, id: &str) -> Option<PathBuf> {
        let recorded = std::fs::read_to_string(self.staged_record(id)).ok()?;
        let image = std::fs::canonicalize(self.volume_image(id)).ok()?;
        loopdev::list()
            .into_iter()
            .find(|l| l.device.as_os_str() == recorded.trim() && l.backing == image)
            .map(|l| l.device)
    }

    /// Attaches `image` and puts `fs` on it; the device, and whether this
    /// call attached it.
    fn attach_formatted(&self, image: &Path, fs: FsType) -> Result<(PathBuf, bool), Status> {
        let (dev, fresh) = loopdev::attach(image)?;
        if let Err(e) = prepare(&dev, fs) {
            if fresh {
                let _ = loopdev::detach(&dev);
            }
            return Err(e);
        }
        Ok((dev, fresh))
    }

    /// Mounts `image`'s filesystem on `target` (no staging: --no-stage,
    /// ephemeral).
    fn mount_image(
        &self,
        image: &Path,
        target: &Path,
        fs: FsType,
        read_only: bool,
        flags: &[String],
    ) -> Result<(), Status> {
        let (dev, fresh) = self.attach_formatted(image, fs)?;
        let r =
            mkdir(target).and_then(|()| mounts::mount(&dev, target, Some(fs.name()), &mount_options(read_only, flags)));
        if let Err(e) = r {
            if fresh {
                let _ = loopdev::detach(&dev);
            }
            return Err(e.into());
        }
        if !read_only {
            grow_btrfs_after_mount(fs, target, &dev);
        }
        Ok(())
    }

    fn stage_now(&self, r: NodeStageVolumeRequest) -> Result<NodeStageVolumeResponse, Status> {
        check_volume_id(&r.volume_id)?;
        let staging = check_path("staging_target_path", &r.staging_target_path)?;
        let access = access(r.volume_capability.as_ref())?;
        if self.config().no_stage {
            return Err(Status::unimplemented("this driver runs with --no-stage"));
        }
        if self.config().require_attach && !r.publish_context.contains_key(ATTACHED_KEY) {
            return Err(Status::failed_precondition(format!(
                "volume {} is not attached: the publish context has no {ATTACHED_KEY}",
                r.volume_id
            )));
        }
        let _g = self.exclusive();
        let image = self.volume_image(&r.volume_id);
        if !image.exists() {
            return Err(Status::not_found(format!("no volume {}", r.volume_id)));
        }
        let (dev, fresh) = loopdev::attach(&image)?;
        let staged = || -> Result<(), Status> {
            if let Access::Mount { fs, flags } = &access {
                match mounts::mounted_at(&staging) {
                    Some(m) if mounts::device_node(&dev).is_some_and(|d| mounts::is_of(&m, d)) => {}
                    Some(m) => {
                        return Err(Status::already_exists(format!(
                            "{} is already mounted from {}",
                            staging.display(),
                            m.source
                        )));
                    }
                    None => {
                        prepare(&dev, *fs)?;
                        mkdir(&staging)?;
                        mounts::mount(&dev, &staging, Some(fs.name()), flags)?;
                        grow_btrfs_after_mount(*fs, &staging, &dev);
                    }
                }
            }
            let record = self.staged_record(&r.volume_id);
            mkdir(record.parent().unwrap_or(self.state()))?;
            std::fs::write(&record, dev.as_os_str().as_encoded_bytes())
                .map_err(|e| HostError::io("cannot write", &record, e))?;
            Ok(())
        };
        let result = staged();
        if result.is_err() && fresh {
            let _ = loopdev::detach(&dev);
        }
        result.map(|()| NodeStageVolumeResponse {})
    }

    fn unstage_now(&self, id: &str, staging: &str) -> Result<NodeUnstageVolumeResponse, Status> {
        check_volume_id(id)?;
        let staging = check_path("staging_target_path", staging)?;
        let _g = self.exclusive();
        let staging_mount = mounts::mounted_at(&staging);
        let devices = loopdev::find(&self.volume_image(id));
        // The CO unpublishes first: a mount left elsewhere is its mistake.
        let table = mounts::table();
        for l in &devices {
            let elsewhere = mounts::of_device(&table, l.dev)
                .into_iter()
                .find(|m| staging_mount.as_ref().is_none_or(|s| s.mount_point != m.mount_point));
            if let Some(m) = elsewhere {
                return Err(Status::failed_precondition(format!(
                    "volume {id} is still published at {}",
                    m.mount_point.display()
                )));
            }
        }
        mounts::unmount(&staging)?;
        for l in &devices {
            loopdev::detach(&l.device)?;
        }
        let record = self.staged_record(id);
        ignore_not_found(std::fs::remove_file(&record), "cannot remove", &record)?;
        Ok(NodeUnstageVolumeResponse {})
    }

    fn publish_now(&self, r: NodePublishVolumeRequest) -> Result<NodePublishVolumeResponse, Status> {
        check_volume_id(&r.volume_id)?;
        let target = check_path("target_path", &r.target_path)?;
        let access = access(r.volume_capability.as_ref())?;
        let ephemeral = r.volume_context.get(EPHEMERAL_KEY).is_some_and(|v| v == "true");
        let _g = self.exclusive();
        if mounts::mounted_at(&target).is_some() {
            return Ok(NodePublishVolumeResponse {});
        }
        match access {
            _ if ephemeral => {
                let size = match r.volume_context.get("size") {
                    None => MIN_SIZE,
                    Some(q) => parse_quantity(q)
                        .map(image_size)
                        .ok_or_else(|| Status::invalid_argument(format!("bad size {q:?}")))?,
                };
                let image = self.ephemeral_image(&r.volume_id);
                loopdev::grow_image(&image, size)?;
                let (fs, flags) = match access {
                    Access::Mount { fs, flags } => (fs, flags),
                    Access::Block => return Err(Status::invalid_argument("inline volumes are filesystems")),
                };
                if let Err(e) = self.mount_image(&image, &target, fs, r.readonly, &flags) {
                    let _ = std::fs::remove_file(&image);
                    return Err(e);
                }
            }
            Access::Mount { fs, flags } if self.config().no_stage => {
                let image = self.volume_image(&r.volume_id);
                if !image.exists() {
                    return Err(Status::not_found(format!("no volume {}", r.volume_id)));
                }
                self.mount_image(&image, &target, fs, r.readonly, &flags)?;
            }
            Access::Mount { flags, .. } => {
                let staging = check_path("staging_target_path", &r.staging_target_path)?;
                if mounts::mounted_at(&staging).is_none() {
                    return Err(Status::failed_precondition(format!(
                        "volume {} is not staged at {}",
                        r.volume_id,
                        staging.display()
                    )));
                }
                mkdir(&target)?;
                mounts::bind(&staging, &target, r.readonly, &flags)?;
            }
            Access::Block => {
                let dev = if self.config().no_stage {
                    let image = self.volume_image(&r.volume_id);
                    if !image.exists() {
                        return Err(Status::not_found(format!("no volume {}", r.volume_id)));
                    }
                    loopdev::attach(&image)?.0
                } else {
                    self.staged_device(&r.volume_id)
                        .ok_or_else(|| Status::failed_precondition(format!("volume {} is not staged", r.volume_id)))?
                };
                if let Some(dir) = target.parent() {
                    mkdir(dir)?;
                }
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&target)
                    .map_err(|e| HostError::io("cannot create", &target, e))?;
                mounts::bind(&dev, &target, r.readonly, &[])?;
            }
        }
        Ok(NodePublishVolumeResponse {})
    }

    fn unpublish_now(&self, id: &str, target: &str) -> Result<NodeUnpublishVolumeResponse, Status> {
        check_volume_id(id)?;
        let target = check_path("target_path", target)?;
        let _g = self.exclusive();
        mounts::unmount(&target)?;
        match std::fs::symlink_metadata(&target) {
            Ok(m) if m.is_dir() => ignore_not_found(std::fs::remove_dir(&target), "cannot remove", &target)?,
            Ok(_) => ignore_not_found(std::fs::remove_file(&target), "cannot remove", &target)?,
            Err(_) => {}
        }
        let ephemeral = self.ephemeral_image(id);
        if ephemeral.exists() {
            for l in loopdev::find(&ephemeral) {
                loopdev::detach(&l.device)?;
            }
            ignore_not_found(std::fs::remove_file(&ephemeral), "cannot remove", &ephemeral)?;
        } else if self.config().no_stage {
            // Nothing unstages: the last unpublish lets the device go.
            let table = mounts::table();
            for l in loopdev::find(&self.volume_image(id)) {
                if mounts::of_device(&table, l.dev).is_empty() {
                    loopdev::detach(&l.device)?;
                }
            }
        }
        Ok(NodeUnpublishVolumeResponse {})
    }

    fn stats_now(&self, id: &str, path: &str) -> Result<NodeGetVolumeStatsResponse, Status> {
        check_volume_id(id)?;
        let path = check_path("volume_path", path)?;
        if mounts::mounted_at(&path).is_none() {
            return Err(Status::not_found(format!("nothing is mounted at {}", path.display())));
        }
        let usage = if let Some(dev) = mounts::device_node(&path) {
            let size = loopdev::size_bytes_of(dev)?;
            vec![VolumeUsage { total: clamp(size), unit: volume_usage::Unit::Bytes as i32, ..Default::default() }]
        } else {
            let s =
                rustix::fs::statvfs(&path).map_err(|e| Status::internal(format!("statvfs {}: {e}", path.display())))?;
            let block = s.f_frsize;
            vec![
                VolumeUsage {
                    total: clamp(s.f_blocks.saturating_mul(block)),
                    available: clamp(s.f_bavail.saturating_mul(block)),
                    used: clamp(s.f_blocks.saturating_sub(s.f_bfree).saturating_mul(block)),
                    unit: volume_usage::Unit::Bytes as i32,
                },
                VolumeUsage {
                    total: clamp(s.f_files),
                    available: clamp(s.f_favail),
                    used: clamp(s.f_files.saturating_sub(s.f_ffree)),
                    unit: volume_usage::Unit::Inodes as i32,
                },
            ]
        };
        let condition = match self.control().abnormal(id) {
            Some(message) => VolumeCondition { abnormal: true, message },
            None => VolumeCondition { abnormal: false, message: "volume is healthy".into() },
        };
        Ok(NodeGetVolumeStatsResponse { usage, volume_condition: Some(condition) })
    }

    fn expand_now(&self, r: NodeExpandVolumeRequest) -> Result<NodeExpandVolumeResponse, Status> {
        check_volume_id(&r.volume_id)?;
        let path = check_path("volume_path", &r.volume_path)?;
        let _g = self.exclusive();
        let image = [self.volume_image(&r.volume_id), self.ephemeral_image(&r.volume_id)]
            .into_iter()
            .find(|p| p.exists())
            .ok_or_else(|| Status::not_found(format!("no volume {}", r.volume_id)))?;
        let dev = loopdev::find(&image)
            .into_iter()
            .next()
            .ok_or_else(|| Status::not_found(format!("volume {} is not staged or published", r.volume_id)))?;
        loopdev::refresh(&dev.device)?;
        let block = matches!(r.volume_capability.as_ref().map(|c| access(Some(c))), Some(Ok(Access::Block)))
            || mounts::device_node(&path).is_some();
        if !block {
            if filesystems::detect(&dev.device)?.as_deref() == Some(FsType::Btrfs.name()) {
                let staging = (!r.staging_target_path.is_empty()).then(|| PathBuf::from(&r.staging_target_path));
                let paths: Vec<PathBuf> = std::iter::once(path).chain(staging).collect();
                self.expand_btrfs(&r.volume_id, &paths, &dev)?;
            } else if mounts::of_device(&mounts::table(), dev.dev).is_empty() {
                filesystems::grow_ext4_offline(&dev.device)?;
            } else {
                filesystems::resize_ext4_online(&dev.device)?;
            }
        }
        Ok(NodeExpandVolumeResponse { capacity_bytes: clamp(loopdev::size_bytes(&dev.device)?) })
    }

    /// Grows the btrfs on `dev` through a writable mount of it: the paths
    /// the request gave (a bind-mounted target works as well as the
    /// staging path) or any other; one not mounted at all is mounted for
    /// the resize, as a btrfs grows only while mounted.
    fn expand_btrfs(&self, id: &str, paths: &[PathBuf], dev: &loopdev::LoopDevice) -> Result<(), Status> {
        let on_dev: Vec<mounts::MountEntry> = paths
            .iter()
            .filter_map(|p| mounts::mounted_at(p))
            .chain(mounts::of_device(&mounts::table(), dev.dev))
            .filter(|m| mounts::is_of(m, dev.dev) && m.fs_type == FsType::Btrfs.name())
            .collect();
        if let Some(m) = on_dev.iter().find(|m| !m.read_only()) {
            return grow_btrfs(&m.mount_point, &dev.device);
        }
        if !on_dev.is_empty() {
            return Err(Status::failed_precondition(format!(
                "volume {id} is mounted read-only only: its btrfs cannot grow"
            )));
        }
        let dir = self.state().join("resize").join(id);
        mkdir(&dir)?;
        mounts::mount(&dev.device, &dir, Some(FsType::Btrfs.name()), &[])?;
        let grown = grow_btrfs(&dir, &dev.device);
        let unmounted = mounts::unmount(&dir);
        let _ = std::fs::remove_dir(&dir);
        grown?;
        unmounted?;
        Ok(())
    }
}

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn rpc(t: node_service_capability::rpc::Type) -> NodeServiceCapability {
    NodeServiceCapability {
        r#type: Some(node_service_capability::Type::Rpc(node_service_capability::Rpc { r#type: t as i32 })),
    }
}

#[tonic::async_trait]
impl api::node_server::Node for Driver {
    async fn node_stage_volume(
        &self,
        r: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let r = r.into_inner();
        let line =
            format!("NodeStageVolume {} {} secrets={}", r.volume_id, r.staging_target_path, sorted_keys(&r.secrets));
        self.call("NodeStageVolume", line, move |d| d.stage_now(r)).await
    }

    async fn node_unstage_volume(
        &self,
        r: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let r = r.into_inner();
        let line = format!("NodeUnstageVolume {} {}", r.volume_id, r.staging_target_path);
        self.call("NodeUnstageVolume", line, move |d| d.unstage_now(&r.volume_id, &r.staging_target_path)).await
    }

    async fn node_publish_volume(
        &self,
        r: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let r = r.into_inner();
        let line = format!(
            "NodePublishVolume {} {} ro={} ctx={} secrets={}",
            r.volume_id,
            r.target_path,
            r.readonly,
            sorted_pairs(&r.volume_context),
            sorted_keys(&r.secrets)
        );
        self.call("NodePublishVolume", line, move |d| d.publish_now(r)).await
    }

    async fn node_unpublish_volume(
        &self,
        r: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let r = r.into_inner();
        let line = format!("NodeUnpublishVolume {} {}", r.volume_id, r.target_path);
        self.call("NodeUnpublishVolume", line, move |d| d.unpublish_now(&r.volume_id, &r.target_path)).await
    }

    async fn node_get_volume_stats(
        &self,
        r: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let r = r.into_inner();
        let line = format!("NodeGetVolumeStats {} {}", r.volume_id, r.volume_path);
        self.call("NodeGetVolumeStats", line, move |d| d.stats_now(&r.volume_id, &r.volume_path)).await
    }

    async fn node_expand_volume(
        &self,
        r: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let r = r.into_inner();
        let required = r.capacity_range.as_ref().map_or(0, |c| c.required_bytes);
        let line = format!("NodeExpandVolume {} {required}", r.volume_id);
        self.call("NodeExpandVolume", line, move |d| d.expand_now(r)).await
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        use node_service_capability::rpc::Type;
        self.call("NodeGetCapabilities", "NodeGetCapabilities".into(), |d| {
            let mut capabilities = Vec::new();
            if !d.config().no_stage {
                capabilities.push(rpc(Type::StageUnstageVolume));
            }
            capabilities.extend([rpc(Type::GetVolumeStats), rpc(Type::ExpandVolume), rpc(Type::VolumeCondition)]);
            Ok(NodeGetCapabilitiesResponse { capabilities })
        })
        .await
    }

    async fn node_get_info(&self, _: Request<NodeGetInfoRequest>) -> Result<Response<NodeGetInfoResponse>, Status> {
        self.call("NodeGetInfo", "NodeGetInfo".into(), |d| {
            let cfg = d.config();
            Ok(NodeGetInfoResponse {
                node_id: cfg.node_id.clone(),
                max_volumes_per_node: cfg.max_volumes,
                accessible_topology: cfg
                    .topology_key
                    .as_ref()
                    .map(|k| Topology { segments: HashMap::from([(k.clone(), cfg.node_id.clone())]) }),
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("16Mi"), Some(16 << 20));
        assert_eq!(parse_quantity("1G"), Some(1_000_000_000));
        assert_eq!(parse_quantity("1.5Gi"), Some(3 << 29));
        assert_eq!(parse_quantity("1048576"), Some(1 << 20));
        assert_eq!(parse_quantity(" 2k "), Some(2000));
        for bad in ["", "Mi", "12Q", "-1Mi", "1.2.3", "99999999999Ei"] {
            assert_eq!(parse_quantity(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn capabilities() {
        let mount = |fs: &str| VolumeCapability {
            access_type: Some(volume_capability::AccessType::Mount(volume_capability::MountVolume {
                fs_type: fs.into(),
                mount_flags: vec!["noatime".into()],
                volume_mount_group: String::new(),
            })),
            access_mode: None,
        };
        let flags = vec!["noatime".to_owned()];
        assert_eq!(access(Some(&mount(""))).unwrap(), Access::Mount { fs: FsType::Ext4, flags: flags.clone() });
        assert_eq!(access(Some(&mount("ext4"))).unwrap(), Access::Mount { fs: FsType::Ext4, flags: flags.clone() });
        assert_eq!(access(Some(&mount("btrfs"))).unwrap(), Access::Mount { fs: FsType::Btrfs, flags });
        let err = access(Some(&mount("xfs"))).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("\"xfs\""), "{}", err.message());
        let block = VolumeCapability {
            access_type: Some(volume_capability::AccessType::Block(volume_capability::BlockVolume {})),
            access_mode: None,
        };
        assert_eq!(access(Some(&block)).unwrap(), Access::Block);
        assert_eq!(access(None).unwrap_err().code(), tonic::Code::InvalidArgument);
        assert_eq!(mount_options(true, &["noatime".into()]), ["ro", "noatime"]);
        assert!(mount_options(false, &[]).is_empty());
    }
}
