//! The plugin watcher's handler for `CSIPlugin` registrations (the
//! kubelet's csi_plugin.go RegistrationHandler).
//!
//! - validate: the driver must offer a CSI version 1.x (0.x is refused
//!   since Kubernetes 1.17, 2.x and later are ignored), and a driver of the
//!   same name must not be registered already at the same or a higher
//!   version (a restarted driver is deregistered first by the watcher);
//! - register: NodeGetInfo on the driver's endpoint, the driver recorded in
//!   [`CsiDrivers`], then published by the [`NodeInfoManager`] (CSINode,
//!   node ID annotation, topology labels). A failure to publish fails the
//!   registration and takes the driver out again, as the kubelet's; the
//!   driver's registrar retries. In standalone mode only `CsiDrivers` is
//!   kept. Until the API client exists, registrations wait for it (a
//!   bounded time) rather than fail, so drivers already running when the
//!   agent starts do not see a refusal.
//! - deregister: out of `CsiDrivers`, out of the CSINode and the
//!   annotation (the topology labels stay).
//!
//! Messages are the kubelet's, `kubernetes.io/csi: ` prefix included.

use std::{cmp::Ordering, collections::BTreeMap, fmt, path::Path, sync::Arc, time::Duration};

use async_trait::async_trait;
use tokio::sync::watch;

use super::{CsiDrivers, DriverInfo, client::CsiClient, nodeinfo::NodeInfoManager};
use crate::pluginwatcher::PluginHandler;

/// How long a registration waits for the API client before it fails (and
/// is retried by the watcher).
pub const PUBLISHER_WAIT: Duration = Duration::from_secs(120);

/// A CSI version as the kubelet parses it (`utilversion.ParseGeneric`:
/// at least major.minor, an optional `v`, anything after the numbers
/// ignored).
#[derive(Clone, Debug)]
pub struct CsiVersion(Vec<u64>);

impl CsiVersion {
    pub fn parse(s: &str) -> Result<CsiVersion, String> {
        let t = s.trim_start();
        let t = t.strip_prefix('v').unwrap_or(t);
        let b = t.as_bytes();
        let mut comps = vec![];
        let mut end = 0;
        loop {
            let start = end;
            while end < b.len() && b[end].is_ascii_digit() {
                end += 1;
            }
            if end == start {
                break;
            }
            comps.push(&t[start..end]);
            if end + 1 < b.len() && b[end] == b'.' && b[end + 1].is_ascii_digit() {
                end += 1;
            } else {
                break;
            }
        }
        if comps.is_empty() {
            return Err(format!("could not parse {s:?} as version"));
        }
        if comps.len() < 2 {
            return Err(format!("illegal version string {s:?}"));
        }
        let mut out = Vec::with_capacity(comps.len());
        for c in comps {
            if c.len() > 1 && c.starts_with('0') {
                return Err(format!("illegal zero-prefixed version component {c:?} in {s:?}"));
            }
            out.push(c.parse().map_err(|e| format!("illegal non-numeric version component {c:?} in {s:?}: {e}"))?);
        }
        Ok(CsiVersion(out))
    }

    pub fn major(&self) -> u64 {
        self.0[0]
    }
}

impl Ord for CsiVersion {
    /// Missing components count as 0 (1.2 == 1.2.0).
    fn cmp(&self, other: &Self) -> Ordering {
        let n = self.0.len().max(other.0.len());
        (0..n)
            .map(|i| self.0.get(i).copied().unwrap_or(0).cmp(&other.0.get(i).copied().unwrap_or(0)))
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    }
}

impl PartialEq for CsiVersion {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for CsiVersion {}

impl PartialOrd for CsiVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for CsiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(u64::to_string).collect();
        f.write_str(&parts.join("."))
    }
}

/// The highest 1.x version offered (the kubelet's
/// `utilversion.HighestSupportedVersion`).
pub fn highest_supported_version(versions: &[String]) -> Result<CsiVersion, String> {
    if versions.is_empty() {
        return Err("empty array for supported versions".into());
    }
    let mut highest: Option<CsiVersion> = None;
    let mut last_err: Option<String> = None;
    for v in versions.iter().rev() {
        match CsiVersion::parse(v) {
            Err(e) => last_err = Some(e),
            Ok(v) if v.major() > 1 => {}
            Ok(v) => {
                if highest.as_ref().is_none_or(|h| *h < v) {
                    highest = Some(v);
                }
            }
        }
    }
    let Some(h) = highest else {
        return Err(format!(
            "could not find a highest supported version from versions ([{}]) reported: {}",
            versions.join(" "),
            last_err.as_deref().unwrap_or("<nil>")
        ));
    };
    if h.major() != 1 {
        return Err(format!("highest supported version reported is {h}, must be v1.x"));
    }
    Ok(h)
}

fn log(msg: String) -> String {
    format!("kubernetes.io/csi: {msg}")
}

/// `["a" "b"]`, as Go's %q writes a string slice.
fn quoted(versions: &[String]) -> String {
    let q: Vec<String> = versions.iter().map(|v| format!("{v:?}")).collect();
    format!("[{}]", q.join(" "))
}

/// Where registrations are published.
#[derive(Clone)]
enum Publisher {
    /// The API client is not there yet.
    Pending,
    /// No API server: CsiDrivers only.
    Standalone,
    Api(Arc<NodeInfoManager>),
}

pub struct CsiRegistration {
    drivers: Arc<CsiDrivers>,
    publisher: watch::Sender<Publisher>,
    wait: Duration,
}

impl CsiRegistration {
    /// A handler filling `drivers`, waiting for [`CsiRegistration::set_node_info`]
    /// or [`CsiRegistration::set_standalone`] to publish.
    pub fn new(drivers: Arc<CsiDrivers>) -> CsiRegistration {
        CsiRegistration { drivers, publisher: watch::channel(Publisher::Pending).0, wait: PUBLISHER_WAIT }
    }

    /// The same with another wait for the API client (tests).
    pub fn with_publisher_wait(mut self, wait: Duration) -> CsiRegistration {
        self.wait = wait;
        self
    }

    /// No API server: registrations only fill `CsiDrivers`.
    pub fn set_standalone(&self) {
        self.publisher.send_replace(Publisher::Standalone);
    }

    /// The API client exists: registrations are published through `m`.
    pub fn set_node_info(&self, m: Arc<NodeInfoManager>) {
        self.publisher.send_replace(Publisher::Api(m));
    }

    pub fn drivers(&self) -> &Arc<CsiDrivers> {
        &self.drivers
    }

    fn validate_versions(&self, caller: &str, name: &str, versions: &[String]) -> Result<CsiVersion, String> {
        if versions.is_empty() {
            return Err(log(format!(
                "{caller} for CSI driver {name:?} failed. Plugin returned an empty list for supported versions"
            )));
        }
        let new = highest_supported_version(versions).map_err(|e| {
            log(format!(
                "{caller} for CSI driver {name:?} failed. None of the versions specified {} are supported. err={e}",
                quoted(versions)
            ))
        })?;
        if let Some(existing) = self.drivers.get(name)
            && let Ok(old) = highest_supported_version(&existing.versions)
            && old >= new
        {
            return Err(log(format!(
                "{caller} for CSI driver {name:?} failed. Another driver with the same name is already registered with a higher supported version: \"{old}\""
            )));
        }
        Ok(new)
    }

    /// The node info publisher, once known (None: standalone).
    async fn publisher(&self) -> Result<Option<Arc<NodeInfoManager>>, String> {
        let mut rx = self.publisher.subscribe();
        let ready = tokio::time::timeout(self.wait, rx.wait_for(|p| !matches!(p, Publisher::Pending))).await;
        match ready {
            Ok(Ok(p)) => match &*p {
                Publisher::Api(m) => Ok(Some(m.clone())),
                _ => Ok(None),
            },
            _ => Err(log(format!("the API server client is not available after {:?}", self.wait))),
        }
    }

    /// Takes a driver whose registration failed out again.
    async fn unregister(&self, name: &str, publisher: Option<&NodeInfoManager>) {
        self.drivers.remove(name);
        if let Some(m) = publisher
            && let Err(e) = m.uninstall_driver(name).await
        {
            tracing::warn!(
                driver = name,
                "{}",
                log(format!("RegisterPlugin failed to unregister plugin due to previous error: {e}"))
            );
        }
    }
}

#[async_trait]
impl PluginHandler for CsiRegistration {
    fn validate(&self, name: &str, endpoint: &Path, versions: &[String]) -> Result<(), String> {
        self.validate_versions("ValidatePlugin", name, versions)
            .map(drop)
            .map_err(|e| format!("validation failed for CSI Driver {name} at endpoint {}: {e}", endpoint.display()))
    }

    async fn register(&self, name: &str, endpoint: &Path, versions: &[String]) -> Result<(), String> {
        self.validate_versions("RegisterPlugin", name, versions)?;
        let client = CsiClient::dial(name, endpoint).await?;
        let info = client.node_info().await?;
        let topology: BTreeMap<String, String> =
            info.accessible_topology.map(|t| t.segments.into_iter().collect()).unwrap_or_default();
        self.drivers.insert(DriverInfo {
            name: name.to_owned(),
            endpoint: endpoint.to_path_buf(),
            node_id: info.node_id.clone(),
            max_volumes: info.max_volumes_per_node,
            topology: topology.clone(),
            versions: versions.to_vec(),
        });
        let publisher = match self.publisher().await {
            Ok(p) => p,
            Err(e) => {
                self.unregister(name, None).await;
                return Err(e);
            }
        };
        if let Some(m) = &publisher
            && let Err(e) = m.install_driver(name, &info.node_id, info.max_volumes_per_node, &topology).await
        {
            self.unregister(name, Some(m)).await;
            return Err(e);
        }
        tracing::info!(driver = name, node_id = info.node_id, endpoint = %endpoint.display(), "CSI driver registered");
        Ok(())
    }

    async fn deregister(&self, name: &str) {
        self.drivers.remove(name);
        let p = self.publisher.borrow().clone();
        if let Publisher::Api(m) = p
            && let Err(e) = m.uninstall_driver(name).await
        {
            tracing::warn!(driver = name, "{}", log(format!("registrationHandler.DeRegisterPlugin failed: {e}")));
        }
        tracing::info!(driver = name, "CSI driver deregistered");
    }
}

#[cfg(test)]
mod tests;
