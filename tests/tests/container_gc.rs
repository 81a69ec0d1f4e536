//! Container garbage collection on the real containerd: dead containers
//! beyond the most recent per (pod, name) are removed with their log
//! files, running ones and other tools' containers are left alone, and a
//! removed pod loses its containers, sandbox and log directory. Needs
//! root.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use swiftlet::{
    cri::RuntimeService,
    gc::{ActivePods, ContainerGc, GcPolicy},
    logs::{ContainerLogManager, LogPolicy},
};
use swiftlet_tests::{
    cgroup::TestCgroup,
    sandbox::{PodOptions, TestPod, client},
};

#[derive(Default)]
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

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[tokio::test]
async fn keeps_the_last_dead_container_per_name_and_removes_the_rest() {
    let cri = client().await;
    let tc = TestCgroup::new();
    let logs_root = tempfile::tempdir().unwrap();
    let pod = TestPod::start(
        cri.clone(),
        PodOptions { name: "gc", logs_root: logs_root.path(), cgroup: &tc, foreign: false },
    )
    .await;
    // Something else's sandbox and dead container, in the same runtime
    // namespace: never touched.
    let foreign = TestPod::start(
        cri.clone(),
        PodOptions { name: "foreign", logs_root: logs_root.path(), cgroup: &tc, foreign: true },
    )
    .await;
    let foreign_dead = foreign.container("app", 0, "exit 1", true).await;
    foreign.wait_exited(&foreign_dead, Duration::from_secs(20)).await;

    // Three runs of "app" (a crash loop), one of "once", and a running
    // "sleeper".
    let mut apps = vec![];
    for attempt in 0..3 {
        let id = pod.container("app", attempt, "echo run; exit 3", true).await;
        let st = pod.wait_exited(&id, Duration::from_secs(20)).await;
        assert_eq!(st.exit_code, 3);
        apps.push(id);
    }
    let once = pod.container("once", 0, "exit 0", true).await;
    pod.wait_exited(&once, Duration::from_secs(20)).await;
    let sleeper = pod.container("sleeper", 0, "sleep 3600", true).await;
    for a in 0..3 {
        assert!(pod.log_dir.join(format!("app/{a}.log")).exists());
    }

    let pods = Arc::new(Pods::default());
    pods.active.lock().unwrap().insert(pod.identity.uid.clone());
    let logs = Arc::new(ContainerLogManager::new(cri.clone(), LogPolicy::default()).unwrap());
    let gc = ContainerGc::new(cri.clone(), pods.clone(), GcPolicy::default(), logs_root.path().to_owned())
        .with_log_cleaner(logs);

    let r = gc.garbage_collect().await.unwrap();
    assert_eq!(sorted(r.containers_removed.clone()), sorted(apps[..2].to_vec()), "{r:?}");
    assert!(r.sandboxes_removed.is_empty() && r.log_dirs_removed.is_empty() && r.failures == 0, "{r:?}");
    let left: HashSet<String> = cri.list_containers(None).await.unwrap().into_iter().map(|c| c.id).collect();
    for id in [&apps[2], &once, &sleeper, &foreign_dead] {
        assert!(left.contains(id), "{id} must remain");
    }
    for id in &apps[..2] {
        assert!(!left.contains(id), "{id} must be gone");
    }
    assert!(!pod.log_dir.join("app/0.log").exists() && !pod.log_dir.join("app/1.log").exists());
    assert!(pod.log_dir.join("app/2.log").exists(), "the last dead container keeps its log");
    // Nothing more to do on a second pass.
    let r = gc.garbage_collect().await.unwrap();
    assert!(r.containers_removed.is_empty() && r.sandboxes_removed.is_empty(), "{r:?}");

    // The pod is deleted: its worker stops the sandbox, the pod manager
    // forgets it, and GC removes the rest.
    cri.stop_pod_sandbox(&pod.id).await.unwrap();
    pods.active.lock().unwrap().clear();
    let r = gc.garbage_collect().await.unwrap();
    assert_eq!(sorted(r.containers_removed.clone()), sorted(vec![apps[2].clone(), once.clone(), sleeper.clone()]));
    assert_eq!(r.sandboxes_removed, vec![pod.id.clone()]);
    assert_eq!(r.log_dirs_removed, vec![pod.log_dir.clone()]);
    assert!(cri.pod_sandbox_status(&pod.id).await.unwrap_err().is_not_found());
    assert!(!pod.log_dir.exists());
    // The foreign sandbox, its container and its logs are still there.
    assert!(cri.container_status(&foreign_dead).await.is_ok());
    assert!(cri.pod_sandbox_status(&foreign.id).await.is_ok());
    assert!(foreign.log_dir.exists());
    drop(foreign);
    drop(pod);
    drop(tc);
}
