//! Container logs (the kubelet's containerLogManager): CRI log files
//! rotated by size, compressed, capped in number, and removed with their
//! container.
//!
//! How to construct and run:
//!
//! ```text
//! use swiftlet::logs::{ContainerLogManager, LogPolicy};
//! let logs = Arc::new(ContainerLogManager::new(cri.clone(), LogPolicy::from_kubelet(&config.kubelet))?);
//! tokio::spawn(logs.clone().run(shutdown.clone()));   // every 10 s
//! // Container GC calls logs.clean(container_id) before RemoveContainer.
//! ```

pub mod manager;
pub mod open;
pub mod rotation;

pub use manager::{ContainerLogManager, LOG_MONITOR_PERIOD, LogError, LogPolicy, RotationReport};
