//! The eviction settings: hard and soft thresholds, their grace periods
//! and minimum reclaim, the pressure transition period and the cap on a
//! pod's grace period, with the kubelet's defaults merged in as it does.

use std::collections::BTreeMap;

use super::configuration::KubeletConfiguration;
use crate::config::{
    error::ConfigError,
    thresholds,
    tree::{Node, Origin},
    values::{Ctx, Object},
};

/// evictionHard, evictionSoft, evictionSoftGracePeriod,
/// evictionMinimumReclaim, evictionPressureTransitionPeriod,
/// evictionMaxPodGracePeriod and mergeDefaultEvictionSettings.
pub(super) fn read(cx: &Ctx, o: &mut Object, c: &mut KubeletConfiguration) -> Result<(), ConfigError> {
    let statements = |entry: Option<(&'static str, &Node)>| -> Result<Vec<(String, String, Node)>, ConfigError> {
        match entry {
            Some((field, n)) => Ok(cx.string_map(n, field)?.into_iter().map(|(k, v, n)| (k, v, n.clone())).collect()),
            None => Ok(vec![]),
        }
    };
    if let Some(v) = o.boolean("mergeDefaultEvictionSettings")? {
        c.merge_default_eviction_settings = v;
    }
    let hard = o.get("evictionHard").map(|n| ("evictionHard", n));
    let soft = o.get("evictionSoft").map(|n| ("evictionSoft", n));
    let grace = o.get("evictionSoftGracePeriod").map(|n| ("evictionSoftGracePeriod", n));
    let reclaim = o.get("evictionMinimumReclaim").map(|n| ("evictionMinimumReclaim", n));

    let mut reclaims = BTreeMap::new();
    for (k, v, n) in statements(reclaim)? {
        let (s, r) = thresholds::parse_min_reclaim(&k, &v).map_err(|m| cx.err(&n, "evictionMinimumReclaim", m))?;
        reclaims.insert(s, r);
    }
    let mut graces = BTreeMap::new();
    for (k, v, n) in statements(grace)? {
        let (s, g) = thresholds::parse_grace_period(&k, &v).map_err(|m| cx.err(&n, "evictionSoftGracePeriod", m))?;
        graces.insert(s, g);
    }
    let parse_all = |field: &str, entries: Vec<(String, String, Node)>| {
        let mut out = BTreeMap::new();
        let mut nodes = BTreeMap::new();
        for (k, v, n) in entries {
            if let Some((s, t)) = thresholds::parse_threshold(&k, &v).map_err(|m| cx.err(&n, field, m))? {
                out.insert(s, t);
                nodes.insert(s, n);
            }
        }
        Ok::<_, ConfigError>((out, nodes))
    };
    // Absent (or null) evictionHard means the defaults; the loader has
    // already put them in the tree so drop-ins merge into them as upstream.
    let hard_entries = match hard {
        Some(_) => statements(hard)?,
        None => thresholds::DEFAULT_EVICTION_HARD
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned(), Node::str(*v, Origin::Default)))
            .collect(),
    };
    let (mut hard_map, _) = parse_all("evictionHard", hard_entries)?;
    if c.merge_default_eviction_settings {
        // Signals the configuration names (even as 0%) keep their value.
        for (k, v) in thresholds::DEFAULT_EVICTION_HARD {
            let present = hard.and_then(|(_, n)| n.get(k)).is_some();
            if !present && let Ok(Some((s, t))) = thresholds::parse_threshold(k, v) {
                hard_map.insert(s, t);
            }
        }
    }
    let (soft_map, soft_nodes) = parse_all("evictionSoft", statements(soft)?)?;
    c.eviction_hard = thresholds::hard_thresholds(&hard_map, &reclaims);
    c.eviction_soft = thresholds::soft_thresholds(&soft_map, &graces, &reclaims).map_err(|signal| {
        cx.err(
            &soft_nodes[&signal],
            "evictionSoft",
            format!(
                "{:?} has no grace period: set it in evictionSoftGracePeriod (--eviction-soft-grace-period)",
                signal.name()
            ),
        )
    })?;
    c.eviction_soft_grace_period = graces;
    c.eviction_minimum_reclaim = reclaims;
    c.eviction_pressure_transition_period =
        o.duration_or("evictionPressureTransitionPeriod", c.eviction_pressure_transition_period)?;
    if let Some(v) = o.int_in("evictionMaxPodGracePeriod", i32::MIN as i64, i32::MAX as i64)? {
        c.eviction_max_pod_grace_period = v as i32;
    }
    Ok(())
}
