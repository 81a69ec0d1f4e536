//! Scrape-time collectors: the metric families whose values are read when
//! a scraper asks, rather than kept as counters.
//!
//! - /metrics/resource: the kubelet's stable resource metrics, exactly
//!   named (node/pod/container CPU and working set, container start time,
//!   `resource_scrape_error` and the deprecated `scrape_error`).
//! - /metrics/cadvisor is `cadvisor`.
//! - process_* for the agent itself, and the eBPF programs' run time.

use std::{fmt, sync::Arc};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};

use super::stats::{CgroupSample, StatsSnapshot, unix_seconds};
use crate::signals::ebpf::EbpfSource;

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Writes one family: `rows` of (labels, value).
fn family<L: EncodeLabelSet>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    rows: impl IntoIterator<Item = (L, f64)>,
) -> fmt::Result {
    let mut me = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, v) in rows {
        let fe = me.encode_family(&labels)?;
        match kind {
            MetricType::Counter => ConstCounter::new(v).encode(fe)?,
            _ => ConstGauge::new(v).encode(fe)?,
        }
    }
    Ok(())
}

/// Writes one family with a single unlabelled sample.
fn single(enc: &mut DescriptorEncoder, name: &str, help: &str, kind: MetricType, value: Option<f64>) -> fmt::Result {
    let me = enc.encode_descriptor(name, help, None, kind)?;
    match (value, kind) {
        (None, _) => Ok(()),
        (Some(v), MetricType::Counter) => ConstCounter::new(v).encode(me),
        (Some(v), _) => ConstGauge::new(v).encode(me),
    }
}

/// The kubelet's /metrics/resource families.
#[derive(Debug)]
pub struct ResourceCollector(pub Arc<StatsSnapshot>);

impl Collector for ResourceCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let s = &self.0;
        let container_rows = |f: fn(&CgroupSample) -> Option<f64>| {
            s.pods.iter().flat_map(move |p| {
                p.containers.iter().filter_map(move |c| {
                    f(&c.cgroup).map(|v| {
                        (
                            [
                                ("container", c.name.as_str()),
                                ("namespace", p.namespace.as_str()),
                                ("pod", p.name.as_str()),
                            ],
                            v,
                        )
                    })
                })
            })
        };
        let pod_rows = |f: fn(&CgroupSample) -> Option<f64>| {
            s.pods.iter().filter_map(move |p| {
                p.cgroup
                    .as_ref()
                    .and_then(f)
                    .map(|v| ([("namespace", p.namespace.as_str()), ("pod", p.name.as_str())], v))
            })
        };
        let cpu = |c: &CgroupSample| c.cpu_usage_ns.map(secs);
        let ws = |c: &CgroupSample| c.working_set.map(|v| v as f64);
        family(
            &mut enc,
            "container_cpu_usage_seconds",
            "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
            MetricType::Counter,
            container_rows(cpu),
        )?;
        family(
            &mut enc,
            "container_memory_working_set_bytes",
            "[STABLE] Current working set of the container in bytes",
            MetricType::Gauge,
            container_rows(ws),
        )?;
        family(
            &mut enc,
            "container_start_time_seconds",
            "[STABLE] Start time of the container since unix epoch in seconds",
            MetricType::Gauge,
            s.pods.iter().flat_map(|p| {
                p.containers.iter().map(move |c| {
                    (
                        [("container", c.name.as_str()), ("namespace", p.namespace.as_str()), ("pod", p.name.as_str())],
                        unix_seconds(c.start_time),
                    )
                })
            }),
        )?;
        single(
            &mut enc,
            "node_cpu_usage_seconds",
            "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
            MetricType::Counter,
            cpu(&s.node.root),
        )?;
        single(
            &mut enc,
            "node_memory_working_set_bytes",
            "[STABLE] Current working set of the node in bytes",
            MetricType::Gauge,
            ws(&s.node.root),
        )?;
        family(
            &mut enc,
            "pod_cpu_usage_seconds",
            "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
            MetricType::Counter,
            pod_rows(cpu),
        )?;
        family(
            &mut enc,
            "pod_memory_working_set_bytes",
            "[STABLE] Current working set of the pod in bytes",
            MetricType::Gauge,
            pod_rows(ws),
        )?;
        let error = if s.errors.is_empty() { 0.0 } else { 1.0 };
        single(
            &mut enc,
            "resource_scrape_error",
            "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
            MetricType::Gauge,
            Some(error),
        )?;
        single(
            &mut enc,
            "scrape_error",
            "[ALPHA] (Deprecated since 1.29.0) 1 if there was an error while getting container metrics, 0 otherwise",
            MetricType::Gauge,
            Some(error),
        )
    }
}

/// A registry holding one collector (built per scrape: cheap).
pub fn registry_with(collector: impl Collector) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(collector));
    r
}

/// process_* for the agent: CPU, memory, file descriptors, start time.
#[derive(Debug, Default)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let tick = procfs::ticks_per_second().max(1) as f64;
        let me = procfs::process::Process::myself().ok();
        if let Some(stat) = me.as_ref().and_then(|p| p.stat().ok()) {
            single(
                &mut enc,
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                MetricType::Counter,
                Some((stat.utime + stat.stime) as f64 / tick),
            )?;
            single(
                &mut enc,
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                MetricType::Gauge,
                Some(stat.rss as f64 * procfs::page_size() as f64),
            )?;
            single(
                &mut enc,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                MetricType::Gauge,
                Some(stat.vsize as f64),
            )?;
            if let Ok(boot) = procfs::boot_time_secs() {
                single(
                    &mut enc,
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds.",
                    MetricType::Gauge,
                    Some(boot as f64 + stat.starttime as f64 / tick),
                )?;
            }
        }
        if let Some(fds) = me.as_ref().and_then(|p| p.fd_count().ok()) {
            single(
                &mut enc,
                "process_open_fds",
                "Number of open file descriptors.",
                MetricType::Gauge,
                Some(fds as f64),
            )?;
        }
        if let Some(max) = rustix::process::getrlimit(rustix::process::Resource::Nofile).current {
            single(
                &mut enc,
                "process_max_fds",
                "Maximum number of open file descriptors.",
                MetricType::Gauge,
                Some(max as f64),
            )?;
        }
        Ok(())
    }
}

/// Run counts and run time of the kernel programs (counted while
/// `kernel.bpf_stats_enabled` is 1).
pub struct EbpfProgramCollector(pub Arc<EbpfSource>);

impl Collector for EbpfProgramCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let stats = self.0.program_stats();
        family(
            &mut enc,
            "swiftlet_ebpf_program_runs",
            "Runs of each eBPF program (counted while kernel.bpf_stats_enabled=1)",
            MetricType::Counter,
            stats.iter().map(|(n, runs, _)| ([("program", n.as_str())], *runs as f64)),
        )?;
        family(
            &mut enc,
            "swiftlet_ebpf_program_run_seconds",
            "Time spent in each eBPF program (counted while kernel.bpf_stats_enabled=1)",
            MetricType::Counter,
            stats.iter().map(|(n, _, ns)| ([("program", n.as_str())], secs(*ns))),
        )?;
        let enabled = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        family(
            &mut enc,
            "swiftlet_ebpf_stats_enabled",
            "1 while kernel.bpf_stats_enabled counts the eBPF programs' run time",
            MetricType::Gauge,
            [([("source", "sysctl")], enabled)],
        )
    }
}

impl std::fmt::Debug for EbpfProgramCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EbpfProgramCollector")
    }
}
