//! The cache race (`eviction-race-cache`): the allocatable race with a
//! Burstable "cache" pod that re-reads a file set larger than the distance
//! to the line, so its active page cache pushes the working set over
//! allocatableMemory.available first, and a BestEffort anonymous hog that
//! starts later. Per mode: how often the cache pod was evicted, whether the
//! hog was killed before the kernel OOM killer, and crossing → hog dead.
//!
//! The page cache has to be real file-backed, reclaimable cache: the file
//! set lives on a block-device filesystem (`SWIFTLET_BENCH_CACHE_DIR`; the
//! VM mounts an ext4 disk there), never tmpfs or an initramfs, whose pages
//! are shmem that no reclaim can free. It needs cgroup v2 (memory.reclaim),
//! so `cargo xtask bench eviction-race-cache` runs it in the VM.

use std::{
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use swiftlet::{
    cgroups::{CgroupFs, Version},
    eviction::driver::{EvictionPod, EvictionRequest},
    signals::monotonic_ns,
};

use super::{ALLOCATABLE, ALLOCATABLE_THRESHOLD, MIB, Mode, Run, Scenario, run::Reaped, run::RunOptions, run_once};
use crate::{
    bench::{BenchResult, Ctx},
    workload,
};

mod report;

/// Where the file set lives (a directory on a block-device filesystem).
pub const CACHE_DIR_ENV: &str = "SWIFTLET_BENCH_CACHE_DIR";
/// The file set: larger than the distance from the steady pod's usage to
/// the line (768 MiB of kubepods' 1 GiB), below kubepods' limit, so the
/// cache alone crosses the line and never meets the limit.
const FILES: usize = 7;
const FILE_MIB: u64 = 128;
/// The cache pod asks for less than it reads: its working set exceeds its
/// request by its page cache, which is how the kubelet ranks it first.
const CACHE_REQUEST: u64 = 256 * MIB;
/// The hog starts this long after the cache's crossing: longer than the
/// kubelet's 10 s housekeeping, so every mode had its chance to evict (or
/// reclaim) before the hog appears.
const HOG_DELAY: Duration = Duration::from_secs(12);
/// How long the cache may take to cross (two passes over the file set from
/// a virtio disk under TCG).
const CROSSING_TIMEOUT: Duration = Duration::from_secs(180);
/// The hog's ramp.
const RATE: u64 = 256;
/// Runs per mode: `SWIFTLET_BENCH_CACHE_RUNS`, else these.
const RUNS: usize = 5;
const QUICK_RUNS: usize = 1;

/// The modes compared, in report order.
pub(super) const MODES: [Mode; 3] = [Mode::Poll(Duration::from_secs(10)), Mode::Kernel, Mode::ReclaimFirst];

/// How the cache pod is set up in a run.
#[derive(Clone, Copy, Debug)]
pub struct CacheLoad {
    pub request: u64,
    pub hog_delay: Duration,
    pub crossing_timeout: Duration,
}

/// What happened to the cache pod in one run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CacheOutcome {
    /// From the reader's start to the observer's first crossing (None: the
    /// cache never crossed the line within the timeout).
    pub crossed_ms: Option<f64>,
    /// Up-crossings of the line before the hog started (more than one:
    /// the working set went back under the line, by reclaim or eviction).
    pub crossings_before_hog: usize,
    /// The agent asked the pod manager to evict the cache pod.
    pub evicted: bool,
    /// The cache pod's reader was dead before the hog started, and by the
    /// end of the run (evicted, killed in the kernel, or OOM-killed).
    pub killed_before_hog: bool,
    pub killed: bool,
    /// The agent evicted the Guaranteed pod beside them (its memory is
    /// under its request: only a line that stays crossed reaches it).
    pub steady_evicted: bool,
}

/// The cache pod as the eviction manager sees it.
pub(super) fn cache_pod(cgroup: &str, load: CacheLoad) -> EvictionPod {
    EvictionPod {
        uid: "cache".into(),
        namespace: "bench".into(),
        name: "cache".into(),
        cgroup: cgroup.to_owned(),
        memory_request: load.request,
        ..Default::default()
    }
}

/// Sets kubepods' memory.high to its limit: no throttling below the
/// limit, and a memory.high someone else chose, which the cgroupfs
/// source never overwrites with its tripwire at the line. That tripwire
/// makes the kernel reclaim kubepods at the line, so with it the polling
/// mode's cache never crossed at all; the poll then keeps what a poll has
/// on v2 (memory.events and PSI wake-ups), without a throttle of its own.
pub(super) fn hold_memory_high(fs: &CgroupFs, kubepods: &str) -> Result<()> {
    let file = fs.memory_dir(kubepods).join("memory.high");
    std::fs::write(&file, ALLOCATABLE.to_string()).with_context(|| format!("cannot write {}", file.display()))
}

/// The cache pod's reader, running from the cache phase to the end of a run.
pub(super) struct CachePhase {
    reader: Reaped,
    crossed_ms: Option<f64>,
    started_ns: u64,
    killed_before_hog: bool,
}

/// Starts the reader in the cache pod, waits for the observer's first
/// crossing (or the timeout), then `hog_delay`.
pub(super) fn cache_phase(
    fs: &CgroupFs,
    pod: &str,
    load: CacheLoad,
    line_events: &Mutex<Vec<(bool, u64)>>,
) -> Result<CachePhase> {
    let dir = cache_dir()?;
    drop_cache(&dir)?;
    let mut cmd = Command::new(workload::binary());
    cmd.arg("reread").arg(&dir).stdout(Stdio::null());
    workload::in_cgroup(&mut cmd, fs, pod);
    let started_ns = monotonic_ns();
    let started = Instant::now();
    let mut reader = Reaped(cmd.spawn().context("cannot start the cache pod's reader")?);
    let first_up = || line_events.lock().unwrap().iter().find(|(up, ns)| *up && *ns >= started_ns).map(|e| e.1);
    while first_up().is_none() && started.elapsed() < load.crossing_timeout {
        // Killed at the agent's own crossing, a page before the observer's
        // instance counted the line: the run goes on, without a crossing.
        if reader.0.try_wait()?.is_some() {
            std::thread::sleep(Duration::from_millis(500));
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let crossed_ms = first_up().map(|ns| (ns - started_ns) as f64 / 1e6);
    match crossed_ms {
        Some(ms) => eprintln!("      the cache crossed the line {ms:.0} ms after its reader started"),
        None => {
            // What the cache pod holds, to tell a slow reader from cache
            // that never became active.
            let stat = std::fs::read_to_string(fs.memory_dir(pod).join("memory.stat")).unwrap_or_default();
            let held: Vec<&str> = stat
                .lines()
                .filter(|l| ["anon ", "file ", "active_file ", "inactive_file "].iter().any(|k| l.starts_with(k)))
                .collect();
            eprintln!(
                "      the cache did not cross the line within {}s; the cache pod's memory.stat: {}",
                load.crossing_timeout.as_secs(),
                held.join(", ")
            );
        }
    }
    std::thread::sleep(load.hog_delay);
    let killed_before_hog = reader.0.try_wait()?.is_some();
    Ok(CachePhase { reader, crossed_ms, started_ns, killed_before_hog })
}

impl CachePhase {
    /// What happened to the cache pod; ends the reader.
    pub(super) fn finish(
        mut self,
        evictions: &[EvictionRequest],
        line_events: &[(bool, u64)],
        hog_start_ns: u64,
    ) -> CacheOutcome {
        let killed = self.killed_before_hog || self.reader.0.try_wait().ok().flatten().is_some();
        CacheOutcome {
            crossed_ms: self.crossed_ms,
            crossings_before_hog: line_events
                .iter()
                .filter(|(up, ns)| *up && *ns >= self.started_ns && *ns < hog_start_ns)
                .count(),
            evicted: evictions.iter().any(|e| e.uid == "cache"),
            steady_evicted: evictions.iter().any(|e| e.uid == "steady"),
            killed_before_hog: self.killed_before_hog,
            killed,
        }
    }
}

/// The line as the hog meets it: where the working set was already over
/// the line when the hog started (the last crossing before was up), the
/// clock starts with the hog; else at the first up-crossing after it.
pub(super) fn crossing_for_hog(line_events: &[(bool, u64)], hog_start_ns: u64) -> Option<u64> {
    let above_at_start =
        line_events.iter().filter(|(_, ns)| *ns < hog_start_ns).max_by_key(|e| e.1).is_some_and(|e| e.0);
    if above_at_start {
        return Some(hog_start_ns);
    }
    line_events.iter().filter(|(up, ns)| *up && *ns >= hog_start_ns).map(|e| e.1).min()
}

/// The file set's directory, checked: set, and on a filesystem whose page
/// cache is reclaimable.
fn cache_dir() -> Result<PathBuf> {
    let dir = std::env::var_os(CACHE_DIR_ENV).map(PathBuf::from).with_context(|| {
        format!(
            "{CACHE_DIR_ENV} is not set: the cache race needs a directory on a block-device filesystem (ext4, \
             xfs); `cargo xtask bench eviction-race-cache` runs it in a VM with one"
        )
    })?;
    std::fs::create_dir_all(&dir).with_context(|| format!("{CACHE_DIR_ENV}={}: cannot create it", dir.display()))?;
    // SAFETY: statfs on a NUL-terminated path into a zeroed struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
    // SAFETY: `c` is NUL-terminated and `st` a valid statfs to fill.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        bail!("{CACHE_DIR_ENV}={}: statfs: {}", dir.display(), std::io::Error::last_os_error());
    }
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    if [TMPFS_MAGIC, RAMFS_MAGIC].contains(&(st.f_type as i64)) {
        bail!(
            "{CACHE_DIR_ENV}={}: tmpfs/ramfs pages are shmem, not reclaimable page cache; use a directory on a \
             block-device filesystem",
            dir.display()
        );
    }
    Ok(dir)
}

fn set_files(dir: &Path) -> Vec<PathBuf> {
    (0..FILES).map(|i| dir.join(format!("cache-{i}"))).collect()
}

/// Writes the file set once (kept between runs), synced, so that dropping
/// it from the page cache leaves nothing dirty behind.
fn write_file_set(dir: &Path) -> Result<()> {
    let chunk = vec![0x5au8; MIB as usize];
    for f in set_files(dir) {
        if std::fs::metadata(&f).is_ok_and(|m| m.len() == FILE_MIB * MIB) {
            continue;
        }
        let mut file = std::fs::File::create(&f).with_context(|| format!("cannot create {}", f.display()))?;
        for _ in 0..FILE_MIB {
            std::io::Write::write_all(&mut file, &chunk).with_context(|| format!("cannot write {}", f.display()))?;
        }
        file.sync_all()?;
    }
    Ok(())
}

/// Drops the file set from the page cache, so the next cache pod's reads
/// fault it in and are charged to that pod (a page stays charged to the
/// cgroup that first read it). Pages just written, or still in a CPU's LRU
/// batch, survive one DONTNEED: it is repeated until mincore(2) finds
/// none resident.
fn drop_cache(dir: &Path) -> Result<()> {
    for f in set_files(dir) {
        let file = std::fs::File::open(&f).with_context(|| format!("cannot open {}", f.display()))?;
        let mut resident = 0;
        for _ in 0..50 {
            // SAFETY: fadvise on an open descriptor.
            let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            if rc != 0 {
                bail!("{}: posix_fadvise(DONTNEED): {}", f.display(), std::io::Error::from_raw_os_error(rc));
            }
            resident = resident_pages(&file).with_context(|| format!("{}: mincore", f.display()))?;
            if resident == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if resident > 0 {
            eprintln!("      {}: {resident} pages still cached after DONTNEED", f.display());
        }
    }
    Ok(())
}

/// How many of the file's pages are in the page cache.
fn resident_pages(file: &std::fs::File) -> std::io::Result<usize> {
    let len = file.metadata()?.len() as usize;
    if len == 0 {
        return Ok(0);
    }
    // SAFETY: a shared read-only mapping of an open file, unmapped below;
    // mincore writes one byte per page into a vector of that many.
    unsafe {
        let addr = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0);
        if addr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let mut vec = vec![0u8; len.div_ceil(4096)];
        let rc = libc::mincore(addr, len, vec.as_mut_ptr());
        let err = std::io::Error::last_os_error();
        libc::munmap(addr, len);
        if rc != 0 {
            return Err(err);
        }
        Ok(vec.iter().filter(|b| **b & 1 == 1).count())
    }
}

/// Runs per mode: `SWIFTLET_BENCH_CACHE_RUNS` when set.
fn run_count(ctx: &Ctx) -> Result<usize> {
    match std::env::var("SWIFTLET_BENCH_CACHE_RUNS") {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => bail!("SWIFTLET_BENCH_CACHE_RUNS={v:?}: expected a positive count"),
        },
        Err(_) => Ok(ctx.pick(RUNS, QUICK_RUNS)),
    }
}

/// The bench: every mode in turn, round by round.
pub fn race_cache(ctx: &Ctx) -> Result<BenchResult> {
    if CgroupFs::detect()?.version() != Version::V2 {
        bail!(
            "the cache race needs cgroup v2 (memory.reclaim; this machine's memory controller is on v1): run \
             `cargo xtask bench eviction-race-cache`, which boots a cgroup v2 VM"
        );
    }
    let dir = cache_dir()?;
    eprintln!("    writing the file set: {FILES} files of {FILE_MIB} MiB in {}", dir.display());
    write_file_set(&dir)?;
    let n = run_count(ctx)?;
    let load = CacheLoad { request: CACHE_REQUEST, hog_delay: HOG_DELAY, crossing_timeout: CROSSING_TIMEOUT };
    let opts = RunOptions { cache: Some(load), ..Default::default() };
    let mut runs: Vec<Run> = vec![];
    for round in 0..n {
        for mode in MODES {
            eprintln!("    cache race: {} at {RATE} MiB/s, round {}/{n}", mode.label(), round + 1);
            let run = run_once(Scenario::Allocatable, mode, RATE, opts)?;
            super::progress(&run);
            if let Some(c) = &run.cache {
                eprintln!(
                    "      cache pod: evicted {}, killed {} ({} before the hog), crossings before the hog {}; \
                     Guaranteed pod evicted {}",
                    c.evicted, c.killed, c.killed_before_hog, c.crossings_before_hog, c.steady_evicted
                );
            }
            runs.push(run);
        }
    }
    let lru_gen = std::fs::read_to_string("/sys/kernel/mm/lru_gen/enabled").unwrap_or_else(|_| "absent".into());
    let title = format!(
        "A Burstable cache pod (request {req} MiB) re-reads {FILES} × {FILE_MIB} MiB of files on ext4 with read(2) \
         until its active page cache pushes kubepods' working set over allocatableMemory.available<{thr}Mi \
         (kubepods limited to {alloc} MiB, the kernel's OOM point), beside a Guaranteed pod; {delay} s later \
         a BestEffort hog's pod is scheduled (oom_score_adj 1000) and ramps at {RATE} MiB/s once the agent \
         plans for it. An evicted cache pod's processes are killed, its page cache stays charged (as a pod's \
         files on a volume would). Crossing → hog dead runs from the line as the hog meets it \
         (the hog's start when the working set was already over the line, else its crossing), both kernel \
         timestamps of an independent observer. Modes in turn, {n} runs each; MGLRU (lru_gen) {lru}.",
        req = CACHE_REQUEST / MIB,
        thr = ALLOCATABLE_THRESHOLD / MIB,
        alloc = ALLOCATABLE / MIB,
        delay = HOG_DELAY.as_secs(),
        lru = lru_gen.trim(),
    );
    report::report(ctx, title, &runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hogs_crossing_is_where_it_meets_the_line() {
        // The cache crossed up at 10 and was never brought back under: the
        // clock starts with the hog.
        assert_eq!(crossing_for_hog(&[(true, 10)], 50), Some(50));
        // Evicted or reclaimed back under the line: the hog's own crossing.
        assert_eq!(crossing_for_hog(&[(true, 10), (false, 20), (true, 70)], 50), Some(70));
        // Events arrive per CPU, not in order: the latest before the hog counts.
        assert_eq!(crossing_for_hog(&[(false, 20), (true, 10), (true, 90), (true, 60)], 50), Some(60));
        // Never crossed at all.
        assert_eq!(crossing_for_hog(&[], 50), None);
        assert_eq!(crossing_for_hog(&[(true, 10), (false, 20)], 50), None);
    }
}
