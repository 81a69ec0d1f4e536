//! The serving certificate and the TLS configuration of :10250.
//!
//! As the kubelet: `--tls-cert-file`/`--tls-private-key-file` when given;
//! otherwise `kubelet.crt`/`kubelet.key` in `--cert-dir`, generated on first
//! start as a self-signed pair (a throwaway CA `<host>-ca@<time>` signing
//! `<host>@<time>`, valid one year, as client-go's
//! GenerateSelfSignedCertKey) and reused on later starts.
//!
//! Client certificates are *requested*, never required, and the handshake
//! accepts any chain whose owner proves its key: like Go's
//! `tls.RequestClientCert`, verification against `--client-ca-file` is the
//! x509 authenticator's job, so a bad certificate gets the kubelet's 401
//! rather than a failed handshake.

use std::{
    fs,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use parking_lot::{Mutex, RwLock};
use rustls::{
    CipherSuite, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
    SupportedCipherSuite,
    client::danger::HandshakeSignatureValid,
    crypto::{CryptoProvider, WebPkiSupportedAlgorithms, ring},
    pki_types::{CertificateDer, PrivateKeyDer, UnixTime, pem::PemObject},
    server::{
        ResolvesServerCert, WebPkiClientVerifier,
        danger::{ClientCertVerified, ClientCertVerifier},
    },
    sign::CertifiedKey,
};
use thiserror::Error;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Error)]
pub enum TlsError {
    #[error("{path}: {why}")]
    File { path: PathBuf, why: String },
    #[error("{field}: {why}")]
    Config { field: &'static str, why: String },
    #[error("generating the self-signed serving certificate: {0}")]
    Generate(String),
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

fn file_err(path: &Path, why: impl std::fmt::Display) -> TlsError {
    TlsError::File { path: path.to_owned(), why: why.to_string() }
}

/// The crypto provider every TLS piece of the agent uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

/// Makes ring the process-wide default, for libraries that build their own
/// rustls configurations (the kube client). Harmless when already set.
pub fn install_default_provider() {
    let _ = ring::default_provider().install_default();
}

/// A certificate chain and its key.
#[derive(Debug)]
pub struct ServingCert {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// Where it came from, for the log.
    pub source: String,
}

pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = fs::read(path).map_err(|e| file_err(path, e))?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(file_err(path, "no CERTIFICATE block in the file"));
    }
    Ok(certs)
}

pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = fs::read(path).map_err(|e| file_err(path, e))?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| file_err(path, format!("no usable private key: {e}")))
}

/// The serving certificate: the configured files, or the self-signed pair
/// in `cert_dir` (generated when missing) for `host`.
pub fn serving_cert(
    cert_file: Option<&Path>,
    key_file: Option<&Path>,
    cert_dir: &Path,
    host: &str,
) -> Result<ServingCert, TlsError> {
    match (cert_file, key_file) {
        (Some(c), Some(k)) => Ok(ServingCert {
            chain: read_certs(c)?,
            key: read_key(k)?,
            source: format!("{} (--tls-cert-file)", c.display()),
        }),
        (Some(_), None) => {
            Err(TlsError::Config { field: "tlsPrivateKeyFile", why: "must be set together with tlsCertFile".into() })
        }
        (None, Some(_)) => {
            Err(TlsError::Config { field: "tlsCertFile", why: "must be set together with tlsPrivateKeyFile".into() })
        }
        (None, None) => {
            let crt = cert_dir.join("kubelet.crt");
            let key = cert_dir.join("kubelet.key");
            if crt.exists() && key.exists() {
                return Ok(ServingCert {
                    chain: read_certs(&crt)?,
                    key: read_key(&key)?,
                    source: format!("{} (self-signed, reused)", crt.display()),
                });
            }
            let (crt_pem, key_pem) = self_signed(host, SystemTime::now())?;
            fs::create_dir_all(cert_dir).map_err(|e| file_err(cert_dir, e))?;
            // The pair is reused only when both files exist: the key goes
            // first and the certificate last, with no certificate in place
            // meanwhile, so a crash in between never leaves a certificate
            // beside a key that is not its own.
            match fs::remove_file(&crt) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(file_err(&crt, e)),
                _ => {}
            }
            write_file(&key, key_pem.as_bytes(), 0o600)?;
            write_file(&crt, crt_pem.as_bytes(), 0o644)?;
            Ok(ServingCert {
                chain: read_certs(&crt)?,
                key: read_key(&key)?,
                source: format!("{} (self-signed, generated)", crt.display()),
            })
        }
    }
}

fn write_file(path: &Path, data: &[u8], mode: u32) -> Result<(), TlsError> {
    crate::host::write_atomic(path, data, mode).map_err(|e| file_err(path, e))
}

/// A CA and a serving certificate it signed, as client-go's
/// GenerateSelfSignedCertKey makes them: (certificate chain PEM, key PEM).
pub fn self_signed(host: &str, now: SystemTime) -> Result<(String, String), TlsError> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
        SanType,
    };
    let g = |e: rcgen::Error| TlsError::Generate(e.to_string());
    let stamp = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let since_epoch = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    let not_before = epoch + since_epoch(now - Duration::from_secs(3600));
    let not_after = epoch + since_epoch(now + Duration::from_secs(365 * 24 * 3600));

    let ca_key = KeyPair::generate().map_err(g)?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name = rcgen::DistinguishedName::new();
    ca.distinguished_name.push(DnType::CommonName, format!("{host}-ca@{stamp}"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca_cert = ca.self_signed(&ca_key).map_err(g)?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate().map_err(g)?;
    let mut leaf = CertificateParams::default();
    leaf.distinguished_name = rcgen::DistinguishedName::new();
    leaf.distinguished_name.push(DnType::CommonName, format!("{host}@{stamp}"));
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.subject_alt_names = vec![match host.parse::<std::net::IpAddr>() {
        Ok(ip) => SanType::IpAddress(ip),
        Err(_) => SanType::DnsName(host.try_into().map_err(g)?),
    }];
    leaf.not_before = not_before;
    leaf.not_after = not_after;
    let leaf_cert = leaf.signed_by(&key, &issuer).map_err(g)?;
    Ok((format!("{}{}", leaf_cert.pem(), ca_cert.pem()), key.serialize_pem()))
}

/// Trust anchors from `--client-ca-file`.
pub fn client_ca(path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in read_certs(path)? {
        roots.add(c).map_err(|e| file_err(path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(Arc::new(roots))
}

/// `--client-ca-file`, followed: the file is read again when it changes
/// (as the kubelet's dynamic CA content), and a file that no longer parses
/// leaves the last good one in effect.
pub struct ClientCa {
    pub path: PathBuf,
    state: RwLock<(Arc<RootCertStore>, Arc<dyn ClientCertVerifier>)>,
    content: Mutex<Vec<u8>>,
    changed: watch::Sender<u64>,
}

impl std::fmt::Debug for ClientCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCa").field("path", &self.path).finish()
    }
}

impl ClientCa {
    pub fn load(path: &Path) -> Result<Arc<ClientCa>, TlsError> {
        let content = fs::read(path).map_err(|e| file_err(path, e))?;
        let roots = client_ca(path)?;
        let verifier = client_chain_verifier(roots.clone())?;
        Ok(Arc::new(ClientCa {
            path: path.to_owned(),
            state: RwLock::new((roots, verifier)),
            content: Mutex::new(content),
            changed: watch::channel(0).0,
        }))
    }

    pub fn roots(&self) -> Arc<RootCertStore> {
        self.state.read().0.clone()
    }

    pub fn verifier(&self) -> Arc<dyn ClientCertVerifier> {
        self.state.read().1.clone()
    }

    /// Bumped at each change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Reads the file again; Ok(true) when it changed and now applies.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let content = fs::read(&self.path).map_err(|e| file_err(&self.path, e))?;
        if *self.content.lock() == content {
            return Ok(false);
        }
        let roots = client_ca(&self.path)?;
        let verifier = client_chain_verifier(roots.clone())?;
        *self.state.write() = (roots, verifier);
        *self.content.lock() = content;
        self.changed.send_modify(|g| *g += 1);
        Ok(true)
    }

    /// Looks at the file every `period` until `shutdown`.
    pub async fn watch(self: Arc<Self>, period: Duration, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = shutdown.cancelled() => return,
            }
            match self.reload() {
                Ok(true) => tracing::info!(file = %self.path.display(), "client CA reloaded"),
                Ok(false) => {}
                Err(e) => tracing::warn!("client CA not reloaded, the previous one stays: {e}"),
            }
        }
    }
}

/// How often `--client-ca-file` is looked at.
pub const CLIENT_CA_CHECK: Duration = Duration::from_secs(5);

/// The serving certificate resolver for fixed files or a self-signed pair.
pub fn fixed_resolver(cert: ServingCert) -> Result<Arc<dyn ResolvesServerCert>, TlsError> {
    let key = CertifiedKey::from_der(cert.chain, cert.key, &ring::default_provider())?;
    Ok(Arc::new(crate::certs::ServingResolver::new(Some(Arc::new(key)))))
}

/// Verifies client certificate chains against the client CA, with the key
/// usage for client authentication (what the x509 authenticator calls).
pub fn client_chain_verifier(roots: Arc<RootCertStore>) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    WebPkiClientVerifier::builder_with_provider(roots, provider())
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::Config { field: "authentication.x509.clientCAFile", why: e.to_string() })
}

/// Asks for a client certificate and checks the client holds its key, but
/// leaves the chain to the authenticator (Go's RequestClientCert).
#[derive(Debug)]
struct RequestClientCert {
    hints: Vec<DistinguishedName>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Go's names for the cipher suites rustls implements (TLS 1.2 and 1.3).
fn suite_by_go_name(name: &str) -> Option<CipherSuite> {
    Some(match name {
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" => CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" => CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384" => CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384" => CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305" | "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256" => {
            CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        }
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305" | "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256" => {
            CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
        }
        "TLS_AES_128_GCM_SHA256" => CipherSuite::TLS13_AES_128_GCM_SHA256,
        "TLS_AES_256_GCM_SHA384" => CipherSuite::TLS13_AES_256_GCM_SHA384,
        "TLS_CHACHA20_POLY1305_SHA256" => CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
        _ => return None,
    })
}

/// The cipher suites for `tlsCipherSuites` (Go names). As in Go, the list
/// restricts TLS 1.2; TLS 1.3's suites are always on.
pub fn cipher_suites(names: &[String]) -> Result<Vec<SupportedCipherSuite>, TlsError> {
    let all = ring::default_provider().cipher_suites;
    if names.is_empty() {
        return Ok(all);
    }
    let mut wanted = vec![];
    for n in names {
        match suite_by_go_name(n) {
            Some(s) => wanted.push(s),
            None => {
                return Err(TlsError::Config {
                    field: "tlsCipherSuites",
                    why: format!(
                        "{n:?} is not supported (supported: TLS_ECDHE_{{ECDSA,RSA}}_WITH_AES_{{128_GCM_SHA256,256_GCM_SHA384}}, TLS_ECDHE_{{ECDSA,RSA}}_WITH_CHACHA20_POLY1305_SHA256)"
                    ),
                });
            }
        }
    }
    Ok(all.into_iter().filter(|s| matches!(s, SupportedCipherSuite::Tls13(_)) || wanted.contains(&s.suite())).collect())
}

/// The protocol versions for `tlsMinVersion` (VersionTLS10..VersionTLS13).
/// TLS 1.0 and 1.1 are not offered at all, which is stricter than asked.
pub fn protocol_versions(min: Option<&str>) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, TlsError> {
    match min.unwrap_or("") {
        "" | "VersionTLS10" | "VersionTLS11" | "VersionTLS12" => {
            Ok(vec![&rustls::version::TLS13, &rustls::version::TLS12])
        }
        "VersionTLS13" => Ok(vec![&rustls::version::TLS13]),
        other => Err(TlsError::Config {
            field: "tlsMinVersion",
            why: format!("{other:?} is not one of VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13"),
        }),
    }
}

/// The rustls server configuration of :10250.
pub fn server_config(
    cert: Arc<dyn ResolvesServerCert>,
    client_ca: Option<&RootCertStore>,
    suites: &[String],
    min_version: Option<&str>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let mut p = ring::default_provider();
    p.cipher_suites = cipher_suites(suites)?;
    let algorithms = p.signature_verification_algorithms;
    let builder =
        ServerConfig::builder_with_provider(Arc::new(p)).with_protocol_versions(&protocol_versions(min_version)?)?;
    let builder = match client_ca {
        Some(roots) => {
            builder.with_client_cert_verifier(Arc::new(RequestClientCert { hints: roots.subjects(), algorithms }))
        }
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder.with_cert_resolver(cert);
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_pair_is_generated_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let first = serving_cert(None, None, dir.path(), "node-a").unwrap();
        assert!(first.source.contains("generated"), "{}", first.source);
        assert_eq!(first.chain.len(), 2, "leaf and its CA");
        let mode = |p: &str| {
            use std::os::unix::fs::PermissionsExt;
            fs::metadata(dir.path().join(p)).unwrap().permissions().mode() & 0o777
        };
        assert_eq!(mode("kubelet.key"), 0o600);
        assert_eq!(mode("kubelet.crt"), 0o644);
        let again = serving_cert(None, None, dir.path(), "node-a").unwrap();
        assert!(again.source.contains("reused"), "{}", again.source);
        assert_eq!(again.chain, first.chain);
        let (_, leaf) = x509_parser::parse_x509_certificate(&first.chain[0]).unwrap();
        let cn = leaf.subject().iter_common_name().next().unwrap().as_str().unwrap().to_owned();
        assert!(cn.starts_with("node-a@"), "{cn}");
        let (_, ca) = x509_parser::parse_x509_certificate(&first.chain[1]).unwrap();
        assert!(ca.subject().iter_common_name().next().unwrap().as_str().unwrap().starts_with("node-a-ca@"));
        assert_eq!(leaf.issuer(), ca.subject());
        // A configuration builds from it.
        server_config(fixed_resolver(first).unwrap(), None, &[], None).unwrap();
    }

    #[test]
    fn mismatched_or_bad_files_name_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let e = serving_cert(Some(Path::new("/x.crt")), None, dir.path(), "n").unwrap_err();
        assert_eq!(e.to_string(), "tlsPrivateKeyFile: must be set together with tlsCertFile");
        let bad = dir.path().join("bad.crt");
        fs::write(&bad, "hello").unwrap();
        let e = serving_cert(Some(&bad), Some(&bad), dir.path(), "n").unwrap_err();
        assert!(e.to_string().starts_with(&format!("{}: ", bad.display())), "{e}");
        let e = client_ca(Path::new("/nonexistent/ca.crt")).unwrap_err();
        assert!(e.to_string().starts_with("/nonexistent/ca.crt: "), "{e}");
    }

    #[test]
    fn the_client_ca_follows_its_file_and_keeps_the_last_good_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        let ca = |cn: &str| {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut p = rcgen::CertificateParams::default();
            p.distinguished_name.push(rcgen::DnType::CommonName, cn);
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            p.self_signed(&key).unwrap().pem()
        };
        fs::write(&path, ca("first")).unwrap();
        let c = ClientCa::load(&path).unwrap();
        let subject = |c: &ClientCa| c.roots().subjects()[0].as_ref().to_vec();
        let first = subject(&c);
        let mut changes = c.subscribe();
        assert!(!c.reload().unwrap(), "unchanged");
        fs::write(&path, ca("second")).unwrap();
        assert!(c.reload().unwrap());
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        assert_ne!(subject(&c), first);
        let second = subject(&c);
        fs::write(&path, "not a certificate").unwrap();
        assert!(c.reload().is_err());
        assert_eq!(subject(&c), second, "the last good CA stays");
        assert!(!changes.has_changed().unwrap());
    }

    #[test]
    fn cipher_suites_and_versions() {
        let s = cipher_suites(&["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into()]).unwrap();
        assert!(s.iter().any(|s| s.suite() == CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256));
        assert!(!s.iter().any(|s| s.suite() == CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384));
        assert!(s.iter().any(|s| matches!(s, SupportedCipherSuite::Tls13(_))));
        let e = cipher_suites(&["TLS_RSA_WITH_RC4_128_SHA".into()]).unwrap_err();
        assert!(e.to_string().starts_with("tlsCipherSuites: \"TLS_RSA_WITH_RC4_128_SHA\" is not supported"), "{e}");
        assert_eq!(protocol_versions(Some("VersionTLS13")).unwrap().len(), 1);
        assert_eq!(protocol_versions(None).unwrap().len(), 2);
        assert!(protocol_versions(Some("TLS1.2")).unwrap_err().to_string().starts_with("tlsMinVersion: "));
    }
}
