//! What a test scripts and asserts on: images (present, pullable, private,
//! failing), container behaviours and exec results, faults and latency per
//! call, readiness, stats, and the call log with its counts and concurrency.

use std::{
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use parking_lot::Mutex;
use tokio::time::Instant;

use super::state::finish;
use super::{Behavior, Call, FakeImage, FakeRuntime, Fault, Method, Pullable, State, fake_digest, normalize};
use crate::cri::api;

impl FakeRuntime {
    pub fn new() -> FakeRuntime {
        let base_wall_ns = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0);
        FakeRuntime {
            state: Mutex::new(State { runtime_ready: true, network_ready: true, ..Default::default() }),
            base_wall_ns,
            base_instant: Instant::now(),
        }
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
        let mut s = self.state.lock();
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
        let mut s = self.state.lock();
        if let Some(i) = s.find_image(name) {
            s.images[i].pinned = pinned;
        }
    }

    /// A pull of `name` succeeds and adds the image (of `size` bytes).
    pub fn make_pullable(&self, name: &str, size: u64) {
        self.state.lock().pullable.insert(normalize(name), Pullable::Ok { size });
    }

    /// A pull of `name` succeeds only with these credentials (a username
    /// and password, or `auth` = base64 of `username:password`); otherwise
    /// it fails as containerd does on a registry's 401.
    pub fn make_private(&self, name: &str, size: u64, username: &str, password: &str) {
        self.state
            .lock()
            .pullable
            .insert(normalize(name), Pullable::Private { size, username: username.into(), password: password.into() });
    }

    /// The image and credentials of every PullImage so far.
    pub fn pull_auths(&self) -> Vec<(String, Option<api::AuthConfig>)> {
        self.state.lock().pull_auths.clone()
    }

    /// A pull of `name` fails with `code` and `message` until scripted
    /// otherwise (containerd answers Unknown for registry errors).
    pub fn set_pull_error(&self, name: &str, code: tonic::Code, message: impl Into<String>) {
        self.state.lock().pullable.insert(normalize(name), Pullable::Err { code, message: message.into() });
    }

    /// Removes an image behind the caller's back (as `ctr images rm` would).
    pub fn delete_image(&self, name: &str) {
        let mut s = self.state.lock();
        if let Some(i) = s.find_image(name) {
            s.images.remove(i);
        }
    }

    /// ImageFsInfo's answer: the mountpoint, used bytes and inodes (None:
    /// the runtime leaves them out). By default: `/fake/imagefs` and the
    /// sum of the images' sizes.
    pub fn set_image_fs(&self, mountpoint: &str, used_bytes: Option<u64>, inodes_used: Option<u64>) {
        self.state.lock().image_fs = Some((mountpoint.to_owned(), used_bytes, inodes_used));
    }

    // ---- scripting: containers ----

    /// What the next containers named `name` do, one behaviour per
    /// CreateContainer; the last one repeats. Unscripted containers run
    /// until stopped.
    pub fn script(&self, name: &str, behaviors: impl IntoIterator<Item = Behavior>) {
        self.state.lock().scripts.insert(name.to_owned(), behaviors.into_iter().collect());
    }

    /// ExecSync in containers named `name` answers with `f(cmd)`; an `Err`
    /// is a failed call. Without a script, exec answers exit code 0.
    pub fn on_exec(
        &self,
        name: &str,
        f: impl Fn(&[String]) -> std::result::Result<api::ExecSyncResponse, (tonic::Code, String)> + Send + Sync + 'static,
    ) {
        self.state.lock().exec.insert(name.to_owned(), Arc::new(f));
    }

    /// ExecSync in containers named `name` exits with `code`.
    pub fn set_exec_exit_code(&self, name: &str, code: i32) {
        self.on_exec(name, move |_| Ok(api::ExecSyncResponse { exit_code: code, ..Default::default() }));
    }

    /// Makes a running container exit now with `code` and `reason` (empty:
    /// Completed/Error by code).
    pub fn exit_container(&self, id: &str, code: i32, reason: &str) {
        let now = self.now_ns();
        let mut s = self.state.lock();
        if let Some(c) = s.containers.get_mut(id)
            && c.state == api::ContainerState::ContainerRunning
        {
            finish(c, now, code, reason);
        }
    }

    /// Sets a container's creation time (ns since the epoch), for garbage
    /// collection orderings.
    pub fn set_created_at(&self, id: &str, created_at_ns: i64) {
        if let Some(c) = self.state.lock().containers.get_mut(id) {
            c.created_at = created_at_ns;
        }
    }

    /// Sets a sandbox's creation time (ns since the epoch).
    pub fn set_sandbox_created_at(&self, id: &str, created_at_ns: i64) {
        if let Some(s) = self.state.lock().sandboxes.get_mut(id) {
            s.created_at = created_at_ns;
        }
    }

    /// ListContainerStats reports these for container `id`.
    pub fn set_stats(&self, id: &str, cpu_usage_core_ns: u64, memory_working_set_bytes: u64) {
        let mut s = self.state.lock();
        let stats = s.stats.entry(id.to_owned()).or_default();
        stats.cpu_usage_core_ns = cpu_usage_core_ns;
        stats.memory_working_set_bytes = memory_working_set_bytes;
    }

    /// ListContainerStats reports this writable layer (used bytes and
    /// inodes) for container `id`, as containerd's snapshotter measures it.
    pub fn set_writable_layer(&self, id: &str, used_bytes: u64, inodes_used: u64) {
        self.state.lock().stats.entry(id.to_owned()).or_default().writable_layer = Some((used_bytes, inodes_used));
    }

    /// What RuntimeConfig answers (the runtime's cgroup driver); None:
    /// Unimplemented, as containerd 1.x (the default).
    pub fn set_runtime_config(&self, answer: Option<api::RuntimeConfigResponse>) {
        self.state.lock().runtime_config = answer;
    }

    /// The runtime's RuntimeReady / NetworkReady conditions.
    pub fn set_ready(&self, runtime: bool, network: bool) {
        let mut s = self.state.lock();
        s.runtime_ready = runtime;
        s.network_ready = network;
    }

    // ---- scripting: faults and latency ----

    pub fn fail(&self, fault: Fault) {
        self.state.lock().faults.push(fault);
    }

    pub fn clear_faults(&self) {
        self.state.lock().faults.clear();
    }

    /// Every call of `method` takes `latency` (tokio time) before it acts.
    pub fn set_latency(&self, method: Method, latency: Duration) {
        self.state.lock().latency.insert(method, latency);
    }

    // ---- inspection ----

    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().calls.clone()
    }

    pub fn count(&self, method: Method) -> usize {
        self.state.lock().calls.iter().filter(|c| c.method == method).count()
    }

    /// Calls of `method` about `target`.
    pub fn count_on(&self, method: Method, target: &str) -> usize {
        self.state.lock().calls.iter().filter(|c| c.method == method && c.target == target).count()
    }

    pub fn clear_calls(&self) {
        self.state.lock().calls.clear();
    }

    /// The most calls of `method` that were in progress at once.
    pub fn max_in_flight(&self, method: Method) -> usize {
        self.state.lock().max_in_flight.get(&method).copied().unwrap_or(0)
    }

    /// Ids of the containers that exist, oldest first.
    pub fn container_ids(&self) -> Vec<String> {
        self.refresh();
        let s = self.state.lock();
        let mut v: Vec<_> = s.containers.values().map(|c| (c.created_at, c.id.clone())).collect();
        v.sort();
        v.into_iter().map(|(_, id)| id).collect()
    }

    pub fn sandbox_ids(&self) -> Vec<String> {
        self.state.lock().sandboxes.keys().cloned().collect()
    }

    /// The stop timeouts StopContainer was given for container `id`.
    pub fn stop_timeouts(&self, id: &str) -> Vec<Duration> {
        self.state.lock().containers.get(id).map(|c| c.stop_timeouts.clone()).unwrap_or_default()
    }

    /// Names (normalized) of every present image.
    pub fn image_names(&self) -> Vec<String> {
        self.state.lock().images.iter().flat_map(|i| i.tags.clone()).collect()
    }

    pub fn has_image(&self, name: &str) -> bool {
        self.state.lock().find_image(name).is_some()
    }
}
