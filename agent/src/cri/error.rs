//! CRI errors, and how the kubelet names them in pod status and events.

use thiserror::Error;

#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum CriError {
    /// The endpoint is not a unix socket address we can use.
    #[error("container runtime endpoint {endpoint:?}: {why}")]
    Endpoint { endpoint: String, why: String },
    /// The call did not finish within runtimeRequestTimeout.
    #[error("{call}: no answer from the container runtime within {timeout_secs}s")]
    Timeout { call: &'static str, timeout_secs: u64 },
    /// The runtime answered with a gRPC status (or could not be reached:
    /// code Unavailable).
    #[error("{call}: {code:?}: {message}")]
    Status { call: &'static str, code: tonic::Code, message: String },
}

impl CriError {
    pub fn status(call: &'static str, s: tonic::Status) -> CriError {
        CriError::Status { call, code: s.code(), message: s.message().to_owned() }
    }

    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            CriError::Status { code, .. } => Some(*code),
            CriError::Timeout { .. } => Some(tonic::Code::DeadlineExceeded),
            CriError::Endpoint { .. } => None,
        }
    }

    /// The object does not exist (already removed, or never created).
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(tonic::Code::NotFound)
    }

    /// The runtime could not be reached, or did not answer in time: a
    /// problem with the runtime itself, not with the request.
    pub fn is_unavailable(&self) -> bool {
        matches!(self.code(), Some(tonic::Code::Unavailable | tonic::Code::DeadlineExceeded))
            || matches!(self, CriError::Endpoint { .. })
    }

    /// The runtime's message, without the call name (for status messages).
    pub fn message(&self) -> String {
        match self {
            CriError::Status { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }
}

/// The reasons the kubelet reports in container status (waiting.reason) and
/// events when a runtime call fails; users alert on these strings.
pub mod reason {
    /// Building the container's config failed (bad env reference, missing
    /// configMap key, volume problems).
    pub const CREATE_CONTAINER_CONFIG_ERROR: &str = "CreateContainerConfigError";
    /// CreateContainer failed.
    pub const CREATE_CONTAINER_ERROR: &str = "CreateContainerError";
    /// StartContainer failed.
    pub const RUN_CONTAINER_ERROR: &str = "RunContainerError";
    pub const PRE_START_HOOK_ERROR: &str = "PreStartHookError";
    pub const POST_START_HOOK_ERROR: &str = "PostStartHookError";
    /// Waiting for the restart back-off.
    pub const CRASH_LOOP_BACK_OFF: &str = "CrashLoopBackOff";
    pub const CONTAINER_CREATING: &str = "ContainerCreating";
    pub const POD_INITIALIZING: &str = "PodInitializing";
    /// Terminated reasons.
    pub const COMPLETED: &str = "Completed";
    pub const ERROR: &str = "Error";
    pub const OOM_KILLED: &str = "OOMKilled";
    pub const CONTAINER_STATUS_UNKNOWN: &str = "ContainerStatusUnknown";
    /// Event reasons.
    pub const FAILED_CREATE_POD_SANDBOX: &str = "FailedCreatePodSandBox";
    /// The pod's cgroup could not be created or limited (the kubelet's
    /// FailedToCreatePodContainer event).
    pub const FAILED_CREATE_POD_CONTAINER: &str = "FailedCreatePodContainer";
    pub const FAILED_KILL_POD: &str = "FailedKillPod";
    pub const FAILED: &str = "Failed";
    pub const BACK_OFF: &str = "BackOff";
    pub const CREATED: &str = "Created";
    pub const STARTED: &str = "Started";
    pub const KILLING: &str = "Killing";
    pub const UNHEALTHY: &str = "Unhealthy";
    pub const SANDBOX_CHANGED: &str = "SandboxChanged";
    pub const FAILED_PRE_STOP_HOOK: &str = "FailedPreStopHook";
    pub const FAILED_POST_START_HOOK: &str = "FailedPostStartHook";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        let cases = [
            (CriError::Status { call: "x", code: tonic::Code::NotFound, message: "gone".into() }, true, false),
            (CriError::Status { call: "x", code: tonic::Code::Unavailable, message: "refused".into() }, false, true),
            (CriError::Timeout { call: "x", timeout_secs: 120 }, false, true),
            (CriError::Status { call: "x", code: tonic::Code::Unknown, message: "boom".into() }, false, false),
            (CriError::Endpoint { endpoint: "tcp://x".into(), why: "not unix".into() }, false, true),
        ];
        for (e, not_found, unavailable) in cases {
            assert_eq!(e.is_not_found(), not_found, "{e}");
            assert_eq!(e.is_unavailable(), unavailable, "{e}");
        }
    }

    #[test]
    fn message_drops_the_call_name() {
        let e =
            CriError::Status { call: "CreateContainer", code: tonic::Code::Unknown, message: "no such image".into() };
        assert_eq!(e.message(), "no such image");
        assert_eq!(e.to_string(), "CreateContainer: Unknown: no such image");
    }
}
