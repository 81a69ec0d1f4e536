//! The node Lease (`kube-node-lease/<node>`), the kubelet's heartbeat:
//! renewed every leaseDuration/4 (10 s by default); created when missing,
//! owned by the Node once the Node exists; failures retried with back-off
//! from 200 ms to 7 s, as the kubelet's lease controller.

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference},
    jiff::Timestamp,
};
use kube::api::PostParams;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::flowcontrol::{Backoff, BackoffPolicy};

pub const NAMESPACE: &str = "kube-node-lease";
const BACKOFF_START: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(7);
/// The back-off's one key: this loop renews one lease.
const BACKOFF_KEY: &str = "lease";

/// The renew interval for a lease duration (nodeLeaseRenewIntervalFraction 0.25).
pub fn renew_interval(lease_duration_seconds: u32) -> Duration {
    Duration::from_secs_f64(f64::from(lease_duration_seconds.max(1)) * 0.25)
}

fn node_owner(node_name: &str, node_uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node_name.into(),
        uid: node_uid.into(),
        ..Default::default()
    }
}

/// The lease to write: the existing one (its resourceVersion makes the
/// update conditional) with this holder, duration and renewTime, and the
/// Node as owner when known.
pub fn renewed(
    existing: Option<&Lease>,
    node_name: &str,
    duration_seconds: u32,
    now: Timestamp,
    node_uid: Option<&str>,
) -> Lease {
    let mut lease = existing.cloned().unwrap_or_else(|| Lease {
        metadata: ObjectMeta { name: Some(node_name.into()), namespace: Some(NAMESPACE.into()), ..Default::default() },
        spec: None,
    });
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(node_name.into());
    spec.lease_duration_seconds = Some(duration_seconds as i32);
    spec.renew_time = Some(MicroTime(now));
    if let Some(uid) = node_uid {
        let owners = lease.metadata.owner_references.get_or_insert_with(Vec::new);
        if !owners.iter().any(|o| o.kind == "Node" && o.uid == uid) {
            owners.retain(|o| o.kind != "Node");
            owners.push(node_owner(node_name, uid));
        }
    }
    lease
}

/// Renews the lease until `shutdown`.
pub async fn run(
    client: kube::Client,
    node_name: String,
    duration_seconds: u32,
    node_uid: watch::Receiver<Option<String>>,
    shutdown: CancellationToken,
) {
    let api: kube::Api<Lease> = kube::Api::namespaced(client, NAMESPACE);
    let every = renew_interval(duration_seconds);
    let timeout = every.max(Duration::from_secs(1));
    let mut cached: Option<Lease> = None;
    let mut backoff = Backoff::new(BackoffPolicy { initial: BACKOFF_START, max: BACKOFF_MAX });
    let mut failing = false;
    loop {
        let uid = node_uid.borrow().clone();
        let attempt = async {
            let base = match cached.take() {
                Some(l) => Some(l),
                None => api.get_opt(&node_name).await?,
            };
            let lease = renewed(base.as_ref(), &node_name, duration_seconds, Timestamp::now(), uid.as_deref());
            match base {
                Some(_) => api.replace(&node_name, &PostParams::default(), &lease).await,
                None => api.create(&PostParams::default(), &lease).await,
            }
        };
        let wait = match tokio::time::timeout(timeout, attempt).await {
            Ok(Ok(written)) => {
                if failing {
                    info!("node lease renewed again");
                }
                failing = false;
                cached = Some(written);
                backoff.forget(BACKOFF_KEY);
                every
            }
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
                debug!("node lease conflict; re-reading it");
                Duration::ZERO
            }
            outcome => {
                let why = match outcome {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {timeout:?}"),
                };
                if !failing {
                    warn!("cannot renew the node lease (retrying): {why}");
                }
                failing = true;
                backoff.next(BACKOFF_KEY, tokio::time::Instant::now().into_std());
                backoff.delay(BACKOFF_KEY).unwrap_or(BACKOFF_START)
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals() {
        assert_eq!(renew_interval(40), Duration::from_secs(10));
        assert_eq!(renew_interval(10), Duration::from_millis(2500));
        let t = Timestamp::from_second(1_700_000_000).unwrap();
        let fresh = renewed(None, "n1", 40, t, None);
        assert_eq!(fresh.metadata.namespace.as_deref(), Some(NAMESPACE));
        let spec = fresh.spec.as_ref().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("n1"));
        assert_eq!(spec.lease_duration_seconds, Some(40));
        assert_eq!(spec.renew_time, Some(MicroTime(t)));
        assert!(fresh.metadata.owner_references.is_none(), "no Node yet, no owner");
        let mut stored = fresh.clone();
        stored.metadata.resource_version = Some("7".into());
        let later = renewed(Some(&stored), "n1", 40, t + Duration::from_secs(10), Some("uid-1"));
        assert_eq!(later.metadata.resource_version.as_deref(), Some("7"), "the update is conditional");
        let owner = &later.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Node", "uid-1"));
        let again = renewed(Some(&later), "n1", 40, t, Some("uid-1"));
        assert_eq!(again.metadata.owner_references.as_ref().unwrap().len(), 1);
    }
}
