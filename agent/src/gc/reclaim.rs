//! Node-level disk reclaim before any pod is evicted for disk pressure:
//! the eviction manager's [`NodeReclaimer`], as the kubelet's
//! `buildSignalToNodeReclaimFuncs`:
//!
//! | signal | imagefs on nodefs | separate imagefs |
//! |---|---|---|
//! | nodefs.available, nodefs.inodesFree | dead containers, then unused images | nothing (logs are not reclaimed) |
//! | imagefs.available, imagefs.inodesFree | dead containers, then unused images | dead containers, then unused images |
//!
//! "Dead containers" is [`ContainerGc::delete_all_unused_containers`]:
//! every dead container of pods that will not run again, and all but the
//! most recent per container name for the others (as the kubelet: the
//! last one carries the restart count and `lastState`); removing
//! containers first releases their images. "Unused images" is every image
//! no container refers to, past the minimum GC age.

use std::{
    future::Future,
    path::{Path, PathBuf},
    pin::Pin,
    sync::Arc,
};

use tracing::{info, warn};

use super::collector::ContainerGc;
use crate::{cri::ImageService, eviction::driver::NodeReclaimer, eviction::signal::EvictionSignal, images::ImageGc};

/// Where the runtime keeps its images, as the kubelet learns it (the CRI
/// ImageFsInfo's mountpoint): Some when that is a filesystem of its own,
/// None when it is nodefs (the filesystem of `nodefs`, the root dir) or
/// the runtime says nothing usable. imagefs is then watched there, and
/// its pressure reclaims images as the table above says.
pub async fn locate_imagefs(images: &dyn ImageService, nodefs: &Path) -> Option<PathBuf> {
    let filesystems = match images.image_fs_info().await {
        Ok(f) => f,
        Err(e) => {
            warn!("ImageFsInfo failed; imagefs is taken to be nodefs: {e}");
            return None;
        }
    };
    let mountpoint =
        filesystems.iter().find_map(|f| f.fs_id.as_ref().map(|id| id.mountpoint.clone()).filter(|m| !m.is_empty()))?;
    let mountpoint = PathBuf::from(mountpoint);
    match separate_filesystems(nodefs, &mountpoint) {
        Ok(true) => {
            info!(imagefs = %mountpoint.display(), "the runtime's images are on a filesystem of their own");
            Some(mountpoint)
        }
        Ok(false) => None,
        Err(e) => {
            warn!(imagefs = %mountpoint.display(), "cannot tell the image filesystem from nodefs: {e}");
            None
        }
    }
}

/// Whether two paths lie on different filesystems (device ids differ).
fn separate_filesystems(a: &Path, b: &Path) -> std::io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata(a)?.dev() != std::fs::metadata(b)?.dev())
}

/// What one reclaim freed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReclaimReport {
    pub containers_removed: usize,
    pub sandboxes_removed: usize,
    pub images_removed: usize,
    /// The removed images' sizes as the runtime reported them.
    pub image_bytes_freed: u64,
}

/// Construct with the two collectors and hand to the eviction manager:
///
/// ```text
/// let reclaimer = Arc::new(DiskReclaimer::new(container_gc.clone(), image_gc.clone(), imagefs_path.is_some()));
/// EvictionManager::new(cfg, ..., Some(reclaimer as Arc<dyn NodeReclaimer>), metrics);
/// ```
pub struct DiskReclaimer {
    containers: Arc<ContainerGc>,
    images: Arc<ImageGc>,
    separate_imagefs: bool,
}

impl DiskReclaimer {
    pub fn new(containers: Arc<ContainerGc>, images: Arc<ImageGc>, separate_imagefs: bool) -> DiskReclaimer {
        DiskReclaimer { containers, images, separate_imagefs }
    }

    /// Whether pressure on `signal` is relieved by removing containers and
    /// images.
    pub fn reclaims(&self, signal: EvictionSignal) -> bool {
        match signal {
            EvictionSignal::ImageFsAvailable | EvictionSignal::ImageFsInodesFree => true,
            EvictionSignal::NodeFsAvailable | EvictionSignal::NodeFsInodesFree => !self.separate_imagefs,
            _ => false,
        }
    }

    /// Reclaims for `signal` and says what was freed.
    pub async fn reclaim_for(&self, signal: EvictionSignal) -> ReclaimReport {
        let mut report = ReclaimReport::default();
        if !self.reclaims(signal) {
            return report;
        }
        match self.containers.delete_all_unused_containers().await {
            Ok(r) => {
                report.containers_removed = r.containers_removed.len();
                report.sandboxes_removed = r.sandboxes_removed.len();
            }
            Err(e) => warn!(%signal, "reclaim: cannot remove dead containers: {e}"),
        }
        match self.images.delete_unused_images().await {
            Ok(r) => {
                report.images_removed = r.removed.len();
                report.image_bytes_freed = r.freed_bytes;
            }
            Err(e) => warn!(%signal, "reclaim: cannot remove unused images: {e}"),
        }
        info!(
            %signal,
            containers = report.containers_removed,
            sandboxes = report.sandboxes_removed,
            images = report.images_removed,
            image_bytes = report.image_bytes_freed,
            "reclaimed node-level disk resources"
        );
        report
    }
}

impl NodeReclaimer for DiskReclaimer {
    fn reclaim<'a>(&'a self, signal: EvictionSignal) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(async move {
            self.reclaim_for(signal).await;
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::ObjectReference;

    use super::*;
    use crate::{
        cri::{
            RuntimeService as _, api,
            fake::FakeRuntime,
            labels::{PodIdentity, container_labels, sandbox_labels},
        },
        events::LogRecorder,
        gc::{ActivePods, GcPolicy},
        images::ImageGcPolicy,
    };

    struct Gone;
    impl ActivePods for Gone {
        fn all_sources_ready(&self) -> bool {
            true
        }
        fn is_active(&self, _uid: &str) -> bool {
            false
        }
    }

    #[tokio::test]
    async fn imagefs_is_where_the_runtime_says_if_it_is_not_nodefs() {
        let nodefs = std::env::temp_dir();
        let same = nodefs.join("imagefs-on-nodefs");
        std::fs::create_dir_all(&same).unwrap();
        // (ImageFsInfo's mountpoint, where imagefs is watched)
        let cases: [(&str, Option<&str>); 4] =
            [(same.to_str().unwrap(), None), ("/proc", Some("/proc")), ("", None), ("/no/such/mountpoint", None)];
        for (mountpoint, want) in cases {
            let rt = FakeRuntime::new();
            rt.set_image_fs(mountpoint, Some(1), Some(1));
            assert_eq!(locate_imagefs(&rt, &nodefs).await.as_deref(), want.map(Path::new), "{mountpoint:?}");
        }
        let _ = std::fs::remove_dir(&same);
    }

    #[tokio::test(start_paused = true)]
    async fn dead_containers_then_their_images() {
        let rt = Arc::new(FakeRuntime::new());
        rt.add_image("app:1", 300);
        rt.add_image("unused:1", 700);
        rt.add_image("pause:3.9", 1);
        let id = PodIdentity { uid: "u".into(), namespace: "ns".into(), name: "p".into() };
        let sb_cfg = api::PodSandboxConfig { labels: sandbox_labels(&id, &Default::default()), ..Default::default() };
        let sb = rt.run_pod_sandbox(sb_cfg.clone(), "").await.unwrap();
        let cfg = api::ContainerConfig {
            metadata: Some(api::ContainerMetadata { name: "app".into(), attempt: 0 }),
            image: Some(api::ImageSpec { image: "app:1".into(), ..Default::default() }),
            labels: container_labels(&id, "app"),
            ..Default::default()
        };
        let c = rt.create_container(&sb, cfg, sb_cfg).await.unwrap();
        rt.start_container(&c).await.unwrap();
        rt.stop_pod_sandbox(&sb).await.unwrap();
        let containers =
            Arc::new(ContainerGc::new(rt.clone(), Arc::new(Gone), GcPolicy::default(), "/nonexistent".into()));
        let images = Arc::new(ImageGc::new(
            rt.clone(),
            rt.clone(),
            ImageGcPolicy { pinned_images: vec!["pause:3.9".into()], ..Default::default() },
            Arc::new(LogRecorder),
            ObjectReference::default(),
        ));
        images.detect().await.unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        let separate = DiskReclaimer::new(containers.clone(), images.clone(), true);
        assert_eq!(separate.reclaim_for(EvictionSignal::NodeFsAvailable).await, ReclaimReport::default());
        assert_eq!(separate.reclaim_for(EvictionSignal::MemoryAvailable).await, ReclaimReport::default());
        let shared = DiskReclaimer::new(containers, images, false);
        let r = shared.reclaim_for(EvictionSignal::NodeFsAvailable).await;
        assert_eq!(
            r,
            ReclaimReport { containers_removed: 1, sandboxes_removed: 1, images_removed: 2, image_bytes_freed: 1000 }
        );
        assert_eq!(rt.image_names(), ["docker.io/library/pause:3.9"]);
    }
}
