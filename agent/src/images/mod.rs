//! Images: reference parsing and normalization, pull policies, the image
//! manager that ensures a container's image before it is created (with the
//! kubelet's six reasons, events and pull back-off), and image garbage
//! collection.
//!
//! How to construct and run (the composition root wires these):
//!
//! ```text
//! use swiftlet::images::{ImageManager, ImageManagerConfig, ImageGc, ImageGcPolicy, ImageMetrics};
//! let metrics = ImageMetrics::register(&mut registry);
//! // Shared by every pod worker: `ensure_image` before CreateContainer.
//! let images = Arc::new(
//!     ImageManager::new(cri.clone(), recorder.clone(), ImageManagerConfig::from_kubelet(&config.kubelet))
//!         .with_metrics(metrics.clone()),
//! );
//! // Image GC every 5 minutes; also called by the disk-pressure reclaimer.
//! let image_gc = Arc::new(
//!     ImageGc::new(cri.clone(), cri.clone(), ImageGcPolicy::from_kubelet(&config.kubelet, vec![sandbox_image]),
//!                  recorder.clone(), node_ref)
//!         .with_metrics(metrics),
//! );
//! tokio::spawn(image_gc.clone().run(shutdown.clone()));
//! ```
//!
//! How each reason is produced against the real containerd 1.6 here
//! (tests/tests/images.rs does each):
//! - InvalidImageName: a name the reference grammar rejects (`Busybox`,
//!   `busybox:`); no runtime call is made.
//! - ErrImageNeverPull: imagePullPolicy Never and an absent image.
//! - ErrImagePull: a registry that answers but has no such image (the
//!   test's own registry on 127.0.0.1, which containerd reaches over plain
//!   HTTP as it does for localhost), or any other pull failure.
//! - ImagePullBackOff: the next attempt within the back-off after a failed
//!   pull (no PullImage is sent).
//! - RegistryUnavailable: the registry cannot be reached at all, such as a
//!   pull from `127.0.0.1:<closed port>` (containerd: `dial tcp ...:
//!   connect: connection refused`), see [`errors::classify_pull_error`].
//! - ImageInspectError: ImageStatus itself fails. containerd answers
//!   ImageStatus from its in-memory CRI image store, so deleting content
//!   blobs (`ctr content rm`) does not make it fail (checked here: the
//!   status still answers, only later store updates fail). What does fail
//!   is a name that containerd resolves as an ambiguous short image id:
//!   for an image `sha256:<p>` (a valid reference: repository `sha256`,
//!   tag `<p>`), containerd looks `<p>` up as an id prefix, and when two
//!   image ids start with `<p>` it answers `can not resolve "sha256:<p>"
//!   locally: ambiguous digest string`.

pub mod collector;
pub mod credentials;
pub mod errors;
pub mod gc;
pub mod manager;
pub mod metrics;
pub mod policy;
pub mod reference;

pub use collector::{ImageGc, ImageGcError, ImageGcReport};
pub use errors::{ImageError, ImageErrorReason};
pub use gc::ImageGcPolicy;
pub use manager::{ImageManager, ImageManagerConfig, ImageRef, container_ref};
pub use metrics::ImageMetrics;
pub use policy::PullPolicy;
pub use reference::Reference;
