//! The HTTP plumbing shared by the kubelet's servers: the response body
//! type (whole or streamed), response helpers, and the accept loops for
//! plain TCP, TLS and unix sockets, each connection served by hyper (HTTP/1.1
//! and, over TLS with ALPN, HTTP/2).

use std::{convert::Infallible, future::Future, net::SocketAddr, sync::Arc};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::{
    Request, Response, StatusCode,
    body::{Frame, Incoming},
    header::{CONTENT_TYPE, HeaderValue},
    service::service_fn,
};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use rustls::pki_types::CertificateDer;
use tokio::{
    net::{TcpListener, UnixListener},
    sync::{mpsc, watch},
    task::JoinSet,
};
use tokio_rustls::TlsAcceptor;
use tracing::debug;

/// A response body: a whole buffer, or chunks sent as they are produced.
pub type Body = BoxBody<Bytes, Infallible>;

/// What the server knows about the connection a request came on.
#[derive(Clone, Debug, Default)]
pub struct ConnInfo {
    pub peer: Option<SocketAddr>,
    /// The client's certificate chain (end entity first), as presented in
    /// the TLS handshake; empty for plain connections or no certificate.
    pub client_certs: Arc<Vec<CertificateDer<'static>>>,
}

pub fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into()).boxed()
}

/// A streamed body fed through the returned sender; the body ends when the
/// sender is dropped. A failed send means the client went away.
pub fn channel(capacity: usize) -> (mpsc::Sender<Bytes>, Body) {
    let (tx, rx) = mpsc::channel::<Bytes>(capacity);
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    (tx, StreamBody::new(stream).boxed())
}

pub fn respond(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

pub fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    respond(status, "text/plain; charset=utf-8", body)
}

pub fn json(status: StatusCode, value: &impl serde::Serialize) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(v) => respond(status, "application/json", v),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot encode the response: {e}")),
    }
}

pub fn not_found() -> Response<Body> {
    text(StatusCode::NOT_FOUND, "404 page not found\n")
}

/// The query parameters of a request, decoded (`+` and `%XX`).
pub fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    let Some(q) = query else { return vec![] };
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match std::str::from_utf8(&b[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Resolves once `shutdown` turns true (or its sender is gone).
pub async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

/// Serves one connection with hyper until it closes or `shutdown` turns true.
async fn serve_connection<I, H, F>(io: I, conn: ConnInfo, handler: H, mut shutdown: watch::Receiver<bool>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>, ConnInfo) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let handler = Arc::new(handler);
    let service = service_fn(move |req| {
        let handler = handler.clone();
        let conn = conn.clone();
        async move { Ok::<_, Infallible>(handler(req, conn).await) }
    });
    let builder = auto::Builder::new(TokioExecutor::new());
    // With upgrades: exec, attach and port-forward switch protocols.
    let served = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::select! {
        r = served => if let Err(e) = r { debug!("connection: {e}") },
        _ = stopped(&mut shutdown) => {}
    }
}

/// Accepts plain TCP connections until `shutdown` turns true.
pub async fn serve_tcp<H, F>(listener: TcpListener, handler: H, shutdown: watch::Receiver<bool>)
where
    H: Fn(Request<Incoming>, ConnInfo) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let mut conns = JoinSet::new();
    let mut stop = shutdown.clone();
    loop {
        tokio::select! {
            a = listener.accept() => match a {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let conn = ConnInfo { peer: Some(peer), ..Default::default() };
                    conns.spawn(serve_connection(stream, conn, handler.clone(), shutdown.clone()));
                }
                Err(e) => debug!("accept: {e}"),
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = stopped(&mut stop) => break,
        }
    }
}

/// Accepts TLS connections until `shutdown` turns true. The handshake runs
/// in the connection's own task, so a slow client cannot stall the others.
pub async fn serve_tls<H, F>(listener: TcpListener, acceptor: TlsAcceptor, handler: H, shutdown: watch::Receiver<bool>)
where
    H: Fn(Request<Incoming>, ConnInfo) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let mut conns = JoinSet::new();
    let mut stop = shutdown.clone();
    loop {
        tokio::select! {
            a = listener.accept() => match a {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let acceptor = acceptor.clone();
                    let handler = handler.clone();
                    let shutdown = shutdown.clone();
                    conns.spawn(async move {
                        let handshake = tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(stream));
                        let tls = match handshake.await {
                            Ok(Ok(tls)) => tls,
                            Ok(Err(e)) => return debug!(%peer, "TLS handshake: {e}"),
                            Err(_) => return debug!(%peer, "TLS handshake timed out"),
                        };
                        let certs = tls.get_ref().1.peer_certificates().map(|c| c.iter().map(|c| c.clone().into_owned()).collect()).unwrap_or_default();
                        let conn = ConnInfo { peer: Some(peer), client_certs: Arc::new(certs) };
                        serve_connection(tls, conn, handler, shutdown).await;
                    });
                }
                Err(e) => debug!("accept: {e}"),
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = stopped(&mut stop) => break,
        }
    }
}

/// Accepts unix-socket connections until `shutdown` turns true.
pub async fn serve_unix<H, F>(listener: UnixListener, handler: H, shutdown: watch::Receiver<bool>)
where
    H: Fn(Request<Incoming>, ConnInfo) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let mut conns = JoinSet::new();
    let mut stop = shutdown.clone();
    loop {
        tokio::select! {
            a = listener.accept() => match a {
                Ok((stream, _)) => {
                    conns.spawn(serve_connection(stream, ConnInfo::default(), handler.clone(), shutdown.clone()));
                }
                Err(e) => debug!("accept: {e}"),
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = stopped(&mut stop) => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        assert_eq!(
            query_pairs(Some("tailLines=2&follow&sinceTime=2024-01-01T00%3A00%3A00Z&a+b=c%2")),
            vec![
                ("tailLines".into(), "2".into()),
                ("follow".into(), "".into()),
                ("sinceTime".into(), "2024-01-01T00:00:00Z".into()),
                ("a b".into(), "c%2".into()),
            ]
        );
        assert!(query_pairs(None).is_empty());
    }
}
