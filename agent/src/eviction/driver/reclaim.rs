//! Reclaim before evicting for memory (`--memory-reclaim-before-eviction`),
//! the manager's step between deciding and killing: when a memory
//! threshold is met and the growth was not anonymous, the pods with the
//! most active page cache are asked to give it back through
//! `memory.reclaim` (the plan is pure: [`crate::eviction::reclaim`]); the
//! manager then observes again and evicts only if the threshold is still
//! met.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use parking_lot::Mutex;
use tracing::{debug, info, warn};

use super::{EvictionPod, Reclaimer, Shared};
use crate::{
    eviction::{
        core::Observation,
        reclaim::{self, MemoryKinds},
        signal::{EvictionSignal, EvictionThreshold},
    },
    metrics::{Metrics, reclaim::ReclaimResultLabels},
    signals::SignalSource,
};

/// The signals whose pressure page-cache reclaim can relieve.
pub(super) fn is_memory(signal: EvictionSignal) -> bool {
    matches!(signal, EvictionSignal::MemoryAvailable | EvictionSignal::AllocatableMemoryAvailable)
}

pub(super) struct CacheReclaim {
    reclaimer: Arc<dyn Reclaimer>,
    metrics: Arc<Metrics>,
    /// The pods' memory by kind at the last evaluation, to tell what grew
    /// since.
    last: Mutex<Option<MemoryKinds>>,
    /// A crossing since the last evaluation that the kernel knew to be
    /// anonymous growth.
    anonymous_crossing: AtomicBool,
}

impl CacheReclaim {
    pub(super) fn new(reclaimer: Arc<dyn Reclaimer>, metrics: Arc<Metrics>) -> CacheReclaim {
        CacheReclaim { reclaimer, metrics, last: Mutex::new(None), anonymous_crossing: AtomicBool::new(false) }
    }

    /// Turns reclaim-first on where the pods' cgroups can do it (logging
    /// why not otherwise: the manager then behaves as with it off) and
    /// tells the kernel side. Returns whether it is on.
    pub(super) fn start(&self, wanted: bool, kubepods: &str, shared: &Shared, source: &dyn SignalSource) -> bool {
        let on = wanted
            && match self.reclaimer.unavailable(kubepods) {
                None => true,
                Some(why) => {
                    warn!(
                        "--memory-reclaim-before-eviction is not available here ({why}): memory pressure evicts without reclaiming page cache first"
                    );
                    false
                }
            };
        if on {
            info!("memory pressure reclaims the pods' page cache (memory.reclaim) before evicting");
        }
        shared.reclaim_first.store(on, Ordering::Relaxed);
        source.set_reclaim_first(on);
        on
    }

    pub(super) fn on(&self, shared: &Shared) -> bool {
        shared.reclaim_first.load(Ordering::Relaxed)
    }

    /// A memory crossing the kernel knew to be anonymous growth.
    pub(super) fn anonymous_crossing(&self) {
        self.anonymous_crossing.store(true, Ordering::Relaxed);
    }

    /// Whether what grew since the last evaluation was anonymous, by the
    /// kernel's word at a crossing or by the pods' memory.stat; the pods'
    /// figures now become the reference for the next time.
    pub(super) fn growth_was_anonymous(&self, kubepods: &str) -> bool {
        let kernel = self.anonymous_crossing.swap(false, Ordering::Relaxed);
        let now = self.reclaimer.memory_kinds(kubepods);
        let before = std::mem::replace(&mut *self.last.lock(), now);
        let stat = matches!((before, now), (Some(b), Some(n)) if reclaim::growth_is_anonymous(b, n));
        kernel || stat
    }

    /// The pods' figures after a reclaim: growth is measured from here.
    pub(super) fn rebase(&self, kubepods: &str) {
        *self.last.lock() = self.reclaimer.memory_kinds(kubepods);
    }

    /// Reclaims page cache from `pods` to bring `t`'s signal back over its
    /// line plus the minimum reclaim. False when there was nothing to
    /// write, or the pods' active cache cannot cover it (the eviction
    /// should not wait): the manager then evicts on what it observed.
    pub(super) fn reclaim(&self, t: &EvictionThreshold, obs: &Observation, pods: &[Arc<EvictionPod>]) -> bool {
        let excess = reclaim::working_set_excess(t, obs);
        let cache: Vec<(String, MemoryKinds)> =
            pods.iter().filter_map(|p| Some((p.cgroup.clone(), self.reclaimer.memory_kinds(&p.cgroup)?))).collect();
        let Some(targets) = reclaim::plan(excess, &cache) else {
            debug!(signal = %t.signal, excess, "the pods' page cache cannot cover the excess: evicting");
            return false;
        };
        if targets.is_empty() {
            return false;
        }
        let mut given_back = 0;
        for target in &targets {
            let before = cache.iter().find(|(c, _)| *c == target.cgroup).map_or(0, |(_, m)| m.file());
            let result = match self.reclaimer.reclaim(&target.cgroup, target.bytes) {
                Ok(r) => r.as_str(),
                Err(e) => {
                    warn!(cgroup = target.cgroup, "memory.reclaim failed: {e}");
                    "error"
                }
            };
            self.metrics.reclaim.writes.get_or_create(&ReclaimResultLabels { result: result.into() }).inc();
            let after = self.reclaimer.memory_kinds(&target.cgroup).map_or(before, |m| m.file());
            given_back += before.saturating_sub(after);
        }
        self.metrics.reclaim.reclaimed_bytes.inc_by(given_back);
        info!(
            signal = %t.signal,
            excess,
            reclaimed = given_back,
            pods = targets.len(),
            "memory pressure: reclaimed page cache before evicting"
        );
        true
    }
}
