//! Cgroup filesystem access for cgroup v1 (including the hybrid layout) and
//! cgroup v2, behind one type.
//!
//! Paths are relative to the hierarchy root (`kubepods/besteffort/pod<uid>`).
//! On v1 each controller has its own tree and the same relative path is used
//! in each; on v2 there is one tree. Everything here is plain file I/O; the
//! decisions (names, limits, who to kill) live in the container manager and
//! the eviction manager.

mod dir;
mod kill;
mod stat;

use std::{
    fs, io,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

pub use dir::CgroupDir;
use rustix::io::Errno;
pub use stat::MemoryStat;
use thiserror::Error;

/// The default mount point.
pub const DEFAULT_ROOT: &str = "/sys/fs/cgroup";

#[derive(Debug, Error)]
pub enum CgroupError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: cannot parse `{value}`")]
    Parse { path: PathBuf, value: String },
    #[error("no cgroup hierarchy with a memory controller under {0}")]
    NoMemoryController(PathBuf),
    #[error("{path}: still has processes after {waited:?}")]
    Busy { path: PathBuf, waited: Duration },
}

impl CgroupError {
    fn io(path: &Path, source: io::Error) -> CgroupError {
        CgroupError::Io { path: path.to_owned(), source }
    }

    /// True when the cgroup (or file) does not exist, for example because it
    /// was removed while we were reading it.
    pub fn is_not_found(&self) -> bool {
        matches!(self, CgroupError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

pub type Result<T> = std::result::Result<T, CgroupError>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// One hierarchy per controller (also the hybrid layout, where cgroup2
    /// is mounted beside them without controllers).
    V1,
    /// The unified hierarchy with controllers.
    V2,
}

/// v1 controllers whose trees a pod cgroup is created in. cpuset is left to
/// the runtime, which initialises cpus and mems from the parent.
const V1_CONTROLLERS: &[&str] = &["memory", "cpu", "cpuacct", "pids", "freezer", "hugetlb"];

#[derive(Clone, Debug)]
pub struct CgroupFs {
    root: PathBuf,
    version: Version,
}

/// CPU settings for a cgroup, in the kubelet's terms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuLimits {
    /// cpu.shares (v1); converted to cpu.weight on v2.
    pub shares: Option<u64>,
    /// CFS quota in microseconds per period; None means unlimited.
    pub quota_us: Option<i64>,
    pub period_us: u64,
}

impl CgroupFs {
    /// Detects the layout under `/sys/fs/cgroup`.
    pub fn detect() -> Result<CgroupFs> {
        CgroupFs::detect_at(Path::new(DEFAULT_ROOT))
    }

    /// Detects the layout under `root`: v2 when the root itself is a cgroup2
    /// mount with a memory controller, v1 when `root/memory` exists.
    pub fn detect_at(root: &Path) -> Result<CgroupFs> {
        let controllers = root.join("cgroup.controllers");
        if let Ok(c) = fs::read_to_string(&controllers)
            && c.split_whitespace().any(|c| c == "memory")
        {
            return Ok(CgroupFs { root: root.to_owned(), version: Version::V2 });
        }
        if root.join("memory").join("memory.usage_in_bytes").exists() {
            return Ok(CgroupFs { root: root.to_owned(), version: Version::V1 });
        }
        Err(CgroupError::NoMemoryController(root.to_owned()))
    }

    /// A layout given explicitly (recorded trees in tests).
    pub fn with_layout(root: &Path, version: Version) -> CgroupFs {
        CgroupFs { root: root.to_owned(), version }
    }

    pub fn version(&self) -> Version {
        self.version
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of `rel` in a controller's tree (the only tree on v2).
    pub fn controller_dir(&self, controller: &str, rel: &str) -> PathBuf {
        let rel = rel.trim_matches('/');
        match self.version {
            Version::V1 => self.root.join(controller).join(rel),
            Version::V2 => self.root.join(rel),
        }
    }

    /// The directory of `rel` in the memory controller's tree.
    pub fn memory_dir(&self, rel: &str) -> PathBuf {
        self.controller_dir("memory", rel)
    }

    /// The cgroup id the kernel uses for `rel`'s memory cgroup: its kernfs
    /// node id, which is the directory's inode number.
    pub fn cgroup_id(&self, rel: &str) -> Result<u64> {
        let dir = self.memory_dir(rel);
        fs::metadata(&dir).map(|m| m.ino()).map_err(|e| CgroupError::io(&dir, e))
    }

    pub fn exists(&self, rel: &str) -> bool {
        self.memory_dir(rel).is_dir()
    }

    fn read(&self, path: &Path) -> Result<String> {
        fs::File::open(path).and_then(dir::read_whole).map_err(|e| CgroupError::io(path, e))
    }

    fn write(&self, path: &Path, value: &str) -> Result<()> {
        fs::write(path, value).map_err(|e| CgroupError::io(path, e))
    }

    /// Memory usage in bytes (`memory.usage_in_bytes` / `memory.current`).
    /// For the root on v2, which has no memory.current, anon + file from
    /// memory.stat, the same quantity the v1 root reports.
    pub fn memory_usage(&self, rel: &str) -> Result<u64> {
        self.memory_usage_in(&CgroupDir::at(self.memory_dir(rel)), rel.trim_matches('/').is_empty())
    }

    /// Opens `rel`'s directory in the memory tree, to read several of its
    /// files with one walk of the path.
    pub fn open_memory_dir(&self, rel: &str) -> Result<CgroupDir> {
        CgroupDir::open(&self.memory_dir(rel))
    }

    /// [`CgroupFs::memory_usage`] of an open memory directory; `is_root`
    /// when it is the hierarchy's root.
    pub fn memory_usage_in(&self, dir: &CgroupDir, is_root: bool) -> Result<u64> {
        match self.version {
            Version::V1 => dir.read_u64("memory.usage_in_bytes"),
            Version::V2 if is_root => {
                let s = MemoryStat::parse(&dir.read("memory.stat")?, self.version);
                Ok(s.anon + s.file)
            }
            Version::V2 => dir.read_u64("memory.current"),
        }
    }

    /// [`CgroupFs::memory_limit`] of an open memory directory.
    pub fn memory_limit_in(&self, dir: &CgroupDir) -> Result<Option<u64>> {
        let v = match self.version {
            Version::V1 => dir.read_u64("memory.limit_in_bytes")?,
            Version::V2 => dir.read_u64("memory.max")?,
        };
        // v1 reports "unlimited" as the largest page-aligned i64.
        Ok((v < (1 << 62)).then_some(v))
    }

    /// Parsed `memory.stat`, with hierarchical values on both versions.
    pub fn memory_stat(&self, rel: &str) -> Result<MemoryStat> {
        let path = self.memory_dir(rel).join("memory.stat");
        let text = self.read(&path)?;
        Ok(MemoryStat::parse(&text, self.version))
    }

    /// Working set in bytes: usage − inactive_file, floored at zero.
    pub fn working_set(&self, rel: &str) -> Result<u64> {
        let usage = self.memory_usage(rel)?;
        let stat = self.memory_stat(rel)?;
        Ok(usage.saturating_sub(stat.inactive_file))
    }

    /// Processes directly in `rel` (memory tree).
    pub fn procs(&self, rel: &str) -> Result<Vec<u32>> {
        let path = self.memory_dir(rel).join("cgroup.procs");
        Ok(self.read(&path)?.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// Processes in `rel` and all its descendants.
    pub fn procs_recursive(&self, rel: &str) -> Result<Vec<u32>> {
        let mut out = vec![];
        self.each_in_tree(rel, &mut |cgroup| {
            out.extend(self.procs(cgroup)?);
            Ok(())
        })?;
        Ok(out)
    }

    /// Every cgroup of the subtree at `rel` (itself first) with the
    /// processes directly in it: one walk that gives the count of the whole
    /// subtree and of each part ([`subtree_processes`]), and each part's
    /// first process.
    pub fn process_tree(&self, rel: &str) -> Result<Vec<(String, Vec<u32>)>> {
        let mut out = vec![];
        self.each_in_tree(rel, &mut |cgroup| {
            out.push((cgroup.trim_matches('/').to_owned(), self.procs(cgroup)?));
            Ok(())
        })?;
        Ok(out)
    }

    /// Calls `visit` on `rel`, then on each of its descendants, parents
    /// first, in the memory tree.
    fn each_in_tree(&self, rel: &str, visit: &mut dyn FnMut(&str) -> Result<()>) -> Result<()> {
        visit(rel)?;
        if !self.may_have_children(rel) {
            return Ok(());
        }
        for child in self.children(rel)? {
            match self.each_in_tree(&child, visit) {
                // A child removed while we walk has no processes left.
                Err(e) if e.is_not_found() => {}
                other => other?,
            }
        }
        Ok(())
    }

    /// False when `rel` surely has no child cgroup. A cgroupfs directory's
    /// link count is two plus its subdirectories (kernfs keeps it so, as
    /// tmpfs and ext4 do), so one stat tells a leaf (as most sandbox and
    /// container cgroups are) without listing its twenty-odd control
    /// files. A filesystem that does not count links this way (btrfs
    /// reports 1), or a failed stat, says maybe.
    fn may_have_children(&self, rel: &str) -> bool {
        rustix::fs::stat(self.memory_dir(rel)).map_or(true, |st| st.st_nlink != 2)
    }

    /// Child cgroups of `rel` (relative paths), in the memory tree.
    pub fn children(&self, rel: &str) -> Result<Vec<String>> {
        let dir = self.memory_dir(rel);
        let rd = fs::read_dir(&dir).map_err(|e| CgroupError::io(&dir, e))?;
        let base = rel.trim_matches('/');
        let mut out = vec![];
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                let name = e.file_name().to_string_lossy().into_owned();
                out.push(if base.is_empty() { name } else { format!("{base}/{name}") });
            }
        }
        out.sort();
        Ok(out)
    }

    /// `pids.current` of `rel` (tasks, threads included).
    pub fn pids_current(&self, rel: &str) -> Result<u64> {
        CgroupDir::at(self.controller_dir("pids", rel)).read_u64("pids.current")
    }

    /// Creates `rel` (and missing parents) in every tree a pod needs; on v2
    /// also enables the controllers in each parent's subtree_control.
    pub fn create(&self, rel: &str) -> Result<()> {
        match self.version {
            Version::V1 => {
                for c in V1_CONTROLLERS {
                    let base = self.root.join(c);
                    if !base.is_dir() {
                        continue;
                    }
                    let dir = self.controller_dir(c, rel);
                    fs::create_dir_all(&dir).map_err(|e| CgroupError::io(&dir, e))?;
                }
                // Hierarchical accounting is the default since 5.x; setting it
                // on older kernels keeps pod usage including its containers.
                let _ = fs::write(self.memory_dir(rel).join("memory.use_hierarchy"), "1");
                Ok(())
            }
            Version::V2 => {
                let mut cur = self.root.clone();
                for part in rel.trim_matches('/').split('/').filter(|p| !p.is_empty()) {
                    let wanted = ["+memory", "+cpu", "+pids", "+hugetlb"];
                    let available = fs::read_to_string(cur.join("cgroup.controllers")).unwrap_or_default();
                    let enable: Vec<&str> =
                        wanted.iter().copied().filter(|w| available.split_whitespace().any(|a| a == &w[1..])).collect();
                    if !enable.is_empty() {
                        // Failing here (for example on the root of a delegated
                        // subtree) still leaves the child usable with
                        // whatever the parent already enables.
                        let _ = fs::write(cur.join("cgroup.subtree_control"), enable.join(" "));
                    }
                    cur = cur.join(part);
                    if !cur.is_dir() {
                        fs::create_dir(&cur).map_err(|e| CgroupError::io(&cur, e))?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Sets or clears the memory limit.
    pub fn set_memory_limit(&self, rel: &str, bytes: Option<u64>) -> Result<()> {
        let dir = self.memory_dir(rel);
        match self.version {
            Version::V1 => {
                self.write(&dir.join("memory.limit_in_bytes"), &bytes.map_or("-1".to_owned(), |b| b.to_string()))
            }
            Version::V2 => self.write(&dir.join("memory.max"), &bytes.map_or("max".to_owned(), |b| b.to_string())),
        }
    }

    /// Reads the memory limit (None when unlimited).
    pub fn memory_limit(&self, rel: &str) -> Result<Option<u64>> {
        self.memory_limit_in(&CgroupDir::at(self.memory_dir(rel)))
    }

    /// Sets CPU shares/weight and the CFS quota.
    pub fn set_cpu(&self, rel: &str, cpu: CpuLimits) -> Result<()> {
        match self.version {
            Version::V1 => {
                let dir = self.controller_dir("cpu", rel);
                if let Some(shares) = cpu.shares {
                    self.write(&dir.join("cpu.shares"), &shares.to_string())?;
                }
                self.write(&dir.join("cpu.cfs_period_us"), &cpu.period_us.to_string())?;
                self.write(&dir.join("cpu.cfs_quota_us"), &cpu.quota_us.unwrap_or(-1).to_string())
            }
            Version::V2 => {
                let dir = self.controller_dir("cpu", rel);
                if let Some(shares) = cpu.shares {
                    self.write(&dir.join("cpu.weight"), &shares_to_weight(shares).to_string())?;
                }
                let quota = cpu.quota_us.map_or("max".to_owned(), |q| q.to_string());
                self.write(&dir.join("cpu.max"), &format!("{quota} {}", cpu.period_us))
            }
        }
    }

    /// Sets the hugetlb limit of one page size, named as runc names it
    /// (`2MB`, `1GB`).
    pub fn set_hugetlb_limit(&self, rel: &str, page: &str, bytes: u64) -> Result<()> {
        let file = match self.version {
            Version::V1 => format!("hugetlb.{page}.limit_in_bytes"),
            Version::V2 => format!("hugetlb.{page}.max"),
        };
        self.write(&self.controller_dir("hugetlb", rel).join(file), &bytes.to_string())
    }

    /// Sets `pids.max` (None = unlimited).
    pub fn set_pids_max(&self, rel: &str, max: Option<u64>) -> Result<()> {
        let path = self.controller_dir("pids", rel).join("pids.max");
        self.write(&path, &max.map_or("max".to_owned(), |m| m.to_string()))
    }

    /// Moves a process into `rel` in every tree.
    pub fn add_process(&self, rel: &str, pid: u32) -> Result<()> {
        match self.version {
            Version::V1 => {
                for c in V1_CONTROLLERS {
                    let dir = self.controller_dir(c, rel);
                    if dir.is_dir() {
                        self.write(&dir.join("cgroup.procs"), &pid.to_string())?;
                    }
                }
                Ok(())
            }
            Version::V2 => self.write(&self.memory_dir(rel).join("cgroup.procs"), &pid.to_string()),
        }
    }

    /// Removes `rel` and its descendants from every tree, waiting up to
    /// `timeout` for exiting processes to leave. A missing cgroup is fine.
    pub fn remove(&self, rel: &str, timeout: Duration) -> Result<()> {
        let trees: Vec<PathBuf> = match self.version {
            Version::V1 => {
                let mut t: Vec<PathBuf> = V1_CONTROLLERS.iter().map(|c| self.controller_dir(c, rel)).collect();
                // The runtime may have created the path in other trees too.
                if let Ok(rd) = fs::read_dir(&self.root) {
                    for e in rd.flatten() {
                        let p = e.path().join(rel.trim_matches('/'));
                        if !t.contains(&p) && e.path().join("cgroup.procs").exists() {
                            t.push(p);
                        }
                    }
                }
                t
            }
            Version::V2 => vec![self.memory_dir(rel)],
        };
        let deadline = Instant::now() + timeout;
        for dir in trees {
            remove_tree(&dir, deadline)?;
        }
        Ok(())
    }
}

/// rmdir bottom-up; a cgroup with exiting tasks returns EBUSY for a moment.
fn remove_tree(dir: &Path, deadline: Instant) -> Result<()> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(CgroupError::io(dir, e)),
    };
    for e in rd.flatten() {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            remove_tree(&e.path(), deadline)?;
        }
    }
    let start = Instant::now();
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(Errno::BUSY.raw_os_error()) && Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(10));
            }
            Err(e) if e.raw_os_error() == Some(Errno::BUSY.raw_os_error()) => {
                return Err(CgroupError::Busy { path: dir.to_owned(), waited: start.elapsed() });
            }
            Err(e) => return Err(CgroupError::io(dir, e)),
        }
    }
}

/// cpu.shares (2..262144) to cpu.weight (1..10000), the conversion runc and
/// the kubelet use.
pub fn shares_to_weight(shares: u64) -> u64 {
    if shares == 0 {
        return 100;
    }
    1 + ((shares.clamp(2, 262_144) - 2) * 9999) / 262_142
}

/// Processes in the part of a [`CgroupFs::process_tree`] walk at `rel` and
/// below it.
pub fn subtree_processes(tree: &[(String, Vec<u32>)], rel: &str) -> u64 {
    let rel = rel.trim_matches('/');
    tree.iter()
        .filter(|(path, _)| path.strip_prefix(rel).is_some_and(|rest| rest.is_empty() || rest.starts_with('/')))
        .map(|(_, procs)| procs.len() as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_walk_lists_a_tree_and_its_processes() {
        let tmp = tempfile::tempdir().unwrap();
        let fs = CgroupFs::with_layout(tmp.path(), Version::V1);
        for (rel, procs) in [("pod", ""), ("pod/pause", "7\n"), ("pod/app", "8\n9\n"), ("pod/app/sub", "10\n")] {
            let dir = fs.memory_dir(rel);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cgroup.procs"), procs).unwrap();
        }
        let mut tree = fs.process_tree("/pod").unwrap();
        tree.sort();
        let want: [(&str, &[u32]); 4] =
            [("pod", &[]), ("pod/app", &[8, 9]), ("pod/app/sub", &[10]), ("pod/pause", &[7])];
        assert_eq!(tree, want.map(|(p, procs)| (p.to_owned(), procs.to_vec())));
        let mut procs = fs.procs_recursive("pod").unwrap();
        procs.sort();
        assert_eq!(procs, [7, 8, 9, 10]);
        assert!(fs.process_tree("gone").unwrap_err().is_not_found());
    }

    #[test]
    fn a_leaf_is_known_by_its_link_count() {
        let tmp = tempfile::tempdir().unwrap();
        let fs = CgroupFs::with_layout(tmp.path(), Version::V1);
        std::fs::create_dir_all(fs.memory_dir("pod/app/sub")).unwrap();
        assert!(fs.may_have_children("pod"));
        assert!(fs.may_have_children("pod/app"));
        // A failed stat says maybe; the listing then reports it.
        assert!(fs.may_have_children("pod/gone"));
        // The leaf is told without a listing where the test's filesystem
        // counts a directory's links as cgroupfs does (ext4, tmpfs).
        let counts_links = rustix::fs::stat(fs.memory_dir("pod")).unwrap().st_nlink == 3;
        assert_eq!(fs.may_have_children("pod/app/sub"), !counts_links);
    }

    #[test]
    fn subtree_processes_counts_a_cgroup_and_its_descendants_only() {
        let tree: Vec<(String, Vec<u32>)> =
            [("pod", 0), ("pod/pause", 1), ("pod/app", 2), ("pod/app/sub", 3), ("pod/apps", 5)]
                .into_iter()
                .map(|(p, n)| (p.to_owned(), (0..n).collect()))
                .collect();
        for (rel, want) in
            [("pod", 11), ("/pod/", 11), ("pod/app", 5), ("pod/pause", 1), ("pod/apps", 5), ("pod/none", 0)]
        {
            assert_eq!(subtree_processes(&tree, rel), want, "{rel}");
        }
    }

    #[test]
    fn shares_to_weight_matches_runc() {
        for (shares, weight) in [(2, 1), (1024, 39), (262_144, 10_000), (0, 100)] {
            assert_eq!(shares_to_weight(shares), weight, "shares={shares}");
        }
    }

    #[test]
    fn controller_dirs_per_version() {
        let v1 = CgroupFs::with_layout(Path::new("/cg"), Version::V1);
        assert_eq!(v1.memory_dir("/kubepods/pod1/"), Path::new("/cg/memory/kubepods/pod1"));
        assert_eq!(v1.controller_dir("pids", "kubepods"), Path::new("/cg/pids/kubepods"));
        let v2 = CgroupFs::with_layout(Path::new("/cg"), Version::V2);
        assert_eq!(v2.memory_dir("kubepods/pod1"), Path::new("/cg/kubepods/pod1"));
        assert_eq!(v2.controller_dir("pids", "kubepods"), Path::new("/cg/kubepods"));
    }
}
