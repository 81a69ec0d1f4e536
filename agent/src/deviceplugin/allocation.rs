//! Which devices a pod's containers get, as the kubelet's devicemanager
//! picks them at admission (`allocateContainerResources` /
//! `devicesToAllocate`). Pure: the healthy devices come in, the new
//! assignments go out.
//!
//! Containers are served in order, init containers first. A device given
//! to an init container may be given again to a later container of the
//! same pod (init containers have finished by then); every other device
//! goes to one container at a time. A container that already has its
//! devices (a pod admitted again after a restart) keeps them.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod};
use thiserror::Error;

use super::api;
use crate::quantity::Quantity;

/// The devices of one container for one resource, and the plugin's
/// Allocate answer for them once it was asked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerDevices {
    pub ids: BTreeSet<String>,
    pub response: Option<api::ContainerAllocateResponse>,
}

/// Pod uid → container name → resource → devices.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Assignments {
    pub pods: BTreeMap<String, BTreeMap<String, BTreeMap<String, ContainerDevices>>>,
}

/// Why a pod cannot have its devices; the text is the kubelet's (it
/// becomes "Allocate failed due to <this>, which is unexpected").
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum AllocationError {
    #[error("cannot allocate unregistered device {0}")]
    Unregistered(String),
    #[error("no healthy devices present; cannot allocate unhealthy devices {0}")]
    NoHealthy(String),
    #[error("requested number of devices unavailable for {resource}. Requested: {requested}, Available: {available}")]
    Unavailable { resource: String, requested: usize, available: usize },
    #[error("pod {pod:?} container {container:?} changed request for resource {resource:?} from {from} to {to}")]
    Changed { pod: String, container: String, resource: String, from: usize, to: usize },
    #[error("container {container:?} requests {value} of {resource}: device counts are whole numbers")]
    NotWhole { container: String, resource: String, value: String },
}

/// What one container asks of the device plugin resources.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerRequest {
    pub container: String,
    /// A (non-sidecar) init container: its devices may be reused.
    pub init: bool,
    pub resources: BTreeMap<String, usize>,
}

impl Assignments {
    /// Devices of `resource` given to any container.
    pub fn in_use(&self, resource: &str) -> BTreeSet<String> {
        self.pods
            .values()
            .flat_map(|cs| cs.values())
            .filter_map(|rs| rs.get(resource))
            .flat_map(|d| d.ids.iter().cloned())
            .collect()
    }

    /// Every resource some container holds devices of.
    pub fn resources(&self) -> BTreeSet<String> {
        self.pods.values().flat_map(|cs| cs.values()).flat_map(|rs| rs.keys().cloned()).collect()
    }

    pub fn container(&self, uid: &str, container: &str) -> Option<&BTreeMap<String, ContainerDevices>> {
        self.pods.get(uid)?.get(container)
    }

    /// Keeps the pods in `keep` only; true when something was freed.
    pub fn retain_pods(&mut self, keep: &BTreeSet<String>) -> bool {
        let before = self.pods.len();
        self.pods.retain(|uid, _| keep.contains(uid));
        self.pods.len() != before
    }
}

/// The device plugin resources (those `known` says are) each container of
/// `pod` asks for, in the order devices are given: init containers, then
/// the others. Limits count (requests must equal them for extended
/// resources); requests are read when there is no limit.
pub fn requests(pod: &Pod, known: impl Fn(&str) -> bool) -> Result<Vec<ContainerRequest>, AllocationError> {
    let Some(spec) = pod.spec.as_ref() else { return Ok(vec![]) };
    let init = spec.init_containers.iter().flatten().map(|c| (c, c.restart_policy.as_deref() != Some("Always")));
    let regular = spec.containers.iter().map(|c| (c, false));
    let mut out = vec![];
    for (c, reusable) in init.chain(regular) {
        let resources = container_resources(c, &known)?;
        if !resources.is_empty() {
            out.push(ContainerRequest { container: c.name.clone(), init: reusable, resources });
        }
    }
    Ok(out)
}

fn container_resources(
    c: &Container,
    known: &impl Fn(&str) -> bool,
) -> Result<BTreeMap<String, usize>, AllocationError> {
    let Some(r) = c.resources.as_ref() else { return Ok(BTreeMap::new()) };
    let mut list = r.requests.clone().unwrap_or_default();
    list.extend(r.limits.clone().unwrap_or_default());
    let mut out = BTreeMap::new();
    for (name, q) in list {
        if !known(&name) {
            continue;
        }
        let whole = Quantity::parse(&q.0).ok().filter(|v| v.milli_value() % 1000 == 0 && v.value() >= 0);
        let Some(v) = whole else {
            return Err(AllocationError::NotWhole { container: c.name.clone(), resource: name, value: q.0 });
        };
        if v.value() > 0 {
            out.insert(name, v.value() as usize);
        }
    }
    Ok(out)
}

/// Gives `pod_uid`'s containers their devices in `assignments`, from the
/// healthy devices per resource (`healthy`: None for an unregistered
/// resource). On error `assignments` may hold part of the pod: callers
/// work on a copy.
pub fn allocate(
    assignments: &mut Assignments,
    pod_uid: &str,
    containers: &[ContainerRequest],
    healthy: impl Fn(&str) -> Option<BTreeSet<String>>,
) -> Result<(), AllocationError> {
    // Devices of finished init containers, per resource.
    let mut reusable: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for c in containers {
        for (resource, &required) in &c.resources {
            let ids = match assignments.container(pod_uid, &c.container).and_then(|rs| rs.get(resource)) {
                Some(had) if had.ids.len() == required => had.ids.clone(),
                Some(had) => {
                    return Err(AllocationError::Changed {
                        pod: pod_uid.into(),
                        container: c.container.clone(),
                        resource: resource.clone(),
                        from: had.ids.len(),
                        to: required,
                    });
                }
                None => {
                    let ids = pick(assignments, resource, required, reusable.get(resource), &healthy)?;
                    assignments
                        .pods
                        .entry(pod_uid.into())
                        .or_default()
                        .entry(c.container.clone())
                        .or_default()
                        .insert(resource.clone(), ContainerDevices { ids: ids.clone(), response: None });
                    ids
                }
            };
            let pool = reusable.entry(resource.clone()).or_default();
            if c.init {
                pool.extend(ids);
            } else {
                pool.retain(|id| !ids.contains(id));
            }
        }
    }
    Ok(())
}

/// `required` devices of `resource`: reusable ones first, then free
/// healthy ones in id order.
fn pick(
    assignments: &Assignments,
    resource: &str,
    required: usize,
    reusable: Option<&BTreeSet<String>>,
    healthy: &impl Fn(&str) -> Option<BTreeSet<String>>,
) -> Result<BTreeSet<String>, AllocationError> {
    let Some(healthy) = healthy(resource) else {
        return Err(AllocationError::Unregistered(resource.into()));
    };
    if healthy.is_empty() {
        return Err(AllocationError::NoHealthy(resource.into()));
    }
    let mut chosen: BTreeSet<String> =
        reusable.into_iter().flatten().filter(|id| healthy.contains(*id)).take(required).cloned().collect();
    let needed = required - chosen.len();
    if needed == 0 {
        return Ok(chosen);
    }
    let in_use = assignments.in_use(resource);
    let available: Vec<&String> = healthy.iter().filter(|id| !in_use.contains(*id) && !chosen.contains(*id)).collect();
    if available.len() < needed {
        return Err(AllocationError::Unavailable {
            resource: resource.into(),
            requested: needed,
            available: available.len(),
        });
    }
    chosen.extend(available.into_iter().take(needed).cloned());
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{PodSpec, ResourceRequirements},
        apimachinery::pkg::api::resource::Quantity as Q,
    };

    use super::*;

    const R: &str = "example.com/foo";

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    fn req(container: &str, init: bool, n: usize) -> ContainerRequest {
        ContainerRequest { container: container.into(), init, resources: BTreeMap::from([(R.to_string(), n)]) }
    }

    fn held(a: &Assignments, uid: &str, container: &str) -> BTreeSet<String> {
        a.container(uid, container).and_then(|rs| rs.get(R)).map(|d| d.ids.clone()).unwrap_or_default()
    }

    #[test]
    fn allocation_table() {
        // (name, healthy devices (None: unregistered), already held by pod "other",
        //  requests of pod "p", expected devices per container or error)
        type Case<'a> = (
            &'a str,
            Option<&'a [&'a str]>,
            &'a [&'a str],
            Vec<ContainerRequest>,
            Result<Vec<(&'a str, &'a [&'a str])>, String>,
        );
        let cases: Vec<Case> = vec![
            ("one of two", Some(&["a", "b"]), &[], vec![req("c", false, 1)], Ok(vec![("c", &["a"])])),
            (
                "skips devices in use",
                Some(&["a", "b", "c"]),
                &["a"],
                vec![req("c", false, 2)],
                Ok(vec![("c", &["b", "c"])]),
            ),
            (
                "two containers never share",
                Some(&["a", "b"]),
                &[],
                vec![req("c1", false, 1), req("c2", false, 1)],
                Ok(vec![("c1", &["a"]), ("c2", &["b"])]),
            ),
            (
                "more than remain",
                Some(&["a", "b"]),
                &["a"],
                vec![req("c", false, 2)],
                Err("requested number of devices unavailable for example.com/foo. Requested: 2, Available: 1".into()),
            ),
            (
                "unhealthy devices are not given",
                Some(&["b"]),
                &[],
                vec![req("c", false, 2)],
                Err("requested number of devices unavailable for example.com/foo. Requested: 2, Available: 1".into()),
            ),
            (
                "none healthy",
                Some(&[]),
                &[],
                vec![req("c", false, 1)],
                Err("no healthy devices present; cannot allocate unhealthy devices example.com/foo".into()),
            ),
            (
                "unregistered",
                None,
                &[],
                vec![req("c", false, 1)],
                Err("cannot allocate unregistered device example.com/foo".into()),
            ),
            (
                "init devices are reused by the next container",
                Some(&["a", "b"]),
                &["b"],
                vec![req("init", true, 1), req("c", false, 1)],
                Ok(vec![("init", &["a"]), ("c", &["a"])]),
            ),
            (
                "a reused device goes to one regular container only",
                Some(&["a", "b", "c"]),
                &[],
                vec![req("init", true, 1), req("c1", false, 1), req("c2", false, 1)],
                Ok(vec![("init", &["a"]), ("c1", &["a"]), ("c2", &["b"])]),
            ),
            (
                "reuse then top up",
                Some(&["a", "b", "c"]),
                &[],
                vec![req("init", true, 1), req("c", false, 2)],
                Ok(vec![("init", &["a"]), ("c", &["a", "b"])]),
            ),
        ];
        for (name, healthy, other, containers, want) in cases {
            let mut a = Assignments::default();
            if !other.is_empty() {
                a.pods
                    .entry("other".into())
                    .or_default()
                    .entry("x".into())
                    .or_default()
                    .insert(R.into(), ContainerDevices { ids: set(other), response: None });
            }
            let healthy = healthy.map(set);
            let got = allocate(&mut a, "p", &containers, |_| healthy.clone());
            match want {
                Ok(expected) => {
                    assert_eq!(got, Ok(()), "{name}");
                    for (c, ids) in expected {
                        assert_eq!(held(&a, "p", c), set(ids), "{name}: {c}");
                    }
                }
                Err(msg) => assert_eq!(got.map_err(|e| e.to_string()), Err(msg), "{name}"),
            }
        }
    }

    #[test]
    fn a_container_that_has_devices_keeps_them() {
        let mut a = Assignments::default();
        allocate(&mut a, "p", &[req("c", false, 1)], |_| Some(set(&["a", "b"]))).unwrap();
        let before = a.clone();
        // Admitted again (an agent restart): same devices, nothing new.
        allocate(&mut a, "p", &[req("c", false, 1)], |_| Some(set(&["b"]))).unwrap();
        assert_eq!(a, before);
        let e = allocate(&mut a, "p", &[req("c", false, 2)], |_| Some(set(&["a", "b"]))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "pod \"p\" container \"c\" changed request for resource \"example.com/foo\" from 1 to 2"
        );
    }

    #[test]
    fn freed_pods_give_their_devices_back() {
        let mut a = Assignments::default();
        allocate(&mut a, "p1", &[req("c", false, 2)], |_| Some(set(&["a", "b"]))).unwrap();
        assert!(allocate(&mut a.clone(), "p2", &[req("c", false, 1)], |_| Some(set(&["a", "b"]))).is_err());
        assert!(a.retain_pods(&set(&["p2"])));
        assert!(!a.retain_pods(&set(&["p2"])));
        allocate(&mut a, "p2", &[req("c", false, 1)], |_| Some(set(&["a", "b"]))).unwrap();
        assert_eq!(held(&a, "p2", "c"), set(&["a"]));
    }

    fn container(name: &str, limits: &[(&str, &str)], requests: &[(&str, &str)]) -> Container {
        let list = |l: &[(&str, &str)]| {
            (!l.is_empty()).then(|| l.iter().map(|(k, v)| (k.to_string(), Q(v.to_string()))).collect())
        };
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements {
                limits: list(limits),
                requests: list(requests),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn requests_read_known_resources_from_limits_in_container_order() {
        let mut sidecar = container("sidecar", &[(R, "1")], &[]);
        sidecar.restart_policy = Some("Always".into());
        let pod = Pod {
            spec: Some(PodSpec {
                init_containers: Some(vec![container("init", &[(R, "1")], &[]), sidecar]),
                containers: vec![
                    container("main", &[(R, "2"), ("cpu", "1"), ("other.com/bar", "1")], &[]),
                    container("requests-only", &[], &[(R, "1")]),
                    container("none", &[("memory", "1Gi")], &[]),
                    container("zero", &[(R, "0")], &[]),
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        let got = requests(&pod, |r| r == R).unwrap();
        let names: Vec<(&str, bool, usize)> =
            got.iter().map(|c| (c.container.as_str(), c.init, c.resources[R])).collect();
        assert_eq!(
            names,
            vec![("init", true, 1), ("sidecar", false, 1), ("main", false, 2), ("requests-only", false, 1)]
        );
        let bad = Pod {
            spec: Some(PodSpec { containers: vec![container("c", &[(R, "500m")], &[])], ..Default::default() }),
            ..Default::default()
        };
        assert_eq!(
            requests(&bad, |r| r == R).unwrap_err().to_string(),
            "container \"c\" requests 500m of example.com/foo: device counts are whole numbers"
        );
    }
}
