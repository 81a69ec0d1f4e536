//! The API server's checks of pod-level resources (`spec.resources`), with
//! its wording, so a static manifest the API server would refuse is
//! refused here too instead of running with limits nobody meant: only cpu,
//! memory and huge pages at the pod level, each request within its limit,
//! the pod's requests covering what its containers request, and no
//! container limited above the pod.
//!
//! The checks run on the pod-level resources as the API server defaults
//! them (requests from the containers' or from the limits), as the API
//! server validates after defaulting.

use std::collections::BTreeMap;

use k8s_openapi::{api::core::v1::PodSpec, apimachinery::pkg::api::resource::Quantity as ApiQuantity};

use super::validation::{FieldError, invalid, unsupported};
use crate::{
    cm::{
        hugepages,
        pod_level::{self, HUGEPAGES_PREFIX, ResourceList},
    },
    quantity::Quantity,
};

const AT: &str = "spec.resources";

/// The resource names the API knows without a domain (its
/// standardResources); others must be fully qualified.
const STANDARD_RESOURCES: [&str; 20] = [
    "cpu",
    "memory",
    "ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "pods",
    "resourcequotas",
    "services",
    "replicationcontrollers",
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "storage",
    "requests.storage",
    "services.nodeports",
    "services.loadbalancers",
];

/// What `unsupported` lists for the pod level.
const SUPPORTED: [&str; 3] = ["cpu", "hugepages-", "memory"];

fn forbidden(field: &str, why: &str) -> FieldError {
    FieldError { field: field.into(), problem: format!("Forbidden: {why}") }
}

/// A computed quantity as the API prints one: cpu in cores or millicores,
/// bytes with the largest binary (or else decimal) suffix that is exact.
fn show(name: &str, q: Quantity) -> String {
    if name == "cpu" || q.milli_value() % 1000 != 0 {
        return q.to_string();
    }
    let v = q.value();
    if v == 0 {
        return "0".into();
    }
    for (suffix, unit) in
        [("Ei", 1i64 << 60), ("Pi", 1 << 50), ("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)]
    {
        if v % unit == 0 {
            return format!("{}{suffix}", v / unit);
        }
    }
    for (suffix, unit) in [("E", 1_000_000_000_000_000_000i64), ("P", 1_000_000_000_000_000), ("T", 1_000_000_000_000)]
        .into_iter()
        .chain([("G", 1_000_000_000), ("M", 1_000_000), ("k", 1_000)])
    {
        if v % unit == 0 {
            return format!("{}{suffix}", v / unit);
        }
    }
    v.to_string()
}

/// The value of `name` in a list as written, or as defaulting computed it.
fn shown(raw: Option<&BTreeMap<String, ApiQuantity>>, name: &str, q: Quantity) -> String {
    raw.and_then(|r| r.get(name)).map_or_else(|| show(name, q), |v| v.0.clone())
}

/// The name rules of the pod level (validatePodResourceName): a name the
/// API does not know, or one it knows but the pod level does not support.
fn name_error(field: &str, name: &str) -> Option<FieldError> {
    let qualified = name.contains('/');
    let huge = name.starts_with(HUGEPAGES_PREFIX) || name.starts_with("requests.hugepages-");
    if !qualified && !STANDARD_RESOURCES.contains(&name) && !huge {
        return Some(invalid(field, name, "must be a standard resource type or fully qualified"));
    }
    (!pod_level::is_supported(name)).then(|| unsupported(field, name, &SUPPORTED))
}

/// Parses one list, reporting names and values the API refuses.
fn parsed(kind: &str, list: Option<&BTreeMap<String, ApiQuantity>>, errs: &mut Vec<FieldError>) -> ResourceList {
    let mut out = ResourceList::new();
    for (name, raw) in list.into_iter().flatten() {
        let field = format!("{AT}.{kind}[{name}]");
        if let Some(e) = name_error(&field, name) {
            errs.push(e);
        }
        match Quantity::parse(&raw.0) {
            Ok(q) if q.is_negative() => errs.push(invalid(&field, &raw.0, "must be greater than or equal to 0")),
            Ok(q) => {
                if let Some(page) = hugepages::page_bytes(name)
                    && (q.milli_value() % 1000 != 0 || page == 0 || q.value() % page as i64 != 0)
                {
                    errs.push(invalid(&field, &raw.0, format!("{} is not positive integer multiple of {name}", raw.0)));
                }
                out.insert(name.clone(), q);
            }
            Err(e) => errs.push(invalid(&field, &raw.0, e)),
        }
    }
    out
}

/// Every problem with the pod's `spec.resources`, in the API server's
/// order; empty when it is valid or unset.
pub fn validate(spec: &PodSpec) -> Vec<FieldError> {
    let Some(r) = spec.resources.as_ref() else { return vec![] };
    if spec.os.as_ref().is_some_and(|os| os.name == "windows") {
        return vec![forbidden(AT, "may not be set for a windows pod")];
    }
    let mut errs = vec![];
    let raw_limits = r.limits.as_ref();
    let raw_requests = r.requests.as_ref();
    let limits = parsed("limits", raw_limits, &mut errs);
    parsed("requests", raw_requests, &mut errs);
    if !errs.is_empty() {
        return errs;
    }
    // From here on, the pod level as the API server stores it.
    let Some(declared) = pod_level::declared(spec) else { return errs };
    for (name, req) in &declared.requests {
        let value = shown(raw_requests, name, *req);
        match limits.get(name) {
            Some(lim) if name.starts_with(HUGEPAGES_PREFIX) && req != lim => errs.push(invalid(
                format!("{AT}.requests"),
                &value,
                format!("must be equal to {name} limit of {}", shown(raw_limits, name, *lim)),
            )),
            Some(lim) if req > lim => errs.push(invalid(
                format!("{AT}.requests"),
                &value,
                format!("must be less than or equal to {name} limit of {}", shown(raw_limits, name, *lim)),
            )),
            None if name.starts_with(HUGEPAGES_PREFIX) => errs.push(FieldError {
                field: format!("{AT}.limits"),
                problem: "Required value: Limit must be set for non overcommitable resources".into(),
            }),
            _ => {}
        }
    }
    let names = || declared.requests.keys().chain(declared.limits.keys());
    if names().any(|n| n.starts_with(HUGEPAGES_PREFIX)) && !names().any(|n| n == "cpu" || n == "memory") {
        errs.push(forbidden(AT, "HugePages require cpu or memory"));
    }
    consistency(spec, &declared, raw_requests, raw_limits, &mut errs);
    errs
}

/// validatePodResourceConsistency: the pod's requests cover its
/// containers', its huge page limits cover theirs, and no app container
/// has a limit above the pod's.
fn consistency(
    spec: &PodSpec,
    declared: &pod_level::PodLevel,
    raw_requests: Option<&BTreeMap<String, ApiQuantity>>,
    raw_limits: Option<&BTreeMap<String, ApiQuantity>>,
    errs: &mut Vec<FieldError>,
) {
    for (name, aggregate) in pod_level::aggregate(spec, pod_level::container_requests) {
        if let Some(req) = declared.requests.get(&name)
            && aggregate > *req
        {
            errs.push(invalid(
                format!("{AT}.requests[{name}]"),
                shown(raw_requests, &name, *req),
                format!("must be greater than or equal to aggregate container requests of {}", show(&name, aggregate)),
            ));
        }
    }
    for (name, aggregate) in pod_level::aggregate(spec, pod_level::container_limits) {
        if let Some(lim) = declared.limits.get(&name)
            && name.starts_with(HUGEPAGES_PREFIX)
            && aggregate > *lim
        {
            errs.push(invalid(
                format!("{AT}.limits[{name}]"),
                shown(raw_limits, &name, *lim),
                format!("must be greater than or equal to aggregate container limits of {}", show(&name, aggregate)),
            ));
        }
    }
    for (i, c) in spec.containers.iter().enumerate() {
        let raw = c.resources.as_ref().and_then(|r| r.limits.as_ref());
        for (name, lim) in pod_level::container_limits(c) {
            if let Some(pod_lim) = declared.limits.get(&name)
                && lim > *pod_lim
            {
                // The API server builds this path from the pod-level one.
                errs.push(invalid(
                    format!("{AT}.containers[{i}][{name}].limits"),
                    shown(raw, &name, lim),
                    format!("must be less than or equal to pod limits of {}", shown(raw_limits, &name, *pod_lim)),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, PodOS, ResourceRequirements};

    use super::*;

    fn list(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, ApiQuantity>> {
        (!pairs.is_empty()).then(|| pairs.iter().map(|(k, v)| (k.to_string(), ApiQuantity(v.to_string()))).collect())
    }

    fn container(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                requests: list(requests),
                limits: list(limits),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(containers: Vec<Container>, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> PodSpec {
        PodSpec {
            containers,
            resources: Some(ResourceRequirements {
                requests: list(requests),
                limits: list(limits),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn table() {
        let be = || container(&[], &[]);
        let cases: Vec<(&str, PodSpec, Vec<&str>)> = vec![
            ("valid: limits only", pod(vec![be(), be()], &[], &[("cpu", "1"), ("memory", "96Mi")]), vec![]),
            (
                "valid: requests within limits and above the containers'",
                pod(
                    vec![container(&[("cpu", "100m")], &[("cpu", "500m")])],
                    &[("cpu", "250m"), ("memory", "64Mi")],
                    &[("cpu", "1"), ("memory", "128Mi")],
                ),
                vec![],
            ),
            ("valid: unset", PodSpec { containers: vec![be()], ..Default::default() }, vec![]),
            (
                "ephemeral-storage is not a pod-level resource",
                pod(vec![be()], &[("ephemeral-storage", "1Gi")], &[]),
                vec![
                    "spec.resources.requests[ephemeral-storage]: Unsupported value: \"ephemeral-storage\": supported values: \"cpu\", \"hugepages-\", \"memory\"",
                ],
            ),
            (
                "an extended resource is not either",
                pod(vec![be()], &[], &[("example.com/gpu", "1")]),
                vec![
                    "spec.resources.limits[example.com/gpu]: Unsupported value: \"example.com/gpu\": supported values: \"cpu\", \"hugepages-\", \"memory\"",
                ],
            ),
            (
                "an unknown name",
                pod(vec![be()], &[("cpus", "1")], &[]),
                vec![
                    "spec.resources.requests[cpus]: Invalid value: \"cpus\": must be a standard resource type or fully qualified",
                ],
            ),
            (
                "negative",
                pod(vec![be()], &[], &[("memory", "-1")]),
                vec!["spec.resources.limits[memory]: Invalid value: \"-1\": must be greater than or equal to 0"],
            ),
            (
                "request above limit",
                pod(vec![be()], &[("cpu", "2")], &[("cpu", "1")]),
                vec!["spec.resources.requests: Invalid value: \"2\": must be less than or equal to cpu limit of 1"],
            ),
            (
                "defaulted from the containers above the pod's limit",
                pod(vec![container(&[("memory", "200Mi")], &[])], &[], &[("memory", "100Mi")]),
                vec![
                    "spec.resources.requests: Invalid value: \"200Mi\": must be less than or equal to memory limit of 100Mi",
                ],
            ),
            (
                "pod requests below the containers'",
                pod(
                    vec![container(&[("cpu", "1"), ("memory", "4Gi")], &[]), container(&[("cpu", "500m")], &[])],
                    &[("cpu", "1"), ("memory", "576Mi")],
                    &[],
                ),
                vec![
                    "spec.resources.requests[cpu]: Invalid value: \"1\": must be greater than or equal to aggregate container requests of 1500m",
                    "spec.resources.requests[memory]: Invalid value: \"576Mi\": must be greater than or equal to aggregate container requests of 4Gi",
                ],
            ),
            (
                "a container limited above the pod",
                pod(vec![be(), container(&[("cpu", "100m")], &[("cpu", "2")])], &[("cpu", "1")], &[("cpu", "1")]),
                vec![
                    "spec.resources.containers[1][cpu].limits: Invalid value: \"2\": must be less than or equal to pod limits of 1",
                ],
            ),
            (
                "huge pages alone",
                pod(vec![be()], &[], &[("hugepages-2Mi", "4Mi")]),
                vec!["spec.resources: Forbidden: HugePages require cpu or memory"],
            ),
            (
                "huge pages not a multiple of the page",
                pod(vec![be()], &[], &[("memory", "1Gi"), ("hugepages-2Mi", "3Mi")]),
                vec![
                    "spec.resources.limits[hugepages-2Mi]: Invalid value: \"3Mi\": 3Mi is not positive integer multiple of hugepages-2Mi",
                ],
            ),
            (
                "huge page request without a limit",
                pod(vec![be()], &[("memory", "1Gi"), ("hugepages-2Mi", "4Mi")], &[]),
                vec!["spec.resources.limits: Required value: Limit must be set for non overcommitable resources"],
            ),
            (
                "the containers' huge pages equal to the pod's",
                pod(
                    vec![container(&[], &[("hugepages-2Mi", "8Mi")])],
                    &[("hugepages-2Mi", "8Mi")],
                    &[("memory", "1Gi"), ("hugepages-2Mi", "8Mi")],
                ),
                vec![],
            ),
            (
                "the containers' huge page limits above the pod's",
                pod(
                    vec![container(&[], &[("hugepages-2Mi", "8Mi")]), container(&[], &[("hugepages-2Mi", "16Mi")])],
                    &[("hugepages-2Mi", "16Mi")],
                    &[("memory", "1Gi"), ("hugepages-2Mi", "16Mi")],
                ),
                vec![
                    "spec.resources.requests[hugepages-2Mi]: Invalid value: \"16Mi\": must be greater than or equal to aggregate container requests of 24Mi",
                    "spec.resources.limits[hugepages-2Mi]: Invalid value: \"16Mi\": must be greater than or equal to aggregate container limits of 24Mi",
                ],
            ),
        ];
        for (name, spec, want) in cases {
            let got: Vec<String> = validate(&spec).iter().map(ToString::to_string).collect();
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn windows_pods_may_not_set_it() {
        let mut spec = pod(vec![container(&[], &[])], &[], &[("cpu", "1")]);
        spec.os = Some(PodOS { name: "windows".into() });
        let got: Vec<String> = validate(&spec).iter().map(ToString::to_string).collect();
        assert_eq!(got, ["spec.resources: Forbidden: may not be set for a windows pod"]);
    }

    #[test]
    fn computed_quantities_print_as_the_api_prints_them() {
        let q = |s: &str| s.parse::<Quantity>().unwrap();
        assert_eq!(show("cpu", q("1500m")), "1500m");
        assert_eq!(show("cpu", q("2")), "2");
        assert_eq!(show("memory", q("4Gi")), "4Gi");
        assert_eq!(show("memory", q("1536Mi")), "1536Mi");
        assert_eq!(show("memory", q("1G")), "1G");
        assert_eq!(show("memory", q("1500")), "1500");
    }
}
