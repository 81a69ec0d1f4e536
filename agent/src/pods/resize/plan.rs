//! How an admitted resize is applied to a running pod, as the kubelet's
//! computePodResizeAction / doPodResizeAction: each running container whose
//! resources differ from its allocation is updated in place with
//! UpdateContainerResources, or restarted when its resizePolicy says
//! RestartContainer for a resource that changed; the pod cgroup is grown
//! before the containers and shrunk after them, so that a container's
//! limits never exceed its pod's; and a memory limit set below what the
//! pod uses now is not applied (the resize stays in progress with an
//! error, and is tried again). Pure.

use crate::{cm::hierarchy::CgroupLimits, cri::api::LinuxContainerResources};

/// A running container and the resources it runs with and should run with.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerNow {
    pub name: String,
    pub id: String,
    pub actual: LinuxContainerResources,
    pub wanted: LinuxContainerResources,
    /// resizePolicy RestartContainer for cpu, for memory.
    pub restart_on_cpu: bool,
    pub restart_on_memory: bool,
}

/// What to do, in order: `grow_pod`, `updates`, `restarts`, `shrink_pod`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResizePlan {
    pub grow_pod: Option<CgroupLimits>,
    /// (container id, name, resources).
    pub updates: Vec<(String, String, LinuxContainerResources)>,
    /// (container id, name): stopped, and started again by the pod's sync
    /// with the allocated resources.
    pub restarts: Vec<(String, String)>,
    pub shrink_pod: Option<CgroupLimits>,
    /// Why nothing is applied this time (the PodResizeInProgress error).
    pub error: Option<String>,
}

impl ResizePlan {
    pub fn is_empty(&self) -> bool {
        self.grow_pod.is_none()
            && self.updates.is_empty()
            && self.restarts.is_empty()
            && self.shrink_pod.is_none()
            && self.error.is_none()
    }
}

fn cpu_differs(a: &LinuxContainerResources, b: &LinuxContainerResources) -> bool {
    a.cpu_shares != b.cpu_shares || a.cpu_quota != b.cpu_quota || (a.cpu_quota > 0 && a.cpu_period != b.cpu_period)
}

fn memory_differs(a: &LinuxContainerResources, b: &LinuxContainerResources) -> bool {
    a.memory_limit_in_bytes != b.memory_limit_in_bytes
}

/// None is unlimited: the larger of two limits.
fn max_limit<T: Ord + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        _ => None,
    }
}

/// Each limit at the larger of the two: the pod cgroup while its
/// containers change.
fn grown(old: &CgroupLimits, new: &CgroupLimits) -> CgroupLimits {
    let mut g = new.clone();
    g.memory = max_limit(old.memory, new.memory);
    g.cpu.quota_us = max_limit(old.cpu.quota_us, new.cpu.quota_us);
    g.cpu.shares = match (old.cpu.shares, new.cpu.shares) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => b.or(a),
    };
    g
}

/// The plan for one round. `pod_old` is what the pod cgroup was last set
/// to (None: not known, after a restart of the agent: the new limits are
/// then set first); `pod_memory_usage` is the pod cgroup's usage now.
pub fn plan(
    pod_name: &str,
    containers: &[ContainerNow],
    pod_old: Option<&CgroupLimits>,
    pod_new: &CgroupLimits,
    pod_memory_usage: Option<u64>,
) -> ResizePlan {
    let mut p = ResizePlan::default();
    let mut memory_changes = false;
    for c in containers {
        let (cpu, memory) = (cpu_differs(&c.actual, &c.wanted), memory_differs(&c.actual, &c.wanted));
        if !cpu && !memory {
            continue;
        }
        memory_changes |= memory;
        if (cpu && c.restart_on_cpu) || (memory && c.restart_on_memory) {
            p.restarts.push((c.id.clone(), c.name.clone()));
        } else {
            p.updates.push((c.id.clone(), c.name.clone(), c.wanted.clone()));
        }
    }
    let pod_changes = pod_old != Some(pod_new);
    if p.updates.is_empty() && p.restarts.is_empty() && !pod_changes {
        return p;
    }
    let old = pod_old.cloned().unwrap_or_else(|| pod_new.clone());
    memory_changes |= old.memory != pod_new.memory;
    // The kubelet does not lower a pod's memory limit below its usage (the
    // kernel would reclaim or OOM-kill to get there): the resize waits.
    if memory_changes
        && let (Some(limit), Some(usage)) = (pod_new.memory, pod_memory_usage)
        && old.memory.is_none_or(|o| limit < o)
        && usage >= limit
    {
        return ResizePlan {
            error: Some(format!(
                "aborting attempt to set pod memory limit less than current memory usage for pod {pod_name}"
            )),
            ..Default::default()
        };
    }
    if pod_changes || pod_old.is_none() {
        let g = grown(&old, pod_new);
        if &g != pod_new {
            p.shrink_pod = Some(pod_new.clone());
        }
        p.grow_pod = Some(g);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroups::CpuLimits;

    fn cri(quota: i64, shares: i64, memory: i64) -> LinuxContainerResources {
        LinuxContainerResources {
            cpu_period: if quota > 0 { 100_000 } else { 0 },
            cpu_quota: quota,
            cpu_shares: shares,
            memory_limit_in_bytes: memory,
            ..Default::default()
        }
    }

    fn pod(quota: Option<i64>, shares: u64, memory: Option<u64>) -> CgroupLimits {
        CgroupLimits {
            memory,
            cpu: CpuLimits { shares: Some(shares), quota_us: quota, period_us: 100_000 },
            pids: None,
            hugetlb: vec![],
        }
    }

    fn c(actual: LinuxContainerResources, wanted: LinuxContainerResources, cpu: bool, mem: bool) -> ContainerNow {
        ContainerNow {
            name: "app".into(),
            id: "c1".into(),
            actual,
            wanted,
            restart_on_cpu: cpu,
            restart_on_memory: mem,
        }
    }

    const MI: i64 = 1 << 20;

    #[test]
    fn plan_table() {
        let small = pod(Some(50_000), 512, Some(64 << 20));
        let big = pod(Some(100_000), 1024, Some(128 << 20));
        let up = c(cri(50_000, 512, 64 * MI), cri(100_000, 1024, 128 * MI), false, false);
        let down = c(cri(100_000, 1024, 128 * MI), cri(50_000, 512, 64 * MI), false, false);

        // Growing: the pod first, nothing to shrink after.
        let p = plan("web", std::slice::from_ref(&up), Some(&small), &big, Some(10 << 20));
        assert_eq!(p.grow_pod, Some(big.clone()));
        assert_eq!(p.updates, vec![("c1".into(), "app".into(), cri(100_000, 1024, 128 * MI))]);
        assert_eq!((p.restarts.len(), p.shrink_pod.clone(), p.error.clone()), (0, None, None));

        // Shrinking: the pod stays large while the containers shrink.
        let p = plan("web", std::slice::from_ref(&down), Some(&big), &small, Some(10 << 20));
        assert_eq!(p.grow_pod, Some(big.clone()));
        assert_eq!(p.shrink_pod, Some(small.clone()));
        assert_eq!(p.updates.len(), 1);

        // Below what the pod uses: nothing is applied, the error says why.
        let p = plan("web", std::slice::from_ref(&down), Some(&big), &small, Some(100 << 20));
        assert!(p.updates.is_empty() && p.grow_pod.is_none());
        assert_eq!(
            p.error.as_deref(),
            Some("aborting attempt to set pod memory limit less than current memory usage for pod web")
        );

        // RestartContainer for cpu: a cpu change restarts, a memory-only
        // change with the same policy does not.
        let p =
            plan("web", &[c(cri(50_000, 512, 64 * MI), cri(100_000, 1024, 64 * MI), true, false)], None, &big, None);
        assert_eq!(p.restarts, vec![("c1".into(), "app".into())]);
        assert!(p.updates.is_empty());
        let p = plan("web", &[c(cri(50_000, 512, 64 * MI), cri(50_000, 512, 128 * MI), true, false)], None, &big, None);
        assert_eq!((p.restarts.len(), p.updates.len()), (0, 1));

        // Nothing differs: nothing to do.
        let same = c(cri(50_000, 512, 64 * MI), cri(50_000, 512, 64 * MI), false, false);
        assert!(plan("web", &[same], Some(&small), &small, None).is_empty());
    }

    #[test]
    fn unlimited_stays_unlimited_while_growing() {
        let limited = pod(Some(50_000), 512, Some(64 << 20));
        let unlimited = pod(None, 512, None);
        assert_eq!(grown(&limited, &unlimited), unlimited);
        assert_eq!(grown(&unlimited, &limited).memory, None, "the old unlimited stays until after the containers");
        let p = plan("web", &[], Some(&unlimited), &limited, Some(1 << 20));
        assert_eq!((p.grow_pod.clone().unwrap().memory, p.shrink_pod.unwrap().memory), (None, Some(64 << 20)));
    }
}
