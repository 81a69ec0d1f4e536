//! The CRI configs the kubelet derives from a PodSpec: the sandbox config
//! (identity, log directory, hostname, DNS, ports, namespaces, cgroup
//! parent) and each container's config (image, command, env, mounts,
//! resources, security context, labels and annotations). Pure.

use std::{collections::HashMap, path::PathBuf, time::Duration};

use k8s_openapi::api::core::v1::{Container, Pod};
use sha2::{Digest, Sha256};

use super::{
    env::{self, DownwardContext, EnvError},
    hosts,
    security::{self, ImageUser, SecuritySettings},
};
use crate::{
    cm::{
        hugepages,
        naming::{CgroupNaming, milli_cpu_to_quota, milli_cpu_to_shares},
        qos::{oom_score_adj, qos_class},
    },
    cri::{
        api,
        labels::{self, PodIdentity},
    },
    volumes::objects::EnvObjects,
};

/// Node-wide settings the configs depend on.
#[derive(Clone, Debug)]
pub struct NodeSettings {
    pub node_name: String,
    pub node_ip: Option<String>,
    pub pod_logs_dir: PathBuf,
    /// `<root-dir>/pods`: per-pod files (termination messages).
    pub pods_dir: PathBuf,
    pub memory_capacity: u64,
    pub cpu_cfs_quota: bool,
    pub cpu_cfs_quota_period: Duration,
    pub naming: CgroupNaming,
    /// The host's resolv.conf contents (the `Default` DNS policy).
    pub host_dns: api::DnsConfig,
    pub cluster_dns: Vec<String>,
    pub cluster_domain: Option<String>,
    pub allocatable_cpu_milli: i64,
    pub allocatable_memory: i64,
    pub allocatable_ephemeral_storage: i64,
    /// Security profiles, OOM kill scope and huge pages.
    pub features: NodeFeatures,
}

/// What the node contributes to containers beyond names and sizes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFeatures {
    pub security: SecuritySettings,
    /// memory.oom.group=1 for containers (cgroup v2 without
    /// singleProcessOOMKill): an OOM kill ends the whole container.
    pub oom_kills_whole_container: bool,
    /// The host's huge page sizes in bytes, when its hugetlb controller can
    /// limit them (every container then gets a limit per size).
    pub hugepage_sizes: Vec<u64>,
}

/// Why a container's config cannot be made: the kubelet reports it as
/// CreateContainerConfigError.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ContainerConfigError(pub String);

impl From<EnvError> for ContainerConfigError {
    fn from(e: EnvError) -> Self {
        ContainerConfigError(e.0)
    }
}

pub fn identity(pod: &Pod) -> PodIdentity {
    PodIdentity {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        namespace: pod.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
        name: pod.metadata.name.clone().unwrap_or_default(),
    }
}

/// `<podLogsDir>/<namespace>_<name>_<uid>`, the kubelet's layout that log
/// shippers depend on.
pub fn pod_log_dir(settings: &NodeSettings, id: &PodIdentity) -> PathBuf {
    settings.pod_logs_dir.join(format!("{}_{}_{}", id.namespace, id.name, id.uid))
}

/// Relative to the pod log dir: `<container>/<restartCount>.log`.
pub fn container_log_path(container: &str, restart_count: u32) -> String {
    format!("{container}/{restart_count}.log")
}

/// Where a container instance's termination message is written.
pub fn termination_message_file(settings: &NodeSettings, uid: &str, container: &str, attempt: u32) -> PathBuf {
    settings.pods_dir.join(uid).join("containers").join(container).join(format!("termination-{attempt}"))
}

/// Whether the pod runs in the node's network namespace.
pub fn host_network(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false)
}

fn namespace_options(pod: &Pod) -> api::NamespaceOption {
    let spec = pod.spec.as_ref();
    let mode = |node: bool, pod_wide: bool| {
        if node {
            api::NamespaceMode::Node as i32
        } else if pod_wide {
            api::NamespaceMode::Pod as i32
        } else {
            api::NamespaceMode::Container as i32
        }
    };
    api::NamespaceOption {
        network: mode(host_network(pod), true),
        pid: mode(
            spec.and_then(|s| s.host_pid).unwrap_or(false),
            spec.and_then(|s| s.share_process_namespace).unwrap_or(false),
        ),
        ipc: mode(spec.and_then(|s| s.host_ipc).unwrap_or(false), true),
        ..Default::default()
    }
}

/// The DNS the sandbox gets, as the kubelet's dns configurer decides:
/// ClusterFirst without cluster DNS, and host-network pods without
/// ClusterFirstWithHostNet, fall back to the host's resolv.conf.
pub fn dns_config(pod: &Pod, settings: &NodeSettings) -> Option<api::DnsConfig> {
    let spec = pod.spec.as_ref()?;
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let cluster_first = match policy {
        "ClusterFirstWithHostNet" => true,
        "ClusterFirst" => !host_network(pod),
        _ => false,
    };
    let mut cfg = match policy {
        "None" => api::DnsConfig::default(),
        _ if cluster_first && !settings.cluster_dns.is_empty() => {
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            let mut searches = vec![];
            if let Some(domain) = settings.cluster_domain.as_deref().filter(|d| !d.is_empty()) {
                searches = vec![format!("{ns}.svc.{domain}"), format!("svc.{domain}"), domain.to_owned()];
            }
            searches.extend(settings.host_dns.searches.iter().cloned());
            api::DnsConfig { servers: settings.cluster_dns.clone(), searches, options: vec!["ndots:5".into()] }
        }
        _ => settings.host_dns.clone(),
    };
    if let Some(extra) = &spec.dns_config {
        cfg.servers.extend(extra.nameservers.iter().flatten().cloned());
        cfg.searches.extend(extra.searches.iter().flatten().cloned());
        for o in extra.options.iter().flatten() {
            let Some(name) = &o.name else { continue };
            cfg.options.retain(|existing| existing.split(':').next() != Some(name.as_str()));
            cfg.options.push(match &o.value {
                Some(v) => format!("{name}:{v}"),
                None => name.clone(),
            });
        }
    }
    Some(cfg)
}

/// Reads resolv.conf text into a DNS config.
pub fn parse_resolv_conf(text: &str) -> api::DnsConfig {
    let mut cfg = api::DnsConfig::default();
    for line in text.lines() {
        let mut words = line.split('#').next().unwrap_or("").split_whitespace();
        match words.next() {
            Some("nameserver") => cfg.servers.extend(words.next().map(str::to_owned)),
            Some("search") | Some("domain") => cfg.searches = words.map(str::to_owned).collect(),
            Some("options") => cfg.options.extend(words.map(str::to_owned)),
            _ => {}
        }
    }
    cfg
}

pub fn sandbox_config(pod: &Pod, attempt: u32, settings: &NodeSettings) -> api::PodSandboxConfig {
    let id = identity(pod);
    let spec = pod.spec.as_ref();
    // Host-network pods share the node's UTS namespace: the runtime must
    // not set a hostname for them.
    let hostname = if host_network(pod) {
        String::new()
    } else {
        // A FQDN too long for the kernel falls back to the short name here;
        // the pod's validation reports it.
        hosts::kernel_hostname(pod, settings.cluster_domain.as_deref())
            .unwrap_or_else(|_| hosts::hostname_and_domain(pod, settings.cluster_domain.as_deref()).0)
    };
    let mut port_mappings = vec![];
    for c in spec.map(|s| &s.containers[..]).unwrap_or(&[]) {
        for p in c.ports.iter().flatten() {
            let host_port = p.host_port.unwrap_or(0);
            if host_port <= 0 && !host_network(pod) {
                continue;
            }
            port_mappings.push(api::PortMapping {
                protocol: match p.protocol.as_deref() {
                    Some("UDP") => api::Protocol::Udp as i32,
                    Some("SCTP") => api::Protocol::Sctp as i32,
                    _ => api::Protocol::Tcp as i32,
                },
                container_port: p.container_port,
                host_port,
                host_ip: p.host_ip.clone().unwrap_or_default(),
            });
        }
    }
    let psc = spec.and_then(|s| s.security_context.as_ref());
    let qos = spec.map(qos_class).unwrap_or(crate::cm::qos::QosClass::BestEffort);
    let pod_labels = pod.metadata.labels.clone().unwrap_or_default();
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: id.name.clone(),
            uid: id.uid.clone(),
            namespace: id.namespace.clone(),
            attempt,
        }),
        hostname,
        log_directory: pod_log_dir(settings, &id).to_string_lossy().into_owned(),
        dns_config: dns_config(pod, settings),
        port_mappings,
        labels: labels::sandbox_labels(&id, &pod_labels),
        annotations: pod.metadata.annotations.clone().unwrap_or_default().into_iter().collect(),
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: settings.naming.cri_parent(qos, &id.uid),
            security_context: Some(security::sandbox_context(pod, namespace_options(pod))),
            sysctls: psc
                .and_then(|s| s.sysctls.as_ref())
                .into_iter()
                .flatten()
                .map(|s| (s.name.clone(), s.value.clone()))
                .collect(),
            ..Default::default()
        }),
        windows: None,
    }
}

/// The container hash the runtime's containers carry (the
/// `io.kubernetes.container.hash` annotation): it changes exactly when the
/// container must be re-created. As the kubelet's HashContainer, only the
/// name and the image count: every other field of a running pod's container
/// is immutable in the API, except the resources, which are resized in
/// place and must not restart anything. The encoding is ours and fixed
/// (a JSON object with sorted keys, FNV-1a 32, lowercase hex without
/// padding), so neither a new k8s-openapi field nor a resize changes it;
/// the golden table in the tests guards it.
pub fn container_hash(c: &Container) -> String {
    let fields = std::collections::BTreeMap::from([("image", c.image.as_deref().unwrap_or("")), ("name", &c.name)]);
    let json = serde_json::to_vec(&fields).unwrap_or_default();
    format!("{:x}", fnv1a32(&json))
}

fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193))
}

/// The hash older swiftlets wrote: the first 8 bytes of SHA-256 over the
/// whole serialized container (16 hex digits, never the length of
/// [`container_hash`]). Containers created by them are kept while their
/// spec serializes the same.
fn legacy_container_hash(c: &Container) -> String {
    let mut h = Sha256::new();
    h.update(serde_json::to_vec(c).unwrap_or_default());
    h.finalize()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether a running container's hash annotation says it was made from
/// `c` (an empty annotation, from a container not made by swiftlet,
/// matches nothing and is handled by the callers).
pub fn hash_matches(annotation: &str, c: &Container) -> bool {
    if annotation.len() == 16 {
        return annotation == legacy_container_hash(c);
    }
    annotation == container_hash(c)
}

/// The CRI resources a container gets from its (allocated) spec: what it
/// is created with, and what a resize applies with
/// UpdateContainerResources.
pub fn resources(pod: &Pod, c: &Container, settings: &NodeSettings) -> api::LinuxContainerResources {
    let r = crate::cm::qos::container_runtime_resources(pod.spec.as_ref(), c);
    let period_us = settings.cpu_cfs_quota_period.as_micros().clamp(1_000, 1_000_000) as i64;
    let quota = if settings.cpu_cfs_quota {
        r.cpu_limit.and_then(|l| milli_cpu_to_quota(l.milli_value(), period_us as u64)).unwrap_or(0)
    } else {
        0
    };
    api::LinuxContainerResources {
        cpu_period: if quota > 0 { period_us } else { 0 },
        cpu_quota: quota,
        cpu_shares: milli_cpu_to_shares(r.cpu_request.map_or(0, |q| q.milli_value())) as i64,
        memory_limit_in_bytes: r.memory_limit.map_or(0, |q| q.value().max(0)),
        oom_score_adj: i64::from(oom_score_adj(pod, c, settings.memory_capacity)),
        hugepage_limits: hugepages::container_limits(c, &settings.features.hugepage_sizes),
        unified: if settings.features.oom_kills_whole_container {
            HashMap::from([("memory.oom.group".to_owned(), "1".to_owned())])
        } else {
            HashMap::new()
        },
        ..Default::default()
    }
}

/// Everything a container config needs that is decided at start time.
pub struct ContainerStart<'a> {
    pub pod: &'a Pod,
    pub container: &'a Container,
    pub init: bool,
    pub restart_count: u32,
    /// The image reference the image manager resolved.
    pub image_ref: &'a str,
    pub pod_ips: Vec<String>,
    /// The ConfigMaps and Secrets the environment refers to.
    pub env_objects: &'a EnvObjects,
    /// The container's volume mounts, made by the volume manager (and the
    /// managed /etc/hosts).
    pub mounts: &'a [api::Mount],
    /// The user the image runs as (ImageStatus), for runAsNonRoot.
    pub image_user: &'a ImageUser,
}

/// What the downward API reads beyond the pod object.
pub fn downward_context(settings: &NodeSettings, pod_ips: &[String]) -> DownwardContext {
    DownwardContext {
        host_ip: settings.node_ip.clone(),
        pod_ips: pod_ips.to_vec(),
        allocatable_cpu_milli: settings.allocatable_cpu_milli,
        allocatable_memory: settings.allocatable_memory,
        allocatable_ephemeral_storage: settings.allocatable_ephemeral_storage,
    }
}

/// The container's environment (also what `subPathExpr` expands from).
pub fn container_env(s: &ContainerStart<'_>, settings: &NodeSettings) -> Result<Vec<(String, String)>, EnvError> {
    env::build(s.pod, s.container, &downward_context(settings, &s.pod_ips), s.env_objects)
}

pub fn container_config(
    s: &ContainerStart<'_>,
    settings: &NodeSettings,
) -> Result<api::ContainerConfig, ContainerConfigError> {
    let (pod, c) = (s.pod, s.container);
    let id = identity(pod);
    let security =
        security::container_context(pod, c, &settings.features.security, s.image_user, namespace_options(pod))
            .map_err(ContainerConfigError)?;
    let envs = container_env(s, settings)?;
    // Volume mounts first, the termination message file last, as the kubelet.
    let mut mounts = s.mounts.to_vec();
    let message_path = c.termination_message_path.clone().unwrap_or_default();
    if !message_path.is_empty() {
        mounts.push(api::Mount {
            container_path: message_path.clone(),
            host_path: termination_message_file(settings, &id.uid, &c.name, s.restart_count)
                .to_string_lossy()
                .into_owned(),
            ..Default::default()
        });
    }
    let spec = pod.spec.as_ref();
    let grace = spec.and_then(|s| s.termination_grace_period_seconds).unwrap_or(30);
    let mut annotations: HashMap<String, String> = HashMap::from([
        (labels::CONTAINER_HASH.into(), container_hash(c)),
        (labels::CONTAINER_RESTART_COUNT.into(), s.restart_count.to_string()),
        (labels::CONTAINER_TERMINATION_MESSAGE_PATH.into(), message_path),
        (
            labels::CONTAINER_TERMINATION_MESSAGE_POLICY.into(),
            c.termination_message_policy.clone().unwrap_or_else(|| "File".into()),
        ),
        (labels::POD_TERMINATION_GRACE_PERIOD.into(), grace.to_string()),
    ]);
    if let Some(ports) = c.ports.as_ref().filter(|p| !p.is_empty()) {
        annotations.insert(labels::CONTAINER_PORTS.into(), serde_json::to_string(ports).unwrap_or_default());
    }
    if let Some(pre_stop) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
        annotations
            .insert(labels::CONTAINER_PRE_STOP_HANDLER.into(), serde_json::to_string(pre_stop).unwrap_or_default());
    }
    let mut container_labels = labels::container_labels(&id, &c.name);
    container_labels.insert(labels::CONTAINER_TYPE.into(), if s.init { "init" } else { "regular" }.into());
    Ok(api::ContainerConfig {
        metadata: Some(api::ContainerMetadata { name: c.name.clone(), attempt: s.restart_count }),
        image: Some(api::ImageSpec {
            image: s.image_ref.to_owned(),
            user_specified_image: c.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command: env::expand_all(c.command.as_ref(), &envs),
        args: env::expand_all(c.args.as_ref(), &envs),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: envs.into_iter().map(|(key, value)| api::KeyValue { key, value }).collect(),
        mounts,
        labels: container_labels,
        annotations,
        log_path: container_log_path(&c.name, s.restart_count),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(api::LinuxContainerConfig {
            resources: Some(resources(pod, c, settings)),
            security_context: Some(security),
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{Capabilities, ContainerPort, PodDNSConfig, PodSpec, ResourceRequirements, SecurityContext},
        apimachinery::pkg::api::resource::Quantity as Q,
    };

    use super::*;
    use crate::cm::naming::CgroupDriver;

    fn settings() -> NodeSettings {
        NodeSettings {
            node_name: "node-a".into(),
            node_ip: Some("10.0.0.1".into()),
            pod_logs_dir: "/var/log/pods".into(),
            pods_dir: "/var/lib/kubelet/pods".into(),
            memory_capacity: 8 << 30,
            cpu_cfs_quota: true,
            cpu_cfs_quota_period: Duration::from_millis(100),
            naming: CgroupNaming::new(CgroupDriver::Cgroupfs, "/"),
            host_dns: parse_resolv_conf("nameserver 10.0.0.2\nsearch corp.example\noptions edns0\n"),
            cluster_dns: vec![],
            cluster_domain: Some("cluster.local".into()),
            allocatable_cpu_milli: 2000,
            allocatable_memory: 4 << 30,
            allocatable_ephemeral_storage: 10 << 30,
            features: NodeFeatures::default(),
        }
    }

    fn pod(host_network: bool) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("web".into());
        p.metadata.namespace = Some("prod".into());
        p.metadata.uid = Some("1234".into());
        p.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
        p.spec = Some(PodSpec {
            host_network: Some(host_network),
            containers: vec![Container {
                name: "httpd".into(),
                image: Some("busybox:1.35".into()),
                command: Some(vec!["httpd".into(), "-p".into(), "$(PORT)".into()]),
                env: Some(vec![k8s_openapi::api::core::v1::EnvVar {
                    name: "PORT".into(),
                    value: Some("8080".into()),
                    ..Default::default()
                }]),
                ports: Some(vec![ContainerPort { container_port: 8080, host_port: Some(8080), ..Default::default() }]),
                resources: Some(ResourceRequirements {
                    limits: Some(
                        [("cpu".to_string(), Q("500m".into())), ("memory".to_string(), Q("64Mi".into()))].into(),
                    ),
                    ..Default::default()
                }),
                termination_message_path: Some("/dev/termination-log".into()),
                security_context: Some(SecurityContext {
                    allow_privilege_escalation: Some(false),
                    capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: None }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        });
        p
    }

    #[test]
    fn sandbox_config_as_the_kubelet_builds_it() {
        let cfg = sandbox_config(&pod(true), 2, &settings());
        let m = cfg.metadata.as_ref().unwrap();
        assert_eq!((m.name.as_str(), m.namespace.as_str(), m.uid.as_str(), m.attempt), ("web", "prod", "1234", 2));
        assert_eq!(cfg.log_directory, "/var/log/pods/prod_web_1234");
        assert_eq!(cfg.hostname, "", "host-network pods keep the node's hostname");
        assert_eq!(cfg.labels[labels::POD_UID], "1234");
        assert_eq!(cfg.labels["app"], "web");
        let linux = cfg.linux.as_ref().unwrap();
        // Guaranteed (limits only, requests default to them).
        assert_eq!(linux.cgroup_parent, "/kubepods/pod1234");
        let ns = linux.security_context.as_ref().unwrap().namespace_options.as_ref().unwrap();
        assert_eq!(ns.network, api::NamespaceMode::Node as i32);
        assert_eq!(ns.pid, api::NamespaceMode::Container as i32);
        assert_eq!(cfg.port_mappings.len(), 1);
        // ClusterFirst on host network falls back to the host's resolv.conf.
        assert_eq!(cfg.dns_config.as_ref().unwrap().servers, vec!["10.0.0.2"]);
        let cfg = sandbox_config(&pod(false), 0, &settings());
        assert_eq!(cfg.hostname, "web");
        assert_eq!(
            cfg.linux.unwrap().security_context.unwrap().namespace_options.unwrap().network,
            api::NamespaceMode::Pod as i32
        );
    }

    #[test]
    fn dns_policies() {
        let mut s = settings();
        let mut p = pod(false);
        // No cluster DNS: ClusterFirst behaves as Default.
        assert_eq!(dns_config(&p, &s).unwrap().servers, vec!["10.0.0.2"]);
        s.cluster_dns = vec!["10.96.0.10".into()];
        let cfg = dns_config(&p, &s).unwrap();
        assert_eq!(cfg.servers, vec!["10.96.0.10"]);
        assert_eq!(cfg.searches, vec!["prod.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example"]);
        assert_eq!(cfg.options, vec!["ndots:5"]);
        let spec = p.spec.as_mut().unwrap();
        spec.dns_policy = Some("None".into());
        spec.dns_config = Some(PodDNSConfig {
            nameservers: Some(vec!["1.1.1.1".into()]),
            options: Some(vec![k8s_openapi::api::core::v1::PodDNSConfigOption {
                name: Some("ndots".into()),
                value: Some("2".into()),
            }]),
            searches: None,
        });
        let cfg = dns_config(&p, &s).unwrap();
        assert_eq!((cfg.servers, cfg.options), (vec!["1.1.1.1".to_string()], vec!["ndots:2".to_string()]));
    }

    #[test]
    fn container_config_as_the_kubelet_builds_it() {
        let p = pod(true);
        let c = &p.spec.as_ref().unwrap().containers[0];
        let start = ContainerStart {
            pod: &p,
            container: c,
            init: false,
            restart_count: 3,
            image_ref: "sha256:abc",
            pod_ips: vec!["10.0.0.1".into()],
            env_objects: &EnvObjects::default(),
            mounts: &[],
            image_user: &ImageUser::default(),
        };
        let cfg = container_config(&start, &settings()).unwrap();
        assert_eq!(cfg.metadata.as_ref().unwrap().attempt, 3);
        assert_eq!(cfg.log_path, "httpd/3.log");
        assert_eq!(cfg.command, vec!["httpd", "-p", "8080"]);
        assert_eq!(cfg.image.as_ref().unwrap().image, "sha256:abc");
        assert_eq!(cfg.image.as_ref().unwrap().user_specified_image, "busybox:1.35");
        assert_eq!(cfg.annotations[labels::CONTAINER_RESTART_COUNT], "3");
        assert_eq!(cfg.annotations[labels::CONTAINER_HASH], container_hash(c));
        assert_eq!(cfg.labels[labels::CONTAINER_NAME], "httpd");
        assert_eq!(cfg.mounts[0].container_path, "/dev/termination-log");
        assert_eq!(cfg.mounts[0].host_path, "/var/lib/kubelet/pods/1234/containers/httpd/termination-3");
        let linux = cfg.linux.unwrap();
        let r = linux.resources.unwrap();
        assert_eq!((r.cpu_quota, r.cpu_period, r.cpu_shares), (50_000, 100_000, 512));
        assert_eq!(r.memory_limit_in_bytes, 64 << 20);
        assert_eq!(r.oom_score_adj, -997, "Guaranteed");
        let sc = linux.security_context.unwrap();
        assert!(sc.no_new_privs);
        assert_eq!(sc.capabilities.unwrap().drop_capabilities, vec!["ALL"]);
        assert!(sc.masked_paths.contains(&"/proc/kcore".to_string()));
    }

    #[test]
    fn volume_mounts_come_before_the_termination_message() {
        let p = pod(true);
        let c = &p.spec.as_ref().unwrap().containers[0];
        let data = api::Mount {
            container_path: "/data".into(),
            host_path: "/var/lib/kubelet/pods/1234/volumes/kubernetes.io~empty-dir/data".into(),
            readonly: true,
            propagation: api::MountPropagation::PropagationHostToContainer as i32,
            ..Default::default()
        };
        let start = ContainerStart {
            pod: &p,
            container: c,
            init: false,
            restart_count: 0,
            image_ref: "sha256:abc",
            pod_ips: vec![],
            env_objects: &EnvObjects::default(),
            mounts: std::slice::from_ref(&data),
            image_user: &ImageUser::default(),
        };
        let cfg = container_config(&start, &settings()).unwrap();
        assert_eq!(cfg.mounts.len(), 2);
        assert_eq!(cfg.mounts[0], data);
        assert_eq!(cfg.mounts[1].container_path, "/dev/termination-log");
    }

    #[test]
    fn hash_changes_with_the_image_and_name_only() {
        let p = pod(true);
        let mut c = p.spec.as_ref().unwrap().containers[0].clone();
        let h = container_hash(&c);
        assert_eq!(h, container_hash(&c.clone()));
        // A resize, or any field the API does not let change, keeps it.
        c.resources = None;
        c.env = None;
        c.resize_policy = Some(vec![k8s_openapi::api::core::v1::ContainerResizePolicy {
            resource_name: "cpu".into(),
            restart_policy: "RestartContainer".into(),
        }]);
        assert_eq!(h, container_hash(&c));
        c.image = Some("busybox:1.36".into());
        assert_ne!(h, container_hash(&c));
        let mut renamed = p.spec.as_ref().unwrap().containers[0].clone();
        renamed.name = "other".into();
        assert_ne!(h, container_hash(&renamed));
    }

    /// Golden values: a swiftlet whose hash of an unchanged container
    /// differs would restart every container on the node when upgraded.
    /// Never update these; add a migration instead.
    #[test]
    fn golden_hashes() {
        let c = |name: &str, image: Option<&str>| Container {
            name: name.into(),
            image: image.map(str::to_owned),
            ..Default::default()
        };
        let mut full = pod(true).spec.unwrap().containers[0].clone();
        full.name = "app".into();
        full.image = Some("registry.k8s.io/pause:3.10".into());
        let table = [
            (c("app", Some("busybox:1.36")), "47615a6e"),
            (c("sidecar", Some("docker.io/library/nginx:1.27@sha256:0123")), "85770066"),
            (c("no-image", None), "77f19524"),
            (c("ünïcode\"quote", Some("img")), "2724850"),
            (full, "74657526"),
        ];
        for (container, want) in &table {
            assert_eq!(container_hash(container), *want, "{}", container.name);
        }
    }

    #[test]
    fn legacy_hashes_are_still_recognised() {
        let p = pod(true);
        let c = p.spec.as_ref().unwrap().containers[0].clone();
        let legacy = legacy_container_hash(&c);
        assert_eq!(legacy.len(), 16);
        assert!(hash_matches(&legacy, &c), "a container made by an older swiftlet is kept");
        assert!(hash_matches(&container_hash(&c), &c));
        let mut changed = c.clone();
        changed.image = Some("busybox:1.36".into());
        assert!(!hash_matches(&legacy, &changed));
        assert!(!hash_matches(&container_hash(&c), &changed));
        assert!(!hash_matches("", &c));
    }
}
