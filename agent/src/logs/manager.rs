//! The container log manager: every 10 s, each running container's CRI log
//! (its path from ContainerStatus) is rotated once it reaches
//! containerLogMaxSize, keeping at most containerLogMaxFiles files; and the
//! files of a container are removed with it ([`ContainerLogManager::clean`],
//! called by container GC before RemoveContainer).

use std::{
    collections::HashMap,
    fs,
    io::{self, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::rotation::{self, Action, COMPRESS_SUFFIX, TMP_SUFFIX};
use crate::{
    config::KubeletConfiguration,
    cri::{CriError, RuntimeService, api},
};

/// The kubelet's logMonitorPeriod.
pub const LOG_MONITOR_PERIOD: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogPolicy {
    /// containerLogMaxSize in bytes (10Mi).
    pub max_size_bytes: u64,
    /// containerLogMaxFiles (5), at least 2.
    pub max_files: u32,
}

impl Default for LogPolicy {
    fn default() -> Self {
        LogPolicy { max_size_bytes: 10 << 20, max_files: 5 }
    }
}

impl LogPolicy {
    pub fn from_kubelet(k: &KubeletConfiguration) -> LogPolicy {
        LogPolicy {
            max_size_bytes: k.container_log_max_size.value().max(0) as u64,
            max_files: k.container_log_max_files,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{0}")]
    Cri(#[from] CriError),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("containerLogMaxFiles must be at least 2, not {0}")]
    MaxFiles(u32),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> LogError + '_ {
    move |source| LogError::Io { path: path.to_owned(), source }
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RotationReport {
    /// Containers whose live log was rotated.
    pub rotated: Vec<String>,
    pub compressed: usize,
    pub removed: usize,
    /// Containers whose rotation failed (logged).
    pub failed: usize,
}

/// The kubelet's rotated-log timestamp (`20060102-150405`), local time.
/// localtime_r stays libc's: local time is the C library's time zone
/// rules (TZ, /etc/localtime), which rustix, a system-call layer, does not
/// provide.
pub fn local_stamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0) as libc::time_t;
    // SAFETY: a zeroed tm is a valid out-parameter; localtime_r is the
    // thread-safe variant.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to valid locals; localtime_r keeps neither.
    if unsafe { libc::localtime_r(&secs, &mut tm) }.is_null() {
        return "19700101-000000".into();
    }
    format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

type Clock = dyn Fn() -> String + Send + Sync;

/// Construct once and run (the container GC gets a clone for `clean`):
///
/// ```text
/// let logs = Arc::new(ContainerLogManager::new(cri.clone(), LogPolicy::from_kubelet(&config.kubelet))?);
/// tokio::spawn(logs.clone().run(shutdown.clone()));
/// ```
pub struct ContainerLogManager {
    runtime: Arc<dyn RuntimeService>,
    policy: LogPolicy,
    /// Rotation and cleaning never interleave (as the kubelet's mutex).
    busy: tokio::sync::Mutex<()>,
    clock: Box<Clock>,
    /// Each running container's log path. The runtime fixes it at
    /// CreateContainer, so one ContainerStatus per container is enough,
    /// not one per container every 10 s.
    log_paths: parking_lot::Mutex<HashMap<String, PathBuf>>,
}

/// The files of the log at `log`: `<log>.*` in its directory.
fn rotated_files(log: &Path) -> io::Result<Vec<PathBuf>> {
    let (Some(dir), Some(name)) = (log.parent(), log.file_name()) else { return Ok(vec![]) };
    let name = name.to_string_lossy();
    let mut out = vec![];
    for e in fs::read_dir(dir)? {
        let e = e?;
        if rotation::is_rotated_of(&name, &e.file_name().to_string_lossy()) {
            out.push(e.path());
        }
    }
    Ok(out)
}

fn compress(path: &Path) -> Result<(), LogError> {
    let name = path.to_string_lossy();
    let tmp = PathBuf::from(format!("{name}{TMP_SUFFIX}"));
    let gz = PathBuf::from(format!("{name}{COMPRESS_SUFFIX}"));
    // Never through a symlink a pod planted (see `open.rs`): the input is
    // opened with O_NOFOLLOW and must be root's, and the output is created
    // with O_EXCL (a leftover or planted name is removed first, and one
    // planted again in between makes the create fail, not write through).
    let mut input = super::open::open_nofollow(path)
        .and_then(|f| super::open::check_owner(&f, path).map(|()| f))
        .map_err(io_err(path))?;
    remove(&tmp)?;
    let out = fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(&tmp).map_err(io_err(&tmp))?;
    let mut enc = flate2::write::GzEncoder::new(io::BufWriter::new(out), flate2::Compression::default());
    io::copy(&mut input, &mut enc).map_err(io_err(&tmp))?;
    let mut w = enc.finish().map_err(io_err(&tmp))?;
    w.flush().map_err(io_err(&tmp))?;
    fs::rename(&tmp, &gz).map_err(io_err(&gz))?;
    fs::remove_file(path).map_err(io_err(path))
}

fn remove(path: &Path) -> Result<(), LogError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(path)(e)),
        _ => Ok(()),
    }
}

impl ContainerLogManager {
    pub fn new(runtime: Arc<dyn RuntimeService>, policy: LogPolicy) -> Result<ContainerLogManager, LogError> {
        if policy.max_files < 2 {
            return Err(LogError::MaxFiles(policy.max_files));
        }
        Ok(ContainerLogManager {
            runtime,
            policy,
            busy: tokio::sync::Mutex::new(()),
            clock: Box::new(|| local_stamp(SystemTime::now())),
            log_paths: parking_lot::Mutex::new(HashMap::new()),
        })
    }

    /// Replaces the timestamp source (tests).
    pub fn with_clock(mut self, clock: impl Fn() -> String + Send + Sync + 'static) -> ContainerLogManager {
        self.clock = Box::new(clock);
        self
    }

    pub fn policy(&self) -> LogPolicy {
        self.policy
    }

    /// One pass over the running containers.
    pub async fn rotate_logs(&self) -> Result<RotationReport, CriError> {
        let _busy = self.busy.lock().await;
        let running = api::ContainerFilter {
            state: Some(api::ContainerStateValue { state: api::ContainerState::ContainerRunning as i32 }),
            ..Default::default()
        };
        let containers = self.runtime.list_containers(Some(running)).await?;
        self.log_paths.lock().retain(|id, _| containers.iter().any(|c| &c.id == id));
        let mut report = RotationReport::default();
        for c in containers {
            if let Err(e) = self.rotate_container(&c.id, &mut report).await {
                report.failed += 1;
                warn!(container = c.id, "failed to rotate the container's log: {e}");
            }
        }
        Ok(report)
    }

    /// The container's log path (empty when it has none), asked of the
    /// runtime once; `None` when the container is gone.
    async fn log_path(&self, id: &str) -> Result<Option<PathBuf>, LogError> {
        if let Some(p) = self.log_paths.lock().get(id) {
            return Ok(Some(p.clone()));
        }
        let status = match self.runtime.container_status(id).await {
            Ok(s) => s,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let path = PathBuf::from(&status.log_path);
        self.log_paths.lock().insert(id.to_owned(), path.clone());
        Ok(Some(path))
    }

    async fn rotate_container(&self, id: &str, report: &mut RotationReport) -> Result<(), LogError> {
        // Gone since the list, or without a log: nothing to rotate.
        let Some(log) = self.log_path(id).await?.filter(|p| !p.as_os_str().is_empty()) else {
            return Ok(());
        };
        let size = match fs::metadata(&log) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // A rotation whose reopen failed lost the live file: ask the
                // runtime to make it again.
                self.runtime.reopen_container_log(id).await?;
                fs::metadata(&log).map_err(io_err(&log))?.len()
            }
            Err(e) => return Err(io_err(&log)(e)),
        };
        if size < self.policy.max_size_bytes {
            return Ok(());
        }
        let files = rotated_files(&log).map_err(io_err(&log))?;
        let actions = rotation::plan(&log, &files, self.policy.max_files, &(self.clock)());
        if actions.is_empty() {
            debug!(container = id, "rotated name taken (two rotations within a second); rotating next round");
            return Ok(());
        }
        // Compression reads and writes whole files: off the async threads.
        let file_actions: Vec<Action> = actions.iter().filter(|a| !matches!(a, Action::Rotate(_))).cloned().collect();
        let (compressed, removed) = tokio::task::spawn_blocking(move || -> Result<(usize, usize), LogError> {
            let (mut c, mut r) = (0, 0);
            for a in file_actions {
                match a {
                    Action::Remove(p) => {
                        remove(&p)?;
                        r += 1;
                    }
                    Action::Compress(p) => {
                        compress(&p)?;
                        c += 1;
                    }
                    Action::Rotate(_) => {}
                }
            }
            Ok((c, r))
        })
        .await
        .map_err(|e| LogError::Io { path: log.clone(), source: io::Error::other(e) })??;
        report.compressed += compressed;
        report.removed += removed;
        let Some(Action::Rotate(to)) = actions.into_iter().find(|a| matches!(a, Action::Rotate(_))) else {
            return Ok(());
        };
        fs::rename(&log, &to).map_err(io_err(&to))?;
        if let Err(e) = self.runtime.reopen_container_log(id).await {
            // Put the log back so the next round retries; the runtime still
            // writes to the renamed file's inode, so nothing is lost.
            if let Err(back) = fs::rename(&to, &log) {
                warn!(container = id, "cannot rename {} back to {}: {back}", to.display(), log.display());
            }
            return Err(e.into());
        }
        info!(container = id, log = %log.display(), size, "rotated container log");
        report.rotated.push(id.to_owned());
        Ok(())
    }

    /// Removes every log file of container `id` (`<log path>*`): call it
    /// before RemoveContainer, while the runtime still knows the path.
    pub async fn clean(&self, id: &str) -> Result<usize, LogError> {
        let _busy = self.busy.lock().await;
        self.log_paths.lock().remove(id);
        let status = self.runtime.container_status(id).await?;
        if status.log_path.is_empty() {
            return Ok(0);
        }
        let log = PathBuf::from(&status.log_path);
        let (Some(dir), Some(name)) = (log.parent(), log.file_name()) else { return Ok(0) };
        let name = name.to_string_lossy().into_owned();
        let entries = match fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io_err(dir)(e)),
        };
        let mut n = 0;
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&name) {
                remove(&e.path())?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Rotates every [`LOG_MONITOR_PERIOD`] until `shutdown` is cancelled.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        self.run_every(LOG_MONITOR_PERIOD, shutdown).await
    }

    /// [`ContainerLogManager::run`] with another period (tests).
    pub async fn run_every(self: Arc<Self>, period: Duration, shutdown: CancellationToken) {
        let mut ticks = crate::flowcontrol::Periodic::new(period, shutdown);
        while ticks.next().await {
            if let Err(e) = self.rotate_logs().await {
                warn!("container log rotation: cannot list containers: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::Read,
        sync::atomic::{AtomicU32, Ordering},
    };

    use super::*;
    use crate::cri::{
        ImageService as _,
        fake::{FakeRuntime, Fault, Method},
    };

    struct Setup {
        rt: Arc<FakeRuntime>,
        dir: tempfile::TempDir,
        id: String,
        log: PathBuf,
    }

    async fn setup() -> Setup {
        let rt = Arc::new(FakeRuntime::new());
        rt.add_image("busybox", 1);
        let dir = tempfile::tempdir().unwrap();
        let pod_dir = dir.path().join("ns_web_u1");
        fs::create_dir_all(pod_dir.join("app")).unwrap();
        let sb_cfg = api::PodSandboxConfig { log_directory: pod_dir.display().to_string(), ..Default::default() };
        let sb = rt.run_pod_sandbox(sb_cfg.clone(), "").await.unwrap();
        let cfg = api::ContainerConfig {
            metadata: Some(api::ContainerMetadata { name: "app".into(), attempt: 0 }),
            image: Some(api::ImageSpec { image: "busybox".into(), ..Default::default() }),
            log_path: "app/0.log".into(),
            ..Default::default()
        };
        let id = rt.create_container(&sb, cfg, sb_cfg).await.unwrap();
        rt.start_container(&id).await.unwrap();
        let log = pod_dir.join("app/0.log");
        assert!(log.exists(), "the runtime opens the log at start");
        assert!(rt.has_image("busybox") && rt.list_images().await.is_ok());
        Setup { rt, dir, id, log }
    }

    fn write(log: &Path, bytes: usize, fill: u8) {
        let mut f = fs::OpenOptions::new().append(true).open(log).unwrap();
        f.write_all(&vec![fill; bytes]).unwrap();
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        v.sort();
        v
    }

    fn counter_clock() -> impl Fn() -> String + Send + Sync {
        let n = AtomicU32::new(0);
        move || format!("20240101-{:06}", n.fetch_add(1, Ordering::SeqCst))
    }

    #[tokio::test]
    async fn rotates_compresses_and_caps() {
        let s = setup().await;
        let policy = LogPolicy { max_size_bytes: 1000, max_files: 4 };
        let m = ContainerLogManager::new(s.rt.clone(), policy).unwrap().with_clock(counter_clock());
        write(&s.log, 999, b'a');
        assert!(m.rotate_logs().await.unwrap().rotated.is_empty(), "under the limit");
        for round in 0..5u8 {
            write(&s.log, 1, b'a' + round);
            let r = m.rotate_logs().await.unwrap();
            assert_eq!(r.rotated, vec![s.id.clone()], "round {round}");
            write(&s.log, 999, b'b' + round);
        }
        let app = s.log.parent().unwrap();
        // At most 4 files: the live log, the newest rotated (plain) and two
        // older ones (compressed).
        assert_eq!(
            listing(app),
            ["0.log", "0.log.20240101-000002.gz", "0.log.20240101-000003.gz", "0.log.20240101-000004"]
        );
        assert_eq!(fs::metadata(&s.log).unwrap().len(), 999, "written after the reopen");
        let mut gz = flate2::read::GzDecoder::new(fs::File::open(app.join("0.log.20240101-000003.gz")).unwrap());
        let mut text = vec![];
        gz.read_to_end(&mut text).unwrap();
        assert_eq!(text.len(), 1000);
        assert_eq!(s.rt.count(Method::ReopenContainerLog), 5);
    }

    #[tokio::test]
    async fn a_failed_reopen_puts_the_log_back() {
        let s = setup().await;
        let m = ContainerLogManager::new(s.rt.clone(), LogPolicy { max_size_bytes: 10, max_files: 5 })
            .unwrap()
            .with_clock(counter_clock());
        write(&s.log, 20, b'x');
        s.rt.fail(Fault::new(Method::ReopenContainerLog, tonic::Code::Unknown, "boom").once());
        let r = m.rotate_logs().await.unwrap();
        assert_eq!((r.rotated.len(), r.failed), (0, 1));
        assert_eq!(listing(s.log.parent().unwrap()), ["0.log"]);
        assert_eq!(fs::metadata(&s.log).unwrap().len(), 20);
        let r = m.rotate_logs().await.unwrap();
        assert_eq!(r.rotated.len(), 1);
    }

    #[tokio::test]
    async fn a_lost_live_log_is_reopened() {
        let s = setup().await;
        let m = ContainerLogManager::new(s.rt.clone(), LogPolicy { max_size_bytes: 10, max_files: 5 }).unwrap();
        fs::remove_file(&s.log).unwrap();
        m.rotate_logs().await.unwrap();
        assert!(s.log.exists());
    }

    #[tokio::test]
    async fn the_log_path_is_asked_once_per_container() {
        let s = setup().await;
        let m = ContainerLogManager::new(s.rt.clone(), LogPolicy { max_size_bytes: 10, max_files: 5 })
            .unwrap()
            .with_clock(counter_clock());
        for round in 0..3 {
            write(&s.log, 20, b'x');
            assert_eq!(m.rotate_logs().await.unwrap().rotated, vec![s.id.clone()], "round {round}");
        }
        assert_eq!(s.rt.count(Method::ContainerStatus), 1);
        // A container that stops running is forgotten, and asked again
        // should an id come back.
        s.rt.stop_container(&s.id, Duration::ZERO).await.unwrap();
        m.rotate_logs().await.unwrap();
        assert!(m.log_paths.lock().is_empty());
    }

    #[tokio::test]
    async fn clean_removes_every_file_of_the_container() {
        let s = setup().await;
        let app = s.log.parent().unwrap().to_owned();
        fs::write(app.join("0.log.20240101-000001.gz"), b"x").unwrap();
        fs::write(app.join("0.log.20240101-000002"), b"x").unwrap();
        fs::write(app.join("1.log"), b"other attempt").unwrap();
        let m = ContainerLogManager::new(s.rt.clone(), LogPolicy::default()).unwrap();
        assert_eq!(m.clean(&s.id).await.unwrap(), 3);
        assert_eq!(listing(&app), ["1.log"]);
        drop(s.dir);
    }

    #[test]
    fn bad_policy_and_stamp() {
        let rt = Arc::new(FakeRuntime::new());
        assert!(matches!(
            ContainerLogManager::new(rt, LogPolicy { max_size_bytes: 1, max_files: 1 }),
            Err(LogError::MaxFiles(1))
        ));
        let s = local_stamp(SystemTime::now());
        assert_eq!(s.len(), 15);
        assert_eq!(&s[8..9], "-");
        assert!(s.starts_with("20"));
    }
}
