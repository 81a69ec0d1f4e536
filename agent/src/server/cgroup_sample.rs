//! What the stats pass reads for one cgroup, as cAdvisor reads it: CPU
//! (usage, user/system, CFS throttling), memory (usage, working set, RSS,
//! cache, mapped files, swap, page faults, limit), tasks (threads and
//! their limit), block I/O per device, OOM kills, and the cgroup's spec
//! (CFS quota and period, shares, memory limit, reservation and swap limit).
//! Also the network counters of a network namespace (/proc/<pid>/net/dev)
//! and the devices' names.
//!
//! The pass reads these for hundreds of cgroups, so it reads no more than
//! it needs: files through one open of each directory; the spec (limits,
//! quotas, shares), which changes only when a cgroup is updated, again
//! every few passes only ([`SpecCache`]); CFS statistics only where a quota
//! is set (the only cgroups cAdvisor reports them for); block I/O only
//! when the pods' cgroup has any ([`Reads::io`]). The parsers are pure and
//! table-tested. /proc/<pid>/net/dev is parsed here rather than through
//! procfs, whose reader builds a map of every field of every interface
//! for each of these hundreds of reads, where the pass keeps four
//! counters of the interfaces cAdvisor counts.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use crate::{
    cgroups::{CgroupDir, CgroupFs, MemoryStat, Version},
    psi::{self, PsiSample},
};

/// CFS bandwidth statistics (cpu.stat).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CfsStats {
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_ns: u64,
}

/// Block I/O of one device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceIo {
    /// `major:minor`.
    pub device: String,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub reads: u64,
    pub writes: u64,
}

/// The cgroup's configuration (cAdvisor's container spec).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupSpec {
    pub cpu_period_us: Option<u64>,
    /// None when unlimited.
    pub cpu_quota_us: Option<u64>,
    /// cpu.shares (v1), or cpu.weight converted back to shares (v2).
    pub cpu_shares: Option<u64>,
    pub memory_reservation: Option<u64>,
    /// memory.limit_in_bytes (v1) or memory.max (v2); None when unlimited.
    pub memory_limit: Option<u64>,
    pub memory_swap_limit: Option<u64>,
    /// pids.max; None when unlimited.
    pub pids_max: Option<u64>,
}

/// One cgroup's figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CgroupSample {
    /// Relative path in the hierarchy ("" for the root).
    pub path: String,
    pub cpu_usage_ns: Option<u64>,
    pub cpu_nano_cores: Option<u64>,
    pub cpu_user_ns: Option<u64>,
    pub cpu_system_ns: Option<u64>,
    pub cfs: Option<CfsStats>,
    pub memory_usage: Option<u64>,
    pub working_set: Option<u64>,
    pub rss: Option<u64>,
    pub cache: Option<u64>,
    pub mapped_file: Option<u64>,
    pub swap: Option<u64>,
    /// Page faults of the cgroup and its descendants.
    pub page_faults: Option<u64>,
    pub major_page_faults: Option<u64>,
    /// Page faults of the cgroup's own tasks (v1's non-`total_` fields;
    /// v2 has only hierarchical counts, used for both as cAdvisor does).
    pub container_page_faults: Option<u64>,
    pub container_major_page_faults: Option<u64>,
    pub memory_limit: Option<u64>,
    pub processes: Option<u64>,
    pub threads: Option<u64>,
    pub oom_kills: Option<u64>,
    pub io: Vec<DeviceIo>,
    pub spec: CgroupSpec,
    /// Pressure stall information: the cgroup's own pressure files on
    /// cgroup v2, /proc/pressure for the root; empty where there is none.
    pub psi: PsiSample,
}

/// `key value` lines (cpu.stat, memory.events, memory.oom_control).
pub fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// CFS statistics from cpu.stat (`throttled_time` in ns on v1,
/// `throttled_usec` on v2).
pub fn parse_cfs(cpu_stat: &str) -> Option<CfsStats> {
    let periods = keyed(cpu_stat, "nr_periods")?;
    let throttled_periods = keyed(cpu_stat, "nr_throttled").unwrap_or(0);
    let throttled_ns = keyed(cpu_stat, "throttled_time")
        .or_else(|| keyed(cpu_stat, "throttled_usec").map(|us| us * 1000))
        .unwrap_or(0);
    Some(CfsStats { periods, throttled_periods, throttled_ns })
}

/// v1 blkio `*_recursive` files (`8:0 Read 4096` lines) into per-device
/// totals: `bytes` from io_service_bytes, `ops` from io_serviced.
pub fn parse_blkio(bytes: &str, ops: &str) -> Vec<DeviceIo> {
    let mut by_dev: Vec<DeviceIo> = vec![];
    let mut add = |text: &str, is_bytes: bool| {
        for l in text.lines() {
            let mut f = l.split_whitespace();
            let (Some(dev), Some(op), Some(v)) = (f.next(), f.next(), f.next()) else { continue };
            let Ok(v) = v.parse::<u64>() else { continue };
            if !dev.contains(':') {
                continue;
            }
            let i = match by_dev.iter().position(|d| d.device == dev) {
                Some(i) => i,
                None => {
                    by_dev.push(DeviceIo { device: dev.to_owned(), ..Default::default() });
                    by_dev.len() - 1
                }
            };
            let d = &mut by_dev[i];
            match (op, is_bytes) {
                ("Read", true) => d.read_bytes = v,
                ("Write", true) => d.write_bytes = v,
                ("Read", false) => d.reads = v,
                ("Write", false) => d.writes = v,
                _ => {}
            }
        }
    };
    add(bytes, true);
    add(ops, false);
    by_dev
}

/// v2 io.stat (`254:0 rbytes=… wbytes=… rios=… wios=… …`).
pub fn parse_io_stat(text: &str) -> Vec<DeviceIo> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let dev = f.next()?;
            let mut d = DeviceIo { device: dev.to_owned(), ..Default::default() };
            for kv in f {
                let Some((k, v)) = kv.split_once('=') else { continue };
                let v = v.parse().unwrap_or(0);
                match k {
                    "rbytes" => d.read_bytes = v,
                    "wbytes" => d.write_bytes = v,
                    "rios" => d.reads = v,
                    "wios" => d.writes = v,
                    _ => {}
                }
            }
            Some(d)
        })
        .collect()
}

/// cpu.weight (v2) as the shares cAdvisor reports (its inverse of the
/// runtime's shares-to-weight conversion).
pub fn weight_to_shares(weight: u64) -> u64 {
    if weight == 0 { 0 } else { 2 + (weight - 1) * 262_142 / 9_999 }
}

/// v2 cpu.max (`max 100000` or `50000 100000`): (quota, period).
pub fn parse_cpu_max(text: &str) -> (Option<u64>, Option<u64>) {
    let mut f = text.split_whitespace();
    let quota = f.next().and_then(|q| q.parse().ok());
    let period = f.next().and_then(|p| p.parse().ok());
    (quota, period)
}

/// A limit file's value, None when unlimited (`max`, `-1`, or the
/// kernel's page-rounded "no limit" near 2^63).
fn limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" || t.starts_with('-') {
        return None;
    }
    t.parse::<u64>().ok().filter(|v| *v < (1 << 62))
}

/// Reads the cgroup's spec.
pub fn read_spec(fs: &CgroupFs, rel: &str, memory: &CgroupDir) -> CgroupSpec {
    let read = |dir: &CgroupDir, f: &str| dir.read(f).ok();
    let memory_limit = fs.memory_limit_in(memory).ok().flatten();
    match fs.version() {
        Version::V1 => {
            let cpu = CgroupDir::open(&fs.controller_dir("cpu", rel)).ok();
            let cpu_read = |f: &str| cpu.as_ref().and_then(|d| read(d, f));
            let pids = CgroupDir::at(fs.controller_dir("pids", rel));
            CgroupSpec {
                cpu_period_us: cpu_read("cpu.cfs_period_us").and_then(|t| t.trim().parse().ok()),
                cpu_quota_us: cpu_read("cpu.cfs_quota_us").and_then(|t| limit(&t)),
                cpu_shares: cpu_read("cpu.shares").and_then(|t| t.trim().parse().ok()),
                memory_reservation: read(memory, "memory.soft_limit_in_bytes").and_then(|t| limit(&t)),
                memory_limit,
                memory_swap_limit: read(memory, "memory.memsw.limit_in_bytes").and_then(|t| limit(&t)),
                pids_max: read(&pids, "pids.max").and_then(|t| limit(&t)),
            }
        }
        Version::V2 => {
            let (quota, period) = read(memory, "cpu.max").map(|t| parse_cpu_max(&t)).unwrap_or((None, None));
            CgroupSpec {
                cpu_period_us: period,
                cpu_quota_us: quota,
                cpu_shares: read(memory, "cpu.weight").and_then(|t| t.trim().parse().ok()).map(weight_to_shares),
                memory_reservation: read(memory, "memory.low").and_then(|t| limit(&t)),
                memory_limit,
                memory_swap_limit: read(memory, "memory.swap.max").and_then(|t| limit(&t)),
                pids_max: read(memory, "pids.max").and_then(|t| limit(&t)),
            }
        }
    }
}

/// Specs by cgroup path from an earlier pass; a pass that does not
/// refresh them reuses these.
#[derive(Debug, Default)]
pub struct SpecCache {
    pub specs: HashMap<String, CgroupSpec>,
    /// Read every spec again in this pass.
    pub refresh: bool,
}

impl SpecCache {
    fn get(&mut self, fs: &CgroupFs, rel: &str, memory: &CgroupDir) -> CgroupSpec {
        if !self.refresh
            && let Some(s) = self.specs.get(rel)
        {
            return *s;
        }
        let s = read_spec(fs, rel, memory);
        self.specs.insert(rel.to_owned(), s);
        s
    }
}

/// Cumulative CPU time of a cgroup in nanoseconds, with (user, system),
/// and its CFS statistics; `memory` is its open memory directory, which
/// on v2 is also its cpu directory.
fn read_cpu(fs: &CgroupFs, rel: &str, memory: &CgroupDir, s: &mut CgroupSample) {
    let quota = s.spec.cpu_quota_us.is_some();
    match fs.version() {
        Version::V1 => {
            // One file for the usage and its split (cpuacct.usage and
            // cpuacct.stat would be a directory and two files more).
            let all = CgroupDir::at(fs.controller_dir("cpuacct", rel)).read("cpuacct.usage_all");
            if let Some((user, system)) = all.ok().as_deref().and_then(parse_usage_all) {
                s.cpu_usage_ns = Some(user.saturating_add(system));
                s.cpu_user_ns = Some(user);
                s.cpu_system_ns = Some(system);
            }
            if quota {
                s.cfs = CgroupDir::at(fs.controller_dir("cpu", rel)).read("cpu.stat").ok().and_then(|t| parse_cfs(&t));
            }
        }
        Version::V2 => {
            if let Ok(t) = memory.read("cpu.stat") {
                s.cpu_usage_ns = keyed(&t, "usage_usec").map(|us| us * 1000);
                s.cpu_user_ns = keyed(&t, "user_usec").map(|us| us * 1000);
                s.cpu_system_ns = keyed(&t, "system_usec").map(|us| us * 1000);
                s.cfs = parse_cfs(&t).filter(|_| quota);
            }
        }
    }
}

/// The user and system nanoseconds of a v1 `cpuacct.usage_all`, summed
/// over its CPUs (one line each under a `cpu user system` header). Their
/// sum is `cpuacct.usage`.
fn parse_usage_all(text: &str) -> Option<(u64, u64)> {
    let mut lines = text.lines();
    if lines.next()?.split_whitespace().collect::<Vec<_>>() != ["cpu", "user", "system"] {
        return None;
    }
    lines.try_fold((0u64, 0u64), |(user, system), line| {
        let mut f = line.split_whitespace().skip(1).map(str::parse::<u64>);
        match (f.next(), f.next()) {
            (Some(Ok(u)), Some(Ok(s))) => Some((user.saturating_add(u), system.saturating_add(s))),
            _ => None,
        }
    })
}

/// What a pass reads beyond the basics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reads {
    /// Block I/O. On cgroup v1 since Linux 6.9 the blkio statistics are
    /// kept only for disks blk-throttle was switched on for, by a write to
    /// a throttle file; the agent makes one per disk, setting no limit, at
    /// start and as volumes bring new disks (`cm::blkio`, done by
    /// `PodCgroups::account_block_io`). When the pods' cgroup (whose
    /// recursive statistics hold every pod's) names no disk, none of the
    /// pods' are read.
    pub io: bool,
}

/// Whether `rel`'s block I/O statistics (recursive) name any device.
pub fn has_io(fs: &CgroupFs, rel: &str) -> bool {
    let memory = CgroupDir::at(fs.memory_dir(rel));
    !read_io(fs, rel, &memory).is_empty()
}

/// Block I/O per device of a cgroup.
fn read_io(fs: &CgroupFs, rel: &str, memory: &CgroupDir) -> Vec<DeviceIo> {
    match fs.version() {
        Version::V1 => {
            let Ok(dir) = CgroupDir::open(&fs.controller_dir("blkio", rel)) else { return vec![] };
            let bytes = dir.read("blkio.throttle.io_service_bytes_recursive").unwrap_or_default();
            let ops = dir.read("blkio.throttle.io_serviced_recursive").unwrap_or_default();
            parse_blkio(&bytes, &ops)
        }
        Version::V2 => memory.read("io.stat").map(|t| parse_io_stat(&t)).unwrap_or_default(),
    }
}

/// OOM kills inside a cgroup (memory.oom_control on v1, memory.events on v2).
pub fn oom_kills(fs: &CgroupFs, memory: &CgroupDir) -> Option<u64> {
    let file = match fs.version() {
        Version::V1 => "memory.oom_control",
        Version::V2 => "memory.events",
    };
    keyed(&memory.read(file).ok()?, "oom_kill")
}

/// What cgroupfs says about one cgroup, its process count aside (one walk
/// per pod counts those: [`CgroupFs::process_tree`]); None when it does not
/// exist.
pub fn sample_cgroup(fs: &CgroupFs, rel: &str, specs: &mut SpecCache, reads: Reads) -> Option<CgroupSample> {
    let memory = fs.open_memory_dir(rel).ok()?;
    let v1 = fs.version() == Version::V1;
    let mut s = CgroupSample { path: rel.to_owned(), ..Default::default() };
    if !rel.is_empty() {
        s.spec = specs.get(fs, rel, &memory);
    }
    read_cpu(fs, rel, &memory, &mut s);
    if let Ok(text) = memory.read("memory.stat") {
        let stat = MemoryStat::parse(&text, fs.version());
        let (pgfault, mapped) = if v1 { ("total_pgfault", "total_mapped_file") } else { ("pgfault", "file_mapped") };
        s.page_faults = keyed(&text, pgfault);
        s.major_page_faults = Some(stat.pgmajfault);
        (s.container_page_faults, s.container_major_page_faults) = if v1 {
            (keyed(&text, "pgfault"), keyed(&text, "pgmajfault"))
        } else {
            (s.page_faults, s.major_page_faults)
        };
        s.rss = Some(stat.rss);
        s.cache = Some(stat.file);
        s.mapped_file = keyed(&text, mapped);
        // v1 counts swap in memory.stat when swap accounting is on;
        // without it there is none to count.
        s.swap = Some(if v1 { keyed(&text, "total_swap").unwrap_or(0) } else { 0 });
        if let Ok(usage) = fs.memory_usage_in(&memory, rel.trim_matches('/').is_empty()) {
            s.memory_usage = Some(usage);
            s.working_set = Some(usage.saturating_sub(stat.inactive_file));
        }
    }
    if !rel.is_empty() {
        // With the spec: a limit changes only when the cgroup is updated.
        s.memory_limit = s.spec.memory_limit;
        s.oom_kills = oom_kills(fs, &memory);
        if !v1 {
            s.swap = memory.read("memory.swap.current").ok().and_then(|t| t.trim().parse().ok()).or(Some(0));
        }
        let current = if v1 {
            CgroupDir::at(fs.controller_dir("pids", rel)).read("pids.current")
        } else {
            memory.read("pids.current")
        };
        s.threads = current.ok().and_then(|t| t.trim().parse().ok());
    }
    if reads.io {
        s.io = read_io(fs, rel, &memory);
    }
    // cgroup v1 has no per-cgroup pressure files; the root's pressure is
    // the node's, read by the caller from /proc/pressure.
    if !v1 && !rel.is_empty() {
        s.psi = psi::read_cgroup(&memory.path().display().to_string(), |f| memory.read(f));
    }
    Some(s)
}

/// The first process of a cgroup (the sandbox's pause process), for its
/// network namespace.
pub fn first_process(fs: &CgroupFs, rel: &str) -> Option<u32> {
    let text = CgroupDir::at(fs.memory_dir(rel)).read("cgroup.procs").ok()?;
    text.lines().find_map(|l| l.trim().parse().ok())
}

/// One interface's counters from /proc/<pid>/net/dev.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InterfaceSample {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub rx_errors: u64,
    pub rx_dropped: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub tx_errors: u64,
    pub tx_dropped: u64,
}

/// Interfaces cAdvisor leaves out: loopback, the host ends of veth pairs,
/// and container engines' bridges.
fn ignored_interface(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    ["lo", "veth", "docker", "nerdctl"].iter().any(|p| n.starts_with(p))
}

/// Interfaces from a /proc/<pid>/net/dev, as cAdvisor reads them.
pub fn parse_net_dev(text: &str) -> Vec<InterfaceSample> {
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let name = name.trim();
            let f: Vec<u64> = rest.split_whitespace().filter_map(|x| x.parse().ok()).collect();
            (!ignored_interface(name) && f.len() >= 16).then(|| InterfaceSample {
                name: name.to_owned(),
                rx_bytes: f[0],
                rx_packets: f[1],
                rx_errors: f[2],
                rx_dropped: f[3],
                tx_bytes: f[8],
                tx_packets: f[9],
                tx_errors: f[10],
                tx_dropped: f[11],
            })
        })
        .collect()
}

/// The interfaces of the network namespace `pid` is in.
pub fn net_dev_of(pid: u32) -> Option<Vec<InterfaceSample>> {
    std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok().map(|t| parse_net_dev(&t))
}

/// Block device names (`/dev/vda`) by `major:minor`, read from sysfs once
/// per device.
#[derive(Debug, Default)]
pub struct DeviceNames {
    names: HashMap<String, Option<String>>,
    sysfs: Option<PathBuf>,
}

impl DeviceNames {
    /// Names from a sysfs other than /sys (tests).
    pub fn at(sysfs: &Path) -> DeviceNames {
        DeviceNames { names: HashMap::new(), sysfs: Some(sysfs.to_owned()) }
    }

    /// `/dev/<DEVNAME>` of a device, None when sysfs does not know it.
    pub fn name(&mut self, major_minor: &str) -> Option<String> {
        let sysfs = self.sysfs.clone().unwrap_or_else(|| PathBuf::from("/sys"));
        self.names
            .entry(major_minor.to_owned())
            .or_insert_with(|| {
                let uevent = std::fs::read_to_string(sysfs.join("dev/block").join(major_minor).join("uevent")).ok()?;
                uevent.lines().find_map(|l| l.strip_prefix("DEVNAME=")).map(|n| format!("/dev/{}", n.trim()))
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_files() {
        assert_eq!(keyed("usage_usec 1500\nuser_usec 1000\n", "usage_usec"), Some(1500));
        assert_eq!(keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill"), Some(3));
        assert_eq!(keyed("low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\noom_group_kill 0\n", "oom_kill"), Some(1));
        assert_eq!(keyed("x 1\n", "oom_kill"), None);
    }

    #[test]
    fn v1_cpu_time_split_over_every_cpu() {
        let two = "cpu user system\n0 3000 1000\n1 500 250\n";
        assert_eq!(parse_usage_all(two), Some((3500, 1250)));
        // A cgroup on no CPU yet: zero, not unknown.
        assert_eq!(parse_usage_all("cpu user system\n0 0 0\n"), Some((0, 0)));
        // Any other shape is not guessed at.
        for bad in ["", "cpu user\n0 1\n", "cpu user system\n0 1\n", "cpu user system\n0 x 2\n"] {
            assert_eq!(parse_usage_all(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn cfs_statistics_of_both_versions() {
        let v1 = "nr_periods 120\nnr_throttled 7\nthrottled_time 350000000\nnr_bursts 0\nburst_time 0\n";
        assert_eq!(parse_cfs(v1), Some(CfsStats { periods: 120, throttled_periods: 7, throttled_ns: 350_000_000 }));
        let v2 = "usage_usec 10\nuser_usec 5\nsystem_usec 5\nnr_periods 3\nnr_throttled 1\nthrottled_usec 250\n";
        assert_eq!(parse_cfs(v2), Some(CfsStats { periods: 3, throttled_periods: 1, throttled_ns: 250_000 }));
        // Without CFS bandwidth control there is no nr_periods.
        assert_eq!(parse_cfs("usage_usec 10\n"), None);
    }

    #[test]
    fn block_io_of_both_versions() {
        let bytes = "254:0 Read 4096\n254:0 Write 8192\n254:0 Sync 0\n254:0 Async 0\n254:0 Total 12288\n\
                     7:1 Read 512\n7:1 Write 0\nTotal 12800\n";
        let ops = "254:0 Read 1\n254:0 Write 2\n254:0 Total 3\n7:1 Read 1\nTotal 4\n";
        assert_eq!(
            parse_blkio(bytes, ops),
            vec![
                DeviceIo { device: "254:0".into(), read_bytes: 4096, write_bytes: 8192, reads: 1, writes: 2 },
                DeviceIo { device: "7:1".into(), read_bytes: 512, write_bytes: 0, reads: 1, writes: 0 },
            ]
        );
        assert_eq!(
            parse_io_stat("254:0 rbytes=100 wbytes=200 rios=3 wios=4 dbytes=0 dios=0\n"),
            vec![DeviceIo { device: "254:0".into(), read_bytes: 100, write_bytes: 200, reads: 3, writes: 4 }]
        );
        assert!(parse_blkio("Total 0\n", "Total 0\n").is_empty());
    }

    #[test]
    fn spec_values() {
        assert_eq!(parse_cpu_max("max 100000\n"), (None, Some(100_000)));
        assert_eq!(parse_cpu_max("50000 100000\n"), (Some(50_000), Some(100_000)));
        // cpu.weight 1, 100 and 10000 are shares 2, 1024 and 262144.
        assert_eq!(weight_to_shares(1), 2);
        assert_eq!(weight_to_shares(100), 2597);
        assert_eq!(weight_to_shares(10_000), 262_144);
        assert_eq!(limit("9223372036854771712\n"), None);
        assert_eq!(limit("-1\n"), None);
        assert_eq!(limit("max\n"), None);
        assert_eq!(limit("268435456\n"), Some(268_435_456));
    }

    #[test]
    fn net_dev_as_cadvisor_reads_it() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
                    face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
                    lo: 100 1 0 0 0 0 0 0 100 1 0 0 0 0 0 0\n  \
                    eth0: 5000 40 2 3 0 0 0 0 7000 50 1 4 0 0 0 0\n \
                    veth12ab: 1 1 0 0 0 0 0 0 1 1 0 0 0 0 0 0\n";
        assert_eq!(
            parse_net_dev(text),
            vec![InterfaceSample {
                name: "eth0".into(),
                rx_bytes: 5000,
                rx_packets: 40,
                rx_errors: 2,
                rx_dropped: 3,
                tx_bytes: 7000,
                tx_packets: 50,
                tx_errors: 1,
                tx_dropped: 4,
            }]
        );
    }

    #[test]
    fn device_names_come_from_sysfs_uevents() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("dev/block/254:0");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("uevent"), "MAJOR=254\nMINOR=0\nDEVNAME=vda\nDEVTYPE=disk\n").unwrap();
        let mut names = DeviceNames::at(dir.path());
        assert_eq!(names.name("254:0").as_deref(), Some("/dev/vda"));
        assert_eq!(names.name("9:9"), None);
    }
}
