//! Container garbage collection, the decision (pure), as the kubelet's
//! `containerGC` with its GCPolicy (MinAge 0, MaxPerPodContainer 1,
//! MaxContainers -1 by default):
//!
//! - dead containers (anything not running: exited, created and never
//!   started, unknown) older than MinAge are grouped by (pod uid,
//!   container name), newest first;
//! - once every pod source has synced, all of a group goes when its pod's
//!   content may be removed (deleted and terminated, evicted, or unknown),
//!   or, for disk-pressure reclaim, when its pod will not run again;
//! - otherwise each group keeps its MaxPerPodContainer newest (the last
//!   dead container, for `kubectl logs --previous`, lastState and the
//!   restart count), and MaxContainers caps the total, oldest first;
//! - sandboxes: of a pod whose content may be removed, every one that is
//!   not ready and holds no container; otherwise all but the newest;
//! - pod log directories (`<ns>_<name>_<uid>`) of pods whose content may
//!   be removed, once no sandbox of the pod is left (whoever made it).
//!
//! Only sandboxes and containers carrying swiftlet's labels are ever
//! considered (`cri::labels::identity`).

use std::{collections::HashMap, time::Duration};

use crate::cri::{api, labels};

/// The kubelet's container GC policy (`--minimum-container-ttl-duration`,
/// `--maximum-dead-containers-per-container`, `--maximum-dead-containers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcPolicy {
    pub min_age: Duration,
    /// Dead containers kept per (pod, container name); negative: no limit.
    pub max_per_pod_container: i32,
    /// Dead containers kept on the node; negative: no limit.
    pub max_containers: i32,
}

impl Default for GcPolicy {
    fn default() -> Self {
        GcPolicy { min_age: Duration::ZERO, max_per_pod_container: 1, max_containers: -1 }
    }
}

/// What the pod manager knows about pods, for garbage collection. The
/// pod workers implement it.
pub trait ActivePods: Send + Sync {
    /// True once every pod source has delivered its first snapshot. Before
    /// that a pod the manager does not know may simply not have been seen
    /// yet, so nothing is removed for belonging to an unknown pod.
    fn all_sources_ready(&self) -> bool;

    /// The pod is known and its content is kept: it runs, will run, or is
    /// finished but not deleted (its last containers hold its logs). False
    /// for a pod deleted and fully terminated, evicted, or unknown.
    fn is_active(&self, uid: &str) -> bool;

    /// The pod's containers will never run again (phase Succeeded or
    /// Failed, or stopped for deletion). Unknown pods are terminated.
    fn is_terminated(&self, uid: &str) -> bool {
        !self.is_active(uid)
    }
}

/// The pod states the plan needs, resolved once per uid.
pub struct PodStates<'a> {
    pub pods: &'a dyn ActivePods,
    pub sources_ready: bool,
    /// Reclaiming for disk pressure: also remove every dead container of
    /// pods that will not run again.
    pub evict_non_deleted: bool,
}

impl PodStates<'_> {
    /// The kubelet's `ShouldPodContentBeRemoved` (or, when reclaiming,
    /// `ShouldPodRuntimeBeRemoved`), never before the sources are ready.
    fn remove_all(&self, uid: &str) -> bool {
        self.sources_ready && (!self.pods.is_active(uid) || (self.evict_non_deleted && self.pods.is_terminated(uid)))
    }

    pub fn remove_log_dir(&self, uid: &str) -> bool {
        self.sources_ready && !self.pods.is_active(uid)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerRemoval {
    pub id: String,
    pub pod_uid: String,
    pub name: String,
    /// In state unknown: stop it before removal (it may be running).
    pub stop_first: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcPlan {
    /// Oldest first within each group.
    pub containers: Vec<ContainerRemoval>,
    pub sandboxes: Vec<String>,
}

#[derive(Clone, Debug)]
struct Dead {
    id: String,
    created_at: i64,
    unknown: bool,
}

type Unit = (String, String);

fn removal(key: &Unit, d: &Dead) -> ContainerRemoval {
    ContainerRemoval { id: d.id.clone(), pod_uid: key.0.clone(), name: key.1.clone(), stop_first: d.unknown }
}

/// Removes the oldest `n` of a newest-first group.
fn take_oldest(key: &Unit, group: &mut Vec<Dead>, n: usize, out: &mut Vec<ContainerRemoval>) {
    let keep = group.len().saturating_sub(n);
    for d in group.drain(keep..).rev() {
        out.push(removal(key, &d));
    }
}

/// Decides what to remove at `now_ns` (ns since the epoch, as CRI times).
pub fn plan(
    policy: &GcPolicy,
    now_ns: i64,
    containers: &[api::Container],
    sandboxes: &[api::PodSandbox],
    states: &PodStates<'_>,
) -> GcPlan {
    let newest_gc_time = now_ns.saturating_sub(policy.min_age.as_nanos().min(i64::MAX as u128) as i64);
    let mut units: HashMap<Unit, Vec<Dead>> = HashMap::new();
    for c in containers {
        let Some(id) = labels::identity(&c.labels) else { continue };
        if c.state == api::ContainerState::ContainerRunning as i32 || c.created_at > newest_gc_time {
            continue;
        }
        let name = c
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .or_else(|| c.labels.get(labels::CONTAINER_NAME).cloned())
            .unwrap_or_default();
        units.entry((id.uid, name)).or_default().push(Dead {
            id: c.id.clone(),
            created_at: c.created_at,
            unknown: c.state == api::ContainerState::ContainerUnknown as i32,
        });
    }
    for g in units.values_mut() {
        g.sort_by(|a, b| b.created_at.cmp(&a.created_at).then_with(|| b.id.cmp(&a.id)));
    }
    // Deterministic order of groups (pod, then name).
    let mut keys: Vec<Unit> = units.keys().cloned().collect();
    keys.sort();

    let mut out = GcPlan::default();
    for k in &keys {
        if states.remove_all(&k.0) {
            let mut g = units.remove(k).unwrap_or_default();
            let n = g.len();
            take_oldest(k, &mut g, n, &mut out.containers);
        }
    }
    keys.retain(|k| units.contains_key(k));
    if policy.max_per_pod_container >= 0 {
        let keep = policy.max_per_pod_container as usize;
        for k in &keys {
            if let Some(g) = units.get_mut(k) {
                let n = g.len().saturating_sub(keep);
                take_oldest(k, g, n, &mut out.containers);
            }
        }
    }
    let total = |u: &HashMap<Unit, Vec<Dead>>| u.values().map(Vec::len).sum::<usize>();
    if policy.max_containers >= 0 && total(&units) > policy.max_containers as usize {
        let groups = units.values().filter(|g| !g.is_empty()).count().max(1);
        let per_unit = (policy.max_containers as usize / groups).max(1);
        for k in &keys {
            if let Some(g) = units.get_mut(k) {
                let n = g.len().saturating_sub(per_unit);
                take_oldest(k, g, n, &mut out.containers);
            }
        }
        let remaining = total(&units);
        if remaining > policy.max_containers as usize {
            let mut flat: Vec<(Unit, Dead)> =
                units.iter().flat_map(|(k, g)| g.iter().map(move |d| (k.clone(), d.clone()))).collect();
            flat.sort_by(|a, b| a.1.created_at.cmp(&b.1.created_at).then_with(|| a.1.id.cmp(&b.1.id)));
            for (k, d) in flat.into_iter().take(remaining - policy.max_containers as usize) {
                out.containers.push(removal(&k, &d));
            }
        }
    }

    // Sandboxes, against the containers that remain.
    let removed: std::collections::HashSet<&str> = out.containers.iter().map(|r| r.id.as_str()).collect();
    let holding: std::collections::HashSet<&str> =
        containers.iter().filter(|c| !removed.contains(c.id.as_str())).map(|c| c.pod_sandbox_id.as_str()).collect();
    let mut by_pod: HashMap<String, Vec<(i64, String, bool)>> = HashMap::new();
    for s in sandboxes {
        let Some(id) = labels::identity(&s.labels) else { continue };
        let uid = s.metadata.as_ref().map(|m| m.uid.clone()).filter(|u| !u.is_empty()).unwrap_or(id.uid);
        let active = crate::cri::sandbox_ready(s.state) || holding.contains(s.id.as_str());
        by_pod.entry(uid).or_default().push((s.created_at, s.id.clone(), active));
    }
    let mut pods: Vec<_> = by_pod.into_iter().collect();
    pods.sort_by(|a, b| a.0.cmp(&b.0));
    for (uid, mut list) in pods {
        list.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.cmp(&a.1)));
        let keep = if states.remove_all(&uid) { 0 } else { 1 };
        for (_, id, active) in list.into_iter().skip(keep).rev() {
            if !active {
                out.sandboxes.push(id);
            }
        }
    }
    out
}

/// The pod uid of a pod log directory named `<namespace>_<name>_<uid>`;
/// None for any other name (left alone).
pub fn log_dir_uid(name: &str) -> Option<&str> {
    let (rest, uid) = name.rsplit_once('_')?;
    let (ns, pod) = rest.split_once('_')?;
    (!uid.is_empty() && !ns.is_empty() && !pod.is_empty()).then_some(uid)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::cri::labels::{PodIdentity, container_labels, sandbox_labels};

    struct Pods {
        ready: bool,
        active: HashSet<&'static str>,
        terminated: HashSet<&'static str>,
    }

    impl ActivePods for Pods {
        fn all_sources_ready(&self) -> bool {
            self.ready
        }
        fn is_active(&self, uid: &str) -> bool {
            self.active.contains(uid)
        }
        fn is_terminated(&self, uid: &str) -> bool {
            !self.active.contains(uid) || self.terminated.contains(uid)
        }
    }

    const S: i64 = 1_000_000_000;

    fn ident(uid: &str) -> PodIdentity {
        PodIdentity { uid: uid.into(), namespace: "ns".into(), name: format!("pod-{uid}") }
    }

    /// (id, pod uid, name, state, created at seconds)
    fn c(id: &str, uid: &str, name: &str, state: api::ContainerState, at: i64) -> api::Container {
        api::Container {
            id: id.into(),
            pod_sandbox_id: format!("sb-{uid}"),
            metadata: Some(api::ContainerMetadata { name: name.into(), attempt: 0 }),
            state: state as i32,
            created_at: at * S,
            labels: container_labels(&ident(uid), name),
            ..Default::default()
        }
    }

    fn sb(id: &str, uid: &str, ready: bool, at: i64) -> api::PodSandbox {
        api::PodSandbox {
            id: id.into(),
            metadata: Some(api::PodSandboxMetadata { uid: uid.into(), ..Default::default() }),
            state: if ready { api::PodSandboxState::SandboxReady } else { api::PodSandboxState::SandboxNotready }
                as i32,
            created_at: at * S,
            labels: sandbox_labels(&ident(uid), &Default::default()),
            ..Default::default()
        }
    }

    use api::ContainerState::{
        ContainerCreated as Created, ContainerExited as Exited, ContainerRunning as Running,
        ContainerUnknown as Unknown,
    };

    fn ids(p: &GcPlan) -> Vec<&str> {
        p.containers.iter().map(|r| r.id.as_str()).collect()
    }

    fn states(pods: &Pods, evict: bool) -> PodStates<'_> {
        PodStates { pods, sources_ready: pods.ready, evict_non_deleted: evict }
    }

    #[test]
    fn keeps_the_last_dead_container_per_name() {
        let pods = Pods { ready: true, active: ["a"].into(), terminated: HashSet::new() };
        let containers = vec![
            c("a-app-1", "a", "app", Exited, 10),
            c("a-app-2", "a", "app", Exited, 20),
            c("a-app-3", "a", "app", Exited, 30),
            c("a-app-4", "a", "app", Running, 40),
            c("a-init-1", "a", "init", Exited, 5),
            c("a-side-1", "a", "side", Unknown, 1),
            c("a-side-2", "a", "side", Created, 2),
        ];
        let p = plan(&GcPolicy::default(), 100 * S, &containers, &[], &states(&pods, false));
        // Oldest first; the newest dead container of each name stays,
        // running ones are never touched.
        assert_eq!(ids(&p), ["a-app-1", "a-app-2", "a-side-1"]);
        assert!(p.containers[2].stop_first, "unknown state: stopped before removal");
    }

    #[test]
    fn removed_pods_lose_everything_once_sources_are_ready() {
        let containers = vec![
            c("gone-app-1", "gone", "app", Exited, 10),
            c("gone-app-2", "gone", "app", Exited, 20),
            c("done-app-1", "done", "app", Exited, 10),
            c("done-app-2", "done", "app", Exited, 20),
        ];
        let sandboxes = vec![sb("sb-gone", "gone", false, 1), sb("sb-done", "done", false, 1)];
        // Sources not ready: an unknown pod may just be unseen yet.
        let not_ready = Pods { ready: false, active: ["done"].into(), terminated: ["done"].into() };
        let p = plan(&GcPolicy::default(), 100 * S, &containers, &sandboxes, &states(&not_ready, false));
        assert_eq!(ids(&p), ["done-app-1", "gone-app-1"]);
        assert!(p.sandboxes.is_empty());
        // Ready: the unknown pod's containers and sandbox all go; the
        // finished-but-not-deleted pod keeps its last container.
        let ready = Pods { ready: true, ..not_ready };
        let p = plan(&GcPolicy::default(), 100 * S, &containers, &sandboxes, &states(&ready, false));
        assert_eq!(ids(&p), ["gone-app-1", "gone-app-2", "done-app-1"]);
        assert_eq!(p.sandboxes, ["sb-gone"]);
        // Reclaiming for disk pressure: the terminated pod's too.
        let p = plan(&GcPolicy::default(), 100 * S, &containers, &sandboxes, &states(&ready, true));
        assert_eq!(ids(&p), ["done-app-1", "done-app-2", "gone-app-1", "gone-app-2"]);
        assert_eq!(p.sandboxes, ["sb-done", "sb-gone"]);
    }

    #[test]
    fn sandboxes_of_live_pods_keep_the_newest() {
        let pods = Pods { ready: true, active: ["a"].into(), terminated: HashSet::new() };
        let containers = vec![c("a-app-1", "a", "app", Running, 30)];
        let mut with_container = sb("sb-3", "a", false, 3);
        with_container.id = "sb-a".into();
        let sandboxes = vec![
            sb("sb-1", "a", false, 1),
            sb("sb-2", "a", true, 2),
            with_container, // holds a-app-1 (pod_sandbox_id "sb-a")
            sb("sb-4", "a", false, 4),
        ];
        let p = plan(&GcPolicy::default(), 100 * S, &containers, &sandboxes, &states(&pods, false));
        // sb-4 is the newest (kept even though not ready); sb-2 is ready;
        // sb-a holds a container.
        assert_eq!(p.sandboxes, ["sb-1"]);
    }

    #[test]
    fn a_sandbox_whose_containers_are_all_removed_goes_too() {
        let pods = Pods { ready: true, active: HashSet::new(), terminated: HashSet::new() };
        let containers = vec![c("x-app-1", "x", "app", Exited, 10)];
        let mut s = sb("sb-x", "x", false, 1);
        s.id = "sb-x".into();
        let p = plan(&GcPolicy::default(), 100 * S, &containers, &[s], &states(&pods, false));
        assert_eq!(ids(&p), ["x-app-1"]);
        assert_eq!(p.sandboxes, ["sb-x"]);
    }

    #[test]
    fn foreign_objects_are_never_touched() {
        let pods = Pods { ready: true, active: HashSet::new(), terminated: HashSet::new() };
        let mut foreign = c("f-1", "f", "app", Exited, 1);
        foreign.labels.remove(labels::MANAGED_BY);
        let mut foreign_sb = sb("sb-f", "f", false, 1);
        foreign_sb.labels.remove(labels::MANAGED_BY);
        let p = plan(&GcPolicy::default(), 100 * S, &[foreign], &[foreign_sb], &states(&pods, true));
        assert_eq!(p, GcPlan::default());
    }

    #[test]
    fn policy_knobs() {
        let pods = Pods { ready: true, active: ["a", "b"].into(), terminated: HashSet::new() };
        let containers = vec![
            c("a1", "a", "app", Exited, 10),
            c("a2", "a", "app", Exited, 20),
            c("a3", "a", "app", Exited, 30),
            c("b1", "b", "app", Exited, 15),
            c("b2", "b", "app", Exited, 25),
            c("b3", "b", "app", Exited, 95),
        ];
        let s = states(&pods, false);
        // (policy, expected removals)
        let cases: Vec<(GcPolicy, Vec<&str>)> = vec![
            // MinAge 10 s: b3 (created 5 s ago) is too young to count.
            (GcPolicy { min_age: Duration::from_secs(10), ..Default::default() }, vec!["a1", "a2", "b1"]),
            // No per-name limit, at most 2 dead containers on the node:
            // one per group first, then oldest first.
            (
                GcPolicy { max_per_pod_container: -1, max_containers: 2, ..Default::default() },
                vec!["a1", "a2", "b1", "b2"],
            ),
            (
                GcPolicy { max_per_pod_container: -1, max_containers: 1, ..Default::default() },
                vec!["a1", "a2", "b1", "b2", "a3"],
            ),
            (GcPolicy { max_per_pod_container: -1, max_containers: -1, ..Default::default() }, vec![]),
            (GcPolicy { max_per_pod_container: 0, ..Default::default() }, vec!["a1", "a2", "a3", "b1", "b2", "b3"]),
        ];
        for (i, (policy, want)) in cases.into_iter().enumerate() {
            let p = plan(&policy, 100 * S, &containers, &[], &s);
            assert_eq!(ids(&p), want, "case {i}: {policy:?}");
        }
    }

    #[test]
    fn log_dirs() {
        assert_eq!(log_dir_uid("default_web_0b5f-11"), Some("0b5f-11"));
        assert_eq!(log_dir_uid("kube-system_etcd_node_1_abc"), Some("abc"));
        assert_eq!(log_dir_uid("abc"), None);
        assert_eq!(log_dir_uid("ns_abc"), None);
        assert_eq!(log_dir_uid("ns__abc"), None);
    }
}
