//! The runtime's stream server, as a client: the URL CRI Exec, Attach or
//! PortForward returned is asked for a SPDY/3.1 upgrade (containerd 1.6
//! serves SPDY and the WebSocket protocols up to v4; SPDY is the one of
//! the two with a half-close, which stdin needs), then the streams of a
//! v4 remote command, or port-forward stream pairs, are opened on it.

use bytes::Bytes;
use http_body_util::Empty;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use thiserror::Error;

use super::request::StreamOptions;
use crate::server::spdy::{OpenError, Role, Session, StreamReader, StreamWriter};

pub const REMOTE_COMMAND_PROTOCOL: &str = "v4.channel.k8s.io";
pub const PORT_FORWARD_PROTOCOL: &str = "portforward.k8s.io";

#[derive(Debug, Error)]
pub enum RuntimeStreamError {
    #[error("the runtime's stream URL {url:?}: {why}")]
    Url { url: String, why: String },
    #[error("connecting to the runtime's stream server at {url}: {source}")]
    Connect { url: String, source: std::io::Error },
    #[error("the runtime's stream server at {url}: {why}")]
    Upgrade { url: String, why: String },
    #[error("opening a stream on the runtime's stream server: {0}")]
    Open(#[from] OpenError),
}

/// `http://host:port/path` → ("host:port", "/path").
fn split_url(url: &str) -> Result<(String, String), RuntimeStreamError> {
    let bad = |why: &str| RuntimeStreamError::Url { url: url.to_owned(), why: why.to_owned() };
    let rest = match url.split_once("://") {
        Some(("http", rest)) => rest,
        Some((scheme, _)) => {
            return Err(bad(&format!(
                "scheme {scheme} is not supported (the stream server must be plain HTTP, as containerd's default)"
            )));
        }
        None => return Err(bad("not an absolute URL")),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        return Err(bad("no host"));
    }
    Ok((authority.to_owned(), path.to_owned()))
}

/// Upgrades a connection to `url` to SPDY/3.1 with `protocol`.
pub async fn connect(url: &str, protocol: &str) -> Result<Session, RuntimeStreamError> {
    let (authority, path) = split_url(url)?;
    let tcp = tokio::net::TcpStream::connect(&authority)
        .await
        .map_err(|source| RuntimeStreamError::Connect { url: url.to_owned(), source })?;
    let _ = tcp.set_nodelay(true);
    let up = |why: String| RuntimeStreamError::Upgrade { url: url.to_owned(), why };
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.map_err(|e| up(e.to_string()))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let req = Request::post(path)
        .header("host", authority)
        .header("connection", "Upgrade")
        .header("upgrade", "SPDY/3.1")
        .header("x-stream-protocol-version", protocol)
        .body(Empty::<Bytes>::new())
        .map_err(|e| up(e.to_string()))?;
    let resp = sender.send_request(req).await.map_err(|e| up(e.to_string()))?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        use http_body_util::BodyExt;
        let status = resp.status();
        let body = resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        return Err(up(format!("{status}: {}", String::from_utf8_lossy(&body).trim())));
    }
    let upgraded = hyper::upgrade::on(resp).await.map_err(|e| up(e.to_string()))?;
    let (session, _) = Session::start(TokioIo::new(upgraded), Role::Client);
    Ok(session)
}

/// The runtime's side of a remote command.
pub struct RuntimeStreams {
    pub session: Session,
    pub error: StreamReader,
    pub stdin: Option<StreamWriter>,
    pub stdout: Option<StreamReader>,
    pub stderr: Option<StreamReader>,
    pub resize: Option<StreamWriter>,
}

fn stream_type(t: &str) -> Vec<(String, String)> {
    vec![("streamType".into(), t.into())]
}

/// Opens the streams of a v4 remote command (the error stream first, as
/// client-go does); the runtime starts the command once all are there.
pub async fn remote_command(url: &str, opts: StreamOptions) -> Result<RuntimeStreams, RuntimeStreamError> {
    let session = connect(url, REMOTE_COMMAND_PROTOCOL).await?;
    let (error, _) = session.open(stream_type("error"), false).await?;
    let stdin = match opts.stdin {
        true => Some(session.open(stream_type("stdin"), false).await?.1),
        false => None,
    };
    let stdout = match opts.stdout {
        true => Some(session.open(stream_type("stdout"), false).await?.0),
        false => None,
    };
    let stderr = match opts.stderr && !opts.tty {
        true => Some(session.open(stream_type("stderr"), false).await?.0),
        false => None,
    };
    let resize = match opts.tty {
        true => Some(session.open(stream_type("resize"), false).await?.1),
        false => None,
    };
    Ok(RuntimeStreams { session, error, stdin, stdout, stderr, resize })
}

/// Opens one port-forward pair (error stream, half-closed at once as
/// client-go does, then the data stream) for `port`.
pub async fn port_forward_pair(
    session: &Session,
    port: &str,
    request_id: &str,
) -> Result<(StreamReader, (StreamReader, StreamWriter)), RuntimeStreamError> {
    let headers = |t: &str| {
        vec![("streamType".into(), t.into()), ("port".into(), port.into()), ("requestID".into(), request_id.into())]
    };
    let (error, error_w) = session.open(headers("error"), false).await?;
    error_w.close().await.map_err(|_| OpenError::Closed)?;
    let data = session.open(headers("data"), false).await?;
    Ok((error, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_urls() {
        assert_eq!(
            split_url("http://127.0.0.1:35000/exec/AbC").unwrap(),
            ("127.0.0.1:35000".to_owned(), "/exec/AbC".to_owned())
        );
        assert_eq!(split_url("http://[::1]:1").unwrap(), ("[::1]:1".to_owned(), "/".to_owned()));
        for bad in ["https://127.0.0.1:1/x", "/exec/x", "http:///x"] {
            assert!(split_url(bad).is_err(), "{bad}");
        }
    }
}
