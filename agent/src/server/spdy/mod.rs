//! SPDY/3.1 as Kubernetes speaks it: the framing kubectl (before 1.31,
//! and as a fallback after), client-go, the API server and the container
//! runtimes' stream servers use for exec, attach and port-forward, on a
//! connection upgraded from HTTP/1.1 (`Upgrade: SPDY/3.1`).
//!
//! Written here rather than taken from a crate: the one maintained Rust
//! SPDY/3.1 crate (spdy-mux) is client-only (it opens stream pairs over
//! its own pool of WebSocket transports and cannot accept the streams a
//! kubectl opens), and swiftlet needs both ends over plain upgraded
//! connections. The module is small because Kubernetes uses a small part
//! of SPDY: streams opened with a few headers, data, half-close, reset,
//! ping and goaway; no flow control (Go's spdystream has none), no
//! server push, no priorities. Header blocks use flate2 with zlib-rs,
//! which supports the preset dictionary SPDY requires.

pub mod frame;
pub mod session;

pub use frame::{Headers, header};
pub use session::{IncomingStream, OpenError, Role, Session, StreamReader, StreamWriter};
