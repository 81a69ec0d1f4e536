//! Table tests of the driver, as upstream's eviction_manager_test.go drives
//! its manager with fakes: an in-memory signal source the tests inject
//! crossings into, in-memory cgroups that record kills, a recording pod
//! manager, the real metrics registry, and tokio's paused clock.

use std::{
    collections::{BTreeSet, HashSet},
    sync::Arc,
    time::Duration,
};

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::{
    DriverConfig, Edges, EvictionContainer, EvictionManager, EvictionPod, EvictionRequest, KillPath, PodEvictor,
    PodProvider,
    edge::fake::{FakeCgroups, FakeReclaimer},
};
use crate::{
    eviction::{
        core::EvictionConfig,
        observe::NodeInfo,
        signal::{EvictionSignal, EvictionThreshold, NodeCondition, ThresholdValue},
    },
    metrics::Metrics,
    quantity::Quantity,
    signals::{
        CgroupUsage, Direction, KillOutcome, NodeUsage, Signal, SignalEvent, Target, memory::MemorySource, monotonic_ns,
    },
};

pub(super) const MI: u64 = 1 << 20;
pub(super) const CAPACITY: u64 = 4096 * MI;
pub(super) const ALLOCATABLE: u64 = 1024 * MI;
const PID_LIMIT: u64 = 32768;
pub(super) const KUBEPODS: &str = "kubepods";

#[derive(Default)]
pub(super) struct Pods {
    pods: Mutex<Vec<EvictionPod>>,
    requests: Mutex<Vec<EvictionRequest>>,
    /// Evicted pods whose end is not reported yet (their worker still
    /// stopping them).
    unreported: Mutex<HashSet<String>>,
}

impl PodProvider for Pods {
    fn eviction_pods(&self) -> Vec<Arc<EvictionPod>> {
        let gone: Vec<String> = self.requests.lock().iter().map(|r| r.uid.clone()).collect();
        self.pods.lock().iter().filter(|p| !gone.contains(&p.uid)).cloned().map(Arc::new).collect()
    }
}

impl PodEvictor for Pods {
    fn evict(&self, request: EvictionRequest) {
        self.requests.lock().push(request);
    }

    fn termination_reported(&self, uid: &str) -> bool {
        let evicted = self.requests.lock().iter().any(|r| r.uid == uid);
        let known = self.pods.lock().iter().any(|p| p.uid == uid);
        (evicted || !known) && !self.unreported.lock().contains(uid)
    }
}

pub(super) fn pod(name: &str, memory_request: u64) -> EvictionPod {
    let cgroup = format!("{KUBEPODS}/pod{name}");
    EvictionPod {
        uid: name.into(),
        namespace: "default".into(),
        name: name.into(),
        cgroup: cgroup.clone(),
        termination_grace_secs: 30,
        memory_request,
        containers: vec![EvictionContainer {
            name: format!("{name}-c"),
            memory_request,
            cgroup: Some(format!("{cgroup}/c")),
        }],
        ..Default::default()
    }
}

pub(super) fn hard(signal: EvictionSignal, value: ThresholdValue) -> EvictionThreshold {
    EvictionThreshold { signal, value, grace_period: Duration::ZERO, min_reclaim: None }
}

pub(super) fn quantity(v: u64) -> ThresholdValue {
    ThresholdValue::Quantity(Quantity::from_units(v as i64))
}

pub(super) struct Harness {
    pub(super) source: Arc<MemorySource>,
    pub(super) cgroups: Arc<FakeCgroups>,
    pub(super) reclaimer: Arc<FakeReclaimer>,
    pods: Arc<Pods>,
    metrics: Arc<Metrics>,
    pub(super) manager: EvictionManager,
    stop: CancellationToken,
}

impl Harness {
    /// The manager running on `thresholds` over `pods`, each pod using
    /// `usage` MiB (its container the same), kubepods their sum.
    async fn start(thresholds: Vec<EvictionThreshold>, pods: &[(EvictionPod, u64)], kernel: bool) -> Harness {
        Harness::start_with(thresholds, pods, kernel, None).await
    }

    /// [`Harness::start`] with reclaim-first on when `reclaimer` is given
    /// (its working-set changes go to the harness's source).
    pub(super) async fn start_with(
        thresholds: Vec<EvictionThreshold>,
        pods: &[(EvictionPod, u64)],
        kernel: bool,
        reclaimer: Option<FakeReclaimer>,
    ) -> Harness {
        let source = Arc::new(MemorySource::new(kernel));
        let reclaim_before_eviction = reclaimer.is_some();
        let reclaimer = Arc::new(FakeReclaimer { source: Some(source.clone()), ..reclaimer.unwrap_or_default() });
        let cgroups = Arc::new(FakeCgroups::default());
        let h_pods = Arc::new(Pods::default());
        for (p, usage_mi) in pods {
            h_pods.pods.lock().push(p.clone());
            cgroups.populated.lock().insert(p.cgroup.clone());
            cgroups.working_sets.lock().insert(format!("{}/c", p.cgroup), usage_mi * MI);
            source.set_cgroup(
                &p.cgroup,
                CgroupUsage { working_set_bytes: usage_mi * MI, processes: 1, ..Default::default() },
            );
        }
        let kubepods_mi: u64 = pods.iter().map(|(_, u)| u).sum();
        source.set_cgroup(KUBEPODS, CgroupUsage { working_set_bytes: kubepods_mi * MI, ..Default::default() });
        source.set_node(NodeUsage { working_set_bytes: 1024 * MI, tasks: 300, ..Default::default() });
        let cfg = DriverConfig {
            eviction: EvictionConfig {
                thresholds,
                pressure_transition_period: Duration::from_secs(60),
                max_pod_grace_period_secs: 10,
            },
            node: NodeInfo {
                memory_capacity: CAPACITY,
                allocatable_memory: ALLOCATABLE,
                pid_limit: PID_LIMIT,
                kubepods_cgroup: KUBEPODS.into(),
            },
            nodefs_path: std::env::temp_dir(),
            imagefs_path: None,
            housekeeping_interval: Duration::from_secs(10),
            plan_interval: Duration::from_secs(1),
            kernel_eviction: kernel,
            reclaim_before_eviction,
        };
        let metrics = Arc::new(Metrics::new());
        let (manager, event_loop) = EvictionManager::build(
            cfg,
            Edges {
                source: source.clone(),
                cgroups: cgroups.clone(),
                killer: cgroups.clone(),
                pods: h_pods.clone(),
                evictor: h_pods.clone(),
                reclaimer: None,
                cache_reclaimer: reclaimer.clone(),
            },
            metrics.clone(),
        );
        let stop = CancellationToken::new();
        let stop_rx = stop.clone();
        tokio::spawn(event_loop.run(stop_rx));
        settle().await;
        Harness { source, cgroups, reclaimer, pods: h_pods, metrics, manager, stop }
    }

    pub(super) fn requests(&self) -> Vec<EvictionRequest> {
        self.pods.requests.lock().clone()
    }

    pub(super) fn conditions(&self) -> BTreeSet<NodeCondition> {
        self.manager.conditions().borrow().clone()
    }

    /// A metric's value from the exposition ("name{labels}" as written).
    pub(super) fn metric(&self, series: &str) -> Option<f64> {
        let text = self.metrics.encode();
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
    }

    pub(super) fn crossing(&self, target: Target, signal: Signal, value: u64, at_ns: u64) {
        self.source.inject(SignalEvent::Crossing {
            target,
            signal,
            direction: Direction::Up,
            value,
            threshold: value,
            at_ns,
            received_ns: at_ns,
            pid: 0,
            kernel_generation: 0,
            kernel_outcome: KillOutcome::NoPlan,
        });
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Lets the manager's task run what it was woken for (the paused clock
/// moves on only when every task is idle).
pub(super) async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

fn allocatable_line() -> Vec<EvictionThreshold> {
    vec![hard(EvictionSignal::AllocatableMemoryAvailable, quantity(256 * MI))]
}

/// The pods of most cases: a BestEffort hog and a Guaranteed pod within
/// its request.
fn hog_and_steady() -> Vec<(EvictionPod, u64)> {
    vec![(pod("hog", 0), 600), (pod("steady", 256 * MI), 128)]
}

#[tokio::test(start_paused = true)]
async fn a_crossing_with_a_plan_kills_once_and_records_once() {
    let h = Harness::start(allocatable_line(), &hog_and_steady(), false).await;
    assert_eq!(h.manager.plan(EvictionSignal::AllocatableMemoryAvailable)[0].uid, "hog");
    h.source.set_cgroup(KUBEPODS, CgroupUsage { working_set_bytes: 800 * MI, ..Default::default() });
    h.crossing(Target::Cgroup(KUBEPODS.into()), Signal::MemoryWorkingSet, 800 * MI, monotonic_ns());
    // The fast path killed on the injecting (reader) thread, before any await.
    assert_eq!(h.cgroups.kills(), ["kubepods/podhog"]);
    assert!(h.cgroups.survivor_kills().is_empty(), "the reader thread kills once");
    settle().await;
    assert!(h.conditions().contains(&NodeCondition::MemoryPressure));
    // The manager swept the tree for a process forked while the fast kill
    // ran.
    assert_eq!(h.cgroups.survivor_kills(), ["kubepods/podhog"]);
    // The line crossed again while the hog dies (the signal wavering at
    // it): the evaluation judges, counting what the hog gives back.
    h.crossing(Target::Cgroup(KUBEPODS.into()), Signal::MemoryWorkingSet, 790 * MI, monotonic_ns());
    settle().await;
    assert_eq!(h.cgroups.kills(), ["kubepods/podhog"], "no second victim while the first dies");
    // The hog's processes exit and its memory is freed; housekeeping and
    // plan ticks later, still one of everything.
    h.cgroups.emptied("kubepods/podhog");
    h.source.set_cgroup(KUBEPODS, CgroupUsage { working_set_bytes: 128 * MI, ..Default::default() });
    tokio::time::sleep(Duration::from_secs(25)).await;
    assert_eq!(h.cgroups.kills(), ["kubepods/podhog"], "one kill");
    let requests = h.requests();
    assert_eq!(requests.len(), 1, "one request: {requests:?}");
    let r = &requests[0];
    assert_eq!((r.uid.as_str(), r.killed, r.grace_period_secs), ("hog", KillPath::Agent, 0));
    assert_eq!(r.signal, EvictionSignal::AllocatableMemoryAvailable);
    assert_eq!(
        r.message,
        "The node was low on resource: memory. Threshold quantity: 256Mi, available: 224Mi. Signal: \
         allocatableMemory.available. Container hog-c was using 600Mi, request is 0, has larger consumption of memory. "
    );
    assert_eq!(r.annotations["offending_containers"], "hog-c");
    assert_eq!(r.annotations["offending_containers_usage"], "600Mi");
    assert_eq!(r.annotations["starved_resource"], "memory");
    assert_eq!(h.metric("swiftlet_eviction_crossing_to_kill_seconds_count{path=\"agent\"}"), Some(1.0));
    assert_eq!(h.metric("kubelet_evictions_total{eviction_signal=\"allocatableMemory.available\"}"), Some(1.0));
    assert!(h.conditions().contains(&NodeCondition::MemoryPressure), "held for the transition period");
}

#[tokio::test(start_paused = true)]
async fn a_kernel_kill_is_finished_by_the_agent_and_recorded_once() {
    let h = Harness::start(allocatable_line(), &hog_and_steady(), true).await;
    let plan = h.source.plan(&Target::Cgroup(KUBEPODS.into()), Signal::MemoryWorkingSet).expect("a kernel plan");
    assert_eq!((plan.cgroup.as_str(), plan.tgid, plan.max_age), ("kubepods/podhog", 0, None));
    // Once the hog's largest process is known, the next ranking names it.
    h.cgroups.largest.lock().insert("kubepods/podhog".into(), 4242);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let plan = h.source.plan(&Target::Cgroup(KUBEPODS.into()), Signal::MemoryWorkingSet).expect("a kernel plan");
    assert_eq!((plan.cgroup.as_str(), plan.tgid), ("kubepods/podhog", 4242));
    let at = monotonic_ns();
    h.source.inject(SignalEvent::KernelKill {
        target: Target::Cgroup(KUBEPODS.into()),
        cgroup: Some("kubepods/podhog".into()),
        cgroup_id: 77,
        signal: Signal::MemoryWorkingSet,
        pid: 4242,
        signal_error: 0,
        generation: 1,
        crossing_ns: at,
        crossing_value: 800 * MI,
        at_ns: at + 40_000,
        received_ns: at + 90_000,
    });
    h.source.inject(SignalEvent::Crossing {
        target: Target::Cgroup(KUBEPODS.into()),
        signal: Signal::MemoryWorkingSet,
        direction: Direction::Up,
        value: 800 * MI,
        threshold: 768 * MI,
        at_ns: at,
        received_ns: at + 95_000,
        pid: 4242,
        kernel_generation: 1,
        kernel_outcome: KillOutcome::Executed,
    });
    assert!(h.cgroups.kills().is_empty(), "the fast path stands down when the kernel killed");
    settle().await;
    tokio::time::sleep(Duration::from_secs(25)).await;
    assert_eq!(h.cgroups.survivor_kills(), ["kubepods/podhog"], "survivors killed through the cgroup, once");
    assert!(h.cgroups.kills().is_empty(), "no freeze-and-kill of a victim that is already dying");
    assert_eq!(h.source.kills_finished(), [77], "the doomed mark released");
    let requests = h.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!((requests[0].uid.as_str(), requests[0].killed), ("hog", KillPath::Kernel));
    assert_eq!(requests[0].annotations["offending_containers"], "hog-c");
    // The kernel's own timestamps: 40 µs.
    assert_eq!(h.metric("swiftlet_eviction_crossing_to_kill_seconds_sum{path=\"kernel\"}"), Some(0.00004));
    assert_eq!(h.metric("swiftlet_kernel_plan_outcomes_total{outcome=\"executed\"}"), Some(1.0));
}

/// PID lines: a plan older than `PID_PLAN_MAX_AGE` is not used at the
/// crossing; the pods are ranked again by their tasks (threads counted),
/// so the thread bomb goes, not the pod that had more tasks when the plan
/// was made.
#[tokio::test(start_paused = true)]
async fn a_crossing_with_a_stale_pid_plan_ranks_again() {
    // (crossing this long after the plan, the fast path kills)
    let cases: [(Duration, bool); 2] = [(Duration::from_millis(20), true), (Duration::from_secs(1), false)];
    for (age, fast) in cases {
        let pids = vec![hard(EvictionSignal::PidAvailable, quantity(1000))];
        let h = Harness::start(pids, &[(pod("bomb", 0), 10), (pod("neighbour", 0), 10)], false).await;
        // When the plan was made, the neighbour held more tasks.
        h.cgroups.tasks.lock().extend([("kubepods/podbomb".into(), 1), ("kubepods/podneighbour".into(), 5)]);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(h.manager.plan(EvictionSignal::PidAvailable)[0].uid, "neighbour");
        let ranked_ns = h.manager.shared.plan.lock().ranked_ns;
        // Then one process of the bomb started 30,000 threads.
        h.cgroups.tasks.lock().insert("kubepods/podbomb".into(), 30_000);
        h.source.set_node(NodeUsage { working_set_bytes: 1024 * MI, tasks: 31_800, ..Default::default() });
        h.crossing(Target::Node, Signal::Processes, 31_800, ranked_ns + age.as_nanos() as u64);
        settle().await;
        let kills = h.cgroups.kills();
        if fast {
            // Trusted as it stood; once the neighbour is gone, the next
            // round takes the bomb, its five tasks being far from enough.
            assert_eq!(kills, ["kubepods/podneighbour"], "a fresh plan is trusted ({age:?})");
            h.cgroups.emptied("kubepods/podneighbour");
            tokio::time::sleep(Duration::from_millis(1500)).await;
            assert_eq!(h.cgroups.kills(), ["kubepods/podneighbour", "kubepods/podbomb"]);
        } else {
            assert_eq!(kills, ["kubepods/podbomb"], "ranked again at the crossing ({age:?})");
            let r = &h.requests()[0];
            assert!(
                r.message.starts_with("The node was low on resource: pids. Threshold quantity: 1000, available: 968.")
            );
            assert_eq!(r.annotations["starved_resource"], "pids");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_soft_threshold_acts_after_its_grace_period_only() {
    let soft = EvictionThreshold {
        signal: EvictionSignal::MemoryAvailable,
        value: quantity(3500 * MI),
        grace_period: Duration::from_secs(30),
        min_reclaim: None,
    };
    let h = Harness::start(vec![soft], &hog_and_steady(), false).await;
    // (seconds since the threshold was first met, a request by then)
    for (at, evicted) in [(0, false), (29, false), (31, true)] {
        h.manager.poke();
        settle().await;
        assert!(h.conditions().contains(&NodeCondition::MemoryPressure), "{at}s: the condition does not wait");
        assert_eq!(!h.requests().is_empty(), evicted, "{at}s");
        tokio::time::sleep(Duration::from_secs(if at == 0 { 29 } else { 2 })).await;
    }
    let r = &h.requests()[0];
    assert_eq!((r.uid.as_str(), r.killed, r.grace_period_secs), ("hog", KillPath::Graceful, 10));
    assert!(h.cgroups.kills().is_empty(), "a soft eviction stops the pod through the runtime");
}

#[tokio::test(start_paused = true)]
async fn the_condition_is_held_for_the_transition_period() {
    let h = Harness::start(allocatable_line(), &hog_and_steady(), false).await;
    h.source.set_cgroup(KUBEPODS, CgroupUsage { working_set_bytes: 800 * MI, ..Default::default() });
    h.manager.poke();
    settle().await;
    assert!(h.conditions().contains(&NodeCondition::MemoryPressure));
    h.source.set_cgroup(KUBEPODS, CgroupUsage { working_set_bytes: 200 * MI, ..Default::default() });
    let recovered = tokio::time::Instant::now();
    // Housekeeping runs every 10 s; the period is 60 s from the last time
    // the threshold was seen met.
    for (secs, held) in [(10, true), (55, true), (65, false)] {
        tokio::time::sleep_until(recovered + Duration::from_secs(secs)).await;
        h.manager.poke();
        settle().await;
        assert_eq!(h.conditions().contains(&NodeCondition::MemoryPressure), held, "{secs}s after recovery");
    }
}

#[tokio::test(start_paused = true)]
async fn one_pod_per_round_each_after_the_last_one_ended() {
    let mut t = hard(EvictionSignal::MemoryAvailable, quantity(500 * MI));
    t.min_reclaim = Some(quantity(200 * MI));
    let pods = [(pod("a", 0), 150), (pod("b", 0), 120), (pod("c", 0), 100), (pod("d", 512 * MI), 50)];
    let h = Harness::start(vec![t], &pods, false).await;
    h.pods.unreported.lock().extend(["a", "b", "c", "d"].map(String::from));
    // 50 MiB below the line, plus 200 of minimum reclaim: more than any
    // one pod gives back, and the node's figure never moves here.
    h.source.set_node(NodeUsage { working_set_bytes: CAPACITY - 450 * MI, tasks: 300, ..Default::default() });
    h.manager.poke();
    settle().await;
    assert_eq!(h.cgroups.kills(), ["kubepods/poda"], "one pod per round");
    // Its processes gone, its end not reported: still being evicted.
    h.cgroups.emptied("kubepods/poda");
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(h.cgroups.kills(), ["kubepods/poda"], "no round while a's end is not reported");
    // Reported, but b's processes stay: the next round waits for them.
    h.pods.unreported.lock().remove("a");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(h.cgroups.kills(), ["kubepods/poda", "kubepods/podb"], "b next, within a plan interval");
    h.pods.unreported.lock().remove("b");
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(h.cgroups.kills().len(), 2, "b's processes still run");
    h.cgroups.emptied("kubepods/podb");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(h.cgroups.kills(), ["kubepods/poda", "kubepods/podb", "kubepods/podc"]);
    // c's end is never reported: waited for 30 s at most, as the kubelet
    // waits for a pod's cleanup.
    h.cgroups.emptied("kubepods/podc");
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(h.cgroups.kills().len(), 3);
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(h.cgroups.kills().last().map(String::as_str), Some("kubepods/podd"));
    let order: Vec<String> = h.requests().into_iter().map(|r| r.uid).collect();
    assert_eq!(order, ["a", "b", "c", "d"]);
    assert!(h.requests().iter().all(|r| r.killed == KillPath::Agent));
    assert_eq!(h.metric("kubelet_evictions_total{eviction_signal=\"memory.available\"}"), Some(4.0));
}

#[tokio::test(start_paused = true)]
async fn critical_pods_are_never_planned_or_evicted() {
    let mut pods = hog_and_steady();
    pods[0].0.critical = true;
    let h = Harness::start(allocatable_line(), &pods, false).await;
    assert!(h.manager.plan(EvictionSignal::AllocatableMemoryAvailable).iter().all(|v| v.uid != "hog"));
    h.source.set_cgroup(KUBEPODS, CgroupUsage { working_set_bytes: 900 * MI, ..Default::default() });
    h.crossing(Target::Cgroup(KUBEPODS.into()), Signal::MemoryWorkingSet, 900 * MI, monotonic_ns());
    settle().await;
    assert!(h.requests().iter().all(|r| r.uid != "hog"), "{:?}", h.requests());
}

/// The memory.pressure signal's reports, as the watcher sends them.
mod memory_pressure {
    use k8s_openapi::api::core::v1::ObjectReference;

    use super::*;
    use crate::{
        events::{EventRecorder, EventType},
        eviction::pressure::{PressureConfig, Verdict},
    };

    #[derive(Default)]
    struct Events(Mutex<Vec<(String, String, String)>>);

    impl EventRecorder for Events {
        fn record(&self, object: &ObjectReference, _t: EventType, reason: &str, message: &str) {
            self.0.lock().push((object.name.clone().unwrap_or_default(), reason.into(), message.into()));
        }
    }

    const CFG: PressureConfig = PressureConfig {
        threshold_percent: 20.0,
        grace_period: Duration::from_secs(5),
        transition_period: Duration::from_secs(60),
    };

    fn verdict(fire: bool, condition: bool) -> Verdict {
        Verdict { above: fire, fire, condition, held_for: Duration::from_secs(6), next_check: None }
    }

    #[tokio::test(start_paused = true)]
    async fn the_node_firing_sets_the_condition_and_evicts_one_pod_ranked_for_memory() {
        let h = Harness::start(vec![], &hog_and_steady(), false).await;
        let events = Arc::new(Events::default());
        let sink = h.manager.pressure_sink(CFG, events.clone());
        sink.node(5.0, &verdict(false, false));
        settle().await;
        assert!(h.conditions().is_empty() && h.requests().is_empty(), "below: nothing");

        sink.node(42.0, &verdict(true, true));
        settle().await;
        assert!(h.conditions().contains(&NodeCondition::MemoryContention), "{:?}", h.conditions());
        let r = h.requests();
        assert_eq!(r.len(), 1, "one pod per firing: {r:?}");
        assert_eq!(r[0].name, "hog", "ranked as for memory");
        assert_eq!(r[0].killed, KillPath::Graceful, "a grace period: a soft eviction");
        assert_eq!(r[0].grace_period_secs, 10, "capped by evictionMaxPodGracePeriod");
        assert!(r[0].message.contains("Signal: memory.pressure."), "{}", r[0].message);
        assert_eq!(h.metric(r#"kubelet_evictions_total{eviction_signal="memory.pressure"}"#), Some(1.0));
        assert_eq!(h.metric(r#"swiftlet_memory_pressure_avg10{scope="node"}"#), Some(42.0));
        assert_eq!(h.metric(r#"swiftlet_memory_pressure_firings_total{scope="node"}"#), Some(1.0));
        assert_eq!(h.metric(r#"swiftlet_node_condition{condition="SystemMemoryContentionPressure"}"#), Some(1.0));

        // Fired again while the hog is still dying: nobody else goes.
        sink.node(42.0, &verdict(true, true));
        settle().await;
        assert_eq!(h.requests().len(), 1);

        // The watcher says the condition cleared (its transition period is its own).
        sink.node(1.0, &verdict(false, false));
        settle().await;
        assert!(!h.conditions().contains(&NodeCondition::MemoryContention));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_pod_gets_a_warning_not_an_eviction() {
        let h = Harness::start(vec![], &hog_and_steady(), false).await;
        let events = Arc::new(Events::default());
        let sink = h.manager.pressure_sink(CFG, events.clone());
        let (hog, _) = &hog_and_steady()[0];
        sink.pod(hog, 80.0, &verdict(false, false));
        sink.pod(hog, 80.0, &verdict(true, false));
        sink.pods_highest(Some(80.0));
        settle().await;
        assert!(h.requests().is_empty() && h.conditions().is_empty());
        let got = events.0.lock().clone();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!((got[0].0.as_str(), got[0].1.as_str()), ("hog", "MemoryPressureStall"));
        assert!(got[0].2.contains("80.00%") && got[0].2.contains("not evicted"), "{}", got[0].2);
        assert_eq!(h.metric(r#"swiftlet_memory_pressure_firings_total{scope="pod"}"#), Some(1.0));
        assert_eq!(h.metric(r#"swiftlet_memory_pressure_avg10{scope="pod"}"#), Some(80.0));
    }
}
