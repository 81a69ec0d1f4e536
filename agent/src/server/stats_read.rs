//! One stats pass: the node (root cgroup, filesystems, processes,
//! interfaces, the machine), kubepods and its QoS cgroups, and for each
//! pod its cgroup, its sandbox's cgroup and network namespace, and its
//! running containers' cgroups, writable layers and logs.
//!
//! /proc is read through procfs (boot time, meminfo, the processor
//! count); the socket and core counts are parsed from /proc/cpuinfo here,
//! as cAdvisor counts them, since procfs gives each processor's fields but
//! no topology.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use procfs::{Current, FromBufRead};

use super::{
    cgroup_sample::{
        CgroupSample, DeviceNames, Reads, SpecCache, first_process, has_io, net_dev_of, parse_net_dev, sample_cgroup,
    },
    stats::{
        ContainerSample, FsSample, NodeSample, PodSample, RuntimeView, SandboxSample, StatsConfig, from_unix_nanos,
    },
    summary::SYSTEM_CONTAINER_PODS,
};
use crate::{
    cgroups::{CgroupFs, Version, subtree_processes},
    cm::{
        naming::CgroupDriver,
        qos::{QosClass, pod_qos},
    },
    cri::api,
    psi,
    signals::node,
};

/// What cAdvisor reports about the machine (`machine_*`), read once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineSample {
    pub machine_id: String,
    pub system_uuid: String,
    pub boot_id: String,
    /// Logical CPUs online.
    pub cpu_cores: u64,
    pub cpu_physical_cores: u64,
    pub cpu_sockets: u64,
    pub memory_bytes: u64,
    pub swap_bytes: u64,
}

impl MachineSample {
    pub fn read() -> MachineSample {
        let info = crate::node::info::machine_info();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let (physical, sockets) = parse_cpu_topology(&cpuinfo);
        let meminfo = procfs::Meminfo::current().ok();
        let online = std::thread::available_parallelism().map_or(0, |n| n.get() as u64);
        // Processors online, whatever this thread's affinity.
        let configured = procfs::CpuInfo::from_buf_read(cpuinfo.as_bytes()).map_or(0, |c| c.num_cores() as u64);
        MachineSample {
            machine_id: info.machine_id,
            system_uuid: info.system_uuid,
            boot_id: info.boot_id,
            cpu_cores: configured.max(online),
            cpu_physical_cores: physical,
            cpu_sockets: sockets,
            memory_bytes: meminfo.as_ref().map_or(0, |m| m.mem_total),
            swap_bytes: meminfo.as_ref().map_or(0, |m| m.swap_total),
        }
    }
}

/// (physical cores, sockets) from /proc/cpuinfo: distinct (physical id,
/// core id) pairs and distinct physical ids, as cAdvisor counts them; a
/// machine that reports neither (some VMs, other architectures) counts
/// each processor as a core of one socket.
pub fn parse_cpu_topology(cpuinfo: &str) -> (u64, u64) {
    let mut cores = std::collections::BTreeSet::new();
    let mut sockets = std::collections::BTreeSet::new();
    let mut processors = 0u64;
    let mut physical = None;
    for l in cpuinfo.lines().chain(std::iter::once("")) {
        let (k, v) = l.split_once(':').map(|(k, v)| (k.trim(), v.trim())).unwrap_or(("", ""));
        match k {
            "processor" => processors += 1,
            "physical id" => {
                physical = Some(v.to_owned());
                sockets.insert(v.to_owned());
            }
            "core id" => {
                cores.insert((physical.clone().unwrap_or_default(), v.to_owned()));
            }
            _ => {}
        }
    }
    if cores.is_empty() {
        return (processors, u64::from(processors > 0));
    }
    (cores.len() as u64, sockets.len().max(1) as u64)
}

/// statvfs of `path`: capacity, available (to unprivileged users) and
/// used = capacity − free, as cAdvisor (and so the kubelet's Summary API)
/// reports them, so root's reserved blocks count as used.
pub fn fs_sample(path: &Path) -> std::io::Result<FsSample> {
    let st = rustix::fs::statvfs(path)?;
    Ok(fs_from_statvfs(st.f_frsize, st.f_blocks, st.f_bfree, st.f_bavail, st.f_files, st.f_ffree))
}

/// The figures of a statvfs answer (pure).
pub fn fs_from_statvfs(frsize: u64, blocks: u64, bfree: u64, bavail: u64, files: u64, ffree: u64) -> FsSample {
    FsSample {
        capacity: Some(blocks * frsize),
        available: Some(bavail * frsize),
        used: Some(blocks.saturating_sub(bfree) * frsize),
        inodes: Some(files),
        inodes_free: Some(ffree),
        inodes_used: Some(files.saturating_sub(ffree)),
    }
}

/// Bytes and inodes of the files under `dir` (a container's log directory).
fn du(dir: &Path) -> Option<(u64, u64)> {
    let mut bytes = 0;
    let mut inodes = 0;
    let mut stack = vec![dir.to_owned()];
    let mut found = false;
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        found = true;
        inodes += 1;
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else {
                inodes += 1;
                bytes += m.len();
            }
        }
    }
    found.then_some((bytes, inodes))
}

/// The kubelet's pod log directory: `<podLogsDir>/<ns>_<name>_<uid>`.
pub fn pod_log_dir(pod_logs_dir: &Path, namespace: &str, name: &str, uid: &str) -> PathBuf {
    pod_logs_dir.join(format!("{namespace}_{name}_{uid}"))
}

/// Where the runtime puts a container's (or sandbox's) cgroup under its
/// pod's: containerd names it by id with cgroupfs,
/// `cri-containerd-<id>.scope` with systemd. `exists` says which cgroups
/// there are.
fn container_cgroup(driver: CgroupDriver, pod_cgroup: &str, id: &str, exists: impl Fn(&str) -> bool) -> Option<String> {
    let candidates = match driver {
        CgroupDriver::Cgroupfs => [format!("{pod_cgroup}/{id}"), format!("{pod_cgroup}/cri-containerd-{id}.scope")],
        CgroupDriver::Systemd => [format!("{pod_cgroup}/cri-containerd-{id}.scope"), format!("{pod_cgroup}/{id}")],
    };
    candidates.into_iter().find(|c| exists(c))
}

/// Boot time (btime of /proc/stat), the node's and root cgroup's start.
fn boot_time() -> Option<Timestamp> {
    Timestamp::from_second(i64::try_from(procfs::boot_time_secs().ok()?).ok()?).ok()
}

/// The capacity and free space of the filesystem containers' writable
/// layers live on (the container filesystem, else the image one), without
/// its usage.
fn rootfs_base(node: &NodeSample) -> Option<FsSample> {
    node.containerfs.or(node.imagefs).map(|f| FsSample { used: None, inodes_used: None, ..f })
}

/// Block devices named `/dev/<name>` in place of `major:minor`.
fn name_devices(s: &mut CgroupSample, names: &mut DeviceNames) {
    for d in &mut s.io {
        if let Some(n) = names.name(&d.device) {
            d.device = n;
        }
    }
}

/// Reads everything; returns the node, the pods and what could not be read.
pub(super) fn read_cgroups(
    fs: &CgroupFs,
    cfg: &StatsConfig,
    pods: &[Pod],
    rt: &RuntimeView,
    specs: &mut SpecCache,
    devices: &mut DeviceNames,
    machine: Arc<MachineSample>,
) -> (NodeSample, Vec<PodSample>, Vec<String>) {
    let mut errors = vec![];
    let memory_capacity = node::mem_total().unwrap_or(0);
    let kubepods = cfg.naming.kubepods();
    // One read of the pods' recursive block I/O tells whether any pod has any.
    let reads = Reads { io: has_io(fs, &kubepods) };
    let mut sample = |rel: &str, specs: &mut SpecCache| {
        let reads = if rel.is_empty() { Reads { io: true } } else { reads };
        sample_cgroup(fs, rel, specs, reads).map(|mut s| {
            name_devices(&mut s, devices);
            s
        })
    };
    let mut root = sample("", specs).unwrap_or_default();
    root.psi = psi::read_node();
    if fs.version() == Version::V1 {
        psi::note_absent("pods and containers", "their cgroups are cgroup v1, which has no per-cgroup pressure files");
    } else if root.psi.is_empty() {
        psi::note_absent("pods and containers", "the kernel has no PSI");
    }
    let nodefs = match fs_sample(&cfg.root_dir) {
        Ok(s) => Some(s),
        Err(e) => {
            errors.push(format!("statfs {}: {e}", cfg.root_dir.display()));
            None
        }
    };
    let runtime_fs = |(mountpoint, used, inodes_used): &(String, u64, Option<u64>)| {
        let base = (!mountpoint.is_empty()).then(|| fs_sample(Path::new(mountpoint)).ok()).flatten();
        FsSample::usage_on(base, *used, *inodes_used)
    };
    let imagefs = rt.imagefs.as_ref().map(runtime_fs);
    let containerfs = rt.containerfs.as_ref().map(runtime_fs);
    let logs_fs = fs_sample(&cfg.pod_logs_dir).ok().or(nodefs);
    let system = sample(&kubepods, specs).map(|s| vec![(SYSTEM_CONTAINER_PODS.to_owned(), s)]).unwrap_or_default();
    let qos = [QosClass::Burstable, QosClass::BestEffort]
        .into_iter()
        .filter_map(|q| sample(&cfg.naming.qos(q), specs))
        .collect();
    let node = NodeSample {
        start_time: boot_time().unwrap_or(Timestamp::UNIX_EPOCH),
        root,
        memory_capacity,
        fs: nodefs,
        imagefs,
        containerfs,
        maxpid: node::pid_max().ok(),
        curproc: node::tasks().ok(),
        interfaces: std::fs::read_to_string("/proc/net/dev").map(|t| parse_net_dev(&t)).unwrap_or_default(),
        system,
        qos,
        machine,
    };
    let mut out = vec![];
    for pod in pods {
        let m = &pod.metadata;
        let (Some(uid), Some(name)) = (m.uid.clone(), m.name.clone()) else { continue };
        let namespace = m.namespace.clone().unwrap_or_else(|| "default".into());
        let pod_cgroup_path = cfg.naming.pod(pod_qos(pod), &uid);
        // One walk counts the processes of the pod and of each container.
        let tree = fs.process_tree(&pod_cgroup_path).ok();
        let mut sample = |rel: &str| {
            sample(rel, specs).map(|mut s| {
                s.processes = tree.as_deref().map(|t| subtree_processes(t, rel));
                s
            })
        };
        // The walk listed the pod's cgroups; without it, ask cgroupfs.
        let exists = |rel: &str| match &tree {
            Some(t) => t.iter().any(|(p, _)| p == rel.trim_matches('/')),
            None => fs.exists(rel),
        };
        let pod_cgroup = sample(&pod_cgroup_path);
        // The newest sandbox: its pause process holds the pod's network
        // namespace, which the pod's network counters come from.
        let sandbox = rt.sandboxes.get(&uid).and_then(|l| l.first()).and_then(|sb| {
            let rel = container_cgroup(cfg.naming.driver, &pod_cgroup_path, &sb.id, exists)?;
            let cgroup = sample(&rel)?;
            let interfaces = if crate::pods::spec::host_network(pod) {
                // The node's namespace (the agent, as the kubelet, runs in
                // it), whose counters the node's figures read already.
                node.interfaces.clone()
            } else {
                let walked = tree.as_deref().map(|t| first_walked(t, &rel));
                walked.unwrap_or_else(|| first_process(fs, &rel)).and_then(net_dev_of).unwrap_or_default()
            };
            Some(SandboxSample {
                id: sb.id.clone(),
                image: cfg.sandbox_image.clone(),
                start_time: from_unix_nanos(sb.created_at),
                cgroup,
                interfaces,
            })
        });
        let log_dir = pod_log_dir(&cfg.pod_logs_dir, &namespace, &name, &uid);
        let mut containers: Vec<ContainerSample> = vec![];
        let mut listed: Vec<&api::Container> = rt.containers.get(&uid).map(|v| v.iter().collect()).unwrap_or_default();
        // The newest container of each name.
        listed.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        for c in listed {
            let cname = c.metadata.as_ref().map(|md| md.name.clone()).unwrap_or_default();
            if containers.iter().any(|x| x.name == cname) {
                continue;
            }
            let cgroup = container_cgroup(cfg.naming.driver, &pod_cgroup_path, &c.id, exists)
                .and_then(|p| sample(&p))
                .unwrap_or_default();
            let rootfs =
                rt.writable.get(&c.id).map(|(used, inodes)| FsSample::usage_on(rootfs_base(&node), *used, *inodes));
            let logs = du(&log_dir.join(&cname)).map(|(b, i)| FsSample::usage_on(logs_fs, b, Some(i)));
            // The image as the pod names it (the runtime lists its id).
            let spec_image = pod
                .spec
                .iter()
                .flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()))
                .find(|sc| sc.name == cname)
                .and_then(|sc| sc.image.clone());
            containers.push(ContainerSample {
                image: spec_image
                    .or_else(|| c.image.as_ref().map(|i| i.image.clone()))
                    .unwrap_or_else(|| c.image_ref.clone()),
                name: cname,
                id: c.id.clone(),
                start_time: from_unix_nanos(c.created_at),
                cgroup,
                rootfs,
                logs,
            });
        }
        containers.sort_by(|a, b| a.name.cmp(&b.name));
        let start_time = pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0)
            .or_else(|| rt.sandboxes.get(&uid).and_then(|s| s.first()).map(|s| from_unix_nanos(s.created_at)))
            .unwrap_or(Timestamp::UNIX_EPOCH);
        // Ephemeral storage: writable layers plus logs (emptyDir volumes
        // are not measured yet).
        let mut used = 0;
        let mut inodes = 0;
        let mut measured = false;
        for c in &containers {
            for f in [c.rootfs, c.logs].into_iter().flatten() {
                measured = true;
                used += f.used.unwrap_or(0);
                inodes += f.inodes_used.unwrap_or(0);
            }
        }
        let ephemeral = measured.then(|| FsSample::usage_on(nodefs, used, Some(inodes)));
        out.push(PodSample { namespace, name, uid, start_time, cgroup: pod_cgroup, sandbox, containers, ephemeral });
    }
    (node, out, errors)
}

/// The first process the walk found directly in `rel`, if any.
fn first_walked(tree: &[(String, Vec<u32>)], rel: &str) -> Option<u32> {
    let rel = rel.trim_matches('/');
    tree.iter().find(|(path, _)| path == rel).and_then(|(_, procs)| procs.first().copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn used_bytes_are_capacity_minus_free_as_cadvisor_reports_them() {
        // 1000 blocks of 4 KiB, 300 free of which 250 are available to
        // users (50 reserved for root).
        let f = fs_from_statvfs(4096, 1000, 300, 250, 64, 16);
        assert_eq!(f.capacity, Some(4_096_000));
        assert_eq!(f.available, Some(1_024_000));
        // capacity − free, not capacity − available (which would be 3_072_000).
        assert_eq!(f.used, Some(2_867_200));
        assert_eq!((f.inodes, f.inodes_free, f.inodes_used), (Some(64), Some(16), Some(48)));
    }

    #[test]
    fn cpu_topology_from_cpuinfo() {
        let two_sockets = "processor\t: 0\nphysical id\t: 0\ncore id\t: 0\n\nprocessor\t: 1\nphysical id\t: 0\ncore id\t: 0\n\n\
                           processor\t: 2\nphysical id\t: 1\ncore id\t: 0\n\nprocessor\t: 3\nphysical id\t: 1\ncore id\t: 1\n";
        assert_eq!(parse_cpu_topology(two_sockets), (3, 2));
        assert_eq!(parse_cpu_topology("processor\t: 0\n\nprocessor\t: 1\n"), (2, 1));
        assert_eq!(parse_cpu_topology(""), (0, 0));
    }
}
