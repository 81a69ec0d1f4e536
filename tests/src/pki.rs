//! Test certificate authorities and client certificates (rcgen).

use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::https::Identity;

pub struct TestCa {
    pub pem: String,
    cert: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

fn dn(cn: &str, orgs: &[&str]) -> DistinguishedName {
    let mut d = DistinguishedName::new();
    d.push(DnType::CommonName, cn);
    for o in orgs {
        d.push(DnType::OrganizationName, *o);
    }
    d
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let key = KeyPair::generate().expect("CA key");
        let mut p = CertificateParams::default();
        p.distinguished_name = dn(name, &[]);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let cert = p.self_signed(&key).expect("CA certificate");
        TestCa { pem: cert.pem(), cert: cert.der().clone(), issuer: Issuer::new(p, key) }
    }

    pub fn write(&self, path: &Path) {
        std::fs::write(path, &self.pem).expect("write the CA file");
    }

    /// A client certificate for user `cn` in groups `orgs`.
    pub fn client(&self, cn: &str, orgs: &[&str]) -> Identity {
        let key = KeyPair::generate().expect("client key");
        let mut p = CertificateParams::default();
        p.distinguished_name = dn(cn, orgs);
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = p.signed_by(&key, &self.issuer).expect("client certificate");
        Identity {
            chain: vec![cert.der().clone(), self.cert.clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        }
    }

    /// The same as PEM files (for Prometheus): (cert, key).
    pub fn client_pem(&self, cn: &str, orgs: &[&str]) -> (String, String) {
        let key = KeyPair::generate().expect("client key");
        let mut p = CertificateParams::default();
        p.distinguished_name = dn(cn, orgs);
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = p.signed_by(&key, &self.issuer).expect("client certificate");
        (cert.pem(), key.serialize_pem())
    }
}
