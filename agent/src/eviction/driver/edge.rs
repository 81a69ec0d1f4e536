//! What the driver reads from and does to pod cgroups, behind two small
//! traits: the real ones are cgroupfs ([`CgroupFs`]); unit tests use
//! in-memory twins.

use crate::cgroups::CgroupFs;

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
}

/// Ends every process of a cgroup and its descendants.
pub trait Killer: Send + Sync {
    /// SIGKILL to everything in `cgroup` and below, as fast as the kernel
    /// allows. An error when the cgroup is gone or cannot be written.
    fn kill_all(&self, cgroup: &str) -> Result<(), String>;
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
}

impl Killer for CgroupFs {
    fn kill_all(&self, cgroup: &str) -> Result<(), String> {
        CgroupFs::kill_all(self, cgroup).map(|_| ()).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
pub mod fake {
    //! In-memory twins of the edges, for the driver's table tests.

    use std::{
        collections::{HashMap, HashSet},
        sync::Mutex,
    };

    use super::{CgroupReader, Killer};

    /// Cgroups with figures the test sets. A kill is recorded; the
    /// processes it ends leave when the test says so (they take their time
    /// in a kernel too).
    #[derive(Default)]
    pub struct FakeCgroups {
        pub working_sets: Mutex<HashMap<String, u64>>,
        pub tasks: Mutex<HashMap<String, u64>>,
        pub populated: Mutex<HashSet<String>>,
        pub kills: Mutex<Vec<String>>,
    }

    impl FakeCgroups {
        pub fn kills(&self) -> Vec<String> {
            self.kills.lock().unwrap().clone()
        }

        /// The last process of `cgroup` has exited.
        pub fn emptied(&self, cgroup: &str) {
            self.populated.lock().unwrap().remove(cgroup);
        }
    }

    impl CgroupReader for FakeCgroups {
        fn has_processes(&self, cgroup: &str) -> bool {
            self.populated.lock().unwrap().contains(cgroup)
        }

        fn working_set(&self, cgroup: &str) -> Option<u64> {
            self.working_sets.lock().unwrap().get(cgroup).copied()
        }

        fn tasks(&self, cgroup: &str) -> Option<u64> {
            self.tasks.lock().unwrap().get(cgroup).copied()
        }
    }

    impl Killer for FakeCgroups {
        fn kill_all(&self, cgroup: &str) -> Result<(), String> {
            self.kills.lock().unwrap().push(cgroup.to_owned());
            if self.populated.lock().unwrap().contains(cgroup) { Ok(()) } else { Err(format!("{cgroup}: gone")) }
        }
    }
}
