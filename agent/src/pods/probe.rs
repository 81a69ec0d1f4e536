//! Probes and lifecycle handlers: exec (through CRI ExecSync), httpGet,
//! tcpSocket and grpc (grpc.health.v1), with the kubelet's semantics:
//! an HTTP status in [200, 400) is success, the connection counts against
//! timeoutSeconds, and named ports resolve against the container's ports.
//!
//! HTTP requests go through `probe/http.rs` (hyper, nothing from the spec
//! written raw, same-host redirects, 10 KiB of body); exec output is capped
//! at 10 KiB and its control characters escaped before it becomes a
//! message in events and logs.
//!
//! [`Tracker`] turns single results into the probe's verdict with
//! successThreshold / failureThreshold (pure); the worker runs one task per
//! probe of each running container.

use std::{net::IpAddr, time::Duration};

use k8s_openapi::{
    api::core::v1::{Container, ExecAction, GRPCAction, HTTPGetAction, Probe, TCPSocketAction},
    apimachinery::pkg::util::intstr::IntOrString,
};
use tokio::net::TcpStream;

use crate::cri::RuntimeService;

mod http;

/// The kubelet's maxReadLength: what an exec probe's output may add to a
/// message (stdout and stderr together).
pub const MAX_EXEC_OUTPUT: usize = 10 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeType {
    Liveness,
    Readiness,
    Startup,
}

impl ProbeType {
    /// As in events ("Liveness probe failed: ...") and prober_probe_total.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeType::Liveness => "Liveness",
            ProbeType::Readiness => "Readiness",
            ProbeType::Startup => "Startup",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// The handler ran and said no (with its output).
    Failure(String),
    /// The handler could not run (an error on our side); kubelet treats
    /// it as a failure for thresholds, and reports it as "unknown".
    Error(String),
}

impl Outcome {
    pub fn ok(&self) -> bool {
        matches!(self, Outcome::Success)
    }

    /// prober_probe_total's result label.
    pub fn result_label(&self) -> &'static str {
        match self {
            Outcome::Success => "successful",
            Outcome::Failure(_) => "failed",
            Outcome::Error(_) => "unknown",
        }
    }
}

/// Where a handler runs.
#[derive(Clone, Debug)]
pub struct Target<'a> {
    pub container_id: &'a str,
    pub container: &'a Container,
    /// The pod IP (the node IP for host-network pods).
    pub pod_ip: Option<IpAddr>,
}

/// The consecutive-results rule (the kubelet's prober worker).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tracker {
    success_threshold: u32,
    failure_threshold: u32,
    successes: u32,
    failures: u32,
    /// The verdict so far; None until a threshold was reached.
    pub verdict: Option<bool>,
}

impl Tracker {
    pub fn new(p: &Probe) -> Tracker {
        Tracker {
            success_threshold: p.success_threshold.unwrap_or(1).max(1) as u32,
            failure_threshold: p.failure_threshold.unwrap_or(3).max(1) as u32,
            successes: 0,
            failures: 0,
            verdict: None,
        }
    }

    /// Records one result; returns the verdict when it changed.
    pub fn record(&mut self, ok: bool) -> Option<bool> {
        if ok {
            self.successes += 1;
            self.failures = 0;
        } else {
            self.failures += 1;
            self.successes = 0;
        }
        let next = if self.successes >= self.success_threshold {
            Some(true)
        } else if self.failures >= self.failure_threshold {
            Some(false)
        } else {
            self.verdict
        };
        if next != self.verdict {
            self.verdict = next;
            return next;
        }
        None
    }
}

fn resolve_port(port: &IntOrString, c: &Container) -> Result<u16, String> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).ok().filter(|p| *p > 0).ok_or_else(|| format!("invalid port {p}")),
        IntOrString::String(name) => {
            if let Ok(n) = name.parse::<u16>() {
                return Ok(n);
            }
            c.ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| format!("port {name:?} is not a named port of container {:?}", c.name))
        }
    }
}

fn host(explicit: Option<&str>, t: &Target<'_>) -> Result<String, String> {
    match explicit.filter(|h| !h.is_empty()) {
        Some(h) => Ok(h.to_owned()),
        None => t.pod_ip.map(|ip| ip.to_string()).ok_or_else(|| "the pod has no IP yet".to_owned()),
    }
}

/// The output of an exec probe as a message: stdout then stderr, at most
/// [`MAX_EXEC_OUTPUT`] bytes of them, control characters escaped (pure).
pub fn exec_message(stdout: &[u8], stderr: &[u8]) -> String {
    let mut raw = Vec::with_capacity(MAX_EXEC_OUTPUT.min(stdout.len() + stderr.len()));
    for part in [stdout, stderr] {
        let room = MAX_EXEC_OUTPUT - raw.len();
        raw.extend_from_slice(&part[..part.len().min(room)]);
    }
    http::escape(String::from_utf8_lossy(&raw).trim())
}

pub async fn exec(rt: &dyn RuntimeService, t: &Target<'_>, a: &ExecAction, timeout: Duration) -> Outcome {
    let cmd = a.command.clone().unwrap_or_default();
    match rt.exec_sync(t.container_id, cmd, timeout).await {
        Ok(r) if r.exit_code == 0 => Outcome::Success,
        Ok(r) => {
            let out = exec_message(&r.stdout, &r.stderr);
            Outcome::Failure(if out.is_empty() { format!("command exited with {}", r.exit_code) } else { out })
        }
        Err(e) if e.code() == Some(tonic::Code::DeadlineExceeded) => {
            Outcome::Failure(format!("command timed out after {}s", timeout.as_secs()))
        }
        Err(e) => Outcome::Error(http::escape(&e.to_string())),
    }
}

/// An HTTP GET as the kubelet's prober sends it (`probe/http.rs`).
pub async fn http_get(t: &Target<'_>, a: &HTTPGetAction, timeout: Duration) -> Outcome {
    let (host, port) = match (host(a.host.as_deref(), t), resolve_port(&a.port, t.container)) {
        (Ok(h), Ok(p)) => (h, p),
        (Err(e), _) | (_, Err(e)) => return Outcome::Error(e),
    };
    let path = a.path.as_deref().unwrap_or_default();
    let scheme = a.scheme.as_deref().unwrap_or("HTTP");
    let req = match http::build(scheme, &host, port, path, a.http_headers.as_deref().unwrap_or_default()) {
        Ok(r) => r,
        Err(e) => return Outcome::Failure(e),
    };
    match http::send(req, timeout).await {
        Err(e) => Outcome::Failure(http::escape(&e)),
        Ok(r) if r.redirect_terminated => {
            tracing::debug!(status = r.status.as_u16(), "probe terminated redirects to another host");
            Outcome::Success
        }
        Ok(r) if (200..400).contains(&r.status.as_u16()) => Outcome::Success,
        Ok(r) => Outcome::Failure(format!("HTTP probe failed with statuscode: {}", r.status.as_u16())),
    }
}

pub async fn tcp(t: &Target<'_>, a: &TCPSocketAction, timeout: Duration) -> Outcome {
    let (host, port) = match (host(a.host.as_deref(), t), resolve_port(&a.port, t.container)) {
        (Ok(h), Ok(p)) => (h, p),
        (Err(e), _) | (_, Err(e)) => return Outcome::Error(e),
    };
    match tokio::time::timeout(timeout, TcpStream::connect((host.as_str(), port))).await {
        Ok(Ok(_)) => Outcome::Success,
        Ok(Err(e)) => Outcome::Failure(format!("dial tcp {host}:{port}: connect: {e}")),
        Err(_) => Outcome::Failure(format!("dial tcp {host}:{port}: i/o timeout")),
    }
}

pub async fn grpc(t: &Target<'_>, a: &GRPCAction, timeout: Duration) -> Outcome {
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};
    let Some(ip) = t.pod_ip else { return Outcome::Error("the pod has no IP yet".into()) };
    if a.mode.as_deref() == Some("TLS") {
        return Outcome::Error("gRPC probes in TLS mode are not supported by this node".into());
    }
    let addr = format!("http://{}", std::net::SocketAddr::new(ip, a.port as u16));
    let check = async {
        let channel = tonic::transport::Endpoint::from_shared(addr.clone())
            .map_err(|e| e.to_string())?
            .connect_timeout(timeout)
            .connect()
            .await
            .map_err(|e| format!("failed to connect service {addr:?} within {}s: {e}", timeout.as_secs()))?;
        let mut client = HealthClient::new(channel);
        let r = client
            .check(HealthCheckRequest { service: a.service.clone().unwrap_or_default() })
            .await
            .map_err(|s| format!("rpc error: code = {:?} desc = {}", s.code(), s.message()))?;
        Ok::<i32, String>(r.into_inner().status)
    };
    match tokio::time::timeout(timeout, check).await {
        Err(_) => Outcome::Failure(format!("timeout: health rpc did not complete within {}s", timeout.as_secs())),
        Ok(Err(e)) => Outcome::Failure(e),
        Ok(Ok(s)) if s == ServingStatus::Serving as i32 => Outcome::Success,
        Ok(Ok(s)) => Outcome::Failure(format!(
            "service unhealthy (responded with {:?})",
            ServingStatus::try_from(s).map(|s| s.as_str_name()).unwrap_or("UNKNOWN")
        )),
    }
}

/// Runs one probe attempt.
pub async fn run(rt: &dyn RuntimeService, t: &Target<'_>, p: &Probe) -> Outcome {
    let timeout = Duration::from_secs(p.timeout_seconds.unwrap_or(1).max(1) as u64);
    if let Some(a) = &p.exec {
        exec(rt, t, a, timeout).await
    } else if let Some(a) = &p.http_get {
        http_get(t, a, timeout).await
    } else if let Some(a) = &p.tcp_socket {
        tcp(t, a, timeout).await
    } else if let Some(a) = &p.grpc {
        grpc(t, a, timeout).await
    } else {
        Outcome::Error("the probe has no handler".into())
    }
}

/// Runs a lifecycle handler (postStart / preStop): exec, httpGet, or sleep.
pub async fn run_handler(
    rt: &dyn RuntimeService,
    t: &Target<'_>,
    h: &k8s_openapi::api::core::v1::LifecycleHandler,
    budget: Duration,
) -> Outcome {
    if let Some(a) = &h.exec {
        exec(rt, t, a, budget).await
    } else if let Some(a) = &h.http_get {
        http_get(t, a, budget).await
    } else if let Some(s) = &h.sleep {
        tokio::time::sleep(Duration::from_secs(s.seconds.max(0) as u64).min(budget)).await;
        Outcome::Success
    } else if let Some(a) = &h.tcp_socket {
        // Deprecated in hooks and ignored by the kubelet apart from a log.
        let _ = a;
        Outcome::Success
    } else {
        Outcome::Error("the handler has no action".into())
    }
}

/// TLS for https probes: the kubelet does not verify the pod's certificate.
mod tls {
    use std::sync::Arc;

    use tokio::net::TcpStream;
    use tokio_rustls::{
        TlsConnector,
        client::TlsStream,
        rustls::{
            self, DigitallySignedStruct, SignatureScheme,
            client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
            pki_types::{CertificateDer, ServerName, UnixTime},
        },
    };

    #[derive(Debug)]
    struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

    impl ServerCertVerifier for AcceptAny {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    pub async fn connect(stream: TcpStream, host: &str) -> std::io::Result<TlsStream<TcpStream>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(std::io::Error::other)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
            .with_no_client_auth();
        let name = ServerName::try_from(host.to_owned()).map_err(std::io::Error::other)?;
        TlsConnector::from(Arc::new(config)).connect(name, stream).await
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerPort, HTTPHeader};
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpListener,
    };

    use super::*;

    #[test]
    fn thresholds() {
        let mut t =
            Tracker::new(&Probe { success_threshold: Some(2), failure_threshold: Some(3), ..Default::default() });
        assert_eq!(t.record(true), None);
        assert_eq!(t.record(true), Some(true));
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(true), None, "a success resets the failure count");
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(false), None);
        assert_eq!(t.record(false), Some(false));
        assert_eq!(t.record(false), None, "only changes are reported");
        assert_eq!(t.record(true), None);
        assert_eq!(t.record(true), Some(true));
    }

    fn container() -> Container {
        Container {
            name: "web".into(),
            ports: Some(vec![ContainerPort { name: Some("http".into()), container_port: 8080, ..Default::default() }]),
            ..Default::default()
        }
    }

    #[test]
    fn named_ports() {
        let c = container();
        assert_eq!(resolve_port(&IntOrString::String("http".into()), &c), Ok(8080));
        assert_eq!(resolve_port(&IntOrString::Int(81), &c), Ok(81));
        assert!(resolve_port(&IntOrString::String("grpc".into()), &c).unwrap_err().contains("grpc"));
        assert!(resolve_port(&IntOrString::Int(0), &c).is_err());
    }

    /// A one-shot HTTP server answering with `status`.
    async fn serve(status: u16) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 1024];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).into_owned();
                let code =
                    if req.starts_with("GET /healthz HTTP/1.1") && req.contains("X-Probe: yes") { status } else { 400 };
                let _ = s.write_all(format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\n\r\n").as_bytes()).await;
            }
        });
        port
    }

    #[tokio::test]
    async fn http_and_tcp_against_real_sockets() {
        let c = container();
        let t = Target { container_id: "x", container: &c, pod_ip: Some("127.0.0.1".parse().unwrap()) };
        let get = |port: u16| HTTPGetAction {
            path: Some("/healthz".into()),
            port: IntOrString::Int(port as i32),
            http_headers: Some(vec![k8s_openapi::api::core::v1::HTTPHeader {
                name: "X-Probe".into(),
                value: "yes".into(),
            }]),
            ..Default::default()
        };
        let s = Duration::from_secs(1);
        assert_eq!(http_get(&t, &get(serve(200).await), s).await, Outcome::Success);
        assert_eq!(http_get(&t, &get(serve(302).await), s).await, Outcome::Success);
        assert_eq!(
            http_get(&t, &get(serve(503).await), s).await,
            Outcome::Failure("HTTP probe failed with statuscode: 503".into())
        );
        // A closed port: connection refused.
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        let r = http_get(&t, &get(closed), s).await;
        assert!(matches!(&r, Outcome::Failure(m) if m.contains("refused")), "{r:?}");
        let open = serve(200).await;
        let tcp_probe = |port: u16| TCPSocketAction { port: IntOrString::Int(port as i32), host: None };
        assert_eq!(tcp(&t, &tcp_probe(open), s).await, Outcome::Success);
        assert!(matches!(tcp(&t, &tcp_probe(closed), s).await, Outcome::Failure(_)));
        let no_ip = Target { pod_ip: None, ..t };
        assert!(matches!(tcp(&no_ip, &tcp_probe(open), s).await, Outcome::Error(_)));
    }

    /// A server that records every request's raw bytes and answers each
    /// with `answer(request)`.
    async fn capture(
        answer: impl Fn(&str) -> String + Send + Sync + 'static,
    ) -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = vec![0u8; 64 * 1024];
                let mut n = 0;
                while !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf[n..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(m) => n += m,
                    }
                }
                let req = String::from_utf8_lossy(&buf[..n]).into_owned();
                log.lock().unwrap().push(req.clone());
                let _ = s.write_all(answer(&req).as_bytes()).await;
            }
        });
        (port, seen)
    }

    fn target_of(c: &Container) -> Target<'_> {
        Target { container_id: "x", container: c, pod_ip: Some("127.0.0.1".parse().unwrap()) }
    }

    fn get_with(port: u16, path: &str, headers: Vec<HTTPHeader>) -> HTTPGetAction {
        HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(port as i32),
            http_headers: Some(headers),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn no_injected_line_reaches_the_wire() {
        let (port, seen) = capture(|_| "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".into()).await;
        let c = container();
        let t = target_of(&c);
        let s = Duration::from_secs(2);
        let evil = HTTPHeader { name: "X-Probe".into(), value: "yes\r\nX-Injected: 1".into() };
        let r = http_get(&t, &get_with(port, "/healthz", vec![evil]), s).await;
        assert!(matches!(&r, Outcome::Failure(m) if m.contains("invalid header field value")), "{r:?}");
        let r = http_get(&t, &get_with(port, "/healthz HTTP/1.1\r\nX-Injected: 1\r\nX:", vec![]), s).await;
        assert!(matches!(&r, Outcome::Failure(m) if m.contains("invalid control character")), "{r:?}");
        let name = HTTPHeader { name: "X-A\r\nX-Injected".into(), value: "1".into() };
        assert!(matches!(http_get(&t, &get_with(port, "/", vec![name]), s).await, Outcome::Failure(_)));
        // A clean probe goes through, and nothing injected was ever sent.
        let ok = HTTPHeader { name: "X-Probe".into(), value: "yes".into() };
        assert_eq!(http_get(&t, &get_with(port, "/healthz", vec![ok]), s).await, Outcome::Success);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(seen[0].starts_with("GET /healthz HTTP/1.1\r\n"), "{}", seen[0]);
        assert!(seen[0].contains("\r\nX-Probe: yes\r\n"), "{}", seen[0]);
        assert!(seen.iter().all(|r| !r.contains("X-Injected")), "{seen:?}");
    }

    #[tokio::test]
    async fn same_host_redirects_followed_others_not_and_the_body_capped() {
        let (other, other_seen) = capture(|_| "HTTP/1.1 500 X\r\nContent-Length: 0\r\n\r\n".into()).await;
        let (port, seen) = capture(move |req| {
            if req.starts_with("GET /old ") {
                "HTTP/1.1 302 Found\r\nLocation: /new\r\nContent-Length: 0\r\n\r\n".into()
            } else if req.starts_with("GET /away ") {
                // localhost is another host name than 127.0.0.1.
                format!("HTTP/1.1 302 Found\r\nLocation: http://localhost:{other}/\r\nContent-Length: 0\r\n\r\n")
            } else if req.starts_with("GET /new ") {
                "HTTP/1.1 503 X\r\nContent-Length: 0\r\n\r\n".into()
            } else {
                // An endless body: only 10 KiB of it is read.
                format!("HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n{}", "x".repeat(64 * 1024))
            }
        })
        .await;
        let c = container();
        let t = target_of(&c);
        let s = Duration::from_secs(2);
        assert_eq!(
            http_get(&t, &get_with(port, "/old", vec![]), s).await,
            Outcome::Failure("HTTP probe failed with statuscode: 503".into()),
            "the same-host redirect was followed"
        );
        assert_eq!(http_get(&t, &get_with(port, "/away", vec![]), s).await, Outcome::Success);
        assert!(other_seen.lock().unwrap().is_empty(), "a redirect to another host is not followed");
        assert_eq!(http_get(&t, &get_with(port, "/big", vec![]), s).await, Outcome::Success);
        assert_eq!(seen.lock().unwrap().len(), 4);
    }

    #[test]
    fn exec_output_is_capped_and_escaped() {
        let m = exec_message(b"line\n\x1b[31mred\r\nforged", b"err");
        assert_eq!(m, "line\\n\\u{1b}[31mred\\r\\nforgederr");
        let long = exec_message(&[b'a'; 20_000], &[b'b'; 100]);
        assert_eq!(long.len(), MAX_EXEC_OUTPUT);
        assert!(long.bytes().all(|b| b == b'a'));
    }

    #[tokio::test]
    async fn grpc_health_against_a_real_server() {
        use tonic_health::ServingStatus;
        let (reporter, service) = tonic_health::server::health_reporter();
        reporter.set_service_status("", ServingStatus::Serving).await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        let c = container();
        let t = Target { container_id: "x", container: &c, pod_ip: Some("127.0.0.1".parse().unwrap()) };
        let action = GRPCAction { port: port as i32, service: None, ..Default::default() };
        let s = Duration::from_secs(2);
        assert_eq!(grpc(&t, &action, s).await, Outcome::Success);
        reporter.set_service_status("", ServingStatus::NotServing).await;
        assert_eq!(
            grpc(&t, &action, s).await,
            Outcome::Failure("service unhealthy (responded with \"NOT_SERVING\")".into())
        );
        let unknown = GRPCAction { port: port as i32, service: Some("nope".into()), ..Default::default() };
        assert!(matches!(grpc(&t, &unknown, s).await, Outcome::Failure(m) if m.contains("NotFound")));
    }
}
