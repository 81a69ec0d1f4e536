//! Certificates through CertificateSigningRequests, as client-go's
//! certificate manager and the kubelet's TLS bootstrap ask for them: an
//! ECDSA P-256 key generated here, a CSR with the node's identity
//! (`system:node:<name>` in `system:nodes`, and the node's addresses for a
//! serving certificate), the signer and usages of the kind, then waiting
//! for approval and the issued certificate.

use std::{net::IpAddr, time::Duration};

use async_trait::async_trait;
use k8s_openapi::{
    ByteString,
    api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use rcgen::{CertificateParams, DnType, KeyPair, SanType};

/// What a certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The node's client certificate (kubelet-client).
    Client,
    /// The :10250 serving certificate (kubelet-server).
    Serving,
}

impl Kind {
    pub fn signer(self) -> &'static str {
        match self {
            Kind::Client => "kubernetes.io/kube-apiserver-client-kubelet",
            Kind::Serving => "kubernetes.io/kubelet-serving",
        }
    }

    /// The usages for an ECDSA key (no key encipherment, as client-go's
    /// DefaultKubelet*GetUsages give them for non-RSA keys).
    pub fn usages(self) -> Vec<String> {
        let last = match self {
            Kind::Client => "client auth",
            Kind::Serving => "server auth",
        };
        vec!["digital signature".into(), last.into()]
    }

    /// The file store's prefix.
    pub fn prefix(self) -> &'static str {
        match self {
            Kind::Client => "kubelet-client",
            Kind::Serving => "kubelet-server",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Client => "client",
            Kind::Serving => "serving",
        }
    }
}

/// The subject and names a request asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Template {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
}

impl Template {
    /// The node's identity.
    pub fn node(node_name: &str) -> Template {
        Template {
            common_name: format!("system:node:{node_name}"),
            organizations: vec!["system:nodes".into()],
            ..Default::default()
        }
    }
}

/// The CSR's PEM and the private key's PEM.
pub fn request(t: &Template) -> Result<(String, String), String> {
    let key = KeyPair::generate().map_err(|e| format!("cannot generate a key: {e}"))?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    params.distinguished_name.push(DnType::CommonName, t.common_name.clone());
    for o in &t.organizations {
        params.distinguished_name.push(DnType::OrganizationName, o.clone());
    }
    for d in &t.dns_names {
        params.subject_alt_names.push(SanType::DnsName(d.clone().try_into().map_err(|e| format!("{d:?}: {e}"))?));
    }
    params.subject_alt_names.extend(t.ips.iter().map(|ip| SanType::IpAddress(*ip)));
    let csr = params.serialize_request(&key).map_err(|e| format!("cannot build the CSR: {e}"))?;
    Ok((csr.pem().map_err(|e| e.to_string())?, key.serialize_pem()))
}

/// What the status of a CSR says: issued (certificate PEM), refused, or
/// not yet.
pub fn outcome(csr: &CertificateSigningRequest) -> Result<Option<String>, String> {
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

/// The CertificateSigningRequest API (certificates.k8s.io/v1).
#[async_trait]
pub trait CsrApi: Send + Sync {
    /// Creates the request; returns its name.
    async fn create(&self, csr: &CertificateSigningRequest) -> Result<String, String>;
    async fn get(&self, name: &str) -> Result<CertificateSigningRequest, String>;
}

/// The API through a kube client.
pub struct KubeCsrApi(pub kube::Client);

#[async_trait]
impl CsrApi for KubeCsrApi {
    async fn create(&self, csr: &CertificateSigningRequest) -> Result<String, String> {
        let api: kube::Api<CertificateSigningRequest> = kube::Api::all(self.0.clone());
        let created = api
            .create(&kube::api::PostParams::default(), csr)
            .await
            .map_err(|e| format!("cannot create the certificate signing request: {e}"))?;
        Ok(created.metadata.name.unwrap_or_default())
    }

    async fn get(&self, name: &str) -> Result<CertificateSigningRequest, String> {
        let api: kube::Api<CertificateSigningRequest> = kube::Api::all(self.0.clone());
        api.get(name).await.map_err(|e| e.to_string())
    }
}

/// Asks for a certificate of `kind` for `template` and waits (polling
/// every `poll`, at most `wait`) until it is issued: (certificate PEM,
/// key PEM).
pub async fn obtain(
    api: &dyn CsrApi,
    kind: Kind,
    template: &Template,
    poll: Duration,
    wait: Duration,
) -> Result<(String, String), String> {
    let (csr_pem, key_pem) = request(template)?;
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta { generate_name: Some("csr-".into()), ..Default::default() },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.into_bytes()),
            signer_name: kind.signer().into(),
            usages: Some(kind.usages()),
            ..Default::default()
        },
        status: None,
    };
    let name = api.create(&csr).await?;
    tracing::info!(csr = name, signer = kind.signer(), "certificate signing request created; waiting for approval");
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match api.get(&name).await {
            Ok(c) => {
                if let Some(cert) = outcome(&c)? {
                    return Ok((cert, key_pem));
                }
            }
            Err(e) => tracing::debug!(csr = name, "waiting for the certificate: {e}"),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("the certificate signing request {name} was not issued within {wait:?}"));
        }
        tokio::time::sleep(poll).await;
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::certificates::v1::{CertificateSigningRequestCondition, CertificateSigningRequestStatus};

    use super::*;

    #[test]
    fn requests_carry_the_nodes_identity_and_names() {
        let mut t = Template::node("n1");
        t.dns_names = vec!["n1.example".into()];
        t.ips = vec!["10.0.0.5".parse().unwrap()];
        let (csr, key) = request(&t).unwrap();
        assert!(csr.starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
        assert!(key.contains("PRIVATE KEY"));
        let parsed = rcgen::CertificateSigningRequestParams::from_pem(&csr).unwrap();
        let sans = &parsed.params.subject_alt_names;
        assert!(sans.contains(&SanType::IpAddress("10.0.0.5".parse().unwrap())), "{sans:?}");
        assert_eq!(Kind::Serving.signer(), "kubernetes.io/kubelet-serving");
        assert_eq!(Kind::Client.usages(), vec!["digital signature".to_owned(), "client auth".to_owned()]);
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
        assert_eq!(outcome(&csr(vec![], None)), Ok(None));
        assert_eq!(outcome(&csr(vec![cond("Approved")], None)), Ok(None), "approved, not issued yet");
        assert_eq!(outcome(&csr(vec![cond("Approved")], Some("PEM"))), Ok(Some("PEM".into())));
        assert!(outcome(&csr(vec![cond("Denied")], None)).unwrap_err().contains("denied"));
        assert!(outcome(&csr(vec![cond("Approved"), cond("Failed")], None)).is_err());
    }
}
