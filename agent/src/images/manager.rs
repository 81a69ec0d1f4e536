//! The image manager: makes sure a container's image is present before
//! the container is created, as the kubelet's `EnsureImageExists`.
//!
//! Order of checks (each outcome is the kubelet's reason and event):
//! 1. the name parses (else InvalidImageName, event InspectFailed, no
//!    runtime call at all);
//! 2. ImageStatus answers (else ImageInspectError, event InspectFailed);
//! 3. the pull policy says whether to pull (Never and absent:
//!    ErrImageNeverPull; present and no pull needed: event Pulled
//!    "already present");
//! 4. no back-off is pending for this pod and image (else
//!    ImagePullBackOff, event BackOff, with the last pull error);
//! 5. the pull, serialized or parallel per config and throttled by
//!    registryPullQPS (event Pulling, then Pulled with the duration and
//!    size, or Failed and ErrImagePull / RegistryUnavailable, which starts
//!    or doubles the back-off: 10 s doubling to 5 min per pod and image).

use std::{collections::HashMap, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::{Container, ObjectReference, Pod};
use parking_lot::Mutex;
use tokio::{
    sync::{Semaphore, SemaphorePermit},
    time::Instant,
};
use tracing::{info, warn};

use super::{
    credentials::PullCredentials,
    errors::{ImageError, ImageErrorReason, classify_pull_error},
    metrics::ImageMetrics,
    policy::PullPolicy,
    reference::with_default_tag,
};
use crate::{
    config::KubeletConfiguration,
    cri::{CriError, ImageService, api},
    events::{EventRecorder, EventType, pod_ref},
    flowcontrol::{Backoff, BackoffPolicy, TokenBucket},
};

/// Event reasons (pkg/kubelet/events).
pub mod event {
    pub const PULLING: &str = "Pulling";
    pub const PULLED: &str = "Pulled";
    pub const FAILED: &str = "Failed";
    pub const INSPECT_FAILED: &str = "InspectFailed";
    pub const ERR_IMAGE_NEVER_PULL: &str = "ErrImageNeverPull";
    pub const BACK_OFF: &str = "BackOff";
    pub const FAILED_TO_RETRIEVE_IMAGE_PULL_SECRET: &str = "FailedToRetrieveImagePullSecret";
}

/// The runtime's id of a present image (`sha256:...`): what CreateContainer
/// is given and what `containerStatuses[].imageID` reports.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ImageRef(pub String);

impl ImageRef {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ImageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageManagerConfig {
    /// serializeImagePulls: one pull at a time, in arrival order.
    pub serialize_image_pulls: bool,
    /// maxParallelImagePulls when not serialized (None: unlimited).
    pub max_parallel_image_pulls: Option<u32>,
    /// registryPullQPS (0: no limit) and registryBurst.
    pub registry_pull_qps: u32,
    pub registry_burst: u32,
    /// The pull back-off: 10 s doubling to 300 s in the kubelet.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
}

impl Default for ImageManagerConfig {
    fn default() -> Self {
        ImageManagerConfig {
            serialize_image_pulls: true,
            max_parallel_image_pulls: None,
            registry_pull_qps: 5,
            registry_burst: 10,
            backoff_initial: Duration::from_secs(10),
            backoff_max: Duration::from_secs(300),
        }
    }
}

impl ImageManagerConfig {
    pub fn from_kubelet(k: &KubeletConfiguration) -> ImageManagerConfig {
        ImageManagerConfig {
            serialize_image_pulls: k.serialize_image_pulls,
            max_parallel_image_pulls: k.max_parallel_image_pulls,
            registry_pull_qps: k.registry_pull_qps,
            registry_burst: k.registry_burst,
            ..Default::default()
        }
    }
}

enum PullSlots {
    /// The kubelet's serial puller: one at a time, first come first served
    /// (tokio's semaphore is fair).
    Serial(Semaphore),
    Limited(Semaphore),
    Unlimited,
}

impl PullSlots {
    async fn acquire(&self) -> Option<SemaphorePermit<'_>> {
        match self {
            PullSlots::Serial(s) | PullSlots::Limited(s) => s.acquire().await.ok(),
            PullSlots::Unlimited => None,
        }
    }
}

struct PullState {
    backoff: Backoff,
    /// The last pull error per back-off key, shown while backing off.
    prev_error: HashMap<String, String>,
    throttle: TokenBucket,
}

/// Construct once per agent and share (`Arc`); every pod worker calls
/// [`ImageManager::ensure_image`] before CreateContainer:
///
/// ```text
/// let images = Arc::new(ImageManager::new(
///     agent.cri.clone(),                                  // Arc<dyn ImageService>
///     recorder.clone(),                                   // Arc<dyn EventRecorder>
///     ImageManagerConfig::from_kubelet(&config.kubelet),
/// ));
/// let image_ref = images.ensure_image(&pod, &container, Some(&sandbox_config)).await?;
/// // CreateContainer with ImageSpec { image: image_ref.0, user_specified_image: container.image }
/// ```
pub struct ImageManager {
    service: Arc<dyn ImageService>,
    recorder: Arc<dyn EventRecorder>,
    slots: PullSlots,
    state: Mutex<PullState>,
    metrics: Option<ImageMetrics>,
    /// Pull secrets, the node's Docker config and credential providers.
    credentials: Option<Arc<PullCredentials>>,
}

/// An ObjectReference to `container` of `pod` for events, with the
/// kubelet's fieldPath (`spec.containers{name}`, `spec.initContainers{name}`
/// or `spec.ephemeralContainers{name}`).
pub fn container_ref(pod: &Pod, container_name: &str) -> ObjectReference {
    let mut r = pod_ref(pod);
    let spec = pod.spec.as_ref();
    let field =
        if spec.and_then(|s| s.init_containers.as_ref()).is_some_and(|c| c.iter().any(|c| c.name == container_name)) {
            "initContainers"
        } else if spec
            .and_then(|s| s.ephemeral_containers.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.name == container_name))
        {
            "ephemeralContainers"
        } else {
            "containers"
        };
    r.field_path = Some(format!("spec.{field}{{{container_name}}}"));
    r
}

/// A CRI error as Go's gRPC status prints it (`rpc error: code = X desc = Y`).
fn grpc_error_string(e: &CriError) -> String {
    match e {
        CriError::Status { code, message, .. } => format!("rpc error: code = {code:?} desc = {message}"),
        CriError::Timeout { .. } => "rpc error: code = DeadlineExceeded desc = context deadline exceeded".into(),
        CriError::Endpoint { .. } => e.to_string(),
    }
}

/// A duration as Go prints one truncated to milliseconds: `0s`, `850ms`,
/// `1.5s`, `2m3.25s`, `1h0m5s`.
pub fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let (s, frac) = (rest / 1000, rest % 1000);
    let mut secs = s.to_string();
    if frac > 0 {
        let f = format!("{frac:03}");
        secs.push('.');
        secs.push_str(f.trim_end_matches('0'));
    }
    match (h, m) {
        (0, 0) => format!("{secs}s"),
        (0, m) => format!("{m}m{secs}s"),
        (h, m) => format!("{h}h{m}m{secs}s"),
    }
}

impl ImageManager {
    pub fn new(
        service: Arc<dyn ImageService>,
        recorder: Arc<dyn EventRecorder>,
        cfg: ImageManagerConfig,
    ) -> ImageManager {
        let slots = if cfg.serialize_image_pulls {
            PullSlots::Serial(Semaphore::new(1))
        } else {
            match cfg.max_parallel_image_pulls {
                Some(n) if n > 0 => PullSlots::Limited(Semaphore::new(n as usize)),
                _ => PullSlots::Unlimited,
            }
        };
        ImageManager {
            service,
            recorder,
            slots,
            state: Mutex::new(PullState {
                backoff: Backoff::new(BackoffPolicy { initial: cfg.backoff_initial, max: cfg.backoff_max }),
                prev_error: HashMap::new(),
                throttle: TokenBucket::new(f64::from(cfg.registry_pull_qps), cfg.registry_burst),
            }),
            metrics: None,
            credentials: None,
        }
    }

    /// Pulls with the credentials `credentials` finds for each pod.
    pub fn with_credentials(mut self, credentials: Arc<PullCredentials>) -> ImageManager {
        self.credentials = Some(credentials);
        self
    }

    /// The CRI credentials to try for a pull, in order (none: pull
    /// without); Err when a pull secret is broken.
    async fn pull_auths(&self, pod: &Pod, obj: &ObjectReference, image: &str) -> Result<Vec<api::AuthConfig>, String> {
        let Some(creds) = &self.credentials else { return Ok(vec![]) };
        let repository =
            super::reference::Reference::parse(image).map(|r| r.name()).unwrap_or_else(|_| image.to_owned());
        let found = creds.lookup(pod, &repository).await?;
        if !found.missing_secrets.is_empty() {
            let msg = format!(
                "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                found.missing_secrets.join(", ")
            );
            self.event(&pod_ref(pod), EventType::Warning, event::FAILED_TO_RETRIEVE_IMAGE_PULL_SECRET, &msg);
        }
        for e in &found.plugin_errors {
            warn!(image, field = obj.field_path.as_deref().unwrap_or(""), "{e}");
        }
        Ok(found.auth_configs())
    }

    /// Observes pull durations and counts into `metrics`.
    pub fn with_metrics(mut self, metrics: ImageMetrics) -> ImageManager {
        self.metrics = Some(metrics);
        self
    }

    fn event(&self, r: &ObjectReference, t: EventType, reason: &str, message: &str) {
        let pod = format!("{}/{}", r.namespace.as_deref().unwrap_or_default(), r.name.as_deref().unwrap_or_default());
        match t {
            EventType::Normal => info!(pod, field = r.field_path.as_deref().unwrap_or(""), reason, "{message}"),
            EventType::Warning => warn!(pod, field = r.field_path.as_deref().unwrap_or(""), reason, "{message}"),
        }
        self.recorder.record(r, t, reason, message);
    }

    /// Makes sure `container`'s image is present, pulling it if its policy
    /// says so. `sandbox_config` is passed to PullImage (runtimes use it
    /// for per-pod pull settings).
    pub async fn ensure_image(
        &self,
        pod: &Pod,
        container: &Container,
        sandbox_config: Option<&api::PodSandboxConfig>,
    ) -> Result<ImageRef, ImageError> {
        self.ensure_image_status(pod, container, sandbox_config).await.map(|(r, _)| r)
    }

    /// [`ImageManager::ensure_image`] with the runtime's record of the
    /// image (its user, for runAsNonRoot), when the runtime gave one.
    pub async fn ensure_image_status(
        &self,
        pod: &Pod,
        container: &Container,
        sandbox_config: Option<&api::PodSandboxConfig>,
    ) -> Result<(ImageRef, Option<api::Image>), ImageError> {
        let obj = container_ref(pod, &container.name);
        let requested = container.image.as_deref().unwrap_or("");
        let image = match with_default_tag(requested) {
            Ok(i) => i,
            Err(e) => {
                let msg = format!(
                    "Failed to apply default image tag {requested:?}: couldn't parse image name {requested:?}: {e}"
                );
                self.event(&obj, EventType::Warning, event::INSPECT_FAILED, &msg);
                return Err(ImageError::new(ImageErrorReason::InvalidImageName, msg));
            }
        };
        let present = match self.service.image_status(&image).await {
            Ok(status) => status,
            Err(e) => {
                let msg = format!("Failed to inspect image {image:?}: {}", grpc_error_string(&e));
                self.event(&obj, EventType::Warning, event::INSPECT_FAILED, &msg);
                return Err(ImageError::new(ImageErrorReason::ImageInspectError, msg));
            }
        };
        let policy = PullPolicy::effective(container.image_pull_policy.as_deref(), requested);
        if !policy.should_pull(present.is_some()) {
            return match present {
                Some(status) => {
                    let msg = format!("Container image {requested:?} already present on machine");
                    self.event(&obj, EventType::Normal, event::PULLED, &msg);
                    Ok((ImageRef(status.id.clone()), Some(status)))
                }
                None => {
                    let msg = format!("Container image {requested:?} is not present with pull policy of Never");
                    self.event(&obj, EventType::Warning, event::ERR_IMAGE_NEVER_PULL, &msg);
                    Err(ImageError::new(ImageErrorReason::ErrImageNeverPull, msg))
                }
            };
        }

        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let key = format!("{uid}_{image}");
        {
            let st = self.state.lock();
            if st.backoff.in_backoff(&key, Instant::now().into_std()) {
                let msg = format!("Back-off pulling image {requested:?}");
                self.event(&obj, EventType::Normal, event::BACK_OFF, &msg);
                let full = match st.prev_error.get(&key) {
                    Some(prev) => format!("{msg}: {prev}"),
                    None => msg,
                };
                return Err(ImageError::new(ImageErrorReason::ImagePullBackOff, full));
            }
        }

        let auths = match self.pull_auths(pod, &obj, &image).await {
            Ok(a) => a,
            Err(why) => {
                let msg = format!("Failed to pull image {requested:?}: {why}");
                self.event(&obj, EventType::Warning, event::FAILED, &msg);
                return Err(ImageError::new(ImageErrorReason::ErrImagePull, why));
            }
        };
        self.event(&obj, EventType::Normal, event::PULLING, &format!("Pulling image {requested:?}"));
        let waiting_since = Instant::now();
        let result = {
            let _slot = self.slots.acquire().await;
            let started = Instant::now();
            let throttled = !self.state.lock().throttle.try_accept();
            let r =
                if throttled { Err(None) } else { self.pull_with(&image, auths, sandbox_config).await.map_err(Some) };
            r.map(|id| (id, started.elapsed()))
        };
        let now = Instant::now();
        match result {
            Ok((image_ref, pull_time)) => {
                let status = self.service.image_status(&image_ref).await.ok().flatten();
                let size = status.as_ref().map_or(0, |i| i.size);
                let total = waiting_since.elapsed();
                self.event(
                    &obj,
                    EventType::Normal,
                    event::PULLED,
                    &format!(
                        "Successfully pulled image {requested:?} in {} ({} including waiting). Image size: {size} bytes.",
                        go_duration(pull_time),
                        go_duration(total)
                    ),
                );
                if let Some(m) = &self.metrics {
                    m.observe_pull(size, total);
                }
                let mut st = self.state.lock();
                st.backoff.gc(now.into_std());
                st.prev_error.remove(&key);
                Ok((ImageRef(image_ref), status))
            }
            Err(e) => {
                let (raw, err) = match e {
                    Some(e) => (super::errors::go_error_string(&e), classify_pull_error(requested, &e)),
                    // The kubelet's throttled image service.
                    None => (
                        "pull QPS exceeded".to_owned(),
                        ImageError::new(ImageErrorReason::ErrImagePull, "pull QPS exceeded"),
                    ),
                };
                self.event(
                    &obj,
                    EventType::Warning,
                    event::FAILED,
                    &format!("Failed to pull image {requested:?}: {raw}"),
                );
                let mut st = self.state.lock();
                st.backoff.next(&key, now.into_std());
                st.prev_error.insert(key, format!("{}: {}", err.reason, err.message));
                Err(err)
            }
        }
    }

    /// Pulls with each credential in turn until one works (without any
    /// when there are none), as the kubelet; the last failure is the one
    /// reported.
    async fn pull_with(
        &self,
        image: &str,
        auths: Vec<api::AuthConfig>,
        sandbox: Option<&api::PodSandboxConfig>,
    ) -> Result<String, CriError> {
        let attempts: Vec<Option<api::AuthConfig>> =
            if auths.is_empty() { vec![None] } else { auths.into_iter().map(Some).collect() };
        let mut last = None;
        for auth in attempts {
            match self.service.pull_image(image, auth, sandbox.cloned()).await {
                Ok(id) => return Ok(id),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    /// When the pull of `container`'s image for `pod` may be tried again,
    /// if it is backing off (the pod worker can wake up then).
    pub fn retry_at(&self, pod: &Pod, container: &Container) -> Option<Instant> {
        let image = with_default_tag(container.image.as_deref().unwrap_or("")).ok()?;
        let key = format!("{}_{image}", pod.metadata.uid.as_deref().unwrap_or_default());
        self.state.lock().backoff.retry_at(&key, Instant::now().into_std()).map(Instant::from_std)
    }
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
