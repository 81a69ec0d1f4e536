//! The CSI drivers registered on this node (the kubelet's `csiDrivers`
//! store): filled by the plugin watcher's CSI handler, read by the volume
//! manager to dial a driver by name.

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
};

use parking_lot::RwLock;
use tokio::sync::watch;

use super::client::CsiClient;

/// One registered driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverInfo {
    pub name: String,
    /// The socket its Node service is served on.
    pub endpoint: PathBuf,
    /// NodeGetInfo's answer.
    pub node_id: String,
    /// 0: no limit.
    pub max_volumes: i64,
    /// NodeGetInfo's accessible topology (the node labels it adds).
    pub topology: BTreeMap<String, String>,
    /// The CSI versions the registration offered.
    pub versions: Vec<String>,
}

pub struct CsiDrivers {
    drivers: RwLock<HashMap<String, DriverInfo>>,
    changed: watch::Sender<u64>,
}

impl Default for CsiDrivers {
    fn default() -> Self {
        CsiDrivers { drivers: RwLock::new(HashMap::new()), changed: watch::channel(0).0 }
    }
}

impl CsiDrivers {
    pub fn get(&self, name: &str) -> Option<DriverInfo> {
        self.drivers.read().get(name).cloned()
    }

    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.drivers.read().keys().cloned().collect();
        v.sort();
        v
    }

    pub fn all(&self) -> Vec<DriverInfo> {
        let mut v: Vec<DriverInfo> = self.drivers.read().values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Adds or replaces a driver (a re-registration replaces the endpoint).
    pub fn insert(&self, info: DriverInfo) {
        self.drivers.write().insert(info.name.clone(), info);
        self.changed.send_modify(|g| *g += 1);
    }

    pub fn remove(&self, name: &str) -> Option<DriverInfo> {
        let removed = self.drivers.write().remove(name);
        if removed.is_some() {
            self.changed.send_modify(|g| *g += 1);
        }
        removed
    }

    /// Changes whenever a driver registers or goes away.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// A client of the driver `name`, with the kubelet's error when it is
    /// not registered.
    pub async fn client(&self, name: &str) -> Result<CsiClient, String> {
        let Some(info) = self.get(name) else {
            return Err(not_registered(name));
        };
        CsiClient::dial(name, &info.endpoint).await
    }
}

/// The kubelet's message for a driver that has not registered.
pub fn not_registered(name: &str) -> String {
    format!("driver name {name} not found in the list of registered CSI drivers")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, endpoint: &str) -> DriverInfo {
        DriverInfo {
            name: name.into(),
            endpoint: endpoint.into(),
            node_id: "n".into(),
            max_volumes: 0,
            topology: BTreeMap::new(),
            versions: vec!["1.0.0".into()],
        }
    }

    #[tokio::test]
    async fn registrations_replace_and_notify_and_unknown_drivers_are_named() {
        let d = CsiDrivers::default();
        let mut rx = d.subscribe();
        d.insert(info("b.example", "/b"));
        d.insert(info("a.example", "/a"));
        d.insert(info("a.example", "/a2"));
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        assert_eq!(d.names(), ["a.example", "b.example"]);
        assert_eq!(d.get("a.example").unwrap().endpoint, PathBuf::from("/a2"));
        assert!(d.remove("zzz").is_none());
        assert!(!rx.has_changed().unwrap());
        assert!(d.remove("b.example").is_some());
        assert!(rx.has_changed().unwrap());
        let err = d.client("b.example").await.err().unwrap();
        assert_eq!(err, "driver name b.example not found in the list of registered CSI drivers");
    }
}
