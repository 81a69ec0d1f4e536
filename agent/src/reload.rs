//! Configuration reload on SIGHUP (in place of the kubelet's removed
//! dynamic configuration): the config file and drop-ins are read again
//! with the same command line; the fields that are safe to change in a
//! running agent take effect at once, the others are reported as needing
//! a restart and left as they are. A configuration that does not load is
//! reported and changes nothing. Running pods are never touched.
//!
//! Live fields: the eviction thresholds and periods (the eviction manager
//! is reconfigured; node allocatable, which depends on evictionHard, is
//! computed again for node status and pod admission), `logging.verbosity`,
//! and the node status update and report frequencies (for the API side,
//! through [`LiveSettings`]). /configz shows the configuration in effect.

use std::{collections::BTreeMap, time::Duration};

use serde_json::{Map, Value};

use crate::{
    cm::allocatable::{NodeAllocatable, ResourceList},
    config::Config,
};

/// The KubeletConfiguration fields a reload applies (their /configz names).
pub const LIVE_FIELDS: &[&str] = &[
    "evictionHard",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionMinimumReclaim",
    "evictionPressureTransitionPeriod",
    "evictionMaxPodGracePeriod",
    "mergeDefaultEvictionSettings",
    "logging.verbosity",
    "nodeStatusUpdateFrequency",
    "nodeStatusReportFrequency",
];

/// Settings other components read live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveSettings {
    pub node_status_update_frequency: Duration,
    pub node_status_report_frequency: Duration,
    pub verbosity: u32,
    /// Node allocatable as node status prints it, when a reload changed
    /// what it is computed from (None: as computed at start).
    pub allocatable: Option<BTreeMap<String, String>>,
}

impl LiveSettings {
    pub fn of(c: &Config) -> LiveSettings {
        LiveSettings {
            node_status_update_frequency: c.kubelet.node_status_update_frequency,
            node_status_report_frequency: c.kubelet.node_status_report_frequency,
            verbosity: c.kubelet.logging.verbosity,
            allocatable: None,
        }
    }
}

/// Node allocatable for `config` on a machine of `capacity` (evictionHard,
/// kubeReserved and systemReserved taken from `config`).
pub fn allocatable(capacity: &ResourceList, config: &Config) -> NodeAllocatable {
    NodeAllocatable::new(capacity.clone(), &config.kubelet)
}

/// What changed between the running configuration and the new one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigDiff {
    /// Live fields that changed (applied).
    pub applied: Vec<String>,
    /// Other fields that changed (need a restart).
    pub needs_restart: Vec<String>,
}

impl ConfigDiff {
    pub fn is_empty(&self) -> bool {
        self.applied.is_empty() && self.needs_restart.is_empty()
    }

    pub fn eviction_changed(&self) -> bool {
        self.applied.iter().any(|f| f.starts_with("eviction") || f == "mergeDefaultEvictionSettings")
    }
}

/// `logging.verbosity`-style paths for the config's fields (maps one level
/// deep for `logging`, `authentication`, `authorization`; whole values
/// otherwise).
fn flatten(v: &Value) -> Map<String, Value> {
    let mut out = Map::new();
    let Some(obj) = v.get("kubeletconfig").and_then(Value::as_object) else { return out };
    for (k, v) in obj {
        match (k.as_str(), v) {
            ("logging" | "authentication" | "authorization", Value::Object(inner)) => {
                for (ik, iv) in inner {
                    out.insert(format!("{k}.{ik}"), iv.clone());
                }
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    out
}

/// The fields that differ, sorted, split into live and restart-needing.
/// Command-line-only settings cannot change (the same command line is read
/// again), so only the KubeletConfiguration is compared.
pub fn diff(running: &Config, new: &Config) -> ConfigDiff {
    let (a, b) = (flatten(&running.configz()), flatten(&new.configz()));
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut d = ConfigDiff::default();
    for k in keys {
        if a.get(k) == b.get(k) {
            continue;
        }
        if LIVE_FIELDS.contains(&k.as_str()) {
            d.applied.push(k.clone());
        } else {
            d.needs_restart.push(k.clone());
        }
    }
    d
}

/// `running` with the live fields of `new`: what runs after a reload.
pub fn apply_live(running: &Config, new: &Config) -> Config {
    let mut out = running.clone();
    let (k, n) = (&mut out.kubelet, &new.kubelet);
    k.eviction_hard = n.eviction_hard.clone();
    k.eviction_soft = n.eviction_soft.clone();
    k.eviction_soft_grace_period = n.eviction_soft_grace_period.clone();
    k.eviction_minimum_reclaim = n.eviction_minimum_reclaim.clone();
    k.eviction_pressure_transition_period = n.eviction_pressure_transition_period;
    k.eviction_max_pod_grace_period = n.eviction_max_pod_grace_period;
    k.merge_default_eviction_settings = n.merge_default_eviction_settings;
    k.logging.verbosity = n.logging.verbosity;
    k.node_status_update_frequency = n.node_status_update_frequency;
    k.node_status_report_frequency = n.node_status_report_frequency;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigFs, load_with};
    use std::{
        collections::HashMap,
        io,
        path::{Path, PathBuf},
    };

    struct Files(HashMap<PathBuf, String>);

    impl ConfigFs for Files {
        fn read_to_string(&self, path: &Path) -> io::Result<String> {
            self.0.get(path).cloned().ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }

        fn read_dir(&self, _dir: &Path) -> io::Result<Vec<(PathBuf, bool)>> {
            Ok(vec![])
        }
    }

    fn config(body: &str) -> Config {
        let text = format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{body}");
        let fs = Files([(PathBuf::from("/etc/kubelet.yaml"), text)].into());
        load_with(["--config=/etc/kubelet.yaml"], &fs).unwrap()
    }

    #[test]
    fn live_and_restart_fields_are_told_apart() {
        let old = config("evictionHard:\n  memory.available: 100Mi\nmaxPods: 110\n");
        assert!(diff(&old, &old).is_empty());
        let new = config(
            "evictionHard:\n  memory.available: 500Mi\nevictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: 30s\nlogging:\n  verbosity: 4\nmaxPods: 50\nnodeStatusReportFrequency: 1m\nstaticPodPath: /etc/kubernetes/manifests\n",
        );
        let d = diff(&old, &new);
        assert_eq!(
            d.applied,
            vec![
                "evictionHard",
                "evictionSoft",
                "evictionSoftGracePeriod",
                "logging.verbosity",
                "nodeStatusReportFrequency"
            ]
        );
        assert_eq!(d.needs_restart, vec!["maxPods", "staticPodPath"]);
        assert!(d.eviction_changed());

        let after = apply_live(&old, &new);
        assert_eq!(after.kubelet.max_pods, 110, "restart-needing fields keep their running value");
        assert_eq!(after.kubelet.logging.verbosity, 4);
        assert_eq!(after.kubelet.eviction_thresholds(), new.kubelet.eviction_thresholds());
        // What was applied no longer differs; what needs a restart still does.
        let again = diff(&after, &new);
        assert!(again.applied.is_empty());
        assert_eq!(again.needs_restart, vec!["maxPods", "staticPodPath"]);
        assert_eq!(LiveSettings::of(&after).node_status_report_frequency, Duration::from_secs(60));
    }

    #[test]
    fn allocatable_follows_the_hard_memory_threshold() {
        use crate::cm::allocatable::Resource;
        let capacity: ResourceList =
            [(Resource::Memory, "8Gi".parse().unwrap()), (Resource::Cpu, "4".parse().unwrap())].into();
        let memory = |c: &Config| allocatable(&capacity, c).allocatable[&Resource::Memory].value();
        let old = config("evictionHard:\n  memory.available: 100Mi\n");
        let new = config("evictionHard:\n  memory.available: 612Mi\n");
        assert_eq!(memory(&old) - memory(&new), 512 << 20);
    }
}
