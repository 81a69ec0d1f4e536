//! Port-forward: the client's SPDY session (upgraded directly, or
//! tunnelled in WebSocket messages) opens a pair of streams per forwarded
//! connection, an error stream and a data stream sharing a `requestID`
//! and naming the `port`. Each pair is opened on the runtime's stream
//! server too, and the bytes are copied both ways. The session ends when
//! the client goes, or when no byte moved for the idle timeout.

use std::{collections::HashMap, time::Duration};

use tokio::sync::mpsc;
use tracing::{debug, info};

use super::{
    bridge::{Activity, pump},
    runtime::{self, PORT_FORWARD_PROTOCOL},
};
use crate::server::spdy::{IncomingStream, Session};

/// A pair half-received, by request id.
#[derive(Default)]
struct Pending {
    error: Option<IncomingStream>,
    data: Option<IncomingStream>,
}

/// Serves one client session until it ends.
pub async fn serve(
    client: Session,
    mut incoming: mpsc::Receiver<IncomingStream>,
    url: String,
    idle_timeout: Duration,
    what: String,
) {
    let runtime = match runtime::connect(&url, PORT_FORWARD_PROTOCOL).await {
        Ok(s) => s,
        Err(e) => {
            info!("{what}: {e}");
            client.close().await;
            return;
        }
    };
    let activity = Activity::default();
    activity.touch();
    let mut pending: HashMap<String, Pending> = HashMap::new();
    let mut pairs = tokio::task::JoinSet::new();
    loop {
        let s = tokio::select! {
            s = incoming.recv() => match s { Some(s) => s, None => break },
            _ = activity.idle(idle_timeout) => {
                info!("{what}: idle for {idle_timeout:?} (streamingConnectionIdleTimeout): closed");
                break;
            }
            _ = runtime.ended() => break,
            Some(_) = pairs.join_next(), if !pairs.is_empty() => continue,
        };
        let id = s.header("requestid").unwrap_or("").to_owned();
        let entry = pending.entry(id.clone()).or_default();
        match s.header("streamtype").unwrap_or("") {
            "error" => entry.error = Some(s),
            "data" => entry.data = Some(s),
            other => {
                debug!("{what}: stream of unexpected type {other:?}");
                continue;
            }
        }
        if entry.error.is_none() || entry.data.is_none() {
            continue;
        }
        let Some(Pending { error: Some(error), data: Some(data) }) = pending.remove(&id) else { continue };
        let port = data.header("port").unwrap_or("").to_owned();
        let (runtime, activity, what) = (runtime.clone(), activity.clone(), what.clone());
        pairs.spawn(async move {
            match runtime::port_forward_pair(&runtime, &port, &id).await {
                Ok((rt_error, (rt_out, rt_in))) => {
                    let up = pump(data.reader, rt_in, activity.clone());
                    let down = pump(rt_out, data.writer, activity.clone());
                    let errors = pump(rt_error, error.writer, activity);
                    tokio::join!(up, down, errors);
                }
                Err(e) => {
                    let msg = format!("error forwarding port {port} to pod: {e}");
                    debug!("{what}: {msg}");
                    let _ = error.writer.write(msg.as_bytes()).await;
                    let _ = error.writer.close().await;
                    data.writer.reset().await;
                }
            }
        });
    }
    pairs.abort_all();
    runtime.close().await;
    client.close().await;
}
