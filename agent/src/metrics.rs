//! swiftlet's own Prometheus metrics (served on :10250/metrics), with the
//! kubelet's well-known names where one exists.

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabels {
    pub signal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionSignalLabels {
    pub eviction_signal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ThresholdLabels {
    pub signal: String,
    /// "hard" or "soft".
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConditionLabels {
    pub condition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KillPathLabels {
    /// "kernel" (killed by BPF), "agent" (the userspace fast path) or
    /// "graceful" (soft eviction through the runtime).
    pub path: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    pub mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NameLabels {
    pub name: String,
}

/// `operation_type`: the CRI call in the kubelet's snake_case
/// (`list_containers`, `pull_image`, ...), or a pod worker's operation
/// (`create`, `update`, `sync`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub operation_type: String,
}

/// `container_state`: created, running, exited or unknown.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerStateLabels {
    pub container_state: String,
}

/// kubelet_working_pods' labels: `lifecycle` (sync, terminating,
/// terminated), `config` (desired, orphan, runtime_only), `static` ("true"
/// or "").
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkingPodsLabels {
    pub lifecycle: String,
    pub config: String,
    pub r#static: String,
}

/// `container_type`: container, init_container or ephemeral_container.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerTypeLabels {
    pub container_type: String,
}

/// prober_probe_total's labels, as the kubelet's prober sets them:
/// probe_type Liveness/Readiness/Startup, result successful/failed/unknown.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    pub probe_type: String,
    pub result: String,
    pub container: String,
    pub pod: String,
    pub namespace: String,
    pub pod_uid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeDurationLabels {
    pub probe_type: String,
    pub container: String,
    pub pod: String,
    pub namespace: String,
}

/// The kubelet's /metrics/probes registry, fed by the prober.
pub struct ProbeMetrics {
    pub registry: Registry,
    /// prober_probe_total: probe results by container.
    pub probe_total: Family<ProbeLabels, Counter>,
    /// prober_probe_duration_seconds: how long probes take.
    pub probe_duration: Family<ProbeDurationLabels, Histogram>,
}

fn probe_histogram() -> Histogram {
    // The kubelet's buckets (prometheus DefBuckets).
    Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
}

impl ProbeMetrics {
    pub fn new() -> ProbeMetrics {
        let mut registry = Registry::default();
        let probe_total = Family::default();
        registry.register(
            "prober_probe",
            "[ALPHA] Cumulative number of a liveness, readiness or startup probe for a container by result",
            probe_total.clone(),
        );
        let probe_duration = Family::new_with_constructor(probe_histogram as fn() -> Histogram);
        registry.register(
            "prober_probe_duration_seconds",
            "[ALPHA] Duration in seconds for a probe response",
            probe_duration.clone(),
        );
        ProbeMetrics { registry, probe_total, probe_duration }
    }
}

impl Default for ProbeMetrics {
    fn default() -> Self {
        ProbeMetrics::new()
    }
}

/// The kubelet's pod and runtime metrics (served on /metrics beside
/// swiftlet's own), with the kubelet's names, labels and buckets. The pod
/// manager and prober feed them; the runtime client records its calls;
/// running pods and containers are set from the runtime by the stats
/// collector.
pub struct KubeletMetrics {
    /// kubelet_runtime_operations_total{operation_type}
    pub runtime_operations: Family<OperationLabels, Counter>,
    /// kubelet_runtime_operations_errors_total{operation_type}
    pub runtime_operations_errors: Family<OperationLabels, Counter>,
    /// kubelet_runtime_operations_duration_seconds{operation_type}
    pub runtime_operations_duration: Family<OperationLabels, Histogram>,
    /// kubelet_pod_start_duration_seconds: from first seeing a pod to its
    /// containers running.
    pub pod_start_duration: Histogram,
    /// kubelet_pod_worker_duration_seconds{operation_type}: one pod sync.
    pub pod_worker_duration: Family<OperationLabels, Histogram>,
    /// kubelet_working_pods{lifecycle,config,static}: pods with a worker.
    pub working_pods: Family<WorkingPodsLabels, Gauge>,
    /// kubelet_desired_pods{static}: pods the sources want here.
    pub desired_pods: Family<StaticLabels, Gauge>,
    /// kubelet_started_pods_total, kubelet_started_pods_errors_total
    pub started_pods: Counter,
    pub started_pods_errors: Counter,
    /// kubelet_started_containers_total{container_type}
    pub started_containers: Family<ContainerTypeLabels, Counter>,
    /// kubelet_running_pods: pods with a running sandbox.
    pub running_pods: Gauge,
    /// kubelet_running_containers{container_state}
    pub running_containers: Family<ContainerStateLabels, Gauge>,
}

/// `static`: "true" for static pods, "" otherwise.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StaticLabels {
    pub r#static: String,
}

fn runtime_histogram() -> Histogram {
    // The kubelet's ExponentialBuckets(.005, 2.5, 14).
    Histogram::new(exponential_buckets(0.005, 2.5, 14))
}

fn pod_worker_histogram() -> Histogram {
    Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
}

impl KubeletMetrics {
    fn register(registry: &mut Registry) -> KubeletMetrics {
        let m = KubeletMetrics {
            runtime_operations: Family::default(),
            runtime_operations_errors: Family::default(),
            runtime_operations_duration: Family::new_with_constructor(runtime_histogram as fn() -> Histogram),
            pod_start_duration: Histogram::new([
                0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0, 300.0,
                360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
            ]),
            pod_worker_duration: Family::new_with_constructor(pod_worker_histogram as fn() -> Histogram),
            working_pods: Family::default(),
            desired_pods: Family::default(),
            started_pods: Counter::default(),
            started_pods_errors: Counter::default(),
            started_containers: Family::default(),
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
            "kubelet_pod_start_duration_seconds",
            "[ALPHA] Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
            m.pod_start_duration.clone(),
        );
        registry.register(
            "kubelet_pod_worker_duration_seconds",
            "[ALPHA] Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
            m.pod_worker_duration.clone(),
        );
        registry.register(
            "kubelet_working_pods",
            "[ALPHA] Number of pods the kubelet is actually running, broken down by lifecycle phase, whether the pod is desired, orphaned, or runtime only (also orphaned), and whether the pod is static",
            m.working_pods.clone(),
        );
        registry.register(
            "kubelet_desired_pods",
            "[ALPHA] The number of pods the kubelet is being instructed to run. static is true if the pod is not from the apiserver",
            m.desired_pods.clone(),
        );
        registry.register("kubelet_started_pods", "[ALPHA] Cumulative number of pods started", m.started_pods.clone());
        registry.register(
            "kubelet_started_pods_errors",
            "[ALPHA] Cumulative number of errors when starting pods",
            m.started_pods_errors.clone(),
        );
        registry.register(
            "kubelet_started_containers",
            "[ALPHA] Cumulative number of containers started",
            m.started_containers.clone(),
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

/// Every metric the agent exports, registered once.
pub struct Metrics {
    pub registry: Registry,
    /// kubelet_evictions{eviction_signal}: pods evicted, by signal (the
    /// kubelet's name and label).
    pub kubelet_evictions: Family<EvictionSignalLabels, Counter>,
    /// Available amount per eviction signal, in its unit.
    pub signal_available: Family<SignalLabels, Gauge<i64>>,
    /// Configured thresholds, resolved to the signal's unit.
    pub threshold: Family<ThresholdLabels, Gauge<i64>>,
    /// 1 while the node condition holds.
    pub node_condition: Family<ConditionLabels, Gauge>,
    /// From the kernel's crossing timestamp to the eviction decision.
    pub crossing_to_decision: Histogram,
    /// From the kernel's crossing timestamp to the victim's processes killed.
    pub crossing_to_kill: Family<KillPathLabels, Histogram>,
    /// 1 for the signal source in use (ebpf or cgroupfs).
    pub signal_source: Family<ModeLabels, Gauge>,
    /// Signal-source internals (ring drops, vanished cgroups, ...).
    pub signal_counters: Family<NameLabels, Gauge<i64>>,
    /// Kernel OOM kills seen (oom:mark_victim).
    pub oom_kills: Counter,
    /// Evictions that found nothing evictable.
    pub evictions_without_victim: Counter,
    /// The kubelet's pod and runtime metrics.
    pub kubelet: KubeletMetrics,
    /// /metrics/probes.
    pub probes: ProbeMetrics,
}

fn latency_histogram() -> Histogram {
    // 1 µs to ~16 s.
    Histogram::new(exponential_buckets(1e-6, 2.0, 25))
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let kubelet_evictions = Family::default();
        registry.register(
            "kubelet_evictions",
            "Cumulative number of pod evictions by eviction signal",
            kubelet_evictions.clone(),
        );
        let signal_available = Family::default();
        registry.register(
            "swiftlet_eviction_signal_available",
            "Available amount of each eviction signal (bytes, inodes or pids)",
            signal_available.clone(),
        );
        let threshold = Family::default();
        registry.register(
            "swiftlet_eviction_threshold",
            "Eviction thresholds resolved to the signal's unit",
            threshold.clone(),
        );
        let node_condition = Family::default();
        registry.register(
            "swiftlet_node_condition",
            "1 while the node pressure condition is reported",
            node_condition.clone(),
        );
        let crossing_to_decision = latency_histogram();
        registry.register(
            "swiftlet_eviction_crossing_to_decision_seconds",
            "Time from the kernel seeing a threshold crossed to the eviction decision",
            crossing_to_decision.clone(),
        );
        let crossing_to_kill = Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        registry.register(
            "swiftlet_eviction_crossing_to_kill_seconds",
            "Time from the kernel seeing a threshold crossed to the victim's processes killed",
            crossing_to_kill.clone(),
        );
        let signal_source = Family::default();
        registry.register(
            "swiftlet_signal_source",
            "Where eviction signals come from (1 for the mode in use)",
            signal_source.clone(),
        );
        let signal_counters = Family::default();
        // Not "_counter": linters reject a type's name inside a metric's.
        registry.register(
            "swiftlet_signal_source_stat",
            "Signal source internals (ring drops, vanished cgroups, ...)",
            signal_counters.clone(),
        );
        let oom_kills = Counter::default();
        registry.register("swiftlet_kernel_oom_kills", "Kernel OOM kills seen (oom:mark_victim)", oom_kills.clone());
        let evictions_without_victim = Counter::default();
        registry.register(
            "swiftlet_evictions_without_victim",
            "Eviction decisions that found no evictable pod",
            evictions_without_victim.clone(),
        );
        let kubelet = KubeletMetrics::register(&mut registry);
        Metrics {
            kubelet,
            probes: ProbeMetrics::new(),
            registry,
            kubelet_evictions,
            signal_available,
            threshold,
            node_condition,
            crossing_to_decision,
            crossing_to_kill,
            signal_source,
            signal_counters,
            oom_kills,
            evictions_without_victim,
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
