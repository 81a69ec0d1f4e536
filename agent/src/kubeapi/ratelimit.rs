//! kubeAPIQPS/kubeAPIBurst for every API call and eventRecordQPS/eventBurst
//! for event writes: client-go's `flowcontrol.NewTokenBucketRateLimiter`,
//! whose `Wait` blocks until a token is there. The bucket is
//! [`crate::flowcontrol::TokenBucket`]; [`RateLimitLayer`] puts it in front
//! of kube's client.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

/// The shared bucket callers wait on (client-go's name for it).
pub use crate::flowcontrol::TokenBucket as RateLimiter;

/// A tower layer that makes every request wait for a token.
#[derive(Clone, Debug)]
pub struct RateLimitLayer(pub Arc<RateLimiter>);

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited { inner, limiter: self.0.clone(), sleep: None, permitted: false }
    }
}

pub struct RateLimited<S> {
    inner: S,
    limiter: Arc<RateLimiter>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    permitted: bool,
}

impl<S, R> tower::Service<R> for RateLimited<S>
where
    S: tower::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        // Until a token is taken: try, else sleep until one may be there.
        while !self.permitted {
            if let Some(s) = self.sleep.as_mut() {
                if s.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            match self.limiter.try_acquire() {
                None => self.permitted = true,
                Some(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> S::Future {
        self.permitted = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use std::{convert::Infallible, time::Duration};

    use tower::{Service, ServiceExt};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_layer_spaces_requests_at_qps_after_the_burst() {
        let limiter = Arc::new(RateLimiter::new(10.0, 2));
        let mut svc = tower::Layer::layer(
            &RateLimitLayer(limiter),
            tower::service_fn(|r: u32| async move { Ok::<_, Infallible>(r) }),
        );
        let start = tokio::time::Instant::now();
        for i in 0..4 {
            assert_eq!(svc.ready().await.unwrap().call(i).await.unwrap(), i);
        }
        // Two at once (the burst), two more at 10/s.
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(199) && took < Duration::from_millis(300), "{took:?}");
    }
}
