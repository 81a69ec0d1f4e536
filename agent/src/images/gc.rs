//! Image garbage collection, the decision (pure): which images are in use,
//! what the GC remembers about each image, and which to remove, as the
//! kubelet's `realImageGCManager`:
//!
//! - an image is *in use* while any container (running or dead, ours or
//!   not) refers to it, or it is pinned (by the runtime, or named in the
//!   policy: the sandbox image);
//! - each image's first detection and last use are remembered; images
//!   present when the GC starts count as detected at the beginning of
//!   time;
//! - unused images idle for longer than imageMaximumGCAge go first (once
//!   the GC has itself run that long);
//! - when the image filesystem's usage reaches imageGCHighThresholdPercent,
//!   unused images older than imageMinimumGCAge are removed, least
//!   recently used first (then oldest detected), until usage would be at
//!   imageGCLowThresholdPercent.

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use tokio::time::Instant;

use super::reference::Reference;
use crate::{config::KubeletConfiguration, cri::api};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageGcPolicy {
    /// imageGCHighThresholdPercent (85): collect at or above this usage.
    pub high_threshold_percent: u8,
    /// imageGCLowThresholdPercent (80): collect down to this usage.
    pub low_threshold_percent: u8,
    /// imageMinimumGCAge (2m): a newer image is never removed.
    pub min_age: Duration,
    /// imageMaximumGCAge (0: off): remove images unused for longer.
    pub max_age: Duration,
    /// Image names never removed: the sandbox (pause) image, as the
    /// kubelet's `--pod-infra-container-image` ("will not be pruned by the
    /// image garbage collector"). Runtimes that pin their sandbox image
    /// (containerd ≥ 1.7) need nothing here; containerd 1.6 does not pin.
    pub pinned_images: Vec<String>,
}

impl Default for ImageGcPolicy {
    fn default() -> Self {
        ImageGcPolicy {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            min_age: Duration::from_secs(120),
            max_age: Duration::ZERO,
            pinned_images: vec![],
        }
    }
}

impl ImageGcPolicy {
    pub fn from_kubelet(k: &KubeletConfiguration, pinned_images: Vec<String>) -> ImageGcPolicy {
        ImageGcPolicy {
            high_threshold_percent: k.image_gc_high_threshold_percent,
            low_threshold_percent: k.image_gc_low_threshold_percent,
            min_age: k.image_minimum_gc_age,
            max_age: k.image_maximum_gc_age,
            pinned_images,
        }
    }

    /// The kubelet turns image GC off when the high threshold is 100 and
    /// there is no maximum age.
    pub fn enabled(&self) -> bool {
        !(self.high_threshold_percent >= 100 && self.max_age.is_zero())
    }
}

/// What the GC remembers about one image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageRecord {
    /// None: before the GC started (the beginning of time).
    pub first_detected: Option<Instant>,
    /// None: never seen in use.
    pub last_used: Option<Instant>,
    pub size: u64,
    pub pinned: bool,
}

/// Image records by image id.
#[derive(Clone, Debug, Default)]
pub struct ImageRecords {
    pub records: HashMap<String, ImageRecord>,
    initialized: bool,
}

fn same_name(a: &str, b: &str) -> bool {
    a == b
        || match (Reference::parse(a), Reference::parse(b)) {
            (Ok(x), Ok(y)) => x.normalized() == y.normalized(),
            _ => false,
        }
}

/// The ids of images in use: referred to by a container (by id, tag or
/// digest), or named in `pinned_names`.
pub fn images_in_use(images: &[api::Image], containers: &[api::Container], pinned_names: &[String]) -> HashSet<String> {
    let matches = |img: &api::Image, r: &str| {
        !r.is_empty()
            && (img.id == r || img.repo_digests.iter().any(|d| d == r) || img.repo_tags.iter().any(|t| same_name(t, r)))
    };
    let mut used = HashSet::new();
    for img in images {
        let by_container = containers.iter().any(|c| {
            matches(img, &c.image_ref)
                || matches(img, &c.image_id)
                || c.image.as_ref().is_some_and(|s| matches(img, &s.image))
        });
        if by_container || pinned_names.iter().any(|p| matches(img, p)) {
            used.insert(img.id.clone());
        }
    }
    used
}

impl ImageRecords {
    /// `detectImages`: records new images (detected now, or at the
    /// beginning of time on the first call), marks those in use as used
    /// now, and forgets images that are gone.
    pub fn detect(&mut self, images: &[api::Image], in_use: &HashSet<String>, now: Instant) {
        let detected = if self.initialized { Some(now) } else { None };
        self.initialized = true;
        let present: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        self.records.retain(|id, _| present.contains(id.as_str()));
        for img in images {
            let r = self.records.entry(img.id.clone()).or_insert(ImageRecord {
                first_detected: detected,
                last_used: None,
                size: img.size,
                pinned: img.pinned,
            });
            r.size = img.size;
            r.pinned = img.pinned;
            if in_use.contains(&img.id) {
                r.last_used = Some(now);
            }
        }
    }

    pub fn forget(&mut self, id: &str) {
        self.records.remove(id);
    }
}

/// The image filesystem as statfs sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsUsage {
    pub capacity_bytes: u64,
    pub available_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub id: String,
    pub size: u64,
}

/// What one collection should do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcPlan {
    /// Unused images idle past the maximum age: remove all.
    pub by_age: Vec<Candidate>,
    /// The image filesystem's usage, percent.
    pub usage_percent: Option<u8>,
    /// Bytes to free to reach the low threshold (0: under the high one).
    pub bytes_to_free: u64,
    /// Eligible images in eviction order: remove until `bytes_to_free` is
    /// freed (each removal that fails is skipped).
    pub by_space: Vec<Candidate>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("invalid capacity {0} on image filesystem")]
    Capacity(u64),
    #[error("invalid available bytes {available} on image filesystem of capacity {capacity}")]
    Available { available: u64, capacity: u64 },
}

/// Unused, unpinned images in the kubelet's eviction order: least
/// recently used first, then first detected first (ids break ties).
fn eviction_order(records: &ImageRecords, in_use: &HashSet<String>) -> Vec<(String, ImageRecord)> {
    let mut v: Vec<(String, ImageRecord)> = records
        .records
        .iter()
        .filter(|(id, r)| !in_use.contains(*id) && !r.pinned)
        .map(|(id, r)| (id.clone(), *r))
        .collect();
    v.sort_by(|a, b| (a.1.last_used, a.1.first_detected, &a.0).cmp(&(b.1.last_used, b.1.first_detected, &b.0)));
    v
}

fn age(now: Instant, t: Option<Instant>) -> Duration {
    match t {
        Some(t) => now.saturating_duration_since(t),
        None => Duration::MAX,
    }
}

/// Decides one collection at `now`. `gc_started` is when the collector
/// started (the maximum age applies only once it has run that long, so a
/// restart never removes images at once). `fs` is None for "delete every
/// eligible image" (disk-pressure reclaim).
pub fn plan(
    policy: &ImageGcPolicy,
    records: &ImageRecords,
    in_use: &HashSet<String>,
    fs: Option<FsUsage>,
    now: Instant,
    gc_started: Instant,
) -> Result<GcPlan, PlanError> {
    let mut order = eviction_order(records, in_use);
    let mut out = GcPlan::default();
    if fs.is_some() && !policy.max_age.is_zero() && now.saturating_duration_since(gc_started) > policy.max_age {
        // Idle time counts from the last use, or from the first detection
        // for an image never used (the kubelet counts from the epoch there,
        // which can remove an image pulled a moment before its container
        // is created).
        let (old, rest): (Vec<_>, Vec<_>) =
            order.into_iter().partition(|(_, r)| age(now, r.last_used.or(r.first_detected)) > policy.max_age);
        out.by_age = old.into_iter().map(|(id, r)| Candidate { id, size: r.size }).collect();
        order = rest;
    }
    let eligible = |r: &ImageRecord| age(now, r.first_detected) >= policy.min_age;
    match fs {
        None => {
            out.bytes_to_free = u64::MAX;
        }
        Some(fs) => {
            if fs.capacity_bytes == 0 {
                return Err(PlanError::Capacity(0));
            }
            if fs.available_bytes > fs.capacity_bytes {
                return Err(PlanError::Available { available: fs.available_bytes, capacity: fs.capacity_bytes });
            }
            let cap = fs.capacity_bytes as u128;
            let usage = 100 - (fs.available_bytes as u128 * 100 / cap) as u8;
            out.usage_percent = Some(usage);
            if usage >= policy.high_threshold_percent {
                let target_available = cap * (100 - policy.low_threshold_percent.min(100) as u128) / 100;
                out.bytes_to_free = target_available.saturating_sub(fs.available_bytes as u128) as u64;
            }
        }
    }
    if out.bytes_to_free > 0 {
        out.by_space =
            order.into_iter().filter(|(_, r)| eligible(r)).map(|(id, r)| Candidate { id, size: r.size }).collect();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(id: &str, tags: &[&str], size: u64) -> api::Image {
        api::Image {
            id: id.into(),
            repo_tags: tags.iter().map(|t| t.to_string()).collect(),
            size,
            ..Default::default()
        }
    }

    fn container(image: &str, image_ref: &str) -> api::Container {
        api::Container {
            image: Some(api::ImageSpec { image: image.into(), ..Default::default() }),
            image_ref: image_ref.into(),
            ..Default::default()
        }
    }

    #[test]
    fn in_use_by_id_tag_digest_or_pin() {
        let mut digested = image("sha256:d", &["quay.io/x/d:1"], 1);
        digested.repo_digests = vec!["quay.io/x/d@sha256:1111".into()];
        let images = vec![
            image("sha256:a", &["docker.io/library/busybox:1.36"], 1),
            image("sha256:b", &["docker.io/library/nginx:1.27"], 1),
            image("sha256:c", &["registry.k8s.io/pause:3.9"], 1),
            digested,
            image("sha256:e", &["docker.io/library/unused:1"], 1),
        ];
        let containers = vec![
            container("sha256:a", "sha256:a"),        // by id (containerd)
            container("nginx:1.27", ""),              // by short name
            container("", "quay.io/x/d@sha256:1111"), // by digest (CRI-O)
        ];
        let used = images_in_use(&images, &containers, &["registry.k8s.io/pause:3.9".into()]);
        let mut used: Vec<_> = used.into_iter().collect();
        used.sort();
        assert_eq!(used, ["sha256:a", "sha256:b", "sha256:c", "sha256:d"]);
    }

    const GB: u64 = 1 << 30;

    /// Records: (id, first detected seconds ago or None, last used seconds
    /// ago or None, size, pinned).
    type RecordRow<'a> = (&'a str, Option<u64>, Option<u64>, u64, bool);

    fn records(t0: Instant, list: &[RecordRow]) -> ImageRecords {
        let at = |ago: Option<u64>| ago.map(|s| t0 - Duration::from_secs(s));
        ImageRecords {
            records: list
                .iter()
                .map(|(id, fd, lu, size, pinned)| {
                    (
                        id.to_string(),
                        ImageRecord { first_detected: at(*fd), last_used: at(*lu), size: *size, pinned: *pinned },
                    )
                })
                .collect(),
            initialized: true,
        }
    }

    fn ids(c: &[Candidate]) -> Vec<&str> {
        c.iter().map(|c| c.id.as_str()).collect()
    }

    #[test]
    fn plans() {
        let t0 = Instant::now() + Duration::from_secs(100_000);
        let policy = ImageGcPolicy::default(); // 85/80, min age 2m
        let recs = records(
            t0,
            &[
                ("used", None, Some(0), 5 * GB, false),
                ("pinned", None, None, 5 * GB, true),
                ("never-used-old", None, None, 2 * GB, false),
                ("used-long-ago", Some(9000), Some(8000), 3 * GB, false),
                ("used-recently", Some(9000), Some(100), 4 * GB, false),
                ("new", Some(60), None, GB, false),
            ],
        );
        let in_use: HashSet<String> = ["used".to_string()].into();
        let fs = |avail_pct: u64| Some(FsUsage { capacity_bytes: 100 * GB, available_bytes: avail_pct * GB });
        // (fs, max age, usage, bytes to free, by space, by age)
        struct Case {
            fs: Option<FsUsage>,
            max_age: u64,
            usage: Option<u8>,
            to_free: u64,
            by_space: Vec<&'static str>,
            by_age: Vec<&'static str>,
        }
        let cases = [
            // Under the high threshold: nothing.
            Case { fs: fs(16), max_age: 0, usage: Some(84), to_free: 0, by_space: vec![], by_age: vec![] },
            // At 85%: free down to 80% (5 GiB), LRU first, never in-use,
            // pinned or younger than the minimum age.
            Case {
                fs: fs(15),
                max_age: 0,
                usage: Some(85),
                to_free: 5 * GB,
                by_space: vec!["never-used-old", "used-long-ago", "used-recently"],
                by_age: vec![],
            },
            // Disk-pressure reclaim: everything eligible.
            Case {
                fs: None,
                max_age: 0,
                usage: None,
                to_free: u64::MAX,
                by_space: vec!["never-used-old", "used-long-ago", "used-recently"],
                by_age: vec![],
            },
            // Maximum age of one hour: idle longer than that goes whatever
            // the usage; the never-used image detected at start too.
            Case {
                fs: fs(50),
                max_age: 3600,
                usage: Some(50),
                to_free: 0,
                by_space: vec![],
                by_age: vec!["never-used-old", "used-long-ago"],
            },
            Case {
                fs: fs(10),
                max_age: 3600,
                usage: Some(90),
                to_free: 10 * GB,
                by_space: vec!["used-recently"],
                by_age: vec!["never-used-old", "used-long-ago"],
            },
        ];
        for (i, c) in cases.into_iter().enumerate() {
            let p = ImageGcPolicy { max_age: Duration::from_secs(c.max_age), ..policy.clone() };
            let started = t0 - Duration::from_secs(50_000);
            let got = plan(&p, &recs, &in_use, c.fs, t0, started).unwrap();
            assert_eq!(got.usage_percent, c.usage, "case {i}");
            assert_eq!(got.bytes_to_free, c.to_free, "case {i}");
            assert_eq!(ids(&got.by_space), c.by_space, "case {i}");
            assert_eq!(ids(&got.by_age), c.by_age, "case {i}");
        }
    }

    #[test]
    fn max_age_waits_for_the_collector_to_have_run_that_long() {
        let t0 = Instant::now() + Duration::from_secs(100_000);
        let recs = records(t0, &[("old", None, None, GB, false)]);
        let p = ImageGcPolicy { max_age: Duration::from_secs(3600), ..Default::default() };
        let fs = Some(FsUsage { capacity_bytes: 100 * GB, available_bytes: 90 * GB });
        let fresh = plan(&p, &recs, &HashSet::new(), fs, t0, t0 - Duration::from_secs(60)).unwrap();
        assert!(fresh.by_age.is_empty());
        let later = plan(&p, &recs, &HashSet::new(), fs, t0, t0 - Duration::from_secs(3601)).unwrap();
        assert_eq!(ids(&later.by_age), ["old"]);
    }

    #[test]
    fn bad_filesystem_figures() {
        let t0 = Instant::now();
        let p = ImageGcPolicy::default();
        let r = ImageRecords::default();
        let e = plan(&p, &r, &HashSet::new(), Some(FsUsage { capacity_bytes: 0, available_bytes: 0 }), t0, t0);
        assert_eq!(e, Err(PlanError::Capacity(0)));
        let e = plan(&p, &r, &HashSet::new(), Some(FsUsage { capacity_bytes: 1, available_bytes: 2 }), t0, t0);
        assert!(matches!(e, Err(PlanError::Available { .. })));
    }

    #[test]
    fn detection_remembers_first_seen_and_last_used() {
        let t0 = Instant::now();
        let mut r = ImageRecords::default();
        let a = image("sha256:a", &["a:1"], 10);
        let b = image("sha256:b", &["b:1"], 20);
        r.detect(std::slice::from_ref(&a), &HashSet::new(), t0);
        assert_eq!(r.records["sha256:a"].first_detected, None, "present at start: the beginning of time");
        let t1 = t0 + Duration::from_secs(300);
        r.detect(&[a.clone(), b.clone()], &["sha256:a".to_string()].into(), t1);
        assert_eq!(r.records["sha256:b"].first_detected, Some(t1));
        assert_eq!(r.records["sha256:a"].last_used, Some(t1));
        assert_eq!(r.records["sha256:b"].last_used, None);
        let t2 = t1 + Duration::from_secs(300);
        r.detect(&[b], &HashSet::new(), t2);
        assert!(!r.records.contains_key("sha256:a"), "gone images are forgotten");
        assert_eq!(r.records["sha256:b"].first_detected, Some(t1));
    }

    #[test]
    fn disabled_at_100_without_max_age() {
        assert!(!ImageGcPolicy { high_threshold_percent: 100, ..Default::default() }.enabled());
        assert!(
            ImageGcPolicy { high_threshold_percent: 100, max_age: Duration::from_secs(60), ..Default::default() }
                .enabled()
        );
        assert!(ImageGcPolicy::default().enabled());
    }
}
