//! In-place pod resize (the kubelet's allocation manager and the resize
//! half of its runtime manager). The node keeps, per pod, the resources
//! it admitted (the allocation, checkpointed in `allocated_pods_state`);
//! the pod's containers run with those. When the API's spec asks for other
//! resources, [`Allocator::resize`] admits the change against allocatable
//! and the other pods' allocations ([`admission`]), the worker applies it
//! ([`plan`]) and the status reports it ([`status`]).
//!
//! Pure: `admission`, `plan`, `status`; `checkpoint` reads and writes the
//! file; the [`Allocator`] is the node-wide state the workers share.

pub mod admission;
pub mod checkpoint;
pub mod plan;
pub mod status;

use std::{collections::BTreeMap, path::PathBuf};

use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;
use tracing::warn;

use self::{
    admission::{Verdict, allocation_of, with_allocation},
    checkpoint::{Allocations, PodAllocation},
};
use crate::pods::admission::Capacity;

#[derive(Default)]
struct State {
    checkpoint: Allocations,
    /// The pods that run or may run, as allocated: what a resize is
    /// admitted beside.
    active: BTreeMap<String, Pod>,
}

/// Every pod's allocation, shared by the pod workers.
pub struct Allocator {
    /// None: not persisted (tests).
    path: Option<PathBuf>,
    state: Mutex<State>,
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

impl Allocator {
    /// The allocator of `<root_dir>/allocated_pods_state`. A file that
    /// cannot be read is logged and replaced: the pods then run with their
    /// specs' resources, as on a first start.
    pub fn load(root_dir: &std::path::Path) -> Allocator {
        let path = root_dir.join(checkpoint::FILE_NAME);
        let checkpoint = checkpoint::load(&path).unwrap_or_else(|e| {
            warn!("pod resource allocations are lost: {e}");
            Allocations::new()
        });
        Allocator { path: Some(path), state: Mutex::new(State { checkpoint, active: BTreeMap::new() }) }
    }

    pub fn in_memory() -> Allocator {
        Allocator { path: None, state: Mutex::new(State::default()) }
    }

    fn save(&self, state: &State) {
        if let Some(path) = &self.path
            && let Err(e) = checkpoint::save(path, &state.checkpoint)
        {
            warn!("checkpointing pod resource allocations: {e}");
        }
    }

    /// The allocation of a pod its worker starts with: the checkpointed one
    /// (an agent restarted with the pod running), or what its spec asks
    /// for (a pod just admitted).
    pub fn allocate(&self, pod: &Pod) -> PodAllocation {
        let id = uid(pod);
        let mut state = self.state.lock();
        let alloc = match state.checkpoint.get(&id) {
            Some(a) => a.clone(),
            None => {
                let a = allocation_of(pod);
                state.checkpoint.insert(id.clone(), a.clone());
                self.save(&state);
                a
            }
        };
        state.active.insert(id, with_allocation(pod, &alloc));
        alloc
    }

    /// `pod` with the resources it was admitted with, when they are
    /// checkpointed and differ from its spec's: what node-level admission
    /// counts (an agent restarted with a resize pending admits the pod as
    /// it runs, not as its spec asks).
    pub fn as_allocated<'a>(&self, pod: &'a Pod) -> std::borrow::Cow<'a, Pod> {
        let state = self.state.lock();
        match state.checkpoint.get(&uid(pod)) {
            Some(a) if admission::differs(pod, a) => std::borrow::Cow::Owned(with_allocation(pod, a)),
            _ => std::borrow::Cow::Borrowed(pod),
        }
    }

    /// Admits `desired` (the spec's resources) beside the other active
    /// pods; an admitted resize becomes the pod's allocation at once.
    pub fn resize(&self, desired: &Pod, allocatable: &Capacity) -> Verdict {
        let id = uid(desired);
        let mut state = self.state.lock();
        let others: Vec<&Pod> = state.active.iter().filter(|(k, _)| **k != id).map(|(_, p)| p).collect();
        let verdict = admission::admit(desired, &others, allocatable);
        if verdict == Verdict::Admit {
            state.checkpoint.insert(id.clone(), allocation_of(desired));
            state.active.insert(id, desired.clone());
            self.save(&state);
        }
        verdict
    }

    /// The pod will not run again: its resources are free for others'
    /// resizes (its allocation stays until [`Allocator::remove`]).
    pub fn deactivate(&self, uid: &str) {
        self.state.lock().active.remove(uid);
    }

    /// The pod is gone: its allocation too.
    pub fn remove(&self, uid: &str) {
        let mut state = self.state.lock();
        state.active.remove(uid);
        if state.checkpoint.remove(uid).is_some() {
            self.save(&state);
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{Container, PodSpec, ResourceRequirements},
        apimachinery::pkg::api::resource::Quantity as Q,
    };

    use super::*;

    fn pod(uid: &str, cpu: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        let r =
            ResourceRequirements { requests: Some([("cpu".to_string(), Q(cpu.into()))].into()), ..Default::default() };
        p.spec = Some(PodSpec {
            containers: vec![Container { name: "app".into(), resources: Some(r), ..Default::default() }],
            ..Default::default()
        });
        p
    }

    const CAP: Capacity = Capacity { pods: 10, cpu_milli: 2000, memory: 1 << 30, hugepages: vec![] };

    #[test]
    fn a_restarted_agent_keeps_what_it_admitted_and_not_what_was_pending() {
        let dir = tempfile::tempdir().unwrap();
        let a = Allocator::load(dir.path());
        a.allocate(&pod("a", "500m"));
        a.allocate(&pod("b", "1"));
        // Admitted: a grows to 1 cpu. Deferred: then b cannot grow.
        assert_eq!(a.resize(&pod("a", "1"), &CAP), Verdict::Admit);
        assert!(matches!(a.resize(&pod("b", "1500m"), &CAP), Verdict::Pending { reason: "Deferred", .. }));
        drop(a);
        let again = Allocator::load(dir.path());
        // Node admission after the restart counts b as it runs.
        let b = pod("b", "1500m");
        let admitted_as = again.as_allocated(&b);
        assert_eq!(
            admitted_as.spec.as_ref().unwrap().containers[0].resources,
            allocation_of(&pod("b", "1")).containers.get("app").cloned()
        );
        assert!(matches!(again.as_allocated(&pod("new", "1")), std::borrow::Cow::Borrowed(_)));
        // The API's specs now say 1 and 1500m; the allocations stand.
        let alloc_a = again.allocate(&pod("a", "1"));
        let alloc_b = again.allocate(&pod("b", "1500m"));
        assert_eq!(alloc_a.containers["app"].requests.as_ref().unwrap()["cpu"], Q("1".into()));
        assert_eq!(alloc_b.containers["app"].requests.as_ref().unwrap()["cpu"], Q("1".into()));
        // Once a is gone, b's resize fits.
        again.remove("a");
        assert_eq!(again.resize(&pod("b", "1500m"), &CAP), Verdict::Admit);
        assert!(!checkpoint::load(&dir.path().join(checkpoint::FILE_NAME)).unwrap().contains_key("a"));
    }
}
