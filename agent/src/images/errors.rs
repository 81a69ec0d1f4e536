//! The kubelet's image reasons (container `waiting.reason`) and how a
//! failed pull is classified.

use std::fmt;

use crate::cri::CriError;

/// The six reasons a container waits on its image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ImageErrorReason {
    /// The name does not parse as an image reference; nothing was pulled.
    InvalidImageName,
    /// imagePullPolicy Never and the image is not present.
    ErrImageNeverPull,
    /// The pull failed.
    ErrImagePull,
    /// A pull failed recently and the back-off has not expired.
    ImagePullBackOff,
    /// The pull failed because the registry could not be reached.
    RegistryUnavailable,
    /// The runtime could not tell whether the image is present
    /// (ImageStatus failed).
    ImageInspectError,
}

impl ImageErrorReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ImageErrorReason::InvalidImageName => "InvalidImageName",
            ImageErrorReason::ErrImageNeverPull => "ErrImageNeverPull",
            ImageErrorReason::ErrImagePull => "ErrImagePull",
            ImageErrorReason::ImagePullBackOff => "ImagePullBackOff",
            ImageErrorReason::RegistryUnavailable => "RegistryUnavailable",
            ImageErrorReason::ImageInspectError => "ImageInspectError",
        }
    }
}

impl fmt::Display for ImageErrorReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a container's image is not ready: `reason` goes to
/// `state.waiting.reason`, `message` to `state.waiting.message`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct ImageError {
    pub reason: ImageErrorReason,
    pub message: String,
}

impl ImageError {
    pub fn new(reason: ImageErrorReason, message: impl Into<String>) -> ImageError {
        ImageError { reason, message: message.into() }
    }
}

/// A CRI error as the kubelet's remote client turns it into a Go error:
/// the bare message for code Unknown (the runtime's own words), else
/// `rpc error: code = X desc = Y`.
pub fn go_error_string(e: &CriError) -> String {
    match e {
        CriError::Status { code: tonic::Code::Unknown, message, .. } => message.clone(),
        CriError::Status { code, message, .. } => format!("rpc error: code = {code:?} desc = {message}"),
        CriError::Timeout { .. } => "rpc error: code = DeadlineExceeded desc = context deadline exceeded".into(),
        CriError::Endpoint { .. } => e.to_string(),
    }
}

/// The prefix the CRI error convention (`cri-api/pkg/errors`) gives a pull
/// error when the registry is down; CRI-O uses it.
const REGISTRY_UNAVAILABLE_PREFIX: &str = "RegistryUnavailable";

/// Transport failures reaching a registry, in Go's net/http wording, as
/// containerd passes them through (`failed to do request: Head "...":
/// dial tcp 127.0.0.1:5000: connect: connection refused`). The registry
/// never answered, so the image itself may be fine.
const UNREACHABLE: &[&str] = &[
    "connect: connection refused",
    "no such host",
    "server misbehaving",
    "i/o timeout",
    "connect: network is unreachable",
    "connect: no route to host",
    "connection reset by peer",
    "TLS handshake timeout",
    "502 Bad Gateway",
    "503 Service Unavailable",
    "504 Gateway Timeout",
];

/// Classifies a failed PullImage of `image` (as the user wrote it) into
/// ErrImagePull or RegistryUnavailable, with the kubelet's message
/// (`evalCRIPullErr`).
///
/// Upstream recognises RegistryUnavailable only by the runtime's message
/// prefix; containerd 1.6/1.7 never uses it and reports an unreachable
/// registry as a generic pull error. swiftlet also classifies the
/// transport failures above as RegistryUnavailable, so "the registry is
/// down" and "the image does not exist" are told apart on containerd too
/// (pulling from a closed port gives `connect: connection refused`).
pub fn classify_pull_error(image: &str, e: &CriError) -> ImageError {
    let text = go_error_string(e);
    if let Some(rest) = text.strip_prefix(REGISTRY_UNAVAILABLE_PREFIX) {
        return ImageError::new(
            ImageErrorReason::RegistryUnavailable,
            format!("image pull failed for {image} because the registry is unavailable{rest}"),
        );
    }
    let runtime_says = e.message();
    let x509 = runtime_says.contains("x509:") || runtime_says.contains("tls: ");
    // Unavailable or a timeout is the runtime itself not answering, not
    // the registry.
    if !e.is_unavailable() && !x509 && UNREACHABLE.iter().any(|p| runtime_says.contains(p)) {
        return ImageError::new(
            ImageErrorReason::RegistryUnavailable,
            format!("image pull failed for {image} because the registry is unavailable: {text}"),
        );
    }
    ImageError::new(ImageErrorReason::ErrImagePull, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: tonic::Code, message: &str) -> CriError {
        CriError::Status { call: "PullImage", code, message: message.into() }
    }

    #[test]
    fn classification() {
        use ImageErrorReason::*;
        let refused = "failed to pull and unpack image \"127.0.0.1:40325/x:1\": failed to resolve reference \"127.0.0.1:40325/x:1\": failed to do request: Head \"http://127.0.0.1:40325/v2/x/manifests/1\": dial tcp 127.0.0.1:40325: connect: connection refused";
        let dns = "failed to pull and unpack image \"docker.io/library/busybox:latest\": failed to resolve reference \"docker.io/library/busybox:latest\": failed to do request: Head \"https://registry-1.docker.io/v2/library/busybox/manifests/latest\": dial tcp: lookup registry-1.docker.io on 10.255.255.53:53: no such host";
        let not_found = "failed to pull and unpack image \"127.0.0.1:5000/nope:1\": failed to resolve reference \"127.0.0.1:5000/nope:1\": 127.0.0.1:5000/nope:1: not found";
        let x509 = "failed to do request: Head \"https://r.example/v2/\": tls: failed to verify certificate: x509: certificate signed by unknown authority";
        let cases: Vec<(CriError, ImageErrorReason, String)> = vec![
            (status(tonic::Code::Unknown, refused), RegistryUnavailable, format!("image pull failed for x because the registry is unavailable: {refused}")),
            (status(tonic::Code::Unknown, dns), RegistryUnavailable, format!("image pull failed for x because the registry is unavailable: {dns}")),
            (status(tonic::Code::Unknown, not_found), ErrImagePull, not_found.to_owned()),
            (status(tonic::Code::Unknown, x509), ErrImagePull, x509.to_owned()),
            // CRI-O's convention, as upstream recognises it.
            (status(tonic::Code::Unknown, "RegistryUnavailable: registry.example is down"), RegistryUnavailable, "image pull failed for x because the registry is unavailable: registry.example is down".into()),
            // The runtime itself unreachable is not the registry.
            (status(tonic::Code::Unavailable, "connection error: dial unix /run/c.sock: connect: connection refused"), ErrImagePull, "rpc error: code = Unavailable desc = connection error: dial unix /run/c.sock: connect: connection refused".into()),
            (CriError::Timeout { call: "PullImage", timeout_secs: 1800 }, ErrImagePull, "rpc error: code = DeadlineExceeded desc = context deadline exceeded".into()),
        ];
        for (e, reason, message) in cases {
            let got = classify_pull_error("x", &e);
            assert_eq!(got, ImageError::new(reason, message), "{e}");
        }
    }
}
