//! A SPDY/3.1 session over any byte stream: a reader task that decodes
//! frames and hands each stream's data to it, a writer task that encodes
//! what the streams send (one header compression context each way), and
//! stream handles for both sides.
//!
//! As Go's spdystream (what kubectl, client-go and the container
//! runtimes' stream servers use): no flow control (WINDOW_UPDATE and
//! SETTINGS are read and ignored, none are sent; TCP's own back-pressure
//! applies), pings are echoed, open streams go on after a GOAWAY, and the
//! end of the byte stream ends every stream.

use std::{collections::HashMap, sync::Arc};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    sync::{mpsc, oneshot, watch},
};
use tracing::debug;

use super::frame::{self, FLAG_FIN, Frame, HeaderDecoder, HeaderEncoder, Headers};

/// Data frames are cut at this size (kubelet peers read 32 KiB at a time).
const CHUNK: usize = 32 * 1024;
/// Frames queued per stream before the reader waits for its consumer.
const STREAM_QUEUE: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Accepts streams the peer opens (odd ids); opens even ones.
    Server,
    /// Opens odd-numbered streams.
    Client,
}

enum Out {
    Frame(Frame),
    Flush(oneshot::Sender<()>),
}

/// What a stream receives: data chunks, then the end of the channel at
/// FIN, RST_STREAM, GOAWAY or the end of the connection.
pub struct StreamReader {
    rx: mpsc::Receiver<Bytes>,
}

impl StreamReader {
    /// The next chunk, or None at the end of the stream.
    pub async fn recv(&mut self) -> Option<Bytes> {
        self.rx.recv().await
    }
}

/// The sending half of a stream.
#[derive(Clone)]
pub struct StreamWriter {
    pub id: u32,
    out: mpsc::Sender<Out>,
}

#[derive(Debug, thiserror::Error)]
#[error("the SPDY connection is closed")]
pub struct Closed;

/// Why [`Session::open`] got no stream.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("the peer refused the stream (RST_STREAM status {0})")]
    Refused(u32),
    #[error("the SPDY connection closed while the stream was opened")]
    Closed,
}

impl StreamWriter {
    /// Sends `data` (cut into frames).
    pub async fn write(&self, data: &[u8]) -> Result<(), Closed> {
        for chunk in data.chunks(CHUNK) {
            let f = Frame::Data { stream_id: self.id, flags: 0, data: Bytes::copy_from_slice(chunk) };
            self.out.send(Out::Frame(f)).await.map_err(|_| Closed)?;
        }
        Ok(())
    }

    /// Sends `data` without copying when it fits one frame.
    pub async fn write_bytes(&self, data: Bytes) -> Result<(), Closed> {
        if data.len() > CHUNK {
            return self.write(&data).await;
        }
        self.out.send(Out::Frame(Frame::Data { stream_id: self.id, flags: 0, data })).await.map_err(|_| Closed)
    }

    /// Half-closes the stream (an empty DATA frame with FIN).
    pub async fn close(&self) -> Result<(), Closed> {
        let f = Frame::Data { stream_id: self.id, flags: FLAG_FIN, data: Bytes::new() };
        self.out.send(Out::Frame(f)).await.map_err(|_| Closed)
    }

    /// Aborts the stream.
    pub async fn reset(&self) {
        let _ = self.out.send(Out::Frame(Frame::RstStream { stream_id: self.id, status: frame::RST_CANCEL })).await;
    }
}

/// A stream the peer opened.
pub struct IncomingStream {
    pub headers: Headers,
    pub reader: StreamReader,
    pub writer: StreamWriter,
}

impl IncomingStream {
    pub fn header(&self, name: &str) -> Option<&str> {
        frame::header(&self.headers, name)
    }
}

struct Shared {
    streams: Mutex<HashMap<u32, mpsc::Sender<Bytes>>>,
    /// Replies awaited by streams this side opened: Ok at SYN_REPLY, the
    /// status at RST_STREAM; dropped when the connection ends.
    replies: Mutex<HashMap<u32, oneshot::Sender<Result<(), u32>>>>,
    /// The next id to open, held until its SYN_STREAM is queued: ids must
    /// reach the peer in increasing order (a peer resets a stream whose id
    /// is below one it has seen, as spdystream does), and streams are
    /// opened from many tasks at once.
    next_id: tokio::sync::Mutex<u32>,
}

/// A running session. Dropping it does not end the connection: call
/// [`Session::close`], or let the peer end it.
#[derive(Clone)]
pub struct Session {
    out: mpsc::Sender<Out>,
    shared: Arc<Shared>,
    /// Turns true when the connection has ended (read side gone).
    ended: watch::Receiver<bool>,
}

impl Session {
    /// Starts the session on `io`; returns it and the streams the peer
    /// opens (a client gets none unless the peer pushes).
    pub fn start<IO>(io: IO, role: Role) -> (Session, mpsc::Receiver<IncomingStream>)
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (rd, wr) = tokio::io::split(io);
        let (out_tx, out_rx) = mpsc::channel::<Out>(256);
        let (in_tx, in_rx) = mpsc::channel::<IncomingStream>(16);
        let (ended_tx, ended_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            streams: Mutex::default(),
            replies: Mutex::default(),
            next_id: tokio::sync::Mutex::new(if role == Role::Client { 1 } else { 2 }),
        });
        tokio::spawn(write_loop(wr, out_rx));
        tokio::spawn(read_loop(rd, role, shared.clone(), out_tx.clone(), in_tx, ended_tx));
        (Session { out: out_tx, shared, ended: ended_rx }, in_rx)
    }

    /// Opens a stream with `headers` and waits for the peer's SYN_REPLY.
    /// `fin` opens it half-closed (this side sends nothing).
    pub async fn open(&self, headers: Headers, fin: bool) -> Result<(StreamReader, StreamWriter), OpenError> {
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        let (reply_tx, reply_rx) = oneshot::channel();
        let id = {
            let mut next_id = self.shared.next_id.lock().await;
            let id = *next_id;
            *next_id += 2;
            self.shared.streams.lock().insert(id, tx);
            self.shared.replies.lock().insert(id, reply_tx);
            if self.is_ended() {
                self.shared.replies.lock().remove(&id);
                self.shared.streams.lock().remove(&id);
                return Err(OpenError::Closed);
            }
            let f = Frame::SynStream {
                stream_id: id,
                associated_to: 0,
                priority: 0,
                flags: if fin { FLAG_FIN } else { 0 },
                headers,
            };
            self.out.send(Out::Frame(f)).await.map_err(|_| OpenError::Closed)?;
            id
        };
        match reply_rx.await {
            Ok(Ok(())) => Ok((StreamReader { rx }, StreamWriter { id, out: self.out.clone() })),
            Ok(Err(status)) => Err(OpenError::Refused(status)),
            Err(_) => Err(OpenError::Closed),
        }
    }

    /// Waits until everything queued so far is written.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.out.send(Out::Flush(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// Sends GOAWAY after what is queued, then closes the connection.
    pub async fn close(&self) {
        let _ = self.out.send(Out::Frame(Frame::GoAway { last_good_stream_id: 0, status: 0 })).await;
        self.flush().await;
        // The writer ends (and shuts the socket down) when every sender is gone.
    }

    /// Resolves when the connection has ended.
    pub async fn ended(&self) {
        let mut e = self.ended.clone();
        let _ = e.wait_for(|v| *v).await;
    }

    pub fn is_ended(&self) -> bool {
        *self.ended.borrow()
    }
}

async fn write_loop<W: AsyncWrite>(wr: W, mut rx: mpsc::Receiver<Out>) {
    let mut wr = std::pin::pin!(wr);
    let mut enc = HeaderEncoder::default();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    'outer: while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        let mut flushes = vec![];
        // Batch what is queued into one write.
        while let Some(o) = next.take() {
            match o {
                Out::Frame(f) => {
                    let goaway = matches!(f, Frame::GoAway { .. });
                    if let Err(e) = frame::encode(&f, &mut enc, &mut buf) {
                        debug!("SPDY: cannot encode a frame: {e}");
                    }
                    if goaway {
                        // Nothing after GOAWAY but the flushes.
                        while let Ok(o) = rx.try_recv() {
                            if let Out::Flush(t) = o {
                                flushes.push(t);
                            }
                        }
                        let _ = wr.write_all(&buf).await;
                        let _ = wr.flush().await;
                        let _ = wr.shutdown().await;
                        for t in flushes {
                            let _ = t.send(());
                        }
                        break 'outer;
                    }
                }
                Out::Flush(t) => flushes.push(t),
            }
            if buf.len() < 256 * 1024 {
                next = rx.try_recv().ok();
            }
        }
        if wr.write_all(&buf).await.is_err() || wr.flush().await.is_err() {
            break;
        }
        buf.clear();
        for t in flushes {
            let _ = t.send(());
        }
    }
    // Drain so senders waiting on a full queue are released.
    rx.close();
    while let Some(o) = rx.recv().await {
        if let Out::Flush(t) = o {
            let _ = t.send(());
        }
    }
    let _ = wr.shutdown().await;
}

async fn read_loop<R: AsyncRead>(
    rd: R,
    role: Role,
    shared: Arc<Shared>,
    out: mpsc::Sender<Out>,
    incoming: mpsc::Sender<IncomingStream>,
    ended: watch::Sender<bool>,
) {
    let mut rd = std::pin::pin!(rd);
    let mut dec = HeaderDecoder::default();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut last_peer_stream = 0u32;
    'read: loop {
        while let Some(n) = frame::frame_len(&buf).filter(|n| buf.len() >= *n) {
            let raw = buf.split_to(n).freeze();
            let f = match frame::decode(raw, &mut dec) {
                Ok(f) => f,
                Err(e) => {
                    debug!("SPDY: {e}");
                    let _ =
                        out.try_send(Out::Frame(Frame::GoAway { last_good_stream_id: last_peer_stream, status: 1 }));
                    break 'read;
                }
            };
            match f {
                Frame::SynStream { stream_id, flags, headers, .. } => {
                    let from_peer = (stream_id % 2 == 1) == (role == Role::Server);
                    if !from_peer || stream_id <= last_peer_stream {
                        let rst = Frame::RstStream { stream_id, status: frame::RST_PROTOCOL_ERROR };
                        let _ = out.send(Out::Frame(rst)).await;
                        continue;
                    }
                    last_peer_stream = stream_id;
                    let (tx, rx) = mpsc::channel(STREAM_QUEUE);
                    if flags & FLAG_FIN == 0 {
                        shared.streams.lock().insert(stream_id, tx);
                    }
                    // The reply first, so the peer may send at once.
                    let reply = Frame::SynReply { stream_id, flags: 0, headers: vec![] };
                    if out.send(Out::Frame(reply)).await.is_err() {
                        break 'read;
                    }
                    let s = IncomingStream {
                        headers,
                        reader: StreamReader { rx },
                        writer: StreamWriter { id: stream_id, out: out.clone() },
                    };
                    if incoming.send(s).await.is_err() {
                        let rst = Frame::RstStream { stream_id, status: frame::RST_REFUSED_STREAM };
                        let _ = out.send(Out::Frame(rst)).await;
                    }
                }
                Frame::SynReply { stream_id, flags, .. } => {
                    if let Some(t) = shared.replies.lock().remove(&stream_id) {
                        let _ = t.send(Ok(()));
                    }
                    if flags & FLAG_FIN != 0 {
                        shared.streams.lock().remove(&stream_id);
                    }
                }
                Frame::Data { stream_id, flags, data } => {
                    let tx = shared.streams.lock().get(&stream_id).cloned();
                    if let Some(tx) = tx
                        && !data.is_empty()
                        && tx.send(data).await.is_err()
                    {
                        // The consumer is gone: drop the rest of the stream.
                        shared.streams.lock().remove(&stream_id);
                    }
                    if flags & FLAG_FIN != 0 {
                        shared.streams.lock().remove(&stream_id);
                    }
                }
                Frame::Headers { stream_id, flags, .. } => {
                    if flags & FLAG_FIN != 0 {
                        shared.streams.lock().remove(&stream_id);
                    }
                }
                Frame::RstStream { stream_id, status } => {
                    shared.streams.lock().remove(&stream_id);
                    if let Some(t) = shared.replies.lock().remove(&stream_id) {
                        let _ = t.send(Err(status));
                    }
                }
                Frame::Ping { id } => {
                    // Echo the peer's pings (their parity is not ours).
                    let ours = (id % 2 == 1) == (role == Role::Client);
                    if !ours {
                        let _ = out.send(Out::Frame(Frame::Ping { id })).await;
                    }
                }
                // Streams already open go on after a GOAWAY (the peer
                // closes the connection once they are done).
                Frame::GoAway { .. } => {}
                Frame::Settings | Frame::WindowUpdate { .. } | Frame::Unknown { .. } => {}
            }
        }
        buf.reserve(32 * 1024);
        match rd.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    // Ended first: an open racing this sees it, or its reply is failed here.
    let _ = ended.send(true);
    shared.streams.lock().clear();
    // Dropping the awaited replies fails their opens as closed.
    shared.replies.lock().clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Headers {
        pairs.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect()
    }

    #[tokio::test]
    async fn a_client_and_a_server_exchange_data_and_half_close() {
        let (a, b) = tokio::io::duplex(1024);
        let (client, _) = Session::start(a, Role::Client);
        let (server, mut incoming) = Session::start(b, Role::Server);
        let open = tokio::spawn({
            let client = client.clone();
            async move { client.open(h(&[("streamType", "stdin")]), false).await }
        });
        let mut s = incoming.recv().await.expect("a stream");
        assert_eq!(s.header("streamtype"), Some("stdin"));
        let (mut r, w) = open.await.unwrap().unwrap();
        assert_eq!(w.id, 1);
        // More than the duplex buffer and one chunk: back-pressure, no loss.
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let writer = tokio::spawn({
            let w = w.clone();
            let big = big.clone();
            async move {
                w.write(&big).await.unwrap();
                w.close().await.unwrap();
            }
        });
        let mut got = vec![];
        while let Some(b) = s.reader.recv().await {
            got.extend_from_slice(&b);
        }
        writer.await.unwrap();
        assert_eq!(got, big);
        s.writer.write(b"pong").await.unwrap();
        assert_eq!(r.recv().await.unwrap(), Bytes::from_static(b"pong"));
        server.close().await;
        client.ended().await;
        assert!(r.recv().await.is_none(), "the stream ends with the connection");
        assert!(client.open(vec![], true).await.is_err());
    }

    #[tokio::test]
    async fn a_reset_ends_the_stream_and_pings_are_answered() {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let (client, _) = Session::start(a, Role::Client);
        let (_server, mut incoming) = Session::start(b, Role::Server);
        let open = tokio::spawn({
            let client = client.clone();
            async move { client.open(vec![], false).await }
        });
        let mut s = incoming.recv().await.unwrap();
        let (_r, w) = open.await.unwrap().unwrap();
        w.write(b"x").await.unwrap();
        assert_eq!(s.reader.recv().await.unwrap(), Bytes::from_static(b"x"));
        w.reset().await;
        assert!(s.reader.recv().await.is_none());
        // A client ping (odd) comes back.
        client.out.send(Out::Frame(Frame::Ping { id: 7 })).await.ok().unwrap();
        client.flush().await;
    }

    /// Streams opened at once from many tasks reach the peer in the order
    /// of their ids: a peer resets a stream whose id is below one it has
    /// seen (as spdystream does), which would fail a port-forward pair.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_opens_reach_the_peer_in_id_order() {
        let (a, b) = tokio::io::duplex(1024 * 1024);
        let (client, _) = Session::start(a, Role::Client);
        let (_server, mut incoming) = Session::start(b, Role::Server);
        tokio::spawn(async move { while incoming.recv().await.is_some() {} });
        for round in 0..20 {
            let opens: Vec<_> = (0..32)
                .map(|_| {
                    let client = client.clone();
                    tokio::spawn(async move { client.open(vec![], false).await.map(|(_, w)| w.id) })
                })
                .collect();
            for o in opens {
                let opened = o.await.unwrap();
                assert!(opened.is_ok(), "round {round}: {opened:?}");
            }
        }
    }

    /// A peer's RST_STREAM in answer to SYN_STREAM is a refusal with its
    /// status, told apart from the connection ending.
    #[tokio::test]
    async fn a_refused_open_says_so() {
        let (a, mut peer) = tokio::io::duplex(64 * 1024);
        let (client, _) = Session::start(a, Role::Client);
        let open = tokio::spawn({
            let client = client.clone();
            async move { client.open(vec![], false).await }
        });
        let mut buf = BytesMut::new();
        let stream_id = loop {
            peer.read_buf(&mut buf).await.unwrap();
            if let Some(n) = frame::frame_len(&buf).filter(|n| buf.len() >= *n) {
                match frame::decode(buf.split_to(n).freeze(), &mut HeaderDecoder::default()).unwrap() {
                    Frame::SynStream { stream_id, .. } => break stream_id,
                    other => panic!("expected SYN_STREAM, got {other:?}"),
                }
            }
        };
        let mut out = BytesMut::new();
        let rst = Frame::RstStream { stream_id, status: frame::RST_PROTOCOL_ERROR };
        frame::encode(&rst, &mut HeaderEncoder::default(), &mut out).unwrap();
        peer.write_all(&out).await.unwrap();
        assert!(matches!(open.await.unwrap(), Err(OpenError::Refused(frame::RST_PROTOCOL_ERROR))));
        drop(peer);
        client.ended().await;
        assert!(matches!(client.open(vec![], false).await, Err(OpenError::Closed)));
    }
}
