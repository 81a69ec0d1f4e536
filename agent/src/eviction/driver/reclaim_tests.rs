//! Table tests of reclaim before evicting (`reclaim_before_eviction`) and
//! of `kubelet_eviction_stats_age_seconds`, on the driver harness of
//! `tests.rs` (in-memory source, cgroups and `memory.reclaim`, paused
//! clock).

use std::time::Duration;

use super::{
    KillPath,
    edge::fake::FakeReclaimer,
    tests::{ALLOCATABLE, Harness, KUBEPODS, MI, hard, pod, quantity, settle},
};
use crate::{
    eviction::{reclaim::MemoryKinds, signal::EvictionSignal},
    signals::{CgroupUsage, Direction, KillOutcome, Signal, SignalEvent, Target, monotonic_ns},
};

const CACHE: &str = "kubepods/podcache";
const HOG: &str = "kubepods/podhog";

/// anon, file (active + inactive), inactive file, in MiB.
fn kinds(anon_mi: u64, file_mi: u64, inactive_mi: u64) -> MemoryKinds {
    MemoryKinds { anon: anon_mi * MI, active_file: (file_mi - inactive_mi) * MI, inactive_file: inactive_mi * MI }
}

/// What grew before the crossing.
#[derive(Clone, Copy, Debug)]
enum Growth {
    /// The cache pod read its files again: 200 MiB of active page cache.
    Cache,
    /// The hog allocated 200 MiB.
    Anon,
}

/// The allocatable line at 256 Mi (kubepods' working set at 768 Mi) over a
/// cache pod (300 Mi: 50 anonymous, 250 of active page cache beside 150
/// inactive) and a BestEffort hog (328 Mi, anonymous, first in the plan);
/// then `growth` takes kubepods to 828 Mi, 60 Mi over the line.
async fn crossed(growth: Growth, reclaimer: Option<FakeReclaimer>) -> Harness {
    let with_reclaim = reclaimer.is_some();
    let mut fake = reclaimer.unwrap_or_default();
    fake.kinds.get_mut().extend([
        (CACHE.to_owned(), kinds(50, 400, 150)),
        (HOG.to_owned(), kinds(328, 0, 0)),
        (KUBEPODS.to_owned(), kinds(378, 400, 150)),
    ]);
    let thresholds = vec![hard(EvictionSignal::AllocatableMemoryAvailable, quantity(256 * MI))];
    let pods = [(pod("cache", 0), 300), (pod("hog", 0), 328)];
    let h = Harness::start_with(thresholds, &pods, true, with_reclaim.then_some(fake)).await;
    let (pod_cgroup, grown) = match growth {
        Growth::Cache => (CACHE, kinds(50, 600, 150)),
        Growth::Anon => (HOG, kinds(528, 0, 0)),
    };
    let before = h.reclaimer.memory_kinds_of(pod_cgroup);
    h.reclaimer.kinds.lock().insert(pod_cgroup.into(), grown);
    let mut total = h.reclaimer.memory_kinds_of(KUBEPODS);
    total.anon += grown.anon - before.anon;
    total.active_file += grown.active_file - before.active_file;
    h.reclaimer.kinds.lock().insert(KUBEPODS.into(), total);
    let ws = h.source.cgroup(pod_cgroup).working_set_bytes + 200 * MI;
    h.source.set_cgroup(pod_cgroup, CgroupUsage { working_set_bytes: ws, processes: 1, ..Default::default() });
    h.source.set_cgroup(KUBEPODS, CgroupUsage { working_set_bytes: 828 * MI, ..Default::default() });
    h
}

fn cross(h: &Harness, outcome: KillOutcome, at_ns: u64) {
    h.source.inject(SignalEvent::Crossing {
        target: Target::Cgroup(KUBEPODS.into()),
        signal: Signal::MemoryWorkingSet,
        direction: Direction::Up,
        value: 828 * MI,
        threshold: ALLOCATABLE - 256 * MI,
        at_ns,
        received_ns: at_ns,
        pid: 0,
        kernel_generation: 0,
        kernel_outcome: outcome,
    });
}

impl FakeReclaimer {
    fn memory_kinds_of(&self, cgroup: &str) -> MemoryKinds {
        self.kinds.lock().get(cgroup).copied().unwrap_or_default()
    }
}

/// What the kernel said and what grew → who kills, and whether page cache
/// is reclaimed first.
#[tokio::test(start_paused = true)]
async fn page_cache_is_reclaimed_and_anonymous_growth_evicted() {
    // (growth, the kernel's outcome, killed on the reader thread, reclaim
    //  writes, pods killed in the end)
    type Case = (Growth, KillOutcome, bool, Vec<(&'static str, u64)>, Vec<&'static str>);
    let cases: Vec<Case> = vec![
        // The tracepoint saw file pages cross: no kill anywhere; the cache
        // pod gives back its 150 Mi of inactive cache and 60 of active,
        // which brings kubepods back to the line.
        (Growth::Cache, KillOutcome::DeferredFileGrowth, false, vec![(CACHE, 210 * MI)], vec![]),
        // A source that never asks the kernel (cgroupfs): the same.
        (Growth::Cache, KillOutcome::NotAttempted, false, vec![(CACHE, 210 * MI)], vec![]),
        // The kernel knew it was anonymous (and did not kill: its plan was
        // refused): the fast path kills at once, nothing is reclaimed.
        (Growth::Anon, KillOutcome::KernelEvictionOff, true, vec![], vec![HOG]),
        // The charge path cannot tell; memory.stat shows anon grew: the
        // evaluation evicts without reclaiming.
        (Growth::Anon, KillOutcome::DeferredUnknownGrowth, false, vec![], vec![HOG]),
    ];
    for (growth, outcome, fast, writes, killed) in cases {
        let h = crossed(growth, Some(FakeReclaimer::default())).await;
        assert!(h.source.reclaim_first(), "the kernel side is told");
        cross(&h, outcome, monotonic_ns());
        assert_eq!(!h.cgroups.kills().is_empty(), fast, "{growth:?} {outcome:?}: killed on the reader thread");
        settle().await;
        let writes_made = h.reclaimer.writes();
        let written: Vec<(&str, u64)> = writes_made.iter().map(|(c, b)| (c.as_str(), *b)).collect();
        assert_eq!(written, writes, "{growth:?} {outcome:?}: memory.reclaim writes");
        // Housekeeping later, nothing more.
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert_eq!(h.cgroups.kills(), killed, "{growth:?} {outcome:?}: kills");
        assert_eq!(h.requests().len(), killed.len(), "{growth:?} {outcome:?}: {:?}", h.requests());
        if writes.is_empty() {
            assert_eq!(h.metric("swiftlet_memory_reclaim_total{result=\"done\"}"), None);
        } else {
            assert_eq!(h.metric("swiftlet_memory_reclaim_total{result=\"done\"}"), Some(1.0));
            assert_eq!(h.metric("swiftlet_memory_reclaimed_bytes_total"), Some((210 * MI) as f64));
            assert_eq!(h.source.cgroup(KUBEPODS).working_set_bytes, 768 * MI, "back at the line");
        }
    }
}

/// The cache comes back as fast as it is reclaimed (the write is short):
/// after three rounds, each on a fresh observation, one eviction, of the
/// pod the ranking picks on what is observed after.
#[tokio::test(start_paused = true)]
async fn still_over_the_line_after_reclaim_evicts_once() {
    let fake = FakeReclaimer::default();
    fake.refilling.lock().insert(CACHE.into());
    let h = crossed(Growth::Cache, Some(fake)).await;
    cross(&h, KillOutcome::DeferredFileGrowth, monotonic_ns());
    assert!(h.cgroups.kills().is_empty(), "no kill before the reclaim");
    settle().await;
    assert_eq!(h.reclaimer.writes(), vec![(CACHE.to_owned(), 210 * MI); 3], "three rounds");
    assert_eq!(h.cgroups.kills(), [CACHE], "evicted after the reclaim fell short");
    tokio::time::sleep(Duration::from_secs(25)).await;
    assert_eq!(h.cgroups.kills(), [CACHE], "one eviction");
    let r = &h.requests()[..];
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].uid.as_str(), r[0].killed), ("cache", KillPath::Agent));
    assert_eq!(h.metric("swiftlet_memory_reclaim_total{result=\"short\"}"), Some(3.0));
    // Decided on the observation made after the reclaim: fresh.
    let age = "kubelet_eviction_stats_age_seconds_bucket{le=\"0.005\",eviction_signal=\"allocatableMemory.available\"}";
    assert_eq!(h.metric(age), Some(1.0));
}

/// Off, or not available (cgroup v1, a kernel without memory.reclaim):
/// today's behaviour, the fast path kills the plan's first victim (the
/// hog) at the crossing, though page cache grew, and nothing is written.
#[tokio::test(start_paused = true)]
async fn without_reclaim_first_a_cache_crossing_kills_at_once() {
    let unavailable = FakeReclaimer { unavailable: Some("cgroup v1".into()), ..Default::default() };
    for reclaimer in [None, Some(unavailable)] {
        let asked = reclaimer.is_some();
        let h = crossed(Growth::Cache, reclaimer).await;
        assert!(!h.source.reclaim_first(), "asked: {asked}");
        cross(&h, KillOutcome::NoPlan, monotonic_ns());
        assert_eq!(h.cgroups.kills(), [HOG], "asked: {asked}");
        settle().await;
        assert!(h.reclaimer.writes().is_empty(), "asked: {asked}");
        assert_eq!(h.requests().len(), 1, "asked: {asked}");
    }
}

/// `kubelet_eviction_stats_age_seconds`: at a crossing, the kernel event's
/// age when the kill was decided; in a polled evaluation, the snapshot's.
#[tokio::test(start_paused = true)]
async fn the_stats_age_is_the_age_of_the_observation_behind_the_eviction() {
    let bucket = |le: &str| {
        format!(
            "kubelet_eviction_stats_age_seconds_bucket{{le=\"{le}\",eviction_signal=\"allocatableMemory.available\"}}"
        )
    };
    // A crossing seen 2 s after it happened (a stalled reader).
    let h = crossed(Growth::Anon, None).await;
    cross(&h, KillOutcome::NoPlan, monotonic_ns() - 2_000_000_000);
    settle().await;
    assert_eq!(h.cgroups.kills(), [HOG]);
    assert_eq!(h.metric(&bucket("1.0")), Some(0.0));
    assert_eq!(h.metric(&bucket("2.5")), Some(1.0));
    let sum = "kubelet_eviction_stats_age_seconds_sum{eviction_signal=\"allocatableMemory.available\"}";
    assert!(h.metric(sum).is_some_and(|s| (2.0..2.5).contains(&s)), "{:?}", h.metric(sum));
    // No crossing: the housekeeping evaluation's snapshot, just taken.
    let h = crossed(Growth::Anon, None).await;
    h.manager.poke();
    settle().await;
    assert_eq!(h.cgroups.kills(), [HOG]);
    assert_eq!(h.metric(&bucket("0.005")), Some(1.0));
    assert_eq!(h.metric("kubelet_eviction_stats_age_seconds_count{eviction_signal=\"memory.available\"}"), None);
}
