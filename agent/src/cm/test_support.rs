//! Pod specs for the cgroup manager's unit tests: containers whose
//! requests and limits are written as `("cpu", "500m")` pairs.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Container, PodSpec, ResourceRequirements},
    apimachinery::pkg::api::resource::Quantity,
};

use crate::config::{Reservation, ReservedResource};

/// A resource list, or none for no pairs (as an unset field in a manifest).
pub fn res(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
    (!pairs.is_empty()).then(|| pairs.iter().map(|(k, v)| (k.to_string(), Quantity(v.to_string()))).collect())
}

/// A container named "c" with these requests and limits.
pub fn container(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
    Container {
        name: "c".into(),
        resources: Some(ResourceRequirements { requests: res(requests), limits: res(limits), ..Default::default() }),
        ..Default::default()
    }
}

/// A pod spec with only these containers.
pub fn spec(containers: Vec<Container>) -> PodSpec {
    PodSpec { containers, ..Default::default() }
}

/// A reservation (system-reserved or kube-reserved) of 500m CPU, 1Gi of
/// memory and 1000 pids.
pub fn reservation() -> Reservation {
    [
        (ReservedResource::Cpu, "500m".parse().expect("a quantity")),
        (ReservedResource::Memory, "1Gi".parse().expect("a quantity")),
        (ReservedResource::Pid, "1000".parse().expect("a quantity")),
    ]
    .into()
}
