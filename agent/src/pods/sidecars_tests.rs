use k8s_openapi::api::core::v1::{PodSpec, Probe};

use super::*;
use crate::pods::{
    observed::{ContainerState, SandboxState},
    plan::{self, PodActions},
};

/// A pod with init containers (`~name` is a sidecar) and regular ones.
fn pod(policy: &str, inits: &[&str], containers: &[&str]) -> Pod {
    let c = |n: &&str| Container {
        name: n.trim_start_matches('~').to_string(),
        image: Some("busybox".into()),
        restart_policy: n.starts_with('~').then(|| "Always".to_string()),
        ..Default::default()
    };
    let mut p = Pod::default();
    p.metadata.uid = Some("u".into());
    p.spec = Some(PodSpec {
        restart_policy: Some(policy.into()),
        init_containers: Some(inits.iter().map(c).collect()),
        containers: containers.iter().map(c).collect(),
        ..Default::default()
    });
    p
}

fn ctr(p: &Pod, name: &str, state: ContainerRunState, exit: i32, created: i64) -> ContainerState {
    let spec = p.spec.as_ref().unwrap();
    let c = spec.containers.iter().chain(spec.init_containers.iter().flatten()).find(|c| c.name == name).unwrap();
    ContainerState {
        id: format!("{name}-{created}"),
        sandbox_id: "sb0".into(),
        name: name.into(),
        attempt: 0,
        init: true,
        state,
        created_at: created,
        started_at: created,
        finished_at: created + 1,
        exit_code: exit,
        reason: String::new(),
        message: String::new(),
        image: "busybox".into(),
        image_ref: "sha256:x".into(),
        hash: crate::pods::spec::container_hash(c),
        grace_period_secs: None,
    }
}

fn observed(mut containers: Vec<ContainerState>) -> ObservedPod {
    containers.sort_by_key(|c| std::cmp::Reverse(c.created_at));
    let sandboxes = vec![SandboxState { id: "sb0".into(), attempt: 0, ready: true, created_at: 0, ip: None }];
    ObservedPod { sandboxes, containers }
}

use ContainerRunState::{Exited, Running, Unknown};

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn init_actions_table() {
    let none = HashMap::new();
    struct Case {
        name: &'static str,
        pod: Pod,
        observed: Box<dyn Fn(&Pod) -> ObservedPod>,
        probes: HashMap<String, ProbeVerdict>,
        want_start: Vec<String>,
        want_initialized: bool,
        want_kill_pod: bool,
        want_kills: Vec<&'static str>,
    }
    let case = |name, pod, observed: Box<dyn Fn(&Pod) -> ObservedPod>, start: &[&str], init: bool| Case {
        name,
        pod,
        observed,
        probes: HashMap::new(),
        want_start: names(start),
        want_initialized: init,
        want_kill_pod: false,
        want_kills: vec![],
    };
    let cases = vec![
        case(
            "nothing ran: the first init container",
            pod("Always", &["~proxy", "setup"], &["app"]),
            Box::new(|_| observed(vec![])),
            &["proxy"],
            false,
        ),
        case(
            "a running sidecar: the next init container starts",
            pod("Always", &["~proxy", "setup"], &["app"]),
            Box::new(|p| observed(vec![ctr(p, "proxy", Running, 0, 1)])),
            &["setup"],
            false,
        ),
        Case {
            probes: [("proxy-1".to_string(), ProbeVerdict::NotStarted)].into(),
            ..case(
                "a sidecar not started yet holds the next one back",
                pod("Always", &["~proxy", "setup"], &["app"]),
                Box::new(|p| observed(vec![ctr(p, "proxy", Running, 0, 1)])),
                &[],
                false,
            )
        },
        case(
            "the last init container done: initialized",
            pod("Always", &["~proxy", "setup"], &["app"]),
            Box::new(|p| observed(vec![ctr(p, "proxy", Running, 0, 1), ctr(p, "setup", Exited, 0, 2)])),
            &[],
            true,
        ),
        case(
            "a sidecar last and running: initialized",
            pod("Never", &["setup", "~proxy"], &["app"]),
            Box::new(|p| observed(vec![ctr(p, "setup", Exited, 0, 1), ctr(p, "proxy", Running, 0, 2)])),
            &[],
            true,
        ),
        case(
            "an exited sidecar is restarted after initialization, whatever the policy",
            pod("Never", &["~proxy"], &["app"]),
            Box::new(|p| observed(vec![ctr(p, "proxy", Exited, 1, 1), ctr(p, "app", Running, 0, 2)])),
            &["proxy"],
            true,
        ),
        case(
            "a sidecar removed from the runtime after initialization is started again",
            pod("Always", &["~proxy", "setup"], &["app"]),
            Box::new(|p| observed(vec![ctr(p, "app", Running, 0, 3)])),
            &["proxy"],
            true,
        ),
        case(
            "a failed regular init container is retried under OnFailure",
            pod("OnFailure", &["~proxy", "setup"], &["app"]),
            Box::new(|p| observed(vec![ctr(p, "proxy", Running, 0, 1), ctr(p, "setup", Exited, 3, 2)])),
            &["setup"],
            false,
        ),
        Case {
            want_kill_pod: true,
            ..case(
                "a failed regular init container fails a Never pod",
                pod("Never", &["~proxy", "setup"], &["app"]),
                Box::new(|p| observed(vec![ctr(p, "proxy", Running, 0, 1), ctr(p, "setup", Exited, 3, 2)])),
                &[],
                false,
            )
        },
        Case {
            probes: [("proxy-1".to_string(), ProbeVerdict::LivenessFailed)].into(),
            want_kills: vec!["Init container proxy failed liveness probe"],
            ..case(
                "a sidecar failing liveness is restarted",
                pod("Always", &["~proxy"], &["app"]),
                Box::new(|p| observed(vec![ctr(p, "proxy", Running, 0, 1), ctr(p, "app", Running, 0, 2)])),
                &["proxy"],
                true,
            )
        },
        Case {
            want_kills: vec!["Init container is in \"unknown\" state, try killing it before restart"],
            ..case(
                "a sidecar in an unknown state is killed and started again",
                pod("Always", &["~proxy"], &["app"]),
                Box::new(|p| observed(vec![ctr(p, "proxy", Unknown, 0, 1), ctr(p, "app", Running, 0, 2)])),
                &["proxy"],
                true,
            )
        },
    ];
    for c in cases {
        let obs = (c.observed)(&c.pod);
        let got = init_actions(&c.pod, &obs, if c.probes.is_empty() { &none } else { &c.probes });
        assert_eq!(got.start, c.want_start, "{}: start", c.name);
        assert_eq!(got.initialized, c.want_initialized, "{}: initialized", c.name);
        assert_eq!(got.kill_pod, c.want_kill_pod, "{}: kill_pod", c.name);
        assert_eq!(got.kill.iter().map(|k| k.message.as_str()).collect::<Vec<_>>(), c.want_kills, "{}: kills", c.name);
    }
}

#[test]
fn the_pod_completes_when_its_regular_containers_do() {
    let p = pod("Never", &["~proxy"], &["app"]);
    let obs = observed(vec![ctr(&p, "proxy", Running, 0, 1), ctr(&p, "app", Exited, 0, 2)]);
    let a = plan::compute(&p, &obs, &HashMap::new());
    assert_eq!(
        a,
        PodActions { kill_pod: true, sandbox_id: Some("sb0".into()), ..Default::default() },
        "the running sidecar is stopped with the pod, not kept nor restarted"
    );
    // Under Always the app is restarted and the sidecar keeps running.
    let p = pod("Always", &["~proxy"], &["app"]);
    let obs = observed(vec![ctr(&p, "proxy", Running, 0, 1), ctr(&p, "app", Exited, 0, 2)]);
    let a = plan::compute(&p, &obs, &HashMap::new());
    assert_eq!((a.kill_pod, a.start, a.init_start), (false, names(&["app"]), vec![]));
}

#[test]
fn a_new_pod_with_sidecars_starts_its_first_init_container_in_a_new_sandbox() {
    let p = pod("Always", &["~proxy"], &["app"]);
    let a = plan::compute(&p, &ObservedPod::default(), &HashMap::new());
    assert_eq!((a.create_sandbox, a.next_init.as_deref()), (Some(0), Some("proxy")));
    let mut p = p;
    p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].startup_probe = Some(Probe::default());
    assert!(has_sidecars(&p));
}

#[test]
fn a_completed_pod_gets_no_new_sandbox_when_its_sandbox_is_gone() {
    // After an agent restart: the app succeeded, the sidecar was stopped
    // with the pod (137), the sandbox is down.
    let p = pod("OnFailure", &["~proxy"], &["app"]);
    let mut obs = observed(vec![ctr(&p, "proxy", Exited, 137, 1), ctr(&p, "app", Exited, 0, 2)]);
    obs.sandboxes[0].ready = false;
    let a = plan::compute(&p, &obs, &HashMap::new());
    assert_eq!(a, PodActions { kill_pod: true, ..Default::default() });
}

#[test]
fn sidecars_stop_last_in_reverse_order() {
    let p = pod("Always", &["~log", "setup", "~proxy"], &["app", "web"]);
    let (first, last) = termination_order(&p, &["proxy", "app", "log", "web"]);
    assert_eq!((first, last), (vec!["app", "web"], vec!["proxy", "log"]));
}
