//! The API server's defaults for a v1 Pod (SetObjectDefaults_Pod), for the
//! fields the kubelet reads. The kubelet decodes static manifests with
//! these defaults; pods from the API server have them already, and filling
//! them again changes nothing.

use k8s_openapi::api::core::v1::{Container, Pod, Probe};

use crate::images::policy::PullPolicy;

pub const DEFAULT_TERMINATION_GRACE_SECONDS: i64 = 30;
pub const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";

/// Fills every unset field the kubelet depends on.
pub fn apply(pod: &mut Pod) {
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.restart_policy.get_or_insert_with(|| "Always".into());
    spec.termination_grace_period_seconds.get_or_insert(DEFAULT_TERMINATION_GRACE_SECONDS);
    spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
    spec.scheduler_name.get_or_insert_with(|| "default-scheduler".into());
    spec.enable_service_links.get_or_insert(true);
    spec.security_context.get_or_insert_with(Default::default);
    if spec.host_network == Some(true) {
        // Host-network pods publish their container ports on the host.
        for c in spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten()) {
            for p in c.ports.iter_mut().flatten() {
                p.host_port.get_or_insert(p.container_port);
            }
        }
    }
    for c in spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten()) {
        container(c);
    }
}

fn container(c: &mut Container) {
    if c.image_pull_policy.as_deref().unwrap_or("").is_empty() {
        c.image_pull_policy = Some(PullPolicy::effective(None, c.image.as_deref().unwrap_or("")).as_str().into());
    }
    c.termination_message_path.get_or_insert_with(|| DEFAULT_TERMINATION_MESSAGE_PATH.into());
    c.termination_message_policy.get_or_insert_with(|| "File".into());
    for p in c.ports.iter_mut().flatten() {
        p.protocol.get_or_insert_with(|| "TCP".into());
    }
    for probe in [&mut c.liveness_probe, &mut c.readiness_probe, &mut c.startup_probe].into_iter().flatten() {
        self::probe(probe);
    }
}

fn probe(p: &mut Probe) {
    p.timeout_seconds.get_or_insert(1);
    p.period_seconds.get_or_insert(10);
    p.success_threshold.get_or_insert(1);
    p.failure_threshold.get_or_insert(3);
    if let Some(h) = &mut p.http_get {
        h.path.get_or_insert_with(|| "/".into());
        h.scheme.get_or_insert_with(|| "HTTP".into());
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerPort, PodSpec};

    use super::*;

    fn pod(image: &str, host_network: bool) -> Pod {
        Pod {
            spec: Some(PodSpec {
                host_network: Some(host_network),
                containers: vec![Container {
                    name: "c".into(),
                    image: Some(image.into()),
                    ports: Some(vec![ContainerPort { container_port: 8080, ..Default::default() }]),
                    liveness_probe: Some(Probe::default()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn fills_what_the_kubelet_reads() {
        let mut p = pod("busybox", true);
        apply(&mut p);
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
        let c = &spec.containers[0];
        assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
        assert_eq!(c.termination_message_path.as_deref(), Some("/dev/termination-log"));
        let port = &c.ports.as_ref().unwrap()[0];
        assert_eq!((port.protocol.as_deref(), port.host_port), (Some("TCP"), Some(8080)));
        let probe = c.liveness_probe.as_ref().unwrap();
        assert_eq!(
            (probe.timeout_seconds, probe.period_seconds, probe.success_threshold, probe.failure_threshold),
            (Some(1), Some(10), Some(1), Some(3))
        );
    }

    #[test]
    fn pull_policy_follows_the_tag_and_defaults_are_idempotent() {
        for (image, policy) in [("busybox:1.35", "IfNotPresent"), ("busybox:latest", "Always"), ("busybox", "Always")] {
            let mut p = pod(image, false);
            apply(&mut p);
            assert_eq!(p.spec.as_ref().unwrap().containers[0].image_pull_policy.as_deref(), Some(policy), "{image}");
            let port = &p.spec.as_ref().unwrap().containers[0].ports.as_ref().unwrap()[0];
            assert_eq!(port.host_port, None, "only host-network pods get host ports by default");
            let once = p.clone();
            apply(&mut p);
            assert_eq!(p, once);
        }
    }
}
