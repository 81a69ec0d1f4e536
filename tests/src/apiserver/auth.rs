//! What the fake answers for authentication and authorization: token →
//! user mappings (TokenReview, and who a bearer token belongs to), ordered
//! access rules (SubjectAccessReview), and the certificate authority that
//! serves TLS and signs CertificateSigningRequests.

use std::collections::BTreeMap;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use serde_json::{Value, json};

/// A user as TokenReview reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    pub fn new(username: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            username: username.into(),
            uid: String::new(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }
}

/// One authorization rule; `None` fields match anything. The first rule
/// that matches a request decides.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccessRule {
    pub user: Option<String>,
    pub group: Option<String>,
    pub verb: Option<String>,
    /// The resource (`nodes`), for resource requests.
    pub resource: Option<String>,
    pub subresource: Option<String>,
    /// The path (`/metrics`), for non-resource requests.
    pub path: Option<String>,
    pub allow: bool,
}

impl AccessRule {
    pub fn allow() -> AccessRule {
        AccessRule { allow: true, ..Default::default() }
    }

    pub fn deny() -> AccessRule {
        AccessRule::default()
    }

    pub fn user(mut self, u: &str) -> AccessRule {
        self.user = Some(u.into());
        self
    }

    pub fn group(mut self, g: &str) -> AccessRule {
        self.group = Some(g.into());
        self
    }

    pub fn verb(mut self, v: &str) -> AccessRule {
        self.verb = Some(v.into());
        self
    }

    pub fn resource(mut self, r: &str) -> AccessRule {
        self.resource = Some(r.into());
        self
    }

    pub fn subresource(mut self, s: &str) -> AccessRule {
        self.subresource = Some(s.into());
        self
    }

    pub fn path(mut self, p: &str) -> AccessRule {
        self.path = Some(p.into());
        self
    }

    /// What a real cluster allows without any binding: everything to the
    /// `system:masters` group (RBAC's superusers: kubeadm's admin and the
    /// API server's kubelet client). The binary checks it after the rules
    /// it is given, so its own kubeconfig's admin can use the kubelet API
    /// (`kubectl logs`, `get --raw …/proxy/…`) through the webhooks.
    pub fn superusers() -> AccessRule {
        AccessRule::allow().group("system:masters")
    }

    /// `allow|deny:user=<u>,group=<g>,verb=<v>,resource=<r>,subresource=<s>,path=<p>`
    /// (for the binary's --rule flag).
    pub fn parse(s: &str) -> Result<AccessRule, String> {
        let (effect, rest) = s.split_once(':').unwrap_or((s, ""));
        let mut r = match effect {
            "allow" => AccessRule::allow(),
            "deny" => AccessRule::deny(),
            other => return Err(format!("rule {s:?}: expected allow or deny, got {other:?}")),
        };
        for kv in rest.split(',').filter(|x| !x.is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| format!("rule {s:?}: expected key=value, got {kv:?}"))?;
            let v = Some(v.to_owned());
            match k {
                "user" => r.user = v,
                "group" => r.group = v,
                "verb" => r.verb = v,
                "resource" => r.resource = v,
                "subresource" => r.subresource = v,
                "path" => r.path = v,
                other => return Err(format!("rule {s:?}: unknown key {other:?}")),
            }
        }
        Ok(r)
    }

    fn matches(&self, review: &Value) -> bool {
        let spec = &review["spec"];
        let user = spec["user"].as_str().unwrap_or("");
        let groups: Vec<&str> =
            spec["groups"].as_array().map(|g| g.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        let (verb, resource, subresource, path) = if let Some(ra) = spec.get("resourceAttributes") {
            (
                ra["verb"].as_str().unwrap_or(""),
                ra["resource"].as_str().unwrap_or(""),
                ra["subresource"].as_str().unwrap_or(""),
                None,
            )
        } else {
            let na = &spec["nonResourceAttributes"];
            (na["verb"].as_str().unwrap_or(""), "", "", na["path"].as_str())
        };
        let eq = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == "*" || w == have);
        eq(&self.user, user)
            && self.group.as_deref().is_none_or(|g| groups.contains(&g))
            && eq(&self.verb, verb)
            && eq(&self.resource, resource)
            && eq(&self.subresource, subresource)
            && self.path.as_deref().is_none_or(|p| path == Some(p))
    }
}

#[derive(Clone, Debug, Default)]
pub struct AuthConfig {
    pub tokens: BTreeMap<String, UserInfo>,
    pub rules: Vec<AccessRule>,
}

impl AuthConfig {
    /// Answers a TokenReview (the request body) with its status filled in.
    pub fn token_review(&self, mut review: Value) -> Value {
        let token = review.pointer("/spec/token").and_then(Value::as_str).unwrap_or("");
        review["status"] = match self.tokens.get(token) {
            Some(u) => json!({
                "authenticated": true,
                "user": {"username": u.username, "uid": u.uid, "groups": u.groups},
                "audiences": review.pointer("/spec/audiences").cloned().unwrap_or(json!([])),
            }),
            None => json!({"authenticated": false, "error": "invalid bearer token"}),
        };
        review
    }

    /// Answers a SubjectAccessReview: the first matching rule decides;
    /// nothing matching is "no opinion" (not allowed).
    pub fn access_review(&self, mut review: Value) -> Value {
        review["status"] = match self.rules.iter().position(|r| r.matches(&review)) {
            Some(i) if self.rules[i].allow => json!({"allowed": true, "reason": format!("allowed by rule {i}")}),
            Some(i) => json!({"allowed": false, "denied": true, "reason": format!("denied by rule {i}")}),
            None => json!({"allowed": false, "reason": "no rule allows it"}),
        };
        review
    }
}

/// The fake's certificate authority and its serving certificate.
pub struct Pki {
    pub ca_pem: String,
    ca: Issuer<'static, KeyPair>,
    pub server_cert_pem: String,
    pub server_key_pem: String,
}

impl Pki {
    pub fn generate() -> Result<Pki, rcgen::Error> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.distinguished_name.push(DnType::CommonName, "fake-apiserver-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let ca = Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate()?;
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned()])?;
        params.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server = params.signed_by(&server_key, &ca)?;
        Ok(Pki { ca_pem: ca_cert.pem(), ca, server_cert_pem: server.pem(), server_key_pem: server_key.serialize_pem() })
    }

    /// Issues a client certificate (for tests that authenticate with one).
    pub fn client_cert(&self, user: &str, groups: &[&str]) -> Result<(String, String), rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        for g in groups {
            params.distinguished_name.push(DnType::OrganizationName, *g);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.ca)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Signs a PEM CSR as the kube-apiserver-client-kubelet signer would:
    /// client auth, the subject of the request.
    pub fn sign_csr(&self, csr_pem: &str) -> Result<String, rcgen::Error> {
        self.sign_csr_for(csr_pem, false, std::time::Duration::from_secs(365 * 24 * 3600))
    }

    /// Signs a PEM CSR for a client (kube-apiserver-client-kubelet) or a
    /// server (kubelet-serving: server auth, the request's names), valid
    /// for `lifetime` from now (backdated a second, as signers allow for
    /// clock skew).
    pub fn sign_csr_for(
        &self,
        csr_pem: &str,
        serving: bool,
        lifetime: std::time::Duration,
    ) -> Result<String, rcgen::Error> {
        let mut req = CertificateSigningRequestParams::from_pem(csr_pem)?;
        req.params.extended_key_usages =
            vec![if serving { ExtendedKeyUsagePurpose::ServerAuth } else { ExtendedKeyUsagePurpose::ClientAuth }];
        req.params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        req.params.is_ca = IsCa::NoCa;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let epoch = rcgen::date_time_ymd(1970, 1, 1);
        req.params.not_before = epoch + now.saturating_sub(std::time::Duration::from_secs(1));
        req.params.not_after = epoch + now + lifetime;
        Ok(req.signed_by(&self.ca)?.pem())
    }
}

/// The user a client certificate names and its expiry.
pub(crate) fn peer_from_cert(der: &[u8]) -> Option<super::server::Peer> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let t = cert.validity().not_after.timestamp().max(0) as u64;
    Some(super::server::Peer {
        user: user_from_cert(der)?,
        not_after: std::time::UNIX_EPOCH + std::time::Duration::from_secs(t),
    })
}

/// The user a client certificate names: CN, and O as groups.
pub fn user_from_cert(der: &[u8]) -> Option<UserInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let cn = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
    let groups = subject.iter_organization().filter_map(|o| o.as_str().ok().map(str::to_owned)).collect();
    Some(UserInfo { username: cn, uid: String::new(), groups })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sar(user: &str, groups: &[&str], verb: &str, resource: &str, sub: &str) -> Value {
        json!({"spec": {"user": user, "groups": groups, "resourceAttributes": {"verb": verb, "resource": resource, "subresource": sub}}})
    }

    #[test]
    fn access_rules_first_match_decides() {
        let cfg = AuthConfig {
            tokens: BTreeMap::new(),
            rules: vec![
                AccessRule::deny().user("mallory"),
                AccessRule::allow().group("system:masters"),
                AccessRule::allow().user("alice").resource("nodes").subresource("metrics"),
                AccessRule::parse("allow:user=bob,verb=get,resource=nodes,subresource=proxy").unwrap(),
            ],
        };
        let allowed = |v: Value| cfg.access_review(v)["status"]["allowed"].as_bool().unwrap();
        assert!(!allowed(sar("mallory", &["system:masters"], "get", "nodes", "metrics")));
        assert!(allowed(sar("root", &["system:masters"], "delete", "pods", "")));
        assert!(allowed(sar("alice", &[], "get", "nodes", "metrics")));
        assert!(!allowed(sar("alice", &[], "get", "nodes", "proxy")));
        assert!(allowed(sar("bob", &[], "get", "nodes", "proxy")));
        assert!(!allowed(sar("bob", &[], "create", "nodes", "proxy")));
        let np = json!({"spec": {"user": "carol", "nonResourceAttributes": {"verb": "get", "path": "/metrics"}}});
        assert!(!allowed(np.clone()));
        let cfg2 = AuthConfig { rules: vec![AccessRule::allow().user("carol").path("/metrics")], ..Default::default() };
        assert!(cfg2.access_review(np)["status"]["allowed"].as_bool().unwrap());
        assert!(AccessRule::parse("maybe:user=x").is_err());
        assert!(AccessRule::parse("allow:colour=red").is_err());
    }

    #[test]
    fn token_reviews() {
        let mut cfg = AuthConfig::default();
        cfg.tokens.insert("t1".into(), UserInfo::new("alice", &["devs"]));
        let r = cfg.token_review(json!({"spec": {"token": "t1"}}));
        assert_eq!(r["status"]["authenticated"], true);
        assert_eq!(r["status"]["user"]["username"], "alice");
        assert_eq!(r["status"]["user"]["groups"], json!(["devs"]));
        assert_eq!(cfg.token_review(json!({"spec": {"token": "nope"}}))["status"]["authenticated"], false);
    }

    #[test]
    fn signs_csrs_and_client_certs() {
        let pki = Pki::generate().unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, "system:node:n1");
        params.distinguished_name.push(DnType::OrganizationName, "system:nodes");
        let csr = params.serialize_request(&key).unwrap().pem().unwrap();
        let cert = pki.sign_csr(&csr).unwrap();
        let der = rustls::pki_types::pem::PemObject::from_pem_slice(cert.as_bytes())
            .map(|c: rustls::pki_types::CertificateDer<'static>| c.to_vec())
            .unwrap();
        let u = user_from_cert(&der).unwrap();
        assert_eq!(u.username, "system:node:n1");
        assert_eq!(u.groups, vec!["system:nodes".to_owned()]);
        let (c, _) = pki.client_cert("admin", &["system:masters"]).unwrap();
        assert!(c.starts_with("-----BEGIN CERTIFICATE-----"));
    }
}
