//! One certificate kept current: read from its store at start, renewed by
//! CSR at its deadline (`rotation.rs`), stored, and published to whoever
//! uses it (the API client for the client certificate, :10250's TLS for
//! the serving one) without a restart.

use std::{
    fmt,
    sync::Arc,
    time::{Duration, SystemTime},
};

use parking_lot::Mutex;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge, histogram::Histogram},
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{
    csr::{self, CsrApi, Kind, Template},
    rotation,
    store::{FileStore, Pair},
};

/// How long to wait for a CSR to be issued (client-go's 15 minutes).
pub const CSR_WAIT: Duration = Duration::from_secs(15 * 60);
/// How often to look at a pending CSR.
const CSR_POLL: Duration = Duration::from_secs(1);

/// The certificate in use (None until there is one).
pub type Current = watch::Receiver<Option<Arc<Pair>>>;

pub struct Manager {
    pub kind: Kind,
    store: FileStore,
    /// The subject and names to ask for (the serving names follow the
    /// node's addresses).
    template: Mutex<Template>,
    current: watch::Sender<Option<Arc<Pair>>>,
    renew_errors: std::sync::atomic::AtomicU64,
    /// Seconds the previous certificate lived before it was replaced.
    rotation_age: Histogram,
}

impl Manager {
    /// The manager of `kind` over `store`, with the pair it holds now (a
    /// bad stored pair is logged and replaced at once).
    pub fn new(kind: Kind, store: FileStore, template: Template) -> Manager {
        let pair = match store.current() {
            Ok(p) => p,
            Err(e) => {
                warn!(kind = kind.as_str(), "the stored certificate is unusable and will be replaced: {e}");
                None
            }
        };
        if let Some(p) = &pair {
            info!(kind = kind.as_str(), file = %p.source.display(), "certificate loaded");
        }
        Manager {
            kind,
            store,
            template: Mutex::new(template),
            current: watch::channel(pair.map(Arc::new)).0,
            renew_errors: Default::default(),
            rotation_age: Histogram::new([
                60.0,
                3600.0,
                14400.0,
                86400.0,
                604800.0,
                2592000.0,
                7776000.0,
                15552000.0,
                31104000.0,
                124416000.0,
            ]),
        }
    }

    /// Takes the stored pair when there is none in use yet (the one TLS
    /// bootstrap has just written), so it is not asked for again.
    pub fn adopt_stored(&self) {
        if self.current.borrow().is_some() {
            return;
        }
        match self.store.current() {
            Ok(Some(p)) => {
                info!(kind = self.kind.as_str(), file = %p.source.display(), "certificate loaded");
                self.current.send_replace(Some(Arc::new(p)));
            }
            Ok(None) => {}
            Err(e) => warn!(kind = self.kind.as_str(), "the stored certificate is unusable and will be replaced: {e}"),
        }
    }

    pub fn current(&self) -> Current {
        self.current.subscribe()
    }

    pub fn store(&self) -> &FileStore {
        &self.store
    }

    /// Renews at each deadline until `shutdown`; a failed renewal is
    /// counted and retried with back-off.
    pub async fn run(self: Arc<Self>, api: Arc<dyn CsrApi>, shutdown: CancellationToken) {
        let mut failures = 0u32;
        let mut planned: Option<(SystemTime, SystemTime)> = None;
        loop {
            let wait = if failures > 0 {
                rotation::retry_after(failures)
            } else {
                let now = SystemTime::now();
                let at = match &*self.current.borrow() {
                    None => now,
                    Some(p) => {
                        // One jitter per certificate, kept across wake-ups.
                        match planned {
                            Some((nb, at)) if nb == p.not_before => at,
                            _ => {
                                let at = rotation::deadline(p.not_before, p.not_after, rotation::random_jitter());
                                planned = Some((p.not_before, at));
                                info!(
                                    kind = self.kind.as_str(),
                                    "next certificate rotation in {:?}",
                                    at.duration_since(now).unwrap_or_default()
                                );
                                at
                            }
                        }
                    }
                };
                at.duration_since(now).unwrap_or_default()
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.cancelled() => return,
            }
            let template = self.template.lock().clone();
            let obtained = tokio::select! {
                r = csr::obtain(api.as_ref(), self.kind, &template, CSR_POLL, CSR_WAIT) => r,
                _ = shutdown.cancelled() => return,
            };
            match obtained.and_then(|(c, k)| self.store.update(&c, &k, SystemTime::now())) {
                Ok(pair) => {
                    failures = 0;
                    if let Some(old) = &*self.current.borrow() {
                        let age = SystemTime::now().duration_since(old.not_before).unwrap_or_default();
                        self.rotation_age.observe(age.as_secs_f64());
                    }
                    info!(kind = self.kind.as_str(), file = %pair.source.display(), "certificate rotated");
                    self.current.send_replace(Some(Arc::new(pair)));
                }
                Err(e) => {
                    failures += 1;
                    self.renew_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    warn!(kind = self.kind.as_str(), "certificate renewal failed (retrying): {e}");
                }
            }
        }
    }

    /// Seconds until the current certificate expires, truncated (negative
    /// once expired), +Inf without one: the kubelet's TTL gauges.
    pub fn ttl_seconds(&self, now: SystemTime) -> f64 {
        match &*self.current.borrow() {
            None => f64::INFINITY,
            Some(p) => match p.not_after.duration_since(now) {
                Ok(d) => d.as_secs_f64().trunc(),
                Err(e) => -e.duration().as_secs_f64().trunc(),
            },
        }
    }
}

/// The kubelet's certificate manager metrics, for the managers that run
/// (the client ones with rotateCertificates, the serving ones with
/// serverTLSBootstrap, as the kubelet registers them).
#[derive(Default)]
pub struct CertificateMetrics {
    pub client: Option<Arc<Manager>>,
    pub serving: Option<Arc<Manager>>,
}

impl fmt::Debug for CertificateMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateMetrics").finish()
    }
}

impl Collector for CertificateMetrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let now = SystemTime::now();
        let errors = |m: &Manager| m.renew_errors.load(std::sync::atomic::Ordering::Relaxed) as f64;
        if let Some(m) = &self.client {
            let e = enc.encode_descriptor(
                "kubelet_certificate_manager_client_ttl_seconds",
                "[ALPHA] Gauge of the TTL (time-to-live) of the Kubelet's client certificate. The value is in seconds until certificate expiry (negative if already expired). If client certificate is invalid or unused, the value will be +INF.",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(m.ttl_seconds(now)).encode(e)?;
            let e = enc.encode_descriptor(
                "kubelet_certificate_manager_client_expiration_renew_errors",
                "[ALPHA] Counter of certificate renewal errors.",
                None,
                MetricType::Counter,
            )?;
            ConstCounter::new(errors(m)).encode(e)?;
        }
        if let Some(m) = &self.serving {
            let e = enc.encode_descriptor(
                "kubelet_certificate_manager_server_ttl_seconds",
                "[ALPHA] Gauge of the shortest TTL (time-to-live) of the Kubelet's serving certificate. The value is in seconds until certificate expiry (negative if already expired). If serving certificate is invalid or unused, the value will be +INF.",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(m.ttl_seconds(now)).encode(e)?;
            let e = enc.encode_descriptor(
                "kubelet_server_expiration_renew_errors",
                "[ALPHA] Counter of certificate renewal errors.",
                None,
                MetricType::Counter,
            )?;
            ConstCounter::new(errors(m)).encode(e)?;
            let e = enc.encode_descriptor(
                "kubelet_certificate_manager_server_rotation_seconds",
                "[ALPHA] Histogram of the number of seconds the previous certificate lived before being rotated.",
                None,
                MetricType::Histogram,
            )?;
            m.rotation_age.encode(e)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use async_trait::async_trait;
    use k8s_openapi::{
        ByteString,
        api::certificates::v1::{
            CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestStatus,
        },
    };

    use super::*;

    /// A CSR API that signs every request with a short lifetime, or
    /// refuses the first `fail` ones.
    struct Signer {
        lifetime: Duration,
        fail: Mutex<u32>,
        issued: Mutex<HashMap<String, CertificateSigningRequest>>,
    }

    #[async_trait]
    impl CsrApi for Signer {
        async fn create(&self, csr: &CertificateSigningRequest) -> Result<String, String> {
            {
                let mut f = self.fail.lock();
                if *f > 0 {
                    *f -= 1;
                    return Err("the API server is away".into());
                }
            }
            let req = String::from_utf8(csr.spec.request.0.clone()).unwrap();
            let params = rcgen::CertificateSigningRequestParams::from_pem(&req).unwrap();
            let ca_key = rcgen::KeyPair::generate().unwrap();
            let ca = rcgen::Issuer::new(rcgen::CertificateParams::default(), ca_key);
            let mut p = params;
            let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap();
            p.params.not_before = rcgen::date_time_ymd(1970, 1, 1) + now;
            p.params.not_after = rcgen::date_time_ymd(1970, 1, 1) + now + self.lifetime;
            let cert = p.signed_by(&ca).unwrap().pem();
            let mut issued = self.issued.lock();
            let name = format!("csr-{}", issued.len());
            let mut out = csr.clone();
            out.status = Some(CertificateSigningRequestStatus {
                conditions: Some(vec![CertificateSigningRequestCondition {
                    type_: "Approved".into(),
                    status: "True".into(),
                    ..Default::default()
                }]),
                certificate: Some(ByteString(cert.into_bytes())),
            });
            issued.insert(name.clone(), out);
            Ok(name)
        }

        async fn get(&self, name: &str) -> Result<CertificateSigningRequest, String> {
            self.issued.lock().get(name).cloned().ok_or_else(|| "not found".into())
        }
    }

    #[tokio::test]
    async fn renews_before_expiry_counts_failures_and_publishes() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path(), "kubelet-client");
        let m = Arc::new(Manager::new(Kind::Client, store, Template::node("n1")));
        assert_eq!(m.ttl_seconds(SystemTime::now()), f64::INFINITY);
        let api =
            Arc::new(Signer { lifetime: Duration::from_secs(4), fail: Mutex::new(1), issued: Default::default() });
        let stop = CancellationToken::new();
        let rx = stop.clone();
        let mut current = m.current();
        let task = tokio::spawn(m.clone().run(api.clone(), rx));
        // No certificate: asked at once; the first request fails, the
        // retry (2 s later) is issued.
        tokio::time::timeout(Duration::from_secs(10), current.wait_for(|c| c.is_some())).await.unwrap().unwrap();
        let first = current.borrow_and_update().clone().unwrap();
        assert_eq!(m.renew_errors.load(std::sync::atomic::Ordering::Relaxed), 1);
        let ttl = m.ttl_seconds(SystemTime::now());
        assert!((0.0..=4.0).contains(&ttl), "{ttl}");
        // Renewed at 70..90 % of its 4 s.
        tokio::time::timeout(Duration::from_secs(10), current.changed()).await.unwrap().unwrap();
        let second = current.borrow().clone().unwrap();
        assert_ne!(second.cert_pem, first.cert_pem);
        assert!(SystemTime::now() < first.not_after, "renewed before the old one expired");
        let text =
            crate::server::exposition::encode(&[&crate::server::collectors::registry_with(CertificateMetrics {
                client: Some(m.clone()),
                serving: None,
            })]);
        assert!(text.contains("# TYPE kubelet_certificate_manager_client_ttl_seconds gauge"), "{text}");
        assert!(text.contains("kubelet_certificate_manager_client_expiration_renew_errors 1"), "{text}");
        stop.cancel();
        task.await.unwrap();
    }
}
