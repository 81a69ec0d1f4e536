//! The webhook edge of authentication and authorization: TokenReview and
//! SubjectAccessReview against the API server over a `kube::Client`, with
//! the kubelet's caches (`authentication.webhook.cacheTTL`, default 2m;
//! `authorization.webhook.cacheAuthorizedTTL` 5m and
//! `cacheUnauthorizedTTL` 30s). Failed calls are not cached.

use std::{
    collections::HashMap,
    hash::Hash,
    sync::Mutex,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::api::{Api, PostParams};

use super::auth::{Attributes, AuthError, Authenticator, Authorizer, Credentials, Decision, UserInfo};

/// Entries kept at most; expired ones go first, then everything.
const CACHE_CAPACITY: usize = 4096;

/// A map whose entries expire.
pub struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (Instant, V)>>,
}

impl<K: Eq + Hash + Clone, V: Clone> Default for TtlCache<K, V> {
    fn default() -> Self {
        TtlCache { entries: Mutex::new(HashMap::new()) }
    }
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    pub fn get(&self, key: &K, now: Instant) -> Option<V> {
        let map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        map.get(key).filter(|(until, _)| now < *until).map(|(_, v)| v.clone())
    }

    pub fn insert(&self, key: K, value: V, ttl: Duration, now: Instant) {
        if ttl.is_zero() {
            return;
        }
        let mut map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= CACHE_CAPACITY {
            map.retain(|_, (until, _)| now < *until);
            if map.len() >= CACHE_CAPACITY {
                map.clear();
            }
        }
        map.insert(key, (now + ttl, value));
    }
}

/// Bearer tokens checked with TokenReview (authentication.k8s.io/v1).
pub struct TokenReviewAuthenticator {
    client: kube::Client,
    ttl: Duration,
    cache: TtlCache<String, Option<UserInfo>>,
}

impl TokenReviewAuthenticator {
    pub fn new(client: kube::Client, ttl: Duration) -> TokenReviewAuthenticator {
        TokenReviewAuthenticator { client, ttl, cache: TtlCache::default() }
    }
}

#[async_trait]
impl Authenticator for TokenReviewAuthenticator {
    async fn authenticate(&self, creds: &Credentials<'_>) -> Result<Option<UserInfo>, AuthError> {
        let Some(token) = creds.bearer_token else { return Ok(None) };
        let now = Instant::now();
        if let Some(hit) = self.cache.get(&token.to_owned(), now) {
            return Ok(hit);
        }
        let review =
            TokenReview { spec: TokenReviewSpec { token: token.to_owned(), audiences: None }, ..Default::default() };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let out = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| AuthError::Webhook(format!("TokenReview: {e}")))?;
        let status = out.status.unwrap_or_default();
        let result = if status.authenticated == Some(true) {
            let u = status.user.unwrap_or_default();
            Some(UserInfo {
                name: u.username.unwrap_or_default(),
                uid: u.uid.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
                extra: u.extra.unwrap_or_default().into_iter().collect(),
            })
        } else {
            match status.error.filter(|e| !e.is_empty()) {
                // The webhook's own failure is an error, not a verdict.
                Some(e) => return Err(AuthError::Webhook(format!("TokenReview: {e}"))),
                None => None,
            }
        };
        self.cache.insert(token.to_owned(), result.clone(), self.ttl, now);
        Ok(result)
    }
}

/// Requests authorized with SubjectAccessReview (authorization.k8s.io/v1).
pub struct SubjectAccessReviewAuthorizer {
    client: kube::Client,
    authorized_ttl: Duration,
    unauthorized_ttl: Duration,
    cache: TtlCache<Attributes, (Decision, String)>,
}

impl SubjectAccessReviewAuthorizer {
    pub fn new(client: kube::Client, authorized_ttl: Duration, unauthorized_ttl: Duration) -> Self {
        SubjectAccessReviewAuthorizer { client, authorized_ttl, unauthorized_ttl, cache: TtlCache::default() }
    }
}

/// The review the kubelet sends for `a`.
pub fn access_review(a: &Attributes) -> SubjectAccessReview {
    let nonempty = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(a.user.name.clone()),
            uid: nonempty(&a.user.uid),
            groups: Some(a.user.groups.clone()),
            extra: (!a.user.extra.is_empty()).then(|| a.user.extra.clone().into_iter().collect()),
            resource_attributes: Some(ResourceAttributes {
                verb: nonempty(&a.verb),
                group: Some(a.api_group.clone()),
                version: nonempty(&a.api_version),
                resource: nonempty(&a.resource),
                subresource: nonempty(&a.subresource),
                name: nonempty(&a.name),
                namespace: nonempty(&a.namespace),
                ..Default::default()
            }),
            non_resource_attributes: None,
        },
        ..Default::default()
    }
}

#[async_trait]
impl Authorizer for SubjectAccessReviewAuthorizer {
    async fn authorize(&self, attrs: &Attributes) -> Result<(Decision, String), AuthError> {
        let now = Instant::now();
        // The path does not take part in a resource review.
        let key = Attributes { path: String::new(), ..attrs.clone() };
        if let Some(hit) = self.cache.get(&key, now) {
            return Ok(hit);
        }
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let out = api
            .create(&PostParams::default(), &access_review(attrs))
            .await
            .map_err(|e| AuthError::Webhook(format!("SubjectAccessReview: {e}")))?;
        let s = out.status.unwrap_or_default();
        let decision = if s.allowed {
            Decision::Allow
        } else if s.denied == Some(true) {
            Decision::Deny
        } else {
            Decision::NoOpinion
        };
        let reason = s.reason.unwrap_or_default();
        let ttl = if decision == Decision::Allow { self.authorized_ttl } else { self.unauthorized_ttl };
        self.cache.insert(key, (decision, reason.clone()), ttl, now);
        Ok((decision, reason))
    }
}

#[cfg(test)]
mod tests {
    use std::{
        convert::Infallible,
        sync::{Arc, Mutex},
    };

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper::{Request, Response};
    use serde_json::{Value, json};

    use super::*;

    type Seen = Arc<Mutex<Vec<(String, Value)>>>;

    /// A kube client whose API server is a closure over the request body,
    /// recording every request (path and JSON body).
    fn fake_client(answer: impl Fn(&Value) -> Value + Send + Sync + 'static) -> (kube::Client, Seen) {
        let seen = Arc::new(Mutex::new(vec![]));
        let log = seen.clone();
        let answer = Arc::new(answer);
        let svc = tower::service_fn(move |req: Request<kube::client::Body>| {
            let log = log.clone();
            let answer = answer.clone();
            async move {
                let path = req.uri().path().to_owned();
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let v: Value = serde_json::from_slice(&body).unwrap();
                log.lock().unwrap().push((path, v.clone()));
                let out = serde_json::to_vec(&answer(&v)).unwrap();
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(out))))
            }
        });
        (kube::Client::new(svc, "default"), seen)
    }

    #[tokio::test]
    async fn token_review_authenticates_and_caches() {
        let (client, seen) = fake_client(|v| {
            let token = v["spec"]["token"].as_str().unwrap_or_default();
            let mut r = v.clone();
            r["status"] = if token == "good" {
                json!({"authenticated": true, "user": {"username": "system:serviceaccount:monitoring:prometheus", "uid": "u-1", "groups": ["system:serviceaccounts"], "extra": {"scope": ["a"]}}})
            } else if token == "broken" {
                json!({"authenticated": false, "error": "webhook backend down"})
            } else {
                json!({"authenticated": false})
            };
            r
        });
        let a = TokenReviewAuthenticator::new(client, Duration::from_secs(60));
        let creds = |t| Credentials { client_certs: &[], bearer_token: Some(t) };
        let u = a.authenticate(&creds("good")).await.unwrap().unwrap();
        assert_eq!(u.name, "system:serviceaccount:monitoring:prometheus");
        assert_eq!((u.uid.as_str(), u.groups.clone()), ("u-1", vec!["system:serviceaccounts".to_owned()]));
        assert_eq!(u.extra["scope"], vec!["a".to_owned()]);
        assert_eq!(a.authenticate(&creds("bad")).await.unwrap(), None);
        assert!(
            matches!(a.authenticate(&creds("broken")).await, Err(AuthError::Webhook(e)) if e.contains("webhook backend down"))
        );
        // Cached: the good and bad tokens are not reviewed again; the failure is.
        a.authenticate(&creds("good")).await.unwrap();
        a.authenticate(&creds("bad")).await.unwrap();
        let _ = a.authenticate(&creds("broken")).await;
        {
            let seen = seen.lock().unwrap();
            assert_eq!(seen.len(), 4, "{seen:?}");
            assert_eq!(seen[0].0, "/apis/authentication.k8s.io/v1/tokenreviews");
            assert_eq!(seen[0].1["kind"], "TokenReview");
        }
        assert_eq!(a.authenticate(&Credentials::default()).await.unwrap(), None);
    }

    fn attrs(user: &str, sub: &str) -> Attributes {
        Attributes {
            user: UserInfo { name: user.into(), uid: "uid-1".into(), groups: vec!["g".into()], ..Default::default() },
            verb: "get".into(),
            namespace: String::new(),
            api_group: String::new(),
            api_version: "v1".into(),
            resource: "nodes".into(),
            subresource: sub.into(),
            name: "node-1".into(),
            path: "/stats/summary".into(),
        }
    }

    #[tokio::test]
    async fn access_review_carries_the_kubelet_attributes_and_caches_by_ttl() {
        let (client, seen) = fake_client(|v| {
            let user = v["spec"]["user"].as_str().unwrap_or_default();
            let mut r = v.clone();
            r["status"] = match user {
                "alice" => json!({"allowed": true, "reason": "RBAC: allowed"}),
                "mallory" => json!({"allowed": false, "denied": true, "reason": "explicitly denied"}),
                _ => json!({"allowed": false}),
            };
            r
        });
        let z = SubjectAccessReviewAuthorizer::new(client, Duration::from_secs(300), Duration::ZERO);
        assert_eq!(z.authorize(&attrs("alice", "stats")).await.unwrap(), (Decision::Allow, "RBAC: allowed".into()));
        assert_eq!(z.authorize(&attrs("mallory", "stats")).await.unwrap().0, Decision::Deny);
        assert_eq!(z.authorize(&attrs("bob", "stats")).await.unwrap().0, Decision::NoOpinion);
        // alice is cached (5m); the unauthorized TTL here is zero.
        z.authorize(&attrs("alice", "stats")).await.unwrap();
        z.authorize(&attrs("bob", "stats")).await.unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 4);
        let (path, body) = &seen[0];
        assert_eq!(path, "/apis/authorization.k8s.io/v1/subjectaccessreviews");
        assert_eq!(body["kind"], "SubjectAccessReview");
        assert_eq!(
            body["spec"]["resourceAttributes"],
            json!({"verb": "get", "group": "", "version": "v1", "resource": "nodes", "subresource": "stats", "name": "node-1"})
        );
        assert_eq!(body["spec"]["user"], "alice");
        assert_eq!(body["spec"]["uid"], "uid-1");
        assert_eq!(body["spec"]["groups"], json!(["g"]));
    }

    #[tokio::test]
    async fn an_unreachable_api_server_is_an_error_not_a_verdict() {
        let svc = tower::service_fn(|_req: Request<kube::client::Body>| async {
            Err::<Response<Full<Bytes>>, _>(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused"))
        });
        let client = kube::Client::new(svc, "default");
        let z = SubjectAccessReviewAuthorizer::new(client.clone(), Duration::from_secs(300), Duration::from_secs(30));
        assert!(matches!(z.authorize(&attrs("alice", "stats")).await, Err(AuthError::Webhook(_))));
        let a = TokenReviewAuthenticator::new(client, Duration::from_secs(60));
        assert!(matches!(
            a.authenticate(&Credentials { client_certs: &[], bearer_token: Some("t") }).await,
            Err(AuthError::Webhook(_))
        ));
    }

    #[test]
    fn ttl_cache_expires() {
        let c: TtlCache<&str, u32> = TtlCache::default();
        let t0 = Instant::now();
        c.insert("a", 1, Duration::from_secs(10), t0);
        c.insert("z", 1, Duration::ZERO, t0);
        assert_eq!(c.get(&"a", t0 + Duration::from_secs(9)), Some(1));
        assert_eq!(c.get(&"a", t0 + Duration::from_secs(10)), None);
        assert_eq!(c.get(&"z", t0), None);
    }
}
