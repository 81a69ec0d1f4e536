//! The worker's half of an in-place resize: at the start of a round the
//! pod's allocation is settled (the checkpointed one, or a resize the
//! allocator admits), and after observing the runtime the running
//! containers and the pod cgroup are brought to it (see
//! [`crate::pods::resize::plan`]); the status then reports both.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Container, ResourceRequirements};
use tracing::{info, warn};

use super::{SYNC_RETRY, Worker, container_ref, find_container, pod_name, spec_grace};
use crate::{
    cm::{
        hierarchy::{pod_cgroup_config, pod_hugetlb_limits},
        qos::qos_class,
    },
    cri::error::reason,
    events::{EventType, pod_ref},
    pods::{
        admission::Capacity,
        observed::ObservedPod,
        resize::{
            admission::{Verdict, allocation_of, differs, with_allocation},
            plan::{self, ContainerNow},
            status::actual_resources,
        },
        spec,
    },
};

fn restarts_on(c: &Container, resource: &str) -> bool {
    c.resize_policy.iter().flatten().any(|p| p.resource_name == resource && p.restart_policy == "RestartContainer")
}

impl Worker {
    fn allocatable(&self) -> Capacity {
        let s = &self.deps.settings;
        Capacity {
            pods: i64::MAX,
            cpu_milli: s.allocatable_cpu_milli,
            memory: s.allocatable_memory,
            // Huge pages are not resized in place; their admission stands.
            hugepages: s.features.hugepage_sizes.iter().map(|size| (*size, i64::MAX)).collect(),
        }
    }

    /// Settles the pod's allocation for this round and makes `self.pod`
    /// the pod as it runs.
    pub(super) fn admit_resize(&mut self) {
        let alloc = match &self.allocation {
            Some(a) => a.clone(),
            None => self.deps.allocations.allocate(&self.desired),
        };
        let alloc = if differs(&self.desired, &alloc) {
            match self.deps.allocations.resize(&self.desired, &self.allocatable()) {
                Verdict::Admit => {
                    info!(pod = pod_name(&self.desired), "resize admitted");
                    self.deps.recorder.record(
                        &pod_ref(&self.desired),
                        EventType::Normal,
                        "ResizeStarted",
                        "Pod resize started",
                    );
                    self.resize.pending = None;
                    self.resize.in_progress = true;
                    self.resize.error = None;
                    allocation_of(&self.desired)
                }
                Verdict::Pending { reason, message } => {
                    if self.resize.pending.as_ref().map(|(r, m)| (*r, m)) != Some((reason, &message)) {
                        let event = if reason == "Infeasible" { "ResizeInfeasible" } else { "ResizeDeferred" };
                        self.deps.recorder.record(&pod_ref(&self.desired), EventType::Warning, event, &message);
                    }
                    self.resize.pending = Some((reason, message));
                    alloc
                }
            }
        } else {
            self.resize.pending = None;
            alloc
        };
        self.resize.generation = self.desired.metadata.generation;
        self.pod = with_allocation(&self.desired, &alloc);
        self.allocation = Some(alloc);
    }

    /// What a container of the running pod is set to (its CRI resources).
    fn wanted(&self, c: &Container) -> crate::cri::api::LinuxContainerResources {
        spec::resources(&self.pod, c, &self.deps.settings)
    }

    /// The running containers the allocation covers: (name, id, spec).
    fn resizable_running(&self, observed: &ObservedPod) -> Vec<(String, String, Container)> {
        let Some(alloc) = &self.allocation else { return vec![] };
        observed
            .running()
            .filter(|c| observed.latest(&c.name).map(|l| &l.id) == Some(&c.id))
            .filter(|c| alloc.containers.contains_key(&c.name))
            .filter_map(|c| find_container(&self.pod, &c.name).map(|(s, _)| (c.name.clone(), c.id.clone(), s.clone())))
            .collect()
    }

    /// Brings the running containers and the pod cgroup to the allocation.
    /// True when containers were stopped to be restarted (the caller
    /// observes again, and the round's plan starts them).
    pub(super) async fn actuate_resize(&mut self, observed: &ObservedPod, pod_ip: Option<&str>) -> bool {
        let mut now = vec![];
        for (name, id, c) in self.resizable_running(observed) {
            let wanted = self.wanted(&c);
            let (actual, adopted) = match self.actuated.get(&id) {
                Some(a) => (a.clone(), false),
                None => {
                    // A container this worker did not start (the agent
                    // restarted): what the runtime says it runs with, or,
                    // when it does not say, what it was made with.
                    let reported = self.deps.runtime.container_status(&id).await.ok().and_then(|s| s.resources?.linux);
                    let a = reported.unwrap_or_else(|| wanted.clone());
                    self.actuated.insert(id.clone(), a.clone());
                    (a, true)
                }
            };
            // An adopted container is never restarted for a resize: what
            // the runtime reports may differ in form, not in intent.
            now.push(ContainerNow {
                restart_on_cpu: !adopted && restarts_on(&c, "cpu"),
                restart_on_memory: !adopted && restarts_on(&c, "memory"),
                name,
                id,
                actual,
                wanted,
            });
        }
        let running: Vec<String> = now.iter().map(|c| c.id.clone()).collect();
        self.actuated.retain(|id, _| running.contains(id));
        let spec = self.pod.spec.clone().unwrap_or_default();
        let mut limits =
            pod_cgroup_config(&spec, self.deps.cpu_cfs_quota, self.deps.cpu_cfs_quota_period, self.deps.pod_pids_limit);
        limits.hugetlb = pod_hugetlb_limits(&spec, &self.deps.settings.features.hugepage_sizes);
        if now.is_empty() {
            // Nothing runs: what starts next starts with the allocation.
            self.resize.in_progress = false;
            self.resize.error = None;
            return false;
        }
        let qos = qos_class(&spec);
        let usage = self.deps.cgroups.fs().memory_usage(&self.deps.cgroups.pod_cgroup(qos, &self.uid)).ok();
        let p = plan::plan(&pod_name(&self.pod), &now, self.pod_limits.as_ref(), &limits, usage);
        if p.is_empty() {
            self.resize.in_progress = false;
            self.resize.error = None;
            return false;
        }
        let retry = |w: &mut Worker, error: String| {
            warn!(pod = pod_name(&w.pod), "resize: {error}");
            w.resize.in_progress = true;
            w.resize.error = Some(error);
            let at = Instant::now() + SYNC_RETRY;
            w.next_wake = Some(w.next_wake.map_or(at, |t| t.min(at)));
        };
        if let Some(error) = p.error {
            retry(self, error);
            return false;
        }
        if let Some(grow) = &p.grow_pod
            && let Err(e) = self.deps.cgroups.ensure_pod_cgroup(qos, &self.uid, grow).await
        {
            retry(self, format!("setting the pod cgroup: {e}"));
            return false;
        }
        let mut failed = None;
        for (id, name, resources) in p.updates {
            match self.deps.runtime.update_container_resources(&id, resources.clone()).await {
                Ok(()) => {
                    info!(pod = pod_name(&self.pod), container = name, "resized in place");
                    self.actuated.insert(id, resources);
                }
                Err(e) => failed = Some(format!("updating container {name}: {}", e.message())),
            }
        }
        for (id, name) in &p.restarts {
            if let Some((c, init)) = find_container(&self.pod, name).map(|(c, i)| (c.clone(), i)) {
                let message = format!("Container {name} resize requires restart");
                self.deps.recorder.record(
                    &container_ref(&self.pod, &c, init),
                    EventType::Normal,
                    reason::KILLING,
                    &message,
                );
                self.stop_container(id, Some(&c), spec_grace(&self.pod), pod_ip).await;
            }
            self.actuated.remove(id);
        }
        if failed.is_none()
            && let Some(shrink) = &p.shrink_pod
            && let Err(e) = self.deps.cgroups.ensure_pod_cgroup(qos, &self.uid, shrink).await
        {
            failed = Some(format!("setting the pod cgroup: {e}"));
        }
        match failed {
            Some(error) => retry(self, error),
            None => {
                self.pod_limits = Some(limits);
                // Restarted containers finish the resize when they run.
                self.resize.in_progress = !p.restarts.is_empty();
                self.resize.error = None;
                if !p.restarts.is_empty() {
                    let at = Instant::now() + Duration::from_millis(100);
                    self.next_wake = Some(self.next_wake.map_or(at, |t| t.min(at)));
                }
            }
        }
        !p.restarts.is_empty()
    }

    /// A container this worker created runs with what it was created with.
    pub(super) fn created_with(&mut self, id: &str, resources: Option<crate::cri::api::LinuxContainerResources>) {
        if let Some(r) = resources {
            self.actuated.insert(id.to_owned(), r);
        }
    }

    /// The pod cgroup was set up with `limits`.
    pub(super) fn pod_cgroup_set(&mut self, limits: &crate::cm::hierarchy::CgroupLimits) {
        self.pod_limits = Some(limits.clone());
    }

    /// What each running container runs with, for its status.
    pub(super) fn running_resources(&self, observed: &ObservedPod) -> HashMap<String, ResourceRequirements> {
        let Some(alloc) = &self.allocation else { return HashMap::new() };
        let mut out = HashMap::new();
        for (name, id, c) in self.resizable_running(observed) {
            let (Some(actual), Some(allocated)) = (self.actuated.get(&id), alloc.containers.get(&name)) else {
                continue;
            };
            out.insert(name, actual_resources(allocated, &self.wanted(&c), actual));
        }
        out
    }
}
