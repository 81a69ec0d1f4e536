//! Which pods stop when during a graceful node shutdown (the kubelet's
//! shutdownManager): pods grouped by priority, lowest group first, each
//! group with its own budget; a pod's grace is its
//! terminationGracePeriodSeconds if that is shorter than the budget. Pure.

use std::time::Duration;

use crate::cm::qos::SYSTEM_CRITICAL_PRIORITY;

/// One step: pods with priority from `priority` up to the next step's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PriorityPeriod {
    pub priority: i32,
    pub period: Duration,
}

/// `shutdownGracePeriod` and `shutdownGracePeriodCriticalPods` as the
/// kubelet's `migrateConfig` turns them into two steps: regular pods get
/// the difference, critical pods (priority ≥ system-cluster-critical) the
/// rest. Empty (the feature off) when the period is zero or shorter than
/// the critical one.
pub fn steps(grace: Duration, critical: Duration) -> Vec<PriorityPeriod> {
    if grace.is_zero() || critical > grace {
        return vec![];
    }
    let whole = |d: Duration| Duration::from_secs(d.as_secs());
    vec![
        PriorityPeriod { priority: 0, period: whole(grace - critical) },
        PriorityPeriod { priority: SYSTEM_CRITICAL_PRIORITY, period: whole(critical) },
    ]
}

/// A pod to stop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShutdownPod {
    pub uid: String,
    pub name: String,
    pub priority: i32,
    /// terminationGracePeriodSeconds, when set.
    pub termination_grace: Option<Duration>,
}

/// One group: its pods stop together, then the next group starts after
/// they all stopped or the period ran out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub priority: i32,
    pub period: Duration,
    /// (pod, the grace it gets)
    pub pods: Vec<(ShutdownPod, Duration)>,
}

/// The kubelet's `groupByPriority`: a pod goes to the highest step whose
/// priority is at or below its own (below the lowest: the lowest). Groups
/// come in ascending priority; empty ones are dropped.
pub fn groups(steps: &[PriorityPeriod], pods: &[ShutdownPod]) -> Vec<Group> {
    let mut steps = steps.to_vec();
    steps.sort_by_key(|s| s.priority);
    let mut out: Vec<Group> =
        steps.iter().map(|s| Group { priority: s.priority, period: s.period, pods: vec![] }).collect();
    if out.is_empty() {
        return out;
    }
    for p in pods {
        let i = out.iter().rposition(|g| g.priority <= p.priority).unwrap_or(0);
        let budget = out[i].period;
        let grace = p.termination_grace.filter(|g| *g <= budget).unwrap_or(budget);
        out[i].pods.push((p.clone(), grace));
    }
    out.retain(|g| !g.pods.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, priority: i32, grace: Option<u64>) -> ShutdownPod {
        ShutdownPod { uid: name.into(), name: name.into(), priority, termination_grace: grace.map(Duration::from_secs) }
    }

    fn names(g: &Group) -> Vec<(&str, u64)> {
        g.pods.iter().map(|(p, d)| (p.name.as_str(), d.as_secs())).collect()
    }

    #[test]
    fn migrated_steps() {
        let s = |a, b| steps(Duration::from_secs(a), Duration::from_secs(b));
        assert_eq!(
            s(30, 10),
            vec![
                PriorityPeriod { priority: 0, period: Duration::from_secs(20) },
                PriorityPeriod { priority: SYSTEM_CRITICAL_PRIORITY, period: Duration::from_secs(10) },
            ]
        );
        assert!(s(0, 0).is_empty(), "disabled");
        assert!(s(10, 20).is_empty(), "critical above the whole");
        assert_eq!(s(10, 0)[1].period, Duration::ZERO);
    }

    #[test]
    fn regular_first_critical_last_with_the_shorter_grace() {
        let st = steps(Duration::from_secs(30), Duration::from_secs(10));
        let pods = vec![
            pod("critical", 2_000_001_000, Some(30)),
            pod("web", 0, Some(5)),
            pod("batch", 1000, None),
            pod("negative", -5, Some(60)),
            pod("cluster-critical", SYSTEM_CRITICAL_PRIORITY, Some(2)),
        ];
        let g = groups(&st, &pods);
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].priority, 0);
        assert_eq!(names(&g[0]), vec![("web", 5), ("batch", 20), ("negative", 20)]);
        assert_eq!(g[1].period, Duration::from_secs(10));
        assert_eq!(names(&g[1]), vec![("critical", 10), ("cluster-critical", 2)]);
        // Only critical pods: one group.
        let g = groups(&st, &pods[..1]);
        assert_eq!((g.len(), g[0].priority), (1, SYSTEM_CRITICAL_PRIORITY));
        assert!(groups(&[], &pods).is_empty());
    }
}
