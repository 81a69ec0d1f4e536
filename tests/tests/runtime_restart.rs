//! containerd stopped and started again under a running agent, on a
//! containerd of the test's own (the shared one keeps serving the others):
//! the CRI client reports the runtime down while it is gone and reconnects
//! (with back-off, capped at 5 s) when it is back, and the pod that ran
//! through it all is kept: same sandbox, same containers, no restart.

use std::time::{Duration, Instant};

use swiftlet::cri::api;
use swiftlet_tests::{agent::TestAgent, containerd::TestContainerd};

const BUSYBOX: &str = "swiftlet.local/busybox:1.35";

fn manifest() -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: steady\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [\"sleep\", \"3600\"]\n    readinessProbe:\n      exec: {{command: [\"true\"]}}\n      periodSeconds: 1\n"
    )
}

/// (sandbox ids, container ids) with their states, sorted.
type Ids = (Vec<(String, i32)>, Vec<(String, i32)>);

fn ids(agent: &TestAgent, uid: &str) -> Ids {
    let (s, c) = agent.runtime_state(uid);
    let mut s: Vec<_> = s.into_iter().map(|s| (s.id, s.state)).collect();
    let mut c: Vec<_> = c.into_iter().map(|c| (c.id, c.state)).collect();
    s.sort();
    c.sort();
    (s, c)
}

fn ready(s: &k8s_openapi::api::core::v1::PodStatus) -> bool {
    s.phase.as_deref() == Some("Running")
        && s.container_statuses.as_ref().is_some_and(|cs| cs.len() == 1 && cs[0].ready && cs[0].restart_count == 0)
}

fn wait(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < timeout, "{what} did not happen within {timeout:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    start.elapsed()
}

#[test]
fn a_restarted_containerd_is_reconnected_and_no_pod_is_recreated() {
    let mut ctd = TestContainerd::start("ctdrestart");
    let endpoint = format!("--container-runtime-endpoint={}", ctd.endpoint());
    let agent = TestAgent::start("", &["--signal-source=cgroupfs", &endpoint]);
    let name = agent.add_manifest("steady.yaml", &manifest());
    agent.wait_status(&name, Duration::from_secs(60), "running and ready", ready);
    let uid = agent.pod(&name).and_then(|p| p.metadata.uid).expect("the pod's uid");
    let before = ids(&agent, &uid);
    assert_eq!((before.0.len(), before.1.len()), (1, 1), "one sandbox, one container: {before:?}");
    assert_eq!(before.1[0].1, api::ContainerState::ContainerRunning as i32);
    let created_before = agent.events.with_reason("Created").len();
    assert!(agent.agent.cri.health().down_since.is_none(), "the runtime answers before the stop");

    ctd.stop();
    let noticed = wait("the agent noticing the runtime is gone", Duration::from_secs(15), || {
        agent.agent.cri.health().down_since.is_some()
    });
    println!("runtime down noticed after {noticed:?}");
    // Several relists, probes and syncs against a runtime that is not there.
    std::thread::sleep(Duration::from_secs(8));
    let h = agent.agent.cri.health();
    assert!(h.down_since.is_some(), "still down: {h:?}");
    let pod = agent.pod(&name).expect("the pod is still listed while the runtime is down");
    let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
    assert_eq!(phase.as_deref(), Some("Running"), "an unreachable runtime is not a failed pod");
    assert!(agent.events.with_reason("Killing").is_empty(), "nothing killed: {:#?}", agent.events.all());

    ctd.spawn();
    // Back-off caps at 5 s between dials, and the relist dials every second.
    let reconnected =
        wait("the agent reconnecting", Duration::from_secs(15), || agent.agent.cri.health().down_since.is_none());
    println!("reconnected {reconnected:?} after containerd answered");
    agent.wait_status(&name, Duration::from_secs(30), "ready again", ready);
    // Several syncs after the runtime came back.
    std::thread::sleep(Duration::from_secs(5));
    let after = ids(&agent, &uid);
    assert_eq!(after, before, "the same sandbox and container, still running");
    let status = agent.status(&name).expect("status");
    assert!(ready(&status), "ready with restartCount 0: {status:?}");
    assert_eq!(
        agent.events.with_reason("Created").len(),
        created_before,
        "no container created again: {:#?}",
        agent.events.all()
    );
    assert!(agent.events.with_reason("Killing").is_empty(), "nothing killed: {:#?}", agent.events.all());
    assert!(agent.events.with_reason("SandboxChanged").is_empty(), "no new sandbox: {:#?}", agent.events.all());
    drop(agent);
    assert!(ctd.is_running());
}
