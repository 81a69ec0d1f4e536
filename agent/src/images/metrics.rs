//! The kubelet's image metrics. Register them on the agent's registry
//! (`ImageMetrics::register(&mut metrics.registry)`) and hand clones to the
//! image manager and image GC.

use std::time::Duration;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ImageSizeLabels {
    pub image_size_in_bytes: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GcReasonLabels {
    /// "age" or "space".
    pub reason: String,
}

/// The kubelet's `image_pull_duration_seconds` buckets.
const PULL_BUCKETS: [f64; 18] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0,
    3600.0,
];

fn pull_histogram() -> Histogram {
    Histogram::new(PULL_BUCKETS)
}

#[derive(Clone)]
pub struct ImageMetrics {
    /// kubelet_image_pull_duration_seconds{image_size_in_bytes}
    pub pull_duration: Family<ImageSizeLabels, Histogram, fn() -> Histogram>,
    /// kubelet_image_garbage_collected_total{reason}
    pub garbage_collected: Family<GcReasonLabels, Counter>,
}

impl Default for ImageMetrics {
    fn default() -> Self {
        ImageMetrics {
            pull_duration: Family::new_with_constructor(pull_histogram as fn() -> Histogram),
            garbage_collected: Family::default(),
        }
    }
}

/// The kubelet's size bucket label for an image of `bytes`.
pub fn image_size_bucket(bytes: u64) -> &'static str {
    const MB: u64 = 1024 * 1024;
    const GB: u64 = 1024 * MB;
    const BUCKETS: [(u64, &str); 12] = [
        (100 * GB, "GT100GB"),
        (60 * GB, "60GB-100GB"),
        (40 * GB, "40GB-60GB"),
        (30 * GB, "30GB-40GB"),
        (20 * GB, "20GB-30GB"),
        (10 * GB, "10GB-20GB"),
        (5 * GB, "5GB-10GB"),
        (GB, "1GB-5GB"),
        (500 * MB, "500MB-1GB"),
        (100 * MB, "100MB-500MB"),
        (10 * MB, "10MB-100MB"),
        (0, "0-10MB"),
    ];
    BUCKETS.iter().find(|(low, _)| bytes >= *low).map(|(_, l)| *l).unwrap_or("0-10MB")
}

impl ImageMetrics {
    /// New metrics registered on `registry`.
    pub fn register(registry: &mut Registry) -> ImageMetrics {
        let m = ImageMetrics::default();
        registry.register(
            "kubelet_image_pull_duration_seconds",
            "Duration in seconds to pull an image, by image size",
            m.pull_duration.clone(),
        );
        registry.register(
            "kubelet_image_garbage_collected",
            "Total number of images garbage collected by the kubelet, whether through disk usage or image age",
            m.garbage_collected.clone(),
        );
        m
    }

    pub fn observe_pull(&self, size: u64, took: Duration) {
        self.pull_duration
            .get_or_create(&ImageSizeLabels { image_size_in_bytes: image_size_bucket(size).to_owned() })
            .observe(took.as_secs_f64());
    }

    pub fn count_gc(&self, reason: &str) {
        self.garbage_collected.get_or_create(&GcReasonLabels { reason: reason.to_owned() }).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_names() {
        let cases = [(0, "0-10MB"), (10 << 20, "10MB-100MB"), ((1 << 30) - 1, "500MB-1GB"), (200u64 << 30, "GT100GB")];
        for (b, want) in cases {
            assert_eq!(image_size_bucket(b), want, "{b}");
        }
        let mut r = Registry::default();
        let m = ImageMetrics::register(&mut r);
        m.observe_pull(5 << 20, Duration::from_secs(3));
        m.count_gc("space");
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        assert!(
            out.contains("kubelet_image_pull_duration_seconds_bucket{le=\"5.0\",image_size_in_bytes=\"0-10MB\"} 1"),
            "{out}"
        );
        assert!(out.contains("kubelet_image_garbage_collected_total{reason=\"space\"} 1"), "{out}");
    }
}
