//! Port-forward: the client's SPDY session (upgraded directly, or
//! tunnelled in WebSocket messages) opens a pair of streams per forwarded
//! connection, an error stream and a data stream sharing a `requestID`
//! and naming the `port`. Each pair is opened on the runtime's stream
//! server too, and the bytes are copied both ways. The session ends when
//! the client goes, or when no byte moved for the idle timeout.

use std::{collections::HashMap, time::Duration};

use tokio::sync::mpsc;
use tracing::{debug, info};

use bytes::Bytes;

use super::{
    bridge::{Activity, pump},
    runtime::{self, PORT_FORWARD_PROTOCOL},
    websocket::{Mux, WsOut},
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

/// Serves a WebSocket client that does not tunnel SPDY: one connection
/// per `port`, on channels 2n (data) and 2n+1 (error), each of which
/// first carries the port (16 bits, little endian), as the kubelet's.
pub async fn serve_websocket(mux: Mux, ports: Vec<u16>, url: String, idle_timeout: Duration, what: String) {
    let Mux { inputs, out, mut gone } = mux;
    let runtime = match runtime::connect(&url, PORT_FORWARD_PROTOCOL).await {
        Ok(s) => s,
        Err(e) => {
            info!("{what}: {e}");
            let _ = out.send(WsOut::Close).await;
            return;
        }
    };
    let activity = Activity::default();
    activity.touch();
    let mut inputs: Vec<Option<mpsc::Receiver<Bytes>>> = inputs.into_iter().map(Some).collect();
    let mut pairs = tokio::task::JoinSet::new();
    for (i, port) in ports.iter().enumerate() {
        let (data_ch, error_ch) = ((2 * i) as u8, (2 * i + 1) as u8);
        let le = Bytes::copy_from_slice(&port.to_le_bytes());
        let _ = out.send(WsOut::Data(data_ch, le.clone())).await;
        let _ = out.send(WsOut::Data(error_ch, le)).await;
        let mut from_client = inputs.get_mut(2 * i).and_then(Option::take);
        let (runtime, out, activity, port) = (runtime.clone(), out.clone(), activity.clone(), port.to_string());
        pairs.spawn(async move {
            let (mut rt_error, (mut rt_out, rt_in)) =
                match runtime::port_forward_pair(&runtime, &port, &i.to_string()).await {
                    Ok(p) => p,
                    Err(e) => {
                        let msg = format!("error forwarding port {port} to pod: {e}");
                        let _ = out.send(WsOut::Data(error_ch, Bytes::from(msg))).await;
                        return;
                    }
                };
            let up = async {
                if let Some(rx) = from_client.as_mut() {
                    while let Some(b) = rx.recv().await {
                        activity.touch();
                        if rt_in.write_bytes(b).await.is_err() {
                            break;
                        }
                    }
                }
                let _ = rt_in.close().await;
            };
            let down = async {
                while let Some(b) = rt_out.recv().await {
                    activity.touch();
                    if out.send(WsOut::Data(data_ch, b)).await.is_err() {
                        break;
                    }
                }
            };
            let errors = async {
                while let Some(b) = rt_error.recv().await {
                    let _ = out.send(WsOut::Data(error_ch, b)).await;
                }
            };
            // The pair is done when the container's side is; the client's
            // side may end first (it keeps being waited for the other).
            let both = async { tokio::join!(down, errors) };
            tokio::pin!(both, up);
            let mut up_done = false;
            loop {
                tokio::select! {
                    _ = &mut both => break,
                    _ = &mut up, if !up_done => up_done = true,
                }
            }
        });
    }
    tokio::select! {
        _ = async { while pairs.join_next().await.is_some() {} } => {}
        _ = gone.wait_for(|g| *g) => debug!("{what}: the client went away"),
        _ = activity.idle(idle_timeout) => {
            info!("{what}: idle for {idle_timeout:?} (streamingConnectionIdleTimeout): closed");
        }
    }
    pairs.abort_all();
    runtime.close().await;
    let _ = out.send(WsOut::Close).await;
}
