//! Attaching without the agent: the subcommands' own signal source, with
//! the pods' and containers' cgroups found under kubepods registered, and
//! their names from the container runtime.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use parking_lot::RwLock;

use super::CliError;
use crate::{
    cgroups::CgroupFs,
    cm::naming::CgroupNaming,
    config::Config,
    cri::{CriClient, RuntimeService, labels},
    pods::source::PodView,
    server::events::pod_uid_of_cgroup,
    signals::{self, CgroupKind, OpenedSource, ebpf::EbpfOptions},
};

/// A cgroup found under kubepods.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Found {
    pub path: String,
    pub kind: CgroupKind,
    /// The pod's uid (pods and containers).
    pub pod_uid: Option<String>,
    /// The container's id (its cgroup's last component, without a
    /// systemd scope's prefix and suffix).
    pub container_id: Option<String>,
}

fn is_pod_dir(name: &str) -> bool {
    name.starts_with("pod") || (name.ends_with(".slice") && name.contains("-pod"))
}

fn container_id(name: &str) -> String {
    let n = name.strip_suffix(".scope").unwrap_or(name);
    n.rsplit_once('-').filter(|_| name.ends_with(".scope")).map(|(_, id)| id).unwrap_or(n).to_owned()
}

/// The pods' and containers' cgroups under kubepods (and kubepods itself).
pub fn discover(fs: &CgroupFs, naming: &CgroupNaming) -> Vec<Found> {
    let kubepods = naming.kubepods();
    if !fs.exists(&kubepods) {
        return vec![];
    }
    let mut out = vec![Found { path: kubepods.clone(), kind: CgroupKind::Kubepods, pod_uid: None, container_id: None }];
    let mut pod_dirs = vec![];
    for child in fs.children(&kubepods).unwrap_or_default() {
        let name = child.rsplit('/').next().unwrap_or_default();
        if is_pod_dir(name) {
            pod_dirs.push(child);
        } else {
            // A QoS cgroup.
            pod_dirs.extend(
                fs.children(&child)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|c| is_pod_dir(c.rsplit('/').next().unwrap_or_default())),
            );
        }
    }
    for pod in pod_dirs {
        let uid = pod_uid_of_cgroup(&pod);
        for c in fs.children(&pod).unwrap_or_default() {
            let name = c.rsplit('/').next().unwrap_or_default().to_owned();
            out.push(Found {
                path: c,
                kind: CgroupKind::Container,
                pod_uid: uid.clone(),
                container_id: Some(container_id(&name)),
            });
        }
        out.push(Found { path: pod, kind: CgroupKind::Pod, pod_uid: uid, container_id: None });
    }
    out
}

/// Names from the runtime: pods by uid, containers by id.
#[derive(Clone, Debug, Default)]
pub struct Names {
    pub pods: HashMap<String, labels::PodIdentity>,
    pub containers: HashMap<String, String>,
}

impl Names {
    pub async fn read(rt: &dyn RuntimeService) -> Names {
        let mut n = Names::default();
        if let Ok(sandboxes) = rt.list_pod_sandbox(None).await {
            for s in sandboxes {
                if let Some(md) = s.metadata {
                    n.pods.insert(
                        md.uid.clone(),
                        labels::PodIdentity { uid: md.uid, namespace: md.namespace, name: md.name },
                    );
                }
            }
        }
        if let Ok(containers) = rt.list_containers(None).await {
            for c in containers {
                if let Some(md) = c.metadata {
                    n.containers.insert(c.id, md.name);
                }
            }
        }
        n
    }
}

/// The pods the runtime knows, as a PodView (names for events).
#[derive(Default)]
pub struct RuntimePods(pub RwLock<Names>);

impl PodView for RuntimePods {
    fn pods(&self) -> Vec<Pod> {
        let names = self.0.read();
        names
            .pods
            .values()
            .map(|p| Pod {
                metadata: ObjectMeta {
                    uid: Some(p.uid.clone()),
                    namespace: Some(p.namespace.clone()),
                    name: Some(p.name.clone()),
                    ..Default::default()
                },
                ..Default::default()
            })
            .collect()
    }
}

/// The subcommand's own signal source and what it registered.
pub struct Attached {
    pub opened: OpenedSource,
    pub fs: CgroupFs,
    pub naming: CgroupNaming,
    pub registered: HashSet<String>,
    pub cri: Option<Arc<CriClient>>,
}

impl Attached {
    pub fn open(config: &Config) -> Result<Attached, CliError> {
        let fs = CgroupFs::detect()?;
        let opened = signals::open(
            config.swiftlet.signal_source,
            fs.clone(),
            &EbpfOptions::default(),
            std::time::Duration::from_secs(1),
        )?;
        let k = &config.kubelet;
        let cri = CriClient::with_image_endpoint(
            &k.container_runtime_endpoint,
            k.image_endpoint(),
            k.runtime_request_timeout,
        )
        .ok()
        .map(Arc::new);
        Ok(Attached { opened, fs, naming: k.cgroup_naming(), registered: HashSet::new(), cri })
    }

    /// Registers what appeared under kubepods and drops what went.
    pub fn rescan(&mut self) -> Vec<Found> {
        let found = discover(&self.fs, &self.naming);
        let want: HashSet<String> = found.iter().map(|f| f.path.clone()).collect();
        for f in &found {
            if !self.registered.contains(&f.path) && self.opened.source.register(&f.path, f.kind).is_ok() {
                self.registered.insert(f.path.clone());
            }
        }
        for gone in self.registered.difference(&want).cloned().collect::<Vec<_>>() {
            self.opened.source.unregister(&gone);
            self.registered.remove(&gone);
        }
        found
    }

    pub async fn names(&self) -> Names {
        match &self.cri {
            Some(c) => Names::read(c.as_ref()).await,
            None => Names::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_from_cgroup_names() {
        assert_eq!(container_id("0123abcd"), "0123abcd");
        assert_eq!(container_id("cri-containerd-0123abcd.scope"), "0123abcd");
        assert!(is_pod_dir("pod1234"));
        assert!(is_pod_dir("kubepods-besteffort-pod12_34.slice"));
        assert!(!is_pod_dir("burstable"));
        assert!(!is_pod_dir("kubepods-burstable.slice"));
    }

    #[test]
    fn discovery_on_a_recorded_tree() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for d in [
            "memory/kubepods/burstable/podaaa/c1",
            "memory/kubepods/burstable/podaaa/c2",
            "memory/kubepods/besteffort/podbbb",
            "memory/kubepods/podccc/c3",
        ] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let fs = CgroupFs::with_layout(root, crate::cgroups::Version::V1);
        let naming = CgroupNaming::new(crate::cm::naming::CgroupDriver::Cgroupfs, "/");
        let mut found = discover(&fs, &naming);
        found.sort_by(|a, b| a.path.cmp(&b.path));
        let summary: Vec<(String, CgroupKind, Option<String>, Option<String>)> =
            found.into_iter().map(|f| (f.path, f.kind, f.pod_uid, f.container_id)).collect();
        let s = |x: &str| Some(x.to_owned());
        assert_eq!(
            summary,
            vec![
                ("kubepods".into(), CgroupKind::Kubepods, None, None),
                ("kubepods/besteffort/podbbb".into(), CgroupKind::Pod, s("bbb"), None),
                ("kubepods/burstable/podaaa".into(), CgroupKind::Pod, s("aaa"), None),
                ("kubepods/burstable/podaaa/c1".into(), CgroupKind::Container, s("aaa"), s("c1")),
                ("kubepods/burstable/podaaa/c2".into(), CgroupKind::Container, s("aaa"), s("c2")),
                ("kubepods/podccc".into(), CgroupKind::Pod, s("ccc"), None),
                ("kubepods/podccc/c3".into(), CgroupKind::Container, s("ccc"), s("c3")),
            ]
        );
    }
}
