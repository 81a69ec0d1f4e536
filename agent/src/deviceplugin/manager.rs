//! The device manager: registered plugins, their devices, the pods'
//! devices and the checkpoint, behind [`PodDeviceAllocator`] for the pod
//! side and a watch of [`ExtendedResources`] for node status.
//!
//! `DeviceManager::new(root_dir)` reads the checkpoint (resources it names
//! start with no devices until their plugin registers again, as in the
//! kubelet); `start(shutdown)` cleans the directory, serves Registration
//! and expires plugins gone for too long.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    sync::{Arc, Weak},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;
use tokio::{
    sync::{Notify, watch},
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{
    CHECKPOINT_FILE, KUBELET_SOCKET,
    allocation::{self, Assignments},
    api,
    checkpoint::{self, Checkpoint},
    container::{self, DeviceRunOptions},
    devices::{ExtendedResources, Registry},
    endpoint::PluginClient,
    plugin_dir,
    registration::{self, Registrar},
};

/// How often stopped plugins are checked for expiry.
const EXPIRY_CHECK: Duration = Duration::from_secs(10);

/// What the pod side asks of the device manager.
#[async_trait::async_trait]
pub trait PodDeviceAllocator: Send + Sync {
    /// Admission: gives the pod's containers their devices, or says why
    /// it cannot (the kubelet's text; the pod fails with
    /// UnexpectedAdmissionError). With `keep`, the devices of every other
    /// pod not in it are freed first (pods no longer active).
    fn admit(&self, pod: &Pod, keep: Option<&BTreeSet<String>>) -> Result<(), String>;
    /// Container creation: what the container's devices add to its config
    /// (None: it has none). Calls Allocate once per container and
    /// PreStartContainer when the plugin asks for it.
    async fn container_options(&self, pod: &Pod, container: &str) -> Result<Option<DeviceRunOptions>, String>;
    /// The pod is gone: its devices are free.
    fn pod_removed(&self, uid: &str);
}

struct Plugin {
    generation: u64,
    client: PluginClient,
    options: api::DevicePluginOptions,
    /// Ends the ListAndWatch loop of a replaced plugin.
    cancel: Arc<Notify>,
}

#[derive(Default)]
struct State {
    registry: Registry,
    assignments: Assignments,
    plugins: BTreeMap<String, Plugin>,
    generation: u64,
}

pub struct DeviceManager {
    dir: PathBuf,
    state: Mutex<State>,
    published: watch::Sender<ExtendedResources>,
    this: Weak<DeviceManager>,
}

impl DeviceManager {
    /// The manager for `<root_dir>/device-plugins`, with what its
    /// checkpoint holds (an unreadable checkpoint is logged and ignored,
    /// as the kubelet does).
    pub fn new(root_dir: &std::path::Path) -> Arc<DeviceManager> {
        let dir = plugin_dir(root_dir);
        let mut state = State::default();
        match checkpoint::load(&dir.join(CHECKPOINT_FILE)) {
            Ok(c) => {
                let now = Instant::now();
                for resource in c.registered.keys().chain(c.assignments.resources().iter()) {
                    state.registry.restored(resource, now);
                }
                state.assignments = c.assignments;
            }
            Err(e) => warn!("device manager: continuing without the checkpoint: {e}"),
        }
        let published = watch::channel(state.registry.extended_resources()).0;
        Arc::new_cyclic(|this| DeviceManager { dir, state: Mutex::new(state), published, this: this.clone() })
    }

    /// The device plugin directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Capacity and allocatable of the device plugin resources, for node
    /// status; changes as plugins come, go and report health.
    pub fn extended_resources(&self) -> watch::Receiver<ExtendedResources> {
        self.published.subscribe()
    }

    /// Device ids per container of a pod, per resource (for tests and
    /// debugging).
    pub fn pod_devices(&self, uid: &str) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
        let st = self.state.lock();
        st.assignments
            .pods
            .get(uid)
            .map(|cs| {
                cs.iter()
                    .map(|(c, rs)| (c.clone(), rs.iter().map(|(r, d)| (r.clone(), d.ids.clone())).collect()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Publishes the node status figures and writes the checkpoint.
    fn changed(&self, st: &State) {
        let now = st.registry.extended_resources();
        self.published.send_if_modified(|p| {
            let differs = *p != now;
            *p = now;
            differs
        });
        let c = Checkpoint { assignments: st.assignments.clone(), registered: st.registry.all_devices() };
        if let Err(e) = checkpoint::save(&self.dir.join(CHECKPOINT_FILE), &c) {
            warn!("device manager: {e}");
        }
    }

    /// Cleans the directory and serves Registration on its kubelet.sock
    /// until `shutdown`.
    pub fn start(&self, shutdown: CancellationToken) -> std::io::Result<JoinHandle<()>> {
        let ctx = |what: &str, e: std::io::Error| {
            std::io::Error::new(e.kind(), format!("{what} {}: {e}", self.dir.display()))
        };
        std::fs::create_dir_all(&self.dir).map_err(|e| ctx("cannot create", e))?;
        let removed = registration::remove_stale(&self.dir).map_err(|e| ctx("cannot clean", e))?;
        if !removed.is_empty() {
            info!(files = ?removed, "device manager: removed stale sockets");
        }
        let socket = self.dir.join(KUBELET_SOCKET);
        let listener = tokio::net::UnixListener::bind(&socket).map_err(|e| ctx("cannot listen in", e))?;
        info!(socket = %socket.display(), "device plugin registration served");
        let registrar: Arc<dyn Registrar> = Arc::new(Handle(self.this.clone()));
        let this = self.this.clone();
        Ok(tokio::spawn(async move {
            let stop = shutdown.clone();
            let server = registration::serve(listener, registrar, async move {
                let _ = stop.cancelled().await;
            });
            let expiry = async {
                let mut tick = tokio::time::interval(EXPIRY_CHECK);
                loop {
                    tick.tick().await;
                    let Some(m) = this.upgrade() else { return };
                    let st = &mut *m.state.lock();
                    if st.registry.expire(Instant::now()) {
                        info!("device manager: resources of plugins gone for 5 minutes removed");
                        m.changed(st);
                    }
                }
            };
            tokio::select! {
                r = server => if let Err(e) = r { warn!("device plugin registration server: {e}") },
                _ = expiry => {}
                _ = shutdown.cancelled() => {}
            }
        }))
    }

    /// Dials a registered plugin and follows its devices until its stream
    /// ends or another registration replaces it.
    async fn run_plugin(self: Arc<Self>, request: api::RegisterRequest) {
        let resource = request.resource_name.clone();
        let socket = self.dir.join(&request.endpoint);
        let connected = async {
            let client = PluginClient::dial(&socket).await?;
            let options = client.options().await?;
            let stream = client.list_and_watch().await?;
            Ok::<_, String>((client, options, stream))
        };
        let (client, options, mut stream) = match connected.await {
            Ok(c) => c,
            Err(e) => {
                warn!(resource, "device plugin not usable: {e}");
                return;
            }
        };
        let cancel = Arc::new(Notify::new());
        let generation = {
            let st = &mut *self.state.lock();
            st.generation += 1;
            let generation = st.generation;
            let plugin = Plugin { generation, client, options, cancel: cancel.clone() };
            if let Some(old) = st.plugins.insert(resource.clone(), plugin) {
                old.cancel.notify_one();
            }
            st.registry.registered(&resource);
            self.changed(st);
            generation
        };
        info!(resource, endpoint = %socket.display(), "device plugin registered");
        let ended = loop {
            let next = tokio::select! {
                m = stream.message() => m,
                _ = cancel.notified() => return,
            };
            match next {
                Ok(Some(list)) => {
                    let st = &mut *self.state.lock();
                    if st.plugins.get(&resource).is_none_or(|p| p.generation != generation) {
                        return;
                    }
                    st.registry.update(&resource, &list.devices);
                    self.changed(st);
                }
                Ok(None) => break "the stream ended".to_owned(),
                Err(s) => break format!("{}: {}", s.code(), s.message()),
            }
        };
        let st = &mut *self.state.lock();
        if st.plugins.get(&resource).is_some_and(|p| p.generation == generation) {
            warn!(resource, "device plugin ListAndWatch: {ended}; its devices are unhealthy until it registers again");
            st.plugins.remove(&resource);
            st.registry.stopped(&resource, Instant::now());
            self.changed(st);
        }
    }
}

struct Handle(Weak<DeviceManager>);

impl Registrar for Handle {
    fn register(&self, request: api::RegisterRequest) {
        if let Some(m) = self.0.upgrade() {
            tokio::spawn(m.run_plugin(request));
        }
    }
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

#[async_trait::async_trait]
impl PodDeviceAllocator for DeviceManager {
    fn admit(&self, pod: &Pod, keep: Option<&BTreeSet<String>>) -> Result<(), String> {
        let id = uid(pod);
        let st = &mut *self.state.lock();
        let mut changed = false;
        if let Some(keep) = keep {
            let mut keep = keep.clone();
            keep.insert(id.clone());
            changed = st.assignments.retain_pods(&keep);
        }
        let held = st.assignments.resources();
        let requests = allocation::requests(pod, |r| st.registry.knows(r) || held.contains(r));
        let result = requests.and_then(|requests| {
            if requests.is_empty() {
                return Ok(());
            }
            let mut next = st.assignments.clone();
            allocation::allocate(&mut next, &id, &requests, |r| st.registry.healthy(r))?;
            if next != st.assignments {
                st.assignments = next;
                changed = true;
            }
            Ok(())
        });
        if changed {
            self.changed(st);
        }
        result.map_err(|e| e.to_string())
    }

    async fn container_options(&self, pod: &Pod, name: &str) -> Result<Option<DeviceRunOptions>, String> {
        let id = uid(pod);
        type Work = (String, Vec<String>, Option<api::ContainerAllocateResponse>, Option<(PluginClient, bool)>);
        let work: Vec<Work> = {
            let st = self.state.lock();
            let Some(resources) = st.assignments.container(&id, name) else { return Ok(None) };
            resources
                .iter()
                .map(|(r, d)| {
                    let plugin = st.plugins.get(r).map(|p| (p.client.clone(), p.options.pre_start_required));
                    (r.clone(), d.ids.iter().cloned().collect(), d.response.clone(), plugin)
                })
                .collect()
        };
        let mut answers = vec![];
        for (resource, ids, cached, plugin) in work {
            let response = match cached {
                Some(r) => r,
                None => {
                    let Some((client, _)) = &plugin else {
                        return Err(format!("no device plugin is registered for {resource}"));
                    };
                    let r = client.allocate(ids.clone()).await.map_err(|e| format!("{resource}: {e}"))?;
                    let st = &mut *self.state.lock();
                    if let Some(d) = st
                        .assignments
                        .pods
                        .get_mut(&id)
                        .and_then(|cs| cs.get_mut(name))
                        .and_then(|rs| rs.get_mut(&resource))
                    {
                        d.response = Some(r.clone());
                    }
                    self.changed(st);
                    r
                }
            };
            if let Some((client, true)) = &plugin {
                client.pre_start(ids).await.map_err(|e| format!("{resource}: {e}"))?;
            }
            answers.push((resource, response));
        }
        let options = container::run_options(answers.iter().map(|(r, a)| (r.as_str(), a)));
        for c in &options.conflicts {
            warn!(pod = id, container = name, "device plugin settings: {c}; kept the first");
        }
        Ok(Some(options))
    }

    fn pod_removed(&self, uid: &str) {
        let st = &mut *self.state.lock();
        if st.assignments.pods.remove(uid).is_some() {
            self.changed(st);
        }
    }
}
