//! The metrics endpoints, as the kubelet serves them: /metrics (the
//! agent's registry and the scrape-time families), /metrics/resource and
//! /metrics/cadvisor (collectors over the latest stats pass, each pass
//! encoded once however many scrapers ask), /metrics/probes (the prober's
//! registry) and /metrics/slis (the health checks' SLIs). All in the text
//! format, whatever the `Accept` header asks.

use bytes::Bytes;
use hyper::{Response, StatusCode};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use super::{Server, collectors, exposition, http, http::Body, stats};
use crate::metrics::NameLabels;

fn text(body: impl Into<Bytes>) -> Response<Body> {
    http::respond(StatusCode::OK, exposition::CONTENT_TYPE, body.into())
}

impl Server {
    /// GET /metrics, /metrics/resource, /metrics/cadvisor, /metrics/probes
    /// or /metrics/slis.
    pub(super) async fn metrics_route(&self, path: &str) -> Response<Body> {
        match path {
            "/metrics" => self.metrics_page(),
            "/metrics/resource" | "/metrics/cadvisor" => {
                let snap = self.stats.latest().await;
                let key = if path == "/metrics/resource" { "resource" } else { "cadvisor" };
                if key == "cadvisor" {
                    // From now on each pass is encoded before it is asked for.
                    self.cadvisor_scraped.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                text(self.encoded(key, 0, &snap, || encode_stats(key, &snap)))
            }
            "/metrics/probes" => text(exposition::encode(&[&self.probes])),
            _ => text(exposition::encode(&[&self.health.slis().registry()])),
        }
    }

    fn metrics_page(&self) -> Response<Body> {
        if let Some(src) = &self.source {
            for (name, v) in src.counters() {
                self.metrics.signal_counters.get_or_create(&NameLabels { name: name.into() }).set(v as i64);
            }
        }
        text(exposition::encode(&[&self.metrics.registry, &self.extra]))
    }

    /// The body for `key`/`variant` from this stats pass, encoding it the
    /// first time it is asked for.
    pub(super) fn encoded(
        &self,
        key: &'static str,
        variant: u8,
        snap: &stats::StatsSnapshot,
        encode: impl FnOnce() -> Vec<u8>,
    ) -> Bytes {
        let lock = || self.encoded.lock();
        if let Some((t, b)) = lock().get(&(key, variant))
            && *t == snap.time
        {
            return b.clone();
        }
        // Encoded outside the lock: a scrape racing the warm-up encodes
        // twice rather than waiting.
        let body = Bytes::from(encode());
        let mut cache = lock();
        if cache.get(&(key, variant)).is_none_or(|(t, _)| *t <= snap.time) {
            cache.insert((key, variant), (snap.time, body.clone()));
        }
        body
    }

    /// Encodes each new stats pass for the usual scrapes (resource
    /// metrics, the full summary, and cAdvisor's once scraped) as soon as
    /// it is taken, so no request pays for the encoding.
    pub(super) async fn warm(self: std::sync::Arc<Self>, shutdown: CancellationToken) {
        let mut passes = self.stats.subscribe();
        loop {
            tokio::select! {
                r = passes.changed() => if r.is_err() { break },
                _ = shutdown.cancelled() => break,
            }
            let Some(snap) = passes.borrow_and_update().clone() else { continue };
            let me = self.clone();
            let _ = tokio::task::spawn_blocking(move || {
                me.encoded("resource", 0, &snap, || encode_stats("resource", &snap));
                // The larger cAdvisor body only once somebody scrapes it.
                if me.cadvisor_scraped.load(std::sync::atomic::Ordering::Relaxed) {
                    me.encoded("cadvisor", 0, &snap, || encode_stats("cadvisor", &snap));
                }
                me.encoded("summary", 0, &snap, || {
                    serde_json::to_vec(&super::summary_body(&snap, false)).unwrap_or_default()
                });
            })
            .await;
        }
    }
}

/// /metrics/resource (`key` "resource") or /metrics/cadvisor of a pass.
fn encode_stats(key: &str, snap: &std::sync::Arc<stats::StatsSnapshot>) -> Vec<u8> {
    let r: Registry = if key == "resource" {
        collectors::registry_with(collectors::ResourceCollector(snap.clone()))
    } else {
        collectors::registry_with(super::cadvisor::CadvisorCollector(snap.clone()))
    };
    exposition::encode(&[&r]).into_bytes()
}
