//! The WebSocket side (tokio-tungstenite over the upgraded connection):
//! the handshake answer, the channel protocols of remote commands
//! (`channel.k8s.io` and its versions: one byte of channel number before
//! each binary message, or a digit and base64 in text messages; v5 adds
//! the close signal `[255, channel]` that ends one channel), and the
//! tunnel that carries SPDY inside binary messages for port-forward
//! (`SPDY/3.1+portforward.k8s.io`, kubectl 1.30 and later).

use base64::Engine as _;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt, DuplexStream},
    sync::{mpsc, watch},
};
use tokio_tungstenite::{
    WebSocketStream,
    tungstenite::{
        Message,
        protocol::{CloseFrame, Role, frame::coding::CloseCode},
    },
};
use tracing::debug;

pub const CHANNEL_STDIN: u8 = 0;
pub const CHANNEL_STDOUT: u8 = 1;
pub const CHANNEL_STDERR: u8 = 2;
pub const CHANNEL_ERROR: u8 = 3;
pub const CHANNEL_RESIZE: u8 = 4;
/// v5: `[CLOSE, n]` ends channel n.
const CHANNEL_CLOSE: u8 = 255;

/// The tunnelled SPDY port-forward subprotocol.
pub const PORT_FORWARD_TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    Binary,
    Base64,
}

/// A remote-command subprotocol: its codec and protocol version (what
/// the error channel carries, and whether the close signal exists).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelProtocol {
    pub name: &'static str,
    pub codec: Codec,
    pub version: u8,
}

/// The remote-command subprotocols accepted, as the kubelet's (plus v5,
/// which the kubelet leaves to the API server's translation).
pub const REMOTE_COMMAND: &[ChannelProtocol] = &[
    ChannelProtocol { name: "v5.channel.k8s.io", codec: Codec::Binary, version: 5 },
    ChannelProtocol { name: "v4.channel.k8s.io", codec: Codec::Binary, version: 4 },
    ChannelProtocol { name: "v4.base64.channel.k8s.io", codec: Codec::Base64, version: 4 },
    ChannelProtocol { name: "channel.k8s.io", codec: Codec::Binary, version: 1 },
    ChannelProtocol { name: "base64.channel.k8s.io", codec: Codec::Base64, version: 1 },
];

/// The client's first offered protocol that is accepted; a client that
/// offers none gets the plain binary channel protocol (Some(None)).
pub fn choose(offered: &[String]) -> Option<Option<ChannelProtocol>> {
    if offered.is_empty() {
        return Some(None);
    }
    offered.iter().find_map(|o| REMOTE_COMMAND.iter().find(|p| p.name == o.as_str())).map(|p| Some(*p))
}

/// The `Sec-WebSocket-Accept` value for a client's key.
pub fn accept_key(key: &str) -> String {
    tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes())
}

pub async fn websocket(upgraded: Upgraded) -> WebSocketStream<TokioIo<Upgraded>> {
    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await
}

/// What the writer task sends.
pub enum WsOut {
    Data(u8, Bytes),
    /// A normal close after what was queued.
    Close,
}

/// The channels of a remote command over WebSocket.
pub struct WsChannels {
    pub stdin: mpsc::Receiver<Bytes>,
    pub resize: mpsc::Receiver<Bytes>,
    pub out: mpsc::Sender<WsOut>,
    /// True once the client's side has ended (close frame, EOF, error).
    pub gone: watch::Receiver<bool>,
}

/// One message of a channel protocol, decoded: (channel, payload).
pub fn decode_message(codec: Codec, msg: &Message) -> Option<(u8, Bytes)> {
    match (codec, msg) {
        (Codec::Binary, Message::Binary(b)) if !b.is_empty() => Some((b[0], b.slice(1..))),
        (Codec::Base64, Message::Text(t)) if !t.is_empty() => {
            let s = t.as_str();
            let ch = s.as_bytes()[0].wrapping_sub(b'0');
            let data = base64::engine::general_purpose::STANDARD.decode(&s[1..]).ok()?;
            Some((ch, Bytes::from(data)))
        }
        _ => None,
    }
}

pub fn encode_message(codec: Codec, channel: u8, data: &[u8]) -> Message {
    match codec {
        Codec::Binary => {
            let mut v = Vec::with_capacity(data.len() + 1);
            v.push(channel);
            v.extend_from_slice(data);
            Message::Binary(v.into())
        }
        Codec::Base64 => {
            let mut s = String::with_capacity(data.len() * 4 / 3 + 4);
            s.push((b'0' + channel) as char);
            s.push_str(&base64::engine::general_purpose::STANDARD.encode(data));
            Message::Text(s.into())
        }
    }
}

/// Runs the channel protocol on `ws` (reader and writer tasks).
pub fn channels(ws: WebSocketStream<TokioIo<Upgraded>>, protocol: Option<ChannelProtocol>) -> WsChannels {
    let codec = protocol.map_or(Codec::Binary, |p| p.codec);
    let close_signal = protocol.is_some_and(|p| p.version >= 5);
    let (sink, mut stream) = ws.split();
    let (stdin_tx, stdin) = mpsc::channel::<Bytes>(64);
    let (resize_tx, resize) = mpsc::channel::<Bytes>(8);
    let (out, out_rx) = mpsc::channel::<WsOut>(64);
    let (gone_tx, gone) = watch::channel(false);
    tokio::spawn(async move {
        let (mut stdin_tx, mut resize_tx) = (Some(stdin_tx), Some(resize_tx));
        while let Some(m) = stream.next().await {
            let m = match m {
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(m) => m,
            };
            let Some((ch, data)) = decode_message(codec, &m) else { continue };
            match ch {
                CHANNEL_CLOSE if close_signal => match data.first() {
                    Some(&CHANNEL_STDIN) => stdin_tx = None,
                    Some(&CHANNEL_RESIZE) => resize_tx = None,
                    _ => {}
                },
                CHANNEL_STDIN => {
                    if let Some(tx) = &stdin_tx
                        && !data.is_empty()
                        && tx.send(data).await.is_err()
                    {
                        stdin_tx = None;
                    }
                }
                CHANNEL_RESIZE => {
                    if let Some(tx) = &resize_tx {
                        let _ = tx.send(data).await;
                    }
                }
                other => debug!("WebSocket: data on channel {other} ignored"),
            }
        }
        let _ = gone_tx.send(true);
    });
    tokio::spawn(write_out(sink, codec, out_rx));
    WsChannels { stdin, resize, out, gone }
}

/// Sends what the session writes to the client, in `codec`, until it
/// closes or the client is gone; then closes the socket.
async fn write_out(
    mut sink: futures::stream::SplitSink<WebSocketStream<TokioIo<Upgraded>>, Message>,
    codec: Codec,
    mut out_rx: mpsc::Receiver<WsOut>,
) {
    while let Some(o) = out_rx.recv().await {
        let r = match o {
            WsOut::Data(ch, data) => sink.send(encode_message(codec, ch, &data)).await,
            WsOut::Close => {
                let frame = CloseFrame { code: CloseCode::Normal, reason: "".into() };
                let _ = sink.send(Message::Close(Some(frame))).await;
                break;
            }
        };
        if r.is_err() {
            break;
        }
    }
    let _ = sink.close().await;
}

/// The port-forward subprotocols of WebSocket clients that do not tunnel
/// SPDY (two channels per `port` parameter: data 2n, error 2n+1).
pub const PORT_FORWARD: &[ChannelProtocol] = &[
    ChannelProtocol { name: "v4.channel.k8s.io", codec: Codec::Binary, version: 4 },
    ChannelProtocol { name: "v4.base64.channel.k8s.io", codec: Codec::Base64, version: 4 },
];

/// `channels` numbered channels in from the client (one receiver each),
/// one sender out, and whether the client has gone.
pub struct Mux {
    pub inputs: Vec<mpsc::Receiver<Bytes>>,
    pub out: mpsc::Sender<WsOut>,
    pub gone: watch::Receiver<bool>,
}

/// Runs a plain channel protocol with `channels` channels on `ws`.
pub fn mux(ws: WebSocketStream<TokioIo<Upgraded>>, codec: Codec, channels: usize) -> Mux {
    let (sink, mut stream) = ws.split();
    let (txs, inputs): (Vec<_>, Vec<_>) = (0..channels).map(|_| mpsc::channel::<Bytes>(64)).unzip();
    let (out, out_rx) = mpsc::channel::<WsOut>(64);
    let (gone_tx, gone) = watch::channel(false);
    tokio::spawn(async move {
        let mut txs: Vec<Option<mpsc::Sender<Bytes>>> = txs.into_iter().map(Some).collect();
        while let Some(Ok(m)) = stream.next().await {
            if matches!(m, Message::Close(_)) {
                break;
            }
            let Some((ch, data)) = decode_message(codec, &m) else { continue };
            if let Some(slot) = txs.get_mut(usize::from(ch))
                && let Some(tx) = slot
                && !data.is_empty()
                && tx.send(data).await.is_err()
            {
                *slot = None;
            }
        }
        let _ = gone_tx.send(true);
    });
    tokio::spawn(write_out(sink, codec, out_rx));
    Mux { inputs, out, gone }
}

/// Carries the bytes of binary messages both ways between `ws` and the
/// returned stream (SPDY runs on it), until either side ends.
pub fn tunnel(ws: WebSocketStream<TokioIo<Upgraded>>) -> DuplexStream {
    let (ours, theirs) = tokio::io::duplex(256 * 1024);
    let (mut sink, mut stream) = ws.split();
    let (mut rd, mut wr) = tokio::io::split(ours);
    tokio::spawn(async move {
        while let Some(Ok(m)) = stream.next().await {
            match m {
                Message::Binary(b) if wr.write_all(&b).await.is_err() => break,
                Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = wr.shutdown().await;
    });
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if sink.send(Message::Binary(Bytes::copy_from_slice(&buf[..n]))).await.is_err() {
                        break;
                    }
                }
            }
        }
        let frame = CloseFrame { code: CloseCode::Normal, reason: "".into() };
        let _ = sink.send(Message::Close(Some(frame))).await;
        let _ = sink.close().await;
    });
    theirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_frames_in_both_codecs() {
        for codec in [Codec::Binary, Codec::Base64] {
            let m = encode_message(codec, CHANNEL_STDOUT, b"foo\n");
            assert_eq!(decode_message(codec, &m), Some((CHANNEL_STDOUT, Bytes::from_static(b"foo\n"))));
        }
        // The documented examples of the two protocols.
        assert_eq!(encode_message(Codec::Base64, 0, b"foo\n"), Message::Text("0Zm9vCg==".into()));
        assert_eq!(encode_message(Codec::Binary, 1, b"\n"), Message::Binary(Bytes::from_static(&[1, 10])));
        assert_eq!(decode_message(Codec::Binary, &Message::Binary(Bytes::new())), None);
        assert_eq!(decode_message(Codec::Base64, &Message::Text("1!!".into())), None);
    }

    #[test]
    fn protocol_choice_follows_the_clients_order() {
        let offer = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(choose(&offer(&["v5.channel.k8s.io"])).unwrap().unwrap().version, 5);
        assert_eq!(
            choose(&offer(&["v4.base64.channel.k8s.io", "v5.channel.k8s.io"])).unwrap().unwrap().codec,
            Codec::Base64
        );
        assert_eq!(choose(&offer(&[])), Some(None));
        assert_eq!(choose(&offer(&["v6.channel.k8s.io"])), None);
        // RFC 6455's example key.
        assert_eq!(accept_key("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }
}
