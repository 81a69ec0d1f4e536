//! A small HTTPS client for the kubelet API in tests and benches: HTTP/1.1
//! over rustls, optionally with a client certificate or a bearer token,
//! trusting any server certificate (as `curl -k`; the kubelet's is
//! self-signed) while recording the one it saw.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::{Context as _, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{Request, body::Incoming, client::conn::http1::SendRequest};
use hyper_util::rt::TokioIo;
use rustls::{
    ClientConfig, DigitallySignedStruct, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::{WebPkiSupportedAlgorithms, ring},
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime},
};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// A client certificate chain and its key.
#[derive(Debug)]
pub struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Identity { chain: self.chain.clone(), key: self.key.clone_key() }
    }
}

#[derive(Debug)]
struct AnyServer(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// One answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> String {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
    }
}

#[derive(Clone)]
pub struct Https {
    pub addr: SocketAddr,
    config: Arc<ClientConfig>,
    pub token: Option<String>,
}

/// A kept-alive connection (for benches).
pub struct Conn {
    send: SendRequest<Empty<Bytes>>,
    token: Option<String>,
    /// The server's certificate chain as presented.
    pub server_certs: Vec<CertificateDer<'static>>,
}

impl Https {
    /// Waits until the agent's /pods lists a pod whose name starts with
    /// `name` with its container `app` running; returns its (namespace,
    /// name).
    pub async fn wait_running(&self, name: &str) -> (String, String) {
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        loop {
            let r = self.get("/pods").await.unwrap();
            let list: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
            for p in list["items"].as_array().cloned().unwrap_or_default() {
                let pname = p["metadata"]["name"].as_str().unwrap_or_default().to_owned();
                let running = p["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["name"] == "app" && c["state"]["running"].is_object()));
                if pname.starts_with(name) && running {
                    return (p["metadata"]["namespace"].as_str().unwrap_or("default").to_owned(), pname);
                }
            }
            assert!(std::time::Instant::now() < deadline, "pod {name} did not run within 90s; /pods: {}", r.text());
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    pub fn new(addr: SocketAddr, identity: Option<Identity>) -> Https {
        let p = ring::default_provider();
        let algs = p.signature_verification_algorithms;
        let b = ClientConfig::builder_with_provider(Arc::new(p))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer(algs)));
        let mut config = match identity {
            Some(id) => b.with_client_auth_cert(id.chain, id.key).expect("client certificate"),
            None => b.with_no_client_auth(),
        };
        // A full handshake each time: `server_certs` is then the
        // certificate the server serves now, not a resumed session's.
        config.resumption = rustls::client::Resumption::disabled();
        Https { addr, config: Arc::new(config), token: None }
    }

    pub fn with_token(mut self, token: &str) -> Https {
        self.token = Some(token.to_owned());
        self
    }

    pub async fn connect(&self) -> Result<Conn> {
        let tcp = TcpStream::connect(self.addr).await.with_context(|| format!("connecting to {}", self.addr))?;
        tcp.set_nodelay(true)?;
        let name = ServerName::try_from("localhost").expect("server name");
        let tls = TlsConnector::from(self.config.clone()).connect(name, tcp).await.context("TLS handshake")?;
        let server_certs = tls
            .get_ref()
            .1
            .peer_certificates()
            .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
            .unwrap_or_default();
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.context("HTTP handshake")?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn { send, token: self.token.clone(), server_certs })
    }

    /// GET `path` on a fresh connection and read the whole body.
    pub async fn get(&self, path: &str) -> Result<Reply> {
        self.get_with(path, &[]).await
    }

    pub async fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Result<Reply> {
        let mut c = self.connect().await?;
        c.get_with(path, headers).await
    }

    /// `method` `path` on a fresh connection (a POST with no body, say).
    pub async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Result<Reply> {
        let mut c = self.connect().await?;
        let mut req = c.request(path, headers)?;
        *req.method_mut() = http::Method::from_bytes(method.as_bytes())?;
        c.send.ready().await.context("the connection closed")?;
        let r = c.send.send_request(req).await.with_context(|| format!("{method} {path}"))?;
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let body = r.into_body().collect().await?.to_bytes().to_vec();
        Ok(Reply { status, headers, body })
    }

    /// GET `path` and return the head and the body as it streams.
    pub async fn stream(&self, path: &str) -> Result<(u16, Incoming)> {
        let mut c = self.connect().await?;
        let r = c.send.send_request(c.request(path, &[])?).await?;
        Ok((r.status().as_u16(), r.into_body()))
    }
}

impl Conn {
    /// Whether the server has closed the connection (nothing is sent to
    /// find out, so an idle connection stays idle).
    pub fn is_closed(&self) -> bool {
        self.send.is_closed()
    }

    fn request(&self, path: &str, headers: &[(&str, &str)]) -> Result<Request<Empty<Bytes>>> {
        let mut b = Request::get(path).header("host", "localhost");
        if let Some(t) = &self.token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        Ok(b.body(Empty::new())?)
    }

    pub async fn get_with(&mut self, path: &str, headers: &[(&str, &str)]) -> Result<Reply> {
        let req = self.request(path, headers)?;
        // The previous response must be read to its end first.
        self.send.ready().await.context("the connection closed")?;
        let r = self.send.send_request(req).await.with_context(|| format!("GET {path}"))?;
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let body = r.into_body().collect().await?.to_bytes().to_vec();
        Ok(Reply { status, headers, body })
    }

    pub async fn get(&mut self, path: &str) -> Result<Reply> {
        self.get_with(path, &[]).await
    }
}

/// Reads from a streaming body until `done` says the text so far is
/// enough, or `timeout` passes.
pub async fn read_until(body: &mut Incoming, timeout: Duration, done: impl Fn(&str) -> bool) -> Result<String> {
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + timeout;
    while !done(&text) {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(f)) => f?,
            Ok(None) => bail!("the stream ended; got so far: {text:?}"),
            Err(_) => bail!("timed out after {timeout:?}; got so far: {text:?}"),
        };
        if let Ok(d) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&d));
        }
    }
    Ok(text)
}
