//! The HTTP plumbing shared by the kubelet's servers: the response body
//! type (whole or streamed) and response helpers. The accept loops are in
//! `listen.rs`, the connection limits in `conn.rs`.

use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::{
    Response, StatusCode,
    body::Frame,
    header::{CONTENT_TYPE, HeaderValue},
};
use rustls::pki_types::CertificateDer;
use tokio::sync::mpsc;

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
