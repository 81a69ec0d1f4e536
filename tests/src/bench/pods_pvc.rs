//! pods-110 with persistent storage: the same 110 pods (20 with --quick),
//! now API pods of the in-repo fake API server running its storage
//! controllers, a tenth of them (11; 2) each mounting a claim of its own,
//! dynamically provisioned by the test CSI driver (a loop device with a
//! real ext4, attached, staged and published), the rest pause pods. The
//! figures are pods-110's (see [`Footprint`]), so the two compare side by
//! side in one run.
//!
//! Everything is torn down on failure too: the agent stops and every
//! sandbox of its node is removed, its root dir's mounts go, then the
//! driver's remaining mounts and loop devices ([`CsiDriverProcess`]'s
//! drop), then its state dir, then the API server.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use super::{
    BenchResult, Ctx, Figure,
    pods::{Footprint, PAUSE, POD_DEADLINE},
};
use crate::{
    agent::{AgentProcess, AgentSetup, cri_endpoint},
    apiserver::{
        Credentials, FakeApiServer, Options,
        auth::UserInfo,
        resources::{CSIDRIVERS, CSINODES, EVENTS, LEASES, PODS, PVCS, PVS, STORAGE_CLASSES},
        storage::StorageOptions,
        store::DeleteOptions,
    },
    csi::{CsiDriverOptions, CsiDriverProcess, DEFAULT_NAME as DRIVER},
    node_process::free_port,
};

const CLASS: &str = "bench-csi";
const NAMESPACE: &str = "default";
/// The driver's smallest volume.
const CLAIM_SIZE: &str = "16Mi";
/// One pod in this many mounts a claim.
const EVERY: usize = 10;
const SETUP_TIMEOUT: Duration = Duration::from_secs(60);

/// The node and its control plane. Fields drop in order: the agent (it
/// stops, its node's sandboxes are removed and its root dir's mounts,
/// the pods' volumes among them, unmounted), the driver (whatever its
/// volumes still hold mounted or attached is swept away while its state
/// dir, kept apart from the agent's, still exists), that state dir, and
/// the API server.
struct Node {
    agent: AgentProcess,
    driver: CsiDriverProcess,
    _state: tempfile::TempDir,
    api: FakeApiServer,
}

impl Node {
    fn start() -> Result<Node> {
        let api = FakeApiServer::start(Options { tls: true, ..Default::default() }).context("fake API server")?;
        // Changes are acted on at once; the resync only catches what a
        // change missed (the controllers run in this process, not the agent).
        api.start_storage_controllers(StorageOptions { resync: Duration::from_secs(2) });
        // The kubelet's configuration as pods-110 runs it (AgentSetup's
        // defaults: memory-only eviction, no image GC), on the API server.
        let mut setup = AgentSetup::new("", &[]);
        let node = setup.node.clone();
        let token = "swlbch.0123456789abcdef";
        api.set_token(token, UserInfo::new("system:bootstrap:swlbch", &["system:bootstrappers"]));
        let state = api.dir().join(&node);
        std::fs::create_dir_all(&state)?;
        let bootstrap = state.join("bootstrap.kubeconfig");
        api.write_kubeconfig(&bootstrap, &Credentials::Token(token.into()))?;
        setup.args.extend([
            format!("--bootstrap-kubeconfig={}", bootstrap.display()),
            format!("--kubeconfig={}", state.join("kubelet.conf").display()),
            format!("--cert-dir={}", state.join("pki").display()),
            // A later flag wins: AgentSetup's node is API-less.
            "--register-node=true".into(),
            format!("--port={}", free_port()),
            format!("--healthz-port={}", free_port()),
            "--address=127.0.0.1".into(),
        ]);
        let root = setup.dir.path().join("root");
        let agent = AgentProcess::start(setup);
        let state = tempfile::Builder::new().prefix("swiftlet-bench-csi-").tempdir()?;
        let mut opts = CsiDriverOptions::for_kubelet(&root, &node, state.path());
        opts.require_attach = true;
        let driver = CsiDriverProcess::start(&opts).context("starting the test CSI driver")?;
        api.add_csi_controller(DRIVER, driver.socket());
        let n = Node { agent, driver, _state: state, api };
        n.wait("the node's Lease", || n.api.get(&LEASES, "kube-node-lease", &node).map(|_| ()))?;
        n.create(
            &CSIDRIVERS,
            "",
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": DRIVER},
                   "spec": {"attachRequired": true, "volumeLifecycleModes": ["Persistent"]}}),
        )?;
        n.create(
            &STORAGE_CLASSES,
            "",
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": CLASS},
                   "provisioner": DRIVER, "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer",
                   "parameters": {"csi.storage.k8s.io/fstype": "ext4"}}),
        )?;
        n.wait("the driver registered in the CSINode", || {
            let c = n.api.get(&CSINODES, "", &node)?;
            c["spec"]["drivers"].as_array()?.iter().any(|d| d["name"] == DRIVER).then_some(())
        })?;
        Ok(n)
    }

    fn node(&self) -> &str {
        &self.agent.setup.node
    }

    fn create(&self, rt: &crate::apiserver::resources::ResourceType, ns: &str, obj: Value) -> Result<Value> {
        self.api.store().create(rt, ns, obj).map_err(|e| anyhow::anyhow!("creating a {}: {}", rt.kind, e.message))
    }

    fn delete(&self, rt: &crate::apiserver::resources::ResourceType, name: &str) -> Result<()> {
        match self.api.store().delete(rt, NAMESPACE, name, &DeleteOptions::default()) {
            Ok(_) => Ok(()),
            Err(e) if e.code == 404 => Ok(()),
            Err(e) => bail!("deleting {} {name}: {}", rt.kind, e.message),
        }
    }

    fn wait<R>(&self, what: &str, f: impl Fn() -> Option<R>) -> Result<R> {
        let deadline = Instant::now() + SETUP_TIMEOUT;
        loop {
            if let Some(r) = f() {
                return Ok(r);
            }
            if Instant::now() > deadline {
                bail!("no {what} after {SETUP_TIMEOUT:?}{}", self.explain());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The pods that do not run yet, and the last warnings: said on a
    /// time-out.
    fn explain(&self) -> String {
        let waiting: Vec<String> = self
            .api
            .list(&PODS, Some(NAMESPACE))
            .iter()
            .filter(|p| p["status"]["phase"] != "Running")
            .map(|p| format!("{} {}", p["metadata"]["name"], p["status"]["phase"]))
            .take(5)
            .collect();
        let warnings: Vec<String> = self
            .api
            .list(&EVENTS, Some(NAMESPACE))
            .iter()
            .filter(|e| e["type"] == "Warning")
            .map(|e| format!("{} {}: {}", e["involvedObject"]["name"], e["reason"], e["message"]))
            .rev()
            .take(5)
            .collect();
        format!("; pods not running: {waiting:?}; last warnings: {warnings:?}")
    }

    /// Mount points under the agent's root dir, but the root dir itself.
    fn mounts(&self) -> Vec<PathBuf> {
        let root = self.agent.setup.dir.path().join("root");
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        text.lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(|p| PathBuf::from(p.replace("\\040", " ")))
            .filter(|m| m.starts_with(&root) && *m != root)
            .collect()
    }

    /// The driver's calls so far whose line starts with `method`.
    fn calls(&self, method: &str) -> usize {
        self.driver.calls().iter().filter(|c| c.split(' ').next() == Some(method)).count()
    }
}

/// Pod `i` of the node: a pause pod, with a claim of its own mounted at
/// /data for every tenth. Its name ends in `-<node>`, as a static pod's
/// mirror name does: pods-110's runtime counts and AgentProcess's sweep
/// of leftovers find it. Its grace period is 1 s, not pods-110's 0: the
/// API server removes a pod with none at once, before the agent has torn
/// anything down; with one it stays until the agent has (pause exits on
/// SIGTERM at once, so the second is not waited).
fn pod(i: usize, node: &str, claim: Option<&str>) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("p{i}-{node}"), "namespace": NAMESPACE},
        "spec": {"nodeName": node, "hostNetwork": true, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "pause", "image": PAUSE}]},
    });
    if let Some(claim) = claim {
        p["spec"]["volumes"] = json!([{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]);
        p["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
    }
    p
}

fn claim(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
           "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": CLASS,
                    "resources": {"requests": {"storage": CLAIM_SIZE}}}})
}

pub fn pods_110_pvc(ctx: &Ctx) -> Result<BenchResult> {
    let n = ctx.pick(110, 20);
    let idle = ctx.pick(Duration::from_secs(60), Duration::from_secs(10));
    let _ = cri_endpoint();
    let node = Node::start()?;
    let name = node.node().to_owned();
    let claims: Vec<String> = (0..n).step_by(EVERY).map(|i| format!("data{i}")).collect();

    let started = Instant::now();
    for c in &claims {
        node.create(&PVCS, NAMESPACE, claim(c))?;
    }
    for i in 0..n {
        let c = (i % EVERY == 0).then(|| format!("data{i}"));
        node.create(&PODS, NAMESPACE, pod(i, &name, c.as_deref()))?;
    }
    let mut fp = Footprint::wait_running(&node.agent, n, started, &|| node.explain())?;
    let published = node.calls("NodePublishVolume");
    if published != claims.len() {
        bail!("{published} NodePublishVolume calls for {} claims", claims.len());
    }
    let stats_before = node.calls("NodeGetVolumeStats");
    let calls_before = node.driver.calls().len();
    fp.rest(&node.agent, idle)?;
    let stats_at_rest = node.calls("NodeGetVolumeStats") - stats_before;
    let calls_at_rest = node.driver.calls().len() - calls_before;

    // Deletion as the API server does it: the agent kills the pods,
    // unpublishes and unstages their volumes, then removes them.
    let since = Instant::now();
    for i in 0..n {
        node.delete(&PODS, &format!("p{i}-{name}"))?;
    }
    // Out of the API first (their volumes are torn down by then), then
    // the sandboxes gone, as pods-110 waits for them.
    let deadline = since + POD_DEADLINE;
    while !node.api.list(&PODS, Some(NAMESPACE)).is_empty() {
        if Instant::now() > deadline {
            bail!("pods still in the API after {POD_DEADLINE:?}{}", node.explain());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let removed = since.elapsed();
    fp.wait_gone(&node.agent, since, &|| node.explain())?;
    let left = node.mounts();
    if !left.is_empty() {
        bail!("still mounted under the root dir once every pod is gone: {left:?}");
    }
    // The claims go, and with them their volumes (reclaim policy Delete:
    // detached, then DeleteVolume frees the loop devices).
    for c in &claims {
        node.delete(&PVCS, c)?;
    }
    node.wait("deletion of every volume", || node.api.list(&PVS, None).is_empty().then_some(()))?;
    let deleted = node.calls("DeleteVolume");
    if deleted != claims.len() {
        bail!("{deleted} DeleteVolume calls for {} claims", claims.len());
    }

    let (mut figures, table) = fp.report("pods and claims created", "pods deleted");
    figures.insert(
        4,
        Figure::value(
            format!("{n} pods: pods deleted → all removed from the API (volumes torn down)"),
            "s",
            n,
            removed.as_secs_f64(),
        ),
    );
    let k = claims.len();
    Ok(BenchResult {
        name: "pods-110-pvc".into(),
        title: format!(
            "pods-110 through the fake API server, {k} of the {n} pods each mounting a provisioned CSI claim \
             ({CLAIM_SIZE}, ext4 on a loop device); the agent's RSS and CPU at rest"
        ),
        figures,
        tables: vec![table],
        notes: vec![
            format!(
                "At rest: {} s with every pod running and {k} CSI volumes staged and published. Beside what \
                 pods-110's agent does (a runtime relist every second, each pod's resync every syncFrequency, \
                 1 min), this one keeps its API watches, renews its Lease every 10 s, computes the node's \
                 status every 10 s (posting it when it changed, else every 5 min), reads every claim's usage \
                 through NodeGetVolumeStats every volumeStatsAggPeriod (1 min) for kubelet_volume_stats_* and \
                 /stats/summary, and runs the persistent volumes' upkeep every 5 s \
                 (volumesInUse; the driver is dialed there only for a grown claim or a requiresRepublish driver). \
                 The driver saw {calls_at_rest} calls in the window, {stats_at_rest} of them NodeGetVolumeStats.",
                fp.idle.as_secs()
            ),
            "The start time runs from the claims' and pods' creation (the agent is already up, its Lease \
             renewed, the driver registered): it includes provisioning (CreateVolume: a loop device and mkfs.ext4), \
             attaching (ControllerPublishVolume by the fake API server's attacher), NodeStageVolume and \
             NodePublishVolume. pods-110's runs from the agent's start."
                .into(),
            "The API server, its storage controllers and the driver run in other processes (or the bench's): the \
             agent's figures are its own."
                .into(),
        ],
        ..Default::default()
    })
}
