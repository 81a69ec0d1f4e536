//! What the volumes give each container: its mounts for the runtime (with
//! subPath bind mounts), the objects its environment refers to, and the
//! volume paths for disk accounting.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{MountedVolume, VolumeKind, VolumeManager, VolumeUsage, kinds::quantity_bytes, uid_of};
use crate::{
    cri::api,
    volumes::{
        mounts::{self, VolumePath},
        objects::EnvObjects,
        subpath,
    },
};

impl VolumeManager {
    /// The container's mounts for the runtime: its volumeMounts, with
    /// subPath bind mounts made. The pod's volumes must be set up.
    pub async fn container_mounts(
        &self,
        pod: &Pod,
        c: &Container,
        env: &[(String, String)],
    ) -> Result<Vec<api::Mount>, String> {
        if c.volume_mounts.as_ref().is_none_or(|m| m.is_empty()) {
            return Ok(vec![]);
        }
        let uid = uid_of(pod);
        let Some(state) = self.state(&uid) else {
            return Err("the pod's volumes are not set up".into());
        };
        let volumes: BTreeMap<String, VolumePath> = {
            let st = state.lock().await;
            for m in c.volume_mounts.iter().flatten() {
                if st.volumes.get(&m.name).is_some_and(MountedVolume::block) {
                    return Err(format!(
                        "volume {:?} has volumeMode Block, but is specified in volumeMounts of container {:?}",
                        m.name, c.name
                    ));
                }
            }
            st.volumes
                .values()
                .map(|m| {
                    // A claim mounted read-only (by the pod or its PV) is
                    // read-only in every container.
                    let read_only = matches!(
                        m.kind,
                        VolumeKind::ConfigMap | VolumeKind::Secret | VolumeKind::DownwardApi | VolumeKind::Projected
                    ) || m.persistent.as_ref().is_some_and(|p| p.read_only);
                    (m.name.clone(), VolumePath { path: m.path.clone(), read_only })
                })
                .collect()
        };
        let planned = mounts::plan(c, &volumes, env)?;
        let mut out = vec![];
        for p in planned {
            let host = match &p.sub_path {
                None => p.volume_path.clone(),
                Some(sub) => {
                    let target = self
                        .pod_dir(&uid)
                        .join("volume-subpaths")
                        .join(&p.volume)
                        .join(&c.name)
                        .join(p.index.to_string());
                    let (root, sub) = (p.volume_path.clone(), sub.clone());
                    tokio::task::spawn_blocking(move || subpath::prepare(&root, &sub, &target))
                        .await
                        .map_err(|e| e.to_string())?
                        .map_err(|e| {
                            format!(
                                "failed to prepare subPath for volumeMount {:?} of container {:?}: {e}",
                                p.volume, c.name
                            )
                        })?
                }
            };
            out.push(mounts::cri_mount(&p, &host));
        }
        Ok(out)
    }

    /// The container's `volumeDevices`: block volumes given as devices.
    pub async fn container_devices(&self, pod: &Pod, c: &Container) -> Result<Vec<api::Device>, String> {
        let wanted = c.volume_devices.as_deref().unwrap_or(&[]);
        if wanted.is_empty() {
            return Ok(vec![]);
        }
        let Some(state) = self.state(&uid_of(pod)) else {
            return Err("the pod's volumes are not set up".into());
        };
        let st = state.lock().await;
        wanted
            .iter()
            .map(|d| match st.volumes.get(&d.name) {
                Some(m) if m.block() => Ok(api::Device {
                    container_path: d.device_path.clone(),
                    host_path: m.path.display().to_string(),
                    permissions: if m.persistent.as_ref().is_some_and(|p| p.read_only) { "mr" } else { "mrw" }.into(),
                }),
                Some(_) => Err(format!(
                    "volume {:?} has volumeMode Filesystem, but is specified in volumeDevices of container {:?}",
                    d.name, c.name
                )),
                None => Err(format!("volumeDevices of container {:?}: no volume {:?} is set up", c.name, d.name)),
            })
            .collect()
    }

    /// What a container's environment refers to, from the object source.
    pub async fn env_objects(&self, pod: &Pod, c: &Container) -> EnvObjects {
        EnvObjects::fetch(self.objects().as_ref(), pod, c).await
    }

    /// The volumes of a pod with their paths, for disk accounting.
    pub async fn usage_paths(&self, uid: &str) -> Vec<VolumeUsage> {
        let Some(state) = self.state(uid) else { return vec![] };
        let st = state.lock().await;
        let limits: HashMap<&str, Option<i64>> = st
            .pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .map(|v| (v.name.as_str(), v.empty_dir.as_ref().and_then(|e| quantity_bytes(e.size_limit.as_ref()))))
            .collect();
        st.volumes
            .values()
            .map(|m| VolumeUsage {
                name: m.name.clone(),
                kind: m.kind,
                size_limit: limits.get(m.name.as_str()).copied().flatten(),
                path: m.path.clone(),
            })
            .collect()
    }
}
