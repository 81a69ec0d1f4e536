//! The image garbage collector: runs the plan of [`super::gc`] against
//! the runtime every 5 minutes (the kubelet's ImageGCPeriod), and on
//! demand for disk-pressure reclaim.
//!
//! Construct once, share, and run:
//!
//! ```text
//! let image_gc = Arc::new(ImageGc::new(
//!     agent.cri.clone(),                       // Arc<dyn ImageService>
//!     agent.cri.clone(),                       // Arc<dyn RuntimeService>
//!     ImageGcPolicy::from_kubelet(&config.kubelet, pinned /* e.g. the sandbox image */),
//!     recorder.clone(),
//!     node_ref,                                // events FreeDiskSpaceFailed / ImageGCFailed
//! ));
//! tokio::spawn(image_gc.clone().run(shutdown.clone()));
//! ```
//!
//! The image filesystem is the one holding ImageFsInfo's mountpoint
//! (containerd: its snapshotter root), measured with statfs as the
//! kubelet's cadvisor does.

use std::{path::Path, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::ObjectReference;
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    gc::{FsUsage, GcPlan, ImageGcPolicy, ImageRecords, PlanError, images_in_use, plan},
    metrics::ImageMetrics,
};
use crate::{
    cri::{CriError, ImageService, RuntimeService},
    events::{EventRecorder, EventType},
    signals::node::{FsStats, statfs},
};

/// The kubelet's ImageGCPeriod.
pub const IMAGE_GC_PERIOD: Duration = Duration::from_secs(5 * 60);

pub mod event {
    /// Not enough could be freed to reach the low threshold.
    pub const FREE_DISK_SPACE_FAILED: &str = "FreeDiskSpaceFailed";
    /// Image GC failed twice in a row.
    pub const IMAGE_GC_FAILED: &str = "ImageGCFailed";
}

#[derive(Debug, thiserror::Error)]
pub enum ImageGcError {
    #[error("{0}")]
    Cri(#[from] CriError),
    #[error("image filesystem: {0}")]
    Fs(String),
    #[error("{0}")]
    Plan(#[from] PlanError),
    #[error(
        "Failed to garbage collect required amount of images. Attempted to free {wanted} bytes, but only found {freed} bytes eligible to free."
    )]
    NotEnough { wanted: u64, freed: u64 },
}

/// What one collection did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageGcReport {
    /// Image ids removed, with why ("age" or "space").
    pub removed: Vec<(String, &'static str)>,
    pub freed_bytes: u64,
    /// The image filesystem's usage before, percent (None for a reclaim).
    pub usage_percent: Option<u8>,
    pub bytes_to_free: u64,
}

type StatFs = dyn Fn(&Path) -> std::io::Result<FsStats> + Send + Sync;

pub struct ImageGc {
    images: Arc<dyn ImageService>,
    runtime: Arc<dyn RuntimeService>,
    policy: ImageGcPolicy,
    recorder: Arc<dyn EventRecorder>,
    node: ObjectReference,
    records: Mutex<ImageRecords>,
    started: Instant,
    statfs: Box<StatFs>,
    metrics: Option<ImageMetrics>,
    /// One collection at a time (the periodic one and a reclaim).
    busy: tokio::sync::Mutex<()>,
}

impl ImageGc {
    pub fn new(
        images: Arc<dyn ImageService>,
        runtime: Arc<dyn RuntimeService>,
        policy: ImageGcPolicy,
        recorder: Arc<dyn EventRecorder>,
        node: ObjectReference,
    ) -> ImageGc {
        ImageGc {
            images,
            runtime,
            policy,
            recorder,
            node,
            records: Mutex::new(ImageRecords::default()),
            started: Instant::now(),
            statfs: Box::new(statfs),
            metrics: None,
            busy: tokio::sync::Mutex::new(()),
        }
    }

    pub fn with_metrics(mut self, metrics: ImageMetrics) -> ImageGc {
        self.metrics = Some(metrics);
        self
    }

    /// Replaces statfs (tests give the image filesystem any size).
    pub fn with_statfs(mut self, f: impl Fn(&Path) -> std::io::Result<FsStats> + Send + Sync + 'static) -> ImageGc {
        self.statfs = Box::new(f);
        self
    }

    pub fn policy(&self) -> &ImageGcPolicy {
        &self.policy
    }

    /// Lists images and containers and updates the records; returns the
    /// ids in use. The first detection dates every image to the beginning
    /// of time.
    pub async fn detect(&self) -> Result<std::collections::HashSet<String>, CriError> {
        let images = self.images.list_images().await?;
        let containers = self.runtime.list_containers(None).await?;
        let in_use = images_in_use(&images, &containers, &self.policy.pinned_images);
        self.records.lock().detect(&images, &in_use, Instant::now());
        Ok(in_use)
    }

    async fn image_fs(&self) -> Result<FsUsage, ImageGcError> {
        let fs = self.images.image_fs_info().await?;
        let mountpoint = fs
            .iter()
            .find_map(|f| f.fs_id.as_ref().map(|id| id.mountpoint.clone()).filter(|m| !m.is_empty()))
            .ok_or_else(|| ImageGcError::Fs("the runtime reported no image filesystem".into()))?;
        let st = (self.statfs)(Path::new(&mountpoint)).map_err(|e| ImageGcError::Fs(format!("{mountpoint}: {e}")))?;
        Ok(FsUsage { capacity_bytes: st.capacity_bytes, available_bytes: st.available_bytes })
    }

    async fn remove(&self, id: &str, reason: &'static str, report: &mut ImageGcReport, size: u64) -> bool {
        match self.images.remove_image(id).await {
            Ok(()) => {
                info!(image = id, reason, size, "removed unused image");
                self.records.lock().forget(id);
                if let Some(m) = &self.metrics {
                    m.count_gc(reason);
                }
                report.removed.push((id.to_owned(), reason));
                report.freed_bytes = report.freed_bytes.saturating_add(size);
                true
            }
            Err(e) => {
                warn!(image = id, "failed to remove image: {e}");
                false
            }
        }
    }

    /// Removes what the plan says; returns the report and the bytes freed
    /// for space (not counting removals by age).
    async fn execute(&self, p: GcPlan) -> (ImageGcReport, u64) {
        let mut report =
            ImageGcReport { usage_percent: p.usage_percent, bytes_to_free: p.bytes_to_free, ..Default::default() };
        for c in &p.by_age {
            self.remove(&c.id, "age", &mut report, c.size).await;
        }
        let mut freed = 0u64;
        for c in &p.by_space {
            if freed >= p.bytes_to_free {
                break;
            }
            if self.remove(&c.id, "space", &mut report, c.size).await {
                freed = freed.saturating_add(c.size);
            }
        }
        (report, freed)
    }

    /// One periodic collection: by age, then by space if usage is at or
    /// above the high threshold.
    pub async fn garbage_collect(&self) -> Result<ImageGcReport, ImageGcError> {
        let _busy = self.busy.lock().await;
        let in_use = self.detect().await?;
        let fs = self.image_fs().await?;
        let p = {
            let records = self.records.lock();
            plan(&self.policy, &records, &in_use, Some(fs), Instant::now(), self.started)?
        };
        if p.bytes_to_free > 0 {
            info!(
                usage = p.usage_percent,
                high_threshold = self.policy.high_threshold_percent,
                low_threshold = self.policy.low_threshold_percent,
                amount_to_free = p.bytes_to_free,
                "disk usage on the image filesystem is over the high threshold, freeing down to the low threshold"
            );
        }
        let wanted = p.bytes_to_free;
        let (report, freed) = self.execute(p).await;
        if freed < wanted {
            let e = ImageGcError::NotEnough { wanted, freed };
            self.recorder.record(&self.node, EventType::Warning, event::FREE_DISK_SPACE_FAILED, &e.to_string());
            return Err(e);
        }
        Ok(report)
    }

    /// Removes every unused image past the minimum age, whatever the
    /// usage (the kubelet's `DeleteUnusedImages`, for disk pressure).
    pub async fn delete_unused_images(&self) -> Result<ImageGcReport, ImageGcError> {
        let _busy = self.busy.lock().await;
        let in_use = self.detect().await?;
        let p = {
            let records = self.records.lock();
            plan(&self.policy, &records, &in_use, None, Instant::now(), self.started)?
        };
        Ok(self.execute(p).await.0)
    }

    /// Detects at once (dating present images to the beginning of time),
    /// then collects every [`IMAGE_GC_PERIOD`] until `shutdown` is cancelled.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        self.run_every(IMAGE_GC_PERIOD, shutdown).await
    }

    /// [`ImageGc::run`] with another period (tests).
    pub async fn run_every(self: Arc<Self>, period: Duration, shutdown: CancellationToken) {
        if !self.policy.enabled() {
            info!("imageGCHighThresholdPercent is 100 and imageMaximumGCAge is 0: image garbage collection is off");
            return;
        }
        if let Err(e) = self.detect().await {
            debug!("image detection failed (retried at the next collection): {e}");
        }
        let mut failed_before = false;
        let mut ticks = crate::flowcontrol::Periodic::new(period, shutdown);
        while ticks.next().await {
            match self.garbage_collect().await {
                Ok(r) => {
                    failed_before = false;
                    if !r.removed.is_empty() {
                        info!(removed = r.removed.len(), freed_bytes = r.freed_bytes, "image garbage collection");
                    }
                }
                Err(e) => {
                    if failed_before {
                        warn!("image garbage collection failed multiple times in a row: {e}");
                        self.recorder.record(&self.node, EventType::Warning, event::IMAGE_GC_FAILED, &e.to_string());
                    } else {
                        warn!("image garbage collection failed once: {e}");
                    }
                    failed_before = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::cri::{
        api,
        fake::{FakeRuntime, Method},
    };

    #[derive(Default)]
    struct Events(Mutex<Vec<(String, String)>>);

    impl EventRecorder for Events {
        fn record(&self, _o: &ObjectReference, _t: EventType, reason: &str, message: &str) {
            self.0.lock().push((reason.to_owned(), message.to_owned()));
        }
    }

    const GB: u64 = 1 << 30;

    fn node() -> ObjectReference {
        ObjectReference { kind: Some("Node".into()), name: Some("n1".into()), ..Default::default() }
    }

    /// A fake runtime with images "used" (by a container), "pause" (pinned
    /// by name), "old-1" and "old-2" (unused), and a 100 GiB image
    /// filesystem with `available` GiB free.
    async fn setup(available: u64, policy: ImageGcPolicy) -> (Arc<FakeRuntime>, Arc<Events>, ImageGc) {
        let rt = Arc::new(FakeRuntime::new());
        rt.add_image("used:1", 3 * GB);
        rt.add_image("registry.k8s.io/pause:3.9", GB);
        rt.add_image("old-1:1", 2 * GB);
        rt.add_image("old-2:1", 4 * GB);
        let sb = rt.run_pod_sandbox(api::PodSandboxConfig::default(), "").await.unwrap();
        let cfg = api::ContainerConfig {
            metadata: Some(api::ContainerMetadata { name: "c".into(), attempt: 0 }),
            image: Some(api::ImageSpec { image: "used:1".into(), ..Default::default() }),
            ..Default::default()
        };
        let c = rt.create_container(&sb, cfg, api::PodSandboxConfig::default()).await.unwrap();
        // Dead containers keep their image in use too.
        rt.start_container(&c).await.unwrap();
        rt.stop_container(&c, Duration::ZERO).await.unwrap();
        let ev = Arc::new(Events::default());
        let gc = ImageGc::new(rt.clone(), rt.clone(), policy, ev.clone(), node()).with_statfs(move |p| {
            assert_eq!(p, Path::new("/fake/imagefs"));
            Ok(FsStats { capacity_bytes: 100 * GB, available_bytes: available * GB, inodes: 0, inodes_free: 0 })
        });
        (rt, ev, gc)
    }

    fn policy() -> ImageGcPolicy {
        ImageGcPolicy { pinned_images: vec!["registry.k8s.io/pause:3.9".into()], ..Default::default() }
    }

    #[tokio::test]
    async fn collects_down_to_the_low_threshold() {
        // 90% used: free 10 GiB... only 6 GiB are eligible.
        let (rt, ev, gc) = setup(10, policy()).await;
        gc.detect().await.unwrap();
        let e = gc.garbage_collect().await.unwrap_err();
        assert!(matches!(e, ImageGcError::NotEnough { wanted, freed } if wanted == 10 * GB && freed == 6 * GB), "{e}");
        assert_eq!(ev.0.lock()[0].0, event::FREE_DISK_SPACE_FAILED);
        assert!(rt.has_image("used:1") && rt.has_image("registry.k8s.io/pause:3.9"));
        assert!(!rt.has_image("old-1:1") && !rt.has_image("old-2:1"));
    }

    #[tokio::test]
    async fn stops_once_enough_is_freed() {
        // 86% used: free 6 GiB.
        let (rt, ev, gc) = setup(14, policy()).await;
        let r = gc.garbage_collect().await.unwrap();
        assert_eq!(r.bytes_to_free, 6 * GB);
        assert_eq!(r.removed.len(), 2);
        assert!(ev.0.lock().is_empty());
        // Under the high threshold nothing happens.
        let (rt2, _ev, gc) = setup(20, policy()).await;
        let r = gc.garbage_collect().await.unwrap();
        assert!(r.removed.is_empty());
        assert_eq!(rt2.count(Method::RemoveImage), 0);
        assert_eq!(rt.count(Method::RemoveImage), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn new_images_wait_for_the_minimum_age() {
        let (rt, _ev, gc) = setup(50, policy()).await;
        gc.detect().await.unwrap(); // the existing images: beginning of time
        tokio::time::advance(Duration::from_secs(10)).await;
        rt.add_image("fresh:1", GB);
        let r = gc.delete_unused_images().await.unwrap();
        let mut removed: Vec<_> = r.removed.iter().map(|(id, _)| id.clone()).collect();
        removed.sort();
        assert_eq!(removed.len(), 2, "{removed:?}");
        assert!(rt.has_image("fresh:1"), "detected 0 s ago, younger than 2 min");
        tokio::time::advance(Duration::from_secs(120)).await;
        gc.delete_unused_images().await.unwrap();
        assert!(!rt.has_image("fresh:1"));
        assert!(rt.has_image("used:1") && rt.has_image("registry.k8s.io/pause:3.9"));
    }

    #[tokio::test(start_paused = true)]
    async fn runs_periodically_until_shutdown() {
        let (rt, _ev, gc) = setup(10, policy()).await;
        let tx = CancellationToken::new();
        let rx = tx.clone();
        let task = tokio::spawn(Arc::new(gc).run(rx));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!rt.has_image("old-1:1"), "the first collection runs at start");
        rt.add_image("later:1", GB);
        // Seen first at the next collection, removed at the one after, once
        // older than the minimum age.
        tokio::time::sleep(IMAGE_GC_PERIOD).await;
        assert!(rt.has_image("later:1"));
        tokio::time::sleep(IMAGE_GC_PERIOD).await;
        assert!(!rt.has_image("later:1"));
        tx.cancel();
        task.await.unwrap();
    }
}
