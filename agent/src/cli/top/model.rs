//! What `swiftlet top` shows, apart from how it is drawn: the snapshot's
//! cgroups grouped into pods with their containers, named from the
//! runtime, filtered and sorted; the node's line; byte counts for people.

use std::collections::HashMap;

use crate::{
    cli::attach::{Found, Names},
    config::Config,
    eviction::signal::EvictionSignal,
    signals::{CgroupKind, Snapshot, node},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    Memory,
    Headroom,
    Processes,
    Inodes,
    Name,
}

impl SortKey {
    const ALL: [SortKey; 5] = [SortKey::Memory, SortKey::Headroom, SortKey::Processes, SortKey::Inodes, SortKey::Name];

    pub fn parse(s: &str) -> Option<SortKey> {
        SortKey::ALL.into_iter().find(|k| k.name() == s)
    }

    pub fn name(self) -> &'static str {
        match self {
            SortKey::Memory => "memory",
            SortKey::Headroom => "headroom",
            SortKey::Processes => "processes",
            SortKey::Inodes => "inodes",
            SortKey::Name => "name",
        }
    }

    pub(super) fn next(self) -> SortKey {
        let i = SortKey::ALL.iter().position(|k| *k == self).unwrap_or(0);
        SortKey::ALL[(i + 1) % SortKey::ALL.len()]
    }
}

/// One line of the table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row {
    pub namespace: String,
    pub pod: String,
    /// Empty for the pod's own line.
    pub container: String,
    pub working_set: u64,
    pub limit: Option<u64>,
    pub processes: u64,
    pub inodes: Option<i64>,
}

impl Row {
    pub fn headroom(&self) -> Option<u64> {
        self.limit.map(|l| l.saturating_sub(self.working_set))
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodGroup {
    pub pod: Row,
    pub containers: Vec<Row>,
}

/// The node's line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeLine {
    pub name: String,
    pub working_set: u64,
    pub capacity: u64,
    /// memory.available's hard threshold in bytes.
    pub memory_threshold: Option<u64>,
    pub tasks: u64,
    pub pid_limit: u64,
    pub pid_threshold: Option<u64>,
}

/// Groups the snapshot's cgroups into pods with their containers.
pub fn groups(snapshot: &Snapshot, found: &[Found], names: &Names, limits: &HashMap<String, u64>) -> Vec<PodGroup> {
    let row = |f: &Found| -> Option<Row> {
        let u = snapshot.cgroups.get(&f.path)?;
        let uid = f.pod_uid.clone().unwrap_or_default();
        let (namespace, pod) = match names.pods.get(&uid) {
            Some(p) => (p.namespace.clone(), p.name.clone()),
            None => ("?".to_owned(), format!("pod{uid}")),
        };
        let container = match &f.container_id {
            Some(id) => names.containers.get(id).cloned().unwrap_or_else(|| id.chars().take(12).collect()),
            None => String::new(),
        };
        Some(Row {
            namespace,
            pod,
            container,
            working_set: u.working_set_bytes,
            limit: limits.get(&f.path).copied(),
            processes: u.processes,
            inodes: u.inodes,
        })
    };
    let mut by_pod: HashMap<String, PodGroup> = HashMap::new();
    for f in found.iter().filter(|f| f.kind == CgroupKind::Pod) {
        if let Some(r) = row(f) {
            by_pod.insert(f.path.clone(), PodGroup { pod: r, containers: vec![] });
        }
    }
    for f in found.iter().filter(|f| f.kind == CgroupKind::Container) {
        let parent = f.path.rsplit_once('/').map(|(p, _)| p).unwrap_or_default();
        // The sandbox's pause container has no name in the runtime's
        // container list: it is not shown.
        let named =
            f.container_id.as_ref().is_some_and(|id| names.containers.contains_key(id)) || names.containers.is_empty();
        if let (Some(g), Some(r), true) = (by_pod.get_mut(parent), row(f), named) {
            g.containers.push(r);
        }
    }
    by_pod.into_values().collect()
}

fn cmp_rows(a: &Row, b: &Row, key: SortKey) -> std::cmp::Ordering {
    let name = |r: &Row| (r.namespace.clone(), r.pod.clone(), r.container.clone());
    match key {
        SortKey::Memory => b.working_set.cmp(&a.working_set),
        // Closest to its limit first; no limit last.
        SortKey::Headroom => match (a.headroom(), b.headroom()) {
            (Some(x), Some(y)) => x.cmp(&y),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        },
        SortKey::Processes => b.processes.cmp(&a.processes),
        SortKey::Inodes => b.inodes.unwrap_or(0).cmp(&a.inodes.unwrap_or(0)),
        SortKey::Name => std::cmp::Ordering::Equal,
    }
    .then_with(|| name(a).cmp(&name(b)))
}

/// Filters (case-insensitive substring of namespace, pod or container;
/// a pod matches if it or any container does) and sorts.
pub fn arrange(mut gs: Vec<PodGroup>, key: SortKey, filter: &str) -> Vec<PodGroup> {
    let f = filter.to_lowercase();
    let hit = |r: &Row| {
        f.is_empty()
            || r.namespace.to_lowercase().contains(&f)
            || r.pod.to_lowercase().contains(&f)
            || r.container.to_lowercase().contains(&f)
    };
    gs.retain(|g| hit(&g.pod) || g.containers.iter().any(hit));
    for g in &mut gs {
        g.containers.sort_by(|a, b| cmp_rows(a, b, key));
    }
    gs.sort_by(|a, b| cmp_rows(&a.pod, &b.pod, key));
    gs
}

/// Bytes with a binary unit and one decimal (12.3Mi).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes < 1024 {
        return bytes.to_string();
    }
    let mut v = bytes as f64 / 1024.0;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1}{}", UNITS[i])
}

pub(super) fn node_line(config: &Config, name: String, s: &Snapshot) -> NodeLine {
    let capacity = node::mem_total().unwrap_or(0);
    let pid_limit = node::pid_limit().unwrap_or(0);
    let hard = config.kubelet.eviction_thresholds();
    let find = |sig: EvictionSignal, cap: u64| {
        hard.iter().find(|t| t.signal == sig && t.is_hard()).map(|t| t.value.resolve(cap))
    };
    NodeLine {
        name,
        working_set: s.node.working_set_bytes,
        capacity,
        memory_threshold: find(EvictionSignal::MemoryAvailable, capacity),
        tasks: s.node.tasks,
        pid_limit,
        pid_threshold: find(EvictionSignal::PidAvailable, pid_limit),
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap as Map, time::Instant};

    use super::*;
    use crate::{cri::labels::PodIdentity, signals::CgroupUsage};

    fn snapshot(cgs: &[(&str, u64, u64)]) -> Snapshot {
        Snapshot {
            node: Default::default(),
            cgroups: cgs
                .iter()
                .map(|(p, ws, procs)| {
                    (
                        (*p).to_owned(),
                        CgroupUsage {
                            working_set_bytes: *ws,
                            processes: *procs,
                            inodes: Some(5),
                            ..Default::default()
                        },
                    )
                })
                .collect(),
            taken_at: Instant::now(),
        }
    }

    fn found(path: &str, kind: CgroupKind, uid: &str, cid: Option<&str>) -> Found {
        Found { path: path.into(), kind, pod_uid: Some(uid.into()), container_id: cid.map(Into::into) }
    }

    #[test]
    fn pods_grouped_named_sorted_and_filtered() {
        let snap = snapshot(&[
            ("kp/poda", 300 << 20, 3),
            ("kp/poda/c1", 200 << 20, 2),
            ("kp/poda/pause", 1 << 20, 1),
            ("kp/podb", 500 << 20, 1),
            ("kp/podb/c2", 499 << 20, 1),
        ]);
        let f = vec![
            found("kp/poda", CgroupKind::Pod, "a", None),
            found("kp/poda/c1", CgroupKind::Container, "a", Some("c1")),
            found("kp/poda/pause", CgroupKind::Container, "a", Some("pause")),
            found("kp/podb", CgroupKind::Pod, "b", None),
            found("kp/podb/c2", CgroupKind::Container, "b", Some("c2")),
        ];
        let mut names = Names::default();
        names.pods.insert("a".into(), PodIdentity { uid: "a".into(), namespace: "prod".into(), name: "web".into() });
        names.pods.insert("b".into(), PodIdentity { uid: "b".into(), namespace: "prod".into(), name: "db".into() });
        names.containers.insert("c1".into(), "nginx".into());
        names.containers.insert("c2".into(), "postgres".into());
        let limits: Map<String, u64> = [("kp/poda".to_owned(), 1 << 30), ("kp/podb".to_owned(), 512 << 20)].into();
        let gs = groups(&snap, &f, &names, &limits);
        let by_mem = arrange(gs.clone(), SortKey::Memory, "");
        assert_eq!(by_mem.iter().map(|g| g.pod.pod.as_str()).collect::<Vec<_>>(), ["db", "web"]);
        assert_eq!(by_mem[1].containers.len(), 1, "the pause container is not shown");
        assert_eq!(by_mem[1].containers[0].container, "nginx");
        let by_headroom = arrange(gs.clone(), SortKey::Headroom, "");
        assert_eq!(by_headroom[0].pod.pod, "db", "12Mi of headroom comes first");
        assert_eq!(by_headroom[0].pod.headroom(), Some(12 << 20));
        assert_eq!(
            arrange(gs.clone(), SortKey::Name, "").iter().map(|g| g.pod.pod.as_str()).collect::<Vec<_>>(),
            ["db", "web"]
        );
        let filtered = arrange(gs.clone(), SortKey::Memory, "NGINX");
        assert_eq!(filtered.len(), 1);
        assert_eq!(filtered[0].pod.pod, "web");
        assert_eq!(arrange(gs, SortKey::Memory, "nothing").len(), 0);
    }

    #[test]
    fn human_bytes() {
        assert_eq!(human(512), "512");
        assert_eq!(human(1536), "1.5Ki");
        assert_eq!(human(3 << 30), "3.0Gi");
        assert_eq!(human(u64::MAX), "16.0Ei");
    }
}
