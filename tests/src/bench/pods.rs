//! Pod benches on the real containerd: pod start latency against a
//! baseline that makes the same CRI calls directly (measured side by side,
//! alternating), and 110 pause pods started, listed and deleted by the real
//! binary, with its RSS and idle CPU while they run.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use swiftlet::{
    cm::naming::{CgroupDriver, CgroupNaming},
    cri::{CriClient, ImageService, RuntimeService, api, labels},
    pods::spec::{self, ContainerStart, NodeSettings},
};

use super::{BenchResult, Ctx, Figure, Table, median};
use crate::agent::{AgentProcess, AgentSetup, TestAgent, cri_endpoint};

const BUSYBOX: &str = "swiftlet.local/busybox:1.35";
pub(super) const PAUSE: &str = "swiftlet.local/pause:3.9";

fn busybox_pod(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [\"sleep\", \"3600\"]\n"
    )
}

fn pause_pod(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: pause\n    image: {PAUSE}\n"
    )
}

/// The CRI calls a kubelet makes to start a one-container pod, made
/// directly with the configs swiftlet would send: image status, run
/// sandbox, sandbox status, create and start the container.
async fn direct_start(cri: &CriClient, pod: &Pod, settings: &NodeSettings) -> Result<(Duration, String)> {
    let t = Instant::now();
    let c = &pod.spec.as_ref().context("pod spec")?.containers[0];
    let image = cri.image_status(c.image.as_deref().unwrap_or_default()).await?.context("image present")?.id;
    // Without swiftlet's label: the agent running beside the baseline would
    // rightly stop a managed sandbox that no pod of its own explains.
    let mut sandbox_config = spec::sandbox_config(pod, 0, settings);
    sandbox_config.labels.remove(labels::MANAGED_BY);
    let sandbox = cri.run_pod_sandbox(sandbox_config.clone(), "").await?;
    let _ = cri.pod_sandbox_status(&sandbox).await?;
    let objects = swiftlet::volumes::EnvObjects::default();
    let start = ContainerStart {
        pod,
        container: c,
        init: false,
        restart_count: 0,
        image_ref: &image,
        pod_ips: vec![],
        env_objects: &objects,
        mounts: &[],
        image_user: &Default::default(),
    };
    let mut config = spec::container_config(&start, settings)?;
    config.labels.remove(labels::MANAGED_BY);
    let id = cri.create_container(&sandbox, config, sandbox_config).await?;
    cri.start_container(&id).await?;
    Ok((t.elapsed(), sandbox))
}

fn settings(dir: &std::path::Path) -> NodeSettings {
    NodeSettings {
        node_name: "bench".into(),
        node_ip: None,
        pod_logs_dir: dir.join("logs"),
        pods_dir: dir.join("pods"),
        memory_capacity: swiftlet::signals::node::mem_total().unwrap_or(1 << 34),
        cpu_cfs_quota: true,
        cpu_cfs_quota_period: Duration::from_millis(100),
        naming: CgroupNaming::new(CgroupDriver::Cgroupfs, &format!("swiftlet-bench-{}", std::process::id())),
        host_dns: Default::default(),
        cluster_dns: vec![],
        cluster_domain: None,
        allocatable_cpu_milli: 1000,
        allocatable_memory: 1 << 30,
        allocatable_ephemeral_storage: 1 << 30,
        features: Default::default(),
    }
}

pub fn pod_start(ctx: &Ctx) -> Result<BenchResult> {
    let n = ctx.pick(30, 6);
    let agent = TestAgent::start("", &[]);
    let dir = tempfile::tempdir()?;
    let settings = settings(dir.path());
    let mut ours = vec![];
    let mut direct = vec![];
    for i in 0..n {
        // swiftlet: from the manifest seen to its container running.
        let name = agent.add_manifest(&format!("p{i}.yaml"), &busybox_pod(&format!("p{i}")));
        let deadline = Instant::now() + Duration::from_secs(60);
        let uid = loop {
            if let Some(p) = agent.pod(&name)
                && let Some(uid) = p.metadata.uid.clone()
                && agent.agent.pods.start_duration(&uid).is_some()
            {
                break uid;
            }
            if Instant::now() > deadline {
                bail!("pod {name} did not start");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        ours.push(agent.agent.pods.start_duration(&uid).expect("checked").as_secs_f64() * 1e3);
        agent.remove_manifest(&format!("p{i}.yaml"));
        agent.wait_gone(&name, Duration::from_secs(60));

        // The same calls, made directly.
        let mut pod: Pod = serde_saphyr::from_str(&busybox_pod(&format!("d{i}")))?;
        pod.metadata.uid = Some(format!("bench-direct-{}-{i}", std::process::id()));
        pod.metadata.namespace = Some("default".into());
        swiftlet::pods::defaults::apply(&mut pod);
        let (took, sandbox) = agent.rt.block_on(direct_start(&agent.cri, &pod, &settings))?;
        direct.push(took.as_secs_f64() * 1e3);
        agent.rt.block_on(async {
            let _ = agent.cri.stop_pod_sandbox(&sandbox).await;
            let _ = agent.cri.remove_pod_sandbox(&sandbox).await;
        });
    }
    // The direct baseline's pod cgroups (the runtime made them; as for the
    // kubelet's, removing them is ours).
    if let Ok(fs) = swiftlet::cgroups::CgroupFs::detect()
        && let Err(e) = fs.remove(settings.naming.root.as_str(), Duration::from_secs(30))
    {
        eprintln!("warning: cannot remove the baseline's cgroups under {}: {e}", settings.naming.root);
    }
    let ratio = median(&ours) / median(&direct);
    Ok(BenchResult {
        name: "pod-start".into(),
        title:
            "Pod start: manifest seen → container running, swiftlet vs the same CRI calls made directly (alternating)"
                .into(),
        figures: vec![
            Figure::distribution("swiftlet: seen → running", "ms", &ours),
            Figure::distribution("direct CRI calls: image status → started", "ms", &direct),
            Figure::value("ratio of medians (swiftlet / direct)", "×", n, ratio),
        ],
        notes: vec![
            "The direct baseline sends the identical sandbox and container configs swiftlet builds; swiftlet adds \
             the pod cgroup, reading the runtime state before and after, and status generation. Target ≤ 1.10."
                .into(),
        ],
        ..Default::default()
    })
}

/// Running containers of the pods whose names end in `-<node>` (a static
/// pod's mirror name; the API benches name their pods so too).
fn running_pause_containers(cri: &CriClient, rt: &tokio::runtime::Runtime, node: &str) -> Result<usize> {
    let suffix = format!("-{node}");
    let list = rt.block_on(cri.list_containers(Some(api::ContainerFilter {
        label_selector: labels::managed_selector(),
        state: Some(api::ContainerStateValue { state: api::ContainerState::ContainerRunning as i32 }),
        ..Default::default()
    })))?;
    Ok(list.iter().filter(|c| labels::identity(&c.labels).is_some_and(|id| id.name.ends_with(&suffix))).count())
}

fn sandboxes_of(cri: &CriClient, rt: &tokio::runtime::Runtime, node: &str) -> Result<usize> {
    let suffix = format!("-{node}");
    let list = rt.block_on(cri.list_pod_sandbox(Some(api::PodSandboxFilter {
        label_selector: labels::managed_selector(),
        ..Default::default()
    })))?;
    Ok(list.iter().filter(|s| labels::identity(&s.labels).is_some_and(|id| id.name.ends_with(&suffix))).count())
}

/// A process's resident memory, bytes.
#[derive(Clone, Copy, Default)]
struct Resident {
    total: u64,
    /// Heap, stacks and other private memory.
    anon: u64,
    /// Mapped file pages: mostly the binary's code.
    file: u64,
}

/// (resident memory, CPU seconds) of a process.
fn usage(pid: u32) -> Result<(Resident, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |field: &str| -> Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .map(|v| v * 1024)
            .with_context(|| format!("{field} in /proc/{pid}/status"))
    };
    let resident = Resident { total: kib("VmRSS:")?, anon: kib("RssAnon:")?, file: kib("RssFile:")? };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may contain spaces).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((resident, ticks / hz))
}

/// How long the pods-110 benches wait for all pods to run, or to go.
pub(super) const POD_DEADLINE: Duration = Duration::from_secs(600);

/// What the pods-110 benches measure of an agent running `n` pods of its
/// node (pods whose names end in `-<node>`).
pub(super) struct Footprint {
    pub n: usize,
    /// From `started` to every pod's container running.
    pub start_all: Duration,
    /// CRI list round trips with every pod running, ms.
    pub lists: Vec<f64>,
    /// The agent's resident memory, once a second at rest.
    rss: Vec<Resident>,
    /// The agent's CPU at rest, % of a core.
    pub cpu_pct: f64,
    /// The window at rest.
    pub idle: Duration,
    /// From the pods' removal asked to their sandboxes gone (set by
    /// [`Footprint::wait_gone`]).
    pub delete_all: Duration,
}

impl Footprint {
    /// Waits (from `started`) until the `n` pods of the agent's node run,
    /// times CRI lists, and lets the agent settle. `explain` says, on a
    /// time-out, what is holding pods back.
    pub(super) fn wait_running(
        agent: &AgentProcess,
        n: usize,
        started: Instant,
        explain: &dyn Fn() -> String,
    ) -> Result<Footprint> {
        let node = &agent.setup.node;
        let deadline = started + POD_DEADLINE;
        loop {
            let running = running_pause_containers(&agent.cri, &agent.rt, node)?;
            if running >= n {
                break;
            }
            if Instant::now() > deadline {
                bail!("only {running} of {n} pods running after {POD_DEADLINE:?}{}", explain());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let start_all = started.elapsed();
        let mut lists = vec![];
        for _ in 0..20 {
            let t = Instant::now();
            let _ = running_pause_containers(&agent.cri, &agent.rt, node)?;
            let _ = sandboxes_of(&agent.cri, &agent.rt, node)?;
            lists.push(t.elapsed().as_secs_f64() * 1e3);
        }
        std::thread::sleep(Duration::from_secs(5));
        Ok(Footprint {
            n,
            start_all,
            lists,
            rss: vec![],
            cpu_pct: 0.0,
            idle: Duration::ZERO,
            delete_all: Duration::ZERO,
        })
    }

    /// Samples the agent at rest, every pod running, for `idle`: its
    /// resident memory once a second, its CPU over the whole window.
    pub(super) fn rest(&mut self, agent: &AgentProcess, idle: Duration) -> Result<()> {
        let pid = agent.pid().context("the agent is not running")?;
        let (_, cpu0) = usage(pid)?;
        let t0 = Instant::now();
        while t0.elapsed() < idle {
            self.rss.push(usage(pid)?.0);
            std::thread::sleep(Duration::from_secs(1));
        }
        let (_, cpu1) = usage(pid)?;
        self.idle = t0.elapsed();
        self.cpu_pct = (cpu1 - cpu0) / self.idle.as_secs_f64() * 100.0;
        Ok(())
    }

    /// Waits until no sandbox of the agent's node is left; the time from
    /// `since` is the deletion figure.
    pub(super) fn wait_gone(
        &mut self,
        agent: &AgentProcess,
        since: Instant,
        explain: &dyn Fn() -> String,
    ) -> Result<()> {
        let deadline = since + POD_DEADLINE;
        while sandboxes_of(&agent.cri, &agent.rt, &agent.setup.node)? > 0 {
            if Instant::now() > deadline {
                bail!("pods not removed after {POD_DEADLINE:?}{}", explain());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        self.delete_all = since.elapsed();
        Ok(())
    }

    /// The sample with the most resident memory, and its split.
    fn peak(&self) -> Resident {
        self.rss.iter().copied().max_by_key(|r| r.total).unwrap_or_default()
    }

    /// The figures and the targets' table; `started` and `deleted` name
    /// where the start and deletion times run from.
    pub(super) fn report(&self, started: &str, deleted: &str) -> (Vec<Figure>, Table) {
        let n = self.n;
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let peak = self.peak();
        let max_rss = mib(peak.total);
        let cpu_pct = self.cpu_pct;
        let figures = vec![
            Figure::value(format!("{n} pods: {started} → all running"), "s", n, self.start_all.as_secs_f64()),
            Figure::value("pods started per second", "pods/s", n, n as f64 / self.start_all.as_secs_f64()),
            Figure::distribution("CRI list (sandboxes + containers)", "ms", &self.lists),
            Figure::value(format!("{n} pods: {deleted} → all sandboxes gone"), "s", n, self.delete_all.as_secs_f64()),
            Figure::value(format!("agent RSS with {n} pods (max)"), "MiB", self.rss.len(), max_rss),
            Figure::value(format!("of which anonymous (heap, stacks) with {n} pods"), "MiB", 1, mib(peak.anon)),
            Figure::value(format!("of which file-backed (the binary's code) with {n} pods"), "MiB", 1, mib(peak.file)),
            Figure::value(format!("agent CPU at rest with {n} pods"), "% of a core", 1, cpu_pct),
        ];
        let table = Table {
            header: vec!["target".into(), "measured".into()],
            rows: vec![
                vec!["RSS ≤ 30 MiB".into(), format!("{max_rss:.1} MiB")],
                vec!["idle CPU ≤ 1% of a core".into(), format!("{cpu_pct:.2}%")],
            ],
        };
        (figures, table)
    }
}

pub fn pods_110(ctx: &Ctx) -> Result<BenchResult> {
    let n = ctx.pick(110, 20);
    let idle = ctx.pick(Duration::from_secs(60), Duration::from_secs(10));
    let _ = cri_endpoint();
    let setup = AgentSetup::new("", &[]);
    for i in 0..n {
        setup.add_manifest(&format!("pause{i}.yaml"), &pause_pod(&format!("pause{i}")));
    }
    let started = Instant::now();
    let mut agent = AgentProcess::start(setup);
    let mut fp = Footprint::wait_running(&agent, n, started, &String::new)?;
    fp.rest(&agent, idle)?;
    for i in 0..n {
        agent.setup.remove_manifest(&format!("pause{i}.yaml"));
    }
    fp.wait_gone(&agent, Instant::now(), &String::new)?;
    agent.stop();
    let (figures, table) = fp.report("agent start", "manifests removed");
    Ok(BenchResult {
        name: "pods-110".into(),
        title: format!("{n} pause pods started, listed and deleted by the swiftlet binary; its RSS and CPU at rest"),
        figures,
        tables: vec![table],
        notes: vec![format!(
            "At rest: {} s with every pod running; the agent relists the runtime every second and resyncs each pod every syncFrequency (1 min).",
            idle.as_secs()
        )],
        ..Default::default()
    })
}
