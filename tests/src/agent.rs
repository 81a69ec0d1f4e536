//! The whole agent in the test process, on the real containerd the test
//! run started (`SWIFTLET_TEST_CRI_ENDPOINT`), configured through the same
//! flags and KubeletConfiguration file a user writes, with its own static
//! pod directory, root dir, log dir and cgroup root. Events are recorded
//! for assertions. Dropping it removes every pod it ran (through the agent,
//! then directly through CRI for anything left), stops it, and removes its
//! cgroups and directories.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use swiftlet::{
    app::Agent,
    cgroups::CgroupFs,
    config,
    cri::{CriClient, RuntimeService, api, labels},
    events::{AnnotatedEventRecorder, EventRecord, EventRecorder, EventType},
    pods::source::PodView,
    reload::ConfigDiff,
    volumes::{NoApiServer, ObjectSource},
};
use tokio_util::sync::CancellationToken;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The test containerd's endpoint, or a failure that says what is missing.
pub fn cri_endpoint() -> String {
    std::env::var("SWIFTLET_TEST_CRI_ENDPOINT").unwrap_or_else(|_| {
        panic!("SWIFTLET_TEST_CRI_ENDPOINT is not set: this test needs the containerd that `cargo xtask test` starts")
    })
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedEvent {
    pub object: String,
    pub field_path: Option<String>,
    pub event_type: EventType,
    pub reason: String,
    pub message: String,
    pub annotations: std::collections::BTreeMap<String, String>,
}

#[derive(Default)]
pub struct Events(Mutex<Vec<RecordedEvent>>);

impl AnnotatedEventRecorder for Events {
    fn record_event(&self, e: &EventRecord<'_>) {
        self.0.lock().unwrap().push(RecordedEvent {
            object: e.object.name.clone().unwrap_or_default(),
            field_path: e.object.field_path.clone(),
            event_type: e.event_type,
            reason: e.reason.into(),
            message: e.message.into(),
            annotations: e.annotations.clone(),
        });
    }
}

impl Events {
    pub fn all(&self) -> Vec<RecordedEvent> {
        self.0.lock().unwrap().clone()
    }

    pub fn with_reason(&self, reason: &str) -> Vec<RecordedEvent> {
        self.all().into_iter().filter(|e| e.reason == reason).collect()
    }
}

pub struct TestAgent {
    pub agent: Arc<Agent>,
    pub events: Arc<Events>,
    pub dir: tempfile::TempDir,
    pub manifests: PathBuf,
    pub cgroup_root: String,
    pub node: String,
    pub cri: CriClient,
    pub rt: tokio::runtime::Runtime,
    /// The command line the agent was started with (for reloads).
    pub args: Vec<String>,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
    /// Dropped last: removes the cgroup tree even when start() fails half-way.
    _cgroups: CgroupRoot,
}

/// The agent's cgroup root, killed and removed on drop.
struct CgroupRoot {
    fs: CgroupFs,
    root: String,
}

impl Drop for CgroupRoot {
    fn drop(&mut self) {
        let _ = self.fs.kill_all(&self.root);
        if let Err(e) = self.fs.remove(&self.root, Duration::from_secs(10)) {
            eprintln!("warning: cannot remove test cgroup {}: {e}", self.root);
        }
    }
}

/// An agent's own directories, flags and cgroup root: the same for an
/// agent in the test process and one run as the real binary.
pub struct AgentSetup {
    pub dir: tempfile::TempDir,
    pub manifests: PathBuf,
    pub node: String,
    pub cgroup_root: String,
    pub endpoint: String,
    pub args: Vec<String>,
}

impl AgentSetup {
    /// `kubelet_config` is the body of a KubeletConfiguration (without
    /// apiVersion/kind).
    pub fn new(kubelet_config: &str, extra_flags: &[&str]) -> AgentSetup {
        crate::prereq::require_root();
        let endpoint = cri_endpoint();
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let dir = tempfile::Builder::new().prefix("swiftlet-agent-").tempdir().expect("temp dir");
        let manifests = dir.path().join("manifests");
        std::fs::create_dir_all(&manifests).unwrap();
        let node = format!("node-{}-{n}", std::process::id());
        let cgroup_root = format!("swiftlet-test-{}-agent{n}", std::process::id());
        let config_file = dir.path().join("kubelet.yaml");
        // The disk these tests run on is shared and often fuller than the
        // default nodefs/imagefs thresholds and image GC's 85% allow: unless
        // a test is about them, only memory evicts, and image GC (which
        // would delete the locally built test images, never to be pulled
        // again) stays off, as imageGCHighThresholdPercent 100 means.
        let mut defaults = String::new();
        if !kubelet_config.contains("evictionHard") {
            defaults.push_str("evictionHard:\n  memory.available: 100Mi\n");
        }
        if !kubelet_config.contains("imageGCHighThresholdPercent") {
            defaults.push_str("imageGCHighThresholdPercent: 100\n");
        }
        std::fs::write(
            &config_file,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\npodLogsDir: {}\n{defaults}{kubelet_config}\n",
                dir.path().join("logs").display()
            ),
        )
        .unwrap();
        let mut args: Vec<String> = vec![
            format!("--config={}", config_file.display()),
            format!("--pod-manifest-path={}", manifests.display()),
            format!("--container-runtime-endpoint={endpoint}"),
            format!("--root-dir={}", dir.path().join("root").display()),
            format!("--cgroup-root=/{cgroup_root}"),
            format!("--hostname-override={node}"),
            "--register-node=false".into(),
        ];
        args.extend(extra_flags.iter().map(|s| s.to_string()));
        // A test with a runtime of its own names it with a later flag, which wins.
        let endpoint = extra_flags
            .iter()
            .rev()
            .find_map(|f| f.strip_prefix("--container-runtime-endpoint="))
            .map_or(endpoint, str::to_owned);
        AgentSetup { dir, manifests, node, cgroup_root, endpoint, args }
    }

    /// Writes a static pod manifest; returns the pod's name on this node.
    pub fn add_manifest(&self, file: &str, yaml: &str) -> String {
        write_manifest(&self.manifests, &self.node, file, yaml)
    }

    pub fn remove_manifest(&self, file: &str) {
        std::fs::remove_file(self.manifests.join(file)).unwrap();
    }

    fn cgroup_guard(&self) -> CgroupRoot {
        CgroupRoot {
            fs: CgroupFs::detect().unwrap_or_else(|e| panic!("this test needs a cgroup memory controller: {e}")),
            root: self.cgroup_root.clone(),
        }
    }
}

impl TestAgent {
    /// Starts an agent with `kubelet_config` (the body of a
    /// KubeletConfiguration, without apiVersion/kind) and extra flags.
    pub fn start(kubelet_config: &str, extra_flags: &[&str]) -> TestAgent {
        TestAgent::start_with_objects(kubelet_config, extra_flags, Arc::new(NoApiServer))
    }

    /// [`TestAgent::start`] with ConfigMaps, Secrets and tokens from `objects`.
    pub fn start_with_objects(kubelet_config: &str, extra_flags: &[&str], objects: Arc<dyn ObjectSource>) -> TestAgent {
        TestAgent::start_setup(AgentSetup::new(kubelet_config, extra_flags), objects)
    }

    /// Starts an agent on a prepared setup (files written before it starts).
    pub fn start_setup(setup: AgentSetup, objects: Arc<dyn ObjectSource>) -> TestAgent {
        let cgroups = setup.cgroup_guard();
        let AgentSetup { dir, manifests, node, cgroup_root, endpoint, args } = setup;
        let cfg = config::load(args.iter()).unwrap_or_else(|e| panic!("test agent config: {e}"));
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        let events = Arc::new(Events::default());
        let stop = CancellationToken::new();
        let shutdown = stop.clone();
        let recorder: Arc<dyn EventRecorder> = events.clone();
        let agent = rt
            .block_on(Agent::build_with(cfg, shutdown, recorder, objects))
            .unwrap_or_else(|e| panic!("cannot start the agent: {e}"));
        let agent = Arc::new(agent);
        let task = rt.spawn({
            let a = agent.clone();
            async move {
                if let Err(e) = a.run().await {
                    eprintln!("agent: {e}");
                }
            }
        });
        // The channel's worker task needs the runtime.
        let cri = {
            let _in_runtime = rt.enter();
            CriClient::new(&endpoint, Duration::from_secs(30)).unwrap()
        };
        TestAgent {
            agent,
            events,
            dir,
            manifests,
            cgroup_root,
            node,
            cri,
            rt,
            args,
            stop,
            task: Some(task),
            _cgroups: cgroups,
        }
    }

    /// Writes a static pod manifest; returns the pod's name on this node.
    pub fn add_manifest(&self, file: &str, yaml: &str) -> String {
        write_manifest(&self.manifests, &self.node, file, yaml)
    }

    pub fn remove_manifest(&self, file: &str) {
        std::fs::remove_file(self.manifests.join(file)).unwrap();
    }

    pub fn pods(&self) -> Vec<Pod> {
        self.agent.pods.pods()
    }

    pub fn pod(&self, name: &str) -> Option<Pod> {
        self.pods().into_iter().find(|p| p.metadata.name.as_deref() == Some(name))
    }

    pub fn status(&self, name: &str) -> Option<PodStatus> {
        self.pod(name).and_then(|p| p.status)
    }

    /// Waits until `check` holds for the pod's status, or fails with the
    /// last status and the events seen.
    pub fn wait_status(
        &self,
        name: &str,
        timeout: Duration,
        what: &str,
        check: impl Fn(&PodStatus) -> bool,
    ) -> PodStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.status(name)
                && check(&s)
            {
                return s;
            }
            if Instant::now() > deadline {
                panic!(
                    "pod {name}: {what} did not happen within {timeout:?}\nlast status: {}\nevents: {:#?}",
                    self.status(name)
                        .map(|s| serde_json::to_string_pretty(&s).unwrap())
                        .unwrap_or_else(|| "none".into()),
                    self.events.all()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn wait_gone(&self, name: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.pod(name).is_some() {
            assert!(Instant::now() < deadline, "pod {name} still listed after {timeout:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Everything the runtime holds for a pod uid: (sandboxes, containers).
    pub fn runtime_state(&self, uid: &str) -> (Vec<api::PodSandbox>, Vec<api::Container>) {
        runtime_state(&self.cri, &self.rt, uid)
    }

    pub fn cgroupfs(&self) -> CgroupFs {
        self.agent.cgroupfs.clone()
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// The agent's `--root-dir`.
    pub fn root_dir(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// The KubeletConfiguration file the agent was started with.
    pub fn config_file(&self) -> PathBuf {
        self.dir.path().join("kubelet.yaml")
    }

    /// Reads the configuration again (as SIGHUP does in the binary) and
    /// applies it.
    pub fn reload(&self) -> Result<ConfigDiff, config::ConfigError> {
        let _in_runtime = self.rt.enter();
        config::load(self.args.iter()).map(|c| self.agent.reload(c))
    }

    /// The id of the running instance of a container of a pod.
    pub fn container_id(&self, pod: &str, container: &str) -> Option<String> {
        let s = self.status(pod)?;
        let cs = s.container_statuses?.into_iter().find(|c| c.name == container)?;
        cs.state.as_ref()?.running.as_ref()?;
        cs.container_id.map(|id| id.rsplit("://").next().unwrap_or_default().to_owned())
    }

    /// Runs `script` with sh in a running container: (exit code, stdout, stderr).
    pub fn exec(&self, pod: &str, container: &str, script: &str) -> (i32, String, String) {
        let id = self.container_id(pod, container).unwrap_or_else(|| panic!("{pod}/{container} is not running"));
        exec(&self.cri, &self.rt, &id, script)
    }
}

/// Runs `script` with sh in container `id`: (exit code, stdout, stderr).
pub fn exec(cri: &CriClient, rt: &tokio::runtime::Runtime, id: &str, script: &str) -> (i32, String, String) {
    let r = rt
        .block_on(cri.exec_sync(id, vec!["sh".into(), "-c".into(), script.into()], Duration::from_secs(10)))
        .unwrap_or_else(|e| panic!("exec {script:?} in {id}: {e}"));
    (r.exit_code, String::from_utf8_lossy(&r.stdout).into_owned(), String::from_utf8_lossy(&r.stderr).into_owned())
}

/// Unmounts everything a test's agent left mounted under its directory
/// (the root dir's shared bind mount, volumes of pods a failed test left),
/// so removing the directory never reaches through a mount.
pub fn unmount_under(dir: &Path) {
    match swiftlet::volumes::mount::unmount_all_under(dir) {
        Ok(left) if left.is_empty() => {}
        Ok(left) => eprintln!("warning: still mounted under {}: {left:?}", dir.display()),
        Err(e) => eprintln!("warning: cannot read the mount table: {e}"),
    }
}

fn write_manifest(dir: &Path, node: &str, file: &str, yaml: &str) -> String {
    let path = dir.join(file);
    write_atomically(&path, yaml);
    let pod = swiftlet::pods::manifest::load(&path, node).unwrap_or_else(|e| panic!("{e}"));
    pod.metadata.name.unwrap()
}

/// Writes `path` through a dotfile and a rename, as careful tools do: the
/// agent's static pod source (which ignores dotfiles) never reads it half
/// written, whenever its scan runs.
pub fn write_atomically(path: &Path, contents: &str) {
    let tmp = path.with_file_name(format!(".{}.tmp", path.file_name().unwrap().to_string_lossy()));
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

pub fn runtime_state(
    cri: &CriClient,
    rt: &tokio::runtime::Runtime,
    uid: &str,
) -> (Vec<api::PodSandbox>, Vec<api::Container>) {
    let mut sel = labels::managed_selector();
    sel.insert(labels::POD_UID.into(), uid.into());
    rt.block_on(async {
        let s = cri
            .list_pod_sandbox(Some(api::PodSandboxFilter { label_selector: sel.clone(), ..Default::default() }))
            .await
            .unwrap();
        let c = cri
            .list_containers(Some(api::ContainerFilter { label_selector: sel, ..Default::default() }))
            .await
            .unwrap();
        (s, c)
    })
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        // Stop every static pod through the agent, so termination runs as
        // it would for a user; whatever is left goes through CRI below.
        for e in std::fs::read_dir(&self.manifests).into_iter().flatten().flatten() {
            let _ = std::fs::remove_file(e.path());
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.agent.pods.pods().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        self.stop.cancel();
        if let Some(t) = self.task.take() {
            let _ = self.rt.block_on(async { tokio::time::timeout(Duration::from_secs(30), t).await });
        }
        force_remove_pods(&self.cri, &self.rt, &self.node);
        unmount_under(self.dir.path());
    }
}

/// Stops and removes every sandbox of a static pod of `node` (their names
/// end in `-<node>`): what a failed test left behind.
pub fn force_remove_pods(cri: &CriClient, rt: &tokio::runtime::Runtime, node: &str) {
    let suffix = format!("-{node}");
    rt.block_on(async {
        let all = cri
            .list_pod_sandbox(Some(api::PodSandboxFilter {
                label_selector: labels::managed_selector(),
                ..Default::default()
            }))
            .await
            .unwrap_or_default();
        for s in all {
            if labels::identity(&s.labels).is_some_and(|id| id.name.ends_with(&suffix)) {
                let _ = cri.stop_pod_sandbox(&s.id).await;
                let _ = cri.remove_pod_sandbox(&s.id).await;
            }
        }
    });
}

/// The real `swiftlet` binary on an [`AgentSetup`], for tests that kill it.
pub struct AgentProcess {
    pub setup: AgentSetup,
    child: Option<std::process::Child>,
    pub cri: CriClient,
    pub rt: tokio::runtime::Runtime,
    _cgroups: CgroupRoot,
}

impl AgentProcess {
    pub fn start(setup: AgentSetup) -> AgentProcess {
        let cgroups = setup.cgroup_guard();
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        let cri = {
            let _in_runtime = rt.enter();
            CriClient::new(&setup.endpoint, Duration::from_secs(30)).unwrap()
        };
        let mut p = AgentProcess { setup, child: None, cri, rt, _cgroups: cgroups };
        p.spawn();
        p
    }

    /// Starts the binary (again).
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "the agent is already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.setup.dir.path().join("agent.log"))
            .unwrap();
        let child = std::process::Command::new(crate::workload::sibling_binary("swiftlet"))
            .args(&self.setup.args)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start swiftlet");
        self.child = Some(child);
    }

    /// SIGKILL, as a crash or an OOM kill of the agent would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            crate::process::terminate(&mut c, Duration::from_secs(30));
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.setup.dir.path().join("agent.log")).unwrap_or_default()
    }

    pub fn runtime_state(&self, uid: &str) -> (Vec<api::PodSandbox>, Vec<api::Container>) {
        runtime_state(&self.cri, &self.rt, uid)
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        for e in std::fs::read_dir(&self.setup.manifests).into_iter().flatten().flatten() {
            let _ = std::fs::remove_file(e.path());
        }
        self.stop();
        force_remove_pods(&self.cri, &self.rt, &self.setup.node);
        unmount_under(self.setup.dir.path());
    }
}
