//! Garbage collection of dead containers, sandboxes and pod log
//! directories (the kubelet's containerGC), and the node-level disk
//! reclaim the eviction manager runs before evicting for disk pressure.
//!
//! How to construct and run:
//!
//! ```text
//! use swiftlet::gc::{ContainerGc, DiskReclaimer, GcPolicy};
//! // `pods` is the pod manager, which implements `ActivePods`.
//! let container_gc = Arc::new(
//!     ContainerGc::new(cri.clone(), pods.clone(), GcPolicy::default(), config.kubelet.pod_logs_dir.clone())
//!         .with_log_cleaner(logs.clone()),          // the ContainerLogManager
//! );
//! tokio::spawn(container_gc.clone().run(shutdown.clone()));   // every minute
//! let reclaimer = Arc::new(DiskReclaimer::new(container_gc, image_gc, imagefs_is_separate));
//! // pass `reclaimer` to EvictionManager::new as its NodeReclaimer
//! ```

pub mod collector;
pub mod plan;
pub mod reclaim;

pub use collector::{CONTAINER_GC_PERIOD, ContainerGc, ContainerGcReport, ContainerLogCleaner};
pub use plan::{ActivePods, GcPolicy};
pub use reclaim::{DiskReclaimer, ReclaimReport};
