//! /containerLogs/{namespace}/{pod}/{container}: the kubelet's container
//! logs endpoint (what `kubectl logs` reaches through the API server).
//!
//! The runtime writes each container's output to
//! `<podLogsDir>/<ns>_<pod>_<uid>/<container>/<restartCount>.log` in the CRI
//! format (`<RFC3339Nano> <stdout|stderr> <P|F> <text>`, P marking a partial
//! line). The current attempt is `<restartCount>.log`, the previous one
//! `<restartCount-1>.log`; when that file is gone the runtime's own log
//! path for the container is asked. Options and errors are the kubelet's
//! (PodLogOptions: follow, previous, timestamps, sinceSeconds, sinceTime,
//! tailLines, limitBytes; the legacy `tail`).

use std::{
    fs::File,
    io::{self, Read, Seek, SeekFrom},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use bytes::Bytes;
use hyper::StatusCode;
use k8s_openapi::{
    api::core::v1::{ContainerStatus, Pod},
    jiff::{SignedDuration, Timestamp},
};
use tokio::{io::AsyncBufReadExt, sync::mpsc};

use super::stats_read::pod_log_dir;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogOptions {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    /// Lines older than this are skipped.
    pub since: Option<Timestamp>,
    pub tail_lines: Option<u64>,
    pub limit_bytes: Option<u64>,
}

/// An error answer: status and body, as the kubelet writes them.
pub type Refusal = (StatusCode, String);

fn bad_query() -> Refusal {
    (StatusCode::BAD_REQUEST, r#"{"message": "Unable to decode query."}"#.into())
}

fn invalid() -> Refusal {
    (StatusCode::UNPROCESSABLE_ENTITY, r#"{"message": "Invalid request."}"#.into())
}

/// Query values to bool as the apiserver's parameter codec does: absent or
/// "false"/"0" is false, anything else (even empty) true.
fn flag(v: &str) -> bool {
    !matches!(v.to_ascii_lowercase().as_str(), "false" | "0")
}

/// Decodes and validates the query (the kubelet's PodLogOptions handling).
pub fn parse_options(query: &[(String, String)], now: Timestamp) -> Result<LogOptions, Refusal> {
    let get = |k: &str| query.iter().rev().find(|(q, _)| q == k).map(|(_, v)| v.as_str());
    let int = |k: &str| -> Result<Option<i64>, Refusal> {
        get(k).map(|v| v.parse::<i64>().map_err(|_| bad_query())).transpose()
    };
    let mut o = LogOptions {
        follow: get("follow").is_some_and(flag),
        previous: get("previous").is_some_and(flag),
        timestamps: get("timestamps").is_some_and(flag),
        ..Default::default()
    };
    // The legacy `tail` parameter; "all" means no tail.
    let tail = match get("tail") {
        Some("all") => None,
        Some(t) => Some(t.parse::<i64>().map_err(|_| bad_query())?),
        None => int("tailLines")?,
    };
    let since_seconds = int("sinceSeconds")?;
    let since_time = get("sinceTime").map(|v| v.parse::<Timestamp>().map_err(|_| bad_query())).transpose()?;
    let limit = int("limitBytes")?;
    if tail.is_some_and(|t| t < 0) || limit.is_some_and(|l| l < 1) || since_seconds.is_some_and(|s| s < 1) {
        return Err(invalid());
    }
    if since_seconds.is_some() && since_time.is_some() {
        return Err(invalid());
    }
    o.tail_lines = tail.map(|t| t as u64);
    o.limit_bytes = limit.map(|l| l as u64);
    o.since = since_time.or_else(|| since_seconds.and_then(|s| now.checked_sub(SignedDuration::from_secs(s)).ok()));
    Ok(o)
}

/// Where a container's log is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLocation {
    /// The file by the kubelet's layout.
    pub path: PathBuf,
    /// The runtime's id of that attempt (without the `containerd://`
    /// scheme), to ask for its log path when the file is not there.
    pub container_id: Option<String>,
    /// Whether the container may still write (follow stops otherwise).
    pub running: bool,
}

fn strip_scheme(id: &str) -> String {
    id.split_once("://").map(|(_, i)| i).unwrap_or(id).to_owned()
}

/// The log file of `container` in `pod`, or the kubelet's refusal.
pub fn locate(pod: &Pod, container: &str, previous: bool, pod_logs_dir: &Path) -> Result<LogLocation, Refusal> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let spec = pod.spec.as_ref();
    let in_spec = spec.is_some_and(|s| {
        s.containers.iter().any(|c| c.name == container)
            || s.init_containers.iter().flatten().any(|c| c.name == container)
            || s.ephemeral_containers.iter().flatten().any(|c| c.name == container)
    });
    if !in_spec {
        return Err((StatusCode::NOT_FOUND, format!("container {container:?} not found in pod {name:?}")));
    }
    let status = pod.status.as_ref();
    let statuses = status.into_iter().flat_map(|s| {
        s.container_statuses
            .iter()
            .flatten()
            .chain(s.init_container_statuses.iter().flatten())
            .chain(s.ephemeral_container_statuses.iter().flatten())
    });
    let found: Option<&ContainerStatus> = statuses.into_iter().find(|s| s.name == container);
    let Some(cs) = found else {
        return Err((StatusCode::BAD_REQUEST, format!("container {container:?} in pod {name:?} is not available")));
    };
    let dir = pod_log_dir(
        pod_logs_dir,
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        &name,
        pod.metadata.uid.as_deref().unwrap_or_default(),
    )
    .join(container);
    let restarts = cs.restart_count.max(0) as u64;
    let state = cs.state.as_ref();
    if previous {
        let last = cs
            .last_state
            .as_ref()
            .and_then(|l| l.terminated.as_ref())
            .filter(|t| t.container_id.as_deref().is_some_and(|id| !id.is_empty()));
        let Some(t) = last else {
            return Err((
                StatusCode::BAD_REQUEST,
                format!("previous terminated container {container:?} in pod {name:?} not found"),
            ));
        };
        return Ok(LogLocation {
            path: dir.join(format!("{}.log", restarts.saturating_sub(1))),
            container_id: t.container_id.as_deref().map(strip_scheme),
            running: false,
        });
    }
    let running = state.and_then(|s| s.running.as_ref()).is_some();
    let terminated = state.and_then(|s| s.terminated.as_ref());
    if !running && terminated.is_none() {
        let why = match state.and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.clone()) {
            Some(r) if r == "ErrImagePull" => "waiting to start: image can't be pulled".to_owned(),
            Some(r) if r == "ImagePullBackOff" => "waiting to start: trying and failing to pull image".to_owned(),
            Some(r) => format!("waiting to start: {r}"),
            None => "waiting to start - no logs yet".to_owned(),
        };
        return Err((StatusCode::BAD_REQUEST, format!("container {container:?} in pod {name:?} is {why}")));
    }
    let id = cs.container_id.clone().or_else(|| terminated.and_then(|t| t.container_id.clone()));
    Ok(LogLocation {
        path: dir.join(format!("{restarts}.log")),
        container_id: id.as_deref().map(strip_scheme),
        running,
    })
}

/// One parsed CRI log line.
#[derive(Debug, PartialEq, Eq)]
pub struct CriLine<'a> {
    pub time: Timestamp,
    pub stream: &'a str,
    pub partial: bool,
    pub content: &'a [u8],
}

/// Parses `<time> <stream> <tag> <content>` (the line without its newline).
pub fn parse_cri_line(line: &[u8]) -> Option<CriLine<'_>> {
    let mut parts = line.splitn(4, |b| *b == b' ');
    let time = std::str::from_utf8(parts.next()?).ok()?.parse::<Timestamp>().ok()?;
    let stream = std::str::from_utf8(parts.next()?).ok()?;
    if stream != "stdout" && stream != "stderr" {
        return None;
    }
    let tag = parts.next()?;
    // Tags may be several, separated by ':'; P marks a partial line.
    let partial = tag.split(|b| *b == b':').any(|t| t == b"P");
    Some(CriLine { time, stream, partial, content: parts.next().unwrap_or_default() })
}

/// The kubelet's timestamp prefix: RFC 3339 with nine fractional digits.
pub fn format_timestamp(t: Timestamp) -> String {
    format!("{}.{:09}Z", t.strftime("%Y-%m-%dT%H:%M:%S"), t.subsec_nanosecond())
}

/// The offset where the last `n` lines of `f` start.
pub fn tail_offset(f: &mut File, n: u64) -> io::Result<u64> {
    let len = f.seek(SeekFrom::End(0))?;
    if n == 0 {
        return Ok(len);
    }
    const CHUNK: u64 = 64 * 1024;
    let mut pos = len;
    let mut newlines = 0u64;
    let mut buf = vec![0u8; CHUNK as usize];
    // The file's final newline ends the last line; it does not start one.
    let mut skip_last = true;
    while pos > 0 {
        let start = pos.saturating_sub(CHUNK);
        let size = (pos - start) as usize;
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(&mut buf[..size])?;
        for i in (0..size).rev() {
            if buf[i] == b'\n' {
                if skip_last && start + i as u64 == len - 1 {
                    skip_last = false;
                    continue;
                }
                newlines += 1;
                if newlines == n {
                    return Ok(start + i as u64 + 1);
                }
            }
        }
        skip_last = false;
        pos = start;
    }
    Ok(0)
}

/// Log output on its way to the client: limitBytes applied, buffered up
/// to [`FLUSH_AT`] bytes, each send bounded by the write timeout.
struct Sink<'a> {
    out: &'a mpsc::Sender<Bytes>,
    remaining: Option<u64>,
    buf: Vec<u8>,
    write_timeout: Duration,
}

const FLUSH_AT: usize = 32 * 1024;

impl Sink<'_> {
    /// False once the reader should stop (limit reached or client gone).
    async fn write(&mut self, b: &[u8]) -> bool {
        let b = match self.remaining {
            Some(0) => return false,
            Some(r) if (b.len() as u64) > r => &b[..r as usize],
            _ => b,
        };
        if let Some(r) = &mut self.remaining {
            *r -= b.len() as u64;
        }
        self.buf.extend_from_slice(b);
        if self.buf.len() >= FLUSH_AT && !self.flush().await {
            return false;
        }
        self.remaining != Some(0)
    }

    /// Sends what is buffered; false when the client is gone or has read
    /// nothing for the write timeout.
    async fn flush(&mut self) -> bool {
        if self.buf.is_empty() {
            return !self.out.is_closed();
        }
        let chunk = Bytes::from(std::mem::take(&mut self.buf));
        matches!(tokio::time::timeout(self.write_timeout, self.out.send(chunk)).await, Ok(Ok(())))
    }
}

/// How often a follower looks for new output, and how often it asks
/// whether the container still runs.
pub const FOLLOW_POLL: Duration = Duration::from_millis(100);
const RUNNING_CHECK: Duration = Duration::from_secs(1);

/// Opens a log file safely (`logs::open`), for the start and after a
/// rotation.
pub type Opener = dyn Fn() -> io::Result<File> + Send + Sync;

/// Streams the log `open` opens into `out`, without holding a thread:
/// reads go through tokio's file I/O and waiting for new output is a
/// timer. Following, it waits for new lines, reopens the file when the
/// runtime rotates it, and ends once `running` says the container stopped
/// and everything written has been sent, or when the client is gone or
/// has read nothing for `write_timeout`.
pub async fn read_logs(
    path: &Path,
    open: &Opener,
    opts: &LogOptions,
    running: &(dyn Fn() -> bool + Send + Sync),
    out: &mpsc::Sender<Bytes>,
    write_timeout: Duration,
) -> io::Result<()> {
    let f = open()?;
    let mut inode = f.metadata()?.ino();
    let tail = opts.tail_lines;
    // The tail walks the file backwards in 64 KiB reads: bounded work, on
    // the blocking pool.
    let f = tokio::task::spawn_blocking(move || -> io::Result<File> {
        let mut f = f;
        let start = match tail {
            Some(n) => tail_offset(&mut f, n)?,
            None => 0,
        };
        f.seek(SeekFrom::Start(start))?;
        Ok(f)
    })
    .await
    .map_err(io::Error::other)??;
    let mut r = tokio::io::BufReader::with_capacity(64 * 1024, tokio::fs::File::from_std(f));
    let mut sink = Sink { out, remaining: opts.limit_bytes, buf: Vec::with_capacity(FLUSH_AT), write_timeout };
    let mut line = Vec::with_capacity(4096);
    let mut last_check = Instant::now();
    let mut stopped = false;
    loop {
        let n = r.read_until(b'\n', &mut line).await?;
        let complete = line.last() == Some(&b'\n');
        if n > 0 && (complete || !opts.follow) {
            let text = if complete { &line[..line.len() - 1] } else { &line[..] };
            if let Some(l) = parse_cri_line(text)
                && opts.since.is_none_or(|s| l.time >= s)
            {
                let mut ok = true;
                if opts.timestamps {
                    ok = sink.write(format!("{} ", format_timestamp(l.time)).as_bytes()).await;
                }
                ok = ok && sink.write(l.content).await;
                if ok && !l.partial {
                    ok = sink.write(b"\n").await;
                }
                if !ok {
                    sink.flush().await;
                    return Ok(());
                }
            }
            line.clear();
            continue;
        }
        // At the end of what is written (a partial line stays buffered).
        if !sink.flush().await || !opts.follow || stopped {
            return Ok(());
        }
        // Rotated: the path now names another file. Finish the old one
        // first (done: we are at its end), then continue with the new.
        if let Ok(m) = tokio::fs::symlink_metadata(path).await
            && m.ino() != inode
            && let Ok(f) = open()
        {
            inode = f.metadata()?.ino();
            r = tokio::io::BufReader::with_capacity(64 * 1024, tokio::fs::File::from_std(f));
            line.clear();
            continue;
        }
        if last_check.elapsed() >= RUNNING_CHECK {
            last_check = Instant::now();
            if !running() {
                // One last pass for what was written before it stopped.
                stopped = true;
                continue;
            }
        }
        tokio::time::sleep(FOLLOW_POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use k8s_openapi::api::core::v1::{
        Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, PodSpec,
        PodStatus,
    };

    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn options_follow_the_kubelet() {
        let now: Timestamp = "2024-05-01T12:00:00Z".parse().unwrap();
        let o =
            parse_options(&q(&[("follow", ""), ("timestamps", "true"), ("tailLines", "5"), ("limitBytes", "10")]), now)
                .unwrap();
        assert_eq!(
            o,
            LogOptions {
                follow: true,
                timestamps: true,
                tail_lines: Some(5),
                limit_bytes: Some(10),
                ..Default::default()
            }
        );
        assert!(!parse_options(&q(&[("follow", "false"), ("previous", "0")]), now).unwrap().follow);
        let o = parse_options(&q(&[("sinceSeconds", "60")]), now).unwrap();
        assert_eq!(o.since, Some("2024-05-01T11:59:00Z".parse().unwrap()));
        let o = parse_options(&q(&[("sinceTime", "2024-05-01T10:00:00Z")]), now).unwrap();
        assert_eq!(o.since, Some("2024-05-01T10:00:00Z".parse().unwrap()));
        assert_eq!(parse_options(&q(&[("tail", "all"), ("tailLines", "3")]), now).unwrap().tail_lines, None);
        assert_eq!(parse_options(&q(&[("tail", "2")]), now).unwrap().tail_lines, Some(2));
        for bad in [("tailLines", "x"), ("sinceTime", "yesterday"), ("limitBytes", "1k")] {
            assert_eq!(parse_options(&q(&[bad]), now).unwrap_err().0, StatusCode::BAD_REQUEST, "{bad:?}");
        }
        for invalid in [
            &[("tailLines", "-1")][..],
            &[("limitBytes", "0")],
            &[("sinceSeconds", "0")],
            &[("sinceSeconds", "5"), ("sinceTime", "2024-05-01T10:00:00Z")],
        ] {
            let e = parse_options(&q(invalid), now).unwrap_err();
            assert_eq!(
                e,
                (StatusCode::UNPROCESSABLE_ENTITY, r#"{"message": "Invalid request."}"#.into()),
                "{invalid:?}"
            );
        }
    }

    fn pod(status: ContainerStatus) -> Pod {
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("web".into()),
                namespace: Some("prod".into()),
                uid: Some("u-1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container { name: "app".into(), ..Default::default() }],
                ..Default::default()
            }),
            status: Some(PodStatus { container_statuses: Some(vec![status]), ..Default::default() }),
        }
    }

    #[test]
    fn locating_current_and_previous_logs() {
        let dir = Path::new("/var/log/pods");
        let running = ContainerStatus {
            name: "app".into(),
            restart_count: 2,
            container_id: Some("containerd://c3".into()),
            state: Some(ContainerState { running: Some(ContainerStateRunning::default()), ..Default::default() }),
            last_state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    container_id: Some("containerd://c2".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let p = pod(running.clone());
        assert_eq!(
            locate(&p, "app", false, dir).unwrap(),
            LogLocation {
                path: "/var/log/pods/prod_web_u-1/app/2.log".into(),
                container_id: Some("c3".into()),
                running: true
            }
        );
        assert_eq!(
            locate(&p, "app", true, dir).unwrap(),
            LogLocation {
                path: "/var/log/pods/prod_web_u-1/app/1.log".into(),
                container_id: Some("c2".into()),
                running: false
            }
        );
        assert_eq!(
            locate(&p, "db", false, dir).unwrap_err(),
            (StatusCode::NOT_FOUND, "container \"db\" not found in pod \"web\"".into())
        );
        let first = pod(ContainerStatus { last_state: None, ..running.clone() });
        assert_eq!(
            locate(&first, "app", true, dir).unwrap_err(),
            (StatusCode::BAD_REQUEST, "previous terminated container \"app\" in pod \"web\" not found".into())
        );
        let waiting = pod(ContainerStatus {
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting { reason: Some("ImagePullBackOff".into()), ..Default::default() }),
                ..Default::default()
            }),
            ..running.clone()
        });
        assert_eq!(
            locate(&waiting, "app", false, dir).unwrap_err().1,
            "container \"app\" in pod \"web\" is waiting to start: trying and failing to pull image"
        );
        let mut no_status = pod(running);
        no_status.status = None;
        assert_eq!(
            locate(&no_status, "app", false, dir).unwrap_err().1,
            "container \"app\" in pod \"web\" is not available"
        );
    }

    #[test]
    fn cri_lines() {
        let l = parse_cri_line(b"2016-10-06T00:17:09.669794202Z stdout F hello world").unwrap();
        assert_eq!((l.stream, l.partial, l.content), ("stdout", false, &b"hello world"[..]));
        assert_eq!(format_timestamp(l.time), "2016-10-06T00:17:09.669794202Z");
        let l = parse_cri_line(b"2016-10-06T00:17:09Z stderr P part").unwrap();
        assert!(l.partial);
        assert_eq!(format_timestamp(l.time), "2016-10-06T00:17:09.000000000Z");
        assert_eq!(parse_cri_line(b"2016-10-06T00:17:09Z stdout F").unwrap().content, b"");
        assert!(parse_cri_line(b"not a log line").is_none());
        assert!(parse_cri_line(b"2016-10-06T00:17:09Z other F x").is_none());
    }

    fn write_log(lines: &[&str]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        for l in lines {
            writeln!(f, "{l}").unwrap();
        }
        f
    }

    fn read(path: &Path, o: &LogOptions) -> String {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let p = path.to_owned();
        let open = move || File::open(&p);
        rt.block_on(async {
            let (tx, mut rx) = mpsc::channel(4096);
            read_logs(path, &open, o, &|| false, &tx, Duration::from_secs(5)).await.unwrap();
            drop(tx);
            let mut out = Vec::new();
            while let Some(b) = rx.recv().await {
                out.extend_from_slice(&b);
            }
            String::from_utf8(out).unwrap()
        })
    }

    #[test]
    fn reading_with_options() {
        let f = write_log(&[
            "2024-05-01T10:00:00.1Z stdout F one",
            "2024-05-01T10:00:01Z stderr P tw",
            "2024-05-01T10:00:01.5Z stderr F o",
            "2024-05-01T10:00:02Z stdout F three",
        ]);
        let o = LogOptions::default();
        assert_eq!(read(f.path(), &o), "one\ntwo\nthree\n");
        assert_eq!(read(f.path(), &LogOptions { tail_lines: Some(1), ..o.clone() }), "three\n");
        assert_eq!(read(f.path(), &LogOptions { tail_lines: Some(2), ..o.clone() }), "o\nthree\n");
        assert_eq!(read(f.path(), &LogOptions { tail_lines: Some(9), ..o.clone() }), "one\ntwo\nthree\n");
        assert_eq!(read(f.path(), &LogOptions { tail_lines: Some(0), ..o.clone() }), "");
        assert_eq!(read(f.path(), &LogOptions { limit_bytes: Some(6), ..o.clone() }), "one\ntw");
        let since = Some("2024-05-01T10:00:01.2Z".parse().unwrap());
        assert_eq!(read(f.path(), &LogOptions { since, ..o.clone() }), "o\nthree\n");
        assert_eq!(
            read(f.path(), &LogOptions { timestamps: true, tail_lines: Some(1), ..o.clone() }),
            "2024-05-01T10:00:02.000000000Z three\n"
        );
    }

    #[test]
    fn tail_across_chunks() {
        let lines: Vec<String> = (0..30_000).map(|i| format!("2024-05-01T10:00:00Z stdout F line {i}")).collect();
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let f = write_log(&refs);
        let got = read(f.path(), &LogOptions { tail_lines: Some(3), ..Default::default() });
        assert_eq!(got, "line 29997\nline 29998\nline 29999\n");
    }

    #[tokio::test]
    async fn following_sees_new_lines_and_rotation_and_stops_with_the_container() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(&path, "2024-05-01T10:00:00Z stdout F first\n").unwrap();
        let running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (tx, mut rx) = mpsc::channel::<Bytes>(64);
        let p = path.clone();
        let r = running.clone();
        let reader = tokio::spawn(async move {
            let q = p.clone();
            let open = move || File::open(&q);
            let still = move || r.load(std::sync::atomic::Ordering::SeqCst);
            let opts = LogOptions { follow: true, ..Default::default() };
            read_logs(&p, &open, &opts, &still, &tx, Duration::from_secs(5)).await
        });
        let mut got = String::new();
        async fn wait_for(rx: &mut mpsc::Receiver<Bytes>, got: &mut String, want: &str) {
            while !got.contains(want) {
                let b = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect(want).expect(want);
                got.push_str(std::str::from_utf8(&b).unwrap());
            }
        }
        wait_for(&mut rx, &mut got, "first\n").await;
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        // A line written in two pieces is sent once it is complete.
        write!(f, "2024-05-01T10:00:01Z stdout F sec").unwrap();
        f.flush().unwrap();
        tokio::time::sleep(FOLLOW_POLL * 3).await;
        writeln!(f, "ond").unwrap();
        wait_for(&mut rx, &mut got, "second\n").await;
        // Rotation: the runtime renames the file and opens a new one.
        std::fs::rename(&path, dir.path().join("0.log.20240501-100002")).unwrap();
        std::fs::write(&path, "2024-05-01T10:00:03Z stdout F third\n").unwrap();
        wait_for(&mut rx, &mut got, "third\n").await;
        running.store(false, std::sync::atomic::Ordering::SeqCst);
        reader.await.unwrap().unwrap();
        assert_eq!(got, "first\nsecond\nthird\n");
    }

    /// A client that reads nothing: the follower gives up after the write
    /// timeout instead of waiting forever.
    #[tokio::test]
    async fn a_client_that_reads_nothing_ends_the_follow() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        let line = format!("2024-05-01T10:00:00Z stdout F {}\n", "x".repeat(1000));
        std::fs::write(&path, line.repeat(200)).unwrap();
        let (tx, _rx) = mpsc::channel::<Bytes>(1);
        let p = path.clone();
        let open = move || File::open(&p);
        let opts = LogOptions { follow: true, ..Default::default() };
        let t0 = Instant::now();
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            read_logs(&path, &open, &opts, &|| true, &tx, Duration::from_millis(300)),
        )
        .await;
        assert!(matches!(r, Ok(Ok(()))), "{r:?}");
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
}
