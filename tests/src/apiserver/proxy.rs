//! The pod subresources the API server proxies to the pod's kubelet:
//! `pods/exec`, `pods/attach`, `pods/portforward` (connection upgrades:
//! SPDY or WebSocket, whose bytes are then tunnelled both ways) and
//! `pods/log` (a streamed body). As the real API server: the kubelet is
//! found from the Node (`status.addresses` InternalIP and
//! `status.daemonEndpoints.kubeletEndpoint.Port`), the request carries the
//! API server's kubelet client certificate, the kubelet's serving
//! certificate is not verified (the real default without
//! `--kubelet-certificate-authority`), the parameters are renamed to the
//! kubelet's (`stdin=true` → `input=1`, ...), and a missing container name
//! is defaulted when the pod has a single container.

use std::{collections::HashMap, sync::Arc};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use rustls::{
    DigitallySignedStruct, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject},
};
use serde_json::Value;

use super::{
    resources,
    server::{Body, State},
    store::{ApiError, ApiResult},
};

/// The user the API server's kubelet client certificate names.
pub const KUBELET_CLIENT_USER: &str = "kube-apiserver-kubelet-client";

/// Whether `sub` is a subresource this module serves.
pub fn proxied(sub: &str) -> bool {
    matches!(sub, "exec" | "attach" | "portforward" | "log")
}

fn pod_container(pod: &Value, wanted: Option<&String>) -> ApiResult<String> {
    let name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    let names = |list: &str| -> Vec<String> {
        pod.pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str().map(str::to_owned))
            .collect()
    };
    let regular = names("containers");
    match wanted.filter(|w| !w.is_empty()) {
        Some(w) => {
            let all: Vec<String> =
                [regular, names("initContainers"), names("ephemeralContainers")].into_iter().flatten().collect();
            if all.contains(w) {
                Ok(w.clone())
            } else {
                Err(ApiError::bad_request(format!("container {w} is not valid for pod {name}")))
            }
        }
        None if regular.len() == 1 => Ok(regular[0].clone()),
        None => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            regular.join(" ")
        ))),
    }
}

/// The kubelet path and query for a subresource request (pure).
pub fn kubelet_location(sub: &str, pod: &Value, q: &HashMap<String, Vec<String>>) -> ApiResult<String> {
    let ns = pod.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default");
    let name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    let one = |k: &str| q.get(k).and_then(|v| v.first());
    let truthy = |k: &str| one(k).is_some_and(|v| v == "true" || v == "1");
    let mut params = form_urlencoded::Serializer::new(String::new());
    let path = match sub {
        "exec" | "attach" => {
            let c = pod_container(pod, one("container"))?;
            for (theirs, ours) in [("stdin", "input"), ("stdout", "output"), ("stderr", "error"), ("tty", "tty")] {
                if truthy(theirs) {
                    params.append_pair(ours, "1");
                }
            }
            if sub == "exec" {
                for c in q.get("command").into_iter().flatten() {
                    params.append_pair("command", c);
                }
            }
            format!("/{sub}/{ns}/{name}/{c}")
        }
        "portforward" => {
            for p in q.get("ports").into_iter().flatten() {
                params.append_pair("port", p);
            }
            format!("/portForward/{ns}/{name}")
        }
        "log" => {
            let c = pod_container(pod, one("container"))?;
            for k in ["follow", "previous", "timestamps", "sinceSeconds", "sinceTime", "tailLines", "limitBytes"] {
                if let Some(v) = one(k) {
                    params.append_pair(k, v);
                }
            }
            format!("/containerLogs/{ns}/{name}/{c}")
        }
        other => return Err(ApiError::new(404, "NotFound", format!("pods/{other} is not served"))),
    };
    let query = params.finish();
    Ok(if query.is_empty() { path } else { format!("{path}?{query}") })
}

/// The kubelet's address from its Node object.
fn kubelet_address(state: &State, node_name: &str) -> ApiResult<String> {
    let node = state.store.get(&resources::NODES, "", node_name)?;
    let ip = node
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|a| a["type"] == "InternalIP")
        .and_then(|a| a["address"].as_str())
        .ok_or_else(|| ApiError::new(503, "ServiceUnavailable", format!("node {node_name} has no InternalIP")))?;
    let port = node.pointer("/status/daemonEndpoints/kubeletEndpoint/Port").and_then(Value::as_u64).unwrap_or(10250);
    Ok(if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") })
}

/// Accepts whatever certificate the kubelet serves (see the module doc).
#[derive(Debug)]
struct AnyServerCert(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyServerCert {
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

/// The TLS client the API server talks to kubelets with.
pub fn kubelet_client_config(cert_pem: &str, key_pem: &str) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert_pem.as_bytes()).collect::<Result<_, _>>().map_err(|e| e.to_string())?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| e.to_string())?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServerCert(provider)))
        .with_client_auth_cert(certs, key)
        .map_err(|e| e.to_string())?;
    // Upgrades need HTTP/1.1.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn unavailable(why: String) -> ApiError {
    ApiError::new(503, "ServiceUnavailable", why)
}

/// Proxies `req` (already routed to pod `name`'s subresource `sub`).
pub async fn proxy(state: &Arc<State>, pod: &Value, sub: &str, req: Request<Incoming>) -> ApiResult<Response<Body>> {
    let q: HashMap<String, Vec<String>> = {
        let mut m: HashMap<String, Vec<String>> = HashMap::new();
        for (k, v) in form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes()).into_owned() {
            m.entry(k).or_default().push(v);
        }
        m
    };
    let location = kubelet_location(sub, pod, &q)?;
    let node = pod.pointer("/spec/nodeName").and_then(Value::as_str).filter(|n| !n.is_empty()).ok_or_else(|| {
        let name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
        ApiError::bad_request(format!("pod {name} does not have a host assigned"))
    })?;
    let addr = kubelet_address(state, node)?;
    let tls =
        state.kubelet_client.as_ref().ok_or_else(|| unavailable("the fake has no TLS, so no kubelet client".into()))?;
    let tcp = tokio::net::TcpStream::connect(&addr)
        .await
        .map_err(|e| unavailable(format!("error dialing backend: dial tcp {addr}: {e}")))?;
    let _ = tcp.set_nodelay(true);
    let server_name = ServerName::try_from("kubelet").map_err(|e| unavailable(e.to_string()))?;
    let stream = tokio_rustls::TlsConnector::from(tls.clone())
        .connect(server_name, tcp)
        .await
        .map_err(|e| unavailable(format!("error dialing backend: {e}")))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| unavailable(format!("error dialing backend: {e}")))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let upgrade = req.headers().contains_key(header::UPGRADE);
    let mut out = Request::builder().method(req.method().clone()).uri(&location).header(header::HOST, addr.clone());
    for (k, v) in req.headers() {
        let keep = k == header::CONNECTION
            || k == header::UPGRADE
            || k.as_str().starts_with("sec-websocket-")
            || k.as_str().starts_with("x-stream-protocol-version");
        if keep {
            out = out.header(k, v);
        }
    }
    let method = req.method().clone();
    let client_upgrade = hyper::upgrade::on(req);
    let out = out.body(Full::new(Bytes::new())).map_err(|e| unavailable(e.to_string()))?;
    let resp = sender.send_request(out).await.map_err(|e| unavailable(format!("the kubelet: {e}")))?;
    let status = resp.status();
    let mut answer = Response::builder().status(status);
    for (k, v) in resp.headers() {
        if k != header::CONTENT_LENGTH && k != header::TRANSFER_ENCODING {
            answer = answer.header(k, v);
        }
    }
    if upgrade && status == StatusCode::SWITCHING_PROTOCOLS {
        let backend = hyper::upgrade::on(resp);
        tokio::spawn(async move {
            let (Ok(client), Ok(kubelet)) = (client_upgrade.await, backend.await) else { return };
            let (mut a, mut b) = (TokioIo::new(client), TokioIo::new(kubelet));
            let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
        });
        return answer.body(Full::new(Bytes::new()).boxed()).map_err(|e| unavailable(e.to_string()));
    }
    let _ = method == Method::GET;
    // A streamed body (logs -f), passed on chunk by chunk.
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let mut body = resp.into_body();
    tokio::spawn(async move {
        while let Some(Ok(f)) = body.frame().await {
            if let Ok(d) = f.into_data()
                && tx.send(d).await.is_err()
            {
                break;
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::convert::Infallible>(Frame::data(b)), rx))
    });
    answer.body(StreamBody::new(stream).boxed()).map_err(|e| unavailable(e.to_string()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, Vec<String>> {
        let mut m: HashMap<String, Vec<String>> = HashMap::new();
        for (k, v) in pairs {
            m.entry((*k).to_owned()).or_default().push((*v).to_owned());
        }
        m
    }

    #[test]
    fn locations_as_the_api_server_builds_them() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "app"}], "ephemeralContainers": [{"name": "dbg"}]}});
        let l = kubelet_location(
            "exec",
            &pod,
            &q(&[
                ("command", "sh"),
                ("command", "-c"),
                ("command", "echo a b"),
                ("stdin", "true"),
                ("stdout", "true"),
                ("tty", "false"),
            ]),
        )
        .unwrap();
        assert_eq!(l, "/exec/ns/p/app?input=1&output=1&command=sh&command=-c&command=echo+a+b");
        let l =
            kubelet_location("attach", &pod, &q(&[("container", "dbg"), ("stdin", "true"), ("tty", "true")])).unwrap();
        assert_eq!(l, "/attach/ns/p/dbg?input=1&tty=1");
        assert_eq!(kubelet_location("portforward", &pod, &q(&[])).unwrap(), "/portForward/ns/p");
        assert_eq!(
            kubelet_location("log", &pod, &q(&[("follow", "true"), ("tailLines", "5")])).unwrap(),
            "/containerLogs/ns/p/app?follow=true&tailLines=5"
        );
        let e = kubelet_location("exec", &pod, &q(&[("container", "nope")])).unwrap_err();
        assert_eq!(e.code, 400);
        let two = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let e = kubelet_location("log", &two, &q(&[])).unwrap_err();
        assert!(e.message.contains("choose one of: [a b]"), "{}", e.message);
    }
}
