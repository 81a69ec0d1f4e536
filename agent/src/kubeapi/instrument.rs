//! A tower layer that counts and times every request of a kube client in
//! client-go's REST client metrics (`rest_client_requests_total`,
//! `rest_client_request_duration_seconds`), as client-go's transport does
//! for the kubelet. The latency of a watch is the time to its response
//! headers, as in client-go.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Instant,
};

use hyper::{Request, Response};

use crate::metrics::rest_client::RestClientMetrics;

/// Wraps a client's service; `host` is the API server's `host:port` (the
/// layer sits outside kube's base-URI layer, so requests carry only their
/// path).
#[derive(Clone)]
pub struct RestClientLayer {
    pub metrics: RestClientMetrics,
    pub host: String,
}

impl<S> tower::Layer<S> for RestClientLayer {
    type Service = Instrumented<S>;

    fn layer(&self, inner: S) -> Instrumented<S> {
        Instrumented { inner, metrics: self.metrics.clone(), host: self.host.clone() }
    }
}

#[derive(Clone)]
pub struct Instrumented<S> {
    inner: S,
    metrics: RestClientMetrics,
    host: String,
}

impl<S, B, RB> tower::Service<Request<B>> for Instrumented<S>
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let method = req.method().as_str().to_owned();
        let host = req.uri().authority().map_or_else(|| self.host.clone(), |a| a.to_string());
        let metrics = self.metrics.clone();
        let started = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let out = fut.await;
            let status = out.as_ref().ok().map(|r| r.status().as_u16());
            metrics.observe(&method, &host, status, started.elapsed());
            out
        })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use tower::{Layer, Service, ServiceExt};

    use super::*;

    #[tokio::test]
    async fn requests_are_counted_by_code_method_and_host() {
        let metrics = RestClientMetrics::default();
        let layer = RestClientLayer { metrics: metrics.clone(), host: "10.0.0.1:6443".into() };
        let inner = tower::service_fn(|req: Request<()>| async move {
            let code = if req.uri().path() == "/missing" { 404 } else { 200 };
            Ok::<_, Infallible>(Response::builder().status(code).body(()).expect("response"))
        });
        let mut svc = layer.layer(inner);
        for (method, path) in [("GET", "/api/v1/nodes/n"), ("PATCH", "/api/v1/nodes/n/status"), ("GET", "/missing")] {
            let req = Request::builder().method(method).uri(path).body(()).expect("request");
            svc.ready().await.expect("ready").call(req).await.expect("response");
        }
        let mut r = prometheus_client::registry::Registry::default();
        metrics.register(&mut r);
        let text = crate::server::exposition::encode(&[&r]);
        for want in [
            "rest_client_requests_total{code=\"200\",method=\"GET\",host=\"10.0.0.1:6443\"} 1",
            "rest_client_requests_total{code=\"200\",method=\"PATCH\",host=\"10.0.0.1:6443\"} 1",
            "rest_client_requests_total{code=\"404\",method=\"GET\",host=\"10.0.0.1:6443\"} 1",
            "rest_client_request_duration_seconds_count{verb=\"GET\",host=\"10.0.0.1:6443\"} 2",
        ] {
            assert!(text.lines().any(|l| l == want), "{want:?} missing:\n{text}");
        }
    }
}
