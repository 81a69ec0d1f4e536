//! TLS bootstrap, as the kubelet's `--bootstrap-kubeconfig`: with the
//! bootstrap credentials, ask for a client certificate through a
//! CertificateSigningRequest (signer
//! `kubernetes.io/kube-apiserver-client-kubelet`, subject
//! `system:node:<name>` in `system:nodes`, ECDSA P-256), wait until it is
//! approved and issued, store key and certificate as
//! `<cert-dir>/kubelet-client-<time>.pem` with the
//! `kubelet-client-current.pem` link, and write the kubeconfig that uses
//! them with the bootstrap kubeconfig's cluster.
//!
//! Not done: certificate rotation before expiry (rotateCertificates) and
//! serving certificates (serverTLSBootstrap).

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use k8s_openapi::{
    ByteString,
    api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::config::{AuthInfo, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};
use rcgen::{CertificateParams, DnType, KeyPair};
use tracing::info;

use super::{ApiError, client};
use crate::host::write_private;

pub const SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// How long to wait for approval (the kubelet waits an hour).
const WAIT: Duration = Duration::from_secs(3600);

fn err(message: impl Into<String>) -> ApiError {
    ApiError::Bootstrap(message.into())
}

/// The CSR's PEM and the private key's PEM.
pub fn certificate_request(node_name: &str) -> Result<(String, String), ApiError> {
    let key = KeyPair::generate().map_err(|e| err(format!("cannot generate a key: {e}")))?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| err(e.to_string()))?;
    params.distinguished_name.push(DnType::CommonName, format!("system:node:{node_name}"));
    params.distinguished_name.push(DnType::OrganizationName, "system:nodes");
    let csr = params.serialize_request(&key).map_err(|e| err(format!("cannot build the CSR: {e}")))?;
    let pem = csr.pem().map_err(|e| err(e.to_string()))?;
    Ok((pem, key.serialize_pem()))
}

/// What the status of a CSR says: issued (certificate PEM), refused, or
/// not yet.
pub fn csr_outcome(csr: &CertificateSigningRequest) -> Result<Option<String>, String> {
    let status = csr.status.as_ref();
    for c in status.and_then(|s| s.conditions.as_ref()).into_iter().flatten() {
        if (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True" {
            return Err(format!(
                "the certificate signing request was {}: {} {}",
                c.type_.to_lowercase(),
                c.reason.as_deref().unwrap_or(""),
                c.message.as_deref().unwrap_or("")
            ));
        }
    }
    let approved = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Approved" && c.status == "True"));
    match status.and_then(|s| s.certificate.as_ref()) {
        Some(cert) if approved && !cert.0.is_empty() => Ok(Some(String::from_utf8_lossy(&cert.0).into_owned())),
        _ => Ok(None),
    }
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
    let (csr_pem, key_pem) = certificate_request(node_name)?;
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta { generate_name: Some("node-csr-".into()), ..Default::default() },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.into_bytes()),
            signer_name: SIGNER.into(),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            ..Default::default()
        },
        status: None,
    };
    let api: kube::Api<CertificateSigningRequest> = kube::Api::all(client);
    let created = api
        .create(&kube::api::PostParams::default(), &csr)
        .await
        .map_err(|e| err(format!("cannot create the certificate signing request: {e}")))?;
    let name = created.metadata.name.clone().unwrap_or_default();
    info!(csr = name, "certificate signing request created; waiting for approval");
    let deadline = Instant::now() + WAIT;
    let cert_pem = loop {
        match api.get(&name).await {
            Ok(c) => match csr_outcome(&c) {
                Ok(Some(cert)) => break cert,
                Ok(None) => {}
                Err(e) => return Err(err(e)),
            },
            Err(e) => tracing::debug!("waiting for the CSR: {e}"),
        }
        if Instant::now() > deadline {
            return Err(err(format!("the certificate signing request {name} was not approved within {WAIT:?}")));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    // The cert dir holds the private key: root-only, as the key file is.
    crate::host::ensure_private_dir(cert_dir).map_err(|e| err(format!("cannot create {}: {e}", cert_dir.display())))?;
    let stamp = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%d-%H-%M-%S").to_string();
    let pem_file = cert_dir.join(format!("kubelet-client-{stamp}.pem"));
    write_private(&pem_file, format!("{cert_pem}{key_pem}").as_bytes())
        .map_err(|e| err(format!("cannot write {}: {e}", pem_file.display())))?;
    let current = cert_dir.join("kubelet-client-current.pem");
    let link_tmp: PathBuf = cert_dir.join("kubelet-client-current.pem.tmp");
    let _ = std::fs::remove_file(&link_tmp);
    std::os::unix::fs::symlink(&pem_file, &link_tmp)
        .and_then(|_| std::fs::rename(&link_tmp, &current))
        .map_err(|e| err(format!("cannot link {}: {e}", current.display())))?;
    let kc = client_kubeconfig(&bootstrap_kc, &current)
        .map_err(|e| ApiError::Kubeconfig { path: bootstrap_path.to_owned(), message: e })?;
    let text = serde_yaml::to_string(&kc).map_err(|e| err(e.to_string()))?;
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
    use k8s_openapi::api::certificates::v1::{CertificateSigningRequestCondition, CertificateSigningRequestStatus};

    use super::*;

    #[test]
    fn the_request_names_the_node() {
        let (csr, key) = certificate_request("n1").unwrap();
        assert!(csr.starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
        assert!(key.contains("PRIVATE KEY"));
    }

    #[test]
    fn outcomes() {
        let cond = |t: &str| CertificateSigningRequestCondition {
            type_: t.into(),
            status: "True".into(),
            ..Default::default()
        };
        let csr = |conds: Vec<CertificateSigningRequestCondition>, cert: Option<&str>| CertificateSigningRequest {
            status: Some(CertificateSigningRequestStatus {
                conditions: Some(conds),
                certificate: cert.map(|c| ByteString(c.as_bytes().to_vec())),
            }),
            ..Default::default()
        };
        assert_eq!(csr_outcome(&csr(vec![], None)), Ok(None));
        assert_eq!(csr_outcome(&csr(vec![cond("Approved")], None)), Ok(None), "approved, not issued yet");
        assert_eq!(csr_outcome(&csr(vec![cond("Approved")], Some("PEM"))), Ok(Some("PEM".into())));
        assert!(csr_outcome(&csr(vec![cond("Denied")], None)).unwrap_err().contains("denied"));
        assert!(csr_outcome(&csr(vec![cond("Approved"), cond("Failed")], None)).is_err());
    }

    #[test]
    fn kubeconfig_keeps_the_cluster() {
        let bootstrap: Kubeconfig = serde_yaml::from_str(
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
        let broken: Kubeconfig = serde_yaml::from_str("apiVersion: v1\nkind: Config\n").unwrap();
        assert!(client_kubeconfig(&broken, Path::new("/x")).is_err());
    }
}
