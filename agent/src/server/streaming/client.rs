//! The client's side of a remote command, whichever protocol it speaks:
//! SPDY (kubectl's streams, by `streamType` header) or WebSocket channels,
//! seen by the bridge as the same sources and sinks.

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};

use super::{
    request::StreamOptions,
    status::{self, Outcome},
    websocket::{CHANNEL_ERROR, CHANNEL_STDERR, CHANNEL_STDOUT, WsChannels, WsOut},
};
use crate::server::spdy::{IncomingStream, Session, StreamReader, StreamWriter};

/// Bytes from the client (stdin, resize): None at the end.
pub enum Source {
    Spdy(StreamReader),
    Channel(mpsc::Receiver<Bytes>),
}

impl Source {
    pub async fn recv(&mut self) -> Option<Bytes> {
        match self {
            Source::Spdy(r) => r.recv().await,
            Source::Channel(r) => r.recv().await,
        }
    }
}

/// Where output goes to the client.
pub enum Sink {
    Spdy { session: Session, stdout: Option<StreamWriter>, stderr: Option<StreamWriter>, error: Option<StreamWriter> },
    WebSocket(mpsc::Sender<WsOut>),
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Stdout,
    Stderr,
}

impl Sink {
    /// False once the client can no longer be written to.
    pub async fn write(&self, which: Output, data: Bytes) -> bool {
        match self {
            Sink::Spdy { stdout, stderr, .. } => {
                let w = if which == Output::Stdout { stdout } else { stderr };
                match w {
                    Some(w) => w.write_bytes(data).await.is_ok(),
                    None => true,
                }
            }
            Sink::WebSocket(tx) => {
                let ch = if which == Output::Stdout { CHANNEL_STDOUT } else { CHANNEL_STDERR };
                tx.send(WsOut::Data(ch, data)).await.is_ok()
            }
        }
    }

    /// Writes how the command ended on the error channel (in the format of
    /// protocol `version`) and closes the connection.
    pub async fn finish(&self, outcome: &Outcome, version: u8) {
        let body = status::encode(outcome, version);
        match self {
            Sink::Spdy { session, stdout, stderr, error } => {
                for w in [stdout, stderr].into_iter().flatten() {
                    let _ = w.close().await;
                }
                if let Some(e) = error {
                    if !body.is_empty() {
                        let _ = e.write(&body).await;
                    }
                    let _ = e.close().await;
                }
                session.close().await;
            }
            Sink::WebSocket(tx) => {
                if !body.is_empty() {
                    let _ = tx.send(WsOut::Data(CHANNEL_ERROR, Bytes::from(body))).await;
                }
                let _ = tx.send(WsOut::Close).await;
            }
        }
    }
}

/// A client's remote-command streams.
pub struct ClientStreams {
    pub stdin: Option<Source>,
    pub resize: Option<Source>,
    pub sink: Sink,
    /// Turns true when the client's connection has ended.
    pub gone: watch::Receiver<bool>,
    /// The protocol version (what the error channel carries).
    pub version: u8,
}

impl ClientStreams {
    pub fn from_websocket(ch: WsChannels, opts: StreamOptions, version: u8) -> ClientStreams {
        ClientStreams {
            stdin: opts.stdin.then_some(Source::Channel(ch.stdin)),
            resize: opts.tty.then_some(Source::Channel(ch.resize)),
            sink: Sink::WebSocket(ch.out),
            gone: ch.gone,
            version,
        }
    }

    /// Waits (at most `timeout`) for the streams a SPDY client opens: the
    /// error stream and one per requested stream (resize with a TTY on v3
    /// and later).
    pub async fn from_spdy(
        session: Session,
        mut incoming: mpsc::Receiver<IncomingStream>,
        opts: StreamOptions,
        version: u8,
        timeout: Duration,
    ) -> Result<ClientStreams, String> {
        let expected = 1
            + usize::from(opts.stdin)
            + usize::from(opts.stdout)
            + usize::from(opts.stderr)
            + usize::from(opts.tty && version >= 3);
        let (mut stdin, mut resize, mut stdout, mut stderr, mut error) = (None, None, None, None, None);
        let mut received = 0;
        let deadline = tokio::time::Instant::now() + timeout;
        while received < expected {
            let s = match tokio::time::timeout_at(deadline, incoming.recv()).await {
                Ok(Some(s)) => s,
                Ok(None) => return Err("the client closed the connection before opening its streams".into()),
                Err(_) => return Err("timed out waiting for client to create streams".into()),
            };
            received += 1;
            match s.header("streamtype").unwrap_or("") {
                "error" => error = Some(s.writer),
                "stdin" => stdin = Some(Source::Spdy(s.reader)),
                "stdout" => stdout = Some(s.writer),
                "stderr" => stderr = Some(s.writer),
                "resize" => resize = Some(Source::Spdy(s.reader)),
                other => {
                    tracing::debug!("SPDY client opened a stream of unexpected type {other:?}");
                    received -= 1;
                }
            }
        }
        let (gone_tx, gone) = watch::channel(false);
        let watcher = session.clone();
        tokio::spawn(async move {
            watcher.ended().await;
            let _ = gone_tx.send(true);
        });
        // Streams opened later are refused by dropping them.
        tokio::spawn(async move { while incoming.recv().await.is_some() {} });
        Ok(ClientStreams { stdin, resize, sink: Sink::Spdy { session, stdout, stderr, error }, gone, version })
    }
}
