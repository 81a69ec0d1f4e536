//! The plugin watcher's loop: rescan the directory (at once on an inotify
//! event, else every second), reconcile, run the operations (each in its
//! own task, so a plugin that does not answer holds up no other), and keep
//! what is registered readable for metrics and debugging.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use parking_lot::{Mutex, RwLock};
use tokio::task::{Id, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    PluginHandler, PluginManagerCollector,
    fswatch::TreeWatch,
    operation::{self, Handlers, RegisterResult},
    reconciler::{Op, RETRY_POLICY, Reconciler},
    scan::{self, Stamp},
};
use crate::flowcontrol::BackoffPolicy;

/// How often the directory is rescanned and the states reconciled without
/// an inotify event (the kubelet's reconciler period).
pub const RECONCILE_PERIOD: Duration = Duration::from_secs(1);
/// A socket event is followed shortly by the plugin's listen(2): wait a
/// little before dialing it.
const SETTLE: Duration = Duration::from_millis(50);

/// A plugin registered, for metrics and debugging.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginEntry {
    pub plugin_type: String,
    pub name: String,
    pub endpoint: PathBuf,
    /// Its registration socket.
    pub socket: PathBuf,
}

#[derive(Default)]
struct View {
    sockets: Vec<PathBuf>,
    plugins: Vec<PluginEntry>,
}

pub struct PluginWatcher {
    dir: PathBuf,
    handlers: RwLock<Handlers>,
    view: Mutex<View>,
    policy: BackoffPolicy,
}

/// What an operation task reports.
enum Done {
    Registered { socket: PathBuf, stamp: Stamp, result: RegisterResult },
    Deregistered { socket: PathBuf, name: String },
}

impl PluginWatcher {
    /// A watcher of `dir` (`registry_dir(root_dir)`); nothing happens until
    /// [`PluginWatcher::run`].
    pub fn new(dir: impl Into<PathBuf>) -> PluginWatcher {
        PluginWatcher {
            dir: dir.into(),
            handlers: RwLock::new(HashMap::new()),
            view: Mutex::new(View::default()),
            policy: RETRY_POLICY,
        }
    }

    /// The same with another retry back-off (tests).
    pub fn with_backoff(mut self, policy: BackoffPolicy) -> PluginWatcher {
        self.policy = policy;
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Hands the plugins whose `PluginInfo.type` is `plugin_type` to
    /// `handler` (replacing any handler of that type). May be called while
    /// running: operations started afterwards use it.
    pub fn add_handler(&self, plugin_type: &str, handler: Arc<dyn PluginHandler>) {
        self.handlers.write().insert(plugin_type.to_owned(), handler);
    }

    /// The plugins registered, by socket.
    pub fn plugins(&self) -> Vec<PluginEntry> {
        self.view.lock().plugins.clone()
    }

    /// The registration sockets found on disk.
    pub fn sockets(&self) -> Vec<PathBuf> {
        self.view.lock().sockets.clone()
    }

    /// `plugin_manager_total_plugins`, for the agent's registry.
    pub fn collector(self: &Arc<Self>) -> PluginManagerCollector {
        PluginManagerCollector(self.clone())
    }

    fn publish(&self, r: &Reconciler) {
        let mut v = self.view.lock();
        v.sockets = r.desired().map(Path::to_path_buf).collect();
        v.plugins = r
            .actual()
            .map(|p| PluginEntry {
                plugin_type: p.plugin_type.clone(),
                name: p.name.clone(),
                endpoint: p.endpoint.clone(),
                socket: p.socket.clone(),
            })
            .collect();
    }

    /// Reads the directory into the reconciler; makes it again if it went
    /// away. Errors are logged when they change.
    fn rescan(&self, r: &mut Reconciler, watch: &mut Option<TreeWatch>, last_error: &mut Option<String>) {
        let mut found = scan::scan(&self.dir);
        if matches!(&found, Err(e) if e.kind() == std::io::ErrorKind::NotFound) {
            if let Err(e) = scan::ensure_dir(&self.dir) {
                found = Err(e);
            } else {
                found = scan::scan(&self.dir);
            }
        }
        match found {
            Ok(s) => {
                if let Some(w) = watch {
                    w.watch(&s.dirs);
                }
                r.set_desired(s.sockets);
                *last_error = None;
            }
            Err(e) => {
                let msg = e.to_string();
                if last_error.as_deref() != Some(msg.as_str()) {
                    warn!(dir = %self.dir.display(), "plugin watcher: cannot read the registration directory: {msg}");
                }
                *last_error = Some(msg);
                r.set_desired(Default::default());
            }
        }
    }

    fn start(&self, op: Op, ops: &mut JoinSet<Done>, running: &mut HashMap<Id, PathBuf>) {
        let handlers = self.handlers.read().clone();
        let socket = op.socket().to_path_buf();
        let handle = match op {
            Op::Register { socket, stamp } => ops.spawn(async move {
                let result = operation::register(&socket, stamp, &handlers).await;
                Done::Registered { socket, stamp, result }
            }),
            Op::Deregister(plugin) => ops.spawn(async move {
                operation::deregister(&plugin, &handlers).await;
                Done::Deregistered { socket: plugin.socket, name: plugin.name }
            }),
        };
        running.insert(handle.id(), socket);
    }

    fn finish(r: &mut Reconciler, done: Done, now: Instant) {
        match done {
            Done::Registered { socket, stamp, result } => {
                let plugin = result.as_ref().ok().map(|(p, _)| p.clone());
                let message = r.registered(&socket, stamp, result, now);
                match (plugin, message) {
                    (Some(p), warning) => {
                        info!(plugin = p.name, kind = p.plugin_type, endpoint = %p.endpoint.display(), socket = %socket.display(), "plugin registered");
                        if let Some(w) = warning {
                            warn!("{w}");
                        }
                    }
                    (None, Some(e)) => warn!(socket = %socket.display(), "plugin registration failed (retrying): {e}"),
                    (None, None) => debug!(socket = %socket.display(), "plugin registration failed again"),
                }
            }
            Done::Deregistered { socket, name } => {
                info!(plugin = name, socket = %socket.display(), "plugin deregistered");
                r.deregistered(&socket);
            }
        }
    }

    /// Watches until `shutdown`. Plugins stay registered when it stops (as
    /// the kubelet's: a restarted agent finds their sockets again).
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        if let Err(e) = scan::ensure_dir(&self.dir) {
            warn!(dir = %self.dir.display(), "plugin watcher: cannot create the registration directory: {e}");
        }
        let mut watch = match TreeWatch::new() {
            Ok(w) => Some(w),
            Err(e) => {
                warn!("plugin watcher: no inotify ({e}); rescanning every {RECONCILE_PERIOD:?}");
                None
            }
        };
        info!(dir = %self.dir.display(), "plugin watcher started");
        let mut r = Reconciler::new(self.policy);
        let mut ops: JoinSet<Done> = JoinSet::new();
        let mut running: HashMap<Id, PathBuf> = HashMap::new();
        let mut scan_error = None;
        loop {
            self.rescan(&mut r, &mut watch, &mut scan_error);
            let now = Instant::now();
            for op in r.next(now) {
                self.start(op, &mut ops, &mut running);
            }
            self.publish(&r);
            let wait = r.next_retry(now).map_or(RECONCILE_PERIOD, |t| t - now).min(RECONCILE_PERIOD);
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(joined) = ops.join_next_with_id() => match joined {
                    Ok((id, done)) => {
                        running.remove(&id);
                        Self::finish(&mut r, done, Instant::now());
                    }
                    Err(e) => {
                        if let Some(socket) = running.remove(&e.id()) {
                            warn!(socket = %socket.display(), "plugin operation ended abnormally: {e}");
                            r.abandoned(&socket, Instant::now());
                        }
                    }
                },
                res = async { match &mut watch { Some(w) => w.wait().await, None => std::future::pending().await } } => {
                    if let Err(e) = res {
                        warn!("plugin watcher: inotify failed ({e}); rescanning every {RECONCILE_PERIOD:?}");
                        watch = None;
                    }
                    tokio::time::sleep(SETTLE).await;
                }
                _ = tokio::time::sleep(wait) => {}
            }
        }
        ops.shutdown().await;
        info!("plugin watcher stopped");
    }
}
