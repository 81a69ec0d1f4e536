//! Who goes first: the kubelet's ranking for each kind of pressure.

use std::cmp::Ordering;

/// A resource's request and current usage for one pod.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub request: u64,
    pub usage: u64,
}

impl Usage {
    pub fn exceeds_request(&self) -> bool {
        self.usage > self.request
    }

    /// Usage above the request (0 when within it).
    pub fn above_request(&self) -> u64 {
        self.usage.saturating_sub(self.request)
    }
}

/// One container of a pod, for eviction messages: its memory request, and
/// its cgroup, whose usage is read only for the pods evicted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerRef {
    pub name: String,
    pub memory_request: u64,
    /// Its cgroup (relative path); None when unknown.
    pub cgroup: Option<String>,
}

/// A pod as the eviction manager sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Candidate {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub priority: i32,
    /// False for critical pods, which are never evicted.
    pub evictable: bool,
    /// terminationGracePeriodSeconds, for soft evictions.
    pub termination_grace_secs: u64,
    pub memory: Usage,
    /// Tasks, threads included: what counts against pid.available (a pod
    /// with one process and thousands of threads holds thousands of pids).
    pub tasks: u64,
    pub disk: Usage,
    pub inodes: u64,
    pub containers: Vec<ContainerRef>,
    /// Already being evicted: its usage is as good as reclaimed, and it is
    /// not picked again.
    pub in_flight: bool,
}

/// Memory: pods whose usage exceeds their request first, then lower
/// priority first, then the larger usage above request first.
pub fn by_memory(a: &Candidate, b: &Candidate) -> Ordering {
    b.memory
        .exceeds_request()
        .cmp(&a.memory.exceeds_request())
        .then(a.priority.cmp(&b.priority))
        .then(b.memory.above_request().cmp(&a.memory.above_request()))
}

/// PIDs: lower priority first, then more tasks first.
pub fn by_tasks(a: &Candidate, b: &Candidate) -> Ordering {
    a.priority.cmp(&b.priority).then(b.tasks.cmp(&a.tasks))
}

/// Disk bytes: over request first, then priority, then usage.
pub fn by_disk(a: &Candidate, b: &Candidate) -> Ordering {
    b.disk
        .exceeds_request()
        .cmp(&a.disk.exceeds_request())
        .then(a.priority.cmp(&b.priority))
        .then(b.disk.usage.cmp(&a.disk.usage))
}

/// Inodes: priority, then inode usage (pods have no inode requests).
pub fn by_inodes(a: &Candidate, b: &Candidate) -> Ordering {
    a.priority.cmp(&b.priority).then(b.inodes.cmp(&a.inodes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, priority: i32, request: u64, usage: u64) -> Candidate {
        Candidate {
            name: name.into(),
            uid: name.into(),
            priority,
            evictable: true,
            memory: Usage { request, usage },
            ..Default::default()
        }
    }

    fn order(mut pods: Vec<Candidate>, f: fn(&Candidate, &Candidate) -> Ordering) -> Vec<String> {
        pods.sort_by(f);
        pods.into_iter().map(|p| p.name).collect()
    }

    #[test]
    fn memory_table() {
        let cases: Vec<(&str, Vec<Candidate>, Vec<&str>)> = vec![
            (
                "exceeding requests beats priority",
                vec![pod("within-low-prio", -10, 100, 50), pod("over-high-prio", 1000, 10, 20)],
                vec!["over-high-prio", "within-low-prio"],
            ),
            (
                "among over-request pods, lower priority first",
                vec![pod("p100", 100, 0, 10), pod("p0", 0, 0, 5), pod("p50", 50, 0, 99)],
                vec!["p0", "p50", "p100"],
            ),
            (
                "same priority: larger usage above request first",
                vec![pod("small", 0, 100, 150), pod("big", 0, 100, 900), pod("mid", 0, 0, 400)],
                vec!["big", "mid", "small"],
            ),
            (
                "best-effort (no request) hog vs burstable within request",
                vec![pod("burstable", 0, 1 << 30, 1 << 29), pod("besteffort", 0, 0, 1 << 20)],
                vec!["besteffort", "burstable"],
            ),
        ];
        for (name, pods, want) in cases {
            assert_eq!(order(pods, by_memory), want, "{name}");
        }
    }

    #[test]
    fn pid_and_disk_tables() {
        let mut a = pod("a", 0, 0, 0);
        a.tasks = 10;
        let mut b = pod("b", 0, 0, 0);
        b.tasks = 500;
        let mut c = pod("c", -1, 0, 0);
        c.tasks = 1;
        assert_eq!(order(vec![a.clone(), b.clone(), c.clone()], by_tasks), ["c", "b", "a"]);

        a.disk = Usage { request: 0, usage: 10 };
        b.disk = Usage { request: 1000, usage: 500 };
        c.disk = Usage { request: 0, usage: 5 };
        c.priority = 5;
        // a and c exceed (no request); a has lower priority; b is within.
        assert_eq!(order(vec![b.clone(), c.clone(), a.clone()], by_disk), ["a", "c", "b"]);
        a.inodes = 3;
        b.inodes = 30;
        c.inodes = 300;
        assert_eq!(order(vec![a, b, c], by_inodes), ["b", "a", "c"]);
    }

    /// Threads count: one process with 30,000 threads holds 30,000 pids, its
    /// neighbour with five single-threaded processes five.
    #[test]
    fn the_thread_bomb_goes_first() {
        let cases: [(&str, u64, u64, &str); 3] = [
            ("threads outnumber processes", 30_000, 5, "bomb"),
            ("a few threads against many processes", 3, 40, "neighbour"),
            ("equal tasks: the stable order", 5, 5, "bomb"),
        ];
        for (name, bomb_tasks, neighbour_tasks, first) in cases {
            let mut bomb = pod("bomb", 0, 0, 0);
            bomb.tasks = bomb_tasks;
            let mut neighbour = pod("neighbour", 0, 0, 0);
            neighbour.tasks = neighbour_tasks;
            assert_eq!(order(vec![bomb, neighbour], by_tasks)[0], first, "{name}");
        }
    }
}
