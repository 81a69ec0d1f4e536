//! Killing everything in a cgroup tree: `cgroup.kill` on v2; on v1, the
//! freezer and a signal to each task, or, where the freezer would make
//! eviction wait, pidfds.

use std::{
    collections::HashSet,
    os::fd::OwnedFd,
    path::Path,
    time::{Duration, Instant},
};

use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};

use super::{CgroupFs, Result, Version};

/// How long a v1 kill waits for its cgroup to read FROZEN: freezing stops
/// each task at its next return to user space, microseconds for running
/// or sleeping tasks.
const FREEZE_WAIT: Duration = Duration::from_millis(100);

/// The most passes [`CgroupFs::kill_listed`] makes over a v1 tree before it
/// falls back to the freezer.
const SIGNAL_PASSES: usize = 16;

impl CgroupFs {
    /// Kills every process in `rel` and its descendants with SIGKILL, as
    /// fast as the kernel allows: `cgroup.kill` on v2. On v1, the freezer
    /// first: once the cgroup reads FROZEN no task of it can fork or exit,
    /// so the pids read from `tasks` are still the tasks they name when the
    /// signal goes out (no pid reuse); then SIGKILL each task and thaw, so
    /// the signals are delivered. Returns how many tasks were signalled on
    /// v1 (v2 does not say).
    pub fn kill_all(&self, rel: &str) -> Result<usize> {
        match self.version {
            Version::V2 => {
                let path = self.memory_dir(rel).join("cgroup.kill");
                self.write(&path, "1")?;
                Ok(0)
            }
            Version::V1 => {
                let state = self.controller_dir("freezer", rel).join("freezer.state");
                let frozen = state.exists() && self.write(&state, "FROZEN").is_ok();
                if frozen && !self.wait_frozen(&state) {
                    // A task stuck in the kernel (uninterruptible sleep) keeps
                    // the cgroup FREEZING; signal anyway rather than wait on it.
                    tracing::debug!(cgroup = rel, "not FROZEN within {FREEZE_WAIT:?}; signalling what is there");
                }
                let result = self.signal_tree(rel, Signal::KILL);
                if frozen {
                    // Thaw even when signalling failed, or the tasks stay
                    // frozen forever.
                    let _ = self.write(&state, "THAWED");
                }
                result
            }
        }
    }

    /// Polls a v1 `freezer.state` (each read advances the freeze) until it
    /// says FROZEN; false after [`FREEZE_WAIT`]. It sleeps between reads
    /// rather than yields: the tasks must run to freeze, and a caller under
    /// SCHED_FIFO (the eviction fast path) that only yielded would keep its
    /// core from them.
    fn wait_frozen(&self, state: &Path) -> bool {
        let deadline = Instant::now() + FREEZE_WAIT;
        loop {
            if self.read(state).is_ok_and(|s| s.trim() == "FROZEN") {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    fn signal_tree(&self, rel: &str, sig: Signal) -> Result<usize> {
        // Each cgroup's own tasks (threads included: a thread's id is a pid
        // kill(2) takes, and it signals the whole process).
        let mut n = 0;
        let dir = self.memory_dir(rel);
        let tasks = self.read(&dir.join("tasks")).or_else(|_| self.read(&dir.join("cgroup.procs")))?;
        // A pid that has exited meanwhile yields ESRCH, which is fine. `Pid`
        // is positive: a stray 0 or -1 in the file never becomes kill(2)'s
        // "this process group" or "every process".
        let pids = tasks.lines().filter_map(|l| Pid::from_raw(l.trim().parse::<i32>().ok()?));
        for pid in pids {
            if rustix::process::kill_process(pid, sig).is_ok() {
                n += 1;
            }
        }
        for child in self.children(rel)? {
            n += self.signal_tree(&child, sig).unwrap_or(0);
        }
        Ok(n)
    }

    /// Kills every process of `rel`'s tree at once, without waiting for the
    /// freezer: eviction's kill. On v1 the freezer is slow exactly when
    /// eviction has to be fast: a task freezes only when it next runs (with
    /// every core busy, after its turn on one), and a cgroup whose task is
    /// already exiting (a victim the kernel has begun to kill, freeing its
    /// memory) never reads FROZEN, so [`CgroupFs::kill_all`] would wait out
    /// [`FREEZE_WAIT`]. A process signalled here stops at its next return to
    /// user space, and the kernel kills any task of a doomed victim that
    /// charges memory meanwhile.
    ///
    /// On v2 this is `cgroup.kill`. On v1 each pass lists the tree's
    /// processes, opens a pidfd for each one not yet signalled, lists them
    /// again and signals through the pidfd only those still listed: a pidfd
    /// names one process, so when a pid was reused between the two lists
    /// the new process is a member (and is meant to die) or the pidfd's
    /// process is dead (ESRCH). Passes go on while they find processes not
    /// yet signalled (one forked during a pass is listed by the next, and a
    /// process with SIGKILL pending cannot fork). A tree still forking after
    /// [`SIGNAL_PASSES`] passes (a fork bomb outrunning them) is stopped
    /// with the freezer. A child whose fork was past its parent's signal
    /// check but not yet in the cgroup's list when the last pass ran is
    /// left: eviction sweeps the tree again once the reader thread has
    /// handed the kill to the manager, and the pod's stop through the
    /// runtime ends what is left. Returns how many processes were signalled
    /// on v1.
    pub fn kill_listed(&self, rel: &str) -> Result<usize> {
        if self.version == Version::V2 {
            return self.kill_all(rel);
        }
        let mut signalled = HashSet::new();
        for _ in 0..SIGNAL_PASSES {
            let fresh: Vec<(Pid, OwnedFd)> = self
                .tree_pids(rel)?
                .into_iter()
                .filter(|pid| !signalled.contains(pid))
                .filter_map(|pid| Some((pid, pidfd_open(pid, PidfdFlags::empty()).ok()?)))
                .collect();
            if fresh.is_empty() {
                return Ok(signalled.len());
            }
            let still: HashSet<Pid> = self.tree_pids(rel)?.into_iter().collect();
            for (pid, fd) in fresh {
                if still.contains(&pid) && pidfd_send_signal(&fd, Signal::KILL).is_ok() {
                    signalled.insert(pid);
                }
            }
        }
        tracing::debug!(cgroup = rel, "still forking after {SIGNAL_PASSES} passes; freezing it to end the rest");
        Ok(signalled.len() + self.kill_all(rel)?)
    }

    /// The processes of `rel`'s tree ([`CgroupFs::procs_recursive`]) as
    /// pids. `Pid` is positive: a stray 0 never becomes "this process
    /// group".
    fn tree_pids(&self, rel: &str) -> Result<Vec<Pid>> {
        let procs = self.procs_recursive(rel)?;
        Ok(procs.into_iter().filter_map(|p| Pid::from_raw(i32::try_from(p).ok()?)).collect())
    }
}
