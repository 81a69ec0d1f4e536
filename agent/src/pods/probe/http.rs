//! The httpGet probe and hook as the kubelet's prober sends it: a real
//! HTTP/1.1 client (hyper), one connection per request
//! (`Connection: close`, as the kubelet's probe transport disables
//! keep-alives), TLS without verification for HTTPS, redirects followed
//! only to the same host (up to 10, Go's limit; a redirect elsewhere ends
//! the probe as a success with "Probe terminated redirects", as the
//! kubelet's), and at most 10 KiB of body read.
//!
//! What comes from the pod spec (path, headers) is checked before anything
//! is sent: a header name or value with CR, LF or another control
//! character, or a path that is not a valid request target, fails the
//! probe with an error naming the header, as Go's net/http refuses such a
//! request. Nothing from the spec is ever written onto the wire raw.

use std::time::Duration;

use bytes::Bytes;
use http::{
    HeaderMap, HeaderName, HeaderValue, Request, StatusCode, Uri,
    header::{ACCEPT, CONNECTION, HOST, LOCATION, USER_AGENT},
};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::HTTPHeader;
use tokio::net::TcpStream;

/// The kubelet's maxRespBodyLength: what is read of a probe's response.
pub const MAX_BODY: usize = 10 * 1024;
/// Go's http.Client stops after 10 redirects.
const MAX_REDIRECTS: usize = 10;
/// What the prober calls itself (the kubelet's is `kube-probe/<major>.<minor>`).
pub const USER_AGENT_VALUE: &str = "kube-probe/swiftlet";

/// One probe request, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeRequest {
    pub uri: Uri,
    pub headers: HeaderMap,
}

/// What a probe got back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeResponse {
    pub status: StatusCode,
    /// The first [`MAX_BODY`] bytes.
    pub body: Bytes,
    /// True when a redirect to another host was not followed.
    pub redirect_terminated: bool,
}

/// `host:port`, with brackets for IPv6 (Go's net.JoinHostPort).
fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

/// Percent-encodes what may not appear raw in a request target (spaces,
/// quotes, non-ASCII), as Go's URL escaping of the path does.
fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_graphic() && !matches!(b, b'"' | b'<' | b'>' | b'\\' | b'^' | b'`' | b'{' | b'|' | b'}') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Builds the request the kubelet would send, refusing anything from the
/// spec that is not valid on the wire (pure).
pub fn build(scheme: &str, host: &str, port: u16, path: &str, headers: &[HTTPHeader]) -> Result<ProbeRequest, String> {
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return Err(format!("unsupported scheme {scheme:?}"));
    }
    if path.chars().any(|c| c.is_ascii_control()) {
        return Err(format!("parse {path:?}: net/url: invalid control character in URL"));
    }
    let path = if path.is_empty() { "/" } else { path };
    let path = if path.starts_with('/') { encode_path(path) } else { format!("/{}", encode_path(path)) };
    let authority = join_host_port(host, port);
    let url = format!("{scheme}://{authority}{path}");
    let uri: Uri = url.parse().map_err(|e| format!("invalid probe URL {url:?}: {e}"))?;
    let mut map = HeaderMap::new();
    for h in headers {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| format!("net/http: invalid header field name {:?}", h.name))?;
        let value = HeaderValue::from_str(&h.value)
            .map_err(|_| format!("net/http: invalid header field value for {:?}", h.name))?;
        map.append(name, value);
    }
    if !map.contains_key(USER_AGENT) {
        map.insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE));
    }
    if !map.contains_key(ACCEPT) {
        map.insert(ACCEPT, HeaderValue::from_static("*/*"));
    }
    if !map.contains_key(HOST) {
        let v = HeaderValue::from_str(&authority).map_err(|_| format!("invalid host {host:?}"))?;
        map.insert(HOST, v);
    }
    map.insert(CONNECTION, HeaderValue::from_static("close"));
    Ok(ProbeRequest { uri, headers: map })
}

/// Where a redirect goes, if the kubelet would follow it: the same host
/// name (any port or scheme), as its prober's redirect checker. `Err` is
/// a Location that is not a URL.
pub fn redirect_target(from: &Uri, location: &str) -> Result<Option<Uri>, String> {
    let target: Uri = if location.starts_with('/') {
        let authority = from.authority().map(|a| a.as_str()).unwrap_or_default();
        format!("{}://{authority}{location}", from.scheme_str().unwrap_or("http"))
            .parse()
            .map_err(|e| format!("invalid redirect location {location:?}: {e}"))?
    } else {
        location.parse().map_err(|e| format!("invalid redirect location {location:?}: {e}"))?
    };
    if target.scheme_str().is_none_or(|s| s != "http" && s != "https") {
        return Err(format!("unsupported redirect location {location:?}"));
    }
    Ok((target.host() == from.host()).then_some(target))
}

/// Sends the request, following same-host redirects, within `timeout`.
pub async fn send(req: ProbeRequest, timeout: Duration) -> Result<ProbeResponse, String> {
    let url = req.uri.to_string();
    match tokio::time::timeout(timeout, follow(req)).await {
        Ok(r) => r,
        Err(_) => {
            Err(format!("Get \"{url}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"))
        }
    }
}

async fn follow(mut req: ProbeRequest) -> Result<ProbeResponse, String> {
    let mut redirects = 0;
    loop {
        let url = req.uri.to_string();
        let (status, headers, body) = once(&req).await.map_err(|e| format!("Get \"{url}\": {e}"))?;
        let location = headers.get(LOCATION).and_then(|v| v.to_str().ok());
        let redirect = matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308);
        let (true, Some(location)) = (redirect, location) else {
            return Ok(ProbeResponse { status, body, redirect_terminated: false });
        };
        match redirect_target(&req.uri, location).map_err(|e| format!("Get \"{url}\": {e}"))? {
            None => return Ok(ProbeResponse { status, body, redirect_terminated: true }),
            Some(next) => {
                redirects += 1;
                if redirects > MAX_REDIRECTS {
                    return Err(format!("Get \"{next}\": stopped after {MAX_REDIRECTS} redirects"));
                }
                // The same host: the spec's headers go along; Host follows
                // the new authority unless the spec set it.
                let old_authority = req.uri.authority().map(|a| a.to_string());
                if req.headers.get(HOST).and_then(|h| h.to_str().ok()) == old_authority.as_deref()
                    && let Some(a) = next.authority()
                    && let Ok(v) = HeaderValue::from_str(a.as_str())
                {
                    req.headers.insert(HOST, v);
                }
                req.uri = next;
            }
        }
    }
}

/// One request on a connection of its own.
async fn once(req: &ProbeRequest) -> Result<(StatusCode, HeaderMap, Bytes), String> {
    let host = req.uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_owned();
    let https = req.uri.scheme_str() == Some("https");
    let port = req.uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let stream = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| format!("dial tcp {}: connect: {e}", join_host_port(&host, port)))?;
    let path = req.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/").to_owned();
    let mut request = Request::get(path).body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
    *request.headers_mut() = req.headers.clone();
    if https {
        let tls = super::tls::connect(stream, &host).await.map_err(|e| e.to_string())?;
        exchange(TokioIo::new(tls), request).await
    } else {
        exchange(TokioIo::new(stream), request).await
    }
}

async fn exchange<I>(io: I, request: Request<Empty<Bytes>>) -> Result<(StatusCode, HeaderMap, Bytes), String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    // Header names as Go writes them (X-Probe, not x-probe).
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .title_case_headers(true)
        .handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let result = async {
        let resp = sender.send_request(request).await.map_err(|e| e.to_string())?;
        let (parts, mut body) = resp.into_parts();
        // Read at most MAX_BODY bytes; the rest is never read (the
        // connection closes with the probe).
        let mut buf = Vec::new();
        while buf.len() < MAX_BODY {
            match body.frame().await {
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data() {
                        let room = MAX_BODY - buf.len();
                        buf.extend_from_slice(&data[..data.len().min(room)]);
                    }
                }
                Some(Err(e)) => return Err(e.to_string()),
                None => break,
            }
        }
        Ok((parts.status, parts.headers, Bytes::from(buf)))
    }
    .await;
    driver.abort();
    result
}

/// Control characters escaped (`\n`, `\u{1b}`), so text from a container
/// cannot forge log lines or terminal sequences in events and logs.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(name: &str, value: &str) -> HTTPHeader {
        HTTPHeader { name: name.into(), value: value.into() }
    }

    #[test]
    fn requests_refuse_what_is_not_valid_on_the_wire() {
        let ok = build("HTTP", "10.0.0.1", 8080, "/healthz?x=1", &[h("X-Probe", "yes")]).unwrap();
        assert_eq!(ok.uri.to_string(), "http://10.0.0.1:8080/healthz?x=1");
        assert_eq!(ok.headers["x-probe"], "yes");
        assert_eq!(ok.headers[HOST], "10.0.0.1:8080");
        assert_eq!(ok.headers[USER_AGENT], USER_AGENT_VALUE);
        assert_eq!(ok.headers[CONNECTION], "close");
        let v6 = build("https", "fd00::1", 443, "", &[]).unwrap();
        assert_eq!(v6.uri.to_string(), "https://[fd00::1]:443/");
        // The spec's Host and User-Agent win.
        let own = build("http", "10.0.0.1", 80, "/", &[h("Host", "example.com"), h("User-Agent", "mine")]).unwrap();
        assert_eq!(
            (own.headers[HOST].to_str().unwrap(), own.headers[USER_AGENT].to_str().unwrap()),
            ("example.com", "mine")
        );
        let cases: &[(&str, &[HTTPHeader], &str)] = &[
            ("/", &[h("X-A", "ok\r\nX-Injected: 1")], "invalid header field value for \"X-A\""),
            ("/", &[h("X-A", "bell\u{7}")], "invalid header field value"),
            ("/", &[h("X-A\r\nX-B", "v")], "invalid header field name \"X-A\\r\\nX-B\""),
            ("/", &[h("", "v")], "invalid header field name"),
            ("/ HTTP/1.1\r\nX-Injected: 1\r\n", &[], "invalid control character in URL"),
        ];
        for (path, headers, want) in cases {
            let e = build("http", "10.0.0.1", 80, path, headers).unwrap_err();
            assert!(e.contains(want), "{path:?} {headers:?}: {e}");
            assert!(!e.contains('\r') && !e.contains('\n'), "the message is escaped: {e:?}");
        }
        assert!(build("ftp", "h", 1, "/", &[]).is_err());
        // Spaces and the like are escaped, as Go escapes the path.
        assert_eq!(build("http", "h", 1, "/a b\"é", &[]).unwrap().uri.path(), "/a%20b%22%C3%A9");
    }

    #[test]
    fn only_same_host_redirects_are_followed() {
        let from: Uri = "http://10.0.0.1:8080/healthz".parse().unwrap();
        let same = |l: &str| redirect_target(&from, l).unwrap().map(|u| u.to_string());
        assert_eq!(same("/ready").as_deref(), Some("http://10.0.0.1:8080/ready"));
        assert_eq!(same("https://10.0.0.1:8443/x").as_deref(), Some("https://10.0.0.1:8443/x"));
        assert_eq!(same("http://169.254.169.254/latest/meta-data"), None);
        assert_eq!(same("http://10.0.0.10:8080/"), None);
        assert!(redirect_target(&from, "file:///etc/shadow").is_err());
        assert!(redirect_target(&from, "/a\r\nb").is_err());
    }

    #[test]
    fn escaping() {
        assert_eq!(escape("a\nb\r\u{1b}[31mc\td"), "a\\nb\\r\\u{1b}[31mc\\td");
        assert_eq!(escape("plain ünïcode"), "plain ünïcode");
    }
}
