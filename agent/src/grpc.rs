//! gRPC over unix sockets, as node plugins serve it (device plugins, CSI
//! drivers, the plugin watcher's registration sockets).

use std::{path::Path, time::Duration};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// Dials the gRPC server on `socket` within `timeout`; `what` names the
/// peer in the error ("device plugin", "CSI driver csi.example.com").
pub async fn dial_unix(socket: &Path, timeout: Duration, what: &str) -> Result<Channel, String> {
    let path = socket.to_owned();
    // The URI is a placeholder: the connector dials the socket.
    let endpoint = Endpoint::from_static("http://[::]:50051");
    let connect = endpoint.connect_with_connector(tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { tokio::net::UnixStream::connect(&path).await.map(TokioIo::new) }
    }));
    match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(format!("cannot dial {what} {}: {e}", socket.display())),
        Err(_) => Err(format!("cannot dial {what} {}: no answer within {timeout:?}", socket.display())),
    }
}

/// A status as one line: its message, or its code when it has none.
pub fn status_text(s: &tonic::Status) -> String {
    if s.message().is_empty() { format!("{:?}", s.code()) } else { s.message().to_owned() }
}

/// One unary call with a deadline; errors name the call.
pub async fn timed<T>(
    what: &str,
    timeout: Duration,
    f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    match tokio::time::timeout(timeout, f).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(format!("{what}: {}", status_text(&s))),
        Err(_) => Err(format!("{what}: no answer within {timeout:?}")),
    }
}
