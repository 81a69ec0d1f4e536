//! The loop of the kubelet's periodic managers (apimachinery's
//! `wait.Until`): act every period until the agent stops. A late tick is
//! delayed rather than bunched, so a slow pass is not followed by a burst of
//! catch-up passes.

use std::time::Duration;

use tokio::time::{Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

/// Ticks every period until its token is cancelled.
pub struct Periodic {
    tick: Interval,
    shutdown: CancellationToken,
}

impl Periodic {
    /// The first tick is at once, as `wait.Until` runs its function first.
    pub fn new(period: Duration, shutdown: CancellationToken) -> Periodic {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Periodic { tick, shutdown }
    }

    /// Waits for the next tick: true when it is time to act, false once the
    /// agent stops.
    pub async fn next(&mut self) -> bool {
        tokio::select! {
            _ = self.tick.tick() => true,
            _ = self.shutdown.cancelled() => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ticks_at_once_then_every_period_until_cancelled() {
        let token = CancellationToken::new();
        let mut p = Periodic::new(Duration::from_secs(10), token.clone());
        let start = tokio::time::Instant::now();
        assert!(p.next().await);
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert!(p.next().await);
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        token.cancel();
        assert!(!p.next().await);
        assert_eq!(start.elapsed(), Duration::from_secs(10), "cancellation ends the wait at once");
    }
}
