//! The container garbage collector: carries out [`super::plan`] against
//! the runtime every minute (the kubelet's ContainerGCPeriod).

use std::{
    collections::HashSet,
    path::PathBuf,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::plan::{ActivePods, GcPlan, GcPolicy, PodStates, log_dir_uid, plan};
use crate::{
    cri::{CriError, RuntimeService},
    logs::ContainerLogManager,
};

/// The kubelet's ContainerGCPeriod.
pub const CONTAINER_GC_PERIOD: Duration = Duration::from_secs(60);
/// Grace for stopping a container in unknown state before removal (the
/// kubelet's minimum grace period).
const UNKNOWN_STOP_GRACE: Duration = Duration::from_secs(2);

/// Removes a container's log files before the container is removed.
#[async_trait]
pub trait ContainerLogCleaner: Send + Sync {
    async fn clean(&self, container_id: &str) -> Result<(), String>;
}

#[async_trait]
impl ContainerLogCleaner for ContainerLogManager {
    async fn clean(&self, container_id: &str) -> Result<(), String> {
        match ContainerLogManager::clean(self, container_id).await {
            Ok(_) => Ok(()),
            Err(crate::logs::LogError::Cri(e)) if e.is_not_found() => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// What one collection did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerGcReport {
    pub containers_removed: Vec<String>,
    pub sandboxes_removed: Vec<String>,
    pub log_dirs_removed: Vec<PathBuf>,
    /// Removals that failed (logged; retried at the next collection).
    pub failures: usize,
}

/// Construct once and run:
///
/// ```text
/// let container_gc = Arc::new(ContainerGc::new(cri.clone(), pod_workers.clone() /* Arc<dyn ActivePods> */,
///     GcPolicy::default(), config.kubelet.pod_logs_dir.clone()).with_log_cleaner(logs.clone()));
/// tokio::spawn(container_gc.clone().run(shutdown.clone()));   // every minute
/// ```
pub struct ContainerGc {
    runtime: Arc<dyn RuntimeService>,
    pods: Arc<dyn ActivePods>,
    policy: GcPolicy,
    pod_logs_dir: PathBuf,
    logs: Option<Arc<dyn ContainerLogCleaner>>,
    busy: tokio::sync::Mutex<()>,
}

fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
}

impl ContainerGc {
    pub fn new(
        runtime: Arc<dyn RuntimeService>,
        pods: Arc<dyn ActivePods>,
        policy: GcPolicy,
        pod_logs_dir: PathBuf,
    ) -> ContainerGc {
        ContainerGc { runtime, pods, policy, pod_logs_dir, logs: None, busy: tokio::sync::Mutex::new(()) }
    }

    /// Removes each container's log files before the container.
    pub fn with_log_cleaner(mut self, logs: Arc<dyn ContainerLogCleaner>) -> ContainerGc {
        self.logs = Some(logs);
        self
    }

    async fn collect(&self, evict_non_deleted: bool) -> Result<ContainerGcReport, CriError> {
        let _busy = self.busy.lock().await;
        // Everything, not only ours: the plan skips what lacks swiftlet's
        // labels, and a pod log directory is kept while any sandbox of
        // that pod exists, whoever made it.
        let containers = self.runtime.list_containers(None).await?;
        let sandboxes = self.runtime.list_pod_sandbox(None).await?;
        let states =
            PodStates { pods: self.pods.as_ref(), sources_ready: self.pods.all_sources_ready(), evict_non_deleted };
        let p = plan(&self.policy, now_ns(), &containers, &sandboxes, &states);
        let mut report = self.execute(p).await;
        let live_uids: HashSet<String> = sandboxes
            .iter()
            .filter(|s| !report.sandboxes_removed.contains(&s.id))
            .filter_map(|s| s.metadata.as_ref().map(|m| m.uid.clone()))
            .collect();
        self.remove_log_dirs(&states, &live_uids, &mut report).await;
        Ok(report)
    }

    async fn execute(&self, p: GcPlan) -> ContainerGcReport {
        let mut report = ContainerGcReport::default();
        for c in p.containers {
            if c.stop_first
                && let Err(e) = self.runtime.stop_container(&c.id, UNKNOWN_STOP_GRACE).await
                && !e.is_not_found()
            {
                warn!(container = c.id, pod_uid = c.pod_uid, "cannot stop a container in unknown state: {e}");
                report.failures += 1;
                continue;
            }
            if let Some(logs) = &self.logs
                && let Err(e) = logs.clean(&c.id).await
            {
                warn!(container = c.id, "cannot remove the container's logs, keeping it: {e}");
                report.failures += 1;
                continue;
            }
            match self.runtime.remove_container(&c.id).await {
                Ok(()) => {
                    debug!(container = c.id, pod_uid = c.pod_uid, name = c.name, "removed dead container");
                    report.containers_removed.push(c.id);
                }
                Err(e) if e.is_not_found() => report.containers_removed.push(c.id),
                Err(e) => {
                    warn!(container = c.id, "cannot remove dead container: {e}");
                    report.failures += 1;
                }
            }
        }
        for id in p.sandboxes {
            // Normally stopped already; stopping again guards against a
            // sandbox left half-stopped.
            if let Err(e) = self.runtime.stop_pod_sandbox(&id).await
                && !e.is_not_found()
            {
                warn!(sandbox = id, "cannot stop sandbox before removal: {e}");
                report.failures += 1;
                continue;
            }
            match self.runtime.remove_pod_sandbox(&id).await {
                Ok(()) => {
                    debug!(sandbox = id, "removed sandbox");
                    report.sandboxes_removed.push(id);
                }
                Err(e) if e.is_not_found() => report.sandboxes_removed.push(id),
                Err(e) => {
                    warn!(sandbox = id, "cannot remove sandbox: {e}");
                    report.failures += 1;
                }
            }
        }
        report
    }

    async fn remove_log_dirs(
        &self,
        states: &PodStates<'_>,
        live_uids: &HashSet<String>,
        report: &mut ContainerGcReport,
    ) {
        if !states.sources_ready {
            return;
        }
        let entries = match std::fs::read_dir(&self.pod_logs_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                warn!(dir = %self.pod_logs_dir.display(), "cannot read the pod logs directory: {e}");
                return;
            }
        };
        let mut doomed = vec![];
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if log_dir_uid(&name).is_some_and(|uid| states.remove_log_dir(uid) && !live_uids.contains(uid))
                && e.path().is_dir()
            {
                doomed.push(e.path());
            }
        }
        for d in doomed {
            let d2 = d.clone();
            match tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&d2)).await {
                Ok(Ok(())) => {
                    debug!(dir = %d.display(), "removed pod logs");
                    report.log_dirs_removed.push(d);
                }
                Ok(Err(e)) => {
                    warn!(dir = %d.display(), "cannot remove pod logs: {e}");
                    report.failures += 1;
                }
                Err(e) => warn!("pod log removal task: {e}"),
            }
        }
    }

    /// One periodic collection.
    pub async fn garbage_collect(&self) -> Result<ContainerGcReport, CriError> {
        self.collect(false).await
    }

    /// Also removes every dead container and sandbox of pods that will not
    /// run again (the kubelet's `DeleteAllUnusedContainers`, for disk
    /// pressure).
    pub async fn delete_all_unused_containers(&self) -> Result<ContainerGcReport, CriError> {
        self.collect(true).await
    }

    /// Collects every [`CONTAINER_GC_PERIOD`] until `shutdown` is cancelled.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        self.run_every(CONTAINER_GC_PERIOD, shutdown).await
    }

    /// [`ContainerGc::run`] with another period (tests).
    pub async fn run_every(self: Arc<Self>, period: Duration, shutdown: CancellationToken) {
        let mut ticks = crate::flowcontrol::Periodic::new(period, shutdown);
        while ticks.next().await {
            match self.garbage_collect().await {
                Ok(r) if !r.containers_removed.is_empty() || !r.sandboxes_removed.is_empty() => info!(
                    containers = r.containers_removed.len(),
                    sandboxes = r.sandboxes_removed.len(),
                    log_dirs = r.log_dirs_removed.len(),
                    "container garbage collection"
                ),
                Ok(_) => {}
                Err(e) => warn!("container garbage collection failed: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::{
        cri::{
            api,
            fake::{FakeRuntime, Fault, Method},
            labels::{PodIdentity, container_labels, sandbox_labels},
        },
        logs::LogPolicy,
    };

    struct Pods {
        active: Mutex<HashSet<String>>,
    }

    impl ActivePods for Pods {
        fn all_sources_ready(&self) -> bool {
            true
        }
        fn is_active(&self, uid: &str) -> bool {
            self.active.lock().unwrap().contains(uid)
        }
    }

    struct Setup {
        rt: Arc<FakeRuntime>,
        pods: Arc<Pods>,
        logs_dir: tempfile::TempDir,
    }

    impl Setup {
        fn new() -> Setup {
            let rt = Arc::new(FakeRuntime::new());
            rt.add_image("busybox", 1);
            Setup {
                rt,
                pods: Arc::new(Pods { active: Mutex::new(HashSet::new()) }),
                logs_dir: tempfile::tempdir().unwrap(),
            }
        }

        /// A pod with a sandbox, its log dir, and `n` exited containers
        /// named `name` (each with a log file), plus one running if
        /// `running`. Returns (sandbox id, container ids oldest first).
        async fn pod(&self, uid: &str, name: &str, n: usize, running: bool) -> (String, Vec<String>) {
            let id = PodIdentity { uid: uid.into(), namespace: "ns".into(), name: format!("p{uid}") };
            let dir = self.logs_dir.path().join(format!("ns_p{uid}_{uid}"));
            std::fs::create_dir_all(dir.join(name)).unwrap();
            let sb_cfg = api::PodSandboxConfig {
                metadata: Some(api::PodSandboxMetadata { uid: uid.into(), ..Default::default() }),
                labels: sandbox_labels(&id, &Default::default()),
                log_directory: dir.display().to_string(),
                ..Default::default()
            };
            let sb = self.rt.run_pod_sandbox(sb_cfg.clone(), "").await.unwrap();
            let mut ids = vec![];
            for attempt in 0..n + running as usize {
                let cfg = api::ContainerConfig {
                    metadata: Some(api::ContainerMetadata { name: name.into(), attempt: attempt as u32 }),
                    image: Some(api::ImageSpec { image: "busybox".into(), ..Default::default() }),
                    labels: container_labels(&id, name),
                    log_path: format!("{name}/{attempt}.log"),
                    ..Default::default()
                };
                let c = self.rt.create_container(&sb, cfg, sb_cfg.clone()).await.unwrap();
                self.rt.set_created_at(&c, 1_000_000_000 * (attempt as i64 + 1));
                self.rt.start_container(&c).await.unwrap();
                if attempt < n {
                    self.rt.exit_container(&c, 1, "");
                }
                ids.push(c);
            }
            (sb, ids)
        }

        fn gc(&self, with_logs: bool) -> ContainerGc {
            let gc = ContainerGc::new(
                self.rt.clone(),
                self.pods.clone(),
                GcPolicy::default(),
                self.logs_dir.path().to_owned(),
            );
            if with_logs {
                let logs = ContainerLogManager::new(self.rt.clone(), LogPolicy::default()).unwrap();
                gc.with_log_cleaner(Arc::new(logs))
            } else {
                gc
            }
        }
    }

    #[tokio::test]
    async fn live_pods_keep_their_last_dead_container_and_logs() {
        let s = Setup::new();
        s.pods.active.lock().unwrap().insert("a".into());
        let (_sb, ids) = s.pod("a", "app", 3, true).await;
        let gc = s.gc(true);
        let r = gc.garbage_collect().await.unwrap();
        assert_eq!(r.containers_removed, ids[..2].to_vec());
        assert!(r.sandboxes_removed.is_empty());
        assert!(r.log_dirs_removed.is_empty());
        let left = s.rt.container_ids();
        assert_eq!(left, ids[2..].to_vec(), "the last dead container and the running one");
        let app = s.logs_dir.path().join("ns_pa_a/app");
        let mut logs: Vec<_> = std::fs::read_dir(app).unwrap().map(|e| e.unwrap().file_name()).collect();
        logs.sort();
        assert_eq!(logs, ["2.log", "3.log"], "removed containers' logs went with them");
    }

    #[tokio::test]
    async fn removed_pods_lose_containers_sandboxes_and_log_dirs() {
        let s = Setup::new();
        s.pods.active.lock().unwrap().insert("a".into());
        let (sb_b, _) = s.pod("b", "app", 2, false).await;
        s.pod("a", "app", 1, false).await;
        s.rt.stop_pod_sandbox(&sb_b).await.unwrap();
        // A directory that is not a pod's is left alone.
        std::fs::create_dir_all(s.logs_dir.path().join("not-a-pod")).unwrap();
        let r = s.gc(true).garbage_collect().await.unwrap();
        assert_eq!(r.containers_removed.len(), 2);
        assert_eq!(r.sandboxes_removed, vec![sb_b]);
        assert_eq!(r.log_dirs_removed, vec![s.logs_dir.path().join("ns_pb_b")]);
        let mut dirs: Vec<_> = std::fs::read_dir(s.logs_dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        dirs.sort();
        assert_eq!(dirs, ["not-a-pod", "ns_pa_a"]);
    }

    #[tokio::test]
    async fn a_ready_sandbox_of_a_removed_pod_waits_for_its_stop() {
        let s = Setup::new();
        let (sb, _) = s.pod("b", "app", 1, false).await;
        let r = s.gc(false).garbage_collect().await.unwrap();
        assert_eq!(r.containers_removed.len(), 1);
        assert!(r.sandboxes_removed.is_empty(), "ready sandboxes are the pod workers' to stop");
        assert!(r.log_dirs_removed.is_empty(), "a pod's logs stay while it has a sandbox");
        assert_eq!(s.rt.sandbox_ids(), vec![sb]);
    }

    #[tokio::test]
    async fn disk_pressure_removes_terminated_pods_last_containers() {
        struct Done;
        impl ActivePods for Done {
            fn all_sources_ready(&self) -> bool {
                true
            }
            fn is_active(&self, _uid: &str) -> bool {
                true
            }
            fn is_terminated(&self, uid: &str) -> bool {
                uid == "done"
            }
        }
        let s = Setup::new();
        s.pod("done", "app", 2, false).await;
        s.pod("live", "app", 2, false).await;
        let gc = ContainerGc::new(s.rt.clone(), Arc::new(Done), GcPolicy::default(), s.logs_dir.path().to_owned());
        let r = gc.garbage_collect().await.unwrap();
        assert_eq!(r.containers_removed.len(), 2, "one per pod");
        let r = gc.delete_all_unused_containers().await.unwrap();
        assert_eq!(r.containers_removed.len(), 1, "the terminated pod's last one");
        assert_eq!(s.rt.container_ids().len(), 1);
        assert!(r.log_dirs_removed.is_empty(), "the pods still exist");
    }

    #[tokio::test]
    async fn failures_are_counted_and_retried() {
        let s = Setup::new();
        s.pod("b", "app", 2, false).await;
        s.rt.fail(Fault::new(Method::RemoveContainer, tonic::Code::Unknown, "busy").once());
        let gc = s.gc(false);
        let r = gc.garbage_collect().await.unwrap();
        assert_eq!((r.containers_removed.len(), r.failures), (1, 1));
        let r = gc.garbage_collect().await.unwrap();
        assert_eq!((r.containers_removed.len(), r.failures), (1, 0));
        assert!(s.rt.container_ids().is_empty());
    }
}
