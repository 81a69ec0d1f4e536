//! Who is asking, and may they: the kubelet API's authentication and
//! authorization (pkg/kubelet/server/auth.go and the apiserver's delegating
//! authenticator), behind two small traits so the decision logic is tested
//! against in-memory fakes and the webhook clients (`webhook.rs`) are only
//! the edge.
//!
//! Authentication, in the kubelet's order: a client certificate verified
//! against `--client-ca-file` (user = CN, groups = O), then a bearer token
//! checked by TokenReview. The first that succeeds wins; credentials that
//! are presented but fail are a 401 even when anonymous requests are
//! allowed; a request with no credentials is `system:anonymous` only with
//! `--anonymous-auth=true`, a 401 otherwise. Authenticated users gain the
//! `system:authenticated` group.
//!
//! Authorization: the request maps to `nodes/<subresource>` attributes
//! (verb from the method, the node's name, subresource from the path);
//! with KubeletFineGrainedAuthz (default on), /pods, /healthz and /configz
//! are tried as their own subresource first and `proxy` second.

use std::{collections::BTreeMap, sync::Arc};

use async_trait::async_trait;
use hyper::Method;
use rustls::{
    pki_types::{CertificateDer, UnixTime},
    server::danger::ClientCertVerifier,
};
use serde::Serialize;
use thiserror::Error;

pub const ANONYMOUS_USER: &str = "system:anonymous";
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What a request presents.
#[derive(Clone, Copy, Debug, Default)]
pub struct Credentials<'a> {
    /// End entity first, then intermediates.
    pub client_certs: &'a [CertificateDer<'static>],
    pub bearer_token: Option<&'a str>,
}

/// The token of an `Authorization: Bearer <token>` header, as the
/// apiserver's bearertoken authenticator reads it.
pub fn bearer_token(header: Option<&str>) -> Option<&str> {
    let mut parts = header?.trim().splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("verifying the client certificate: {0}")]
    X509(String),
    #[error("invalid bearer token")]
    InvalidToken,
    /// The review could not be made (API server unreachable, bad answer).
    #[error("{0}")]
    Webhook(String),
    /// Over the TokenReview limits: refused without asking.
    #[error("too many token reviews: try again later")]
    RateLimited,
}

/// One way of telling who sent a request.
#[async_trait]
pub trait Authenticator: Send + Sync {
    /// `Ok(None)`: this authenticator found no credentials of its kind.
    /// `Err`: credentials were presented and did not check out.
    async fn authenticate(&self, creds: &Credentials<'_>) -> Result<Option<UserInfo>, AuthError>;
}

/// Client certificates verified against the client CA.
pub struct X509Authenticator {
    verifier: Verifier,
}

enum Verifier {
    Fixed(Arc<dyn ClientCertVerifier>),
    /// `--client-ca-file` as it is now (reloaded when it changes).
    Following(Arc<super::tls::ClientCa>),
}

impl X509Authenticator {
    pub fn new(verifier: Arc<dyn ClientCertVerifier>) -> X509Authenticator {
        X509Authenticator { verifier: Verifier::Fixed(verifier) }
    }

    /// Verifies against the client CA file's current content.
    pub fn following(ca: Arc<super::tls::ClientCa>) -> X509Authenticator {
        X509Authenticator { verifier: Verifier::Following(ca) }
    }

    fn verifier(&self) -> Arc<dyn ClientCertVerifier> {
        match &self.verifier {
            Verifier::Fixed(v) => v.clone(),
            Verifier::Following(ca) => ca.verifier(),
        }
    }
}

/// The user a verified client certificate names: CN, and O as groups.
pub fn certificate_user(der: &[u8]) -> Result<UserInfo, AuthError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| AuthError::X509(e.to_string()))?;
    let name = cert.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok()).unwrap_or_default().to_owned();
    if name.is_empty() {
        return Err(AuthError::X509("the certificate has no common name".into()));
    }
    let groups = cert.subject().iter_organization().filter_map(|o| o.as_str().ok().map(str::to_owned)).collect();
    Ok(UserInfo { name, groups, ..Default::default() })
}

#[async_trait]
impl Authenticator for X509Authenticator {
    async fn authenticate(&self, creds: &Credentials<'_>) -> Result<Option<UserInfo>, AuthError> {
        let Some((leaf, intermediates)) = creds.client_certs.split_first() else { return Ok(None) };
        self.verifier()
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .map_err(|e| AuthError::X509(e.to_string()))?;
        certificate_user(leaf).map(Some)
    }
}

/// The kubelet's combination: x509, then bearer tokens, then anonymous.
pub struct KubeletAuthenticator {
    pub x509: Option<Arc<dyn Authenticator>>,
    /// Answers bearer tokens (TokenReview); `Ok(None)` for a token means
    /// the webhook did not authenticate it.
    pub token: Option<Arc<dyn Authenticator>>,
    pub anonymous: bool,
}

#[async_trait]
impl Authenticator for KubeletAuthenticator {
    async fn authenticate(&self, creds: &Credentials<'_>) -> Result<Option<UserInfo>, AuthError> {
        let mut first_error = None;
        if let Some(x) = &self.x509 {
            match x.authenticate(creds).await {
                Ok(Some(u)) => return Ok(Some(with_authenticated_group(u))),
                Ok(None) => {}
                Err(e) => first_error = Some(e),
            }
        }
        if let (Some(t), Some(_)) = (&self.token, creds.bearer_token) {
            match t.authenticate(creds).await {
                Ok(Some(u)) => return Ok(Some(with_authenticated_group(u))),
                Ok(None) => {
                    first_error.get_or_insert(AuthError::InvalidToken);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        Ok(self.anonymous.then(|| UserInfo {
            name: ANONYMOUS_USER.into(),
            groups: vec![UNAUTHENTICATED_GROUP.into()],
            ..Default::default()
        }))
    }
}

fn with_authenticated_group(mut u: UserInfo) -> UserInfo {
    if !u.groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
        u.groups.push(AUTHENTICATED_GROUP.into());
    }
    u
}

/// What a request asks to do, in the API's terms.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Attributes {
    pub user: UserInfo,
    pub verb: String,
    pub namespace: String,
    pub api_group: String,
    pub api_version: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    pub path: String,
}

/// `path` is `prefix` or below it (the kubelet's isSubpath).
fn is_subpath(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    path == prefix || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

/// The subresources a request is authorized against, in order.
pub fn subresources(path: &str, fine_grained: bool) -> Vec<&'static str> {
    let own = |s: &'static str| vec![s];
    if is_subpath(path, "/stats/") {
        return own("stats");
    }
    if is_subpath(path, "/metrics") {
        return own("metrics");
    }
    if is_subpath(path, "/logs/") {
        return own("log");
    }
    if is_subpath(path, "/checkpoint/") {
        return own("checkpoint");
    }
    if fine_grained {
        if is_subpath(path, "/pods") || is_subpath(path, "/runningPods/") {
            return vec!["pods", "proxy"];
        }
        if is_subpath(path, "/healthz") {
            return vec!["healthz", "proxy"];
        }
        if is_subpath(path, "/configz") {
            return vec!["configz", "proxy"];
        }
        if is_subpath(path, "/spec/") {
            return own("spec");
        }
    }
    own("proxy")
}

/// The API verb for an HTTP method, as the kubelet maps it.
pub fn verb(method: &Method) -> &'static str {
    match *method {
        Method::POST => "create",
        Method::GET => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
}

/// The attributes to authorize, in order: allowed if any is.
pub fn request_attributes(
    user: &UserInfo,
    method: &Method,
    path: &str,
    node: &str,
    fine_grained: bool,
) -> Vec<Attributes> {
    subresources(path, fine_grained)
        .into_iter()
        .map(|sub| Attributes {
            user: user.clone(),
            verb: verb(method).into(),
            namespace: String::new(),
            api_group: String::new(),
            api_version: "v1".into(),
            resource: "nodes".into(),
            subresource: sub.into(),
            name: node.into(),
            path: path.into(),
        })
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny,
    /// The authorizer has no rule for it: not allowed.
    NoOpinion,
}

#[async_trait]
pub trait Authorizer: Send + Sync {
    /// The decision and the reason the authorizer gave.
    async fn authorize(&self, attrs: &Attributes) -> Result<(Decision, String), AuthError>;
}

/// `authorization.mode: AlwaysAllow`.
pub struct AlwaysAllow;

#[async_trait]
impl Authorizer for AlwaysAllow {
    async fn authorize(&self, _attrs: &Attributes) -> Result<(Decision, String), AuthError> {
        Ok((Decision::Allow, String::new()))
    }
}

/// Webhook authorization configured without an API server to ask
/// (standalone mode): nothing is allowed, and the reason says why.
pub struct Unavailable(pub String);

#[async_trait]
impl Authorizer for Unavailable {
    async fn authorize(&self, _attrs: &Attributes) -> Result<(Decision, String), AuthError> {
        Ok((Decision::NoOpinion, self.0.clone()))
    }
}

/// The outcome of the auth filter, with the kubelet's status and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Allowed(UserInfo),
    /// 401 "Unauthorized".
    Unauthorized,
    /// 403 with the kubelet's message.
    Forbidden(String),
    /// 500 with the kubelet's message.
    Error(String),
    /// 429: the credentials could not be checked now (TokenReview limits).
    TooManyRequests,
}

/// Authenticates and authorizes one request, as the kubelet's auth filter.
pub async fn check(
    authn: &dyn Authenticator,
    authz: &dyn Authorizer,
    creds: &Credentials<'_>,
    method: &Method,
    path: &str,
    node: &str,
    fine_grained: bool,
) -> Outcome {
    let user = match authn.authenticate(creds).await {
        Ok(Some(u)) => u,
        Ok(None) => return Outcome::Unauthorized,
        Err(AuthError::RateLimited) => return Outcome::TooManyRequests,
        Err(e) => {
            tracing::debug!("unable to authenticate the request: {e}");
            return Outcome::Unauthorized;
        }
    };
    let attrs = request_attributes(&user, method, path, node, fine_grained);
    for a in &attrs {
        match authz.authorize(a).await {
            Ok((Decision::Allow, _)) => return Outcome::Allowed(user),
            Ok(_) => {}
            Err(e) => {
                tracing::error!(
                    user = a.user.name,
                    verb = a.verb,
                    subresource = a.subresource,
                    "authorization error: {e}"
                );
                return Outcome::Error(format!(
                    "Authorization error (user={}, verb={}, resource={}, subresource={})",
                    a.user.name, a.verb, a.resource, a.subresource
                ));
            }
        }
    }
    let subs: Vec<&str> = attrs.iter().map(|a| a.subresource.as_str()).collect();
    let msg = format!(
        "Forbidden (user={}, verb={}, resource=nodes, subresource(s)=[{}])\n",
        user.name,
        verb(method),
        subs.join(" ")
    );
    tracing::debug!("{}", msg.trim_end());
    Outcome::Forbidden(msg)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[test]
    fn path_to_subresources_follows_the_kubelet() {
        let cases: &[(&str, bool, &[&str])] = &[
            ("/stats/summary", true, &["stats"]),
            ("/stats", true, &["stats"]),
            ("/statsfoo", true, &["proxy"]),
            ("/metrics", true, &["metrics"]),
            ("/metrics/resource", true, &["metrics"]),
            ("/metrics/cadvisor", false, &["metrics"]),
            ("/metricsx", true, &["proxy"]),
            ("/logs/", true, &["log"]),
            ("/logs/syslog", true, &["log"]),
            ("/containerLogs/ns/pod/c", true, &["proxy"]),
            ("/pods", true, &["pods", "proxy"]),
            ("/pods", false, &["proxy"]),
            ("/runningPods/", true, &["pods", "proxy"]),
            ("/healthz", true, &["healthz", "proxy"]),
            ("/healthz/syncloop", true, &["healthz", "proxy"]),
            ("/healthz", false, &["proxy"]),
            ("/configz", true, &["configz", "proxy"]),
            ("/spec/", true, &["spec"]),
            ("/checkpoint/ns/pod/c", true, &["checkpoint"]),
            ("/debug/events", true, &["proxy"]),
            ("/exec/ns/pod/c", true, &["proxy"]),
            ("/exec/ns/pod/uid/c", false, &["proxy"]),
            ("/attach/ns/pod/c", true, &["proxy"]),
            ("/portForward/ns/pod", true, &["proxy"]),
            ("/run/ns/pod/c", true, &["proxy"]),
        ];
        for (path, fine, want) in cases {
            assert_eq!(subresources(path, *fine), *want, "{path} fine-grained={fine}");
        }
        let u = UserInfo { name: "u".into(), ..Default::default() };
        let a = request_attributes(&u, &Method::POST, "/pods", "node-1", true);
        assert_eq!(a.len(), 2);
        assert_eq!(
            (a[0].verb.as_str(), a[0].resource.as_str(), a[0].name.as_str(), a[0].api_version.as_str()),
            ("create", "nodes", "node-1", "v1")
        );
        for (m, v) in [
            (Method::GET, "get"),
            (Method::PUT, "update"),
            (Method::PATCH, "patch"),
            (Method::DELETE, "delete"),
            (Method::HEAD, ""),
        ] {
            assert_eq!(verb(&m), v);
        }
    }

    #[test]
    fn bearer_tokens() {
        assert_eq!(bearer_token(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some("  bearer abc  ")), Some("abc"));
        assert_eq!(bearer_token(Some("Bearer abc extra")), Some("abc"));
        assert_eq!(bearer_token(Some("Basic abc")), None);
        assert_eq!(bearer_token(Some("Bearer")), None);
        assert_eq!(bearer_token(Some("Bearer  x")), None);
        assert_eq!(bearer_token(None), None);
    }

    /// An authenticator that answers from a table.
    struct Fake(Result<Option<UserInfo>, AuthError>);

    #[async_trait]
    impl Authenticator for Fake {
        async fn authenticate(&self, _creds: &Credentials<'_>) -> Result<Option<UserInfo>, AuthError> {
            self.0.clone()
        }
    }

    fn user(n: &str) -> UserInfo {
        UserInfo { name: n.into(), ..Default::default() }
    }

    fn fake(r: Result<Option<UserInfo>, AuthError>) -> Option<Arc<dyn Authenticator>> {
        Some(Arc::new(Fake(r)))
    }

    #[tokio::test]
    async fn union_order_errors_and_anonymous() {
        let cert = [CertificateDer::from(vec![1u8])];
        let with_cert = Credentials { client_certs: &cert, bearer_token: None };
        let with_token = Credentials { client_certs: &[], bearer_token: Some("t") };
        let nothing = Credentials::default();
        let x509_ok = || fake(Ok(Some(user("alice"))));
        let x509_none = || fake(Ok(None));
        let x509_bad = || fake(Err(AuthError::X509("unknown authority".into())));
        let token_ok = || fake(Ok(Some(user("bob"))));
        let token_no = || fake(Ok(None));
        // (x509, token, anonymous, credentials, expected)
        type Authn = Option<Arc<dyn Authenticator>>;
        type Case<'a> = (Authn, Authn, bool, &'a Credentials<'a>, Result<Option<&'a str>, AuthError>);
        let cases: Vec<Case> = vec![
            (x509_ok(), token_ok(), false, &with_cert, Ok(Some("alice"))),
            (x509_none(), token_ok(), false, &with_token, Ok(Some("bob"))),
            // A rejected token is a 401 even with anonymous allowed.
            (x509_none(), token_no(), true, &with_token, Err(AuthError::InvalidToken)),
            // A bad certificate too, unless a token authenticates.
            (x509_bad(), None, true, &with_cert, Err(AuthError::X509("unknown authority".into()))),
            (x509_bad(), token_ok(), false, &with_token, Ok(Some("bob"))),
            // Nothing presented.
            (x509_none(), token_ok(), false, &nothing, Ok(None)),
            (x509_none(), token_ok(), true, &nothing, Ok(Some(ANONYMOUS_USER))),
            // Tokens are ignored when the webhook is off.
            (None, None, false, &with_token, Ok(None)),
            (None, None, true, &with_token, Ok(Some(ANONYMOUS_USER))),
        ];
        for (i, (x509, token, anonymous, creds, want)) in cases.into_iter().enumerate() {
            let a = KubeletAuthenticator { x509, token, anonymous };
            let got = a.authenticate(creds).await;
            let got_name = got.as_ref().map(|u| u.as_ref().map(|u| u.name.as_str())).map_err(Clone::clone);
            assert_eq!(got_name, want, "case {i}");
            if let Ok(Some(u)) = got {
                let want_group = if u.name == ANONYMOUS_USER { UNAUTHENTICATED_GROUP } else { AUTHENTICATED_GROUP };
                assert_eq!(u.groups, vec![want_group.to_owned()], "case {i}");
            }
        }
    }

    /// An authorizer that allows listed (user, subresource) pairs and
    /// records what it was asked.
    #[derive(Default)]
    struct Rules {
        allow: Vec<(&'static str, &'static str)>,
        fail: bool,
        asked: Mutex<Vec<String>>,
    }

    #[async_trait]
    impl Authorizer for Rules {
        async fn authorize(&self, a: &Attributes) -> Result<(Decision, String), AuthError> {
            self.asked.lock().unwrap().push(a.subresource.clone());
            if self.fail {
                return Err(AuthError::Webhook("connection refused".into()));
            }
            let ok = self.allow.iter().any(|(u, s)| *u == a.user.name && *s == a.subresource);
            Ok((if ok { Decision::Allow } else { Decision::NoOpinion }, String::new()))
        }
    }

    #[tokio::test]
    async fn filter_outcomes() {
        let cert = [CertificateDer::from(vec![1u8])];
        let creds = Credentials { client_certs: &cert, bearer_token: None };
        let authn = KubeletAuthenticator { x509: fake(Ok(Some(user("metrics")))), token: None, anonymous: false };
        let rules = Rules { allow: vec![("metrics", "metrics"), ("metrics", "proxy")], ..Default::default() };
        let ok = check(&authn, &rules, &creds, &Method::GET, "/metrics/resource", "n1", true).await;
        assert!(matches!(ok, Outcome::Allowed(ref u) if u.name == "metrics"), "{ok:?}");
        // /pods: nodes/pods first, then the proxy fallback.
        rules.asked.lock().unwrap().clear();
        let ok = check(&authn, &rules, &creds, &Method::GET, "/pods", "n1", true).await;
        assert!(matches!(ok, Outcome::Allowed(_)));
        assert_eq!(*rules.asked.lock().unwrap(), vec!["pods", "proxy"]);
        let stats = check(&authn, &rules, &creds, &Method::GET, "/stats/summary", "n1", true).await;
        assert_eq!(
            stats,
            Outcome::Forbidden("Forbidden (user=metrics, verb=get, resource=nodes, subresource(s)=[stats])\n".into())
        );
        let none = KubeletAuthenticator { x509: fake(Ok(None)), token: None, anonymous: false };
        assert_eq!(check(&none, &rules, &creds, &Method::GET, "/pods", "n1", true).await, Outcome::Unauthorized);
        let failing = Rules { fail: true, ..Default::default() };
        assert_eq!(
            check(&authn, &failing, &creds, &Method::GET, "/healthz", "n1", true).await,
            Outcome::Error("Authorization error (user=metrics, verb=get, resource=nodes, subresource=healthz)".into())
        );
        assert!(matches!(
            check(&authn, &AlwaysAllow, &creds, &Method::GET, "/anything", "n1", true).await,
            Outcome::Allowed(_)
        ));
        assert!(matches!(
            check(&authn, &Unavailable("standalone".into()), &creds, &Method::GET, "/pods", "n1", true).await,
            Outcome::Forbidden(_)
        ));
    }

    /// A CA and a client certificate it signed: (CA DER, leaf DER).
    fn ca_and_client(cn: &str) -> (CertificateDer<'static>, CertificateDer<'static>) {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
            KeyUsagePurpose,
        };
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::default();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::default();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let leaf = p.signed_by(&key, &issuer).unwrap();
        (ca_cert.der().clone(), leaf.der().clone())
    }

    #[tokio::test]
    async fn x509_verifies_the_chain_and_the_client_usage() {
        let (ca, alice) = ca_and_client("alice");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca).unwrap();
        let x509 = X509Authenticator::new(super::super::tls::client_chain_verifier(Arc::new(roots)).unwrap());
        let creds = |c: &'static [CertificateDer<'static>]| Credentials { client_certs: c, bearer_token: None };
        let good: &'static [CertificateDer<'static>] = Box::leak(vec![alice].into_boxed_slice());
        assert_eq!(x509.authenticate(&creds(good)).await.unwrap().unwrap().name, "alice");
        let (_, stranger) = ca_and_client("mallory");
        let bad: &'static [CertificateDer<'static>] = Box::leak(vec![stranger].into_boxed_slice());
        assert!(matches!(x509.authenticate(&creds(bad)).await, Err(AuthError::X509(_))));
        assert_eq!(x509.authenticate(&creds(&[])).await.unwrap(), None);
    }

    #[test]
    fn certificate_user_is_cn_and_organizations() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::default();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(rcgen::DnType::CommonName, "system:node:n1");
        p.distinguished_name.push(rcgen::DnType::OrganizationName, "system:nodes");
        let c = p.self_signed(&key).unwrap();
        let u = certificate_user(c.der()).unwrap();
        assert_eq!(u.name, "system:node:n1");
        assert_eq!(u.groups, vec!["system:nodes".to_owned()]);
        let mut p = rcgen::CertificateParams::default();
        p.distinguished_name = rcgen::DistinguishedName::new();
        let c = p.self_signed(&key).unwrap();
        assert!(certificate_user(c.der()).is_err());
    }
}
