//! The real binary killed with SIGKILL and started again: what runs is
//! re-adopted from the runtime's state, with no container restarted and no
//! sandbox created twice.

use std::time::{Duration, Instant};

use swiftlet::cri::{self, api};
use swiftlet_tests::agent::{AgentProcess, AgentSetup};

const BUSYBOX: &str = "swiftlet.local/busybox:1.35";

fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  initContainers:\n  - name: init\n    image: {BUSYBOX}\n    command: [\"true\"]\n  containers:\n  - name: a\n    image: {BUSYBOX}\n    command: [\"sleep\", \"3600\"]\n  - name: b\n    image: {BUSYBOX}\n    command: [\"sleep\", \"3600\"]\n"
    )
}

/// (sandbox ids, (container id, name, state)) sorted, for comparison.
type State = (Vec<(String, i32)>, Vec<(String, String, i32)>);

fn state(agent: &AgentProcess, uid: &str) -> State {
    let (s, c) = agent.runtime_state(uid);
    let mut sandboxes: Vec<(String, i32)> = s.into_iter().map(|s| (s.id, s.state)).collect();
    let mut containers: Vec<(String, String, i32)> =
        c.into_iter().map(|c| (c.id, c.metadata.map(|m| m.name).unwrap_or_default(), c.state)).collect();
    sandboxes.sort();
    containers.sort();
    (sandboxes, containers)
}

fn all_up(s: &State) -> bool {
    let running =
        |n: &str| s.1.iter().any(|(_, name, st)| name == n && *st == api::ContainerState::ContainerRunning as i32);
    s.0.len() == 1 && cri::sandbox_ready(s.0[0].1) && running("a") && running("b")
}

/// The relist's lean decoding (id, state, and the pod named by the labels,
/// read from their wire entries) of containerd's real responses agrees
/// with the full messages.
fn relist_matches_full_listing(agent: &AgentProcess, uid: &str) {
    use swiftlet::cri::{Listed, RuntimeService, labels};
    let (s, c) = agent.runtime_state(uid);
    let mut sel = labels::managed_selector();
    sel.insert(labels::POD_UID.into(), uid.into());
    let (ls, lc) = agent
        .rt
        .block_on(agent.cri.list_states(
            Some(api::PodSandboxFilter { label_selector: sel.clone(), ..Default::default() }),
            Some(api::ContainerFilter { label_selector: sel, ..Default::default() }),
        ))
        .expect("list_states");
    let sorted = |mut v: Vec<Listed>| {
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    };
    let full_s = s.into_iter().map(|s| Listed { pod: labels::identity(&s.labels), id: s.id, state: s.state }).collect();
    let full_c = c.into_iter().map(|c| Listed { pod: labels::identity(&c.labels), id: c.id, state: c.state }).collect();
    assert_eq!(sorted(ls), sorted(full_s));
    let lc = sorted(lc);
    assert_eq!(lc.len(), 3, "{lc:?}");
    assert!(lc.iter().all(|c| c.pod.as_ref().map(|p| p.uid.as_str()) == Some(uid)), "{lc:?}");
    assert_eq!(lc, sorted(full_c));
}

#[test]
fn a_killed_agent_readopts_its_pods_with_zero_restarts() {
    let setup = AgentSetup::new("", &["--signal-source=cgroupfs"]);
    setup.add_manifest("web.yaml", &manifest("web"));
    let uid =
        swiftlet::pods::manifest::load(&setup.manifests.join("web.yaml"), &setup.node).unwrap().metadata.uid.unwrap();
    let mut agent = AgentProcess::start(setup);

    let deadline = Instant::now() + Duration::from_secs(60);
    let before = loop {
        let s = state(&agent, &uid);
        if all_up(&s) {
            break s;
        }
        assert!(Instant::now() < deadline, "the pod did not start: {s:?}\n{}", agent.log());
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(before.1.len(), 3, "init, a and b: {before:?}");
    relist_matches_full_listing(&agent, &uid);

    agent.kill();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(state(&agent, &uid), before, "pods keep running while the agent is down");
    let log_len = agent.log().len();
    agent.spawn();
    // Several relists and syncs.
    std::thread::sleep(Duration::from_secs(10));
    let after = state(&agent, &uid);
    assert_eq!(after, before, "re-adopted as it was: same sandbox, same containers, nothing new\n{}", agent.log());
    let second_run = agent.log()[log_len..].to_owned();
    assert!(second_run.contains("pod added"), "the restarted agent took the pod over:\n{second_run}");
    assert!(!second_run.contains("Created container"), "nothing was recreated:\n{second_run}");

    // And it still manages the pod: deleting the manifest stops it.
    std::fs::remove_file(agent.setup.manifests.join("web.yaml")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while state(&agent, &uid) != (vec![], vec![]) {
        assert!(Instant::now() < deadline, "the pod was not removed: {:?}\n{}", state(&agent, &uid), agent.log());
        std::thread::sleep(Duration::from_millis(200));
    }
}
