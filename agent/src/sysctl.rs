//! Pod sysctls, admitted as the kubelet's sysctl allowlist does: the safe
//! sysctls (namespaced and isolated from other pods) are always allowed,
//! others only when `allowedUnsafeSysctls` names them (exactly or by a
//! pattern ending in `*`) and they are known to be namespaced; net.*
//! sysctls are refused for host-network pods and IPC ones for host-IPC
//! pods. A refused pod fails admission with reason `SysctlForbidden`.
//! Pure. It sits at the crate's top level, below both of its users: the
//! configuration checks `allowedUnsafeSysctls` at load, pod admission
//! checks each pod.

use k8s_openapi::api::core::v1::Pod;

/// The kubelet's admission reason for a refused sysctl.
pub const FORBIDDEN_REASON: &str = "SysctlForbidden";

/// The kernel namespace that isolates a sysctl.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Namespace {
    Ipc,
    Net,
}

impl Namespace {
    fn as_str(self) -> &'static str {
        match self {
            Namespace::Ipc => "ipc",
            Namespace::Net => "net",
        }
    }
}

/// The safe sysctls and the kernel version from which each is namespaced.
const SAFE: &[(&str, (u32, u32))] = &[
    ("kernel.shm_rmid_forced", (0, 0)),
    ("net.ipv4.ip_local_port_range", (0, 0)),
    ("net.ipv4.tcp_syncookies", (0, 0)),
    ("net.ipv4.ping_group_range", (0, 0)),
    ("net.ipv4.ip_unprivileged_port_start", (0, 0)),
    ("net.ipv4.ip_local_reserved_ports", (3, 16)),
    ("net.ipv4.tcp_keepalive_time", (4, 5)),
    ("net.ipv4.tcp_fin_timeout", (4, 6)),
    ("net.ipv4.tcp_keepalive_intvl", (4, 5)),
    ("net.ipv4.tcp_keepalive_probes", (4, 5)),
    ("net.ipv4.tcp_rmem", (4, 15)),
    ("net.ipv4.tcp_wmem", (4, 15)),
];

/// `a/b/c` and `a.b.c` name the same sysctl; a name whose first separator
/// is `/` has its dots and slashes swapped (the kubelet's NormalizeName).
pub fn normalize(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|c| {
                if c == '/' {
                    '.'
                } else if c == '.' {
                    '/'
                } else {
                    c
                }
            })
            .collect(),
        _ => name.to_owned(),
    }
}

/// The namespace of a sysctl or sysctl prefix, if the kernel namespaces it.
pub fn namespace_of(name: &str) -> Option<Namespace> {
    if name == "kernel.sem" {
        return Some(Namespace::Ipc);
    }
    for (prefix, ns) in [
        ("kernel.shm", Namespace::Ipc),
        ("kernel.msg", Namespace::Ipc),
        ("fs.mqueue.", Namespace::Ipc),
        ("net.", Namespace::Net),
    ] {
        if name.starts_with(prefix) {
            return Some(ns);
        }
    }
    None
}

/// A sysctl name or pattern as the API server validates it: dot- or
/// slash-separated segments of lowercase letters, digits, `_` and `-`
/// starting and ending with a letter or digit; a pattern may end in `*`.
fn valid_pattern(s: &str) -> bool {
    if s.is_empty() || s.len() > 253 {
        return false;
    }
    let body = s.strip_suffix('*').map_or(s, |b| b.strip_suffix(['.', '/']).unwrap_or(b));
    if s.ends_with('*') && body.is_empty() {
        return s == "*";
    }
    body.split(['.', '/']).all(|seg| {
        !seg.is_empty()
            && seg.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
            && seg.starts_with(|c: char| c.is_ascii_alphanumeric())
            && seg.ends_with(|c: char| c.is_ascii_alphanumeric())
    })
}

/// The sysctls a node admits: the safe ones for its kernel plus
/// `allowedUnsafeSysctls`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allowlist {
    sysctls: Vec<(String, Namespace)>,
    prefixes: Vec<(String, Namespace)>,
}

impl Allowlist {
    /// The allowlist for a kernel (major, minor) and the configured unsafe
    /// sysctls; an unsafe entry that is malformed or not known to be
    /// namespaced is an error (the kubelet refuses to start).
    pub fn new(kernel: (u32, u32), unsafe_sysctls: &[String]) -> Result<Allowlist, String> {
        let mut a = Allowlist::default();
        let safe = SAFE.iter().filter(|(_, since)| kernel >= *since).map(|(n, _)| n.to_string());
        for s in safe.chain(unsafe_sysctls.iter().cloned()) {
            if !valid_pattern(&s) {
                return Err(format!(
                    "sysctl {s:?} must have at most 253 characters and match regex \
                     ^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\\./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?(\\*)?$ (or be \"*\")"
                ));
            }
            let s = normalize(&s);
            let (name, prefixed) = match s.strip_suffix('*') {
                Some(p) => (p.to_owned(), true),
                None => (s.clone(), false),
            };
            let Some(ns) = namespace_of(&name) else {
                return Err(format!("the sysctls {name:?} are not known to be namespaced"));
            };
            if prefixed { a.prefixes.push((name, ns)) } else { a.sysctls.push((name, ns)) }
        }
        Ok(a)
    }

    /// Why `sysctl` may not be set by a pod with these host namespaces.
    pub fn check(&self, sysctl: &str, host_network: bool, host_ipc: bool) -> Result<(), String> {
        let sysctl = normalize(sysctl);
        let found = self
            .sysctls
            .iter()
            .find(|(n, _)| *n == sysctl)
            .or_else(|| self.prefixes.iter().find(|(p, _)| sysctl.starts_with(p.as_str())));
        let Some((_, ns)) = found else { return Err(format!("{sysctl:?} not allowlisted")) };
        let shared = match ns {
            Namespace::Ipc => host_ipc,
            Namespace::Net => host_network,
        };
        if shared {
            return Err(format!("{sysctl:?} not allowed with host {} enabled", ns.as_str()));
        }
        Ok(())
    }

    /// Admission: the message of the first sysctl refused
    /// (`forbidden sysctl: ...`), or None when every one is allowed.
    pub fn admit(&self, pod: &Pod) -> Option<String> {
        let spec = pod.spec.as_ref()?;
        let sysctls = spec.security_context.as_ref()?.sysctls.as_ref()?;
        let host_network = spec.host_network.unwrap_or(false);
        let host_ipc = spec.host_ipc.unwrap_or(false);
        sysctls
            .iter()
            .find_map(|s| self.check(&s.name, host_network, host_ipc).err())
            .map(|e| format!("forbidden sysctl: {e}"))
    }
}

/// The running kernel's (major, minor), from a release string such as
/// `6.18.4-amd64`.
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSecurityContext, PodSpec, Sysctl};

    use super::*;

    fn pod(names: &[&str], host_network: bool, host_ipc: bool) -> Pod {
        Pod {
            spec: Some(PodSpec {
                host_network: Some(host_network),
                host_ipc: Some(host_ipc),
                security_context: Some(PodSecurityContext {
                    sysctls: Some(names.iter().map(|n| Sysctl { name: n.to_string(), value: "1".into() }).collect()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn admission_table() {
        let unsafe_ = vec!["kernel.msg*".to_string(), "net.core.somaxconn".to_string()];
        let a = Allowlist::new((6, 1), &unsafe_).unwrap();
        let cases: Vec<(&str, Pod, Option<&str>)> = vec![
            ("safe", pod(&["net.ipv4.ip_local_port_range", "kernel.shm_rmid_forced"], false, false), None),
            ("safe written with slashes", pod(&["net/ipv4/tcp_syncookies"], false, false), None),
            (
                "unsafe and not allowed",
                pod(&["kernel.sem"], false, false),
                Some("forbidden sysctl: \"kernel.sem\" not allowlisted"),
            ),
            ("allowed by pattern", pod(&["kernel.msgmax"], false, false), None),
            ("allowed by name", pod(&["net.core.somaxconn"], false, false), None),
            (
                "net sysctl on the host network",
                pod(&["net.ipv4.tcp_syncookies"], true, false),
                Some("forbidden sysctl: \"net.ipv4.tcp_syncookies\" not allowed with host net enabled"),
            ),
            (
                "ipc sysctl with host IPC",
                pod(&["kernel.shm_rmid_forced"], false, true),
                Some("forbidden sysctl: \"kernel.shm_rmid_forced\" not allowed with host ipc enabled"),
            ),
            (
                "the first refused one is named",
                pod(&["net.ipv4.tcp_syncookies", "vm.swappiness"], false, false),
                Some("forbidden sysctl: \"vm.swappiness\" not allowlisted"),
            ),
            ("no sysctls", Pod::default(), None),
        ];
        for (name, p, want) in cases {
            assert_eq!(a.admit(&p).as_deref(), want, "{name}");
        }
    }

    #[test]
    fn newer_safe_sysctls_need_their_kernel() {
        let old = Allowlist::new((4, 4), &[]).unwrap();
        assert!(old.check("net.ipv4.ip_local_reserved_ports", false, false).is_ok());
        assert!(old.check("net.ipv4.tcp_keepalive_time", false, false).is_err());
        assert!(Allowlist::new((6, 1), &[]).unwrap().check("net.ipv4.tcp_wmem", false, false).is_ok());
    }

    #[test]
    fn unsafe_entries_are_checked_at_start() {
        assert_eq!(
            Allowlist::new((6, 1), &["vm.swappiness".into()]).unwrap_err(),
            "the sysctls \"vm.swappiness\" are not known to be namespaced"
        );
        assert!(Allowlist::new((6, 1), &["Net.Core".into()]).unwrap_err().contains("must have at most 253"));
        assert!(Allowlist::new((6, 1), &["net.*".into(), "fs.mqueue.*".into(), "kernel.sem".into()]).is_ok());
    }

    #[test]
    fn names_normalize_and_kernels_parse() {
        assert_eq!(normalize("net/ipv4/conf/eth0.100/forwarding"), "net.ipv4.conf.eth0/100.forwarding");
        assert_eq!(normalize("net.ipv4.tcp_syncookies"), "net.ipv4.tcp_syncookies");
        assert_eq!(kernel_version("6.18.44-amd64"), Some((6, 18)));
        assert_eq!(kernel_version("6.1.0-28-cloud-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("x"), None);
    }
}
