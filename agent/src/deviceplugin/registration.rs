//! The Registration service on `<root-dir>/device-plugins/kubelet.sock`:
//! request validation (pure, the kubelet's checks and wording) and the
//! gRPC server. What a valid request leads to is the [`Registrar`]'s.

use std::{future::Future, path::Path, sync::Arc};

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use super::{CHECKPOINT_FILE, VERSION, api};

/// Acts on a registration that passed [`validate`].
pub trait Registrar: Send + Sync + 'static {
    fn register(&self, request: api::RegisterRequest);
}

/// The kubelet's checks of a RegisterRequest.
pub fn validate(r: &api::RegisterRequest) -> Result<(), String> {
    if r.version != VERSION {
        return Err(format!(
            "requested API version {:?} is not supported by kubelet. Supported versions are [{VERSION:?}]",
            r.version
        ));
    }
    if !is_extended_resource_name(&r.resource_name) {
        return Err(format!("the ResourceName {:?} is invalid", r.resource_name));
    }
    let e = &r.endpoint;
    if e.is_empty() || e.contains('/') || e == "." || e == ".." || e == super::KUBELET_SOCKET || e == CHECKPOINT_FILE {
        return Err(format!(
            "invalid endpoint {e:?}: it must name the plugin's socket file in the device plugin directory"
        ));
    }
    Ok(())
}

/// `v1helper.IsExtendedResourceName`: `<domain>/<name>` outside the
/// kubernetes.io domains, whose quota name `requests.<it>` is a
/// qualified name.
pub fn is_extended_resource_name(name: &str) -> bool {
    let Some((prefix, base)) = name.split_once('/') else { return false };
    if prefix == "kubernetes.io" || prefix.ends_with(".kubernetes.io") || name.starts_with("requests.") {
        return false;
    }
    let subdomain_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    let base_ok = !base.is_empty()
        && base.len() <= 63
        && base.bytes().all(|b| alnum(b) || b == b'-' || b == b'_' || b == b'.')
        && base.bytes().next().is_some_and(alnum)
        && base.bytes().last().is_some_and(alnum);
    prefix.len() <= 253 && prefix.split('.').all(subdomain_label) && base_ok
}

struct Service(Arc<dyn Registrar>);

#[tonic::async_trait]
impl api::registration_server::Registration for Service {
    async fn register(&self, request: Request<api::RegisterRequest>) -> Result<Response<api::Empty>, Status> {
        let r = request.into_inner();
        tracing::info!(
            resource = r.resource_name,
            endpoint = r.endpoint,
            version = r.version,
            "device plugin registration"
        );
        if let Err(e) = validate(&r) {
            tracing::warn!(resource = r.resource_name, "device plugin registration refused: {e}");
            return Err(Status::invalid_argument(e));
        }
        self.0.register(r);
        Ok(Response::new(api::Empty {}))
    }
}

/// Removes what a previous agent left in the device plugin directory
/// (every file but the checkpoint; directories stay), as the kubelet does
/// at start: plugins see their socket go and register again.
pub fn remove_stale(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut removed = vec![];
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name == CHECKPOINT_FILE || e.file_type()?.is_dir() {
            continue;
        }
        std::fs::remove_file(e.path())?;
        removed.push(name);
    }
    Ok(removed)
}

/// Serves Registration on `listener` until `shutdown` completes.
pub async fn serve(
    listener: UnixListener,
    registrar: Arc<dyn Registrar>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_service(api::registration_server::RegistrationServer::new(Service(registrar)))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(version: &str, resource: &str, endpoint: &str) -> api::RegisterRequest {
        api::RegisterRequest {
            version: version.into(),
            endpoint: endpoint.into(),
            resource_name: resource.into(),
            options: None,
        }
    }

    #[test]
    fn validation_table() {
        let cases = [
            ("v1beta1", "example.com/foo", "foo.sock", None),
            ("v1beta1", "nvidia.com/gpu", "nvidia-gpu.sock", None),
            ("v1beta1", "a.b-c.io/x_y.z", "p.sock", None),
            (
                "v1alpha",
                "example.com/foo",
                "foo.sock",
                Some(
                    r#"requested API version "v1alpha" is not supported by kubelet. Supported versions are ["v1beta1"]"#,
                ),
            ),
            (
                "",
                "example.com/foo",
                "foo.sock",
                Some(r#"requested API version "" is not supported by kubelet. Supported versions are ["v1beta1"]"#),
            ),
            ("v1beta1", "foo", "foo.sock", Some(r#"the ResourceName "foo" is invalid"#)),
            ("v1beta1", "kubernetes.io/foo", "foo.sock", Some(r#"the ResourceName "kubernetes.io/foo" is invalid"#)),
            (
                "v1beta1",
                "x.kubernetes.io/foo",
                "foo.sock",
                Some(r#"the ResourceName "x.kubernetes.io/foo" is invalid"#),
            ),
            ("v1beta1", "Example.com/foo", "foo.sock", Some(r#"the ResourceName "Example.com/foo" is invalid"#)),
            ("v1beta1", "example.com/-foo", "foo.sock", Some(r#"the ResourceName "example.com/-foo" is invalid"#)),
            ("v1beta1", "example.com/", "foo.sock", Some(r#"the ResourceName "example.com/" is invalid"#)),
            ("v1beta1", "example.com/a/b", "foo.sock", Some(r#"the ResourceName "example.com/a/b" is invalid"#)),
            (
                "v1beta1",
                "example.com/foo",
                "../foo.sock",
                Some(
                    r#"invalid endpoint "../foo.sock": it must name the plugin's socket file in the device plugin directory"#,
                ),
            ),
            (
                "v1beta1",
                "example.com/foo",
                "kubelet.sock",
                Some(
                    r#"invalid endpoint "kubelet.sock": it must name the plugin's socket file in the device plugin directory"#,
                ),
            ),
        ];
        for (version, resource, endpoint, want) in cases {
            let got = validate(&req(version, resource, endpoint)).err();
            assert_eq!(got.as_deref(), want, "{version} {resource} {endpoint}");
        }
    }

    #[test]
    fn stale_files_go_but_the_checkpoint_and_directories_stay() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["kubelet.sock", "old-plugin.sock", CHECKPOINT_FILE] {
            std::fs::write(dir.path().join(f), "").unwrap();
        }
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let mut removed = remove_stale(dir.path()).unwrap();
        removed.sort();
        assert_eq!(removed, vec!["kubelet.sock", "old-plugin.sock"]);
        assert!(dir.path().join(CHECKPOINT_FILE).exists() && dir.path().join("sub").is_dir());
    }
}
