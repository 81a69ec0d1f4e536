//! client-go's REST client metrics (component-base/metrics/prometheus/
//! restclient): every request the agent makes to the API server, by
//! status code, method and host, and its latency by verb and host.
//!
//! As in client-go, one set is shared by every client of the process (the
//! API agent's, the TLS bootstrap's, the webhooks'): [`RestClientMetrics::
//! global`] is what `kubeapi::client` instruments its clients with, and
//! what [`crate::metrics::Metrics`] serves.

use std::{sync::OnceLock, time::Duration};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

/// client-go's latency buckets.
pub const LATENCY_BUCKETS: [f64; 12] = [0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// The HTTP status code, or `<error>` when no response came back.
    pub code: String,
    pub method: String,
    pub host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabels {
    pub verb: String,
    pub host: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// The REST client families; clones share their values.
#[derive(Clone)]
pub struct RestClientMetrics {
    /// rest_client_requests_total{code,method,host}
    pub requests: Family<ResultLabels, Counter>,
    /// rest_client_request_duration_seconds{verb,host}
    pub request_duration: Family<VerbLabels, Histogram, fn() -> Histogram>,
}

impl Default for RestClientMetrics {
    fn default() -> Self {
        RestClientMetrics {
            requests: Family::default(),
            request_duration: Family::new_with_constructor(latency_histogram),
        }
    }
}

impl RestClientMetrics {
    /// The process-wide set.
    pub fn global() -> &'static RestClientMetrics {
        static GLOBAL: OnceLock<RestClientMetrics> = OnceLock::new();
        GLOBAL.get_or_init(RestClientMetrics::default)
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "rest_client_requests",
            "[ALPHA] Number of HTTP requests, partitioned by status code, method, and host",
            self.requests.clone(),
        );
        registry.register(
            "rest_client_request_duration_seconds",
            "[ALPHA] Request latency in seconds. Broken down by verb, and host",
            self.request_duration.clone(),
        );
    }

    /// One request answered with `status` (None: no response) after `took`.
    pub fn observe(&self, method: &str, host: &str, status: Option<u16>, took: Duration) {
        let code = status.map_or_else(|| "<error>".to_owned(), |s| s.to_string());
        self.requests.get_or_create(&ResultLabels { code, method: method.into(), host: host.into() }).inc();
        self.request_duration
            .get_or_create(&VerbLabels { verb: method.into(), host: host.into() })
            .observe(took.as_secs_f64());
    }
}
