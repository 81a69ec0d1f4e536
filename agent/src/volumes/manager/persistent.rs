//! Volumes backed by PersistentVolumes and CSI drivers: a claim resolved to
//! its bound PV through the API (`persistentVolumeClaim`, and `ephemeral`
//! through the claim made for the pod), and the PV's source set up as the
//! kubelet's plugins do: `hostPath` (the path itself), `local` (bind
//! mounted into the pod's directory, or a device for `volumeMode: Block`)
//! and `csi` (staged and published by the driver). Inline `csi` volumes go
//! straight to the driver.

use std::{
    collections::{BTreeMap, HashMap},
    fs,
    path::{Path, PathBuf},
};

use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, SecretReference, Volume},
    storage::v1::CSIDriver,
};

use super::{MountedVolume, PersistentInfo, VolumeKind, VolumeManager, kinds::LOCAL_VOLUME, namespace_of, uid_of};
use crate::volumes::{
    affinity,
    csi::{
        client::{Capability, VolumeRequest},
        mounter::{self, CsiVolume},
        paths,
    },
    hostpath, mount,
    objects::ObjectError,
};

/// What a volume resolves to.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Source {
    HostPath { path: String, type_: Option<String> },
    Local { path: String, block: bool },
    Csi(Box<CsiSource>),
}

/// A CSI volume before the driver and the attachment are asked.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct CsiSource {
    pub driver: String,
    pub volume_handle: String,
    pub fs_type: String,
    pub attributes: BTreeMap<String, String>,
    pub stage_secret: Option<SecretReference>,
    pub publish_secret: Option<SecretReference>,
    pub access_modes: Vec<String>,
    pub mount_options: Vec<String>,
    pub block: bool,
    pub inline: bool,
}

/// A claim and the PV bound to it, and what the pod's volume says.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Resolved {
    pub source: Source,
    pub read_only: bool,
    /// The name of the directory under the plugin's (the PV's name, or
    /// the volume's for inline volumes).
    pub spec_name: String,
    pub claim: Option<(String, String)>,
    pub pv: Option<String>,
}

fn claim_error(ns: &str, claim: &str, why: impl std::fmt::Display) -> String {
    format!("error processing PVC {ns}/{claim}: {why}")
}

/// The claim's checks before its PV is read, as the kubelet's volume
/// populator makes them.
pub(super) fn check_claim(pvc: &PersistentVolumeClaim, ns: &str, name: &str) -> Result<String, String> {
    if pvc.metadata.deletion_timestamp.is_some() {
        return Err(format!("can't start pod because PVC {ns}/{name} is being deleted"));
    }
    let phase = pvc.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    if phase != "Bound" {
        return Err(claim_error(ns, name, "PVC is not bound"));
    }
    match pvc.spec.as_ref().and_then(|s| s.volume_name.clone()).filter(|v| !v.is_empty()) {
        Some(v) => Ok(v),
        None => Err(claim_error(ns, name, "PVC has empty pvc.Spec.VolumeName")),
    }
}

/// The PV's source as this node mounts it. In-tree plugins other than
/// hostPath and local are not supported.
pub(super) fn pv_source(pv: &PersistentVolume, read_only: bool) -> Result<(Source, bool), String> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let Some(spec) = &pv.spec else { return Err(format!("PersistentVolume {name:?} has no spec")) };
    let block = spec.volume_mode.as_deref() == Some("Block");
    if let Some(h) = &spec.host_path {
        return Ok((Source::HostPath { path: h.path.clone(), type_: h.type_.clone() }, read_only));
    }
    if let Some(l) = &spec.local {
        return Ok((Source::Local { path: l.path.clone(), block }, read_only));
    }
    if let Some(c) = &spec.csi {
        let source = CsiSource {
            driver: c.driver.clone(),
            volume_handle: c.volume_handle.clone(),
            fs_type: c.fs_type.clone().unwrap_or_default(),
            attributes: c.volume_attributes.clone().unwrap_or_default(),
            stage_secret: c.node_stage_secret_ref.clone(),
            publish_secret: c.node_publish_secret_ref.clone(),
            access_modes: spec.access_modes.clone().unwrap_or_default(),
            mount_options: spec.mount_options.clone().unwrap_or_default(),
            block,
            inline: false,
        };
        return Ok((Source::Csi(Box::new(source)), read_only || c.read_only.unwrap_or(false)));
    }
    let json = serde_json::to_value(spec).unwrap_or_default();
    const NOT_SOURCES: &[&str] = &[
        "accessModes",
        "capacity",
        "claimRef",
        "mountOptions",
        "nodeAffinity",
        "persistentVolumeReclaimPolicy",
        "storageClassName",
        "volumeMode",
        "volumeAttributesClassName",
    ];
    let source = json
        .as_object()
        .and_then(|o| o.keys().find(|k| !NOT_SOURCES.contains(&k.as_str())).cloned())
        .unwrap_or_else(|| "none".into());
    Err(format!("PersistentVolume {name:?}: volume type {source} is not supported by this node"))
}

/// Whether the driver needs a VolumeAttachment (a missing CSIDriver
/// object means yes, as upstream).
pub(super) fn attach_required(driver: Option<&CSIDriver>) -> bool {
    driver.and_then(|d| d.spec.attach_required).unwrap_or(true)
}

/// Whether the pod's fsGroup is applied to a CSI volume, by the driver's
/// fsGroupPolicy (the kubelet's `supportsFSGroup`).
pub(super) fn applies_fs_group(
    driver: Option<&CSIDriver>,
    fs_type: &str,
    access_modes: &[String],
    inline: bool,
) -> bool {
    match driver.and_then(|d| d.spec.fs_group_policy.as_deref()).unwrap_or("ReadWriteOnceWithFSType") {
        "File" => true,
        "None" => false,
        _ => !fs_type.is_empty() && (inline || (access_modes.len() == 1 && access_modes[0] == "ReadWriteOnce")),
    }
}

fn secret_strings(s: &k8s_openapi::api::core::v1::Secret) -> HashMap<String, String> {
    let mut out: HashMap<String, String> =
        s.data.iter().flatten().map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned())).collect();
    out.extend(s.string_data.iter().flatten().map(|(k, v)| (k.clone(), v.clone())));
    out
}

impl VolumeManager {
    /// Resolves a claim-backed or CSI volume; `None` for other kinds.
    pub(super) async fn resolve(&self, pod: &Pod, v: &Volume) -> Option<Result<Resolved, String>> {
        let ns = namespace_of(pod);
        let objects = self.objects();
        let claim = if let Some(c) = &v.persistent_volume_claim {
            (c.claim_name.clone(), c.read_only.unwrap_or(false), false)
        } else if v.ephemeral.is_some() {
            (format!("{}-{}", pod.metadata.name.clone().unwrap_or_default(), v.name), false, true)
        } else if let Some(c) = &v.csi {
            let source = CsiSource {
                driver: c.driver.clone(),
                volume_handle: paths::ephemeral_handle(&uid_of(pod), &v.name),
                fs_type: c.fs_type.clone().unwrap_or_default(),
                attributes: c.volume_attributes.clone().unwrap_or_default(),
                stage_secret: None,
                publish_secret: c
                    .node_publish_secret_ref
                    .as_ref()
                    .map(|r| SecretReference { name: Some(r.name.clone()), namespace: Some(ns.clone()) }),
                access_modes: vec![],
                mount_options: vec![],
                block: false,
                inline: true,
            };
            return Some(Ok(Resolved {
                source: Source::Csi(Box::new(source)),
                read_only: c.read_only.unwrap_or(false),
                spec_name: v.name.clone(),
                claim: None,
                pv: None,
            }));
        } else {
            return None;
        };
        let (name, read_only, ephemeral) = claim;
        Some(
            async {
                let pvc = objects.get_pvc(&ns, &name).await.map_err(|e| match e {
                    ObjectError::NotFound { .. } => {
                        claim_error(&ns, &name, format!("failed to fetch PVC from API server: {e}"))
                    }
                    other => claim_error(&ns, &name, other),
                })?;
                if ephemeral {
                    let owned = pvc
                        .metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|o| o.uid == uid_of(pod) && o.controller == Some(true));
                    if !owned {
                        return Err(format!(
                            "error processing PVC {ns}/{name}: PVC was not created for pod {ns}/{} (pod is not owner)",
                            pod.metadata.name.clone().unwrap_or_default()
                        ));
                    }
                }
                let pv_name = check_claim(&pvc, &ns, &name)?;
                let pv = objects.get_pv(&pv_name).await.map_err(|e| {
                    claim_error(&ns, &name, format!("failed to fetch PV {pv_name} from API server: {e}"))
                })?;
                let bound_uid = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|c| c.uid.clone());
                if bound_uid.is_none() || bound_uid != pvc.metadata.uid {
                    return Err(claim_error(
                        &ns,
                        &name,
                        format!("the PV {pv_name} is not bound to this claim (claimRef uid {bound_uid:?})"),
                    ));
                }
                let (source, read_only) = pv_source(&pv, read_only)?;
                if let Source::Local { .. } = &source {
                    affinity::check_node_affinity(&pv, &self.cfg.node_labels).map_err(|e| {
                        format!("volume {pv_name:?} cannot be used on node {}: {e}", self.cfg.node_name)
                    })?;
                }
                Ok(Resolved {
                    source,
                    read_only,
                    spec_name: pv_name.clone(),
                    claim: Some((ns.clone(), name.clone())),
                    pv: Some(pv_name),
                })
            }
            .await,
        )
    }

    /// Sets up a resolved volume.
    pub(super) async fn setup_resolved(&self, pod: &Pod, v: &Volume, r: Resolved) -> Result<MountedVolume, String> {
        let uid = uid_of(pod);
        let info = |block: bool, csi: Option<CsiVolume>| PersistentInfo {
            claim: r.claim.clone(),
            pv: r.pv.clone(),
            read_only: r.read_only,
            block,
            csi,
        };
        match &r.source {
            Source::HostPath { path, type_ } => {
                let (p, t) = (path.clone(), type_.clone());
                tokio::task::spawn_blocking(move || hostpath::prepare(&p, t.as_deref()))
                    .await
                    .map_err(|e| e.to_string())??;
                Ok(MountedVolume::persistent(&v.name, VolumeKind::HostPath, path.into(), info(false, None)))
            }
            Source::Local { path, block: true } => {
                let (p, link) = (
                    PathBuf::from(path),
                    self.pod_dir(&uid).join("volumeDevices").join(LOCAL_VOLUME).join(&r.spec_name),
                );
                tokio::task::spawn_blocking(move || link_block_device(&p, &link))
                    .await
                    .map_err(|e| e.to_string())??;
                Ok(MountedVolume::persistent(&v.name, VolumeKind::Local, path.into(), info(true, None)))
            }
            Source::Local { path, block: false } => {
                let target = self.pod_dir(&uid).join("volumes").join(LOCAL_VOLUME).join(&r.spec_name);
                let (p, t, ro) = (PathBuf::from(path), target.clone(), r.read_only);
                tokio::task::spawn_blocking(move || bind_local(&p, &t, ro)).await.map_err(|e| e.to_string())??;
                let m = MountedVolume::persistent(&v.name, VolumeKind::Local, target, info(false, None));
                if !r.read_only {
                    super::setup::apply_fs_group(pod, &m).await?;
                }
                Ok(m)
            }
            Source::Csi(c) => {
                let csi = self.csi_volume(pod, &r, c).await?;
                let drivers = self.csi_drivers();
                let client = drivers.client(&c.driver).await?;
                let caps = client.capabilities().await?;
                let driver_object = self.objects().get_csi_driver(&c.driver).await.ok();
                let _serial = self.csi_lock.lock().await;
                let target = mounter::mount_volume(
                    &client,
                    caps,
                    &self.root_dir(),
                    &self.pod_dir(&uid),
                    &self.cfg.node_name,
                    &csi,
                )
                .await?;
                let m = MountedVolume::persistent(&v.name, VolumeKind::Csi, target, info(false, Some(csi)));
                if !r.read_only
                    && !caps.volume_mount_group
                    && applies_fs_group(driver_object.as_ref(), &c.fs_type, &c.access_modes, c.inline)
                {
                    super::setup::apply_fs_group(pod, &m).await?;
                }
                Ok(m)
            }
        }
    }

    /// The driver's view of a CSI volume: attachment, secrets, pod info.
    async fn csi_volume(&self, pod: &Pod, r: &Resolved, c: &CsiSource) -> Result<CsiVolume, String> {
        if c.block {
            return Err(format!(
                "volume {:?}: volumeMode Block on CSI volumes is not supported by this node",
                r.spec_name
            ));
        }
        let objects = self.objects();
        let driver = match objects.get_csi_driver(&c.driver).await {
            Ok(d) => Some(d),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(format!("reading CSIDriver {}: {e}", c.driver)),
        };
        if c.inline {
            let modes = driver.as_ref().and_then(|d| d.spec.volume_lifecycle_modes.clone()).unwrap_or_default();
            if !modes.iter().any(|m| m == "Ephemeral") {
                return Err(format!(
                    "volume mode \"Ephemeral\" not supported by driver {} (only supports {modes:?})",
                    c.driver
                ));
            }
        }
        if driver.as_ref().is_some_and(|d| d.spec.token_requests.as_ref().is_some_and(|t| !t.is_empty())) {
            tracing::warn!(
                driver = c.driver,
                "CSIDriver tokenRequests are not implemented: the driver gets no service account token"
            );
        }
        let mut publish_context = HashMap::new();
        let mut attachment_id = None;
        if !c.inline && attach_required(driver.as_ref()) {
            let name = paths::attachment_name(&c.volume_handle, &c.driver, &self.cfg.node_name);
            let va = objects
                .get_volume_attachment(&name)
                .await
                .map_err(|e| format!("AttachVolume.WaitForAttach failed for volume {:?}: {e}", r.spec_name))?;
            let status = va.status.unwrap_or_default();
            if !status.attached {
                let why = status.attach_error.and_then(|e| e.message).unwrap_or_else(|| "not attached yet".into());
                return Err(format!(
                    "AttachVolume.WaitForAttach failed for volume {:?}: volume attachment {name} is not attached: {why}",
                    r.spec_name
                ));
            }
            publish_context = status.attachment_metadata.unwrap_or_default().into_iter().collect();
            attachment_id = Some(name);
        }
        let mut volume_context: HashMap<String, String> = c.attributes.clone().into_iter().collect();
        if driver.as_ref().and_then(|d| d.spec.pod_info_on_mount).unwrap_or(false) {
            let sa = pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "default".into());
            volume_context.extend(paths::pod_info(
                &pod.metadata.name.clone().unwrap_or_default(),
                &namespace_of(pod),
                &uid_of(pod),
                &sa,
                c.inline,
            ));
        }
        let secrets = |r: Option<SecretReference>| {
            let objects = objects.clone();
            let ns = namespace_of(pod);
            async move {
                let Some(r) = r else { return Ok(HashMap::new()) };
                let name = r.name.unwrap_or_default();
                let ns = r.namespace.unwrap_or(ns);
                objects
                    .get_secret(&ns, &name)
                    .await
                    .map(|s| secret_strings(&s))
                    .map_err(|e| format!("fetching the secret {ns}/{name} for the CSI driver: {e}"))
            }
        };
        let fs_group = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()).and_then(|s| s.fs_group);
        Ok(CsiVolume {
            driver: c.driver.clone(),
            volume_handle: c.volume_handle.clone(),
            spec_name: r.spec_name.clone(),
            read_only: r.read_only,
            capability: Capability {
                block: false,
                fs_type: c.fs_type.clone(),
                mount_flags: c.mount_options.clone(),
                access_mode: if c.inline {
                    crate::volumes::csi::api::volume_capability::access_mode::Mode::SingleNodeWriter
                } else {
                    Capability::access_mode_for(&c.access_modes)
                },
                volume_mount_group: fs_group.map(|g| g.to_string()).unwrap_or_default(),
            },
            request: VolumeRequest {
                volume_id: c.volume_handle.clone(),
                publish_context,
                volume_context,
                secrets: secrets(c.publish_secret.clone()).await?,
            },
            stage_secrets: secrets(c.stage_secret.clone()).await?,
            ephemeral: c.inline,
            attachment_id,
            requires_republish: driver.as_ref().and_then(|d| d.spec.requires_republish).unwrap_or(false),
        })
    }
}

/// Bind-mounts a local volume's path into the pod's directory (read-only
/// when the claim or the pod says so); nothing is done when it is already
/// there (an agent restart).
fn bind_local(source: &Path, target: &Path, read_only: bool) -> Result<(), String> {
    let meta = fs::metadata(source).map_err(|e| format!("local volume path {}: {e}", source.display()))?;
    if !meta.is_dir() {
        return Err(format!("local volume path {} is not a directory", source.display()));
    }
    fs::create_dir_all(target).map_err(|e| format!("creating {}: {e}", target.display()))?;
    let table = mount::mount_table().map_err(|e| format!("reading the mount table: {e}"))?;
    if mount::is_mount_point(&table, target) {
        return Ok(());
    }
    mount::bind(source, target, false)
        .map_err(|e| format!("bind-mounting {} at {}: {e}", source.display(), target.display()))?;
    if read_only && let Err(e) = mount::remount_read_only(target) {
        let _ = mount::unmount(target);
        return Err(format!("remounting {} read-only: {e}", target.display()));
    }
    Ok(())
}

/// A block local volume: the path must be a block device; the pod's
/// `volumeDevices` directory gets a link to it, as the kubelet's.
fn link_block_device(device: &Path, link: &Path) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    let meta = fs::metadata(device).map_err(|e| format!("local volume path {}: {e}", device.display()))?;
    if !meta.file_type().is_block_device() {
        return Err(format!("local volume path {} is not a block device (volumeMode: Block)", device.display()));
    }
    if let Some(parent) = link.parent() {
        fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
    }
    match fs::read_link(link) {
        Ok(to) if to == device => Ok(()),
        _ => {
            let _ = fs::remove_file(link);
            std::os::unix::fs::symlink(device, link).map_err(|e| format!("linking {}: {e}", link.display()))
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::{
        core::v1::{
            CSIPersistentVolumeSource, HostPathVolumeSource, LocalVolumeSource, NFSVolumeSource,
            PersistentVolumeClaimSpec, PersistentVolumeClaimStatus, PersistentVolumeSpec,
        },
        storage::v1::CSIDriverSpec,
    };

    use super::*;

    fn claim(phase: Option<&str>, volume: Option<&str>, deleting: bool) -> PersistentVolumeClaim {
        let mut c = PersistentVolumeClaim {
            spec: Some(PersistentVolumeClaimSpec { volume_name: volume.map(Into::into), ..Default::default() }),
            status: Some(PersistentVolumeClaimStatus { phase: phase.map(Into::into), ..Default::default() }),
            ..Default::default()
        };
        if deleting {
            c.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        }
        c
    }

    #[test]
    fn claims_are_checked_as_the_kubelet_checks_them() {
        let cases = [
            (claim(Some("Bound"), Some("pv-1"), false), Ok("pv-1".to_string())),
            (claim(Some("Pending"), None, false), Err("error processing PVC ns/data: PVC is not bound".to_string())),
            (claim(None, None, false), Err("error processing PVC ns/data: PVC is not bound".into())),
            (
                claim(Some("Bound"), Some(""), false),
                Err("error processing PVC ns/data: PVC has empty pvc.Spec.VolumeName".into()),
            ),
            (
                claim(Some("Bound"), Some("pv-1"), true),
                Err("can't start pod because PVC ns/data is being deleted".into()),
            ),
        ];
        for (c, want) in cases {
            assert_eq!(check_claim(&c, "ns", "data"), want);
        }
    }

    fn pv(spec: PersistentVolumeSpec) -> PersistentVolume {
        let mut p = PersistentVolume { spec: Some(spec), ..Default::default() };
        p.metadata.name = Some("pv-1".into());
        p
    }

    #[test]
    fn sources_and_read_only() {
        let host = pv(PersistentVolumeSpec {
            host_path: Some(HostPathVolumeSource { path: "/srv".into(), type_: Some("Directory".into()) }),
            ..Default::default()
        });
        assert_eq!(
            pv_source(&host, true).unwrap(),
            (Source::HostPath { path: "/srv".into(), type_: Some("Directory".into()) }, true)
        );
        let local = pv(PersistentVolumeSpec {
            local: Some(LocalVolumeSource { path: "/dev/loop7".into(), fs_type: None }),
            volume_mode: Some("Block".into()),
            ..Default::default()
        });
        assert_eq!(
            pv_source(&local, false).unwrap(),
            (Source::Local { path: "/dev/loop7".into(), block: true }, false)
        );
        let csi = pv(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: "d".into(),
                volume_handle: "h".into(),
                read_only: Some(true),
                fs_type: Some("ext4".into()),
                ..Default::default()
            }),
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            ..Default::default()
        });
        let (s, ro) = pv_source(&csi, false).unwrap();
        assert!(ro, "the PV's readOnly counts");
        let Source::Csi(c) = s else { panic!("{s:?}") };
        assert_eq!((c.driver.as_str(), c.volume_handle.as_str(), c.fs_type.as_str()), ("d", "h", "ext4"));
        let nfs = pv(PersistentVolumeSpec {
            nfs: Some(NFSVolumeSource { server: "s".into(), path: "/".into(), read_only: None }),
            capacity: Some(Default::default()),
            ..Default::default()
        });
        assert_eq!(
            pv_source(&nfs, false).unwrap_err(),
            "PersistentVolume \"pv-1\": volume type nfs is not supported by this node"
        );
    }

    #[test]
    fn attach_and_fs_group_policies() {
        let d = |attach: Option<bool>, policy: Option<&str>| CSIDriver {
            spec: CSIDriverSpec {
                attach_required: attach,
                fs_group_policy: policy.map(Into::into),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(attach_required(None));
        assert!(attach_required(Some(&d(None, None))));
        assert!(!attach_required(Some(&d(Some(false), None))));
        let rwo = vec!["ReadWriteOnce".to_string()];
        let rwx = vec!["ReadWriteMany".to_string()];
        assert!(applies_fs_group(None, "ext4", &rwo, false));
        assert!(!applies_fs_group(None, "", &rwo, false), "no fsType: not with the default policy");
        assert!(!applies_fs_group(None, "ext4", &rwx, false));
        assert!(applies_fs_group(Some(&d(None, Some("File"))), "", &rwx, false));
        assert!(!applies_fs_group(Some(&d(None, Some("None"))), "ext4", &rwo, false));
        assert!(applies_fs_group(None, "ext4", &[], true), "inline volumes with a fsType");
    }
}
