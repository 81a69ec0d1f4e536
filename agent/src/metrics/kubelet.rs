//! The kubelet's runtime metrics (pkg/kubelet/metrics), with its names,
//! help texts, labels and buckets: runtime operations, running pods and
//! containers. The pod side's (relist, pod workers, pod start, cgroup
//! manager) are in `pods::metrics`.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

/// `operation_type`: a CRI call in the kubelet's snake_case
/// (`list_containers`, `pull_image`, ...), or a cgroup manager operation
/// (`create`, `update`, `destroy`), or a pod worker's update type.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub operation_type: String,
}

/// `container_state`: created, running, exited or unknown.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerStateLabels {
    pub container_state: String,
}

/// Prometheus' DefBuckets, which most kubelet histograms use.
pub const DEFAULT_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// A histogram with Prometheus' default buckets.
pub fn default_histogram() -> Histogram {
    Histogram::new(DEFAULT_BUCKETS)
}

fn runtime_histogram() -> Histogram {
    // The kubelet's ExponentialBuckets(.005, 2.5, 14).
    Histogram::new(exponential_buckets(0.005, 2.5, 14))
}

/// The kubelet's runtime metrics, served on /metrics.
pub struct KubeletMetrics {
    /// kubelet_runtime_operations_total{operation_type}
    pub runtime_operations: Family<OperationLabels, Counter>,
    /// kubelet_runtime_operations_errors_total{operation_type}
    pub runtime_operations_errors: Family<OperationLabels, Counter>,
    /// kubelet_runtime_operations_duration_seconds{operation_type}
    pub runtime_operations_duration: Family<OperationLabels, Histogram>,
    /// kubelet_running_pods: pods with a running sandbox.
    pub running_pods: Gauge,
    /// kubelet_running_containers{container_state}
    pub running_containers: Family<ContainerStateLabels, Gauge>,
}

impl KubeletMetrics {
    pub(super) fn register(registry: &mut Registry) -> KubeletMetrics {
        let m = KubeletMetrics {
            runtime_operations: Family::default(),
            runtime_operations_errors: Family::default(),
            runtime_operations_duration: Family::new_with_constructor(runtime_histogram as fn() -> Histogram),
            running_pods: Gauge::default(),
            running_containers: Family::default(),
        };
        registry.register(
            "kubelet_runtime_operations",
            "[ALPHA] Cumulative number of runtime operations by operation type",
            m.runtime_operations.clone(),
        );
        registry.register(
            "kubelet_runtime_operations_errors",
            "[ALPHA] Cumulative number of runtime operation errors by operation type",
            m.runtime_operations_errors.clone(),
        );
        registry.register(
            "kubelet_runtime_operations_duration_seconds",
            "[ALPHA] Duration in seconds of runtime operations. Broken down by operation type",
            m.runtime_operations_duration.clone(),
        );
        registry.register(
            "kubelet_running_pods",
            "[ALPHA] Number of pods that have a running pod sandbox",
            m.running_pods.clone(),
        );
        registry.register(
            "kubelet_running_containers",
            "[ALPHA] Number of containers currently running",
            m.running_containers.clone(),
        );
        m
    }

    /// Records one CRI call: `method` as the client names it (`ListContainers`).
    pub fn observe_runtime_call(&self, method: &str, seconds: f64, failed: bool) {
        let l = OperationLabels { operation_type: snake_case(method) };
        self.runtime_operations.get_or_create(&l).inc();
        self.runtime_operations_duration.get_or_create(&l).observe(seconds);
        if failed {
            self.runtime_operations_errors.get_or_create(&l).inc();
        }
    }
}

/// `ListPodSandbox` → `list_podsandbox`, as the kubelet's instrumented
/// runtime service names its operations.
pub fn snake_case(method: &str) -> String {
    let mut out = String::with_capacity(method.len() + 4);
    for (i, ch) in method.chars().enumerate() {
        if ch.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(ch.to_ascii_lowercase());
        } else {
            out.push(ch);
        }
    }
    // The kubelet's names for the sandbox calls run "pod" and "sandbox" together.
    out.replace("pod_sandbox", "podsandbox")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    #[test]
    fn runtime_operation_names_are_the_kubelets() {
        for (method, want) in [
            ("ListPodSandbox", "list_podsandbox"),
            ("RunPodSandbox", "run_podsandbox"),
            ("PodSandboxStatus", "podsandbox_status"),
            ("ListContainers", "list_containers"),
            ("ImageFsInfo", "image_fs_info"),
            ("ExecSync", "exec_sync"),
            ("Version", "version"),
        ] {
            assert_eq!(snake_case(method), want);
        }
        let m = Metrics::new();
        m.kubelet.observe_runtime_call("ListContainers", 0.002, false);
        m.kubelet.observe_runtime_call("ListContainers", 0.5, true);
        let text = m.encode_text();
        assert!(text.contains("kubelet_runtime_operations_total{operation_type=\"list_containers\"} 2"), "{text}");
        assert!(
            text.contains("kubelet_runtime_operations_errors_total{operation_type=\"list_containers\"} 1"),
            "{text}"
        );
    }
}
