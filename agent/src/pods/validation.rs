//! Pod validation for what the kubelet itself acts on, with the API
//! server's wording (`spec.containers[0].name: Invalid value: "Web": ...`),
//! so a bad static manifest is refused with the field and value named
//! instead of failing later inside the runtime.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Container, Pod, Probe};

use crate::quantity::Quantity;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub problem: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.problem)
    }
}

pub(super) fn required(field: impl Into<String>) -> FieldError {
    FieldError { field: field.into(), problem: "Required value".into() }
}

/// A field's value as apimachinery's field errors print it: strings
/// quoted, numbers and booleans bare (`Invalid value: 70000: ...`).
pub trait FieldValue {
    fn shown(&self) -> String;
}

impl FieldValue for str {
    fn shown(&self) -> String {
        format!("{self:?}")
    }
}

impl FieldValue for String {
    fn shown(&self) -> String {
        self.as_str().shown()
    }
}

impl<T: FieldValue + ?Sized> FieldValue for &T {
    fn shown(&self) -> String {
        (**self).shown()
    }
}

macro_rules! bare_field_values {
    ($($t:ty),*) => {$(
        impl FieldValue for $t {
            fn shown(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
bare_field_values!(i32, i64, u16, u32, u64, usize, bool);

pub fn invalid(field: impl Into<String>, value: impl FieldValue, why: impl std::fmt::Display) -> FieldError {
    FieldError { field: field.into(), problem: format!("Invalid value: {}: {why}", value.shown()) }
}

pub(super) fn unsupported(field: impl Into<String>, value: &str, allowed: &[&str]) -> FieldError {
    let allowed = allowed.iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(", ");
    FieldError { field: field.into(), problem: format!("Unsupported value: \"{value}\": supported values: {allowed}") }
}

/// The API server's limit on a pod's annotations, keys and values
/// together: a larger mirror pod would be refused.
pub const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 << 10;

pub(super) const DNS_LABEL_RULE: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
pub(super) const DNS_SUBDOMAIN_RULE: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";

pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

fn is_env_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// Every problem found, in field order; empty when the pod is valid.
pub fn validate(pod: &Pod) -> Vec<FieldError> {
    let mut errs = vec![];
    match pod.metadata.name.as_deref() {
        None | Some("") => errs.push(required("metadata.name")),
        Some(n) if !is_dns_subdomain(n) => errs.push(invalid("metadata.name", n, DNS_SUBDOMAIN_RULE)),
        _ => {}
    }
    if let Some(ns) = pod.metadata.namespace.as_deref()
        && !is_dns_label(ns)
    {
        errs.push(invalid("metadata.namespace", ns, DNS_LABEL_RULE));
    }
    // apimachinery's ValidateAnnotationsSize: keys and values together.
    let annotations: usize = pod.metadata.annotations.iter().flatten().map(|(k, v)| k.len() + v.len()).sum();
    if annotations > TOTAL_ANNOTATION_SIZE_LIMIT {
        errs.push(FieldError {
            field: "metadata.annotations".into(),
            problem: format!("Too long: must have at most {TOTAL_ANNOTATION_SIZE_LIMIT} bytes"),
        });
    }
    let Some(spec) = pod.spec.as_ref() else {
        errs.push(required("spec"));
        return errs;
    };
    if spec.containers.is_empty() {
        errs.push(required("spec.containers"));
    }
    if let Some(p) = spec.restart_policy.as_deref()
        && !["Always", "OnFailure", "Never"].contains(&p)
    {
        errs.push(unsupported("spec.restartPolicy", p, &["Always", "OnFailure", "Never"]));
    }
    if let Some(g) = spec.termination_grace_period_seconds
        && g < 0
    {
        errs.push(invalid("spec.terminationGracePeriodSeconds", g, "must be greater than or equal to 0"));
    }
    if let Some(p) = spec.dns_policy.as_deref()
        && !["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"].contains(&p)
    {
        errs.push(unsupported("spec.dnsPolicy", p, &["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"]));
    }
    let mut names = HashSet::new();
    let host_network = spec.host_network == Some(true);
    for (path, list) in [
        ("spec.initContainers", spec.init_containers.as_deref().unwrap_or(&[])),
        ("spec.containers", &spec.containers[..]),
    ] {
        for (i, c) in list.iter().enumerate() {
            let at = format!("{path}[{i}]");
            if !c.name.is_empty() && !names.insert(c.name.as_str()) {
                errs.push(FieldError {
                    field: format!("{at}.name"),
                    problem: format!("Duplicate value: \"{}\"", c.name),
                });
            }
            container(&at, c, host_network, path == "spec.initContainers", &mut errs);
        }
    }
    errs.extend(super::volume_validation::validate(spec));
    errs.extend(super::validation_extra::validate(spec));
    errs.extend(super::pod_level_validation::validate(spec));
    errs
}

fn container(at: &str, c: &Container, host_network: bool, init: bool, errs: &mut Vec<FieldError>) {
    if c.name.is_empty() {
        errs.push(required(format!("{at}.name")));
    } else if !is_dns_label(&c.name) {
        errs.push(invalid(format!("{at}.name"), &c.name, DNS_LABEL_RULE));
    }
    if c.image.as_deref().unwrap_or("").trim().is_empty() {
        errs.push(required(format!("{at}.image")));
    }
    if let Some(p) = c.image_pull_policy.as_deref()
        && !["Always", "IfNotPresent", "Never"].contains(&p)
    {
        errs.push(unsupported(format!("{at}.imagePullPolicy"), p, &["Always", "IfNotPresent", "Never"]));
    }
    for (j, port) in c.ports.iter().flatten().enumerate() {
        let pat = format!("{at}.ports[{j}]");
        if !(1..=65535).contains(&port.container_port) {
            errs.push(invalid(
                format!("{pat}.containerPort"),
                port.container_port,
                "must be between 1 and 65535, inclusive",
            ));
        }
        if let Some(h) = port.host_port {
            if !(0..=65535).contains(&h) {
                errs.push(invalid(format!("{pat}.hostPort"), h, "must be between 1 and 65535, inclusive"));
            } else if host_network && h != 0 && h != port.container_port {
                errs.push(invalid(
                    format!("{pat}.hostPort"),
                    h,
                    "must match `containerPort` when `hostNetwork` is true",
                ));
            }
        }
        if let Some(proto) = port.protocol.as_deref()
            && !["TCP", "UDP", "SCTP"].contains(&proto)
        {
            errs.push(unsupported(format!("{pat}.protocol"), proto, &["SCTP", "TCP", "UDP"]));
        }
    }
    for (j, e) in c.env.iter().flatten().enumerate() {
        if !is_env_name(&e.name) {
            errs.push(invalid(
                format!("{at}.env[{j}].name"),
                &e.name,
                "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit",
            ));
        }
        if e.value.is_some() && e.value_from.is_some() {
            errs.push(invalid(
                format!("{at}.env[{j}].valueFrom"),
                "",
                "may not be specified when `value` is not empty",
            ));
        }
    }
    resources(at, c, errs);
    let probes = [
        ("livenessProbe", &c.liveness_probe),
        ("readinessProbe", &c.readiness_probe),
        ("startupProbe", &c.startup_probe),
    ];
    for (name, p) in probes {
        let Some(p) = p else { continue };
        let pat = format!("{at}.{name}");
        if init && c.restart_policy.as_deref() != Some("Always") {
            errs.push(FieldError { field: pat, problem: "Forbidden: may not be set for init containers".into() });
            continue;
        }
        probe(&pat, p, name != "readinessProbe", errs);
    }
}

fn resources(at: &str, c: &Container, errs: &mut Vec<FieldError>) {
    let Some(r) = c.resources.as_ref() else { return };
    let mut parsed = |kind: &str,
                      list: Option<
        &std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| {
        let mut out = std::collections::BTreeMap::new();
        for (name, q) in list.into_iter().flatten() {
            let field = format!("{at}.resources.{kind}[{name}]");
            match Quantity::parse(&q.0) {
                Ok(v) if v.is_negative() => errs.push(invalid(field, &q.0, "must be greater than or equal to 0")),
                Ok(v) => {
                    out.insert(name.clone(), v);
                }
                Err(e) => errs.push(invalid(field, &q.0, e)),
            }
        }
        out
    };
    let limits = parsed("limits", r.limits.as_ref());
    let requests = parsed("requests", r.requests.as_ref());
    for (name, req) in &requests {
        if let Some(lim) = limits.get(name)
            && req.milli_value() > lim.milli_value()
        {
            let raw = &r.requests.as_ref().expect("parsed from requests")[name].0;
            let lim_raw = &r.limits.as_ref().expect("parsed from limits")[name].0;
            errs.push(invalid(
                format!("{at}.resources.requests[{name}]"),
                raw,
                format!("must be less than or equal to {name} limit of {lim_raw}"),
            ));
        }
    }
}

fn probe(at: &str, p: &Probe, success_must_be_one: bool, errs: &mut Vec<FieldError>) {
    let handlers = [p.exec.is_some(), p.http_get.is_some(), p.tcp_socket.is_some(), p.grpc.is_some()];
    match handlers.iter().filter(|h| **h).count() {
        0 => errs.push(required(format!("{at}: must specify a handler type (exec, httpGet, tcpSocket or grpc)"))),
        1 => {}
        _ => errs.push(FieldError {
            field: at.into(),
            problem: "Forbidden: may not specify more than 1 handler type".into(),
        }),
    }
    for (name, v, min) in [
        ("initialDelaySeconds", p.initial_delay_seconds, 0),
        ("timeoutSeconds", p.timeout_seconds, 1),
        ("periodSeconds", p.period_seconds, 1),
        ("successThreshold", p.success_threshold, 1),
        ("failureThreshold", p.failure_threshold, 1),
    ] {
        if let Some(v) = v
            && v < min
        {
            errs.push(invalid(format!("{at}.{name}"), v, format!("must be greater than or equal to {min}")));
        }
    }
    if success_must_be_one && p.success_threshold.is_some_and(|s| s != 1) {
        errs.push(invalid(format!("{at}.successThreshold"), p.success_threshold.unwrap_or(0), "must be 1"));
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerPort, EnvVar, ExecAction, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;

    use super::*;

    fn valid() -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("web".into());
        p.spec = Some(PodSpec {
            containers: vec![Container { name: "c".into(), image: Some("busybox".into()), ..Default::default() }],
            ..Default::default()
        });
        p
    }

    fn with(f: impl FnOnce(&mut Pod)) -> Vec<String> {
        let mut p = valid();
        f(&mut p);
        validate(&p).into_iter().map(|e| e.to_string()).collect()
    }

    fn c0(p: &mut Pod) -> &mut Container {
        &mut p.spec.as_mut().unwrap().containers[0]
    }

    type Edit = Box<dyn FnOnce(&mut Pod)>;

    #[test]
    fn table() {
        let cases: Vec<(&str, Edit, &str)> = vec![
            ("valid", Box::new(|_| {}), ""),
            ("no name", Box::new(|p| p.metadata.name = None), "metadata.name: Required value"),
            ("bad name", Box::new(|p| p.metadata.name = Some("Web".into())), "metadata.name: Invalid value: \"Web\""),
            (
                "bad namespace",
                Box::new(|p| p.metadata.namespace = Some("a.b".into())),
                "metadata.namespace: Invalid value: \"a.b\"",
            ),
            ("no spec", Box::new(|p| p.spec = None), "spec: Required value"),
            (
                "annotations over 256 KiB in total",
                Box::new(|p| {
                    p.metadata.annotations = Some(
                        [("a".to_string(), "x".repeat(128 << 10)), ("b".to_string(), "y".repeat(128 << 10))].into(),
                    )
                }),
                "metadata.annotations: Too long: must have at most 262144 bytes",
            ),
            (
                "annotations of exactly 256 KiB",
                Box::new(|p| p.metadata.annotations = Some([("a".to_string(), "x".repeat((256 << 10) - 1))].into())),
                "",
            ),
            (
                "no containers",
                Box::new(|p| p.spec.as_mut().unwrap().containers.clear()),
                "spec.containers: Required value",
            ),
            (
                "restart policy",
                Box::new(|p| p.spec.as_mut().unwrap().restart_policy = Some("Sometimes".into())),
                "spec.restartPolicy: Unsupported value: \"Sometimes\"",
            ),
            (
                "negative grace",
                Box::new(|p| p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(-1)),
                "spec.terminationGracePeriodSeconds: Invalid value: -1",
            ),
            (
                "container name",
                Box::new(|p| c0(p).name = "my_container".into()),
                "spec.containers[0].name: Invalid value: \"my_container\"",
            ),
            ("no image", Box::new(|p| c0(p).image = None), "spec.containers[0].image: Required value"),
            (
                "pull policy",
                Box::new(|p| c0(p).image_pull_policy = Some("Sometimes".into())),
                "spec.containers[0].imagePullPolicy: Unsupported value",
            ),
            (
                "duplicate name",
                Box::new(|p| {
                    let c = c0(p).clone();
                    p.spec.as_mut().unwrap().init_containers = Some(vec![c]);
                }),
                "spec.containers[0].name: Duplicate value: \"c\"",
            ),
            (
                "port",
                Box::new(|p| c0(p).ports = Some(vec![ContainerPort { container_port: 70000, ..Default::default() }])),
                "spec.containers[0].ports[0].containerPort: Invalid value: 70000",
            ),
            (
                "host port on host network",
                Box::new(|p| {
                    p.spec.as_mut().unwrap().host_network = Some(true);
                    c0(p).ports =
                        Some(vec![ContainerPort { container_port: 80, host_port: Some(8080), ..Default::default() }]);
                }),
                "spec.containers[0].ports[0].hostPort: Invalid value: 8080: must match `containerPort`",
            ),
            (
                "env name",
                Box::new(|p| c0(p).env = Some(vec![EnvVar { name: "1X".into(), ..Default::default() }])),
                "spec.containers[0].env[0].name: Invalid value: \"1X\"",
            ),
            (
                "bad quantity",
                Box::new(|p| {
                    c0(p).resources = Some(ResourceRequirements {
                        limits: Some([("memory".to_string(), Q("2Gx".into()))].into()),
                        ..Default::default()
                    })
                }),
                "spec.containers[0].resources.limits[memory]: Invalid value: \"2Gx\"",
            ),
            (
                "request over limit",
                Box::new(|p| {
                    c0(p).resources = Some(ResourceRequirements {
                        limits: Some([("cpu".to_string(), Q("500m".into()))].into()),
                        requests: Some([("cpu".to_string(), Q("1".into()))].into()),
                        ..Default::default()
                    })
                }),
                "spec.containers[0].resources.requests[cpu]: Invalid value: \"1\": must be less than or equal to cpu limit of 500m",
            ),
            (
                "probe without handler",
                Box::new(|p| c0(p).liveness_probe = Some(Probe::default())),
                "spec.containers[0].livenessProbe: must specify a handler type",
            ),
            (
                "liveness success threshold",
                Box::new(|p| {
                    c0(p).liveness_probe = Some(Probe {
                        exec: Some(ExecAction { command: Some(vec!["true".into()]) }),
                        success_threshold: Some(2),
                        ..Default::default()
                    })
                }),
                "spec.containers[0].livenessProbe.successThreshold: Invalid value: 2: must be 1",
            ),
            (
                "zero period",
                Box::new(|p| {
                    c0(p).readiness_probe = Some(Probe {
                        exec: Some(ExecAction { command: Some(vec!["true".into()]) }),
                        period_seconds: Some(0),
                        ..Default::default()
                    })
                }),
                "spec.containers[0].readinessProbe.periodSeconds: Invalid value: 0",
            ),
        ];
        for (name, f, want) in cases {
            let got = with(f);
            if want.is_empty() {
                assert!(got.is_empty(), "{name}: {got:?}");
            } else {
                assert!(got.iter().any(|g| g.contains(want)), "{name}: want {want:?} in {got:?}");
            }
        }
    }
}
