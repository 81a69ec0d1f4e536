//! The Node object: registration, status and the Lease, as the kubelet
//! keeps them.
//!
//! Every nodeStatusUpdateFrequency (and at once when a pressure condition
//! changes) the status loop reads the runtime (version, readiness,
//! images), computes the status (`status::node_status`, pure) from the
//! Node the API server holds, and patches `nodes/<name>/status` when it
//! changed or nodeStatusReportFrequency has passed; pressure taints follow
//! the conditions. Condition transitions are recorded as node events.

pub mod info;
pub mod lease;
pub mod registration;
pub mod status;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::{api::core::v1::Node, jiff::Timestamp};
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use self::{
    registration::Registration,
    status::{MachineInfo, NodeFacts},
};
use crate::{
    cm::allocatable::{NodeAllocatable, ResourceList},
    config::{Config, format_quantity},
    cri::{ImageService, RuntimeService},
    events::{EventRecorder, EventType, node_ref},
    eviction::signal::NodeCondition,
    smp,
};

/// The version node status reports for swiftlet (kubectl's VERSION): the
/// Kubernetes release it stands in for, see [`crate::version`].
pub fn kubelet_version() -> String {
    crate::version::kubelet_version()
}

/// The node's settings, from the configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSettings {
    pub registration: Registration,
    pub register: bool,
    pub node_ips: Vec<IpAddr>,
    pub port: u16,
    pub lease_duration_seconds: u32,
    pub max_images: i32,
    pub capacity: BTreeMap<String, String>,
    pub allocatable: BTreeMap<String, String>,
}

/// Capacity and allocatable as node status names and prints them.
pub fn resource_strings(list: &ResourceList) -> BTreeMap<String, String> {
    list.iter().filter_map(|(r, q)| r.status_name().map(|n| (n.to_owned(), format_quantity(q)))).collect()
}

impl NodeSettings {
    pub fn from_config(config: &Config, node_name: &str, allocatable: &NodeAllocatable) -> NodeSettings {
        let k = &config.kubelet;
        let machine = info::machine_info();
        NodeSettings {
            registration: Registration {
                node_name: node_name.into(),
                hostname: node_name.to_lowercase(),
                os: machine.operating_system.clone(),
                arch: machine.architecture.clone(),
                labels: config.flags.node_labels.clone(),
                taints: crate::cloudprovider::registration_taints(config),
                provider_id: k.provider_id.clone(),
            },
            register: k.register_node,
            node_ips: config.flags.node_ip.clone(),
            port: k.port,
            lease_duration_seconds: k.node_lease_duration_seconds,
            max_images: k.node_status_max_images,
            capacity: resource_strings(&allocatable.capacity),
            allocatable: resource_strings(&allocatable.allocatable),
        }
    }
}

/// Where the pressure conditions come from: connected once the eviction
/// manager exists (none: no pressure).
pub type PressureSource = watch::Receiver<Option<watch::Receiver<BTreeSet<NodeCondition>>>>;

/// What the status loop reads.
pub struct NodeInputs {
    pub runtime: Arc<dyn RuntimeService>,
    pub images: Arc<dyn ImageService>,
    pub pressure: PressureSource,
    /// The graceful node shutdown's phase, once connected: anything but
    /// Idle makes the node NotReady ("node is shutting down").
    pub shutdown: ShutdownSource,
    /// The node status update and report frequencies, which a SIGHUP
    /// reload may change while the loop runs.
    pub frequencies: watch::Receiver<crate::reload::LiveSettings>,
    /// The device manager's capacity and allocatable, once connected.
    pub devices: DevicesSource,
    /// The volume manager's attachable volumes in use, once connected.
    pub volumes_in_use: VolumesSource,
}

pub type VolumesSource = watch::Receiver<Option<watch::Receiver<Vec<String>>>>;

pub type DevicesSource = watch::Receiver<Option<watch::Receiver<crate::deviceplugin::devices::ExtendedResources>>>;

pub type ShutdownSource = watch::Receiver<Option<watch::Receiver<crate::shutdown::Phase>>>;

/// Registration and the status loop.
pub struct NodeAgent {
    pub settings: NodeSettings,
    machine: MachineInfo,
    recorder: Arc<dyn EventRecorder>,
    node_uid: watch::Sender<Option<String>>,
}

/// The status round's clock; a round that overran is not caught up
/// (the next one is a full period later), like the kubelet's wait.Until.
fn status_ticker(every: Duration) -> tokio::time::Interval {
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}

const CALL_TIMEOUT: Duration = Duration::from_secs(10);
const RUNTIME_TIMEOUT: Duration = Duration::from_secs(5);

/// Runtime facts kept between rounds (a failed call keeps the last).
#[derive(Default)]
struct RuntimeFacts {
    version: String,
    images: Vec<k8s_openapi::api::core::v1::ContainerImage>,
}

impl NodeAgent {
    pub fn new(settings: NodeSettings, recorder: Arc<dyn EventRecorder>) -> NodeAgent {
        NodeAgent { settings, machine: info::machine_info(), recorder, node_uid: watch::channel(None).0 }
    }

    /// The Node's uid once it is registered (or found).
    pub fn node_uid(&self) -> watch::Receiver<Option<String>> {
        self.node_uid.subscribe()
    }

    fn name(&self) -> &str {
        &self.settings.registration.node_name
    }

    async fn facts(
        &self,
        inputs: &NodeInputs,
        kept: &mut RuntimeFacts,
        pressure: BTreeSet<NodeCondition>,
        extended: crate::deviceplugin::devices::ExtendedResources,
        volumes_in_use: Vec<String>,
    ) -> NodeFacts {
        let s = &self.settings;
        if let Ok(Ok(v)) = tokio::time::timeout(RUNTIME_TIMEOUT, inputs.runtime.version()).await {
            kept.version = format!("{}://{}", v.runtime_name, v.runtime_version);
        }
        let status = tokio::time::timeout(RUNTIME_TIMEOUT, inputs.runtime.status()).await.ok().and_then(Result::ok);
        if let Ok(Ok(images)) = tokio::time::timeout(RUNTIME_TIMEOUT, inputs.images.list_images()).await {
            kept.images = status::images_for_status(&images, s.max_images);
        }
        // A reload that changed evictionHard (or what else allocatable is
        // computed from) replaces the start-time figures.
        let allocatable = inputs.frequencies.borrow().allocatable.clone().unwrap_or_else(|| s.allocatable.clone());
        NodeFacts {
            capacity: s.capacity.clone(),
            allocatable,
            pressure,
            runtime_version: kept.version.clone(),
            runtime_errors: {
                let mut errs = status::runtime_errors(status.as_ref().and_then(|s| s.status.as_ref()));
                let phase = inputs.shutdown.borrow().as_ref().map(|p| *p.borrow());
                if phase.is_some_and(|p| p != crate::shutdown::Phase::Idle) {
                    errs.push(crate::shutdown::NOT_READY_MESSAGE.into());
                }
                errs
            },
            runtime_handlers: status.as_ref().map(status::runtime_handlers).unwrap_or_default(),
            supplemental_groups_policy: status
                .as_ref()
                .and_then(|s| s.features.as_ref())
                .is_some_and(|f| f.supplemental_groups_policy),
            addresses: info::node_addresses(&s.node_ips, &s.registration.hostname),
            machine: self.machine.clone(),
            kubelet_version: kubelet_version(),
            kubelet_port: i32::from(s.port),
            images: kept.images.clone(),
            extended,
            volumes_in_use,
        }
    }

    fn record(&self, events: &[status::NodeEvent]) {
        let r = node_ref(self.name());
        for e in events {
            self.recorder.record(&r, EventType::Normal, e, &format!("Node {} status is now: {e}", self.name()));
        }
    }

    /// Creates the Node, or adopts the one with this name.
    async fn register(&self, api: &kube::Api<Node>, facts: &NodeFacts) -> Result<Node, kube::Error> {
        let (status, events) = status::node_status(None, facts, Timestamp::now());
        let wanted = registration::initial_node(&self.settings.registration, status);
        match api.create(&PostParams::default(), &wanted).await {
            Ok(n) => {
                info!(node = self.name(), "node registered");
                self.record(&events);
                Ok(n)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = api.get(self.name()).await?;
                info!(node = self.name(), "a Node with this name exists: adopting it");
                match registration::adoption_patch(&existing, &wanted) {
                    Some(p) => api.patch(self.name(), &PatchParams::default(), &Patch::Merge(&p)).await,
                    None => Ok(existing),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// One status round against the Node the API server has. Returns the
    /// Node (None when it does not exist).
    async fn sync_status(
        &self,
        api: &kube::Api<Node>,
        facts: &NodeFacts,
        last_report: &mut Option<Instant>,
        report_every: Duration,
    ) -> Result<Option<Node>, kube::Error> {
        let Some(node) = api.get_opt(self.name()).await? else {
            return Ok(None);
        };
        let mut rv = node.metadata.resource_version.clone();
        let old = node.status.clone().unwrap_or_default();
        let (new, events) = status::node_status(Some(&old), facts, Timestamp::now());
        let changed = status::status_changed(&old, &new);
        if status::should_report(changed, last_report.map(|t| t.elapsed()), report_every) {
            let old_v = serde_json::to_value(&old).unwrap_or_default();
            let new_v = serde_json::to_value(&new).unwrap_or_default();
            if let Some(d) = smp::diff(&old_v, &new_v) {
                let patched = api
                    .patch_status(self.name(), &PatchParams::default(), &Patch::Strategic(json!({"status": d})))
                    .await?;
                rv = patched.metadata.resource_version.clone();
                debug!(node = self.name(), changed, "node status sent");
            }
            *last_report = Some(Instant::now());
            self.record(&events);
        }
        let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        if let Some(t) = status::pressure_taints(&taints, &facts.pressure) {
            let p: Value = json!({"metadata": {"resourceVersion": rv}, "spec": {"taints": t}});
            match api.patch(self.name(), &PatchParams::default(), &Patch::Merge(&p)).await {
                Ok(_) => {
                    info!(node = self.name(), taints = ?t.iter().map(|t| t.key.as_str()).collect::<Vec<_>>(), "node taints updated")
                }
                Err(kube::Error::Api(s)) if s.code == 409 => debug!("taint update conflicted; next round"),
                Err(e) => return Err(e),
            }
        }
        Ok(Some(node))
    }

    /// Registers (with --register-node) and keeps the status until `shutdown`.
    pub async fn run(&self, client: kube::Client, mut inputs: NodeInputs, shutdown: CancellationToken) {
        let api: kube::Api<Node> = kube::Api::all(client);
        let mut kept = RuntimeFacts::default();
        let mut registered = false;
        let mut last_report: Option<Instant> = None;
        let mut backoff = Duration::from_millis(100);
        let mut failing = false;
        let mut pressure_rx: Option<watch::Receiver<BTreeSet<NodeCondition>>> = None;
        let mut devices_rx: Option<watch::Receiver<crate::deviceplugin::devices::ExtendedResources>> = None;
        let mut volumes_rx: Option<watch::Receiver<Vec<String>>> = None;
        let mut tick = status_ticker(inputs.frequencies.borrow().node_status_update_frequency);
        tick.tick().await;
        loop {
            let report_every = {
                let live = inputs.frequencies.borrow_and_update().clone();
                let update_every = live.node_status_update_frequency.max(Duration::from_millis(100));
                if update_every != tick.period() {
                    info!(every = ?update_every, "nodeStatusUpdateFrequency changed by a reload");
                    tick = status_ticker(update_every);
                    tick.tick().await;
                }
                live.node_status_report_frequency
            };
            if inputs.pressure.has_changed().unwrap_or(false) || pressure_rx.is_none() {
                pressure_rx = inputs.pressure.borrow_and_update().clone();
            }
            let pressure = pressure_rx.as_mut().map(|r| r.borrow_and_update().clone()).unwrap_or_default();
            if inputs.devices.has_changed().unwrap_or(false) || devices_rx.is_none() {
                devices_rx = inputs.devices.borrow_and_update().clone();
            }
            let extended = devices_rx.as_mut().map(|r| r.borrow_and_update().clone()).unwrap_or_default();
            if inputs.volumes_in_use.has_changed().unwrap_or(false) || volumes_rx.is_none() {
                volumes_rx = inputs.volumes_in_use.borrow_and_update().clone();
            }
            let in_use = volumes_rx.as_mut().map(|r| r.borrow_and_update().clone()).unwrap_or_default();
            let facts = self.facts(&inputs, &mut kept, pressure, extended, in_use).await;
            let round = async {
                if !registered && self.settings.register {
                    let n = self.register(&api, &facts).await?;
                    last_report = Some(Instant::now());
                    return Ok(Some(n));
                }
                self.sync_status(&api, &facts, &mut last_report, report_every).await
            };
            let mut wait = None;
            match tokio::time::timeout(CALL_TIMEOUT, round).await {
                Ok(Ok(Some(node))) => {
                    if failing {
                        info!(node = self.name(), "node status: the API server answers again");
                    }
                    failing = false;
                    backoff = Duration::from_millis(100);
                    if !registered && self.settings.register {
                        // Registered: the first regular round right away.
                        wait = Some(Duration::ZERO);
                    }
                    registered = true;
                    let uid = node.metadata.uid.clone();
                    self.node_uid.send_if_modified(|u| {
                        let changed = *u != uid;
                        *u = uid.clone();
                        changed
                    });
                }
                Ok(Ok(None)) => {
                    if registered {
                        warn!(node = self.name(), "the Node is gone from the API server; registering again");
                    } else if !self.settings.register {
                        warn!(node = self.name(), "the Node does not exist and --register-node=false");
                    }
                    registered = false;
                }
                outcome => {
                    let why = match outcome {
                        Ok(Err(e)) => e.to_string(),
                        _ => format!("no answer within {CALL_TIMEOUT:?}"),
                    };
                    if !failing {
                        warn!(node = self.name(), "node status: {why} (retrying)");
                    }
                    failing = true;
                    if !registered {
                        wait = Some(backoff);
                        backoff = (backoff * 2).min(Duration::from_secs(7));
                    }
                }
            }
            let changed_devices = async {
                match devices_rx.as_mut() {
                    Some(r) => {
                        if r.changed().await.is_err() {
                            std::future::pending::<()>().await
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            // The attach-detach controller detaches a volume only once it
            // has left volumesInUse: report that without waiting a period.
            let changed_volumes = async {
                match volumes_rx.as_mut() {
                    Some(r) => {
                        if r.changed().await.is_err() {
                            std::future::pending::<()>().await
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            let changed_pressure = async {
                match pressure_rx.as_mut() {
                    Some(r) => {
                        if r.changed().await.is_err() {
                            std::future::pending::<()>().await
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = async { match wait { Some(w) => tokio::time::sleep(w).await, None => { tick.tick().await; } } } => {}
                _ = changed_pressure => debug!("pressure conditions changed"),
                _ = changed_devices => debug!("device plugin resources changed"),
                _ = changed_volumes => debug!("volumes in use changed"),
                _ = async { if inputs.volumes_in_use.changed().await.is_err() { std::future::pending::<()>().await } } => {}
                _ = async { if inputs.devices.changed().await.is_err() { std::future::pending::<()>().await } } => {}
                _ = async { if inputs.pressure.changed().await.is_err() { std::future::pending::<()>().await } } => {}
                _ = async { if inputs.frequencies.changed().await.is_err() { std::future::pending::<()>().await } } => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }
}
