//! /metrics/cadvisor: cAdvisor's container and machine metrics as the
//! kubelet serves them, over the latest stats pass, with cAdvisor's names,
//! help texts, types and the kubelet's label set (`container`, `id`,
//! `image`, `name`, `namespace`, `pod`, plus each family's own labels,
//! sorted by name as client_golang writes them).
//!
//! Rows are the cgroups cAdvisor reports under the kubelet: the root
//! (`id="/"`), kubepods and its QoS cgroups, each pod's cgroup
//! (`container=""`, `image=""`), each pod's sandbox (`container=""`, the
//! pause image, `name` its id; it alone carries the pod's network
//! counters, read from its network namespace, as cAdvisor reports
//! network only for sandboxes), and each running container. Network
//! counters of the root are the host's. CFS throttling and
//! `container_spec_cpu_quota` appear only for cgroups with a quota, as
//! in cAdvisor.

use std::{fmt, sync::Arc};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use super::{
    cgroup_sample::{CgroupSample, InterfaceSample},
    stats::{StatsSnapshot, unix_seconds},
};

type Labels<'a> = Vec<(&'a str, &'a str)>;

/// One cgroup as cAdvisor labels it.
pub(super) struct Row<'a> {
    container: &'a str,
    id: String,
    image: &'a str,
    name: &'a str,
    namespace: &'a str,
    pod: &'a str,
    pub(super) cgroup: &'a CgroupSample,
    start: f64,
    interfaces: &'a [InterfaceSample],
    fs_usage: Option<u64>,
}

impl<'a> Row<'a> {
    /// The base labels plus `extra`, sorted by name.
    fn labels(&'a self, extra: &[(&'a str, &'a str)]) -> Labels<'a> {
        let mut l: Labels<'a> = vec![
            ("container", self.container),
            ("id", self.id.as_str()),
            ("image", self.image),
            ("name", self.name),
            ("namespace", self.namespace),
            ("pod", self.pod),
        ];
        l.extend_from_slice(extra);
        l.sort_by_key(|(k, _)| *k);
        l
    }
}

fn id_of(path: &str) -> String {
    format!("/{}", path.trim_matches('/'))
}

/// The rows of a stats pass.
fn rows<'a>(s: &'a StatsSnapshot) -> Vec<Row<'a>> {
    let host = |cgroup: &'a CgroupSample, start: f64| Row {
        container: "",
        id: id_of(&cgroup.path),
        image: "",
        name: "",
        namespace: "",
        pod: "",
        cgroup,
        start,
        interfaces: &[],
        fs_usage: None,
    };
    let boot = unix_seconds(s.node.start_time);
    let mut rows = vec![Row { interfaces: &s.node.interfaces, ..host(&s.node.root, boot) }];
    rows.extend(s.node.system.iter().map(|(_, c)| host(c, boot)));
    rows.extend(s.node.qos.iter().map(|c| host(c, boot)));
    for p in &s.pods {
        let pod_row = |container: &'a str, image: &'a str, name: &'a str, cgroup: &'a CgroupSample, start: f64| Row {
            container,
            id: id_of(&cgroup.path),
            image,
            name,
            namespace: &p.namespace,
            pod: &p.name,
            cgroup,
            start,
            interfaces: &[],
            fs_usage: None,
        };
        if let Some(c) = &p.cgroup {
            rows.push(pod_row("", "", "", c, unix_seconds(p.start_time)));
        }
        if let Some(sb) = &p.sandbox {
            rows.push(Row {
                interfaces: &sb.interfaces,
                ..pod_row("", &sb.image, &sb.id, &sb.cgroup, unix_seconds(sb.start_time))
            });
        }
        for c in &p.containers {
            if c.cgroup.path.is_empty() {
                continue;
            }
            rows.push(Row {
                fs_usage: c.rootfs.and_then(|f| f.used),
                ..pod_row(&c.name, &c.image, &c.id, &c.cgroup, unix_seconds(c.start_time))
            });
        }
    }
    rows
}

/// Writes one family.
fn family<'a>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: impl IntoIterator<Item = (Labels<'a>, f64)>,
) -> fmt::Result {
    // prometheus-client appends `_total` to a counter's samples itself.
    let name = if matches!(kind, MetricType::Counter) { name.strip_suffix("_total").unwrap_or(name) } else { name };
    let mut me = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, v) in samples {
        let fe = me.encode_family(&labels)?;
        match kind {
            MetricType::Counter => ConstCounter::new(v).encode(fe)?,
            _ => ConstGauge::new(v).encode(fe)?,
        }
    }
    Ok(())
}

/// A family with one sample per row that has a value.
pub(super) fn per_row(
    enc: &mut DescriptorEncoder,
    rows: &[Row],
    name: &str,
    help: &str,
    kind: MetricType,
    value: impl Fn(&Row) -> Option<f64>,
) -> fmt::Result {
    family(enc, name, help, kind, rows.iter().filter_map(|r| value(r).map(|v| (r.labels(&[]), v))))
}

/// A family with one sample per (row, extra label value).
fn per_row_and<'a, T: 'a>(
    enc: &mut DescriptorEncoder,
    rows: &'a [Row<'a>],
    name: &str,
    help: &str,
    kind: MetricType,
    items: impl Fn(&'a Row<'a>) -> Vec<T>,
    sample: impl Fn(&'a Row<'a>, &T) -> Option<(Labels<'a>, f64)>,
) -> fmt::Result {
    let samples: Vec<(Labels<'a>, f64)> =
        rows.iter().flat_map(|r| items(r).into_iter().filter_map(|i| sample(r, &i)).collect::<Vec<_>>()).collect();
    family(enc, name, help, kind, samples)
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// cAdvisor's metrics over a stats pass.
#[derive(Debug)]
pub struct CadvisorCollector(pub Arc<StatsSnapshot>);

impl Collector for CadvisorCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        use MetricType::{Counter, Gauge};
        let s = &self.0;
        let rows = rows(s);
        let e = &mut enc;
        let n = |v: Option<u64>| v.map(|v| v as f64);
        let seen = unix_seconds(s.time);
        per_row(e, &rows, "container_last_seen", "Last time a container was seen by the exporter", Gauge, |_| {
            Some(seen)
        })?;
        family(
            e,
            "container_cpu_usage_seconds_total",
            "Cumulative cpu time consumed in seconds.",
            Counter,
            rows.iter().filter_map(|r| r.cgroup.cpu_usage_ns.map(|v| (r.labels(&[("cpu", "total")]), secs(v)))),
        )?;
        let cpu = [
            ("container_cpu_user_seconds_total", "Cumulative user cpu time consumed in seconds.", 0),
            ("container_cpu_system_seconds_total", "Cumulative system cpu time consumed in seconds.", 1),
        ];
        for (name, help, which) in cpu {
            per_row(e, &rows, name, help, Counter, |r| {
                if which == 0 { r.cgroup.cpu_user_ns } else { r.cgroup.cpu_system_ns }.map(secs)
            })?;
        }
        // CFS statistics only where a quota is set (cAdvisor's condition).
        let cfs = |r: &Row| r.cgroup.cfs.filter(|_| r.cgroup.spec.cpu_quota_us.is_some());
        per_row(
            e,
            &rows,
            "container_cpu_cfs_periods_total",
            "Number of elapsed enforcement period intervals.",
            Counter,
            |r| cfs(r).map(|c| c.periods as f64),
        )?;
        per_row(
            e,
            &rows,
            "container_cpu_cfs_throttled_periods_total",
            "Number of throttled period intervals.",
            Counter,
            |r| cfs(r).map(|c| c.throttled_periods as f64),
        )?;
        per_row(
            e,
            &rows,
            "container_cpu_cfs_throttled_seconds_total",
            "Total time duration the container has been throttled.",
            Counter,
            |r| cfs(r).map(|c| secs(c.throttled_ns)),
        )?;
        per_row(e, &rows, "container_memory_cache", "Number of bytes of page cache memory.", Gauge, |r| {
            n(r.cgroup.cache)
        })?;
        per_row(e, &rows, "container_memory_rss", "Size of RSS in bytes.", Gauge, |r| n(r.cgroup.rss))?;
        per_row(e, &rows, "container_memory_mapped_file", "Size of memory mapped files in bytes.", Gauge, |r| {
            n(r.cgroup.mapped_file)
        })?;
        per_row(e, &rows, "container_memory_swap", "Container swap usage in bytes.", Gauge, |r| n(r.cgroup.swap))?;
        per_row(
            e,
            &rows,
            "container_memory_usage_bytes",
            "Current memory usage in bytes, including all memory regardless of when it was accessed",
            Gauge,
            |r| n(r.cgroup.memory_usage),
        )?;
        per_row(e, &rows, "container_memory_working_set_bytes", "Current working set in bytes.", Gauge, |r| {
            n(r.cgroup.working_set)
        })?;
        per_row_and(
            e,
            &rows,
            "container_memory_failures_total",
            "Cumulative count of memory allocation failures.",
            Counter,
            |r| {
                let c = r.cgroup;
                vec![
                    ("pgfault", "container", c.container_page_faults),
                    ("pgmajfault", "container", c.container_major_page_faults),
                    ("pgfault", "hierarchy", c.page_faults),
                    ("pgmajfault", "hierarchy", c.major_page_faults),
                ]
            },
            |r, (kind, scope, v)| v.map(|v| (r.labels(&[("failure_type", kind), ("scope", scope)]), v as f64)),
        )?;
        let io = [
            ("container_fs_reads_bytes_total", "Cumulative count of bytes read", 0),
            ("container_fs_reads_total", "Cumulative count of reads completed", 1),
            ("container_fs_writes_bytes_total", "Cumulative count of bytes written", 2),
            ("container_fs_writes_total", "Cumulative count of writes completed", 3),
        ];
        for (name, help, which) in io {
            per_row_and(
                e,
                &rows,
                name,
                help,
                Counter,
                |r| r.cgroup.io.iter().collect(),
                |r, d| {
                    let v = [d.read_bytes, d.reads, d.write_bytes, d.writes][which];
                    Some((r.labels(&[("device", d.device.as_str())]), v as f64))
                },
            )?;
        }
        per_row(
            e,
            &rows,
            "container_fs_usage_bytes",
            "Number of bytes that are consumed by the container on this filesystem.",
            Gauge,
            |r| n(r.fs_usage),
        )?;
        let net = [
            ("container_network_receive_bytes_total", "Cumulative count of bytes received", 0),
            ("container_network_receive_packets_total", "Cumulative count of packets received", 1),
            (
                "container_network_receive_packets_dropped_total",
                "Cumulative count of packets dropped while receiving",
                2,
            ),
            ("container_network_receive_errors_total", "Cumulative count of errors encountered while receiving", 3),
            ("container_network_transmit_bytes_total", "Cumulative count of bytes transmitted", 4),
            ("container_network_transmit_packets_total", "Cumulative count of packets transmitted", 5),
            (
                "container_network_transmit_packets_dropped_total",
                "Cumulative count of packets dropped while transmitting",
                6,
            ),
            ("container_network_transmit_errors_total", "Cumulative count of errors encountered while transmitting", 7),
        ];
        for (name, help, which) in net {
            per_row_and(
                e,
                &rows,
                name,
                help,
                Counter,
                |r| r.interfaces.iter().collect(),
                |r, i| {
                    let v = [
                        i.rx_bytes,
                        i.rx_packets,
                        i.rx_dropped,
                        i.rx_errors,
                        i.tx_bytes,
                        i.tx_packets,
                        i.tx_dropped,
                        i.tx_errors,
                    ][which];
                    Some((r.labels(&[("interface", i.name.as_str())]), v as f64))
                },
            )?;
        }
        per_row(e, &rows, "container_processes", "Number of processes running inside the container.", Gauge, |r| {
            n(r.cgroup.processes)
        })?;
        per_row(e, &rows, "container_threads", "Number of threads running inside the container", Gauge, |r| {
            n(r.cgroup.threads)
        })?;
        per_row(
            e,
            &rows,
            "container_threads_max",
            "Maximum number of threads allowed inside the container, infinity if value is zero",
            Gauge,
            // Unlimited is 0, as cAdvisor writes it.
            |r| r.cgroup.threads.map(|_| r.cgroup.spec.pids_max.unwrap_or(0) as f64),
        )?;
        per_row(
            e,
            &rows,
            "container_oom_events_total",
            "Count of out of memory events observed for the container",
            Counter,
            |r| n(r.cgroup.oom_kills),
        )?;
        self.encode_spec(e, &rows)?;
        super::cadvisor_psi::encode(e, &rows)?;
        per_row(
            e,
            &rows,
            "container_start_time_seconds",
            "Start time of the container since unix epoch in seconds.",
            Gauge,
            |r| Some(r.start),
        )?;
        let error = if s.errors.is_empty() { 0.0 } else { 1.0 };
        family(
            e,
            "container_scrape_error",
            "1 if there was an error while getting container metrics, 0 otherwise",
            Gauge,
            [(vec![], error)],
        )?;
        self.encode_machine(e)
    }
}

impl CadvisorCollector {
    /// container_spec_*: what the cgroup is configured with (unlimited is 0).
    fn encode_spec(&self, e: &mut DescriptorEncoder, rows: &[Row]) -> fmt::Result {
        use MetricType::Gauge;
        // Rows whose cgroup was read (cAdvisor's HasCpu/HasMemory).
        let read = |r: &Row| r.cgroup.working_set.is_some();
        let spec = |r: &Row| read(r).then_some(r.cgroup.spec);
        per_row(e, rows, "container_spec_cpu_period", "CPU period of the container.", Gauge, |r| {
            spec(r).and_then(|s| s.cpu_period_us).map(|v| v as f64)
        })?;
        per_row(e, rows, "container_spec_cpu_quota", "CPU quota of the container.", Gauge, |r| {
            spec(r).and_then(|s| s.cpu_quota_us).map(|v| v as f64)
        })?;
        per_row(e, rows, "container_spec_cpu_shares", "CPU share of the container.", Gauge, |r| {
            spec(r).and_then(|s| s.cpu_shares).map(|v| v as f64)
        })?;
        per_row(e, rows, "container_spec_memory_limit_bytes", "Memory limit for the container.", Gauge, |r| {
            read(r).then(|| r.cgroup.memory_limit.unwrap_or(0) as f64)
        })?;
        per_row(
            e,
            rows,
            "container_spec_memory_reservation_limit_bytes",
            "Memory reservation limit for the container.",
            Gauge,
            |r| spec(r).map(|s| s.memory_reservation.unwrap_or(0) as f64),
        )?;
        per_row(e, rows, "container_spec_memory_swap_limit_bytes", "Memory swap limit for the container.", Gauge, |r| {
            spec(r).map(|s| s.memory_swap_limit.unwrap_or(0) as f64)
        })
    }

    /// machine_*.
    fn encode_machine(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        use MetricType::Gauge;
        let m = &self.0.node.machine;
        let labels = || {
            vec![
                ("boot_id", m.boot_id.as_str()),
                ("machine_id", m.machine_id.as_str()),
                ("system_uuid", m.system_uuid.as_str()),
            ]
        };
        for (name, help, v) in [
            ("machine_cpu_cores", "Number of logical CPU cores.", m.cpu_cores),
            ("machine_cpu_physical_cores", "Number of physical CPU cores.", m.cpu_physical_cores),
            ("machine_cpu_sockets", "Number of CPU sockets.", m.cpu_sockets),
            ("machine_memory_bytes", "Amount of memory installed on the machine.", m.memory_bytes),
            ("machine_swap_bytes", "Amount of swap memory available on the machine.", m.swap_bytes),
        ] {
            family(e, name, help, Gauge, [(labels(), v as f64)])?;
        }
        // cadvisor_version_info is left out: its camelCase label names
        // (kernelVersion, ...) fail `promtool check metrics`;
        // kubernetes_build_info and node status carry the versions.
        family(
            e,
            "machine_scrape_error",
            "1 if there was an error while getting machine metrics, 0 otherwise.",
            Gauge,
            [(vec![], 0.0)],
        )
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::server::{
        cgroup_sample::{CfsStats, CgroupSpec, DeviceIo},
        collectors::registry_with,
        exposition,
        stats::{ContainerSample, NodeSample, PodSample, SandboxSample},
        stats_read::MachineSample,
    };

    fn cg(path: &str) -> CgroupSample {
        CgroupSample {
            path: path.into(),
            cpu_usage_ns: Some(2_000_000_000),
            memory_usage: Some(1000),
            working_set: Some(800),
            rss: Some(500),
            cache: Some(300),
            swap: Some(0),
            page_faults: Some(10),
            major_page_faults: Some(1),
            container_page_faults: Some(4),
            container_major_page_faults: Some(0),
            ..Default::default()
        }
    }

    fn snapshot() -> StatsSnapshot {
        let eth0 = InterfaceSample { name: "eth0".into(), rx_bytes: 1234, tx_packets: 7, ..Default::default() };
        let limited = CgroupSample {
            cfs: Some(CfsStats { periods: 50, throttled_periods: 5, throttled_ns: 2_500_000_000 }),
            spec: CgroupSpec {
                cpu_period_us: Some(100_000),
                cpu_quota_us: Some(50_000),
                cpu_shares: Some(51),
                ..Default::default()
            },
            memory_limit: Some(64 << 20),
            threads: Some(3),
            io: vec![DeviceIo { device: "/dev/vda".into(), read_bytes: 4096, write_bytes: 8192, reads: 1, writes: 2 }],
            ..cg("kubepods/burstable/podu1/c1")
        };
        StatsSnapshot {
            time: Timestamp::from_second(1_700_000_060).unwrap(),
            node_name: "n1".into(),
            node: NodeSample {
                start_time: Timestamp::from_second(1_600_000_000).unwrap(),
                root: cg(""),
                memory_capacity: 4000,
                fs: None,
                imagefs: None,
                containerfs: None,
                maxpid: None,
                curproc: None,
                interfaces: vec![InterfaceSample { name: "ens3".into(), rx_bytes: 99, ..Default::default() }],
                system: vec![("pods".into(), cg("kubepods"))],
                qos: vec![cg("kubepods/burstable")],
                machine: Arc::new(MachineSample {
                    machine_id: "m".into(),
                    system_uuid: "u".into(),
                    boot_id: "b".into(),
                    cpu_cores: 2,
                    cpu_physical_cores: 2,
                    cpu_sockets: 1,
                    memory_bytes: 1 << 30,
                    ..Default::default()
                }),
            },
            pods: vec![PodSample {
                namespace: "default".into(),
                name: "web".into(),
                uid: "u1".into(),
                start_time: Timestamp::from_second(1_700_000_000).unwrap(),
                cgroup: Some(cg("kubepods/burstable/podu1")),
                sandbox: Some(SandboxSample {
                    id: "sb1".into(),
                    image: "registry.k8s.io/pause:3.10".into(),
                    start_time: Timestamp::from_second(1_700_000_000).unwrap(),
                    cgroup: cg("kubepods/burstable/podu1/sb1"),
                    interfaces: vec![eth0],
                }),
                containers: vec![ContainerSample {
                    name: "app".into(),
                    id: "c1".into(),
                    image: "nginx:1".into(),
                    start_time: Timestamp::from_second(1_700_000_001).unwrap(),
                    cgroup: limited,
                    rootfs: None,
                    logs: None,
                }],
                ephemeral: None,
            }],
            errors: vec![],
        }
    }

    #[test]
    fn series_carry_cadvisors_names_and_the_kubelets_labels() {
        let text = exposition::encode(&[&registry_with(CadvisorCollector(Arc::new(snapshot())))]);
        let pod = r#"namespace="default",pod="web""#;
        for want in [
            // The pod's cgroup: container and image empty.
            format!(r#"container_memory_working_set_bytes{{container="",id="/kubepods/burstable/podu1",image="",name="",{pod}}} 800"#),
            // The pod's network, from its sandbox's namespace.
            format!(r#"container_network_receive_bytes_total{{container="",id="/kubepods/burstable/podu1/sb1",image="registry.k8s.io/pause:3.10",interface="eth0",name="sb1",{pod}}} 1234"#),
            format!(r#"container_network_transmit_packets_total{{container="",id="/kubepods/burstable/podu1/sb1",image="registry.k8s.io/pause:3.10",interface="eth0",name="sb1",{pod}}} 7"#),
            format!(r#"container_cpu_usage_seconds_total{{container="app",cpu="total",id="/kubepods/burstable/podu1/c1",image="nginx:1",name="c1",{pod}}} 2"#),
            format!(r#"container_cpu_cfs_periods_total{{container="app",id="/kubepods/burstable/podu1/c1",image="nginx:1",name="c1",{pod}}} 50"#),
            format!(r#"container_cpu_cfs_throttled_periods_total{{container="app",id="/kubepods/burstable/podu1/c1",image="nginx:1",name="c1",{pod}}} 5"#),
            format!(r#"container_cpu_cfs_throttled_seconds_total{{container="app",id="/kubepods/burstable/podu1/c1",image="nginx:1",name="c1",{pod}}} 2.5"#),
            format!(r#"container_spec_cpu_quota{{container="app",id="/kubepods/burstable/podu1/c1",image="nginx:1",name="c1",{pod}}} 50000"#),
            format!(r#"container_spec_memory_limit_bytes{{container="app",id="/kubepods/burstable/podu1/c1",image="nginx:1",name="c1",{pod}}} 67108864"#),
            format!(r#"container_fs_writes_bytes_total{{container="app",device="/dev/vda",id="/kubepods/burstable/podu1/c1",image="nginx:1",name="c1",{pod}}} 8192"#),
            format!(r#"container_memory_failures_total{{container="app",failure_type="pgfault",id="/kubepods/burstable/podu1/c1",image="nginx:1",name="c1",{pod},scope="container"}} 4"#),
            format!(r#"container_threads_max{{container="app",id="/kubepods/burstable/podu1/c1",image="nginx:1",name="c1",{pod}}} 0"#),
            r#"container_memory_cache{container="",id="/",image="",name="",namespace="",pod=""} 300"#.to_owned(),
            r#"container_network_receive_bytes_total{container="",id="/",image="",interface="ens3",name="",namespace="",pod=""} 99"#.to_owned(),
            r#"container_last_seen{container="",id="/kubepods/burstable",image="",name="",namespace="",pod=""} 1700000060"#.to_owned(),
            r#"machine_cpu_cores{boot_id="b",machine_id="m",system_uuid="u"} 2"#.to_owned(),
            r#"machine_memory_bytes{boot_id="b",machine_id="m",system_uuid="u"} 1073741824"#.to_owned(),
            "container_scrape_error 0".to_owned(),
        ] {
            assert!(text.lines().any(|l| l == want), "{want} missing:\n{text}");
        }
        // No network on the pod's or containers' own cgroups, no CFS
        // statistics without a quota.
        for l in text.lines().filter(|l| l.starts_with("container_network_")) {
            assert!(l.contains(r#"id="/""#) || l.contains("/sb1\""), "{l}");
        }
        assert_eq!(text.lines().filter(|l| l.starts_with("container_cpu_cfs_periods_total")).count(), 1);
        assert!(text.contains("# TYPE container_network_receive_bytes_total counter"));
    }
}
