//! The seams between pod sources, the pod workers and status reporting.

use k8s_openapi::api::core::v1::{Pod, PodStatus};

/// Where a pod came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SourceKind {
    /// The static manifest directory (`staticPodPath`).
    File,
    /// The API server (pods bound to this node).
    Api,
}

impl SourceKind {
    /// The value of the `kubernetes.io/config.source` annotation.
    pub fn annotation(self) -> &'static str {
        match self {
            SourceKind::File => "file",
            SourceKind::Api => "api",
        }
    }
}

/// Every pod one source currently wants on this node. A snapshot replaces
/// the previous one from the same source.
#[derive(Clone, Debug)]
pub struct PodSnapshot {
    pub source: SourceKind,
    pub pods: Vec<Pod>,
}

/// Takes a source's snapshots (the pod manager; the mirror-pod manager for
/// the file source). A snapshot replaces the previous one of its source.
pub trait PodSink: Send + Sync {
    fn set(&self, snapshot: PodSnapshot);
}

/// Receives pod status changes (to patch them to the API server, ...).
/// Called with the pod as the source gave it and the status the kubelet
/// computed; only changes are reported.
pub trait StatusReporter: Send + Sync {
    fn report(&self, pod: &Pod, status: &PodStatus);

    /// Every container of `pod` has stopped and will not run again, and its
    /// sandbox is stopped: for a pod being deleted, the moment the kubelet
    /// deletes it from the API server with grace period 0.
    fn terminated(&self, _pod: &Pod) {}
}

/// A reporter that drops everything (standalone mode).
pub struct NoStatusReporter;

impl StatusReporter for NoStatusReporter {
    fn report(&self, _pod: &Pod, _status: &PodStatus) {}
}

/// The pods this node runs now, each with its current status (for /pods,
/// stats, node status and metrics).
pub trait PodView: Send + Sync {
    fn pods(&self) -> Vec<Pod>;
}
