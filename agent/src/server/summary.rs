//! The kubelet's Summary API types (`/stats/summary`,
//! k8s.io/kubelet/pkg/apis/stats/v1alpha1), field for field in its JSON:
//! metrics-server, `kubectl top` (through it) and monitoring agents read
//! them. k8s-openapi has no stats types, hence these.

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use serde::{Deserialize, Serialize};

use super::stats::{CgroupSample, FsSample, InterfaceSample, StatsSnapshot};
use crate::psi::{Pressure, PsiLine};

/// System container names in `node.systemContainers`.
pub const SYSTEM_CONTAINER_KUBELET: &str = "kubelet";
pub const SYSTEM_CONTAINER_RUNTIME: &str = "runtime";
pub const SYSTEM_CONTAINER_PODS: &str = "pods";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
}

#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub system_containers: Vec<ContainerStats>,
    pub start_time: Time,
    pub cpu: Option<CpuStats>,
    pub memory: Option<MemoryStats>,
    pub io: Option<IoStats>,
    pub network: Option<NetworkStats>,
    pub fs: Option<FsStats>,
    pub runtime: Option<RuntimeStats>,
    pub rlimit: Option<RlimitStats>,
}

#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RlimitStats {
    pub time: Time,
    /// The maximum number of process ids (pid_max).
    pub maxpid: Option<i64>,
    /// Running processes (threads included, as sysinfo counts them).
    pub curproc: Option<i64>,
}

#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    pub image_fs: Option<FsStats>,
    pub container_fs: Option<FsStats>,
}

#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessStats {
    pub process_count: Option<u64>,
}

#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodReference,
    pub start_time: Time,
    pub containers: Vec<ContainerStats>,
    pub cpu: Option<CpuStats>,
    pub memory: Option<MemoryStats>,
    pub io: Option<IoStats>,
    pub network: Option<NetworkStats>,
    #[serde(default, rename = "volume", skip_serializing_if = "Vec::is_empty")]
    pub volume_stats: Vec<VolumeStats>,
    #[serde(rename = "ephemeral-storage")]
    pub ephemeral_storage: Option<FsStats>,
    #[serde(rename = "process_stats")]
    pub process_stats: Option<ProcessStats>,
}

#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    pub start_time: Time,
    pub cpu: Option<CpuStats>,
    pub memory: Option<MemoryStats>,
    pub io: Option<IoStats>,
    pub rootfs: Option<FsStats>,
    pub logs: Option<FsStats>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodReference {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStats {
    pub name: String,
    pub rx_bytes: Option<u64>,
    pub rx_errors: Option<u64>,
    pub tx_bytes: Option<u64>,
    pub tx_errors: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NetworkStats {
    pub time: Time,
    /// The default interface, inline.
    #[serde(flatten)]
    pub interface: InterfaceStats,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceStats>,
}

#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    pub time: Time,
    /// Average usage over the last sampling interval, in nanocores.
    pub usage_nano_cores: Option<u64>,
    /// Cumulative CPU time, in core-nanoseconds.
    pub usage_core_nano_seconds: Option<u64>,
    pub psi: Option<PsiStats>,
}

/// IO stats (KEP-4205): only pressure so far.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IoStats {
    pub time: Time,
    pub psi: Option<PsiStats>,
}

/// Pressure stall information of one resource (KEP-4205). `full` is
/// always present, as in the kubelet's type: zeros where the kernel has no
/// `full` line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PsiStats {
    pub full: PsiData,
    pub some: PsiData,
}

/// `total` is the kernel's cumulative stall in microseconds, passed on
/// as the kubelet passes it; the averages are percentages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PsiData {
    pub total: u64,
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
}

impl From<&PsiLine> for PsiData {
    fn from(l: &PsiLine) -> PsiData {
        PsiData { total: l.total_us, avg10: l.avg10, avg60: l.avg60, avg300: l.avg300 }
    }
}

fn psi_stats(p: Option<Pressure>) -> Option<PsiStats> {
    p.map(|p| PsiStats { full: p.full.as_ref().map(PsiData::from).unwrap_or_default(), some: (&p.some).into() })
}

fn io(s: &CgroupSample, at: Timestamp) -> Option<IoStats> {
    psi_stats(s.psi.io).map(|psi| IoStats { time: t(at), psi: Some(psi) })
}

#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub time: Time,
    pub available_bytes: Option<u64>,
    pub usage_bytes: Option<u64>,
    pub working_set_bytes: Option<u64>,
    pub rss_bytes: Option<u64>,
    pub page_faults: Option<u64>,
    pub major_page_faults: Option<u64>,
    pub psi: Option<PsiStats>,
}

#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    pub time: Time,
    pub available_bytes: Option<u64>,
    pub capacity_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub inodes_free: Option<u64>,
    pub inodes: Option<u64>,
    pub inodes_used: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStats {
    #[serde(flatten)]
    pub fs: FsStats,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The claim behind the volume (persistent volumes only).
    #[serde(default, rename = "pvcRef", skip_serializing_if = "Option::is_none")]
    pub pvc_ref: Option<PvcReference>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PvcReference {
    pub name: String,
    pub namespace: String,
}

/// The mounted claims' usage as the pods' `volume` entries with `pvcRef`
/// (as last read, every volumeStatsAggPeriod).
pub fn add_claims(s: &mut Summary, claims: &[crate::metrics::storage::ClaimStatsRow]) {
    let u = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok());
    for p in &mut s.pods {
        for c in claims.iter().filter(|c| c.pod_uid == p.pod_ref.uid) {
            p.volume_stats.push(VolumeStats {
                fs: FsStats {
                    time: c.time.map(Time).unwrap_or_else(|| Time(Timestamp::now())),
                    available_bytes: u(c.available_bytes),
                    capacity_bytes: u(c.capacity_bytes),
                    used_bytes: u(c.used_bytes),
                    inodes_free: u(c.inodes_free),
                    inodes: u(c.inodes),
                    inodes_used: u(c.inodes_used),
                },
                name: c.volume.clone(),
                pvc_ref: Some(PvcReference { name: c.persistentvolumeclaim.clone(), namespace: c.namespace.clone() }),
            });
        }
    }
}

fn network_stats(default: &InterfaceSample, all: &[InterfaceSample], at: Timestamp) -> NetworkStats {
    let conv = |i: &InterfaceSample| InterfaceStats {
        name: i.name.clone(),
        rx_bytes: Some(i.rx_bytes),
        rx_errors: Some(i.rx_errors),
        tx_bytes: Some(i.tx_bytes),
        tx_errors: Some(i.tx_errors),
    };
    NetworkStats { time: t(at), interface: conv(default), interfaces: all.iter().map(conv).collect() }
}

fn t(ts: Timestamp) -> Time {
    Time(ts)
}

fn cpu(s: &CgroupSample, at: Timestamp) -> Option<CpuStats> {
    s.cpu_usage_ns.map(|u| CpuStats {
        time: t(at),
        usage_nano_cores: s.cpu_nano_cores,
        usage_core_nano_seconds: Some(u),
        psi: psi_stats(s.psi.cpu),
    })
}

fn memory(s: &CgroupSample, at: Timestamp, capacity: Option<u64>) -> Option<MemoryStats> {
    s.working_set?;
    let available = match (s.memory_limit.or(capacity), s.working_set) {
        (Some(limit), Some(ws)) => Some(limit.saturating_sub(ws)),
        _ => None,
    };
    Some(MemoryStats {
        time: t(at),
        available_bytes: available,
        usage_bytes: s.memory_usage,
        working_set_bytes: s.working_set,
        rss_bytes: s.rss,
        page_faults: s.page_faults,
        major_page_faults: s.major_page_faults,
        psi: psi_stats(s.psi.memory),
    })
}

fn fs_stats(f: &FsSample, at: Timestamp) -> FsStats {
    FsStats {
        time: t(at),
        available_bytes: f.available,
        capacity_bytes: f.capacity,
        used_bytes: f.used,
        inodes_free: f.inodes_free,
        inodes: f.inodes,
        inodes_used: f.inodes_used,
    }
}

/// The Summary API response for a sample.
pub fn summary(s: &StatsSnapshot) -> Summary {
    let at = s.time;
    let n = &s.node;
    let network = n
        .interfaces
        .iter()
        .max_by_key(|i| i.rx_bytes + i.tx_bytes)
        .map(|default| network_stats(default, &n.interfaces, at));
    let node = NodeStats {
        node_name: s.node_name.clone(),
        system_containers: n
            .system
            .iter()
            .map(|(name, c)| ContainerStats {
                name: name.clone(),
                start_time: t(n.start_time),
                cpu: cpu(c, at),
                memory: memory(c, at, None),
                io: io(c, at),
                rootfs: None,
                logs: None,
            })
            .collect(),
        start_time: t(n.start_time),
        cpu: cpu(&n.root, at),
        memory: memory(&n.root, at, Some(n.memory_capacity)),
        io: io(&n.root, at),
        network,
        fs: n.fs.as_ref().map(|f| fs_stats(f, at)),
        // As the kubelet's CRI stats provider: the container filesystem is
        // the image filesystem unless the runtime reports one of its own.
        runtime: n.imagefs.as_ref().map(|f| RuntimeStats {
            image_fs: Some(fs_stats(f, at)),
            container_fs: Some(fs_stats(n.containerfs.as_ref().unwrap_or(f), at)),
        }),
        rlimit: Some(RlimitStats {
            time: t(at),
            maxpid: n.maxpid.map(|v| v as i64),
            curproc: n.curproc.map(|v| v as i64),
        }),
    };
    let pods = s
        .pods
        .iter()
        .map(|p| PodStats {
            pod_ref: PodReference { name: p.name.clone(), namespace: p.namespace.clone(), uid: p.uid.clone() },
            start_time: t(p.start_time),
            containers: p
                .containers
                .iter()
                .map(|c| ContainerStats {
                    name: c.name.clone(),
                    start_time: t(c.start_time),
                    cpu: cpu(&c.cgroup, at),
                    memory: memory(&c.cgroup, at, None),
                    io: io(&c.cgroup, at),
                    rootfs: c.rootfs.as_ref().map(|f| fs_stats(f, at)),
                    logs: c.logs.as_ref().map(|f| fs_stats(f, at)),
                })
                .collect(),
            cpu: p.cgroup.as_ref().and_then(|c| cpu(c, at)),
            memory: p.cgroup.as_ref().and_then(|c| memory(c, at, None)),
            io: p.cgroup.as_ref().and_then(|c| io(c, at)),
            // The sandbox's namespace; its `eth0` is the pod's interface.
            network: p.sandbox.as_ref().and_then(|s| {
                let default = s.interfaces.iter().find(|i| i.name == "eth0").or(s.interfaces.first())?;
                Some(network_stats(default, &s.interfaces, at))
            }),
            volume_stats: vec![],
            ephemeral_storage: p.ephemeral.as_ref().map(|f| fs_stats(f, at)),
            process_stats: p.cgroup.as_ref().and_then(|c| c.processes).map(|n| ProcessStats { process_count: Some(n) }),
        })
        .collect();
    Summary { node, pods }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::stats::{ContainerSample, NodeSample, PodSample, SandboxSample};

    fn snapshot() -> StatsSnapshot {
        let at = Timestamp::from_second(1_700_000_060).unwrap();
        let cg = |path: &str, ws: u64| CgroupSample {
            path: path.into(),
            cpu_usage_ns: Some(2_500_000_000),
            cpu_nano_cores: Some(250_000_000),
            memory_usage: Some(ws + 10),
            working_set: Some(ws),
            rss: Some(ws / 2),
            page_faults: Some(7),
            major_page_faults: Some(1),
            memory_limit: None,
            processes: Some(3),
            oom_kills: Some(0),
            ..Default::default()
        };
        StatsSnapshot {
            time: at,
            node_name: "n1".into(),
            node: NodeSample {
                start_time: Timestamp::from_second(1_600_000_000).unwrap(),
                root: cg("", 1000),
                memory_capacity: 4000,
                fs: Some(FsSample {
                    capacity: Some(100),
                    available: Some(60),
                    used: Some(40),
                    inodes: Some(10),
                    inodes_free: Some(4),
                    inodes_used: Some(6),
                }),
                imagefs: None,
                containerfs: None,
                maxpid: Some(4_194_304),
                curproc: Some(321),
                interfaces: vec![],
                system: vec![("pods".into(), cg("kubepods", 500))],
                qos: vec![],
                machine: Default::default(),
            },
            pods: vec![PodSample {
                namespace: "default".into(),
                name: "web".into(),
                uid: "u1".into(),
                start_time: Timestamp::from_second(1_700_000_000).unwrap(),
                cgroup: Some(CgroupSample { memory_limit: Some(800), ..cg("kubepods/podu1", 300) }),
                sandbox: Some(SandboxSample {
                    id: "sb1".into(),
                    image: "pause:3".into(),
                    start_time: Timestamp::from_second(1_700_000_000).unwrap(),
                    cgroup: cg("kubepods/podu1/sb1", 1),
                    interfaces: vec![
                        InterfaceSample { name: "tunl0".into(), ..Default::default() },
                        InterfaceSample { name: "eth0".into(), rx_bytes: 900, tx_bytes: 700, ..Default::default() },
                    ],
                }),
                containers: vec![ContainerSample {
                    name: "nginx".into(),
                    id: "abc".into(),
                    image: "nginx:1".into(),
                    start_time: Timestamp::from_second(1_700_000_001).unwrap(),
                    cgroup: cg("kubepods/podu1/abc", 200),
                    rootfs: Some(FsSample { used: Some(4096), inodes_used: Some(2), ..Default::default() }),
                    logs: None,
                }],
                ephemeral: Some(FsSample { used: Some(4096), ..Default::default() }),
            }],
            errors: vec![],
        }
    }

    #[test]
    fn summary_json_has_the_kubelet_shape() {
        let v = serde_json::to_value(summary(&snapshot())).unwrap();
        let node = &v["node"];
        assert_eq!(node["nodeName"], "n1");
        assert_eq!(node["startTime"], "2020-09-13T12:26:40Z");
        assert_eq!(node["cpu"]["usageCoreNanoSeconds"], 2_500_000_000u64);
        assert_eq!(node["cpu"]["usageNanoCores"], 250_000_000u64);
        assert_eq!(node["cpu"]["time"], "2023-11-14T22:14:20Z");
        assert_eq!(node["memory"]["workingSetBytes"], 1000);
        assert_eq!(node["memory"]["availableBytes"], 3000);
        assert_eq!(node["rlimit"]["maxpid"], 4_194_304);
        assert_eq!(node["rlimit"]["curproc"], 321);
        assert_eq!(node["fs"]["inodesUsed"], 6);
        assert_eq!(node["systemContainers"][0]["name"], "pods");
        let pod = &v["pods"][0];
        assert_eq!(pod["podRef"], serde_json::json!({"name": "web", "namespace": "default", "uid": "u1"}));
        assert_eq!(pod["memory"]["availableBytes"], 500, "limit − working set");
        assert_eq!(pod["process_stats"]["process_count"], 3);
        assert_eq!(pod["ephemeral-storage"]["usedBytes"], 4096);
        // The pod's network is its sandbox's namespace, eth0 first.
        assert_eq!(pod["network"]["name"], "eth0");
        assert_eq!(pod["network"]["rxBytes"], 900);
        assert_eq!(pod["network"]["interfaces"].as_array().unwrap().len(), 2);
        let c = &pod["containers"][0];
        assert_eq!(c["name"], "nginx");
        assert_eq!(c["rootfs"]["usedBytes"], 4096);
        assert!(c["memory"].get("availableBytes").is_none(), "no limit, no available");
        assert!(c.get("logs").is_none());
        // And it reads back.
        let back: Summary = serde_json::from_value(v).unwrap();
        assert_eq!(back, summary(&snapshot()));
    }

    #[test]
    fn the_container_filesystem_is_the_image_one_unless_the_runtime_reports_its_own() {
        let fs = |used| FsSample { used: Some(used), capacity: Some(1000), ..Default::default() };
        let mut snap = snapshot();
        snap.node.imagefs = Some(fs(100));
        let v = serde_json::to_value(summary(&snap)).unwrap();
        assert_eq!(v["node"]["runtime"]["imageFs"]["usedBytes"], 100);
        assert_eq!(v["node"]["runtime"]["containerFs"]["usedBytes"], 100);
        snap.node.containerfs = Some(fs(300));
        let v = serde_json::to_value(summary(&snap)).unwrap();
        assert_eq!(v["node"]["runtime"]["imageFs"]["usedBytes"], 100);
        assert_eq!(v["node"]["runtime"]["containerFs"]["usedBytes"], 300);
    }

    #[test]
    fn psi_as_kep_4205_shapes_it_and_absent_where_there_is_none() {
        use crate::psi::{Pressure, PsiLine, PsiSample};
        let line = |avg10, total_us| PsiLine { avg10, avg60: 1.5, avg300: 0.25, total_us };
        let both = Pressure { some: line(12.5, 4000), full: Some(line(2.0, 1000)) };
        let mut snap = snapshot();
        // The node: cpu without a full line (kernels before 5.13), memory and io.
        snap.node.root.psi =
            PsiSample { cpu: Some(Pressure { some: line(3.0, 77), full: None }), memory: Some(both), io: Some(both) };
        // The container has PSI (cgroup v2); the pod does not (as on v1).
        snap.pods[0].containers[0].cgroup.psi = PsiSample { memory: Some(both), ..Default::default() };
        let v = serde_json::to_value(summary(&snap)).unwrap();
        let node = &v["node"];
        assert_eq!(
            node["memory"]["psi"],
            serde_json::json!({
                "some": {"total": 4000, "avg10": 12.5, "avg60": 1.5, "avg300": 0.25},
                "full": {"total": 1000, "avg10": 2.0, "avg60": 1.5, "avg300": 0.25},
            })
        );
        assert_eq!(node["cpu"]["psi"]["some"]["total"], 77);
        assert_eq!(
            node["cpu"]["psi"]["full"],
            serde_json::json!({"total": 0, "avg10": 0.0, "avg60": 0.0, "avg300": 0.0})
        );
        assert_eq!(node["io"]["time"], "2023-11-14T22:14:20Z");
        assert_eq!(node["io"]["psi"]["some"]["avg10"], 12.5);
        let pod = &v["pods"][0];
        assert!(pod.get("io").is_none() && pod["memory"].get("psi").is_none() && pod["cpu"].get("psi").is_none());
        let c = &pod["containers"][0];
        assert_eq!(c["memory"]["psi"]["full"]["total"], 1000);
        assert!(c.get("io").is_none() && c["cpu"].get("psi").is_none(), "only what was read");
        // Without PSI anywhere (the first snapshot) no field appears.
        let none = serde_json::to_string(&summary(&snapshot())).unwrap();
        assert!(!none.contains("psi") && !none.contains("\"io\""), "{none}");
        let back: Summary = serde_json::from_value(v).unwrap();
        assert_eq!(back, summary(&snap));
    }
}
