//! The node's shutdown as systemd-logind announces it, the way the kubelet
//! listens: a `delay` inhibitor lock on `shutdown` held while the agent
//! runs, and on PrepareForShutdown(true) the pods stopped in priority order
//! before the lock is released and the shutdown goes on. logind holds a
//! delay lock for at most InhibitDelayMaxSec, so when that is shorter than
//! shutdownGracePeriod the agent raises it with the kubelet's drop-in and
//! reloads logind, as the kubelet does.

use std::{path::Path, sync::Arc, time::Duration};

use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::NodeShutdownManager;
use crate::systemd::{InhibitLock, Logind, Systemd, SystemdError};

/// The drop-in the kubelet writes (same path, so the two never disagree).
pub const LOGIND_DROP_IN: &str = "/etc/systemd/logind.conf.d/99-kubelet.conf";
const WHO: &str = "swiftlet";
const WHY: &str = "Kubelet needs time to handle node shutdown";

/// The drop-in's text for a grace period (whole seconds, rounded up).
pub fn drop_in(grace: Duration) -> String {
    let secs = grace.as_secs() + u64::from(grace.subsec_nanos() > 0);
    format!(
        "# Written by swiftlet (the node agent) for graceful node shutdown:\n\
         # logind holds the agent's delay lock for up to shutdownGracePeriod.\n\
         [Login]\nInhibitDelayMaxSec={secs}\n"
    )
}

/// Whether this node's shutdowns come from logind (systemd is PID 1).
pub fn available() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// Makes InhibitDelayMaxSec at least `grace`: writes the drop-in, asks
/// systemd to send logind SIGHUP, and reads it back.
async fn ensure_inhibit_delay(logind: &Logind, grace: Duration) -> Result<Duration, String> {
    let current = logind.inhibit_delay_max().await.map_err(|e| e.to_string())?;
    if current >= grace {
        return Ok(current);
    }
    let dir = Path::new(LOGIND_DROP_IN).parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    crate::host::write_atomic(Path::new(LOGIND_DROP_IN), drop_in(grace).as_bytes(), 0o644)
        .map_err(|e| format!("{LOGIND_DROP_IN}: {e}"))?;
    let systemd = Systemd::connect().await.map_err(|e| e.to_string())?;
    systemd
        .kill_unit("systemd-logind.service", "main", rustix::process::Signal::HUP.as_raw())
        .await
        .map_err(|e| e.to_string())?;
    // logind re-reads its configuration as it handles the signal (seconds
    // on a slow machine).
    for _ in 0..200 {
        let now = logind.inhibit_delay_max().await.map_err(|e| e.to_string())?;
        if now >= grace {
            return Ok(now);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let now = logind.inhibit_delay_max().await.map_err(|e| e.to_string())?;
    Err(format!(
        "InhibitDelayMaxSec is {now:?} after writing {LOGIND_DROP_IN}, less than shutdownGracePeriod {grace:?}"
    ))
}

async fn take_lock(logind: &Logind) -> Result<InhibitLock, SystemdError> {
    logind.inhibit_delay("shutdown", WHO, WHY).await
}

/// Holds the lock and stops the pods when logind says the node is going
/// down; returns when the agent stops (or logind cannot be used, after
/// saying why).
pub async fn run(manager: Arc<NodeShutdownManager>, stop: CancellationToken) {
    let grace = manager.grace_period();
    let logind = match Logind::connect().await {
        Ok(l) => l,
        Err(e) => {
            warn!(
                "graceful node shutdown: cannot use systemd-logind ({e}); only the shutdown marker and SIGTERM start it"
            );
            return;
        }
    };
    match ensure_inhibit_delay(&logind, grace).await {
        Ok(delay) => info!(?delay, "graceful node shutdown: logind's InhibitDelayMaxSec covers shutdownGracePeriod"),
        Err(e) => warn!("graceful node shutdown: {e}; logind may end the wait before the pods are stopped"),
    }
    let mut signals = match logind.prepare_for_shutdown().await {
        Ok(s) => s,
        Err(e) => {
            warn!("graceful node shutdown: {e}; only the shutdown marker and SIGTERM start it");
            return;
        }
    };
    let mut lock = match take_lock(&logind).await {
        Ok(l) => Some(l),
        Err(e) => {
            warn!("graceful node shutdown: {e}; only the shutdown marker and SIGTERM start it");
            return;
        }
    };
    info!("graceful node shutdown: holding a logind delay inhibitor lock");
    loop {
        let start = tokio::select! {
            s = signals.next() => match s {
                Some(start) => start,
                None => {
                    warn!("graceful node shutdown: logind's signal stream ended");
                    return;
                }
            },
            _ = stop.cancelled() => return,
        };
        if start {
            manager.shutdown("systemd-logind announced the shutdown (PrepareForShutdown)").await;
            // Released: logind goes on with the shutdown.
            lock = None;
            info!("graceful node shutdown: pods stopped; released the inhibitor lock");
        } else if lock.is_none() {
            // The shutdown was cancelled: hold the lock for the next one.
            match take_lock(&logind).await {
                Ok(l) => lock = Some(l),
                Err(e) => warn!("graceful node shutdown: cannot take the inhibitor lock again: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drop_in_rounds_the_grace_period_up_to_whole_seconds() {
        assert!(drop_in(Duration::from_secs(30)).contains("\n[Login]\nInhibitDelayMaxSec=30\n"));
        assert!(drop_in(Duration::from_millis(1500)).ends_with("InhibitDelayMaxSec=2\n"));
    }
}
