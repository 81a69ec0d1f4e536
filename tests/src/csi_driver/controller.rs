//! The Controller service: volumes are sparse images under
//! `<state>/volumes/`, an attachment is a file `<state>/attached/<id>@<node>`.

use std::{collections::HashMap, path::PathBuf};

use swiftlet::volumes::csi::api::{self, *};
use tonic::{Request, Response, Status};

use super::{
    ATTACHED_KEY, Driver, IMAGE_KEY, check_volume_id,
    filesystems::{self, BTRFS_MIN_RESIZE, FsType},
    image_size, loopdev,
};

fn rpc(t: controller_service_capability::rpc::Type) -> ControllerServiceCapability {
    ControllerServiceCapability {
        r#type: Some(controller_service_capability::Type::Rpc(controller_service_capability::Rpc { r#type: t as i32 })),
    }
}

/// (required, limit) of a capacity range, refusing negative sizes.
fn range(r: Option<&CapacityRange>) -> Result<(u64, u64), Status> {
    let (required, limit) = r.map(|c| (c.required_bytes, c.limit_bytes)).unwrap_or((0, 0));
    match (u64::try_from(required), u64::try_from(limit)) {
        (Ok(required), Ok(limit)) => Ok((required, limit)),
        _ => Err(Status::invalid_argument(format!("negative capacity range {required}..{limit}"))),
    }
}

fn bytes(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Driver {
    fn attached_dir(&self) -> PathBuf {
        self.state().join("attached")
    }

    fn volume(&self, id: &str, capacity: u64) -> Volume {
        let cfg = self.config();
        Volume {
            capacity_bytes: bytes(capacity),
            volume_id: id.to_owned(),
            volume_context: HashMap::from([(IMAGE_KEY.to_owned(), self.volume_image(id).display().to_string())]),
            content_source: None,
            accessible_topology: cfg
                .topology_key
                .iter()
                .map(|k| Topology { segments: HashMap::from([(k.clone(), cfg.node_id.clone())]) })
                .collect(),
        }
    }

    fn create_volume_now(&self, r: CreateVolumeRequest) -> Result<CreateVolumeResponse, Status> {
        check_volume_id(&r.name).map_err(|_| Status::invalid_argument(format!("bad volume name {:?}", r.name)))?;
        if r.volume_content_source.is_some() {
            return Err(Status::invalid_argument("this driver makes no volumes from snapshots or clones"));
        }
        let (required, limit) = range(r.capacity_range.as_ref())?;
        let size = image_size(required);
        if limit > 0 && size > limit {
            return Err(Status::out_of_range(format!("{size} bytes (the smallest this driver makes) exceed {limit}")));
        }
        let _g = self.exclusive();
        let image = self.volume_image(&r.name);
        let capacity = match std::fs::metadata(&image) {
            Ok(m) if m.len() < size || (limit > 0 && m.len() > limit) => {
                return Err(Status::already_exists(format!(
                    "volume {} exists with {} bytes, not {size}",
                    r.name,
                    m.len()
                )));
            }
            Ok(m) => m.len(),
            Err(_) => loopdev::grow_image(&image, size)?,
        };
        Ok(CreateVolumeResponse { volume: Some(self.volume(&r.name, capacity)) })
    }

    fn delete_volume_now(&self, id: &str) -> Result<DeleteVolumeResponse, Status> {
        check_volume_id(id)?;
        let _g = self.exclusive();
        let image = self.volume_image(id);
        if let Some(l) = loopdev::find(&image).first() {
            return Err(Status::failed_precondition(format!(
                "volume {id} is in use: attached to {}",
                l.device.display()
            )));
        }
        match std::fs::remove_file(&image) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Status::internal(format!("cannot remove {}: {e}", image.display()))),
        }
        self.remove_attachments(id, None)?;
        Ok(DeleteVolumeResponse {})
    }

    /// Removes `<id>@<node>`, or every attachment of `id` without a node.
    fn remove_attachments(&self, id: &str, node: Option<&str>) -> Result<(), Status> {
        let Ok(entries) = std::fs::read_dir(self.attached_dir()) else { return Ok(()) };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some((vol, n)) = name.rsplit_once('@') else { continue };
            if vol == id && node.is_none_or(|node| node == n) {
                match std::fs::remove_file(e.path()) {
                    Ok(()) => {}
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                    Err(err) => return Err(Status::internal(format!("cannot remove {}: {err}", e.path().display()))),
                }
            }
        }
        Ok(())
    }

    fn controller_publish_now(&self, id: &str, node: &str) -> Result<ControllerPublishVolumeResponse, Status> {
        check_volume_id(id)?;
        if node.is_empty() || node.contains('/') {
            return Err(Status::invalid_argument(format!("bad node_id {node:?}")));
        }
        let _g = self.exclusive();
        if !self.volume_image(id).exists() {
            return Err(Status::not_found(format!("no volume {id}")));
        }
        let dir = self.attached_dir();
        let record = dir.join(format!("{id}@{node}"));
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(&record, node))
            .map_err(|e| Status::internal(format!("cannot write {}: {e}", record.display())))?;
        Ok(ControllerPublishVolumeResponse {
            publish_context: HashMap::from([(ATTACHED_KEY.to_owned(), node.to_owned())]),
        })
    }

    fn controller_expand_now(
        &self,
        id: &str,
        range_: Option<&CapacityRange>,
    ) -> Result<ControllerExpandVolumeResponse, Status> {
        check_volume_id(id)?;
        let (required, limit) = range(range_)?;
        let mut size = image_size(required);
        let _g = self.exclusive();
        let image = self.volume_image(id);
        let Ok(now) = std::fs::metadata(&image).map(|m| m.len()) else {
            return Err(Status::not_found(format!("no volume {id}")));
        };
        // The kernel grows a btrfs to no less than 256 MiB: a smaller
        // growth is rounded up (the capacity is at least what was asked).
        let mut why = "";
        if size > now
            && size < BTRFS_MIN_RESIZE
            && filesystems::detect(&image)?.as_deref() == Some(FsType::Btrfs.name())
        {
            size = BTRFS_MIN_RESIZE;
            why = " (a btrfs grows to 256 MiB at least)";
        }
        if limit > 0 && size > limit {
            return Err(Status::out_of_range(format!("{size} bytes exceed {limit}{why}")));
        }
        let capacity = loopdev::grow_image(&image, size)?;
        Ok(ControllerExpandVolumeResponse { capacity_bytes: bytes(capacity), node_expansion_required: true })
    }
}

fn unimplemented<T>(what: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!("{what} is not implemented by this driver")))
}

#[tonic::async_trait]
impl api::controller_server::Controller for Driver {
    async fn create_volume(&self, r: Request<CreateVolumeRequest>) -> Result<Response<CreateVolumeResponse>, Status> {
        let r = r.into_inner();
        let required = r.capacity_range.as_ref().map_or(0, |c| c.required_bytes);
        self.call("CreateVolume", format!("CreateVolume {} {required}", r.name), move |d| d.create_volume_now(r)).await
    }

    async fn delete_volume(&self, r: Request<DeleteVolumeRequest>) -> Result<Response<DeleteVolumeResponse>, Status> {
        let id = r.into_inner().volume_id;
        self.call("DeleteVolume", format!("DeleteVolume {id}"), move |d| d.delete_volume_now(&id)).await
    }

    async fn controller_publish_volume(
        &self,
        r: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        let r = r.into_inner();
        let line = format!("ControllerPublishVolume {} {}", r.volume_id, r.node_id);
        self.call("ControllerPublishVolume", line, move |d| d.controller_publish_now(&r.volume_id, &r.node_id)).await
    }

    async fn controller_unpublish_volume(
        &self,
        r: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        let r = r.into_inner();
        let line = format!("ControllerUnpublishVolume {} {}", r.volume_id, r.node_id);
        self.call("ControllerUnpublishVolume", line, move |d| {
            check_volume_id(&r.volume_id)?;
            let _g = d.exclusive();
            let node = (!r.node_id.is_empty()).then_some(r.node_id.as_str());
            d.remove_attachments(&r.volume_id, node)?;
            Ok(ControllerUnpublishVolumeResponse {})
        })
        .await
    }

    async fn validate_volume_capabilities(
        &self,
        _: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        unimplemented("ValidateVolumeCapabilities")
    }

    async fn list_volumes(&self, _: Request<ListVolumesRequest>) -> Result<Response<ListVolumesResponse>, Status> {
        unimplemented("ListVolumes")
    }

    async fn get_capacity(&self, _: Request<GetCapacityRequest>) -> Result<Response<GetCapacityResponse>, Status> {
        unimplemented("GetCapacity")
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        use controller_service_capability::rpc::Type;
        self.call("ControllerGetCapabilities", "ControllerGetCapabilities".into(), |_| {
            Ok(ControllerGetCapabilitiesResponse {
                capabilities: vec![
                    rpc(Type::CreateDeleteVolume),
                    rpc(Type::PublishUnpublishVolume),
                    rpc(Type::ExpandVolume),
                ],
            })
        })
        .await
    }

    async fn create_snapshot(
        &self,
        _: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        unimplemented("CreateSnapshot")
    }

    async fn delete_snapshot(
        &self,
        _: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        unimplemented("DeleteSnapshot")
    }

    async fn list_snapshots(
        &self,
        _: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        unimplemented("ListSnapshots")
    }

    async fn controller_expand_volume(
        &self,
        r: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let r = r.into_inner();
        let required = r.capacity_range.as_ref().map_or(0, |c| c.required_bytes);
        let line = format!("ControllerExpandVolume {} {required}", r.volume_id);
        self.call("ControllerExpandVolume", line, move |d| {
            d.controller_expand_now(&r.volume_id, r.capacity_range.as_ref())
        })
        .await
    }

    async fn controller_get_volume(
        &self,
        _: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        unimplemented("ControllerGetVolume")
    }

    async fn controller_modify_volume(
        &self,
        _: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        unimplemented("ControllerModifyVolume")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_ranges() {
        assert_eq!(range(None).unwrap(), (0, 0));
        assert_eq!(range(Some(&CapacityRange { required_bytes: 5, limit_bytes: 9 })).unwrap(), (5, 9));
        assert!(range(Some(&CapacityRange { required_bytes: -1, limit_bytes: 0 })).is_err());
    }
}
