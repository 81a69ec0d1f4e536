//! What one listener holds open, and for how long: the connection cap,
//! and the timeouts that close connections sending nothing useful.
//!
//! Every accepted connection takes a slot. When the listener is full, the
//! oldest connection that has no request in flight and is not an upgraded
//! stream (one still in its TLS handshake, one that never sent a complete
//! request, one idle between requests) is closed to make room; if every
//! connection is busy, the new one is closed instead. So stalled
//! connections can never lock out a client that completes its handshake
//! and request promptly, and the agent's file descriptors stay bounded.
//!
//! A connection is closed when:
//! - its TLS handshake takes longer than the request-header timeout;
//! - no complete request arrives within the request-header timeout of
//!   the handshake (slow or absent headers), or within the idle timeout
//!   of its previous response (hyper also bounds each later request's
//!   headers by the request-header timeout);
//! - a write makes no progress for the write timeout (a client that stops
//!   reading).
//!
//! Upgraded connections (exec, attach, port-forward) keep their slot but
//! none of these timeouts: once the 101 is sent, streamingConnectionIdleTimeout
//! governs them (`streaming/`). A response still being streamed (logs
//! -f, /debug/events) counts as a request in flight.

use std::{
    collections::BTreeMap,
    future::Future as _,
    io,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use parking_lot::Mutex;
use rustix::io::Errno;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::Notify,
    time::{Instant, Sleep},
};

use super::http::Body;

/// The limits of one listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once (see [`effective_cap`]).
    pub max_connections: usize,
    /// The TLS handshake, and the time to the first complete request.
    pub request_header_timeout: Duration,
    /// Between responses, with nothing in flight.
    pub idle_timeout: Duration,
    /// A write that makes no progress.
    pub write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            request_header_timeout: Duration::from_secs(10),
            // The kubelet's http.Server IdleTimeout.
            idle_timeout: Duration::from_secs(90),
            write_timeout: Duration::from_secs(60),
        }
    }
}

/// The connection cap for an open-file limit of `nofile`: at most half of
/// it, so the agent keeps descriptors for the runtime, cgroup files and
/// the API server however many clients connect (pure).
pub fn effective_cap(configured: usize, nofile: u64) -> usize {
    let half = usize::try_from(nofile / 2).unwrap_or(usize::MAX);
    configured.min(half).max(1)
}

/// The process's soft RLIMIT_NOFILE.
pub fn open_file_limit() -> u64 {
    // None is RLIM_INFINITY.
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// What the cap decision sees of one open connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub id: u64,
    pub busy: bool,
    pub upgraded: bool,
}

/// The connection to close to make room: the oldest (lowest id) that is
/// neither serving a request nor upgraded; None when all are (pure).
pub fn victim(open: impl IntoIterator<Item = Seen>) -> Option<u64> {
    open.into_iter().filter(|c| !c.busy && !c.upgraded).map(|c| c.id).min()
}

/// The accept loop's back-off after running out of descriptors: 5 ms,
/// doubling to 1 s, as Go's http.Server (pure).
pub fn next_backoff(previous: Option<Duration>) -> Duration {
    match previous {
        None => Duration::from_millis(5),
        Some(d) => (d * 2).min(Duration::from_secs(1)),
    }
}

/// Whether an accept error means the process (or the system) ran out of
/// descriptors or buffers, which retrying at once cannot fix.
pub fn is_exhaustion(e: &io::Error) -> bool {
    matches!(Errno::from_io_error(e), Some(Errno::MFILE | Errno::NFILE | Errno::NOBUFS | Errno::NOMEM))
}

/// One open connection's state, shared by its task, its I/O and its
/// requests.
#[derive(Debug)]
pub struct Conn {
    pub id: u64,
    busy: AtomicUsize,
    upgraded: AtomicBool,
    /// A response was completed (the idle timeout applies from then on).
    served: AtomicBool,
    /// When the connection last had nothing in flight, in ms since `epoch`.
    idle_since: AtomicU64,
    epoch: Instant,
    changed: Notify,
    closed: AtomicBool,
    close: Notify,
}

impl Conn {
    fn new(id: u64) -> Conn {
        Conn {
            id,
            busy: AtomicUsize::new(0),
            upgraded: AtomicBool::new(false),
            served: AtomicBool::new(false),
            idle_since: AtomicU64::new(0),
            epoch: Instant::now(),
            changed: Notify::new(),
            closed: AtomicBool::new(false),
            close: Notify::new(),
        }
    }

    fn seen(&self) -> Seen {
        Seen { id: self.id, busy: self.busy.load(Ordering::Acquire) > 0, upgraded: self.is_upgraded() }
    }

    pub fn is_upgraded(&self) -> bool {
        self.upgraded.load(Ordering::Acquire)
    }

    /// The connection switched protocols: its timeouts are the stream's.
    pub fn mark_upgraded(&self) {
        self.upgraded.store(true, Ordering::Release);
        self.changed.notify_one();
    }

    /// Restarts the clock of the first request (after the TLS handshake).
    pub fn handshake_done(&self) {
        self.set_idle_now();
        self.changed.notify_one();
    }

    fn set_idle_now(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.idle_since.store(ms, Ordering::Release);
    }

    /// A request starts; the guard ends it when dropped (with the
    /// response body, for a streamed response).
    pub fn request(self: &Arc<Self>) -> InFlight {
        self.busy.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_one();
        InFlight(self.clone())
    }

    /// Resolves once the cap closed this connection.
    pub async fn closed(&self) {
        loop {
            let notified = self.close.notified();
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }

    fn shut(&self) {
        self.closed.store(true, Ordering::Release);
        self.close.notify_waiters();
    }

    /// Resolves when the connection has been waiting too long for a
    /// request: `header` before the first response, `idle` after one.
    /// Never resolves while a request is in flight or once upgraded.
    pub async fn expired(&self, header: Duration, idle: Duration) {
        loop {
            if self.is_upgraded() {
                return std::future::pending().await;
            }
            if self.busy.load(Ordering::Acquire) > 0 {
                self.changed.notified().await;
                continue;
            }
            let limit = if self.served.load(Ordering::Acquire) { idle } else { header };
            let since = self.idle_since.load(Ordering::Acquire);
            let deadline = self.epoch + Duration::from_millis(since) + limit;
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {
                    if self.busy.load(Ordering::Acquire) == 0
                        && !self.is_upgraded()
                        && self.idle_since.load(Ordering::Acquire) == since
                    {
                        return;
                    }
                }
                _ = self.changed.notified() => {}
            }
        }
    }
}

/// A request in flight on a connection.
#[derive(Debug)]
pub struct InFlight(Arc<Conn>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let c = &self.0;
        if c.busy.fetch_sub(1, Ordering::AcqRel) == 1 {
            c.set_idle_now();
            c.served.store(true, Ordering::Release);
        }
        c.changed.notify_one();
    }
}

/// A response body that keeps its request in flight until it is sent or
/// dropped.
pub struct GuardedBody {
    inner: Body,
    _request: InFlight,
}

impl GuardedBody {
    pub fn wrap(inner: Body, request: InFlight) -> Body {
        GuardedBody { inner, _request: request }.boxed()
    }
}

impl HttpBody for GuardedBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The open connections of one listener.
#[derive(Debug)]
pub struct Connections {
    pub limits: Limits,
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    next: u64,
    open: BTreeMap<u64, Arc<Conn>>,
}

/// A connection's place in the table; freed when dropped (the I/O owns
/// it, so an upgraded stream keeps it until the stream ends).
#[derive(Debug)]
pub struct Slot {
    conns: Arc<Connections>,
    pub conn: Arc<Conn>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.conns.table.lock().open.remove(&self.conn.id);
    }
}

impl Connections {
    pub fn new(limits: Limits) -> Arc<Connections> {
        Arc::new(Connections { limits, table: Mutex::new(Table::default()) })
    }

    pub fn open(&self) -> usize {
        self.table.lock().open.len()
    }

    /// A slot for a new connection, closing the oldest waiting one when
    /// the listener is full; None when every open connection is busy.
    pub fn admit(self: &Arc<Self>) -> Option<Slot> {
        let mut t = self.table.lock();
        if t.open.len() >= self.limits.max_connections {
            let id = victim(t.open.values().map(|c| c.seen()))?;
            if let Some(c) = t.open.remove(&id) {
                c.shut();
            }
        }
        t.next += 1;
        let conn = Arc::new(Conn::new(t.next));
        t.open.insert(conn.id, conn.clone());
        Some(Slot { conns: self.clone(), conn })
    }

    /// Closes the oldest waiting connection (to free a descriptor);
    /// false when there is none.
    pub fn evict_one(&self) -> bool {
        let mut t = self.table.lock();
        let Some(id) = victim(t.open.values().map(|c| c.seen())) else { return false };
        if let Some(c) = t.open.remove(&id) {
            c.shut();
        }
        true
    }
}

/// A connection's byte stream with its slot and the write timeout.
pub struct TrackedIo<I> {
    inner: I,
    slot: Slot,
    write_timeout: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<I> TrackedIo<I> {
    pub fn new(inner: I, slot: Slot, write_timeout: Duration) -> TrackedIo<I> {
        TrackedIo { inner, slot, write_timeout, stalled: None }
    }

    pub fn conn(&self) -> &Arc<Conn> {
        &self.slot.conn
    }

    /// A pending write: Err once it has made no progress for the write
    /// timeout (not on upgraded streams, which time out on their own).
    fn check_stall(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.slot.conn.is_upgraded() || self.write_timeout.is_zero() {
            self.stalled = None;
            return Poll::Pending;
        }
        let timeout = self.write_timeout;
        let sleep = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {timeout:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for TrackedIo<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for TrackedIo<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Pending => self.check_stall(cx),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Pending => self.check_stall(cx),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending => self.check_stall(cx).map_ok(|_| ()),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_follows_the_open_file_limit() {
        assert_eq!(effective_cap(1024, 1_000_000), 1024);
        assert_eq!(effective_cap(1024, 256), 128);
        assert_eq!(effective_cap(1024, 1), 1);
        assert_eq!(effective_cap(10, u64::MAX), 10);
    }

    #[test]
    fn the_victim_is_the_oldest_waiting_connection() {
        let c = |id, busy, upgraded| Seen { id, busy, upgraded };
        assert_eq!(victim([c(3, false, false), c(1, true, false), c(2, false, true), c(4, false, false)]), Some(3));
        assert_eq!(victim([c(1, true, false), c(2, false, true)]), None);
        assert_eq!(victim([]), None);
    }

    #[test]
    fn backoff_doubles_to_a_second() {
        let mut d = None;
        let mut seen = vec![];
        for _ in 0..10 {
            let n = next_backoff(d);
            seen.push(n.as_millis());
            d = Some(n);
        }
        assert_eq!(seen, vec![5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        assert!(is_exhaustion(&Errno::MFILE.into()));
        assert!(is_exhaustion(&Errno::NFILE.into()));
        assert!(!is_exhaustion(&Errno::CONNABORTED.into()));
        assert!(!is_exhaustion(&io::Error::other("not an OS error")));
    }

    #[tokio::test]
    async fn a_full_table_closes_the_oldest_waiting_connection() {
        let conns = Connections::new(Limits { max_connections: 2, ..Default::default() });
        let a = conns.admit().unwrap();
        let b = conns.admit().unwrap();
        let _busy = b.conn.request();
        let c = conns.admit().expect("a is closed to make room");
        assert!(a.conn.closed.load(Ordering::Acquire));
        tokio::time::timeout(Duration::from_secs(1), a.conn.closed()).await.unwrap();
        assert_eq!(conns.open(), 2);
        c.conn.mark_upgraded();
        assert!(conns.admit().is_none(), "busy and upgraded connections are kept");
        drop(c);
        assert_eq!(conns.open(), 1);
        assert!(conns.admit().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn connections_expire_only_while_waiting_for_a_request() {
        let conns = Connections::new(Limits::default());
        let slot = conns.admit().unwrap();
        let conn = slot.conn.clone();
        let (header, idle) = (Duration::from_secs(10), Duration::from_secs(90));
        let start = Instant::now();
        conn.expired(header, idle).await;
        assert_eq!(start.elapsed(), header, "no request: the header timeout");
        // A request in flight (a streamed body) holds it open.
        let req = conn.request();
        let waited = tokio::time::timeout(Duration::from_secs(1000), conn.expired(header, idle)).await;
        assert!(waited.is_err(), "never expires while busy");
        drop(req);
        let start = Instant::now();
        conn.expired(header, idle).await;
        assert_eq!(start.elapsed(), idle, "after a response: the idle timeout");
        conn.mark_upgraded();
        assert!(tokio::time::timeout(Duration::from_secs(1000), conn.expired(header, idle)).await.is_err());
    }
}
