//! What a pod's status says of its resources and of a resize, as the
//! kubelet's status manager reports it: each container's
//! `allocatedResources` (the allocated requests) and `resources` (what it
//! runs with), and the conditions PodResizePending (reason Deferred or
//! Infeasible) and PodResizeInProgress (reason Error when applying failed).
//! Pure.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::{
    api::core::v1::{PodCondition, PodStatus, ResourceRequirements},
    apimachinery::pkg::{api::resource::Quantity as Q, apis::meta::v1::Time},
    jiff::Timestamp,
};

use super::checkpoint::PodAllocation;
use crate::{cri::api::LinuxContainerResources, pods::conditions::condition};

pub const POD_RESIZE_PENDING: &str = "PodResizePending";
pub const POD_RESIZE_IN_PROGRESS: &str = "PodResizeInProgress";
/// The reason of PodResizeInProgress when applying the resize failed.
pub const ERROR: &str = "Error";

/// Where a pod's resize stands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResizeState {
    /// Not admitted: (Deferred | Infeasible, message).
    pub pending: Option<(&'static str, String)>,
    /// Admitted and not yet applied to every running container.
    pub in_progress: bool,
    /// Why the last attempt to apply it failed.
    pub error: Option<String>,
    /// The pod generation the conditions are about.
    pub generation: Option<i64>,
}

fn milli(m: i64) -> Q {
    if m % 1000 == 0 { Q((m / 1000).to_string()) } else { Q(format!("{m}m")) }
}

/// What a container runs with, in the API's terms: the allocated
/// quantities where the runtime applied exactly what they map to (so
/// `100m` reads back as `100m`, not as the shares it became), converted
/// from the runtime's values otherwise (a resize not yet applied).
pub fn actual_resources(
    allocated: &ResourceRequirements,
    wanted: &LinuxContainerResources,
    actual: &LinuxContainerResources,
) -> ResourceRequirements {
    let get = |m: &Option<BTreeMap<String, Q>>, k: &str| m.as_ref().and_then(|m| m.get(k)).cloned();
    let mut limits = BTreeMap::new();
    let mut requests = BTreeMap::new();
    if actual.cpu_quota == wanted.cpu_quota && actual.cpu_period == wanted.cpu_period {
        limits.extend(get(&allocated.limits, "cpu").map(|q| ("cpu".to_string(), q)));
    } else if actual.cpu_quota > 0 && actual.cpu_period > 0 {
        limits.insert("cpu".into(), milli(actual.cpu_quota * 1000 / actual.cpu_period));
    }
    if actual.cpu_shares == wanted.cpu_shares {
        requests.extend(get(&allocated.requests, "cpu").map(|q| ("cpu".to_string(), q)));
    } else if actual.cpu_shares > 2 {
        requests.insert("cpu".into(), milli(actual.cpu_shares * 1000 / 1024));
    }
    if actual.memory_limit_in_bytes == wanted.memory_limit_in_bytes {
        limits.extend(get(&allocated.limits, "memory").map(|q| ("memory".to_string(), q)));
    } else if actual.memory_limit_in_bytes > 0 {
        limits.insert("memory".into(), Q(actual.memory_limit_in_bytes.to_string()));
    }
    // The memory request is not a cgroup setting: it is the allocation's.
    requests.extend(get(&allocated.requests, "memory").map(|q| ("memory".to_string(), q)));
    ResourceRequirements {
        limits: (!limits.is_empty()).then_some(limits),
        requests: (!requests.is_empty()).then_some(requests),
        ..Default::default()
    }
}

/// Adds the resize fields to a generated status: `allocated` is the pod's
/// allocation, `running` what each running container runs with.
pub fn decorate(
    status: &mut PodStatus,
    allocated: &PodAllocation,
    running: &HashMap<String, ResourceRequirements>,
    state: &ResizeState,
    previous: Option<&PodStatus>,
    now: Timestamp,
) {
    let lists = [status.container_statuses.as_mut(), status.init_container_statuses.as_mut()];
    for cs in lists.into_iter().flatten().flatten() {
        if let Some(a) = allocated.containers.get(&cs.name) {
            cs.allocated_resources = Some(a.requests.clone().unwrap_or_default());
        }
        if let Some(r) = running.get(&cs.name) {
            cs.resources = Some(r.clone());
        }
    }
    let mut added: Vec<PodCondition> = vec![];
    if let Some((reason, message)) = &state.pending {
        added.push(condition(POD_RESIZE_PENDING, true, Some(reason), Some(message.clone())));
    }
    if state.in_progress {
        added.push(condition(POD_RESIZE_IN_PROGRESS, true, state.error.as_ref().map(|_| ERROR), state.error.clone()));
    }
    let prev = previous.and_then(|p| p.conditions.as_ref());
    for c in &mut added {
        c.observed_generation = state.generation;
        c.last_transition_time = match prev.and_then(|l| l.iter().find(|p| p.type_ == c.type_)) {
            Some(p) if p.status == c.status && p.reason == c.reason => p.last_transition_time.clone(),
            _ => Some(Time(now)),
        };
    }
    status.conditions.get_or_insert_with(Vec::new).extend(added);
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ContainerStatus;

    use super::*;

    fn rr(cpu_req: &str, cpu_lim: &str, mem: &str) -> ResourceRequirements {
        ResourceRequirements {
            requests: Some([("cpu".to_string(), Q(cpu_req.into())), ("memory".to_string(), Q(mem.into()))].into()),
            limits: Some([("cpu".to_string(), Q(cpu_lim.into())), ("memory".to_string(), Q(mem.into()))].into()),
            ..Default::default()
        }
    }

    fn cri(quota: i64, shares: i64, memory: i64) -> LinuxContainerResources {
        LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: quota,
            cpu_shares: shares,
            memory_limit_in_bytes: memory,
            ..Default::default()
        }
    }

    #[test]
    fn actual_resources_read_back_as_allocated_or_as_the_runtime_has_them() {
        let alloc = rr("100m", "200m", "64Mi");
        let wanted = cri(20_000, 102, 64 << 20);
        assert_eq!(actual_resources(&alloc, &wanted, &wanted), alloc);
        // Not applied yet: the old values, converted.
        let old = cri(10_000, 51, 32 << 20);
        let r = actual_resources(&alloc, &wanted, &old);
        assert_eq!(r.limits.as_ref().unwrap()["cpu"], Q("100m".into()));
        assert_eq!(r.limits.as_ref().unwrap()["memory"], Q((32u64 << 20).to_string()));
        assert_eq!(r.requests.as_ref().unwrap()["cpu"], Q("49m".into()));
        assert_eq!(r.requests.as_ref().unwrap()["memory"], Q("64Mi".into()));
    }

    #[test]
    fn conditions_and_container_fields() {
        let mut status = PodStatus {
            container_statuses: Some(vec![ContainerStatus { name: "app".into(), ..Default::default() }]),
            conditions: Some(vec![condition("Ready", true, None, None)]),
            ..Default::default()
        };
        let alloc = PodAllocation { containers: [("app".to_string(), rr("1", "1", "1Gi"))].into(), pod_level: None };
        let running = HashMap::from([("app".to_string(), rr("500m", "500m", "1Gi"))]);
        let state = ResizeState {
            pending: Some(("Infeasible", "Node didn't have enough capacity: cpu".into())),
            in_progress: true,
            error: Some("boom".into()),
            generation: Some(3),
        };
        let t0 = Timestamp::from_second(1_700_000_000).unwrap();
        decorate(&mut status, &alloc, &running, &state, None, t0);
        let cs = &status.container_statuses.as_ref().unwrap()[0];
        assert_eq!(cs.allocated_resources.as_ref().unwrap()["cpu"], Q("1".into()));
        assert_eq!(cs.resources.as_ref().unwrap().limits.as_ref().unwrap()["cpu"], Q("500m".into()));
        let conds = status.conditions.clone().unwrap();
        let pending = conds.iter().find(|c| c.type_ == POD_RESIZE_PENDING).unwrap();
        assert_eq!((pending.reason.as_deref(), pending.observed_generation), (Some("Infeasible"), Some(3)));
        let progress = conds.iter().find(|c| c.type_ == POD_RESIZE_IN_PROGRESS).unwrap();
        assert_eq!((progress.reason.as_deref(), progress.message.as_deref()), (Some(ERROR), Some("boom")));
        // The transition time stays while the condition does.
        let mut next = PodStatus::default();
        let t1 = Timestamp::from_second(1_700_000_100).unwrap();
        decorate(&mut next, &alloc, &running, &state, Some(&status), t1);
        assert_eq!(next.conditions.unwrap()[0].last_transition_time, Some(Time(t0)));
        // Nothing pending, nothing in progress: no condition.
        let mut quiet = PodStatus::default();
        decorate(&mut quiet, &alloc, &running, &ResizeState::default(), None, t1);
        assert!(quiet.conditions.unwrap().is_empty());
    }
}
