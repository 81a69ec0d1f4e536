//! A pod's names and its kubelet-managed `/etc/hosts`, as the kubelet
//! makes them (GeneratePodHostNameAndDomain, GetNodenameForKernel,
//! managedHostsFileContent, nodeHostsFileContent):
//!
//! - hostname: `spec.hostname`, else the pod's name, cut to 63 characters
//!   without a trailing `-` or `.`;
//! - domain: `<subdomain>.<namespace>.svc.<clusterDomain>` when
//!   `spec.subdomain` is set;
//! - the kernel's host name (the sandbox's) is the FQDN with
//!   `setHostnameAsFQDN`, else the short name;
//! - `/etc/hosts` (`<root-dir>/pods/<uid>/etc-hosts`, mounted into every
//!   container that does not mount something at /etc/hosts itself, once
//!   the pod has an address): localhost entries, the pod's addresses with
//!   its FQDN and name, and `hostAliases`; host-network pods get the
//!   node's own file with the aliases appended.
//!
//! Pure.

use k8s_openapi::api::core::v1::{HostAlias, Pod};

/// Where a container sees the managed file.
pub const ETC_HOSTS: &str = "/etc/hosts";

const MAX_HOSTNAME: usize = 63;

/// The pod's short host name and its domain ("" without a subdomain).
pub fn hostname_and_domain(pod: &Pod, cluster_domain: Option<&str>) -> (String, String) {
    let spec = pod.spec.as_ref();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let hostname = spec.and_then(|s| s.hostname.clone()).filter(|h| !h.is_empty()).unwrap_or(name);
    let hostname = if hostname.len() > MAX_HOSTNAME {
        hostname[..MAX_HOSTNAME].trim_end_matches(['-', '.']).to_owned()
    } else {
        hostname
    };
    let domain = match spec.and_then(|s| s.subdomain.as_deref()).filter(|s| !s.is_empty()) {
        Some(sub) => format!(
            "{sub}.{}.svc.{}",
            pod.metadata.namespace.as_deref().unwrap_or("default"),
            cluster_domain.unwrap_or("")
        ),
        None => String::new(),
    };
    (hostname, domain)
}

/// The host name the sandbox's UTS namespace gets: the FQDN when the pod
/// asks for it with setHostnameAsFQDN and has a domain. Linux caps it at
/// 64 characters, so a longer FQDN is an error (the kubelet's
/// GetNodenameForKernel).
pub fn kernel_hostname(pod: &Pod, cluster_domain: Option<&str>) -> Result<String, String> {
    let (hostname, domain) = hostname_and_domain(pod, cluster_domain);
    let as_fqdn = pod.spec.as_ref().and_then(|s| s.set_hostname_as_fqdn).unwrap_or(false);
    if !as_fqdn || domain.is_empty() {
        return Ok(hostname);
    }
    let fqdn = format!("{hostname}.{domain}");
    if fqdn.len() > 64 {
        return Err(format!(
            "failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too long (64 characters is \
             the max, {} characters requested)",
            fqdn.len()
        ));
    }
    Ok(fqdn)
}

fn alias_lines(aliases: &[HostAlias]) -> String {
    if aliases.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n# Entries added by HostAliases.\n");
    for a in aliases {
        out.push_str(&format!("{}\t{}\n", a.ip, a.hostnames.clone().unwrap_or_default().join("\t")));
    }
    out
}

/// The managed file of a pod with its own network namespace.
pub fn managed_hosts(pod_ips: &[String], hostname: &str, domain: &str, aliases: &[HostAlias]) -> String {
    let mut out = String::from("# Kubernetes-managed hosts file.\n");
    out.push_str("127.0.0.1\tlocalhost\n");
    out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
    out.push_str("fe00::0\tip6-localnet\n");
    out.push_str("fe00::0\tip6-mcastprefix\n");
    out.push_str("fe00::1\tip6-allnodes\n");
    out.push_str("fe00::2\tip6-allrouters\n");
    for ip in pod_ips {
        if domain.is_empty() {
            out.push_str(&format!("{ip}\t{hostname}\n"));
        } else {
            out.push_str(&format!("{ip}\t{hostname}.{domain}\t{hostname}\n"));
        }
    }
    out.push_str(&alias_lines(aliases));
    out
}

/// The file of a host-network pod: the node's /etc/hosts and the aliases.
pub fn host_network_hosts(node_hosts: &str, aliases: &[HostAlias]) -> String {
    format!("# Kubernetes-managed hosts file (host network).\n{node_hosts}{}", alias_lines(aliases))
}

/// The file a pod's containers get.
pub fn hosts_file(pod: &Pod, pod_ips: &[String], cluster_domain: Option<&str>, node_hosts: &str) -> String {
    let spec = pod.spec.as_ref();
    let aliases = spec.and_then(|s| s.host_aliases.as_deref()).unwrap_or(&[]);
    if spec.and_then(|s| s.host_network).unwrap_or(false) {
        return host_network_hosts(node_hosts, aliases);
    }
    let (hostname, domain) = hostname_and_domain(pod, cluster_domain);
    managed_hosts(pod_ips, &hostname, &domain, aliases)
}

/// Whether a container gets the managed file: the pod has an address and
/// the container mounts nothing at /etc/hosts itself.
pub fn mounts_hosts_file(c: &k8s_openapi::api::core::v1::Container, pod_ips: &[String]) -> bool {
    !pod_ips.is_empty() && !c.volume_mounts.iter().flatten().any(|m| m.mount_path == ETC_HOSTS)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, PodSpec, VolumeMount};

    use super::*;

    fn pod(name: &str, hostname: Option<&str>, subdomain: Option<&str>, fqdn: bool) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("prod".into());
        p.spec = Some(PodSpec {
            hostname: hostname.map(str::to_owned),
            subdomain: subdomain.map(str::to_owned),
            set_hostname_as_fqdn: Some(fqdn),
            ..Default::default()
        });
        p
    }

    #[test]
    fn names() {
        let cd = Some("cluster.local");
        assert_eq!(hostname_and_domain(&pod("web-0", None, None, false), cd), ("web-0".into(), String::new()));
        assert_eq!(
            hostname_and_domain(&pod("web-0", Some("db"), Some("backend"), false), cd),
            ("db".into(), "backend.prod.svc.cluster.local".into())
        );
        let long = format!("{}-x", "a".repeat(62));
        assert_eq!(
            hostname_and_domain(&pod(&long, None, None, false), cd).0,
            "a".repeat(62),
            "cut at 63 without the '-'"
        );
        assert_eq!(kernel_hostname(&pod("web-0", None, Some("backend"), false), cd).unwrap(), "web-0");
        assert_eq!(
            kernel_hostname(&pod("web-0", None, Some("backend"), true), cd).unwrap(),
            "web-0.backend.prod.svc.cluster.local"
        );
        assert_eq!(kernel_hostname(&pod("web-0", None, None, true), cd).unwrap(), "web-0", "no domain, no FQDN");
        let too_long = pod(&"a".repeat(40), None, Some("backend"), true);
        assert!(kernel_hostname(&too_long, cd).unwrap_err().contains("is too long (64 characters is the max"));
    }

    #[test]
    fn managed_file_as_the_kubelet_writes_it() {
        let aliases = vec![
            HostAlias { ip: "10.1.2.3".into(), hostnames: Some(vec!["foo.local".into(), "bar.local".into()]) },
            HostAlias { ip: "10.1.2.4".into(), hostnames: Some(vec!["baz".into()]) },
        ];
        let mut p = pod("web-0", None, Some("backend"), false);
        p.spec.as_mut().unwrap().host_aliases = Some(aliases);
        let text = hosts_file(&p, &["10.244.0.5".into()], Some("cluster.local"), "");
        assert_eq!(
            text,
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
             fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n\
             10.244.0.5\tweb-0.backend.prod.svc.cluster.local\tweb-0\n\n# Entries added by HostAliases.\n\
             10.1.2.3\tfoo.local\tbar.local\n10.1.2.4\tbaz\n"
        );
        p.spec.as_mut().unwrap().host_network = Some(true);
        let text = hosts_file(&p, &["10.0.0.1".into()], Some("cluster.local"), "127.0.0.1 localhost\n");
        assert!(text.starts_with("# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n\n# Entries"));
    }

    #[test]
    fn which_containers_get_it() {
        let c = Container::default();
        assert!(mounts_hosts_file(&c, &["10.0.0.1".into()]));
        assert!(!mounts_hosts_file(&c, &[]), "no address yet");
        let own = Container {
            volume_mounts: Some(vec![VolumeMount {
                name: "h".into(),
                mount_path: "/etc/hosts".into(),
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert!(!mounts_hosts_file(&own, &["10.0.0.1".into()]));
    }
}
