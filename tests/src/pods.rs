//! In-process stand-ins for the pod manager, for tests of the eviction
//! manager that run "pods" as plain processes in pod cgroups.

use std::sync::{Arc, Mutex};

use swiftlet::eviction::driver::{EvictionPod, EvictionRequest, PodEvictor, PodProvider};

/// A fixed set of pods; evicted ones drop out, as the pod manager's do.
#[derive(Default)]
pub struct FakePods {
    pub pods: Mutex<Vec<EvictionPod>>,
    pub evicted: Mutex<Vec<EvictionRequest>>,
}

impl FakePods {
    pub fn new(pods: Vec<EvictionPod>) -> FakePods {
        FakePods { pods: Mutex::new(pods), evicted: Mutex::new(vec![]) }
    }

    pub fn evictions(&self) -> Vec<EvictionRequest> {
        self.evicted.lock().unwrap().clone()
    }
}

impl PodProvider for FakePods {
    fn eviction_pods(&self) -> Vec<Arc<EvictionPod>> {
        let evicted: Vec<String> = self.evicted.lock().unwrap().iter().map(|e| e.uid.clone()).collect();
        self.pods.lock().unwrap().iter().filter(|p| !evicted.contains(&p.uid)).cloned().map(Arc::new).collect()
    }
}

impl PodEvictor for FakePods {
    fn evict(&self, request: EvictionRequest) {
        self.evicted.lock().unwrap().push(request);
    }

    /// No pod worker here: an evicted pod has ended once evicted.
    fn termination_reported(&self, uid: &str) -> bool {
        self.evicted.lock().unwrap().iter().any(|e| e.uid == uid)
            || !self.pods.lock().unwrap().iter().any(|p| p.uid == uid)
    }
}
