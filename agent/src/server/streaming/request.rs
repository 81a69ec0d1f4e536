//! What a streaming request asks for, read from its path, query and
//! upgrade headers as the kubelet reads them (pure).

use http::{HeaderMap, Method, StatusCode};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Exec,
    Attach,
    PortForward,
    /// `POST /run/...?cmd=...`: a command run to completion (ExecSync).
    Run,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Exec => "exec",
            Kind::Attach => "attach",
            Kind::PortForward => "portForward",
            Kind::Run => "run",
        }
    }
}

/// The streams a remote command wants (`input`, `output`, `error`, `tty`
/// = `1`, the kubelet's parameter names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamOptions {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamRequest {
    pub kind: Kind,
    pub namespace: String,
    pub pod: String,
    /// The `{uid}` form: the pod must have this uid.
    pub uid: Option<String>,
    /// None for port-forward.
    pub container: Option<String>,
    pub command: Vec<String>,
    pub options: StreamOptions,
    /// `port` parameters (port-forward over WebSocket, and what CRI gets).
    pub ports: Vec<u16>,
}

/// A refusal: the status and the text the kubelet answers with.
pub type Refusal = (StatusCode, String);

/// The path's kind, if it is a streaming path.
pub fn kind_of(path: &str) -> Option<Kind> {
    let first = path.trim_start_matches('/').split('/').next()?;
    match first {
        "exec" => Some(Kind::Exec),
        "attach" => Some(Kind::Attach),
        "portForward" => Some(Kind::PortForward),
        "run" => Some(Kind::Run),
        _ => None,
    }
}

fn not_found() -> Refusal {
    (StatusCode::NOT_FOUND, "404 page not found\n".into())
}

/// Reads a request on a streaming path. `query` is decoded.
pub fn parse(method: &Method, path: &str, query: &[(String, String)]) -> Result<StreamRequest, Refusal> {
    let kind = kind_of(path).ok_or_else(not_found)?;
    let allowed = match kind {
        Kind::Run => *method == Method::POST,
        _ => *method == Method::GET || *method == Method::POST,
    };
    if !allowed {
        return Err((StatusCode::METHOD_NOT_ALLOWED, "405: Method Not Allowed".into()));
    }
    let parts: Vec<String> =
        path.trim_start_matches('/').split('/').skip(1).map(super::super::http::percent_decode).collect();
    if parts.iter().any(String::is_empty) {
        return Err(not_found());
    }
    let (namespace, pod, uid, container) = match (kind, parts.as_slice()) {
        (Kind::PortForward, [ns, pod]) => (ns, pod, None, None),
        (Kind::PortForward, [ns, pod, uid]) => (ns, pod, Some(uid.clone()), None),
        (Kind::PortForward, _) => return Err(not_found()),
        (_, [ns, pod, c]) => (ns, pod, None, Some(c.clone())),
        (_, [ns, pod, uid, c]) => (ns, pod, Some(uid.clone()), Some(c.clone())),
        _ => return Err(not_found()),
    };
    fn get<'a>(query: &'a [(String, String)], k: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        query.iter().filter(move |(n, _)| n == k).map(|(_, v)| v.as_str())
    }
    let get = |k: &'static str| get(query, k);
    let flag = |k: &'static str| get(k).next() == Some("1");
    let mut options =
        StreamOptions { stdin: flag("input"), stdout: flag("output"), stderr: flag("error"), tty: flag("tty") };
    // As the kubelet: stderr is merged into the terminal with a TTY.
    if options.tty {
        options.stderr = false;
    }
    let command: Vec<String> = match kind {
        // For legacy reasons /run takes one `cmd`, split on spaces.
        Kind::Run => get("cmd").next().unwrap_or("").split(' ').map(str::to_owned).collect(),
        _ => get("command").map(str::to_owned).collect(),
    };
    if matches!(kind, Kind::Exec | Kind::Attach) && !options.stdin && !options.stdout && !options.stderr {
        return Err((StatusCode::BAD_REQUEST, "you must specify at least 1 of stdin, stdout, stderr".into()));
    }
    let mut ports = vec![];
    // `port=80,8080` or `port=80&port=8080`, as the kubelet reads them.
    for p in get("port").flat_map(|v| v.split(',')) {
        match p.parse::<u16>() {
            Ok(n) if n > 0 => ports.push(n),
            _ => return Err((StatusCode::BAD_REQUEST, format!("invalid port value {p:?}: must be 1 to 65535"))),
        }
    }
    Ok(StreamRequest { kind, namespace: namespace.clone(), pod: pod.clone(), uid, container, command, options, ports })
}

/// How the client asks to stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Upgrade {
    /// `Upgrade: SPDY/3.1` with the protocols of `X-Stream-Protocol-Version`.
    Spdy(Vec<String>),
    /// `Upgrade: websocket` with the key and the subprotocols offered.
    WebSocket {
        key: String,
        protocols: Vec<String>,
    },
    None,
}

fn values(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect()
}

pub fn upgrade(headers: &HeaderMap) -> Upgrade {
    let connection_upgrade = values(headers, "connection").iter().any(|v| v.eq_ignore_ascii_case("upgrade"));
    let up = values(headers, "upgrade");
    if connection_upgrade && up.iter().any(|v| v.eq_ignore_ascii_case("websocket")) {
        let key = headers.get("sec-websocket-key").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        return Upgrade::WebSocket { key, protocols: values(headers, "sec-websocket-protocol") };
    }
    if connection_upgrade && up.iter().any(|v| v.eq_ignore_ascii_case("SPDY/3.1")) {
        return Upgrade::Spdy(values(headers, "x-stream-protocol-version"));
    }
    Upgrade::None
}

/// The first protocol the client offers that the server supports (the
/// client's order wins, as in Go's httpstream.Handshake).
pub fn negotiate<'a>(client: &[String], server: &[&'a str]) -> Option<&'a str> {
    client.iter().find_map(|c| server.iter().find(|s| **s == c.as_str()).copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect()
    }

    #[test]
    fn paths_and_parameters_as_the_kubelet_reads_them() {
        let r = parse(
            &Method::POST,
            "/exec/ns/pod/c",
            &q(&[("command", "sh"), ("command", "-c"), ("command", "echo hi"), ("input", "1"), ("output", "1")]),
        )
        .unwrap();
        assert_eq!(
            (r.kind, r.namespace.as_str(), r.pod.as_str(), r.uid.as_deref(), r.container.as_deref()),
            (Kind::Exec, "ns", "pod", None, Some("c"))
        );
        assert_eq!(r.command, ["sh", "-c", "echo hi"]);
        assert_eq!(r.options, StreamOptions { stdin: true, stdout: true, stderr: false, tty: false });
        let r = parse(&Method::GET, "/attach/ns/pod/uid-1/c", &q(&[("output", "1"), ("error", "1"), ("tty", "1")]))
            .unwrap();
        assert_eq!((r.uid.as_deref(), r.options.stderr, r.options.tty), (Some("uid-1"), false, true));
        let r = parse(&Method::GET, "/portForward/ns/pod", &q(&[("port", "80"), ("port", "8080,9090")])).unwrap();
        assert_eq!((r.kind, r.container, r.ports), (Kind::PortForward, None, vec![80, 8080, 9090]));
        let r = parse(&Method::POST, "/portForward/ns/pod/u", &[]).unwrap();
        assert_eq!(r.uid.as_deref(), Some("u"));
        let r = parse(&Method::POST, "/run/ns/pod/c", &q(&[("cmd", "ls -l /")])).unwrap();
        assert_eq!(r.command, ["ls", "-l", "/"]);
        // Percent-encoded path segments.
        let r = parse(&Method::POST, "/exec/ns/my%2Dpod/c", &q(&[("output", "1")])).unwrap();
        assert_eq!(r.pod, "my-pod");
    }

    #[test]
    fn refusals() {
        type Case<'a> = (Method, &'a str, &'a [(&'a str, &'a str)], u16);
        let cases: &[Case] = &[
            (Method::PUT, "/exec/ns/pod/c", &[("output", "1")], 405),
            (Method::GET, "/run/ns/pod/c", &[("cmd", "ls")], 405),
            (Method::POST, "/exec/ns/pod", &[("output", "1")], 404),
            (Method::POST, "/exec/ns/pod/a/b/c", &[("output", "1")], 404),
            (Method::POST, "/exec/ns//c", &[("output", "1")], 404),
            (Method::POST, "/portForward/ns/pod/uid/extra", &[], 404),
            (Method::POST, "/exec/ns/pod/c", &[("command", "ls")], 400),
            (Method::POST, "/exec/ns/pod/c", &[("input", "true")], 400),
            (Method::POST, "/portForward/ns/pod", &[("port", "0")], 400),
            (Method::POST, "/portForward/ns/pod", &[("port", "http")], 400),
            (Method::POST, "/execx/ns/pod/c", &[], 404),
        ];
        for (m, path, query, code) in cases {
            let e = parse(m, path, &q(query)).unwrap_err();
            assert_eq!(e.0.as_u16(), *code, "{m} {path} {query:?}: {}", e.1);
        }
    }

    #[test]
    fn upgrades_and_negotiation() {
        let mut h = HeaderMap::new();
        h.insert("connection", "Upgrade".parse().unwrap());
        h.insert("upgrade", "SPDY/3.1".parse().unwrap());
        h.append("x-stream-protocol-version", "v4.channel.k8s.io".parse().unwrap());
        h.append("x-stream-protocol-version", "v3.channel.k8s.io, v2.channel.k8s.io".parse().unwrap());
        let Upgrade::Spdy(p) = upgrade(&h) else { panic!("SPDY") };
        assert_eq!(p, ["v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io"]);
        assert_eq!(negotiate(&p, &["v2.channel.k8s.io", "v4.channel.k8s.io"]), Some("v4.channel.k8s.io"));
        assert_eq!(negotiate(&p, &["portforward.k8s.io"]), None);
        let mut w = HeaderMap::new();
        w.insert("connection", "keep-alive, Upgrade".parse().unwrap());
        w.insert("upgrade", "websocket".parse().unwrap());
        w.insert("sec-websocket-key", "abc==".parse().unwrap());
        w.insert("sec-websocket-protocol", "v5.channel.k8s.io".parse().unwrap());
        assert_eq!(
            upgrade(&w),
            Upgrade::WebSocket { key: "abc==".into(), protocols: vec!["v5.channel.k8s.io".into()] }
        );
        assert_eq!(upgrade(&HeaderMap::new()), Upgrade::None);
    }
}
