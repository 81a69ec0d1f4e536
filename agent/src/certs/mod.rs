//! The node's certificates, as kubeadm nodes need them (the kubelet's
//! certificate managers):
//!
//! - `rotateCertificates`: the client certificate (`kubelet-client-current.pem`)
//!   renewed by CSR (signer `kubernetes.io/kube-apiserver-client-kubelet`)
//!   at a jittered 70–90 % of its lifetime; every API client of the agent
//!   then uses it without a restart ([`SwappableClient`]);
//! - `serverTLSBootstrap`: the serving certificate of :10250 requested by CSR
//!   (signer `kubernetes.io/kubelet-serving`, the node's addresses as
//!   names), served once approved and rotated the same way
//!   ([`ServingResolver`]).
//!
//! | module | concern |
//! |---|---|
//! | `rotation.rs` | deadlines and retry back-off (pure) |
//! | `store.rs` | the pairs on disk, client-go's file store layout |
//! | `csr.rs` | CSRs: the request, the signer and usages, waiting for the certificate |
//! | `manager.rs` | one certificate kept current; the kubelet's certificate metrics |

pub mod csr;
pub mod manager;
pub mod rotation;
pub mod store;

use std::{
    fmt,
    sync::Arc,
    task::{Context, Poll},
};

use futures::future::BoxFuture;
use http::{Request, Response};
use parking_lot::RwLock;
use rustls::{
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use tokio_util::sync::CancellationToken;

pub use self::manager::{CertificateMetrics, Current, Manager};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A kube client whose connection to the API server can be replaced while
/// it is in use: requests already sent finish on the old one, new ones go
/// to the new one (its pool, its certificate). The agent's clients are
/// built over it before the API server is reached, so the webhooks never
/// use bootstrap credentials; before the first connection every request
/// fails with "not connected".
#[derive(Clone, Default)]
pub struct SwappableClient(Arc<RwLock<Option<kube::Client>>>);

impl fmt::Debug for SwappableClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SwappableClient")
    }
}

impl SwappableClient {
    pub fn set(&self, client: kube::Client) {
        *self.0.write() = Some(client);
    }

    pub fn is_set(&self) -> bool {
        self.0.read().is_some()
    }

    /// A kube client over this one, with `layer` (the rate limiter) in
    /// front.
    pub fn client_with<L>(&self, layer: L) -> kube::Client
    where
        L: tower::Layer<SwappableClient>,
        L::Service: tower::Service<Request<kube::client::Body>, Response = Response<kube::client::Body>, Error = BoxError>
            + Send
            + 'static,
        <L::Service as tower::Service<Request<kube::client::Body>>>::Future: Send + 'static,
    {
        kube::Client::new(layer.layer(self.clone()), "default")
    }
}

impl tower::Service<Request<kube::client::Body>> for SwappableClient {
    type Response = Response<kube::client::Body>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<kube::client::Body>) -> Self::Future {
        let client = self.0.read().clone();
        Box::pin(async move {
            match client {
                // kube's Client::send returns its own error, which the
                // outer client unwraps again.
                Some(c) => c.send(req).await.map_err(|e| Box::new(e) as BoxError),
                None => Err("not connected to the API server yet".into()),
            }
        })
    }
}

/// The serving certificate for rustls, read at each handshake from the
/// certificate in effect (none until a CSR is issued: handshakes then
/// fail, as the kubelet's do while it waits for approval).
pub struct ServingResolver {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl fmt::Debug for ServingResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ServingResolver")
    }
}

impl ServingResolver {
    pub fn new(key: Option<Arc<CertifiedKey>>) -> ServingResolver {
        ServingResolver { current: RwLock::new(key) }
    }

    pub fn set(&self, key: Option<Arc<CertifiedKey>>) {
        *self.current.write() = key;
    }

    /// Follows a manager's certificate until the manager goes or
    /// `shutdown` is cancelled.
    pub fn follow(self: &Arc<Self>, mut current: Current, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                let pair = current.borrow_and_update().clone();
                match pair.as_deref().map(certified_key).transpose() {
                    Ok(k) => me.set(k.map(Arc::new)),
                    Err(e) => tracing::warn!("the serving certificate cannot be used: {e}"),
                }
                tokio::select! {
                    r = current.changed() => if r.is_err() { return },
                    _ = shutdown.cancelled() => return,
                }
            }
        })
    }
}

impl ResolvesServerCert for ServingResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().clone()
    }
}

/// A pair as rustls serves it.
pub fn certified_key(p: &store::Pair) -> Result<CertifiedKey, String> {
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(p.chain.clone(), p.key(), &provider).map_err(|e| format!("{}: {e}", p.source.display()))
}
