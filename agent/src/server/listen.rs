//! The accept loops of the kubelet's servers (TCP with or without TLS, and
//! the unix socket), each connection served by hyper (HTTP/1.1 and, over
//! TLS with ALPN, HTTP/2) within the limits of `conn.rs`.
//!
//! Running out of file descriptors (EMFILE, ENFILE) closes the oldest
//! waiting connection and backs off (5 ms doubling to 1 s) instead of
//! retrying the accept in a spin: the pending connection stays in the
//! kernel's backlog until a descriptor is free.

use std::{convert::Infallible, future::Future, io, net::SocketAddr, sync::Arc, task::Poll, time::Duration};

use hyper::{Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
use rustls::ServerConfig;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream, UnixListener, UnixStream},
    sync::watch,
    task::JoinSet,
};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::{
    conn::{self, Conn, Connections, GuardedBody, TrackedIo},
    http::{Body, ConnInfo},
};

/// A listening socket.
pub trait Listener: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn poll_accept(&self, cx: &mut std::task::Context<'_>) -> Poll<io::Result<(Self::Io, Option<SocketAddr>)>>;
    /// Per-connection socket options.
    fn prepare(_io: &Self::Io) {}
}

impl Listener for TcpListener {
    type Io = TcpStream;

    fn poll_accept(&self, cx: &mut std::task::Context<'_>) -> Poll<io::Result<(TcpStream, Option<SocketAddr>)>> {
        TcpListener::poll_accept(self, cx).map_ok(|(s, a)| (s, Some(a)))
    }

    fn prepare(io: &TcpStream) {
        let _ = io.set_nodelay(true);
    }
}

impl Listener for UnixListener {
    type Io = UnixStream;

    fn poll_accept(&self, cx: &mut std::task::Context<'_>) -> Poll<io::Result<(UnixStream, Option<SocketAddr>)>> {
        UnixListener::poll_accept(self, cx).map_ok(|(s, _)| (s, None))
    }
}

/// TLS for a listener: the configuration in effect now (it changes when
/// the serving certificate rotates or the client CA file changes; each
/// new connection takes the current one).
pub type TlsConfig = watch::Receiver<Arc<ServerConfig>>;

/// Accepts connections until `shutdown` is cancelled.
pub async fn serve<L, H, F>(
    listener: L,
    conns: Arc<Connections>,
    tls: Option<TlsConfig>,
    handler: H,
    shutdown: CancellationToken,
) where
    L: Listener,
    H: Fn(Request<Incoming>, ConnInfo) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let mut tasks = JoinSet::new();
    let stop = shutdown.clone();
    let mut backoff: Option<Duration> = None;
    loop {
        let accepted = tokio::select! {
            a = std::future::poll_fn(|cx| listener.poll_accept(cx)) => a,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            _ = stop.cancelled() => break,
        };
        let (io, peer) = match accepted {
            Ok(a) => {
                backoff = None;
                a
            }
            Err(e) if conn::is_exhaustion(&e) => {
                let wait = conn::next_backoff(backoff);
                backoff = Some(wait);
                let freed = conns.evict_one();
                warn!(open = conns.open(), closed_one = freed, "accept: {e}; retrying in {wait:?}");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.cancelled() => break,
                }
                continue;
            }
            Err(e) => {
                debug!("accept: {e}");
                continue;
            }
        };
        L::prepare(&io);
        let Some(slot) = conns.admit() else {
            debug!(?peer, open = conns.open(), "every connection is busy: closing the new one");
            continue;
        };
        let limits = conns.limits;
        let io = TrackedIo::new(io, slot, limits.write_timeout);
        let info = ConnInfo { peer, ..Default::default() };
        let handler = handler.clone();
        let shutdown = shutdown.clone();
        let tls = tls.as_ref().map(|t| TlsAcceptor::from(t.borrow().clone()));
        tasks.spawn(async move {
            let conn = io.conn().clone();
            match tls {
                None => {
                    conn.handshake_done();
                    serve_connection(io, conn, limits, info, handler, shutdown).await
                }
                Some(acceptor) => {
                    let handshake = tokio::select! {
                        r = tokio::time::timeout(limits.request_header_timeout, acceptor.accept(io)) => r,
                        _ = conn.closed() => return debug!(?peer, "closed during the TLS handshake to make room"),
                    };
                    let tls = match handshake {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => return debug!(?peer, "TLS handshake: {e}"),
                        Err(_) => return debug!(?peer, "TLS handshake timed out"),
                    };
                    let certs = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
                        .unwrap_or_default();
                    conn.handshake_done();
                    let info = ConnInfo { client_certs: Arc::new(certs), ..info };
                    serve_connection(tls, conn, limits, info, handler, shutdown).await
                }
            }
        });
    }
}

/// Serves one connection with hyper until it closes, expires, is closed to
/// make room, or `shutdown` is cancelled.
async fn serve_connection<I, H, F>(
    io: I,
    conn: Arc<Conn>,
    limits: conn::Limits,
    info: ConnInfo,
    handler: H,
    shutdown: CancellationToken,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>, ConnInfo) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let handler = Arc::new(handler);
    let c = conn.clone();
    let service = service_fn(move |req| {
        let handler = handler.clone();
        let info = info.clone();
        let in_flight = c.request();
        let c = c.clone();
        async move {
            let resp = handler(req, info).await;
            if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
                // The stream's own idle timeout takes over.
                c.mark_upgraded();
            }
            let (parts, body) = resp.into_parts();
            Ok::<_, Infallible>(Response::from_parts(parts, GuardedBody::wrap(body, in_flight)))
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.request_header_timeout)
        // The kubelet's MaxHeaderBytes is 1 MiB.
        .max_buf_size(1 << 20);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(250)
        .max_header_list_size(1 << 20)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20));
    // With upgrades: exec, attach and port-forward switch protocols.
    let served = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::select! {
        r = served => if let Err(e) = r { debug!("connection: {e}") },
        _ = conn.expired(limits.request_header_timeout, limits.idle_timeout) => debug!(conn = conn.id, "closed: no request within its timeout"),
        _ = conn.closed() => debug!(conn = conn.id, "closed to make room"),
        _ = shutdown.cancelled() => {}
    }
}
