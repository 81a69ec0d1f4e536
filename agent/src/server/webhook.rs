//! The webhook edge of authentication and authorization: TokenReview and
//! SubjectAccessReview against the API server over a `kube::Client`, with
//! the kubelet's caches (`authentication.webhook.cacheTTL`, default 2m;
//! `authorization.webhook.cacheAuthorizedTTL` 5m and
//! `cacheUnauthorizedTTL` 30s). Failed calls are not cached.
//!
//! Bearer tokens come from anyone who can reach :10250, so TokenReviews
//! are bounded apart from everything else the agent asks of the API
//! server: their client is not the one that renews the Lease and posts
//! node status (no shared kubeAPIQPS bucket, so heartbeats never wait
//! behind reviews), a token bucket (`--token-review-qps`/`-burst`) and a
//! cap on reviews in flight refuse what is over at once instead of
//! queueing it (429), identical reviews in flight are made once, and the
//! cache keeps authenticated tokens apart from refused ones
//! (`review_cache.rs`).

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use tokio::sync::{OnceCell, Semaphore};

use super::{
    auth::{Attributes, AuthError, Authenticator, Authorizer, Credentials, Decision, UserInfo},
    review_cache::{CACHE_CAPACITY, TokenCache, TokenKey, TtlCache},
};
use crate::flowcontrol::TokenBucket;

/// TokenReviews in flight at once, whatever the bucket allows.
const MAX_IN_FLIGHT: usize = 32;

type Verdict = Result<Option<UserInfo>, AuthError>;

/// How many TokenReviews may be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReviewLimits {
    pub qps: u32,
    pub burst: u32,
}

/// Bearer tokens checked with TokenReview (authentication.k8s.io/v1).
pub struct TokenReviewAuthenticator {
    client: kube::Client,
    ttl: Duration,
    cache: TokenCache,
    bucket: TokenBucket,
    /// qps 0: no review is ever sent.
    disabled: bool,
    in_flight: Semaphore,
    pending: Mutex<HashMap<TokenKey, Arc<OnceCell<Verdict>>>>,
}

impl TokenReviewAuthenticator {
    pub fn new(client: kube::Client, ttl: Duration, limits: ReviewLimits) -> TokenReviewAuthenticator {
        TokenReviewAuthenticator {
            client,
            ttl,
            cache: TokenCache::random(CACHE_CAPACITY),
            bucket: TokenBucket::new(f64::from(limits.qps), limits.burst),
            disabled: limits.qps == 0,
            in_flight: Semaphore::new(MAX_IN_FLIGHT),
            pending: Mutex::new(HashMap::new()),
        }
    }

    /// One review for `token`, shared by every request presenting it
    /// meanwhile; refused at once when over the limits.
    async fn review_once(&self, key: TokenKey, token: &str) -> Verdict {
        let cell = {
            let mut p = self.pending.lock();
            p.entry(key).or_default().clone()
        };
        let verdict = cell.get_or_init(|| self.limited_review(key, token)).await.clone();
        let mut p = self.pending.lock();
        if p.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            p.remove(&key);
        }
        verdict
    }

    async fn limited_review(&self, key: TokenKey, token: &str) -> Verdict {
        let Ok(_permit) = self.in_flight.try_acquire() else { return Err(AuthError::RateLimited) };
        let allowed = !self.disabled && self.bucket.try_accept();
        if !allowed {
            return Err(AuthError::RateLimited);
        }
        let verdict = review(&self.client, token).await?;
        self.cache.insert(key, verdict.clone(), self.ttl, Instant::now());
        Ok(verdict)
    }
}

/// One TokenReview.
async fn review(client: &kube::Client, token: &str) -> Verdict {
    let review =
        TokenReview { spec: TokenReviewSpec { token: token.to_owned(), audiences: None }, ..Default::default() };
    let api: Api<TokenReview> = Api::all(client.clone());
    let out = api
        .create(&PostParams::default(), &review)
        .await
        .map_err(|e| AuthError::Webhook(format!("TokenReview: {e}")))?;
    let status = out.status.unwrap_or_default();
    if status.authenticated == Some(true) {
        let u = status.user.unwrap_or_default();
        return Ok(Some(UserInfo {
            name: u.username.unwrap_or_default(),
            uid: u.uid.unwrap_or_default(),
            groups: u.groups.unwrap_or_default(),
            extra: u.extra.unwrap_or_default().into_iter().collect(),
        }));
    }
    match status.error.filter(|e| !e.is_empty()) {
        // The webhook's own failure is an error, not a verdict.
        Some(e) => Err(AuthError::Webhook(format!("TokenReview: {e}"))),
        None => Ok(None),
    }
}

#[async_trait]
impl Authenticator for TokenReviewAuthenticator {
    async fn authenticate(&self, creds: &Credentials<'_>) -> Result<Option<UserInfo>, AuthError> {
        let Some(token) = creds.bearer_token else { return Ok(None) };
        let key = self.cache.key(token);
        if let Some(hit) = self.cache.get(&key, Instant::now()) {
            return Ok(hit);
        }
        self.review_once(key, token).await
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
    use std::convert::Infallible;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper::{Request, Response};
    use serde_json::{Value, json};

    use super::*;

    type Seen = Arc<Mutex<Vec<(String, Value)>>>;

    const LIMITS: ReviewLimits = ReviewLimits { qps: 100, burst: 100 };

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
                log.lock().push((path, v.clone()));
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
        let a = TokenReviewAuthenticator::new(client, Duration::from_secs(60), LIMITS);
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
            let seen = seen.lock();
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
        let seen = seen.lock();
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
        let a = TokenReviewAuthenticator::new(client, Duration::from_secs(60), LIMITS);
        assert!(matches!(
            a.authenticate(&Credentials { client_certs: &[], bearer_token: Some("t") }).await,
            Err(AuthError::Webhook(_))
        ));
    }

    /// A flood of random tokens: at most the bucket's reviews are sent,
    /// the rest refused at once (429), and identical reviews in flight
    /// are made once.
    #[tokio::test]
    async fn floods_are_refused_not_queued_and_identical_reviews_coalesce() {
        let (client, seen) = fake_client(|v| {
            let mut r = v.clone();
            let good = v["spec"]["token"] == "good";
            r["status"] = if good {
                json!({"authenticated": true, "user": {"username": "alice"}})
            } else {
                json!({"authenticated": false})
            };
            r
        });
        let a = Arc::new(TokenReviewAuthenticator::new(
            client,
            Duration::from_secs(120),
            ReviewLimits { qps: 5, burst: 5 },
        ));
        let creds = |t: &'static str| Credentials { client_certs: &[], bearer_token: Some(t) };
        assert_eq!(a.authenticate(&creds("good")).await.unwrap().unwrap().name, "alice");
        let mut limited = 0;
        for i in 0..1000 {
            let t: &'static str = Box::leak(format!("random-{i}").into_boxed_str());
            match a.authenticate(&creds(t)).await {
                Err(AuthError::RateLimited) => limited += 1,
                Ok(None) => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(limited, 1000 - 4, "the burst of 5 less the good token's review");
        assert_eq!(seen.lock().len(), 5);
        // The authenticated token is still cached.
        assert_eq!(a.authenticate(&creds("good")).await.unwrap().unwrap().name, "alice");
        assert_eq!(seen.lock().len(), 5);
        // Coalescing: 50 requests presenting one new token at once, one review.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = seen.lock().len();
        let mut tasks = vec![];
        for _ in 0..50 {
            let a = a.clone();
            tasks.push(tokio::spawn(async move {
                a.authenticate(&Credentials { client_certs: &[], bearer_token: Some("same-new-token") }).await
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap(), Ok(None));
        }
        assert_eq!(seen.lock().len(), before + 1);
    }
}
