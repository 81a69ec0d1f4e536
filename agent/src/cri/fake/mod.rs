//! The test runtime: an in-memory [`RuntimeService`] + [`ImageService`]
//! for unit tests of everything that drives CRI (pod workers, the image
//! manager, garbage collection, log rotation) and for the benches, which
//! measure the agent against it. It is compiled into the crate's own unit
//! tests and, with the `test-util` feature (which the tests crate turns
//! on), into other crates; the product binary never contains it.
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

mod controls;
mod images;
mod runtime;
mod state;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use parking_lot::Mutex;
use tokio::time::Instant;

use super::{CriError, api};

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
    RuntimeConfig,
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
            Method::RuntimeConfig => "RuntimeConfig",
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
    stats: HashMap<String, CannedStats>,
    image_fs: Option<(String, Option<u64>, Option<u64>)>,
    /// RuntimeConfig's answer; None: Unimplemented, as containerd 1.x.
    runtime_config: Option<api::RuntimeConfigResponse>,
    runtime_ready: bool,
    network_ready: bool,
}

/// What ListContainerStats reports for one container.
#[derive(Clone, Copy, Debug, Default)]
struct CannedStats {
    cpu_usage_core_ns: u64,
    memory_working_set_bytes: u64,
    /// The writable layer's used bytes and inodes (None: left out, as a
    /// runtime that does not measure it).
    writable_layer: Option<(u64, u64)>,
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
