//! The node side of one CSI driver: dialed on the endpoint it registered,
//! each call with the kubelet's deadline, errors naming the call.

use std::{collections::HashMap, path::Path, time::Duration};

use tonic::transport::Channel;

use super::api::{
    self,
    identity_client::IdentityClient,
    node_client::NodeClient,
    node_service_capability,
    volume_capability::{self, AccessMode, access_mode},
};
use crate::grpc::{dial_unix, timed};

/// The kubelet's deadline for a CSI operation (csiTimeout).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// The deadline for the calls made at registration (NodeGetInfo), shorter
/// so a stuck driver does not hold the plugin watcher.
pub const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(30);

/// What the node plugin can do (NodeGetCapabilities).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeCapabilities {
    pub stage_unstage: bool,
    pub get_volume_stats: bool,
    pub expand: bool,
    pub volume_condition: bool,
    pub volume_mount_group: bool,
}

/// How a volume is used: a filesystem (with its type and mount options)
/// or a raw block device; read-only or not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capability {
    pub block: bool,
    pub fs_type: String,
    pub mount_flags: Vec<String>,
    /// The PV's access modes decide the CSI access mode.
    pub access_mode: access_mode::Mode,
    /// `VOLUME_MOUNT_GROUP` drivers get the pod's fsGroup here.
    pub volume_mount_group: String,
}

impl Capability {
    /// The kubelet's mapping of a PV's access modes to a CSI access mode
    /// (without the alpha single-node modes).
    pub fn access_mode_for(pv_modes: &[String]) -> access_mode::Mode {
        let has = |m: &str| pv_modes.iter().any(|x| x == m);
        if has("ReadWriteMany") {
            access_mode::Mode::MultiNodeMultiWriter
        } else if has("ReadOnlyMany") {
            access_mode::Mode::MultiNodeReaderOnly
        } else if has("ReadWriteOnce") || has("ReadWriteOncePod") {
            access_mode::Mode::SingleNodeWriter
        } else {
            access_mode::Mode::Unknown
        }
    }

    fn to_api(&self) -> api::VolumeCapability {
        let access_type = if self.block {
            volume_capability::AccessType::Block(volume_capability::BlockVolume {})
        } else {
            volume_capability::AccessType::Mount(volume_capability::MountVolume {
                fs_type: self.fs_type.clone(),
                mount_flags: self.mount_flags.clone(),
                volume_mount_group: self.volume_mount_group.clone(),
            })
        };
        api::VolumeCapability {
            access_mode: Some(AccessMode { mode: self.access_mode as i32 }),
            access_type: Some(access_type),
        }
    }
}

/// One volume's usage (NodeGetVolumeStats).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeStats {
    pub capacity_bytes: Option<i64>,
    pub available_bytes: Option<i64>,
    pub used_bytes: Option<i64>,
    pub inodes: Option<i64>,
    pub inodes_free: Option<i64>,
    pub inodes_used: Option<i64>,
    /// `Some(message)` when the driver reports the volume abnormal.
    pub abnormal: Option<String>,
}

impl VolumeStats {
    fn from_api(r: api::NodeGetVolumeStatsResponse) -> VolumeStats {
        let mut s = VolumeStats::default();
        for u in r.usage {
            match api::volume_usage::Unit::try_from(u.unit).unwrap_or(api::volume_usage::Unit::Unknown) {
                api::volume_usage::Unit::Bytes => {
                    s.capacity_bytes = Some(u.total);
                    s.available_bytes = Some(u.available);
                    s.used_bytes = Some(u.used);
                }
                api::volume_usage::Unit::Inodes => {
                    s.inodes = Some(u.total);
                    s.inodes_free = Some(u.available);
                    s.inodes_used = Some(u.used);
                }
                api::volume_usage::Unit::Unknown => {}
            }
        }
        s.abnormal = r.volume_condition.filter(|c| c.abnormal).map(|c| c.message);
        s
    }
}

/// The arguments of NodeStageVolume and NodePublishVolume that come from
/// the PV (or the inline volume) and the attachment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeRequest {
    pub volume_id: String,
    pub publish_context: HashMap<String, String>,
    pub volume_context: HashMap<String, String>,
    pub secrets: HashMap<String, String>,
}

#[derive(Clone)]
pub struct CsiClient {
    driver: String,
    channel: Channel,
}

impl CsiClient {
    /// Dials the driver `name` on its registered endpoint.
    pub async fn dial(name: &str, endpoint: &Path) -> Result<CsiClient, String> {
        let channel = dial_unix(endpoint, REGISTRATION_TIMEOUT, &format!("CSI driver {name}")).await?;
        Ok(CsiClient { driver: name.to_owned(), channel })
    }

    pub fn driver(&self) -> &str {
        &self.driver
    }

    fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel.clone())
    }

    fn what(&self, call: &str) -> String {
        format!("{call} (driver {})", self.driver)
    }

    pub async fn plugin_info(&self) -> Result<api::GetPluginInfoResponse, String> {
        let mut c = IdentityClient::new(self.channel.clone());
        timed(&self.what("GetPluginInfo"), REGISTRATION_TIMEOUT, c.get_plugin_info(api::GetPluginInfoRequest {})).await
    }

    pub async fn node_info(&self) -> Result<api::NodeGetInfoResponse, String> {
        timed(&self.what("NodeGetInfo"), REGISTRATION_TIMEOUT, self.node().node_get_info(api::NodeGetInfoRequest {}))
            .await
    }

    pub async fn capabilities(&self) -> Result<NodeCapabilities, String> {
        use node_service_capability::rpc::Type;
        let r = timed(
            &self.what("NodeGetCapabilities"),
            CALL_TIMEOUT,
            self.node().node_get_capabilities(api::NodeGetCapabilitiesRequest {}),
        )
        .await?;
        let mut caps = NodeCapabilities::default();
        for c in r.capabilities {
            let Some(node_service_capability::Type::Rpc(rpc)) = c.r#type else { continue };
            match Type::try_from(rpc.r#type).unwrap_or(Type::Unknown) {
                Type::StageUnstageVolume => caps.stage_unstage = true,
                Type::GetVolumeStats => caps.get_volume_stats = true,
                Type::ExpandVolume => caps.expand = true,
                Type::VolumeCondition => caps.volume_condition = true,
                Type::VolumeMountGroup => caps.volume_mount_group = true,
                _ => {}
            }
        }
        Ok(caps)
    }

    pub async fn stage(&self, req: &VolumeRequest, staging_path: &Path, cap: &Capability) -> Result<(), String> {
        let request = api::NodeStageVolumeRequest {
            volume_id: req.volume_id.clone(),
            publish_context: req.publish_context.clone(),
            staging_target_path: staging_path.display().to_string(),
            volume_capability: Some(cap.to_api()),
            secrets: req.secrets.clone(),
            volume_context: req.volume_context.clone(),
        };
        timed(&self.what("NodeStageVolume"), CALL_TIMEOUT, self.node().node_stage_volume(request)).await.map(drop)
    }

    pub async fn unstage(&self, volume_id: &str, staging_path: &Path) -> Result<(), String> {
        let request = api::NodeUnstageVolumeRequest {
            volume_id: volume_id.to_owned(),
            staging_target_path: staging_path.display().to_string(),
        };
        timed(&self.what("NodeUnstageVolume"), CALL_TIMEOUT, self.node().node_unstage_volume(request)).await.map(drop)
    }

    pub async fn publish(
        &self,
        req: &VolumeRequest,
        staging_path: Option<&Path>,
        target_path: &Path,
        cap: &Capability,
        read_only: bool,
    ) -> Result<(), String> {
        let request = api::NodePublishVolumeRequest {
            volume_id: req.volume_id.clone(),
            publish_context: req.publish_context.clone(),
            staging_target_path: staging_path.map(|p| p.display().to_string()).unwrap_or_default(),
            target_path: target_path.display().to_string(),
            volume_capability: Some(cap.to_api()),
            readonly: read_only,
            secrets: req.secrets.clone(),
            volume_context: req.volume_context.clone(),
        };
        timed(&self.what("NodePublishVolume"), CALL_TIMEOUT, self.node().node_publish_volume(request)).await.map(drop)
    }

    pub async fn unpublish(&self, volume_id: &str, target_path: &Path) -> Result<(), String> {
        let request = api::NodeUnpublishVolumeRequest {
            volume_id: volume_id.to_owned(),
            target_path: target_path.display().to_string(),
        };
        timed(&self.what("NodeUnpublishVolume"), CALL_TIMEOUT, self.node().node_unpublish_volume(request))
            .await
            .map(drop)
    }

    pub async fn volume_stats(
        &self,
        volume_id: &str,
        volume_path: &Path,
        staging_path: Option<&Path>,
    ) -> Result<VolumeStats, String> {
        let request = api::NodeGetVolumeStatsRequest {
            volume_id: volume_id.to_owned(),
            volume_path: volume_path.display().to_string(),
            staging_target_path: staging_path.map(|p| p.display().to_string()).unwrap_or_default(),
        };
        timed(&self.what("NodeGetVolumeStats"), CALL_TIMEOUT, self.node().node_get_volume_stats(request))
            .await
            .map(VolumeStats::from_api)
    }

    /// NodeExpandVolume to `bytes`; returns the size the driver reports.
    pub async fn expand(
        &self,
        req: &VolumeRequest,
        volume_path: &Path,
        staging_path: Option<&Path>,
        cap: &Capability,
        bytes: i64,
    ) -> Result<i64, String> {
        let request = api::NodeExpandVolumeRequest {
            volume_id: req.volume_id.clone(),
            volume_path: volume_path.display().to_string(),
            capacity_range: Some(api::CapacityRange { required_bytes: bytes, limit_bytes: 0 }),
            staging_target_path: staging_path.map(|p| p.display().to_string()).unwrap_or_default(),
            volume_capability: Some(cap.to_api()),
            secrets: req.secrets.clone(),
        };
        let r = timed(&self.what("NodeExpandVolume"), CALL_TIMEOUT, self.node().node_expand_volume(request)).await?;
        Ok(if r.capacity_bytes > 0 { r.capacity_bytes } else { bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_modes_map_as_the_kubelet_maps_them() {
        let m = |v: &[&str]| Capability::access_mode_for(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(m(&["ReadWriteOnce"]), access_mode::Mode::SingleNodeWriter);
        assert_eq!(m(&["ReadWriteOncePod"]), access_mode::Mode::SingleNodeWriter);
        assert_eq!(m(&["ReadOnlyMany"]), access_mode::Mode::MultiNodeReaderOnly);
        assert_eq!(m(&["ReadWriteOnce", "ReadWriteMany"]), access_mode::Mode::MultiNodeMultiWriter);
        assert_eq!(m(&[]), access_mode::Mode::Unknown);
    }

    #[test]
    fn stats_read_bytes_inodes_and_condition() {
        let r = api::NodeGetVolumeStatsResponse {
            usage: vec![
                api::VolumeUsage { available: 10, total: 30, used: 20, unit: api::volume_usage::Unit::Bytes as i32 },
                api::VolumeUsage { available: 1, total: 3, used: 2, unit: api::volume_usage::Unit::Inodes as i32 },
            ],
            volume_condition: Some(api::VolumeCondition { abnormal: true, message: "gone".into() }),
        };
        let s = VolumeStats::from_api(r);
        assert_eq!((s.capacity_bytes, s.available_bytes, s.used_bytes), (Some(30), Some(10), Some(20)));
        assert_eq!((s.inodes, s.inodes_free, s.inodes_used), (Some(3), Some(1), Some(2)));
        assert_eq!(s.abnormal.as_deref(), Some("gone"));
    }
}
