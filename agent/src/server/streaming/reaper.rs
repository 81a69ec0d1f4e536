//! Ending what an abandoned exec left running. CRI has no call to stop an
//! exec session, and a runtime whose client went away lets the command
//! run on (the kubelet leaks it the same way). So each exec learns its
//! process when it starts: the runtime's shim is the parent of the
//! container's first process and of every exec'd process (it is their
//! subreaper), and exec'd processes share the container's cgroup. Starts
//! in one container are serialized, so the one new child of the shim in
//! that cgroup is this session's. When the client drops the session (or
//! it idles out), that process and its descendants are killed.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use parking_lot::Mutex;
use rustix::process::{Pid, Signal};
use tokio::sync::OwnedMutexGuard;

/// How long a start waits for its process to appear.
const CLAIM_WINDOW: Duration = Duration::from_secs(3);
const POLL: Duration = Duration::from_millis(10);

/// Exec processes in use, and the per-container start locks.
#[derive(Default)]
pub struct ExecTracker {
    starts: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    claimed: Arc<Mutex<HashSet<u32>>>,
}

/// A process seen under the shim: pid and cgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Child {
    pub pid: u32,
    pub cgroup: String,
}

/// The exec'd processes among the shim's children now: those in the
/// container's cgroup that were not there before the start, are not the
/// container's first process and belong to no other session (pure).
pub fn new_exec_processes(before: &HashSet<u32>, now: &[Child], init: &Child, claimed: &HashSet<u32>) -> Vec<u32> {
    let mut v: Vec<u32> = now
        .iter()
        .filter(|c| c.pid != init.pid && c.cgroup == init.cgroup)
        .filter(|c| !before.contains(&c.pid) && !claimed.contains(&c.pid))
        .map(|c| c.pid)
        .collect();
    v.sort_unstable();
    v
}

/// A start in progress: holds the container's start lock.
pub struct Start {
    _guard: OwnedMutexGuard<()>,
    shim: u32,
    init: Child,
    before: HashSet<u32>,
    claimed: Arc<Mutex<HashSet<u32>>>,
}

/// The process an exec session started; unclaimed when dropped.
pub struct ExecProcess {
    pub pid: u32,
    start_time: u64,
    claimed: Arc<Mutex<HashSet<u32>>>,
}

impl ExecTracker {
    /// Takes the container's start lock and notes the shim's children.
    /// None when the container's process cannot be found (nothing will
    /// be reaped for this session).
    pub async fn begin(&self, container_id: &str, init_pid: u32) -> Option<Start> {
        let m = self.starts.lock().entry(container_id.to_owned()).or_default().clone();
        let guard = m.lock_owned().await;
        let init_cgroup = proc_fs::cgroup(init_pid)?;
        let shim = proc_fs::ppid(init_pid)?;
        let before = proc_fs::children(shim).into_iter().collect();
        Some(Start {
            _guard: guard,
            shim,
            init: Child { pid: init_pid, cgroup: init_cgroup },
            before,
            claimed: self.claimed.clone(),
        })
    }
}

impl Start {
    /// Waits for the session's process to appear (or `done` to resolve:
    /// the command already ended) and claims it; releases the lock.
    pub async fn claim(self, done: impl std::future::Future<Output = ()>) -> Option<ExecProcess> {
        let mut done = std::pin::pin!(done);
        let deadline = tokio::time::Instant::now() + CLAIM_WINDOW;
        loop {
            let (shim, before, init, claimed) =
                (self.shim, self.before.clone(), self.init.clone(), self.claimed.clone());
            let found = tokio::task::spawn_blocking(move || {
                let now: Vec<Child> = proc_fs::children(shim)
                    .into_iter()
                    .filter_map(|pid| Some(Child { pid, cgroup: proc_fs::cgroup(pid)? }))
                    .collect();
                let mut c = claimed.lock();
                let pid = new_exec_processes(&before, &now, &init, &c).into_iter().next()?;
                let start_time = proc_fs::start_time(pid)?;
                c.insert(pid);
                Some((pid, start_time))
            })
            .await
            .ok()
            .flatten();
            if let Some((pid, start_time)) = found {
                return Some(ExecProcess { pid, start_time, claimed: self.claimed.clone() });
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::select! {
                _ = &mut done => return None,
                _ = tokio::time::sleep(POLL) => {}
            }
        }
    }
}

impl ExecProcess {
    /// SIGKILLs the process and its descendants (if it is still the same
    /// process: its start time is unchanged).
    pub fn kill(&self) -> usize {
        if proc_fs::start_time(self.pid) != Some(self.start_time) {
            return 0;
        }
        let mut tree = vec![self.pid];
        let mut i = 0;
        while i < tree.len() {
            let kids = proc_fs::children(tree[i]);
            tree.extend(kids);
            i += 1;
        }
        for pid in tree.iter().filter_map(|p| i32::try_from(*p).ok().and_then(Pid::from_raw)) {
            // A process that has exited meanwhile is not an error.
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
        tree.len()
    }
}

impl Drop for ExecProcess {
    fn drop(&mut self) {
        self.claimed.lock().remove(&self.pid);
    }
}

/// The few /proc reads the tracker needs. The cgroup file is kept as its
/// text: the tracker only compares a child's with the container's.
mod proc_fs {
    use procfs::process::Process;

    fn process(pid: u32) -> Option<Process> {
        Process::new(i32::try_from(pid).ok()?).ok()
    }

    pub fn children(pid: u32) -> Vec<u32> {
        let Some(tasks) = process(pid).and_then(|p| p.tasks().ok()) else { return vec![] };
        tasks.flatten().filter_map(|t| t.children().ok()).flatten().collect()
    }

    pub fn cgroup(pid: u32) -> Option<String> {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()
    }

    pub fn ppid(pid: u32) -> Option<u32> {
        u32::try_from(process(pid)?.stat().ok()?.ppid).ok()
    }

    pub fn start_time(pid: u32) -> Option<u64> {
        Some(process(pid)?.stat().ok()?.starttime)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_new_child_in_the_containers_cgroup_is_the_sessions() {
        let init = Child { pid: 10, cgroup: "pod/c1".into() };
        let c = |pid: u32, cg: &str| Child { pid, cgroup: cg.into() };
        let now = vec![c(10, "pod/c1"), c(11, "pod/c2"), c(12, "pod/c1"), c(20, "pod/c1"), c(21, "pod/c1")];
        let before: HashSet<u32> = [10, 11, 12].into();
        let claimed: HashSet<u32> = [20].into();
        assert_eq!(new_exec_processes(&before, &now, &init, &claimed), vec![21]);
        assert!(new_exec_processes(&before, &now[..3], &init, &claimed).is_empty());
    }

    #[test]
    fn proc_reads_of_this_process() {
        let me = std::process::id();
        assert_eq!(proc_fs::ppid(me), Some(std::os::unix::process::parent_id()));
        assert!(proc_fs::start_time(me).is_some());
        assert!(proc_fs::cgroup(me).is_some());
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        assert!(proc_fs::children(me).contains(&child.id()));
        let p = ExecProcess {
            pid: child.id(),
            start_time: proc_fs::start_time(child.id()).unwrap(),
            claimed: Arc::default(),
        };
        assert_eq!(p.kill(), 1);
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(Signal::KILL.as_raw()));
    }
}
