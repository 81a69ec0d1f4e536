//! The API server's checks, with its wording, for the pod fields of the
//! security context (seccomp and AppArmor profiles, sysctls, groups,
//! procMount), sidecars (init containers' restartPolicy), readiness
//! gates, host aliases, hostname and subdomain, RuntimeClass and huge
//! pages, so a static manifest with one of them wrong is refused naming
//! the field.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{AppArmorProfile, Container, PodSpec, SeccompProfile, SecurityContext};

use super::validation::{
    DNS_LABEL_RULE, DNS_SUBDOMAIN_RULE, FieldError, invalid, is_dns_label, is_dns_subdomain, required, unsupported,
};

const SYSCTL_RULE: &str = "must have at most 253 characters and match regex \
                           ^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\\./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$";

/// A Localhost profile path: relative, without `..`.
fn descending(path: &str) -> bool {
    !path.starts_with('/') && !path.split('/').any(|p| p == "..")
}

fn profile(at: &str, type_: &str, localhost: Option<&str>, errs: &mut Vec<FieldError>) {
    const TYPES: [&str; 3] = ["Localhost", "RuntimeDefault", "Unconfined"];
    if !TYPES.contains(&type_) {
        errs.push(unsupported(format!("{at}.type"), type_, &TYPES));
        return;
    }
    match (type_, localhost) {
        ("Localhost", None) | ("Localhost", Some("")) => errs.push(FieldError {
            field: format!("{at}.localhostProfile"),
            problem: "Required value: must be set when seccomp type is Localhost".into(),
        }),
        ("Localhost", Some(p)) if !descending(p) => {
            errs.push(invalid(format!("{at}.localhostProfile"), p, "must be a relative path without '..'"))
        }
        ("Localhost", _) | (_, None) => {}
        (_, Some(_)) => errs.push(FieldError {
            field: format!("{at}.localhostProfile"),
            problem: "Forbidden: can only be set when seccomp type is Localhost".into(),
        }),
    }
}

fn seccomp(at: &str, p: &SeccompProfile, errs: &mut Vec<FieldError>) {
    profile(&format!("{at}.seccompProfile"), &p.type_, p.localhost_profile.as_deref(), errs);
}

fn apparmor(at: &str, p: &AppArmorProfile, errs: &mut Vec<FieldError>) {
    profile(&format!("{at}.appArmorProfile"), &p.type_, p.localhost_profile.as_deref(), errs);
}

fn container_context(at: &str, sc: &SecurityContext, errs: &mut Vec<FieldError>) {
    let at = format!("{at}.securityContext");
    if let Some(p) = &sc.seccomp_profile {
        seccomp(&at, p, errs);
    }
    if let Some(p) = &sc.app_armor_profile {
        apparmor(&at, p, errs);
    }
    if let Some(m) = sc.proc_mount.as_deref()
        && !["Default", "Unmasked"].contains(&m)
    {
        errs.push(unsupported(format!("{at}.procMount"), m, &["Default", "Unmasked"]));
    }
    if sc.privileged == Some(true) && sc.allow_privilege_escalation == Some(false) {
        errs.push(invalid(
            format!("{at}.allowPrivilegeEscalation"),
            false,
            "cannot set `allowPrivilegeEscalation` to false and `privileged` to true",
        ));
    }
}

/// Huge pages need a cpu or memory request or limit in the same container.
fn hugepages(at: &str, c: &Container, errs: &mut Vec<FieldError>) {
    let Some(r) = &c.resources else { return };
    let names = || r.limits.iter().chain(r.requests.iter()).flatten().map(|(n, _)| n.as_str());
    if names().any(|n| n.starts_with("hugepages-")) && !names().any(|n| n == "cpu" || n == "memory") {
        errs.push(FieldError {
            field: format!("{at}.resources"),
            problem: "Forbidden: HugePages require cpu or memory".into(),
        });
    }
}

pub fn validate(spec: &PodSpec) -> Vec<FieldError> {
    let mut errs = vec![];
    if let Some(psc) = &spec.security_context {
        let at = "spec.securityContext";
        if let Some(p) = &psc.seccomp_profile {
            seccomp(at, p, &mut errs);
        }
        if let Some(p) = &psc.app_armor_profile {
            apparmor(at, p, &mut errs);
        }
        let mut seen = std::collections::HashSet::new();
        for (i, s) in psc.sysctls.iter().flatten().enumerate() {
            let name = super::sysctl::normalize(&s.name);
            let valid = name.len() <= 253
                && name.split(['.', '/']).all(|seg| {
                    !seg.is_empty()
                        && seg.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
                        && seg.as_bytes()[0].is_ascii_alphanumeric()
                        && seg.as_bytes()[seg.len() - 1].is_ascii_alphanumeric()
                });
            if !valid {
                errs.push(invalid(format!("{at}.sysctls[{i}].name"), &s.name, SYSCTL_RULE));
            } else if !seen.insert(name) {
                errs.push(FieldError {
                    field: format!("{at}.sysctls[{i}].name"),
                    problem: format!("Duplicate value: \"{}\"", s.name),
                });
            }
        }
        if let Some(p) = psc.supplemental_groups_policy.as_deref()
            && !["Merge", "Strict"].contains(&p)
        {
            errs.push(unsupported(format!("{at}.supplementalGroupsPolicy"), p, &["Merge", "Strict"]));
        }
        if let Some(p) = psc.fs_group_change_policy.as_deref()
            && !["Always", "OnRootMismatch"].contains(&p)
        {
            errs.push(unsupported(format!("{at}.fsGroupChangePolicy"), p, &["Always", "OnRootMismatch"]));
        }
    }
    for (list, containers) in [
        ("spec.initContainers", spec.init_containers.as_deref().unwrap_or(&[])),
        ("spec.containers", &spec.containers[..]),
    ] {
        for (i, c) in containers.iter().enumerate() {
            let at = format!("{list}[{i}]");
            if let Some(sc) = &c.security_context {
                container_context(&at, sc, &mut errs);
            }
            hugepages(&at, c, &mut errs);
            match (list, c.restart_policy.as_deref()) {
                (_, None) => {}
                ("spec.initContainers", Some("Always")) => {}
                ("spec.initContainers", Some(p)) => {
                    errs.push(unsupported(format!("{at}.restartPolicy"), p, &["Always"]))
                }
                (_, Some(_)) => errs.push(FieldError {
                    field: format!("{at}.restartPolicy"),
                    problem: "Forbidden: may not be set for non-init containers".into(),
                }),
            }
        }
    }
    for (i, g) in spec.readiness_gates.iter().flatten().enumerate() {
        if crate::config::validation::qualified_name(&g.condition_type).is_err() {
            errs.push(invalid(
                format!("spec.readinessGates[{i}].conditionType"),
                &g.condition_type,
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an \
                 alphanumeric character",
            ));
        }
    }
    for (i, a) in spec.host_aliases.iter().flatten().enumerate() {
        if a.ip.parse::<IpAddr>().is_err() {
            errs.push(invalid(format!("spec.hostAliases[{i}].ip"), &a.ip, "must be a valid IP address"));
        }
        for (j, h) in a.hostnames.iter().flatten().enumerate() {
            if !is_dns_subdomain(h) {
                errs.push(invalid(format!("spec.hostAliases[{i}].hostnames[{j}]"), h, DNS_SUBDOMAIN_RULE));
            }
        }
    }
    for (field, value) in [("spec.hostname", &spec.hostname), ("spec.subdomain", &spec.subdomain)] {
        if let Some(v) = value.as_deref().filter(|v| !v.is_empty())
            && !is_dns_label(v)
        {
            errs.push(invalid(field, v, DNS_LABEL_RULE));
        }
    }
    match spec.runtime_class_name.as_deref() {
        Some("") => errs.push(required("spec.runtimeClassName")),
        Some(n) if !is_dns_subdomain(n) => errs.push(invalid("spec.runtimeClassName", n, DNS_SUBDOMAIN_RULE)),
        _ => {}
    }
    errs
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        HostAlias, Pod, PodReadinessGate, PodSecurityContext, ResourceRequirements, Sysctl,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;

    use super::*;

    fn errors(f: impl FnOnce(&mut PodSpec)) -> Vec<String> {
        let mut p = Pod::default();
        p.metadata.name = Some("web".into());
        let mut spec = PodSpec {
            containers: vec![Container { name: "c".into(), image: Some("busybox".into()), ..Default::default() }],
            ..Default::default()
        };
        f(&mut spec);
        p.spec = Some(spec);
        crate::pods::validation::validate(&p).into_iter().map(|e| e.to_string()).collect()
    }

    type Edit = Box<dyn FnOnce(&mut PodSpec)>;

    #[test]
    fn table() {
        let psc = |f: fn(&mut PodSecurityContext)| -> Edit {
            Box::new(move |s| {
                let mut p = PodSecurityContext::default();
                f(&mut p);
                s.security_context = Some(p);
            })
        };
        let cases: Vec<(&str, Edit, &str)> = vec![
            ("valid", Box::new(|_| {}), ""),
            (
                "Localhost without a profile",
                psc(|p| {
                    p.seccomp_profile = Some(SeccompProfile { type_: "Localhost".into(), localhost_profile: None })
                }),
                "spec.securityContext.seccompProfile.localhostProfile: Required value: must be set when seccomp type is Localhost",
            ),
            (
                "a profile outside the seccomp root",
                psc(|p| {
                    p.seccomp_profile =
                        Some(SeccompProfile { type_: "Localhost".into(), localhost_profile: Some("../x.json".into()) })
                }),
                "spec.securityContext.seccompProfile.localhostProfile: Invalid value: \"../x.json\"",
            ),
            (
                "an unknown AppArmor type",
                psc(|p| {
                    p.app_armor_profile = Some(AppArmorProfile { type_: "Enforce".into(), localhost_profile: None })
                }),
                "spec.securityContext.appArmorProfile.type: Unsupported value: \"Enforce\"",
            ),
            (
                "a bad sysctl name",
                psc(|p| p.sysctls = Some(vec![Sysctl { name: "Net.Core".into(), value: "1".into() }])),
                "spec.securityContext.sysctls[0].name: Invalid value: \"Net.Core\"",
            ),
            (
                "supplementalGroupsPolicy",
                psc(|p| p.supplemental_groups_policy = Some("Loose".into())),
                "spec.securityContext.supplementalGroupsPolicy: Unsupported value: \"Loose\": supported values: \"Merge\", \"Strict\"",
            ),
            (
                "restartPolicy on an init container",
                Box::new(|s| {
                    s.init_containers = Some(vec![Container {
                        name: "i".into(),
                        image: Some("busybox".into()),
                        restart_policy: Some("OnFailure".into()),
                        ..Default::default()
                    }])
                }),
                "spec.initContainers[0].restartPolicy: Unsupported value: \"OnFailure\": supported values: \"Always\"",
            ),
            (
                "restartPolicy on a regular container",
                Box::new(|s| s.containers[0].restart_policy = Some("Always".into())),
                "spec.containers[0].restartPolicy: Forbidden: may not be set for non-init containers",
            ),
            (
                "a readiness gate",
                Box::new(|s| s.readiness_gates = Some(vec![PodReadinessGate { condition_type: "bad gate".into() }])),
                "spec.readinessGates[0].conditionType: Invalid value: \"bad gate\"",
            ),
            (
                "a host alias IP",
                Box::new(|s| {
                    s.host_aliases = Some(vec![HostAlias { ip: "x".into(), hostnames: Some(vec!["a".into()]) }])
                }),
                "spec.hostAliases[0].ip: Invalid value: \"x\": must be a valid IP address",
            ),
            (
                "a RuntimeClass name",
                Box::new(|s| s.runtime_class_name = Some("Kata".into())),
                "spec.runtimeClassName: Invalid value: \"Kata\"",
            ),
            (
                "huge pages alone",
                Box::new(|s| {
                    s.containers[0].resources = Some(ResourceRequirements {
                        limits: Some([("hugepages-2Mi".to_string(), Q("2Mi".into()))].into()),
                        ..Default::default()
                    })
                }),
                "spec.containers[0].resources: Forbidden: HugePages require cpu or memory",
            ),
        ];
        for (name, edit, want) in cases {
            let errs = errors(edit);
            if want.is_empty() {
                assert!(errs.is_empty(), "{name}: {errs:?}");
            } else {
                assert!(errs.iter().any(|e| e.starts_with(want)), "{name}: {errs:?}");
            }
        }
    }
}
