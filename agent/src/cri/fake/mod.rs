//! The test runtime: an in-memory [`RuntimeService`] + [`ImageService`]
//! for unit tests of everything that drives CRI (pod workers, the image
//! manager, garbage collection, log rotation). It is a normal module, not
//! test-only, so every crate's tests can use it; nothing in the agent
//! constructs it.
//!
//! How to use it:
//!
//! ```
//! # use std::time::Duration;
//! # use swiftlet::cri::fake::{Behavior, FakeRuntime, Fault, Method};
//! let rt = FakeRuntime::new();
//! rt.add_image("docker.io/library/busybox:1.36", 1 << 20); // present
//! rt.make_pullable("docker.io/library/nginx:1.27", 50 << 20); // a pull succeeds
//! // Each start of a container named "app" takes the next behaviour; the
//! // last one repeats.
//! rt.script("app", [Behavior::Exit { code: 1, after: Duration::from_secs(2) }, Behavior::run()]);
//! rt.script("hog", [Behavior::OomKill { after: Duration::ZERO }]);
//! // StartContainer of "app" fails once with Unavailable, then works.
//! rt.fail(Fault::new(Method::StartContainer, tonic::Code::Unavailable, "runtime restarting").on("app").once());
//! // ... run the code under test, then assert on what it called:
//! assert_eq!(rt.count(Method::PullImage), 0);
//! ```
//!
//! Behaviour follows containerd's where tests rely on it: a container's
//! exit is evaluated lazily against [`tokio::time::Instant`], so a test
//! with a paused clock advances containers by advancing time; exits carry
//! containerd's reasons (Completed, Error, OOMKilled, StartError with code
//! 128); CreateContainer needs the image present (NotFound otherwise) and a
//! ready sandbox; stopping a sandbox stops its containers; RemoveImage and
//! RemovePodSandbox of something absent succeed; a failed pull is
//! `Unknown` with containerd's wording. Images are matched by id, by name
//! normalized as containerd does (`busybox` = `docker.io/library/busybox:latest`),
//! or by a unique id prefix.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use async_trait::async_trait;
use tokio::time::Instant;

use super::{CriError, ImageService, Result, RuntimeService, api};

/// A CRI call, for scripting faults and latency and for the call log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    Version,
    Status,
    RunPodSandbox,
    StopPodSandbox,
    RemovePodSandbox,
    PodSandboxStatus,
    ListPodSandbox,
    CreateContainer,
    StartContainer,
    StopContainer,
    RemoveContainer,
    ListContainers,
    ContainerStatus,
    ExecSync,
    ReopenContainerLog,
    ListContainerStats,
    ListImages,
    ImageStatus,
    PullImage,
    RemoveImage,
    ImageFsInfo,
}

impl Method {
    /// The gRPC method name (as in CriError's `call`).
    pub fn name(self) -> &'static str {
        match self {
            Method::Version => "Version",
            Method::Status => "Status",
            Method::RunPodSandbox => "RunPodSandbox",
            Method::StopPodSandbox => "StopPodSandbox",
            Method::RemovePodSandbox => "RemovePodSandbox",
            Method::PodSandboxStatus => "PodSandboxStatus",
            Method::ListPodSandbox => "ListPodSandbox",
            Method::CreateContainer => "CreateContainer",
            Method::StartContainer => "StartContainer",
            Method::StopContainer => "StopContainer",
            Method::RemoveContainer => "RemoveContainer",
            Method::ListContainers => "ListContainers",
            Method::ContainerStatus => "ContainerStatus",
            Method::ExecSync => "ExecSync",
            Method::ReopenContainerLog => "ReopenContainerLog",
            Method::ListContainerStats => "ListContainerStats",
            Method::ListImages => "ListImages",
            Method::ImageStatus => "ImageStatus",
            Method::PullImage => "PullImage",
            Method::RemoveImage => "RemoveImage",
            Method::ImageFsInfo => "ImageFsInfo",
        }
    }
}

/// One recorded call. `target` is what the call was about: the sandbox or
/// container id, the image as given, the pod name for RunPodSandbox and
/// the container name for CreateContainer; empty for list calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub method: Method,
    pub target: String,
}

/// What a container does once started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Behavior {
    /// Runs until stopped; StopContainer ends it with `stop_exit_code`
    /// (137: the process ignored SIGTERM and was killed; 143 or 0 for one
    /// that handles it).
    Run { stop_exit_code: i32 },
    /// Exits by itself `after` the start with `code` (reason Completed for
    /// 0, Error otherwise, as containerd reports).
    Exit { code: i32, after: Duration },
    /// Killed by the kernel's OOM killer `after` the start: exit code 137,
    /// reason OOMKilled.
    OomKill { after: Duration },
    /// StartContainer fails with `message`; the container is then exited
    /// with code 128 and reason StartError, as containerd leaves it.
    FailStart { message: String },
}

impl Behavior {
    /// Runs until stopped, and is SIGKILLed when stopped (exit code 137).
    pub fn run() -> Behavior {
        Behavior::Run { stop_exit_code: 137 }
    }
}

/// How often a fault fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Times {
    Always,
    Remaining(u32),
}

/// A scripted failure of a call.
#[derive(Clone, Debug)]
pub struct Fault {
    method: Method,
    target: Option<String>,
    code: tonic::Code,
    message: String,
    times: Times,
}

impl Fault {
    /// `method` fails with `code` and `message`, always, for any target.
    pub fn new(method: Method, code: tonic::Code, message: impl Into<String>) -> Fault {
        Fault { method, target: None, code, message: message.into(), times: Times::Always }
    }

    /// Only for this target: an id, an image (as given, or normalized), a
    /// pod name (RunPodSandbox) or a container name (CreateContainer, and
    /// every call about a container of that name).
    pub fn on(mut self, target: impl Into<String>) -> Fault {
        self.target = Some(target.into());
        self
    }

    /// Fires once, then the call works again.
    pub fn once(self) -> Fault {
        self.times(1)
    }

    pub fn times(mut self, n: u32) -> Fault {
        self.times = Times::Remaining(n);
        self
    }
}

type ExecFn = Arc<dyn Fn(&[String]) -> std::result::Result<api::ExecSyncResponse, (tonic::Code, String)> + Send + Sync>;

/// A pull's scripted outcome.
#[derive(Clone, Debug)]
enum Pullable {
    Ok {
        size: u64,
    },
    /// Pulls only with this username and password.
    Private {
        size: u64,
        username: String,
        password: String,
    },
    Err {
        code: tonic::Code,
        message: String,
    },
}

#[derive(Clone, Debug)]
struct FakeImage {
    id: String,
    tags: Vec<String>,
    size: u64,
    pinned: bool,
}

#[derive(Clone, Debug)]
struct FakeSandbox {
    id: String,
    config: api::PodSandboxConfig,
    ready: bool,
    created_at: i64,
    ip: String,
}

#[derive(Clone, Debug)]
struct FakeContainer {
    id: String,
    sandbox_id: String,
    config: api::ContainerConfig,
    image_ref: String,
    state: api::ContainerState,
    created_at: i64,
    started_at: i64,
    finished_at: i64,
    exit_code: i32,
    reason: String,
    message: String,
    log_path: String,
    behavior: Behavior,
    /// When a scripted exit happens (set at start).
    exit_at: Option<Instant>,
    stop_timeouts: Vec<Duration>,
}

impl FakeContainer {
    fn name(&self) -> &str {
        self.config.metadata.as_ref().map(|m| m.name.as_str()).unwrap_or("")
    }
}

#[derive(Default)]
struct State {
    next_id: u64,
    images: Vec<FakeImage>,
    pullable: HashMap<String, Pullable>,
    sandboxes: BTreeMap<String, FakeSandbox>,
    containers: BTreeMap<String, FakeContainer>,
    /// Behaviours per container name, consumed one per CreateContainer.
    scripts: HashMap<String, Vec<Behavior>>,
    exec: HashMap<String, ExecFn>,
    faults: Vec<Fault>,
    latency: HashMap<Method, Duration>,
    in_flight: HashMap<Method, usize>,
    max_in_flight: HashMap<Method, usize>,
    calls: Vec<Call>,
    /// Every PullImage's image and credentials, in order.
    pull_auths: Vec<(String, Option<api::AuthConfig>)>,
    stats: HashMap<String, (u64, u64)>,
    image_fs: Option<(String, Option<u64>, Option<u64>)>,
    runtime_ready: bool,
    network_ready: bool,
}

/// The in-memory runtime. Cheap to share: wrap it in an `Arc` and hand it
/// out as `Arc<dyn RuntimeService>` and `Arc<dyn ImageService>`.
pub struct FakeRuntime {
    state: Mutex<State>,
    /// Wall-clock base for CRI timestamps, paired with a tokio instant so
    /// timestamps follow a paused test clock.
    base_wall_ns: i64,
    base_instant: Instant,
}

impl Default for FakeRuntime {
    fn default() -> Self {
        FakeRuntime::new()
    }
}

/// The image name as containerd stores it, or the input if it does not parse.
fn normalize(name: &str) -> String {
    crate::images::reference::Reference::parse(name).map(|r| r.normalized()).unwrap_or_else(|_| name.to_owned())
}

fn fake_digest(seed: &str) -> String {
    // FNV-1a, spread over 64 hex digits: stable ids without a hash crate.
    let mut out = String::from("sha256:");
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for round in 0..4u8 {
        for b in seed.bytes().chain([round]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        out.push_str(&format!("{h:016x}"));
    }
    out
}

fn err(method: Method, code: tonic::Code, message: impl Into<String>) -> CriError {
    CriError::Status { call: method.name(), code, message: message.into() }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    fn new_id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}{:04}", self.next_id)
    }

    fn find_image(&self, name: &str) -> Option<usize> {
        if name.is_empty() {
            return None;
        }
        let normalized = normalize(name);
        if let Some(i) = self.images.iter().position(|i| i.id == name || i.tags.contains(&normalized)) {
            return Some(i);
        }
        // A unique prefix of an id (with or without "sha256:"), as
        // containerd resolves short ids; an ambiguous one is an error
        // the caller reports.
        let hex = name.strip_prefix("sha256:").unwrap_or(name);
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut hits = self.images.iter().enumerate().filter(|(_, i)| i.id["sha256:".len()..].starts_with(hex));
        match (hits.next(), hits.next()) {
            (Some((i, _)), None) => Some(i),
            _ => None,
        }
    }

    fn ambiguous(&self, name: &str) -> bool {
        let hex = name.strip_prefix("sha256:").unwrap_or(name);
        !hex.is_empty()
            && hex.bytes().all(|b| b.is_ascii_hexdigit())
            && self.images.iter().filter(|i| i.id["sha256:".len()..].starts_with(hex)).count() > 1
    }

    fn take_fault(&mut self, method: Method, targets: &[&str]) -> Option<CriError> {
        let pos = self.faults.iter().position(|f| {
            f.method == method
                && f.times != Times::Remaining(0)
                && f.target.as_deref().is_none_or(|t| targets.iter().any(|x| *x == t || normalize(x) == normalize(t)))
        })?;
        let f = &mut self.faults[pos];
        if let Times::Remaining(n) = &mut f.times {
            *n -= 1;
        }
        Some(err(method, f.code, f.message.clone()))
    }
}

impl FakeRuntime {
    pub fn new() -> FakeRuntime {
        let base_wall_ns = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0);
        FakeRuntime {
            state: Mutex::new(State { runtime_ready: true, network_ready: true, ..Default::default() }),
            base_wall_ns,
            base_instant: Instant::now(),
        }
    }

    fn now_ns(&self) -> i64 {
        self.base_wall_ns + Instant::now().saturating_duration_since(self.base_instant).as_nanos() as i64
    }

    fn ns_at(&self, at: Instant) -> i64 {
        self.base_wall_ns + at.saturating_duration_since(self.base_instant).as_nanos() as i64
    }

    // ---- scripting: images ----

    /// Adds a present image under `name` (normalized as containerd does);
    /// returns its id. Adding a name again replaces that tag.
    pub fn add_image(&self, name: &str, size: u64) -> String {
        let id = fake_digest(name);
        self.add_image_with_id(name, &id, size);
        id
    }

    /// Adds `name` as a tag of the image `id` (created if new).
    pub fn add_image_with_id(&self, name: &str, id: &str, size: u64) {
        let mut s = lock(&self.state);
        let tag = normalize(name);
        for i in s.images.iter_mut() {
            i.tags.retain(|t| *t != tag);
        }
        match s.images.iter_mut().find(|i| i.id == id) {
            Some(i) => i.tags.push(tag),
            None => s.images.push(FakeImage { id: id.to_owned(), tags: vec![tag], size, pinned: false }),
        }
        s.images.retain(|i| !i.tags.is_empty() || i.id == id);
    }

    /// Marks an image pinned (never garbage collected), as runtimes pin
    /// their sandbox image.
    pub fn set_pinned(&self, name: &str, pinned: bool) {
        let mut s = lock(&self.state);
        if let Some(i) = s.find_image(name) {
            s.images[i].pinned = pinned;
        }
    }

    /// A pull of `name` succeeds and adds the image (of `size` bytes).
    pub fn make_pullable(&self, name: &str, size: u64) {
        lock(&self.state).pullable.insert(normalize(name), Pullable::Ok { size });
    }

    /// A pull of `name` succeeds only with these credentials (a username
    /// and password, or `auth` = base64 of `username:password`); otherwise
    /// it fails as containerd does on a registry's 401.
    pub fn make_private(&self, name: &str, size: u64, username: &str, password: &str) {
        lock(&self.state)
            .pullable
            .insert(normalize(name), Pullable::Private { size, username: username.into(), password: password.into() });
    }

    /// The image and credentials of every PullImage so far.
    pub fn pull_auths(&self) -> Vec<(String, Option<api::AuthConfig>)> {
        lock(&self.state).pull_auths.clone()
    }

    /// A pull of `name` fails with `code` and `message` until scripted
    /// otherwise (containerd answers Unknown for registry errors).
    pub fn set_pull_error(&self, name: &str, code: tonic::Code, message: impl Into<String>) {
        lock(&self.state).pullable.insert(normalize(name), Pullable::Err { code, message: message.into() });
    }

    /// Removes an image behind the caller's back (as `ctr images rm` would).
    pub fn delete_image(&self, name: &str) {
        let mut s = lock(&self.state);
        if let Some(i) = s.find_image(name) {
            s.images.remove(i);
        }
    }

    /// ImageFsInfo's answer: the mountpoint, used bytes and inodes (None:
    /// the runtime leaves them out). By default: `/fake/imagefs` and the
    /// sum of the images' sizes.
    pub fn set_image_fs(&self, mountpoint: &str, used_bytes: Option<u64>, inodes_used: Option<u64>) {
        lock(&self.state).image_fs = Some((mountpoint.to_owned(), used_bytes, inodes_used));
    }

    // ---- scripting: containers ----

    /// What the next containers named `name` do, one behaviour per
    /// CreateContainer; the last one repeats. Unscripted containers run
    /// until stopped.
    pub fn script(&self, name: &str, behaviors: impl IntoIterator<Item = Behavior>) {
        lock(&self.state).scripts.insert(name.to_owned(), behaviors.into_iter().collect());
    }

    /// ExecSync in containers named `name` answers with `f(cmd)`; an `Err`
    /// is a failed call. Without a script, exec answers exit code 0.
    pub fn on_exec(
        &self,
        name: &str,
        f: impl Fn(&[String]) -> std::result::Result<api::ExecSyncResponse, (tonic::Code, String)> + Send + Sync + 'static,
    ) {
        lock(&self.state).exec.insert(name.to_owned(), Arc::new(f));
    }

    /// ExecSync in containers named `name` exits with `code`.
    pub fn set_exec_exit_code(&self, name: &str, code: i32) {
        self.on_exec(name, move |_| Ok(api::ExecSyncResponse { exit_code: code, ..Default::default() }));
    }

    /// Makes a running container exit now with `code` and `reason` (empty:
    /// Completed/Error by code).
    pub fn exit_container(&self, id: &str, code: i32, reason: &str) {
        let now = self.now_ns();
        let mut s = lock(&self.state);
        if let Some(c) = s.containers.get_mut(id)
            && c.state == api::ContainerState::ContainerRunning
        {
            finish(c, now, code, reason);
        }
    }

    /// Sets a container's creation time (ns since the epoch), for garbage
    /// collection orderings.
    pub fn set_created_at(&self, id: &str, created_at_ns: i64) {
        if let Some(c) = lock(&self.state).containers.get_mut(id) {
            c.created_at = created_at_ns;
        }
    }

    /// Sets a sandbox's creation time (ns since the epoch).
    pub fn set_sandbox_created_at(&self, id: &str, created_at_ns: i64) {
        if let Some(s) = lock(&self.state).sandboxes.get_mut(id) {
            s.created_at = created_at_ns;
        }
    }

    /// ListContainerStats reports these for container `id`.
    pub fn set_stats(&self, id: &str, cpu_usage_core_ns: u64, memory_working_set_bytes: u64) {
        lock(&self.state).stats.insert(id.to_owned(), (cpu_usage_core_ns, memory_working_set_bytes));
    }

    /// The runtime's RuntimeReady / NetworkReady conditions.
    pub fn set_ready(&self, runtime: bool, network: bool) {
        let mut s = lock(&self.state);
        s.runtime_ready = runtime;
        s.network_ready = network;
    }

    // ---- scripting: faults and latency ----

    pub fn fail(&self, fault: Fault) {
        lock(&self.state).faults.push(fault);
    }

    pub fn clear_faults(&self) {
        lock(&self.state).faults.clear();
    }

    /// Every call of `method` takes `latency` (tokio time) before it acts.
    pub fn set_latency(&self, method: Method, latency: Duration) {
        lock(&self.state).latency.insert(method, latency);
    }

    // ---- inspection ----

    pub fn calls(&self) -> Vec<Call> {
        lock(&self.state).calls.clone()
    }

    pub fn count(&self, method: Method) -> usize {
        lock(&self.state).calls.iter().filter(|c| c.method == method).count()
    }

    /// Calls of `method` about `target`.
    pub fn count_on(&self, method: Method, target: &str) -> usize {
        lock(&self.state).calls.iter().filter(|c| c.method == method && c.target == target).count()
    }

    pub fn clear_calls(&self) {
        lock(&self.state).calls.clear();
    }

    /// The most calls of `method` that were in progress at once.
    pub fn max_in_flight(&self, method: Method) -> usize {
        lock(&self.state).max_in_flight.get(&method).copied().unwrap_or(0)
    }

    /// Ids of the containers that exist, oldest first.
    pub fn container_ids(&self) -> Vec<String> {
        self.refresh();
        let s = lock(&self.state);
        let mut v: Vec<_> = s.containers.values().map(|c| (c.created_at, c.id.clone())).collect();
        v.sort();
        v.into_iter().map(|(_, id)| id).collect()
    }

    pub fn sandbox_ids(&self) -> Vec<String> {
        lock(&self.state).sandboxes.keys().cloned().collect()
    }

    /// The stop timeouts StopContainer was given for container `id`.
    pub fn stop_timeouts(&self, id: &str) -> Vec<Duration> {
        lock(&self.state).containers.get(id).map(|c| c.stop_timeouts.clone()).unwrap_or_default()
    }

    /// Names (normalized) of every present image.
    pub fn image_names(&self) -> Vec<String> {
        lock(&self.state).images.iter().flat_map(|i| i.tags.clone()).collect()
    }

    pub fn has_image(&self, name: &str) -> bool {
        lock(&self.state).find_image(name).is_some()
    }

    // ---- internals ----

    /// Applies scripted exits whose time has come.
    fn refresh(&self) {
        let now = Instant::now();
        let mut s = lock(&self.state);
        for c in s.containers.values_mut() {
            if c.state != api::ContainerState::ContainerRunning {
                continue;
            }
            if let Some(at) = c.exit_at
                && at <= now
            {
                let (code, reason) = match &c.behavior {
                    Behavior::OomKill { .. } => (137, "OOMKilled"),
                    Behavior::Exit { code, .. } => (*code, ""),
                    _ => continue,
                };
                let at_ns = self.ns_at(at);
                finish(c, at_ns, code, reason);
            }
        }
    }

    /// Records the call, applies latency and faults. Returns a guard that
    /// keeps the call counted as in flight.
    async fn enter(&self, method: Method, target: &str, extra_targets: &[&str]) -> Result<InFlight<'_>> {
        let latency = {
            let mut s = lock(&self.state);
            s.calls.push(Call { method, target: target.to_owned() });
            let n = s.in_flight.entry(method).or_default();
            *n += 1;
            let n = *n;
            let m = s.max_in_flight.entry(method).or_default();
            *m = (*m).max(n);
            s.latency.get(&method).copied()
        };
        let guard = InFlight { rt: self, method };
        if let Some(d) = latency {
            tokio::time::sleep(d).await;
        }
        self.refresh();
        let mut targets = vec![target];
        targets.extend_from_slice(extra_targets);
        if let Some(e) = lock(&self.state).take_fault(method, &targets) {
            return Err(e);
        }
        Ok(guard)
    }

    fn container_name(&self, id: &str) -> String {
        lock(&self.state).containers.get(id).map(|c| c.name().to_owned()).unwrap_or_default()
    }
}

struct InFlight<'a> {
    rt: &'a FakeRuntime,
    method: Method,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(n) = lock(&self.rt.state).in_flight.get_mut(&self.method) {
            *n = n.saturating_sub(1);
        }
    }
}

fn finish(c: &mut FakeContainer, at_ns: i64, code: i32, reason: &str) {
    c.state = api::ContainerState::ContainerExited;
    c.finished_at = at_ns;
    c.exit_code = code;
    c.reason = if !reason.is_empty() {
        reason.to_owned()
    } else if code == 0 {
        "Completed".into()
    } else {
        "Error".into()
    };
    c.exit_at = None;
}

fn labels_match(selector: &HashMap<String, String>, labels: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn container_view(c: &FakeContainer) -> api::Container {
    api::Container {
        id: c.id.clone(),
        pod_sandbox_id: c.sandbox_id.clone(),
        metadata: c.config.metadata.clone(),
        image: c.config.image.clone(),
        image_ref: c.image_ref.clone(),
        state: c.state as i32,
        created_at: c.created_at,
        labels: c.config.labels.clone(),
        annotations: c.config.annotations.clone(),
        image_id: c.image_ref.clone(),
    }
}

fn image_view(i: &FakeImage) -> api::Image {
    api::Image { id: i.id.clone(), repo_tags: i.tags.clone(), size: i.size, pinned: i.pinned, ..Default::default() }
}

#[async_trait]
impl RuntimeService for FakeRuntime {
    async fn version(&self) -> Result<api::VersionResponse> {
        let _g = self.enter(Method::Version, "", &[]).await?;
        Ok(api::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "fake".into(),
            runtime_version: "0.1.0".into(),
            runtime_api_version: "v1".into(),
        })
    }

    async fn status(&self) -> Result<api::StatusResponse> {
        let _g = self.enter(Method::Status, "", &[]).await?;
        let s = lock(&self.state);
        let cond = |t: &str, ok: bool| api::RuntimeCondition {
            r#type: t.into(),
            status: ok,
            reason: if ok { String::new() } else { format!("{t}False") },
            message: String::new(),
        };
        Ok(api::StatusResponse {
            status: Some(api::RuntimeStatus {
                conditions: vec![cond("RuntimeReady", s.runtime_ready), cond("NetworkReady", s.network_ready)],
            }),
            ..Default::default()
        })
    }

    async fn run_pod_sandbox(&self, config: api::PodSandboxConfig, _runtime_handler: &str) -> Result<String> {
        let name = config.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
        let _g = self.enter(Method::RunPodSandbox, &name, &[]).await?;
        let now = self.now_ns();
        let mut s = lock(&self.state);
        let id = s.new_id("sandbox-");
        let host_network = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|c| c.namespace_options.as_ref())
            .is_some_and(|n| n.network == api::NamespaceMode::Node as i32);
        // Host-network sandboxes report no IP (the node's is used), as
        // containerd does.
        let ip =
            if host_network { String::new() } else { format!("10.88.{}.{}", s.next_id / 250, s.next_id % 250 + 2) };
        s.sandboxes.insert(id.clone(), FakeSandbox { id: id.clone(), config, ready: true, created_at: now, ip });
        Ok(id)
    }

    async fn stop_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        let _g = self.enter(Method::StopPodSandbox, sandbox_id, &[]).await?;
        let now = self.now_ns();
        let mut s = lock(&self.state);
        let Some(sb) = s.sandboxes.get_mut(sandbox_id) else {
            return Err(err(Method::StopPodSandbox, tonic::Code::NotFound, format!("sandbox {sandbox_id} not found")));
        };
        sb.ready = false;
        for c in s.containers.values_mut().filter(|c| c.sandbox_id == sandbox_id) {
            if c.state == api::ContainerState::ContainerRunning {
                let code = match c.behavior {
                    Behavior::Run { stop_exit_code } => stop_exit_code,
                    _ => 137,
                };
                finish(c, now, code, "");
            }
        }
        Ok(())
    }

    async fn remove_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        let _g = self.enter(Method::RemovePodSandbox, sandbox_id, &[]).await?;
        let mut s = lock(&self.state);
        if let Some(sb) = s.sandboxes.get(sandbox_id)
            && sb.ready
        {
            return Err(err(
                Method::RemovePodSandbox,
                tonic::Code::Unknown,
                format!("sandbox container {sandbox_id:?} is not fully stopped"),
            ));
        }
        s.sandboxes.remove(sandbox_id);
        s.containers.retain(|_, c| c.sandbox_id != sandbox_id);
        Ok(())
    }

    async fn pod_sandbox_status(&self, sandbox_id: &str) -> Result<api::PodSandboxStatus> {
        let _g = self.enter(Method::PodSandboxStatus, sandbox_id, &[]).await?;
        let s = lock(&self.state);
        let sb = s.sandboxes.get(sandbox_id).ok_or_else(|| {
            err(
                Method::PodSandboxStatus,
                tonic::Code::NotFound,
                format!("an error occurred when try to find sandbox {sandbox_id:?}: not found"),
            )
        })?;
        Ok(api::PodSandboxStatus {
            id: sb.id.clone(),
            metadata: sb.config.metadata.clone(),
            state: sandbox_state(sb.ready),
            created_at: sb.created_at,
            network: Some(api::PodSandboxNetworkStatus { ip: sb.ip.clone(), additional_ips: vec![] }),
            labels: sb.config.labels.clone(),
            annotations: sb.config.annotations.clone(),
            ..Default::default()
        })
    }

    async fn list_pod_sandbox(&self, filter: Option<api::PodSandboxFilter>) -> Result<Vec<api::PodSandbox>> {
        let _g = self.enter(Method::ListPodSandbox, "", &[]).await?;
        let s = lock(&self.state);
        let f = filter.unwrap_or_default();
        Ok(s.sandboxes
            .values()
            .filter(|sb| f.id.is_empty() || sb.id == f.id)
            .filter(|sb| f.state.as_ref().is_none_or(|st| st.state == sandbox_state(sb.ready)))
            .filter(|sb| labels_match(&f.label_selector, &sb.config.labels))
            .map(|sb| api::PodSandbox {
                id: sb.id.clone(),
                metadata: sb.config.metadata.clone(),
                state: sandbox_state(sb.ready),
                created_at: sb.created_at,
                labels: sb.config.labels.clone(),
                annotations: sb.config.annotations.clone(),
                runtime_handler: String::new(),
            })
            .collect())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        _sandbox_config: api::PodSandboxConfig,
    ) -> Result<String> {
        let name = config.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
        let _g = self.enter(Method::CreateContainer, &name, &[sandbox_id]).await?;
        let now = self.now_ns();
        let mut s = lock(&self.state);
        let log_dir = match s.sandboxes.get(sandbox_id) {
            None => {
                return Err(err(
                    Method::CreateContainer,
                    tonic::Code::NotFound,
                    format!("failed to find sandbox id {sandbox_id:?}: not found"),
                ));
            }
            Some(sb) if !sb.ready => {
                return Err(err(
                    Method::CreateContainer,
                    tonic::Code::Unknown,
                    format!("sandbox {sandbox_id:?} is not running"),
                ));
            }
            Some(sb) => sb.config.log_directory.clone(),
        };
        let image = config.image.as_ref().map(|i| i.image.clone()).unwrap_or_default();
        let Some(idx) = s.find_image(&image) else {
            return Err(err(
                Method::CreateContainer,
                tonic::Code::NotFound,
                format!("failed to resolve image {image:?}: not found"),
            ));
        };
        let image_ref = s.images[idx].id.clone();
        let behavior = match s.scripts.get_mut(&name) {
            Some(list) if list.len() > 1 => list.remove(0),
            Some(list) if list.len() == 1 => list[0].clone(),
            _ => Behavior::run(),
        };
        let id = s.new_id("container-");
        let log_path = if log_dir.is_empty() || config.log_path.is_empty() {
            String::new()
        } else {
            std::path::Path::new(&log_dir).join(&config.log_path).display().to_string()
        };
        s.containers.insert(
            id.clone(),
            FakeContainer {
                id: id.clone(),
                sandbox_id: sandbox_id.to_owned(),
                config,
                image_ref,
                state: api::ContainerState::ContainerCreated,
                created_at: now,
                started_at: 0,
                finished_at: 0,
                exit_code: 0,
                reason: String::new(),
                message: String::new(),
                log_path,
                behavior,
                exit_at: None,
                stop_timeouts: vec![],
            },
        );
        Ok(id)
    }

    async fn start_container(&self, container_id: &str) -> Result<()> {
        let name = self.container_name(container_id);
        let _g = self.enter(Method::StartContainer, container_id, &[&name]).await?;
        let now = Instant::now();
        let now_ns = self.ns_at(now);
        let mut s = lock(&self.state);
        let Some(c) = s.containers.get_mut(container_id) else {
            return Err(err(
                Method::StartContainer,
                tonic::Code::NotFound,
                format!("container {container_id} not found"),
            ));
        };
        if c.state != api::ContainerState::ContainerCreated {
            return Err(err(
                Method::StartContainer,
                tonic::Code::Unknown,
                format!("container {container_id} is in {:?} state, not created", c.state),
            ));
        }
        if let Behavior::FailStart { message } = &c.behavior {
            let message = message.clone();
            c.state = api::ContainerState::ContainerExited;
            c.started_at = 0;
            c.finished_at = now_ns;
            c.exit_code = 128;
            c.reason = "StartError".into();
            c.message = message.clone();
            return Err(err(Method::StartContainer, tonic::Code::Unknown, message));
        }
        c.state = api::ContainerState::ContainerRunning;
        c.started_at = now_ns;
        c.exit_at = match &c.behavior {
            Behavior::Exit { after, .. } | Behavior::OomKill { after } => Some(now + *after),
            _ => None,
        };
        if !c.log_path.is_empty() {
            // The runtime opens the log file when the container starts.
            let _ = std::fs::OpenOptions::new().create(true).append(true).open(&c.log_path);
        }
        drop(s);
        self.refresh();
        Ok(())
    }

    async fn stop_container(&self, container_id: &str, timeout: Duration) -> Result<()> {
        let name = self.container_name(container_id);
        let _g = self.enter(Method::StopContainer, container_id, &[&name]).await?;
        let now = self.now_ns();
        let mut s = lock(&self.state);
        let Some(c) = s.containers.get_mut(container_id) else {
            return Err(err(
                Method::StopContainer,
                tonic::Code::NotFound,
                format!("an error occurred when try to find container {container_id:?}: not found"),
            ));
        };
        c.stop_timeouts.push(timeout);
        match c.state {
            api::ContainerState::ContainerRunning => {
                let code = match c.behavior {
                    Behavior::Run { stop_exit_code } => stop_exit_code,
                    _ => 137,
                };
                finish(c, now, code, "");
            }
            api::ContainerState::ContainerCreated => {
                // containerd leaves a never-started container as it is.
            }
            _ => {}
        }
        Ok(())
    }

    async fn remove_container(&self, container_id: &str) -> Result<()> {
        let name = self.container_name(container_id);
        let _g = self.enter(Method::RemoveContainer, container_id, &[&name]).await?;
        let mut s = lock(&self.state);
        if let Some(c) = s.containers.get(container_id)
            && c.state == api::ContainerState::ContainerRunning
        {
            return Err(err(
                Method::RemoveContainer,
                tonic::Code::Unknown,
                format!("container {container_id:?} is running, stop it first"),
            ));
        }
        s.containers.remove(container_id);
        Ok(())
    }

    async fn list_containers(&self, filter: Option<api::ContainerFilter>) -> Result<Vec<api::Container>> {
        let _g = self.enter(Method::ListContainers, "", &[]).await?;
        let s = lock(&self.state);
        let f = filter.unwrap_or_default();
        Ok(s.containers
            .values()
            .filter(|c| f.id.is_empty() || c.id == f.id)
            .filter(|c| f.pod_sandbox_id.is_empty() || c.sandbox_id == f.pod_sandbox_id)
            .filter(|c| f.state.as_ref().is_none_or(|st| st.state == c.state as i32))
            .filter(|c| labels_match(&f.label_selector, &c.config.labels))
            .map(container_view)
            .collect())
    }

    async fn container_status(&self, container_id: &str) -> Result<api::ContainerStatus> {
        let name = self.container_name(container_id);
        let _g = self.enter(Method::ContainerStatus, container_id, &[&name]).await?;
        let s = lock(&self.state);
        let c = s.containers.get(container_id).ok_or_else(|| {
            err(
                Method::ContainerStatus,
                tonic::Code::NotFound,
                format!("an error occurred when try to find container {container_id:?}: not found"),
            )
        })?;
        Ok(api::ContainerStatus {
            id: c.id.clone(),
            metadata: c.config.metadata.clone(),
            state: c.state as i32,
            created_at: c.created_at,
            started_at: c.started_at,
            finished_at: c.finished_at,
            exit_code: c.exit_code,
            image: c.config.image.clone(),
            image_ref: c.image_ref.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            labels: c.config.labels.clone(),
            annotations: c.config.annotations.clone(),
            log_path: c.log_path.clone(),
            image_id: c.image_ref.clone(),
            ..Default::default()
        })
    }

    async fn exec_sync(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        _timeout: Duration,
    ) -> Result<api::ExecSyncResponse> {
        let name = self.container_name(container_id);
        let _g = self.enter(Method::ExecSync, container_id, &[&name]).await?;
        let f = {
            let s = lock(&self.state);
            match s.containers.get(container_id) {
                None => {
                    return Err(err(
                        Method::ExecSync,
                        tonic::Code::NotFound,
                        format!("container {container_id} not found"),
                    ));
                }
                Some(c) if c.state != api::ContainerState::ContainerRunning => {
                    return Err(err(
                        Method::ExecSync,
                        tonic::Code::Unknown,
                        format!("container {container_id} is not running"),
                    ));
                }
                Some(_) => s.exec.get(&name).cloned(),
            }
        };
        match f {
            Some(f) => f(&cmd).map_err(|(code, m)| err(Method::ExecSync, code, m)),
            None => Ok(api::ExecSyncResponse::default()),
        }
    }

    async fn reopen_container_log(&self, container_id: &str) -> Result<()> {
        let name = self.container_name(container_id);
        let _g = self.enter(Method::ReopenContainerLog, container_id, &[&name]).await?;
        let s = lock(&self.state);
        let c = s.containers.get(container_id).ok_or_else(|| {
            err(Method::ReopenContainerLog, tonic::Code::NotFound, format!("container {container_id} not found"))
        })?;
        if c.state != api::ContainerState::ContainerRunning {
            return Err(err(
                Method::ReopenContainerLog,
                tonic::Code::FailedPrecondition,
                "container is not running".to_string(),
            ));
        }
        if !c.log_path.is_empty() {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&c.log_path)
                .map_err(|e| err(Method::ReopenContainerLog, tonic::Code::Unknown, format!("{}: {e}", c.log_path)))?;
        }
        Ok(())
    }

    async fn list_container_stats(
        &self,
        filter: Option<api::ContainerStatsFilter>,
    ) -> Result<Vec<api::ContainerStats>> {
        let _g = self.enter(Method::ListContainerStats, "", &[]).await?;
        let now = self.now_ns();
        let s = lock(&self.state);
        let f = filter.unwrap_or_default();
        Ok(s.containers
            .values()
            .filter(|c| c.state == api::ContainerState::ContainerRunning)
            .filter(|c| f.id.is_empty() || c.id == f.id)
            .filter(|c| f.pod_sandbox_id.is_empty() || c.sandbox_id == f.pod_sandbox_id)
            .filter(|c| labels_match(&f.label_selector, &c.config.labels))
            .map(|c| {
                let (cpu, mem) = s.stats.get(&c.id).copied().unwrap_or_default();
                api::ContainerStats {
                    attributes: Some(api::ContainerAttributes {
                        id: c.id.clone(),
                        metadata: c.config.metadata.clone(),
                        labels: c.config.labels.clone(),
                        annotations: c.config.annotations.clone(),
                    }),
                    cpu: Some(api::CpuUsage {
                        timestamp: now,
                        usage_core_nano_seconds: Some(api::UInt64Value { value: cpu }),
                        usage_nano_cores: None,
                    }),
                    memory: Some(api::MemoryUsage {
                        timestamp: now,
                        working_set_bytes: Some(api::UInt64Value { value: mem }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }
            })
            .collect())
    }
}

fn sandbox_state(ready: bool) -> i32 {
    if ready { api::PodSandboxState::SandboxReady as i32 } else { api::PodSandboxState::SandboxNotready as i32 }
}

#[async_trait]
impl ImageService for FakeRuntime {
    async fn list_images(&self) -> Result<Vec<api::Image>> {
        let _g = self.enter(Method::ListImages, "", &[]).await?;
        Ok(lock(&self.state).images.iter().map(image_view).collect())
    }

    async fn image_status(&self, image: &str) -> Result<Option<api::Image>> {
        let _g = self.enter(Method::ImageStatus, image, &[]).await?;
        let s = lock(&self.state);
        if s.ambiguous(image) {
            return Err(err(
                Method::ImageStatus,
                tonic::Code::Unknown,
                format!("can not resolve {image:?} locally: ambiguous digest string"),
            ));
        }
        Ok(s.find_image(image).map(|i| image_view(&s.images[i])))
    }

    async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        _sandbox_config: Option<api::PodSandboxConfig>,
    ) -> Result<String> {
        let _g = self.enter(Method::PullImage, image, &[]).await?;
        let normalized = normalize(image);
        let mut s = lock(&self.state);
        s.pull_auths.push((image.to_owned(), auth.clone()));
        match s.pullable.get(&normalized).cloned() {
            Some(Pullable::Ok { size }) => {
                drop(s);
                Ok(self.add_image(&normalized, size))
            }
            Some(Pullable::Private { size, username, password }) => {
                let given = auth.map(|a| {
                    if a.username.is_empty() && !a.auth.is_empty() {
                        use base64::Engine;
                        let decoded = base64::engine::general_purpose::STANDARD.decode(&a.auth).unwrap_or_default();
                        let text = String::from_utf8_lossy(&decoded).into_owned();
                        let (u, p) = text.split_once(':').unwrap_or((&text, ""));
                        (u.to_owned(), p.to_owned())
                    } else {
                        (a.username, a.password)
                    }
                });
                drop(s);
                if given == Some((username, password)) {
                    return Ok(self.add_image(&normalized, size));
                }
                let host = normalized.split('/').next().unwrap_or("");
                Err(err(
                    Method::PullImage,
                    tonic::Code::Unknown,
                    format!(
                        "failed to pull and unpack image {normalized:?}: failed to resolve reference {normalized:?}: \
                         pulling from host {host} failed with status code [manifests]: 401 Unauthorized"
                    ),
                ))
            }
            Some(Pullable::Err { code, message }) => Err(err(Method::PullImage, code, message)),
            None => Err(err(
                Method::PullImage,
                tonic::Code::Unknown,
                format!(
                    "failed to pull and unpack image {normalized:?}: failed to resolve reference {normalized:?}: {normalized}: not found"
                ),
            )),
        }
    }

    async fn remove_image(&self, image: &str) -> Result<()> {
        let _g = self.enter(Method::RemoveImage, image, &[]).await?;
        let mut s = lock(&self.state);
        if let Some(i) = s.find_image(image) {
            s.images.remove(i);
        }
        Ok(())
    }

    async fn image_fs_info(&self) -> Result<Vec<api::FilesystemUsage>> {
        let _g = self.enter(Method::ImageFsInfo, "", &[]).await?;
        let now = self.now_ns();
        let s = lock(&self.state);
        let (mountpoint, used, inodes) = s.image_fs.clone().unwrap_or_else(|| {
            ("/fake/imagefs".into(), Some(s.images.iter().map(|i| i.size).sum()), Some(s.images.len() as u64))
        });
        Ok(vec![api::FilesystemUsage {
            timestamp: now,
            fs_id: Some(api::FilesystemIdentifier { mountpoint }),
            used_bytes: used.map(|value| api::UInt64Value { value }),
            inodes_used: inodes.map(|value| api::UInt64Value { value }),
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox_config(name: &str, uid: &str) -> api::PodSandboxConfig {
        api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: name.into(),
                uid: uid.into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            labels: crate::cri::labels::sandbox_labels(
                &crate::cri::labels::PodIdentity { uid: uid.into(), namespace: "default".into(), name: name.into() },
                &Default::default(),
            ),
            ..Default::default()
        }
    }

    fn container_config(name: &str, image: &str) -> api::ContainerConfig {
        api::ContainerConfig {
            metadata: Some(api::ContainerMetadata { name: name.into(), attempt: 0 }),
            image: Some(api::ImageSpec { image: image.into(), ..Default::default() }),
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn scripted_exits_follow_the_tokio_clock() {
        let rt = FakeRuntime::new();
        rt.add_image("busybox:1.36", 100);
        rt.script("app", [Behavior::Exit { code: 3, after: Duration::from_secs(5) }, Behavior::run()]);
        rt.script("hog", [Behavior::OomKill { after: Duration::from_secs(1) }]);
        let sb = rt.run_pod_sandbox(sandbox_config("p", "u1"), "").await.unwrap();
        let cfg = sandbox_config("p", "u1");
        let app = rt.create_container(&sb, container_config("app", "busybox:1.36"), cfg.clone()).await.unwrap();
        let hog = rt
            .create_container(&sb, container_config("hog", "docker.io/library/busybox:1.36"), cfg.clone())
            .await
            .unwrap();
        rt.start_container(&app).await.unwrap();
        rt.start_container(&hog).await.unwrap();
        let st = rt.container_status(&app).await.unwrap();
        assert_eq!(st.state, api::ContainerState::ContainerRunning as i32);
        tokio::time::advance(Duration::from_secs(2)).await;
        let hs = rt.container_status(&hog).await.unwrap();
        assert_eq!(
            (hs.state, hs.exit_code, hs.reason.as_str()),
            (api::ContainerState::ContainerExited as i32, 137, "OOMKilled")
        );
        assert_eq!(rt.container_status(&app).await.unwrap().state, api::ContainerState::ContainerRunning as i32);
        tokio::time::advance(Duration::from_secs(4)).await;
        let st = rt.container_status(&app).await.unwrap();
        assert_eq!((st.exit_code, st.reason.as_str()), (3, "Error"));
        assert_eq!(st.finished_at - st.started_at, 5_000_000_000);
        // The second container named "app" takes the next behaviour: it runs.
        let app2 = rt.create_container(&sb, container_config("app", "busybox:1.36"), cfg).await.unwrap();
        rt.start_container(&app2).await.unwrap();
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(rt.container_status(&app2).await.unwrap().state, api::ContainerState::ContainerRunning as i32);
        rt.stop_container(&app2, Duration::from_secs(30)).await.unwrap();
        let st = rt.container_status(&app2).await.unwrap();
        assert_eq!((st.exit_code, st.reason.as_str()), (137, "Error"));
        assert_eq!(rt.stop_timeouts(&app2), vec![Duration::from_secs(30)]);
    }

    #[tokio::test]
    async fn faults_fire_as_scripted_and_calls_are_logged() {
        let rt = FakeRuntime::new();
        rt.add_image("busybox", 1);
        rt.fail(Fault::new(Method::StartContainer, tonic::Code::Unavailable, "restarting").on("app").once());
        rt.fail(
            Fault::new(Method::ImageStatus, tonic::Code::Internal, "broken").on("docker.io/library/busybox:latest"),
        );
        let sb = rt.run_pod_sandbox(sandbox_config("p", "u1"), "").await.unwrap();
        let c = rt.create_container(&sb, container_config("app", "busybox"), sandbox_config("p", "u1")).await.unwrap();
        let e = rt.start_container(&c).await.unwrap_err();
        assert_eq!(e.code(), Some(tonic::Code::Unavailable));
        rt.start_container(&c).await.unwrap();
        // Matched through normalization, and every time.
        for _ in 0..2 {
            assert_eq!(rt.image_status("busybox").await.unwrap_err().code(), Some(tonic::Code::Internal));
        }
        assert_eq!(rt.count(Method::StartContainer), 2);
        assert_eq!(rt.count_on(Method::CreateContainer, "app"), 1);
        assert_eq!(rt.calls()[0], Call { method: Method::RunPodSandbox, target: "p".into() });
    }

    #[tokio::test]
    async fn images_pulls_and_lookups() {
        let rt = FakeRuntime::new();
        rt.make_pullable("nginx:1.27", 10);
        rt.set_pull_error("quay.io/x/y:1", tonic::Code::Unknown, "RegistryUnavailable: down");
        assert_eq!(rt.image_status("nginx:1.27").await.unwrap(), None);
        let id = rt.pull_image("nginx:1.27", None, None).await.unwrap();
        let img = rt.image_status("docker.io/library/nginx:1.27").await.unwrap().unwrap();
        assert_eq!(img.id, id);
        assert_eq!(rt.image_status(&id).await.unwrap().unwrap().id, id);
        assert_eq!(rt.image_status(&id[..12]).await.unwrap().unwrap().id, id);
        assert!(
            rt.pull_image("quay.io/x/y:1", None, None).await.unwrap_err().message().starts_with("RegistryUnavailable")
        );
        let e = rt.pull_image("nope", None, None).await.unwrap_err();
        assert!(e.message().contains("docker.io/library/nope:latest"), "{e}");
        rt.remove_image(&id).await.unwrap();
        rt.remove_image(&id).await.unwrap();
        assert!(!rt.has_image("nginx:1.27"));
        // Two ids sharing a prefix make that prefix ambiguous.
        rt.add_image_with_id("a:1", &format!("sha256:ab{}", "0".repeat(62)), 1);
        rt.add_image_with_id("b:1", &format!("sha256:ab{}", "1".repeat(62)), 1);
        assert!(rt.image_status("sha256:ab").await.unwrap_err().message().contains("ambiguous"));
    }

    #[tokio::test]
    async fn sandboxes_and_containers() {
        let rt = FakeRuntime::new();
        rt.add_image("busybox", 1);
        let sb = rt.run_pod_sandbox(sandbox_config("p", "u1"), "").await.unwrap();
        // No image: NotFound, as containerd.
        let e = rt.create_container(&sb, container_config("x", "nope"), sandbox_config("p", "u1")).await.unwrap_err();
        assert!(e.is_not_found(), "{e}");
        let c = rt.create_container(&sb, container_config("app", "busybox"), sandbox_config("p", "u1")).await.unwrap();
        rt.start_container(&c).await.unwrap();
        let running = api::ContainerFilter {
            state: Some(api::ContainerStateValue { state: api::ContainerState::ContainerRunning as i32 }),
            ..Default::default()
        };
        assert_eq!(rt.list_containers(Some(running.clone())).await.unwrap().len(), 1);
        assert!(rt.remove_pod_sandbox(&sb).await.is_err(), "a ready sandbox is not removed");
        rt.stop_pod_sandbox(&sb).await.unwrap();
        assert_eq!(rt.list_containers(Some(running)).await.unwrap().len(), 0);
        assert!(!crate::cri::sandbox_ready(rt.pod_sandbox_status(&sb).await.unwrap().state));
        rt.remove_pod_sandbox(&sb).await.unwrap();
        assert!(rt.list_containers(None).await.unwrap().is_empty());
        assert!(rt.pod_sandbox_status(&sb).await.unwrap_err().is_not_found());
    }

    #[tokio::test]
    async fn start_failures_leave_a_start_error() {
        let rt = FakeRuntime::new();
        rt.add_image("busybox", 1);
        rt.script("bad", [Behavior::FailStart { message: "exec: \"nope\": not found".into() }]);
        let sb = rt.run_pod_sandbox(sandbox_config("p", "u1"), "").await.unwrap();
        let c = rt.create_container(&sb, container_config("bad", "busybox"), sandbox_config("p", "u1")).await.unwrap();
        assert!(rt.start_container(&c).await.is_err());
        let st = rt.container_status(&c).await.unwrap();
        assert_eq!((st.exit_code, st.reason.as_str()), (128, "StartError"));
    }

    #[tokio::test(start_paused = true)]
    async fn latency_and_concurrency_are_measured() {
        let rt = Arc::new(FakeRuntime::new());
        rt.make_pullable("a", 1);
        rt.make_pullable("b", 1);
        rt.set_latency(Method::PullImage, Duration::from_secs(1));
        let (x, y) = tokio::join!(rt.pull_image("a", None, None), rt.pull_image("b", None, None));
        x.unwrap();
        y.unwrap();
        assert_eq!(rt.max_in_flight(Method::PullImage), 2);
    }
}
