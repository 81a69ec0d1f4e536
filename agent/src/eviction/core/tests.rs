//! Table tests of the eviction decision.

use super::*;
use crate::{
    eviction::{
        ranking::{ContainerRef, Usage},
        signal::ThresholdValue,
    },
    quantity::Quantity,
};

const MI: u64 = 1 << 20;

fn hard(signal: EvictionSignal, value: ThresholdValue) -> EvictionThreshold {
    EvictionThreshold { signal, value, grace_period: Duration::ZERO, min_reclaim: None }
}

fn mi(n: u64) -> ThresholdValue {
    ThresholdValue::Quantity(Quantity::from_units((n * MI) as i64))
}

fn cfg(thresholds: Vec<EvictionThreshold>) -> EvictionConfig {
    EvictionConfig { thresholds, pressure_transition_period: Duration::from_secs(300), max_pod_grace_period_secs: 0 }
}

fn mem(available_mi: i64) -> Observations {
    [(EvictionSignal::MemoryAvailable, Observation { available: available_mi * MI as i64, capacity: 4096 * MI })].into()
}

fn pod(name: &str, priority: i32, request_mi: u64, usage_mi: u64) -> Candidate {
    Candidate {
        uid: format!("uid-{name}"),
        namespace: "default".into(),
        name: name.into(),
        priority,
        evictable: true,
        termination_grace_secs: 30,
        memory: Usage { request: request_mi * MI, usage: usage_mi * MI },
        containers: vec![ContainerRef {
            name: "c".into(),
            memory_request: request_mi * MI,
            cgroup: Some(format!("{usage_mi}")),
        }],
        ..Default::default()
    }
}

/// Container cgroups in these tests are named after their usage in MiB.
fn usage(cgroup: &str) -> Option<u64> {
    cgroup.parse::<u64>().ok().map(|mi| mi * MI)
}

fn victims(e: &Evaluation) -> Vec<String> {
    match &e.action {
        Action::Evict(ev) => ev.victim.iter().map(|v| v.name.clone()).collect(),
        _ => vec![],
    }
}

#[test]
fn hard_threshold_table() {
    let t0 = Instant::now();
    // (available MiB, expected condition, expected victims)
    let cases: &[(i64, bool, &[&str])] = &[
        (600, false, &[]),
        (500, false, &[]),      // at the line: not below it
        (499, true, &["hog"]),  // 1 MiB short: the top-ranked pod
        (100, true, &["hog"]),  // hog's 600 MiB covers 400 MiB of need
        (-200, true, &["hog"]), // 700 needed: still one pod per round
    ];
    for (avail, pressure, want) in cases {
        let mut st = State::default();
        let pods = [pod("hog", 0, 0, 600), pod("burstable", 0, 100, 300), pod("guaranteed", 0, 500, 500)];
        let e = st.evaluate(
            &cfg(vec![hard(EvictionSignal::MemoryAvailable, mi(500))]),
            t0,
            &mem(*avail),
            &pods,
            false,
            &usage,
        );
        assert_eq!(e.conditions.contains(&NodeCondition::MemoryPressure), *pressure, "available {avail}Mi");
        assert_eq!(victims(&e), *want, "available {avail}Mi");
    }
}

#[test]
fn percentages_resolve_against_capacity() {
    let t = hard(EvictionSignal::MemoryAvailable, ThresholdValue::Percentage(0.10));
    let mut st = State::default();
    // capacity 4096Mi → line at 409.6Mi
    let e = st.evaluate(&cfg(vec![t.clone()]), Instant::now(), &mem(410), &[pod("a", 0, 0, 10)], false, &usage);
    assert_eq!(e.action, Action::None);
    let e = st.evaluate(&cfg(vec![t]), Instant::now(), &mem(409), &[pod("a", 0, 0, 10)], false, &usage);
    assert_eq!(victims(&e), ["a"]);
}

#[test]
fn soft_threshold_waits_for_grace_and_caps_pod_grace() {
    let soft = EvictionThreshold {
        signal: EvictionSignal::MemoryAvailable,
        value: mi(1000),
        grace_period: Duration::from_secs(30),
        min_reclaim: None,
    };
    let mut c = cfg(vec![soft]);
    c.max_pod_grace_period_secs = 10;
    let mut st = State::default();
    let t0 = Instant::now();
    let pods = [pod("hog", 0, 0, 600)];
    let e = st.evaluate(&c, t0, &mem(900), &pods, false, &usage);
    assert!(e.conditions.contains(&NodeCondition::MemoryPressure), "the condition does not wait for grace");
    assert_eq!(e.action, Action::None);
    assert_eq!(e.next_deadline, Some(t0 + Duration::from_secs(30)));
    let e = st.evaluate(&c, t0 + Duration::from_secs(29), &mem(900), &pods, false, &usage);
    assert_eq!(e.action, Action::None);
    let e = st.evaluate(&c, t0 + Duration::from_secs(30), &mem(900), &pods, false, &usage);
    let Action::Evict(ev) = e.action else { panic!("expected an eviction") };
    assert_eq!(ev.victim.as_ref().unwrap().grace_period_secs, 10, "min(pod's 30s, max 10s)");
    // Recovering resets the grace clock.
    let mut st = State::default();
    st.evaluate(&c, t0, &mem(900), &pods, false, &usage);
    st.evaluate(&c, t0 + Duration::from_secs(20), &mem(1500), &pods, false, &usage);
    let e = st.evaluate(&c, t0 + Duration::from_secs(31), &mem(900), &pods, false, &usage);
    assert_eq!(e.action, Action::None, "grace restarts after the signal recovered");
}

#[test]
fn min_reclaim_keeps_the_threshold_met_until_recovered() {
    let mut t = hard(EvictionSignal::MemoryAvailable, mi(500));
    t.min_reclaim = Some(mi(200));
    let c = cfg(vec![t]);
    let mut st = State::default();
    let now = Instant::now();
    let pods = [pod("a", 0, 0, 100), pod("b", 0, 0, 100), pod("c", 0, 0, 100)];
    // 50 below the line + 200 reclaim = 250 needed: one pod per round.
    let e = st.evaluate(&c, now, &mem(450), &pods, false, &usage);
    assert_eq!(victims(&e), ["a"]);
    // Back above the line but not above line + reclaim: still met.
    let e = st.evaluate(&c, now, &mem(600), &[pod("d", 0, 0, 300)], false, &usage);
    assert_eq!(victims(&e), ["d"]);
    // Above line + reclaim: recovered.
    let e = st.evaluate(&c, now, &mem(701), &[pod("d", 0, 0, 300)], false, &usage);
    assert_eq!(e.action, Action::None);
    assert!(e.met.is_empty());
}

#[test]
fn transition_period_holds_the_condition() {
    let c = cfg(vec![hard(EvictionSignal::MemoryAvailable, mi(500))]);
    let mut st = State::default();
    let t0 = Instant::now();
    st.evaluate(&c, t0, &mem(100), &[], false, &usage);
    for (secs, held) in [(1, true), (299, true), (300, false), (1000, false)] {
        let e = st.evaluate(&c, t0 + Duration::from_secs(secs), &mem(3000), &[], false, &usage);
        assert_eq!(e.conditions.contains(&NodeCondition::MemoryPressure), held, "{secs}s after recovery");
    }
}

#[test]
fn a_crossing_holds_the_condition_though_the_kill_ended_the_pressure() {
    let c = cfg(vec![hard(EvictionSignal::MemoryAvailable, mi(500))]);
    let mut st = State::default();
    let t0 = Instant::now();
    st.crossed(EvictionSignal::MemoryAvailable, t0);
    // By the evaluation, the victim is dead and memory is back.
    for (secs, held) in [(0, true), (299, true), (300, false)] {
        let e = st.evaluate(&c, t0 + Duration::from_secs(secs), &mem(3000), &[], false, &usage);
        assert_eq!(e.conditions.contains(&NodeCondition::MemoryPressure), held, "{secs}s after the crossing");
        assert_eq!(e.action, Action::None, "nothing more to evict");
    }
}

#[test]
fn no_round_while_a_victim_is_in_flight() {
    let c = cfg(vec![hard(EvictionSignal::MemoryAvailable, mi(500))]);
    let mut hog = pod("hog", 0, 0, 600);
    hog.in_flight = true;
    for avail in [400, -400] {
        let mut st = State::default();
        let e = st.evaluate(&c, Instant::now(), &mem(avail), &[hog.clone(), pod("b", 0, 0, 50)], false, &usage);
        assert_eq!(e.action, Action::None, "available {avail}Mi: the hog is still being evicted");
        assert!(e.conditions.contains(&NodeCondition::MemoryPressure), "the condition does not wait");
    }
    hog.in_flight = false;
    let e = State::default().evaluate(&c, Instant::now(), &mem(-400), &[pod("b", 0, 0, 50)], false, &usage);
    assert_eq!(victims(&e), ["b"], "the hog gone: the next round");
}

#[test]
fn a_pod_holding_none_of_the_resource_is_never_a_victim() {
    let disk = hard(EvictionSignal::NodeFsAvailable, ThresholdValue::Percentage(0.10));
    let obs: Observations = [(EvictionSignal::NodeFsAvailable, Observation { available: 5, capacity: 100 })].into();
    let mut writer = pod("writer", 0, 0, 0);
    let idle = pod("idle", 0, 0, 0);
    // The writer's bytes not measured yet: nobody goes this round.
    let e = State::default().evaluate(
        &cfg(vec![disk.clone()]),
        Instant::now(),
        &obs,
        &[idle.clone(), writer.clone()],
        true,
        &usage,
    );
    assert_eq!(victims(&e), Vec::<String>::new());
    writer.disk = Usage { request: 0, usage: 40 };
    let e = State::default().evaluate(&cfg(vec![disk]), Instant::now(), &obs, &[idle, writer], true, &usage);
    assert_eq!(victims(&e), ["writer"]);
}

#[test]
fn critical_pods_are_never_evicted() {
    let c = cfg(vec![hard(EvictionSignal::MemoryAvailable, mi(500))]);
    let mut crit = pod("crit", 2_000_001_000, 0, 2000);
    crit.evictable = false;
    let e = State::default().evaluate(&c, Instant::now(), &mem(0), &[crit], false, &usage);
    let Action::Evict(ev) = e.action else { panic!("the threshold is met") };
    assert!(ev.victim.is_none());
}

#[test]
fn memory_goes_before_disk_and_disk_reclaims_node_resources_first() {
    let disk = hard(EvictionSignal::NodeFsAvailable, ThresholdValue::Percentage(0.10));
    let memt = hard(EvictionSignal::MemoryAvailable, mi(500));
    let c = cfg(vec![disk.clone(), memt]);
    let mut obs = mem(100);
    obs.insert(EvictionSignal::NodeFsAvailable, Observation { available: 5, capacity: 100 });
    let e = State::default().evaluate(&c, Instant::now(), &obs, &[pod("a", 0, 0, 600)], false, &usage);
    assert!(matches!(&e.action, Action::Evict(ev) if ev.threshold.signal == EvictionSignal::MemoryAvailable));
    assert!(
        e.conditions.contains(&NodeCondition::DiskPressure) && e.conditions.contains(&NodeCondition::MemoryPressure)
    );

    let c = cfg(vec![disk.clone()]);
    let mut st = State::default();
    let mut p = pod("writer", 0, 0, 0);
    p.disk = Usage { request: 0, usage: 50 };
    let e = st.evaluate(&c, Instant::now(), &obs, std::slice::from_ref(&p), false, &usage);
    assert_eq!(e.action, Action::ReclaimNodeResources(disk));
    let e = st.evaluate(&c, Instant::now(), &obs, &[p], true, &usage);
    assert_eq!(victims(&e), ["writer"]);
}

#[test]
fn pid_pressure_picks_by_priority_then_processes() {
    let c = cfg(vec![hard(EvictionSignal::PidAvailable, ThresholdValue::Quantity(Quantity::from_units(1000)))]);
    let obs: Observations = [(EvictionSignal::PidAvailable, Observation { available: 900, capacity: 32768 })].into();
    let mut bomb = pod("bomb", 0, 0, 0);
    bomb.tasks = 5000;
    let mut quiet = pod("quiet", 0, 0, 0);
    quiet.tasks = 3;
    let e = State::default().evaluate(&c, Instant::now(), &obs, &[quiet, bomb], false, &usage);
    assert_eq!(victims(&e), ["bomb"]);
    assert!(e.conditions.contains(&NodeCondition::PidPressure));
}

#[test]
fn message_names_signal_threshold_and_usage() {
    let t = hard(EvictionSignal::AllocatableMemoryAvailable, mi(500));
    let obs = Observation { available: 421_844 * 1024, capacity: 1 << 30 };
    let v = victim(&cfg(vec![t.clone()]), &t, &obs, &pod("hog", 0, 0, 600), &usage);
    assert_eq!(
        v.message,
        "The node was low on resource: memory. Threshold quantity: 500Mi, available: 421844Ki. \
         Signal: allocatableMemory.available. Container c was using 600Mi, request is 0, has larger consumption of memory. "
    );
    assert_eq!(v.annotations["offending_containers"], "c");
    assert_eq!(v.annotations["offending_containers_usage"], "600Mi");
    assert_eq!(v.annotations["starved_resource"], "memory");
    assert_eq!(v.grace_period_secs, 0);
    let obs = Observation { available: -(5 * MI as i64), capacity: 1 };
    let v = victim(&cfg(vec![t.clone()]), &t, &obs, &pod("x", 0, 0, 0), &usage);
    assert!(v.message.contains("available: -5Mi."), "{}", v.message);
    // A container within its request is not an offender; a container
    // whose cgroup cannot be read counts as using nothing.
    let unread = |_: &str| None;
    let v = victim(&cfg(vec![t.clone()]), &t, &obs, &pod("y", 0, 100, 50), &unread);
    assert_eq!(
        (v.annotations["offending_containers"].as_str(), v.annotations["offending_containers_usage"].as_str()),
        ("", "")
    );
    // PIDs name the resource, with the annotations the kubelet always sets.
    let t = hard(EvictionSignal::PidAvailable, ThresholdValue::Quantity(Quantity::from_units(1000)));
    let v =
        victim(&cfg(vec![t.clone()]), &t, &Observation { available: 10, capacity: 32768 }, &pod("b", 0, 0, 0), &usage);
    assert!(v.message.starts_with("The node was low on resource: pids. Threshold quantity: 1000, available: 10."));
    assert_eq!(v.annotations["starved_resource"], "pids");
}
