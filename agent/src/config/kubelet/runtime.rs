//! The container runtime and images: the CRI endpoints and timeouts, image
//! pulls (rate, parallelism) and image garbage collection, and the
//! rotation of container logs.

use super::{configuration::KubeletConfiguration, non_negative};
use crate::{
    config::{
        error::ConfigError,
        tree::Node,
        values::{Ctx, Object},
    },
    quantity::Quantity,
};

/// Reads the image pull rate, image garbage collection, the runtime's
/// timeouts, parallel pulls, container log rotation and the endpoints.
/// `root` is the whole configuration, where an error about a pair of
/// fields points when the one it names is unset.
pub(super) fn read(cx: &Ctx, root: &Node, o: &mut Object, c: &mut KubeletConfiguration) -> Result<(), ConfigError> {
    if let Some(v) = non_negative(o, "registryPullQPS")? {
        c.registry_pull_qps = v;
    }
    if let Some(v) = non_negative(o, "registryBurst")?.filter(|v| *v != 0) {
        c.registry_burst = v;
    }
    read_image_gc(cx, root, o, c)?;
    c.runtime_request_timeout = o.duration_or("runtimeRequestTimeout", c.runtime_request_timeout)?;
    c.streaming_connection_idle_timeout =
        o.duration_or("streamingConnectionIdleTimeout", c.streaming_connection_idle_timeout)?;
    read_parallel_pulls(cx, o, c)?;
    read_container_logs(cx, o, c)?;
    if let Some(v) = o.string("containerRuntimeEndpoint")?.filter(|s| !s.is_empty()) {
        c.container_runtime_endpoint = v;
    }
    c.image_service_endpoint = o.string("imageServiceEndpoint")?.filter(|s| !s.is_empty());
    Ok(())
}

/// imageMinimumGCAge, imageMaximumGCAge and the two thresholds, the low
/// one below the high one.
fn read_image_gc(cx: &Ctx, root: &Node, o: &mut Object, c: &mut KubeletConfiguration) -> Result<(), ConfigError> {
    c.image_minimum_gc_age = o.duration_or("imageMinimumGCAge", c.image_minimum_gc_age)?;
    if let Some(v) = o.duration("imageMaximumGCAge")? {
        c.image_maximum_gc_age = v;
    }
    if let Some(v) = o.int_in("imageGCHighThresholdPercent", 0, 100)? {
        c.image_gc_high_threshold_percent = v as u8;
    }
    let low_node = o.get("imageGCLowThresholdPercent");
    if let Some(n) = low_node {
        c.image_gc_low_threshold_percent = cx.int_in(n, "imageGCLowThresholdPercent", 0, 100)? as u8;
    }
    if c.image_gc_low_threshold_percent >= c.image_gc_high_threshold_percent {
        let n = low_node.or_else(|| root.get("imageGCHighThresholdPercent")).unwrap_or(root);
        return Err(cx.err(
            n,
            "imageGCLowThresholdPercent",
            format!(
                "{} must be less than imageGCHighThresholdPercent ({})",
                c.image_gc_low_threshold_percent, c.image_gc_high_threshold_percent
            ),
        ));
    }
    Ok(())
}

/// serializeImagePulls and maxParallelImagePulls, which must agree.
fn read_parallel_pulls(cx: &Ctx, o: &mut Object, c: &mut KubeletConfiguration) -> Result<(), ConfigError> {
    let serialize = o.get("serializeImagePulls");
    let parallel = o.get("maxParallelImagePulls");
    if let Some(n) = parallel {
        c.max_parallel_image_pulls = Some(cx.int_in(n, "maxParallelImagePulls", 1, i32::MAX as i64)? as u32);
    }
    c.serialize_image_pulls = match serialize {
        Some(n) => cx.boolean(n, "serializeImagePulls")?,
        // Unset: serial unless parallel pulls were asked for.
        None => c.max_parallel_image_pulls.is_none_or(|p| p < 2),
    };
    if let (true, Some(p @ 2..), Some(n)) = (c.serialize_image_pulls, c.max_parallel_image_pulls, parallel) {
        return Err(cx.err(
            n,
            "maxParallelImagePulls",
            format!("{p} cannot be larger than 1 unless serializeImagePulls (--serialize-image-pulls) is false"),
        ));
    }
    Ok(())
}

/// containerLogMaxSize and containerLogMaxFiles.
fn read_container_logs(cx: &Ctx, o: &mut Object, c: &mut KubeletConfiguration) -> Result<(), ConfigError> {
    if let Some(n) = o.get("containerLogMaxSize") {
        let raw = cx.scalar_string(n, "containerLogMaxSize")?;
        if !raw.is_empty() {
            let q = cx.quantity(n, "containerLogMaxSize")?;
            if q.is_negative() || q == Quantity::ZERO {
                return Err(cx.err(n, "containerLogMaxSize", format!("{raw:?} must be positive")));
            }
            c.container_log_max_size = q;
        }
    }
    if let Some(v) = o.int_in("containerLogMaxFiles", 2, i32::MAX as i64)? {
        c.container_log_max_files = v as u32;
    }
    Ok(())
}
