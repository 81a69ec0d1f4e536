//! Reloading (SIGHUP): the live fields of a new configuration take
//! effect, the others are reported as needing a restart.

use std::sync::Arc;

use tokio::sync::watch;
use tracing::{info, warn};

use crate::{
    config::Config,
    reload::{self, ConfigDiff, LiveSettings},
};

use super::{
    Agent, LogLevelHook,
    build::{admission_capacity, eviction_config},
};

impl Agent {
    /// Settings that change with a reload (node status frequencies, log
    /// verbosity), for the API side.
    pub fn live_settings(&self) -> watch::Receiver<LiveSettings> {
        self.live.subscribe()
    }

    /// How a reload changes the log verbosity (the binary's subscriber).
    pub fn set_log_level_hook(&self, hook: LogLevelHook) {
        *self.log_level.lock() = Some(hook);
    }

    /// The configuration in effect.
    pub fn running_config(&self) -> Config {
        (**self.running.borrow()).clone()
    }

    /// The configuration in effect, as it changes (for /configz).
    pub fn running_configs(&self) -> watch::Receiver<Arc<Config>> {
        self.running.subscribe()
    }

    /// Applies a newly loaded configuration (SIGHUP): the live fields take
    /// effect, the others are reported as needing a restart. Pods are not
    /// touched.
    pub fn reload(&self, new: Config) -> ConfigDiff {
        // One reload at a time: the signal handler is the only caller.
        let running = self.running_config();
        let diff = reload::diff(&running, &new);
        if diff.is_empty() {
            info!("configuration reloaded: nothing changed");
            return diff;
        }
        let next = reload::apply_live(&running, &new);
        let mut allocatable = self.live.borrow().allocatable.clone();
        if diff.eviction_changed() {
            self.eviction.reconfigure(eviction_config(&next.kubelet));
            // Node allocatable subtracts the hard memory threshold: node
            // status and pod admission follow.
            let alloc = reload::allocatable(&self.allocatable.capacity, &next);
            let a = &alloc.allocatable;
            self.pods.set_capacity(admission_capacity(a));
            allocatable = Some(crate::node::resource_strings(a));
        }
        if next.kubelet.logging.verbosity != running.kubelet.logging.verbosity
            && let Some(hook) = self.log_level.lock().as_ref()
        {
            hook(next.kubelet.logging.verbosity);
        }
        self.live.send_if_modified(|l| {
            let want = LiveSettings { allocatable: allocatable.clone(), ..LiveSettings::of(&next) };
            let changed = *l != want;
            *l = want;
            changed
        });
        if !diff.applied.is_empty() {
            info!(fields = ?diff.applied, "configuration reloaded: applied");
        }
        if !diff.needs_restart.is_empty() {
            warn!(fields = ?diff.needs_restart, "configuration reloaded: these changes need a restart and are not applied");
        }
        self.running.send_replace(Arc::new(next));
        diff
    }
}
