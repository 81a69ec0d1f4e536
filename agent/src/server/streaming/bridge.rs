//! Joins a client's remote-command streams to the runtime's: stdin and
//! resize go in, stdout and stderr come out, and when the runtime reports
//! how the command ended the client gets it on its error channel in its
//! own protocol's format. A session ends early when the client goes away
//! or nothing moves for streamingConnectionIdleTimeout: the runtime
//! connection is closed and the exec'd process (if known) killed.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

use tracing::{debug, info};

use super::{
    client::{ClientStreams, Output},
    reaper::ExecProcess,
    runtime::RuntimeStreams,
    status::{self, Outcome},
};

/// The last time data moved, shared by the pumps of one session.
#[derive(Clone)]
pub struct Activity {
    origin: Instant,
    last_ms: Arc<AtomicU64>,
}

impl Default for Activity {
    fn default() -> Self {
        Activity { origin: Instant::now(), last_ms: Arc::default() }
    }
}

impl Activity {
    pub fn touch(&self) {
        self.last_ms.store(self.origin.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    pub fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.origin.elapsed().saturating_sub(last)
    }

    /// Resolves once nothing has moved for `limit` (never if zero).
    pub async fn idle(&self, limit: Duration) {
        if limit.is_zero() {
            return std::future::pending().await;
        }
        loop {
            let idle = self.idle_for();
            if idle >= limit {
                return;
            }
            tokio::time::sleep(limit - idle).await;
        }
    }
}

/// Why a session ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// The command ended; the client was told how.
    Finished(Outcome),
    ClientGone,
    IdleTimeout,
}

/// A terminal size as the resize stream carries it.
#[derive(serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "PascalCase")]
struct TerminalSize {
    width: u16,
    height: u16,
}

/// Runs the session to its end.
pub async fn run(
    client: ClientStreams,
    runtime: RuntimeStreams,
    idle_timeout: Duration,
    exec: Option<ExecProcess>,
    what: &str,
) -> End {
    let activity = Activity::default();
    activity.touch();
    let ClientStreams { stdin, resize, sink, mut gone, version } = client;
    let RuntimeStreams { session, mut error, stdin: rt_stdin, stdout, stderr, resize: rt_resize } = runtime;
    let sink = Arc::new(sink);
    let mut tasks = tokio::task::JoinSet::new();
    if let (Some(mut src), Some(dst)) = (stdin, rt_stdin) {
        let a = activity.clone();
        tasks.spawn(async move {
            while let Some(b) = src.recv().await {
                a.touch();
                if dst.write_bytes(b).await.is_err() {
                    return;
                }
            }
            // The client's stdin ended: so does the command's.
            let _ = dst.close().await;
        });
    }
    if let (Some(mut src), Some(dst)) = (resize, rt_resize) {
        tasks.spawn(async move {
            let mut buf: Vec<u8> = vec![];
            while let Some(b) = src.recv().await {
                buf.extend_from_slice(&b);
                // Whole JSON objects go on; a partial one waits for more.
                let mut it = serde_json::Deserializer::from_slice(&buf).into_iter::<TerminalSize>();
                let mut used = 0;
                while let Some(Ok(size)) = it.next() {
                    used = it.byte_offset();
                    debug!("terminal resized to {}x{}", size.width, size.height);
                    let json = serde_json::to_vec(&size).unwrap_or_default();
                    if dst.write(&json).await.is_err() {
                        return;
                    }
                }
                buf.drain(..used);
            }
        });
    }
    let mut outputs = tokio::task::JoinSet::new();
    for (src, which) in [(stdout, Output::Stdout), (stderr, Output::Stderr)] {
        let Some(mut src) = src else { continue };
        let (a, sink) = (activity.clone(), sink.clone());
        outputs.spawn(async move {
            while let Some(b) = src.recv().await {
                a.touch();
                if !sink.write(which, b).await {
                    break;
                }
            }
        });
    }
    let finished = async {
        let mut err: Vec<u8> = vec![];
        while let Some(b) = error.recv().await {
            err.extend_from_slice(&b);
        }
        // All output is read before the status is written.
        while outputs.join_next().await.is_some() {}
        status::decode_v4(&err)
    };
    let gone_fut = async {
        let _ = gone.wait_for(|g| *g).await;
    };
    let end = tokio::select! {
        outcome = finished => End::Finished(outcome),
        _ = gone_fut => End::ClientGone,
        _ = activity.idle(idle_timeout) => End::IdleTimeout,
    };
    tasks.abort_all();
    match &end {
        End::Finished(outcome) => {
            sink.finish(outcome, version).await;
            debug!("{what}: ended ({outcome:?})");
        }
        End::ClientGone | End::IdleTimeout => {
            let killed = exec.as_ref().map_or(0, ExecProcess::kill);
            if end == End::IdleTimeout {
                info!("{what}: idle for {idle_timeout:?} (streamingConnectionIdleTimeout): closed");
                let e = Outcome::Error(format!("the session was idle for {idle_timeout:?} and was closed"));
                sink.finish(&e, version).await;
            } else {
                debug!("{what}: the client went away");
            }
            if killed > 0 {
                info!("{what}: killed {killed} process(es) the session left running");
            }
        }
    }
    // Ending the runtime's connection ends its side of the streams.
    session.close().await;
    drop(exec);
    end
}

/// Bytes copied between two stream halves, touching `activity`.
pub async fn pump(
    mut src: crate::server::spdy::StreamReader,
    dst: crate::server::spdy::StreamWriter,
    activity: Activity,
) {
    while let Some(b) = src.recv().await {
        activity.touch();
        if dst.write_bytes(b).await.is_err() {
            return;
        }
    }
    let _ = dst.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idleness_is_measured_from_the_last_data() {
        let a = Activity::default();
        a.touch();
        let idle = tokio::spawn({
            let a = a.clone();
            async move { a.idle(Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert!(!idle.is_finished());
        a.touch();
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert!(!idle.is_finished(), "data 6 s ago: not idle yet");
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(idle.is_finished(), "nothing for 11 s");
        assert!(a.idle_for() >= Duration::from_secs(10));
    }
}
