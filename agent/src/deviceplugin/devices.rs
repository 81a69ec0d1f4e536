//! The devices each registered resource has, their health, and what node
//! status reports from them, as the kubelet's devicemanager keeps them
//! (`healthyDevices`/`unhealthyDevices`, `GetCapacity`). Pure: the caller
//! passes the time.
//!
//! - capacity counts every device, allocatable only the healthy ones;
//! - when a plugin's stream ends every device turns unhealthy (capacity
//!   stays, allocatable drops to 0) until it registers again;
//! - a resource whose plugin stayed away for [`STOP_GRACE`] is dropped
//!   and reported as removed, so node status deletes it.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use super::{HEALTHY, api};

/// How long a stopped plugin's resource stays in node status (the
/// kubelet's endpointStopGracePeriod).
pub const STOP_GRACE: Duration = Duration::from_secs(5 * 60);

/// What node status reports for device plugin resources.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExtendedResources {
    pub capacity: BTreeMap<String, i64>,
    pub allocatable: BTreeMap<String, i64>,
    /// Resources dropped after their plugin went away: deleted from status.
    pub removed: BTreeSet<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct ResourceDevices {
    /// Device id → healthy.
    devices: BTreeMap<String, bool>,
    /// Since when its plugin is gone (None: connected).
    stopped_at: Option<Instant>,
}

/// Every resource a plugin registered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Registry {
    resources: BTreeMap<String, ResourceDevices>,
    removed: BTreeSet<String>,
}

impl Registry {
    /// A plugin registered `resource` (again): its devices stay as they
    /// were until its first ListAndWatch answer.
    pub fn registered(&mut self, resource: &str) {
        self.removed.remove(resource);
        self.resources.entry(resource.to_owned()).or_default().stopped_at = None;
    }

    /// A resource known from the checkpoint, with its plugin not (yet)
    /// registered: no devices, stopped since `now`.
    pub fn restored(&mut self, resource: &str, now: Instant) {
        self.resources
            .entry(resource.to_owned())
            .or_insert_with(|| ResourceDevices { devices: BTreeMap::new(), stopped_at: Some(now) });
    }

    /// A ListAndWatch answer: the full device list of `resource`.
    pub fn update(&mut self, resource: &str, devices: &[api::Device]) {
        let r = self.resources.entry(resource.to_owned()).or_default();
        r.devices = devices.iter().map(|d| (d.id.clone(), d.health == HEALTHY)).collect();
    }

    /// The plugin's stream ended: every device is unhealthy from now on.
    pub fn stopped(&mut self, resource: &str, now: Instant) {
        if let Some(r) = self.resources.get_mut(resource) {
            r.devices.values_mut().for_each(|h| *h = false);
            r.stopped_at.get_or_insert(now);
        }
    }

    /// Drops resources whose plugin stayed away for [`STOP_GRACE`]; true
    /// when something was dropped.
    pub fn expire(&mut self, now: Instant) -> bool {
        let gone: Vec<String> = self
            .resources
            .iter()
            .filter(|(_, r)| r.stopped_at.is_some_and(|t| now.saturating_duration_since(t) >= STOP_GRACE))
            .map(|(n, _)| n.clone())
            .collect();
        for n in &gone {
            self.resources.remove(n);
            self.removed.insert(n.clone());
        }
        !gone.is_empty()
    }

    /// Whether `resource` is a device plugin resource (registered now or
    /// restored from the checkpoint).
    pub fn knows(&self, resource: &str) -> bool {
        self.resources.contains_key(resource)
    }

    /// The healthy devices of `resource` (None: not registered).
    pub fn healthy(&self, resource: &str) -> Option<BTreeSet<String>> {
        self.resources.get(resource).map(|r| r.devices.iter().filter(|(_, h)| **h).map(|(id, _)| id.clone()).collect())
    }

    /// Every device id per resource (for the checkpoint).
    pub fn all_devices(&self) -> BTreeMap<String, Vec<String>> {
        self.resources.iter().map(|(n, r)| (n.clone(), r.devices.keys().cloned().collect())).collect()
    }

    /// What node status reports.
    pub fn extended_resources(&self) -> ExtendedResources {
        let mut out = ExtendedResources { removed: self.removed.clone(), ..Default::default() };
        for (name, r) in &self.resources {
            out.capacity.insert(name.clone(), r.devices.len() as i64);
            out.allocatable.insert(name.clone(), r.devices.values().filter(|h| **h).count() as i64);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deviceplugin::UNHEALTHY;

    fn dev(id: &str, healthy: bool) -> api::Device {
        api::Device { id: id.into(), health: if healthy { HEALTHY } else { UNHEALTHY }.into(), topology: None }
    }

    fn counts(r: &Registry) -> Vec<(String, i64, i64)> {
        let e = r.extended_resources();
        e.capacity.iter().map(|(n, c)| (n.clone(), *c, e.allocatable[n])).collect()
    }

    #[test]
    fn capacity_counts_all_devices_and_allocatable_the_healthy_ones() {
        let t0 = Instant::now();
        type Step = Box<dyn Fn(&mut Registry)>;
        // (name, steps, (resource, capacity, allocatable), removed)
        type Case = (&'static str, Vec<Step>, Vec<(&'static str, i64, i64)>, Vec<&'static str>);
        let cases: Vec<Case> = vec![
            ("nothing registered", vec![], vec![], vec![]),
            ("registered, no list yet", vec![Box::new(|r| r.registered("a.com/x"))], vec![("a.com/x", 0, 0)], vec![]),
            (
                "all healthy",
                vec![Box::new(|r| {
                    r.registered("a.com/x");
                    r.update("a.com/x", &[dev("0", true), dev("1", true)]);
                })],
                vec![("a.com/x", 2, 2)],
                vec![],
            ),
            (
                "one unhealthy",
                vec![Box::new(|r| {
                    r.registered("a.com/x");
                    r.update("a.com/x", &[dev("0", true), dev("1", false), dev("2", true)]);
                })],
                vec![("a.com/x", 3, 2)],
                vec![],
            ),
            (
                "a device disappears from the list",
                vec![Box::new(|r| {
                    r.registered("a.com/x");
                    r.update("a.com/x", &[dev("0", true), dev("1", true)]);
                    r.update("a.com/x", &[dev("1", true)]);
                })],
                vec![("a.com/x", 1, 1)],
                vec![],
            ),
            (
                "plugin stream ended: capacity stays, allocatable 0",
                vec![Box::new(move |r| {
                    r.registered("a.com/x");
                    r.update("a.com/x", &[dev("0", true), dev("1", true)]);
                    r.stopped("a.com/x", t0);
                    r.expire(t0 + STOP_GRACE - Duration::from_secs(1));
                })],
                vec![("a.com/x", 2, 0)],
                vec![],
            ),
            (
                "gone past the grace period: removed",
                vec![Box::new(move |r| {
                    r.registered("a.com/x");
                    r.update("a.com/x", &[dev("0", true)]);
                    r.registered("b.com/y");
                    r.update("b.com/y", &[dev("0", true)]);
                    r.stopped("a.com/x", t0);
                    r.expire(t0 + STOP_GRACE);
                })],
                vec![("b.com/y", 1, 1)],
                vec!["a.com/x"],
            ),
            (
                "registers again within the grace period",
                vec![Box::new(move |r| {
                    r.registered("a.com/x");
                    r.update("a.com/x", &[dev("0", true)]);
                    r.stopped("a.com/x", t0);
                    r.registered("a.com/x");
                    r.update("a.com/x", &[dev("0", true), dev("1", true)]);
                    r.expire(t0 + STOP_GRACE * 2);
                })],
                vec![("a.com/x", 2, 2)],
                vec![],
            ),
            (
                "removed, then registered again",
                vec![Box::new(move |r| {
                    r.registered("a.com/x");
                    r.stopped("a.com/x", t0);
                    r.expire(t0 + STOP_GRACE);
                    r.registered("a.com/x");
                    r.update("a.com/x", &[dev("7", true)]);
                })],
                vec![("a.com/x", 1, 1)],
                vec![],
            ),
            (
                "restored from the checkpoint: 0 until the plugin comes back",
                vec![Box::new(move |r| r.restored("a.com/x", t0))],
                vec![("a.com/x", 0, 0)],
                vec![],
            ),
        ];
        for (name, steps, want, removed) in cases {
            let mut r = Registry::default();
            for s in &steps {
                s(&mut r);
            }
            let want: Vec<(String, i64, i64)> = want.into_iter().map(|(n, c, a)| (n.to_owned(), c, a)).collect();
            assert_eq!(counts(&r), want, "{name}");
            let removed: BTreeSet<String> = removed.into_iter().map(str::to_owned).collect();
            assert_eq!(r.extended_resources().removed, removed, "{name}: removed");
        }
    }

    #[test]
    fn healthy_lists_only_healthy_devices_of_known_resources() {
        let mut r = Registry::default();
        assert_eq!(r.healthy("a.com/x"), None);
        r.registered("a.com/x");
        r.update("a.com/x", &[dev("0", true), dev("1", false)]);
        assert_eq!(r.healthy("a.com/x"), Some(BTreeSet::from(["0".to_string()])));
        assert!(r.knows("a.com/x") && !r.knows("b.com/y"));
        assert_eq!(r.all_devices()["a.com/x"], vec!["0".to_string(), "1".to_string()]);
    }
}
