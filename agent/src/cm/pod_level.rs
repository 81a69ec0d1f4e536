//! Pod-level resources (`spec.resources`), as the API server defaults them
//! and the kubelet's resource helpers read them: a pod's effective
//! requests and limits, which the QoS class, the pod cgroup, admission and
//! eviction all follow. Only cpu, memory and huge pages can be set at the
//! pod level; where the pod sets one, it replaces the containers' sum.
//!
//! Pure: every function reads a `PodSpec` and nothing else.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Container, PodSpec},
    apimachinery::pkg::api::resource::Quantity as ApiQuantity,
};

use crate::quantity::Quantity;

/// The prefix of the huge page resources (`hugepages-2Mi`).
pub const HUGEPAGES_PREFIX: &str = "hugepages-";

/// Resource name → quantity; a quantity that does not parse is left out
/// (validation refuses such pods before anything reads them).
pub type ResourceList = BTreeMap<String, Quantity>;

/// The resources the pod level supports (the kubelet's
/// IsSupportedPodLevelResource): cpu, memory and huge pages.
pub fn is_supported(name: &str) -> bool {
    name == "cpu" || name == "memory" || name.starts_with(HUGEPAGES_PREFIX)
}

fn parse(list: Option<&BTreeMap<String, ApiQuantity>>) -> ResourceList {
    list.into_iter().flatten().filter_map(|(k, q)| Some((k.clone(), q.0.parse::<Quantity>().ok()?))).collect()
}

/// A container's requests, with the API server's defaulting: a resource
/// with a limit and no request requests its limit.
pub fn container_requests(c: &Container) -> ResourceList {
    let r = c.resources.as_ref();
    let mut out = parse(r.and_then(|r| r.requests.as_ref()));
    for (k, v) in parse(r.and_then(|r| r.limits.as_ref())) {
        out.entry(k).or_insert(v);
    }
    out
}

/// A container's limits.
pub fn container_limits(c: &Container) -> ResourceList {
    parse(c.resources.as_ref().and_then(|r| r.limits.as_ref()))
}

fn add(into: &mut ResourceList, from: &ResourceList) {
    for (k, v) in from {
        let e = into.entry(k.clone()).or_default();
        *e = *e + *v;
    }
}

fn max(into: &mut ResourceList, from: &ResourceList) {
    for (k, v) in from {
        let e = into.entry(k.clone()).or_insert(*v);
        *e = (*e).max(*v);
    }
}

fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// The containers' aggregate of `of` (the kubelet's
/// AggregateContainerRequests / Limits): app containers and sidecars
/// summed, or the largest init container with the sidecars started before
/// it if that is more. A resource no container names is absent.
pub fn aggregate(spec: &PodSpec, of: impl Fn(&Container) -> ResourceList) -> ResourceList {
    let mut total = ResourceList::new();
    for c in &spec.containers {
        add(&mut total, &of(c));
    }
    let mut sidecars = ResourceList::new();
    let mut init_peak = ResourceList::new();
    for c in spec.init_containers.iter().flatten() {
        let own = of(c);
        let running = if is_sidecar(c) {
            add(&mut total, &own);
            add(&mut sidecars, &own);
            sidecars.clone()
        } else {
            let mut r = own;
            add(&mut r, &sidecars);
            r
        };
        max(&mut init_peak, &running);
    }
    max(&mut total, &init_peak);
    total
}

/// `spec.resources` as the API server stores it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodLevel {
    pub requests: ResourceList,
    pub limits: ResourceList,
}

/// `spec.resources` with the API server's defaulting (defaultPodRequests),
/// or None when the pod does not set it. When pod-level limits are set, a
/// supported resource without a pod-level request requests what the
/// containers request together, or, if no container requests it, the
/// pod-level limit.
pub fn declared(spec: &PodSpec) -> Option<PodLevel> {
    let r = spec.resources.as_ref()?;
    let mut requests = parse(r.requests.as_ref());
    let limits = parse(r.limits.as_ref());
    if !limits.is_empty() {
        let containers = aggregate(spec, container_requests);
        for (k, v) in containers.iter().chain(limits.iter()) {
            if is_supported(k) {
                requests.entry(k.clone()).or_insert(*v);
            }
        }
    }
    Some(PodLevel { requests, limits })
}

impl PodLevel {
    /// Requests of a resource the pod level supports (the kubelet's
    /// IsPodLevelRequestsSet).
    pub fn requests_set(&self) -> bool {
        self.requests.keys().any(|k| is_supported(k))
    }

    /// Requests or limits of a supported resource (IsPodLevelResourcesSet).
    pub fn is_set(&self) -> bool {
        self.requests_set() || self.limits.keys().any(|k| is_supported(k))
    }
}

fn overhead(spec: &PodSpec) -> ResourceList {
    parse(spec.overhead.as_ref())
}

/// The pod's effective requests (the kubelet's PodRequests): the
/// containers' aggregate, each supported resource the pod level requests
/// replaced by that request, plus the pod overhead.
pub fn pod_requests(spec: &PodSpec) -> ResourceList {
    let mut reqs = aggregate(spec, container_requests);
    if let Some(p) = declared(spec).filter(PodLevel::requests_set) {
        for (k, v) in p.requests.iter().filter(|(k, _)| is_supported(k)) {
            reqs.insert(k.clone(), *v);
        }
    }
    add(&mut reqs, &overhead(spec));
    reqs
}

/// The pod's effective limits (the kubelet's PodLimits): the containers'
/// aggregate, each supported resource the pod level limits replaced by
/// that limit, plus the overhead on the limits that are set.
pub fn pod_limits(spec: &PodSpec) -> ResourceList {
    let mut limits = aggregate(spec, container_limits);
    if let Some(p) = declared(spec).filter(PodLevel::is_set) {
        for (k, v) in p.limits.iter().filter(|(k, _)| is_supported(k)) {
            limits.insert(k.clone(), *v);
        }
    }
    for (k, v) in overhead(spec) {
        if let Some(l) = limits.get_mut(&k).filter(|l| **l != Quantity::ZERO) {
            *l = *l + v;
        }
    }
    limits
}

/// Milli-units of `name` in `list`, 0 when absent.
pub fn milli(list: &ResourceList, name: &str) -> i64 {
    list.get(name).map_or(0, |q| q.milli_value().max(0))
}

/// Whole units (bytes, cores rounded up) of `name` in `list`, 0 when absent.
pub fn value(list: &ResourceList, name: &str) -> i64 {
    list.get(name).map_or(0, |q| q.value().max(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::test_support::{container, res, spec};

    fn with_pod_level(mut s: PodSpec, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> PodSpec {
        s.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            requests: res(requests),
            limits: res(limits),
            ..Default::default()
        });
        s
    }

    fn list(pairs: &[(&str, &str)]) -> ResourceList {
        pairs.iter().map(|(k, v)| (k.to_string(), v.parse().expect("a quantity"))).collect()
    }

    #[test]
    fn defaulting_table() {
        let cases: Vec<(&str, PodSpec, Option<PodLevel>)> = vec![
            ("unset", spec(vec![container(&[], &[])]), None),
            (
                "limits only: requests default to them",
                with_pod_level(spec(vec![container(&[], &[])]), &[], &[("cpu", "1"), ("memory", "96Mi")]),
                Some(PodLevel {
                    requests: list(&[("cpu", "1"), ("memory", "96Mi")]),
                    limits: list(&[("cpu", "1"), ("memory", "96Mi")]),
                }),
            ),
            (
                "containers' requests come before the limits",
                with_pod_level(
                    spec(vec![container(&[("cpu", "100m")], &[]), container(&[("cpu", "150m")], &[])]),
                    &[],
                    &[("cpu", "1"), ("memory", "1Gi")],
                ),
                Some(PodLevel {
                    requests: list(&[("cpu", "250m"), ("memory", "1Gi")]),
                    limits: list(&[("cpu", "1"), ("memory", "1Gi")]),
                }),
            ),
            (
                "explicit requests are kept",
                with_pod_level(spec(vec![container(&[], &[])]), &[("memory", "64Mi")], &[("memory", "128Mi")]),
                Some(PodLevel { requests: list(&[("memory", "64Mi")]), limits: list(&[("memory", "128Mi")]) }),
            ),
            (
                "requests only: nothing defaulted",
                with_pod_level(spec(vec![container(&[("cpu", "1")], &[])]), &[("memory", "64Mi")], &[]),
                Some(PodLevel { requests: list(&[("memory", "64Mi")]), limits: list(&[]) }),
            ),
            (
                "unsupported container resources are not pulled up",
                with_pod_level(spec(vec![container(&[("ephemeral-storage", "1Gi")], &[])]), &[], &[("cpu", "1")]),
                Some(PodLevel { requests: list(&[("cpu", "1")]), limits: list(&[("cpu", "1")]) }),
            ),
        ];
        for (name, s, want) in cases {
            assert_eq!(declared(&s), want, "{name}");
        }
    }

    #[test]
    fn effective_requests_and_limits() {
        let two = spec(vec![
            container(&[("cpu", "100m"), ("memory", "32Mi")], &[("memory", "64Mi")]),
            container(&[("cpu", "200m")], &[("cpu", "500m")]),
        ]);
        assert_eq!(pod_requests(&two), list(&[("cpu", "300m"), ("memory", "32Mi")]), "no pod level: the sum");
        assert_eq!(pod_limits(&two), list(&[("cpu", "500m"), ("memory", "64Mi")]));

        let p = with_pod_level(two.clone(), &[("memory", "96Mi")], &[("memory", "200Mi")]);
        assert_eq!(pod_requests(&p), list(&[("cpu", "300m"), ("memory", "96Mi")]), "memory from the pod level");
        assert_eq!(pod_limits(&p), list(&[("cpu", "500m"), ("memory", "200Mi")]));

        let mut o = with_pod_level(spec(vec![container(&[], &[])]), &[], &[("cpu", "1")]);
        o.overhead = res(&[("cpu", "100m"), ("memory", "10Mi")]);
        assert_eq!(pod_requests(&o), list(&[("cpu", "1100m"), ("memory", "10Mi")]), "overhead on every request");
        assert_eq!(pod_limits(&o), list(&[("cpu", "1100m")]), "overhead only on limits that are set");

        let ignored = with_pod_level(two.clone(), &[("ephemeral-storage", "1Gi")], &[]);
        assert_eq!(pod_requests(&ignored), pod_requests(&two), "unsupported pod-level resources are not used");
    }

    #[test]
    fn sidecars_and_init_containers_aggregate() {
        let mut s = spec(vec![container(&[("memory", "100Mi")], &[])]);
        let mut sidecar = container(&[("memory", "50Mi")], &[]);
        sidecar.restart_policy = Some("Always".into());
        s.init_containers = Some(vec![sidecar, container(&[("memory", "400Mi")], &[])]);
        assert_eq!(aggregate(&s, container_requests), list(&[("memory", "450Mi")]), "init peak: 400 + sidecar 50");
        s.init_containers.as_mut().unwrap().pop();
        assert_eq!(aggregate(&s, container_requests), list(&[("memory", "150Mi")]), "sidecar adds to the app");
    }
}
