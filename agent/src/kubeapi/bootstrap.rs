//! TLS bootstrap, as the kubelet's `--bootstrap-kubeconfig`: with the
//! bootstrap credentials, ask for a client certificate through a
//! CertificateSigningRequest (signer
//! `kubernetes.io/kube-apiserver-client-kubelet`, subject
//! `system:node:<name>` in `system:nodes`, ECDSA P-256: `certs::csr`),
//! wait until it is approved and issued, store key and certificate as
//! `<cert-dir>/kubelet-client-<time>.pem` with the
//! `kubelet-client-current.pem` link (`certs::store`), and write the
//! kubeconfig that uses them with the bootstrap kubeconfig's cluster.
//! Renewing it later is the client certificate manager's
//! (rotateCertificates, `certs::manager`).

use std::{path::Path, time::Duration};

use kube::config::{AuthInfo, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};
use tracing::info;

use super::{ApiError, client};
use crate::{
    certs::{
        csr::{self, Kind, KubeCsrApi, Template},
        store::FileStore,
    },
    host::write_private,
};

/// How long to wait for approval (the kubelet waits an hour).
const WAIT: Duration = Duration::from_secs(3600);

fn err(message: impl Into<String>) -> ApiError {
    ApiError::Bootstrap(message.into())
}

/// The kubeconfig for the issued certificate: the bootstrap kubeconfig's
/// current cluster, the certificate file as the user.
pub fn client_kubeconfig(bootstrap: &Kubeconfig, cert_file: &Path) -> Result<Kubeconfig, String> {
    let context_name = bootstrap.current_context.clone().ok_or("the bootstrap kubeconfig has no current-context")?;
    let context = bootstrap
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.clone())
        .ok_or_else(|| format!("the bootstrap kubeconfig has no context {context_name:?}"))?;
    let cluster = bootstrap
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .cloned()
        .ok_or_else(|| format!("the bootstrap kubeconfig has no cluster {:?}", context.cluster))?;
    let cert = cert_file.display().to_string();
    Ok(Kubeconfig {
        clusters: vec![NamedCluster {
            name: "default-cluster".into(),
            cluster: cluster.cluster,
            other: Default::default(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "default-auth".into(),
            auth_info: Some(AuthInfo {
                client_certificate: Some(cert.clone()),
                client_key: Some(cert),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: "default-context".into(),
            context: Some(Context {
                cluster: "default-cluster".into(),
                user: Some("default-auth".into()),
                namespace: Some("default".into()),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        current_context: Some("default-context".into()),
        kind: Some("Config".into()),
        api_version: Some("v1".into()),
        ..Default::default()
    })
}

/// Runs the bootstrap; on success `kubeconfig` exists.
pub async fn bootstrap(
    bootstrap_path: &Path,
    kubeconfig: &Path,
    cert_dir: &Path,
    node_name: &str,
) -> Result<(), ApiError> {
    info!(bootstrap = %bootstrap_path.display(), "no kubeconfig yet: requesting a client certificate");
    let bootstrap_kc = Kubeconfig::read_from(bootstrap_path)
        .map_err(|e| ApiError::Kubeconfig { path: bootstrap_path.to_owned(), message: e.to_string() })?;
    let client = client::client_from(client::load_kubeconfig(bootstrap_path).await?, 5, 10)?;
    let (cert_pem, key_pem) =
        csr::obtain(&KubeCsrApi(client), Kind::Client, &Template::node(node_name), Duration::from_secs(1), WAIT)
            .await
            .map_err(err)?;
    // The cert dir holds the private key: root-only, as the key file is.
    crate::host::ensure_private_dir(cert_dir).map_err(|e| err(format!("cannot create {}: {e}", cert_dir.display())))?;
    let store = FileStore::new(cert_dir, Kind::Client.prefix());
    let pair = store.update(&cert_pem, &key_pem, std::time::SystemTime::now()).map_err(err)?;
    let pem_file = pair.source;
    let current = store.current_path();
    let kc = client_kubeconfig(&bootstrap_kc, &current)
        .map_err(|e| ApiError::Kubeconfig { path: bootstrap_path.to_owned(), message: e })?;
    let text = serde_saphyr::to_string(&kc).map_err(|e| err(e.to_string()))?;
    if let Some(dir) = kubeconfig.parent() {
        std::fs::create_dir_all(dir).map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
    }
    write_private(kubeconfig, text.as_bytes())
        .map_err(|e| err(format!("cannot write {}: {e}", kubeconfig.display())))?;
    info!(kubeconfig = %kubeconfig.display(), certificate = %pem_file.display(), "client certificate issued");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_keeps_the_cluster() {
        let bootstrap: Kubeconfig = serde_saphyr::from_str(
            "apiVersion: v1\nkind: Config\ncurrent-context: boot\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority-data: Q0E=\ncontexts:\n- name: boot\n  context:\n    cluster: c\n    user: u\nusers:\n- name: u\n  user:\n    token: abc.def\n",
        )
        .unwrap();
        let kc = client_kubeconfig(&bootstrap, Path::new("/var/lib/kubelet/pki/kubelet-client-current.pem")).unwrap();
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://10.0.0.1:6443"));
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Q0E="));
        let user = kc.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(user.client_certificate.as_deref(), Some("/var/lib/kubelet/pki/kubelet-client-current.pem"));
        assert!(user.token.is_none(), "the bootstrap token is not kept");
        let broken: Kubeconfig = serde_saphyr::from_str("apiVersion: v1\nkind: Config\n").unwrap();
        assert!(client_kubeconfig(&broken, Path::new("/x")).is_err());
    }
}
