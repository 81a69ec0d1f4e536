//! Service environment variables, as the kubelet's getServiceEnvVarMap and
//! envvars.FromServices make them: `<NAME>_SERVICE_HOST`,
//! `<NAME>_SERVICE_PORT` (and `_<PORT NAME>`), and the Docker link
//! variables (`<NAME>_PORT`, `<NAME>_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR]`)
//! for the `kubernetes` service of the `default` namespace always, and for
//! every service of the pod's namespace when `enableServiceLinks` is on
//! (its default). Services without a cluster IP (headless) are skipped.
//! Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Service};

fn env_name(s: &str) -> String {
    s.replace('-', "_").to_uppercase()
}

fn cluster_ip(s: &Service) -> Option<&str> {
    s.spec.as_ref()?.cluster_ip.as_deref().filter(|ip| !ip.is_empty() && *ip != "None")
}

fn join_host_port(ip: &str, port: i32) -> String {
    if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") }
}

/// The variables of one service, in the kubelet's order.
fn service_vars(s: &Service, ip: &str, out: &mut Vec<(String, String)>) {
    let prefix = env_name(s.metadata.name.as_deref().unwrap_or(""));
    let ports = s.spec.as_ref().and_then(|sp| sp.ports.as_deref()).unwrap_or(&[]);
    out.push((format!("{prefix}_SERVICE_HOST"), ip.to_owned()));
    let Some(first) = ports.first() else { return };
    out.push((format!("{prefix}_SERVICE_PORT"), first.port.to_string()));
    for p in ports {
        if let Some(name) = p.name.as_deref().filter(|n| !n.is_empty()) {
            out.push((format!("{prefix}_SERVICE_PORT_{}", env_name(name)), p.port.to_string()));
        }
    }
    for (i, p) in ports.iter().enumerate() {
        let proto = p.protocol.clone().filter(|p| !p.is_empty()).unwrap_or_else(|| "TCP".into());
        let url = format!("{}://{}", proto.to_lowercase(), join_host_port(ip, p.port));
        if i == 0 {
            out.push((format!("{prefix}_PORT"), url.clone()));
        }
        let port_prefix = format!("{prefix}_PORT_{}_{}", p.port, proto.to_uppercase());
        out.push((port_prefix.clone(), url));
        out.push((format!("{port_prefix}_PROTO"), proto.to_lowercase()));
        out.push((format!("{port_prefix}_PORT"), p.port.to_string()));
        out.push((format!("{port_prefix}_ADDR"), ip.to_owned()));
    }
}

/// The service variables a pod's containers get, sorted by service name.
pub fn service_env(pod: &Pod, services: &[Service]) -> Vec<(String, String)> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let links = pod.spec.as_ref().and_then(|s| s.enable_service_links).unwrap_or(true);
    let mut chosen: BTreeMap<String, &Service> = BTreeMap::new();
    for s in services {
        if cluster_ip(s).is_none() {
            continue;
        }
        let name = s.metadata.name.clone().unwrap_or_default();
        let ns = s.metadata.namespace.as_deref().unwrap_or("default");
        if ns == "default" && name == "kubernetes" {
            chosen.entry(name).or_insert(s);
        } else if ns == namespace && links {
            chosen.insert(name, s);
        }
    }
    let mut out = vec![];
    for s in chosen.values() {
        service_vars(s, cluster_ip(s).expect("filtered above"), &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSpec, ServicePort, ServiceSpec};

    use super::*;

    fn svc(ns: &str, name: &str, ip: &str, ports: &[(Option<&str>, i32, Option<&str>)]) -> Service {
        let mut s = Service::default();
        s.metadata.namespace = Some(ns.into());
        s.metadata.name = Some(name.into());
        s.spec = Some(ServiceSpec {
            cluster_ip: Some(ip.into()),
            ports: Some(
                ports
                    .iter()
                    .map(|(n, p, proto)| ServicePort {
                        name: n.map(str::to_owned),
                        port: *p,
                        protocol: proto.map(str::to_owned),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        s
    }

    fn pod(ns: &str, links: Option<bool>) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some(ns.into());
        p.spec = Some(PodSpec { enable_service_links: links, ..Default::default() });
        p
    }

    #[test]
    fn variables_as_the_kubelet_makes_them() {
        let services = vec![
            svc("default", "kubernetes", "10.96.0.1", &[(Some("https"), 443, None)]),
            svc("prod", "redis-primary", "10.96.3.4", &[(None, 6379, None), (Some("metrics"), 9121, Some("TCP"))]),
            svc("prod", "headless", "None", &[(None, 80, None)]),
            svc("other", "elsewhere", "10.96.9.9", &[(None, 80, None)]),
        ];
        let env: BTreeMap<String, String> = service_env(&pod("prod", None), &services).into_iter().collect();
        assert_eq!(env["KUBERNETES_SERVICE_HOST"], "10.96.0.1");
        assert_eq!(env["KUBERNETES_SERVICE_PORT"], "443");
        assert_eq!(env["KUBERNETES_SERVICE_PORT_HTTPS"], "443");
        assert_eq!(env["KUBERNETES_PORT"], "tcp://10.96.0.1:443");
        assert_eq!(env["KUBERNETES_PORT_443_TCP"], "tcp://10.96.0.1:443");
        assert_eq!(env["KUBERNETES_PORT_443_TCP_PROTO"], "tcp");
        assert_eq!(env["KUBERNETES_PORT_443_TCP_PORT"], "443");
        assert_eq!(env["KUBERNETES_PORT_443_TCP_ADDR"], "10.96.0.1");
        assert_eq!(env["REDIS_PRIMARY_SERVICE_HOST"], "10.96.3.4");
        assert_eq!(env["REDIS_PRIMARY_SERVICE_PORT"], "6379");
        assert_eq!(env["REDIS_PRIMARY_SERVICE_PORT_METRICS"], "9121");
        assert_eq!(env["REDIS_PRIMARY_PORT_9121_TCP"], "tcp://10.96.3.4:9121");
        assert!(!env.keys().any(|k| k.starts_with("HEADLESS") || k.starts_with("ELSEWHERE")));

        let off: BTreeMap<String, String> = service_env(&pod("prod", Some(false)), &services).into_iter().collect();
        assert!(off.contains_key("KUBERNETES_SERVICE_HOST"), "the master service is always there");
        assert!(!off.contains_key("REDIS_PRIMARY_SERVICE_HOST"));
    }

    #[test]
    fn ipv6_addresses_are_bracketed() {
        let services = vec![svc("default", "kubernetes", "fd00::1", &[(Some("https"), 443, None)])];
        let env: BTreeMap<String, String> = service_env(&pod("x", None), &services).into_iter().collect();
        assert_eq!(env["KUBERNETES_PORT"], "tcp://[fd00::1]:443");
    }
}
