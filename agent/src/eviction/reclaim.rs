//! Reclaim before evicting, for memory (pure): how much of the pods' page
//! cache to hand back through `memory.reclaim`, from which pods, and
//! whether the growth that crossed the line was anonymous (which reclaim
//! cannot undo, so the eviction goes ahead at once).
//!
//! The working set is usage − inactive_file, so reclaiming inactive file
//! pages frees memory without moving the working set: only active file
//! pages, which the kernel deactivates as the inactive list empties, bring
//! it down. A pod can give back at most its active file pages, and a
//! request asks for its inactive file pages (reclaimed first) plus its
//! share of what the working set must lose.

use super::{
    core::{Observation, threshold_value},
    signal::EvictionThreshold,
};

/// A cgroup's memory by kind (memory.stat, hierarchical), in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryKinds {
    pub anon: u64,
    /// Page cache on the file LRU lists: the part the working set counts,
    /// which reclaim can shrink. (memory.stat's `file` also counts tmpfs
    /// and shared memory, which sit on the anonymous lists and which
    /// reclaim cannot take without swap.)
    pub active_file: u64,
    pub inactive_file: u64,
}

impl MemoryKinds {
    /// Page cache reclaim can take.
    pub fn file(&self) -> u64 {
        self.active_file + self.inactive_file
    }
}

/// One `memory.reclaim` write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReclaimTarget {
    pub cgroup: String,
    pub bytes: u64,
}

/// How far the working set must come down for `t` to be met no more: back
/// above the line plus the threshold's minimum reclaim (what the eviction
/// would have to free). Zero when it is not met.
pub fn working_set_excess(t: &EvictionThreshold, obs: &Observation) -> u64 {
    let min_reclaim = t.min_reclaim.as_ref().map_or(0, |m| m.resolve(obs.capacity));
    let line = threshold_value(t, obs) as i128 + min_reclaim as i128;
    (line - obs.available as i128).max(0) as u64
}

/// The writes that bring the working set down by `excess`: the pods with
/// the most active page cache first, each asked for its inactive file
/// pages plus what it gives of the excess (at most its active file pages).
/// None when all the pods' active cache together cannot cover the excess:
/// reclaim would not end the pressure, and the eviction should not wait
/// for it.
pub fn plan(excess: u64, pods: &[(String, MemoryKinds)]) -> Option<Vec<ReclaimTarget>> {
    if excess == 0 {
        return Some(vec![]);
    }
    let mut ranked: Vec<&(String, MemoryKinds)> = pods.iter().filter(|(_, m)| m.active_file > 0).collect();
    // Most active cache first; ties by name, so the plan is stable.
    ranked.sort_by(|a, b| b.1.active_file.cmp(&a.1.active_file).then_with(|| a.0.cmp(&b.0)));
    let mut left = excess;
    let mut out = vec![];
    for (cgroup, m) in ranked {
        let take = m.active_file.min(left);
        out.push(ReclaimTarget { cgroup: cgroup.clone(), bytes: m.inactive_file + take });
        left -= take;
        if left == 0 {
            return Some(out);
        }
    }
    None
}

/// Whether the memory that grew between two observations of the pods was
/// mostly anonymous: reclaim cannot give that back, so the eviction goes
/// ahead at once. Growth is counted as the working set counts it (anon and
/// active file pages).
pub fn growth_is_anonymous(before: MemoryKinds, now: MemoryKinds) -> bool {
    let anon = now.anon as i128 - before.anon as i128;
    let file = now.active_file as i128 - before.active_file as i128;
    anon > 0 && anon >= file
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        eviction::signal::{EvictionSignal, ThresholdValue},
        quantity::Quantity,
    };

    const MI: u64 = 1 << 20;

    /// anon, file (active + inactive), inactive file, in MiB.
    fn kinds(anon_mi: u64, file_mi: u64, inactive_mi: u64) -> MemoryKinds {
        MemoryKinds { anon: anon_mi * MI, active_file: (file_mi - inactive_mi) * MI, inactive_file: inactive_mi * MI }
    }

    #[test]
    fn the_excess_is_the_distance_to_the_line_plus_the_minimum_reclaim() {
        let t = |min: Option<u64>| EvictionThreshold {
            signal: EvictionSignal::MemoryAvailable,
            value: ThresholdValue::Quantity(Quantity::from_units(500 * MI as i64)),
            grace_period: Duration::ZERO,
            min_reclaim: min.map(|m| ThresholdValue::Quantity(Quantity::from_units(m as i64))),
        };
        let obs = |available_mi: i64| Observation { available: available_mi * MI as i64, capacity: 4096 * MI };
        // (min reclaim, available, excess), MiB
        let cases: [(Option<u64>, i64, u64); 5] =
            [(None, 450, 50), (None, 500, 0), (None, 900, 0), (Some(200 * MI), 450, 250), (None, -100, 600)];
        for (min, available, excess) in cases {
            assert_eq!(working_set_excess(&t(min), &obs(available)), excess * MI, "{min:?} {available}");
        }
    }

    #[test]
    fn the_pods_with_the_most_active_cache_give_it_back_first() {
        let pods = |list: &[(&str, MemoryKinds)]| -> Vec<(String, MemoryKinds)> {
            list.iter().map(|(c, m)| ((*c).to_owned(), *m)).collect()
        };
        let target = |c: &str, mi: u64| ReclaimTarget { cgroup: c.into(), bytes: mi * MI };
        // (excess MiB, pods, plan)
        type Case = (u64, Vec<(String, MemoryKinds)>, Option<Vec<ReclaimTarget>>);
        let cases: Vec<Case> = vec![
            // Nothing to do.
            (0, pods(&[("a", kinds(10, 100, 20))]), Some(vec![])),
            // One pod covers it: its inactive pages plus the excess.
            (50, pods(&[("small", kinds(0, 40, 0)), ("cache", kinds(10, 300, 100))]), Some(vec![target("cache", 150)])),
            // Two pods: the larger cache gives all of its active pages.
            (
                250,
                pods(&[("a", kinds(0, 300, 100)), ("b", kinds(0, 100, 0))]),
                Some(vec![target("a", 300), target("b", 50)]),
            ),
            // Anonymous memory and inactive cache do not count.
            (50, pods(&[("hog", kinds(900, 30, 30)), ("c", kinds(0, 60, 0))]), Some(vec![target("c", 50)])),
            // Not enough active cache anywhere: evict rather than wait.
            (200, pods(&[("hog", kinds(900, 30, 0)), ("c", kinds(0, 100, 0))]), None),
            (10, vec![], None),
            // Equal caches: by name.
            (10, pods(&[("b", kinds(0, 50, 0)), ("a", kinds(0, 50, 0))]), Some(vec![target("a", 10)])),
        ];
        for (excess, pods, want) in cases {
            assert_eq!(plan(excess * MI, &pods), want, "excess {excess} MiB over {pods:?}");
        }
    }

    #[test]
    fn growth_is_anonymous_when_anon_grew_the_most() {
        // (before, now, anonymous)
        let cases = [
            (kinds(100, 100, 50), kinds(400, 100, 50), true),
            // Page cache read in and activated.
            (kinds(100, 100, 50), kinds(110, 500, 50), false),
            // Cache read but left inactive does not move the working set.
            (kinds(100, 100, 50), kinds(150, 500, 450), true),
            // Both grew, anon more.
            (kinds(100, 100, 0), kinds(300, 200, 0), true),
            // Nothing grew (a crossing with no change since): not anon.
            (kinds(100, 100, 0), kinds(100, 100, 0), false),
            // Anon shrank while cache grew.
            (kinds(300, 100, 0), kinds(200, 300, 0), false),
        ];
        for (before, now, anonymous) in cases {
            assert_eq!(growth_is_anonymous(before, now), anonymous, "{before:?} → {now:?}");
        }
    }
}
