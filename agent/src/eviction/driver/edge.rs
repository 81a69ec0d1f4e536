//! What the driver reads from and does to pod cgroups, behind three small
//! traits: the real ones are cgroupfs ([`CgroupFs`]); unit tests use
//! in-memory twins.

use std::io::Write;

use crate::{
    cgroups::{CgroupFs, Version},
    eviction::reclaim::MemoryKinds,
};

/// Reads pod and container cgroups.
pub trait CgroupReader: Send + Sync {
    /// Whether any task is left in the cgroup or below it.
    fn has_processes(&self, cgroup: &str) -> bool;
    /// A (container) cgroup's memory working set, for eviction messages.
    fn working_set(&self, cgroup: &str) -> Option<u64>;
    /// Tasks, threads included, in the cgroup and below: what the pod holds
    /// of pid.available (the pids controller's count). None when the
    /// controller is not there.
    fn tasks(&self, cgroup: &str) -> Option<u64>;
    /// The process in the cgroup or below with the most resident memory,
    /// if any: the one the kernel signals when it sees the victim's line
    /// crossed outside the victim's own context.
    fn largest_process(&self, cgroup: &str) -> Option<u32>;
}

/// Ends every process of a cgroup and its descendants.
pub trait Killer: Send + Sync {
    /// SIGKILL to everything in `cgroup` and below, as fast as the kernel
    /// allows, without waiting for the tasks to stop. An error when the
    /// cgroup is gone or cannot be written.
    fn kill_all(&self, cgroup: &str) -> Result<(), String>;
    /// [`Killer::kill_all`] again for a victim whose kill has begun (the
    /// kernel's at a crossing, or the agent's fast path): what is left, a
    /// task the kernel could not reach or one forked while the first kill
    /// ran, is signalled without waiting on the tasks already dying.
    fn kill_survivors(&self, cgroup: &str) -> Result<(), String>;
}

/// How a `memory.reclaim` write ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReclaimWrite {
    /// The kernel reclaimed what was asked.
    Done,
    /// EAGAIN: it reclaimed less than asked (nothing left it could take).
    Short,
}

impl ReclaimWrite {
    /// The `result` label of `swiftlet_memory_reclaim_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReclaimWrite::Done => "done",
            ReclaimWrite::Short => "short",
        }
    }
}

/// Asks the kernel to reclaim page cache from pod cgroups on demand
/// (cgroup v2's `memory.reclaim`, kernel 5.19+).
pub trait Reclaimer: Send + Sync {
    /// None when `cgroup` (and the pods below it) can be reclaimed from on
    /// demand; otherwise why not, for the log.
    fn unavailable(&self, cgroup: &str) -> Option<String>;
    /// The cgroup's anonymous and file memory (memory.stat); None when it
    /// cannot be read.
    fn memory_kinds(&self, cgroup: &str) -> Option<MemoryKinds>;
    /// Writes `bytes` to the cgroup's `memory.reclaim`: the kernel reclaims
    /// that much (page cache; anonymous memory only where there is swap)
    /// before the write returns.
    fn reclaim(&self, cgroup: &str, bytes: u64) -> Result<ReclaimWrite, String>;
}

impl Reclaimer for CgroupFs {
    fn unavailable(&self, cgroup: &str) -> Option<String> {
        if self.version() != Version::V2 {
            return Some("the memory cgroups are v1, which has no memory.reclaim".into());
        }
        let file = self.memory_dir(cgroup).join("memory.reclaim");
        (!file.exists()).then(|| format!("{} does not exist (it needs kernel 5.19 or later)", file.display()))
    }

    fn memory_kinds(&self, cgroup: &str) -> Option<MemoryKinds> {
        let s = self.memory_stat(cgroup).ok()?;
        Some(MemoryKinds { anon: s.anon, active_file: s.active_file, inactive_file: s.inactive_file })
    }

    fn reclaim(&self, cgroup: &str, bytes: u64) -> Result<ReclaimWrite, String> {
        let file = self.memory_dir(cgroup).join("memory.reclaim");
        let write = std::fs::OpenOptions::new().write(true).open(&file).and_then(|mut f| {
            // One write(2): the kernel reads the amount from it whole.
            f.write_all(bytes.to_string().as_bytes())
        });
        match write {
            Ok(()) => Ok(ReclaimWrite::Done),
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::AGAIN.raw_os_error()) => Ok(ReclaimWrite::Short),
            Err(e) => Err(format!("{}: {e}", file.display())),
        }
    }
}

impl CgroupReader for CgroupFs {
    fn has_processes(&self, cgroup: &str) -> bool {
        // The pids controller counts every task until it is reaped, threads
        // of an exiting process included, which cgroup.procs no longer lists.
        match self.pids_current(cgroup) {
            Ok(n) => n > 0,
            Err(_) => self.procs_recursive(cgroup).is_ok_and(|p| !p.is_empty()),
        }
    }

    fn working_set(&self, cgroup: &str) -> Option<u64> {
        CgroupFs::working_set(self, cgroup).ok()
    }

    fn tasks(&self, cgroup: &str) -> Option<u64> {
        self.pids_current(cgroup).ok()
    }

    fn largest_process(&self, cgroup: &str) -> Option<u32> {
        // Resident pages are statm's second field; a process gone since the
        // listing is skipped.
        let resident = |pid: u32| -> Option<u64> {
            let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
            statm.split_whitespace().nth(1)?.parse().ok()
        };
        let procs = self.procs_recursive(cgroup).ok()?;
        procs.into_iter().filter_map(|pid| Some((resident(pid)?, pid))).max().map(|(_, pid)| pid)
    }
}

impl Killer for CgroupFs {
    fn kill_all(&self, cgroup: &str) -> Result<(), String> {
        CgroupFs::kill_listed(self, cgroup).map(|_| ()).map_err(|e| e.to_string())
    }

    fn kill_survivors(&self, cgroup: &str) -> Result<(), String> {
        CgroupFs::kill_listed(self, cgroup).map(|_| ()).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
pub mod fake {
    //! In-memory twins of the edges, for the driver's table tests.

    use std::collections::{HashMap, HashSet};

    use parking_lot::Mutex;

    use super::{CgroupReader, Killer, ReclaimWrite, Reclaimer};
    use crate::{eviction::reclaim::MemoryKinds, signals::memory::MemorySource};

    /// Cgroups with figures the test sets. A kill is recorded; the
    /// processes it ends leave when the test says so (they take their time
    /// in a kernel too).
    #[derive(Default)]
    pub struct FakeCgroups {
        pub working_sets: Mutex<HashMap<String, u64>>,
        pub tasks: Mutex<HashMap<String, u64>>,
        pub populated: Mutex<HashSet<String>>,
        pub largest: Mutex<HashMap<String, u32>>,
        pub kills: Mutex<Vec<String>>,
        pub survivor_kills: Mutex<Vec<String>>,
    }

    impl FakeCgroups {
        /// The cgroups killed whole, in order.
        pub fn kills(&self) -> Vec<String> {
            self.kills.lock().clone()
        }

        /// The cgroups whose survivors were killed after a kernel kill.
        pub fn survivor_kills(&self) -> Vec<String> {
            self.survivor_kills.lock().clone()
        }

        /// The last process of `cgroup` has exited.
        pub fn emptied(&self, cgroup: &str) {
            self.populated.lock().remove(cgroup);
        }
    }

    impl CgroupReader for FakeCgroups {
        fn has_processes(&self, cgroup: &str) -> bool {
            self.populated.lock().contains(cgroup)
        }

        fn working_set(&self, cgroup: &str) -> Option<u64> {
            self.working_sets.lock().get(cgroup).copied()
        }

        fn tasks(&self, cgroup: &str) -> Option<u64> {
            self.tasks.lock().get(cgroup).copied()
        }

        fn largest_process(&self, cgroup: &str) -> Option<u32> {
            self.largest.lock().get(cgroup).copied()
        }
    }

    /// Page cache by cgroup, as the test sets it. A reclaim takes inactive
    /// file pages first, then active ones, from the cgroup and its
    /// ancestors, and lowers the working sets `source` reports by the
    /// active pages it took (the node's too), as the kernel would; a cgroup
    /// in `refilling` gets back at once what it gives (a pod re-reading its
    /// files faster than reclaim takes them): the write comes back short.
    #[derive(Default)]
    pub struct FakeReclaimer {
        pub unavailable: Option<String>,
        pub kinds: Mutex<HashMap<String, MemoryKinds>>,
        pub refilling: Mutex<HashSet<String>>,
        pub writes: Mutex<Vec<(String, u64)>>,
        pub source: Option<std::sync::Arc<MemorySource>>,
    }

    impl FakeReclaimer {
        pub fn writes(&self) -> Vec<(String, u64)> {
            self.writes.lock().clone()
        }
    }

    impl Reclaimer for FakeReclaimer {
        fn unavailable(&self, _cgroup: &str) -> Option<String> {
            self.unavailable.clone()
        }

        fn memory_kinds(&self, cgroup: &str) -> Option<MemoryKinds> {
            self.kinds.lock().get(cgroup).copied()
        }

        fn reclaim(&self, cgroup: &str, bytes: u64) -> Result<ReclaimWrite, String> {
            self.writes.lock().push((cgroup.to_owned(), bytes));
            if self.refilling.lock().contains(cgroup) {
                return Ok(ReclaimWrite::Short);
            }
            let mut kinds = self.kinds.lock();
            let Some(m) = kinds.get(cgroup).copied() else { return Err(format!("{cgroup}: gone")) };
            let inactive = m.inactive_file.min(bytes);
            let active = m.active_file.min(bytes - inactive);
            // The cgroup and every ancestor the test describes.
            let mut path = cgroup.to_owned();
            loop {
                if let Some(k) = kinds.get_mut(&path) {
                    k.active_file -= active;
                    k.inactive_file -= inactive;
                }
                if let Some(source) = &self.source {
                    let mut u = source.cgroup(&path);
                    u.working_set_bytes = u.working_set_bytes.saturating_sub(active);
                    source.set_cgroup(&path, u);
                }
                match path.rfind('/') {
                    Some(i) => path.truncate(i),
                    None => break,
                }
            }
            if let Some(source) = &self.source {
                let mut node = source.node();
                node.working_set_bytes = node.working_set_bytes.saturating_sub(active);
                source.set_node(node);
            }
            Ok(if inactive + active == bytes { ReclaimWrite::Done } else { ReclaimWrite::Short })
        }
    }

    impl Killer for FakeCgroups {
        fn kill_all(&self, cgroup: &str) -> Result<(), String> {
            self.kills.lock().push(cgroup.to_owned());
            if self.populated.lock().contains(cgroup) { Ok(()) } else { Err(format!("{cgroup}: gone")) }
        }

        fn kill_survivors(&self, cgroup: &str) -> Result<(), String> {
            self.survivor_kills.lock().push(cgroup.to_owned());
            if self.populated.lock().contains(cgroup) { Ok(()) } else { Err(format!("{cgroup}: gone")) }
        }
    }
}
