//! Storage in the fake API server: what the API server does to PVs, PVCs,
//! StorageClasses and CSIDrivers on the way in ([`admission`]), how
//! kubectl prints them ([`printers`]), and the control-plane controllers
//! that act on them, as far as a kubelet can tell them from the real ones:
//!
//! | module | the real component |
//! |---|---|
//! | [`binder`] | kube-controller-manager's PV controller: binding, Released, reclaim |
//! | [`provisioner`] | the external-provisioner: CreateVolume / DeleteVolume |
//! | [`attacher`] | the attach-detach controller and the external-attacher |
//! | [`resizer`] | the external-resizer: ControllerExpandVolume |
//! | [`ephemeral`] | the ephemeral volume controller, and the garbage collector's part for its claims |
//!
//! They run on their own thread and runtime once
//! [`FakeApiServer::start_storage_controllers`](super::FakeApiServer::start_storage_controllers)
//! is called, until the server is dropped: a pass over every object on
//! each change in the store and every [`StorageOptions::resync`]. Driver
//! calls run as operations of their own, one at a time per object,
//! retried with back-off; their errors go where the real components write
//! them (events, VolumeAttachment status), never a panic. They read and
//! write the store directly, so they keep working while the server is
//! stopped (an API server outage is not theirs).

pub mod admission;
mod attacher;
mod binder;
mod csi;
mod ephemeral;
mod events;
pub mod objects;
mod ops;
pub(crate) mod printers;
mod provisioner;
pub mod quantity;
mod resizer;

#[cfg(test)]
mod tests;

pub use attacher::{attachment_name, unique_name};

use std::{
    collections::HashMap,
    future::Future,
    path::Path,
    sync::{Arc, Mutex},
    thread,
    time::Duration,
};

use serde_json::Value;
use tokio::sync::{Notify, broadcast, oneshot};

use self::objects::{deleting, name, namespace, pod_active, pod_claims, s};
use super::{
    resources::{CSIDRIVERS, CSINODES, NODES, PODS, PVCS, PVS, ResourceType, STORAGE_CLASSES, VOLUME_ATTACHMENTS},
    server::State,
    store::{ApiError, Store},
};

#[derive(Clone, Debug)]
pub struct StorageOptions {
    /// How often every object is looked at again without a change (the
    /// controllers also react to each change at once).
    pub resync: Duration,
}

impl Default for StorageOptions {
    fn default() -> Self {
        StorageOptions { resync: Duration::from_millis(250) }
    }
}

/// The storage side of a [`FakeApiServer`](super::FakeApiServer): the
/// drivers added, and the controllers once started.
#[derive(Default)]
pub(crate) struct Storage {
    drivers: Arc<csi::Drivers>,
    running: Mutex<Option<Running>>,
}

struct Running {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Storage {
    pub(crate) fn add_driver(&self, driver: &str, socket: &Path) {
        self.drivers.add(driver, socket);
    }

    /// Starts the controllers (again with new options when running).
    pub(crate) fn start(&self, state: Arc<State>, opts: StorageOptions) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        // The old ones stop first: two sets would race each other.
        running.take();
        let ctx = Arc::new(Ctx {
            state,
            drivers: self.drivers.clone(),
            ops: ops::Ops::default(),
            events: events::Recorder::default(),
            kick: Notify::new(),
            identity: format!(
                "{}-{}",
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis(),
                std::process::id() % 10_000
            ),
        });
        let (stop_tx, stop_rx) = oneshot::channel();
        let spawned = thread::Builder::new().name("fake-storage".into()).spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "storage controllers: no runtime");
                    return;
                }
            };
            rt.block_on(run(ctx, opts.resync, stop_rx));
        });
        match spawned {
            Ok(t) => *running = Some(Running { stop: Some(stop_tx), thread: Some(t) }),
            Err(e) => tracing::error!(error = %e, "storage controllers: cannot start their thread"),
        }
    }
}

/// What every controller works with.
pub(crate) struct Ctx {
    state: Arc<State>,
    drivers: Arc<csi::Drivers>,
    ops: ops::Ops,
    events: events::Recorder,
    /// Runs a pass at once (an operation ended).
    kick: Notify,
    /// The provisioner's identity, in the PVs it makes.
    identity: String,
}

impl Ctx {
    fn store(&self) -> &Store {
        &self.state.store
    }

    fn event(&self, obj: &Value, kind: &str, reason: &str, message: &str, component: &str) {
        self.events.record(self.store(), obj, kind, reason, message, component);
    }

    /// Reads the object, lets `edit` change it (false: nothing to write;
    /// it may also set `abort`), and writes it on the version it read,
    /// again on a conflict. Returns the object as stored after.
    fn modify(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        mut edit: impl FnMut(&mut Value) -> bool,
    ) -> Result<Value, ApiError> {
        for _ in 0..5 {
            let mut obj = self.store().get(rt, ns, name)?;
            if !edit(&mut obj) {
                return Ok(obj);
            }
            match self.store().update(rt, ns, name, obj, |_, _| {}) {
                Err(e) if e.code == 409 => continue,
                other => return other,
            }
        }
        Err(ApiError::conflict(rt, name, "too many concurrent writes"))
    }

    /// Runs `op` as the operation `key` unless it is running or backing
    /// off; `op` answers whether it succeeded.
    fn spawn(self: &Arc<Self>, key: String, op: impl Future<Output = bool> + Send + 'static) {
        if !self.ops.try_start(&key) {
            return;
        }
        let ctx = self.clone();
        tokio::spawn(async move {
            let ok = op.await;
            ctx.ops.finish(&key, ok);
            ctx.kick.notify_one();
        });
    }
}

/// The objects one pass looks at.
pub(crate) struct Snapshot {
    pvcs: Vec<Value>,
    pvs: Vec<Value>,
    classes: HashMap<String, Value>,
    pods: Vec<Value>,
    nodes: HashMap<String, Value>,
    csidrivers: HashMap<String, Value>,
    vas: Vec<Value>,
}

fn by_name(items: Vec<Value>) -> HashMap<String, Value> {
    items.into_iter().map(|o| (name(&o).to_owned(), o)).collect()
}

impl Snapshot {
    fn take(store: &Store) -> Snapshot {
        Snapshot {
            pods: store.list(&PODS, None).0,
            pvcs: store.list(&PVCS, None).0,
            pvs: store.list(&PVS, None).0,
            classes: by_name(store.list(&STORAGE_CLASSES, None).0),
            nodes: by_name(store.list(&NODES, None).0),
            csidrivers: by_name(store.list(&CSIDRIVERS, None).0),
            vas: store.list(&VOLUME_ATTACHMENTS, None).0,
        }
    }

    fn pvc(&self, ns: &str, n: &str) -> Option<&Value> {
        self.pvcs.iter().find(|c| namespace(c) == ns && name(c) == n)
    }

    fn pv(&self, n: &str) -> Option<&Value> {
        self.pvs.iter().find(|v| name(v) == n)
    }

    /// The node of a running pod that uses the claim (the scheduler's
    /// choice, for WaitForFirstConsumer).
    fn consumer_node(&self, pvc: &Value) -> Option<String> {
        self.pods
            .iter()
            .filter(|p| namespace(p) == namespace(pvc) && pod_active(p) && !deleting(p))
            .filter(|p| !s(p, "/spec/nodeName").is_empty())
            .find(|p| pod_claims(p).iter().any(|c| c == name(pvc)))
            .map(|p| s(p, "/spec/nodeName").to_owned())
    }
}

/// The resources whose changes the controllers act on.
fn relevant(resource: &str) -> bool {
    [PODS, NODES, PVCS, PVS, STORAGE_CLASSES, CSIDRIVERS, CSINODES, VOLUME_ATTACHMENTS]
        .iter()
        .any(|r| r.key() == resource)
}

fn sync_all(ctx: &Arc<Ctx>) {
    let snap = Snapshot::take(ctx.store());
    ephemeral::sync(ctx, &snap);
    binder::sync(ctx, &snap);
    attacher::sync(ctx, &snap);
    resizer::sync(ctx, &snap);
}

async fn run(ctx: Arc<Ctx>, resync: Duration, mut stop: oneshot::Receiver<()>) {
    let mut changes = ctx.store().subscribe();
    let mut tick = tokio::time::interval(resync.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        sync_all(&ctx);
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = tick.tick() => break,
                _ = ctx.kick.notified() => break,
                c = changes.recv() => match c {
                    Ok(c) if relevant(&c.resource) => break,
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => break,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            }
        }
        // A burst of changes is one pass.
        tokio::time::sleep(Duration::from_millis(5)).await;
        while let Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) = changes.try_recv() {}
    }
}
