//! The static pod source: every file in `staticPodPath` is one pod.
//!
//! It reacts to inotify events at once (debounced briefly, since editors
//! write in several steps) and rescans every `fileCheckFrequency` as a
//! safety net. Files whose names start with a dot are ignored (editor swap
//! files), as the kubelet does. A bad file is logged once per content with
//! the file, field and value, counted in a metric, and does not affect the
//! other pods; if it replaced a good manifest, the pod that file last
//! described keeps running until the file is fixed or removed, so a typo
//! never takes a running pod down.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;
use prometheus_client::metrics::counter::Counter;
use tokio::io::unix::AsyncFd;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    manifest::{self, ManifestError},
    source::{PodSink, PodSnapshot, SourceKind},
};

/// How long to wait for more events after one arrives.
const DEBOUNCE: Duration = Duration::from_millis(100);

pub struct FileSource {
    dir: PathBuf,
    node_name: String,
    check_frequency: Duration,
    sink: Arc<dyn PodSink>,
    errors: Counter,
}

/// What one scan found, per file.
#[derive(Default)]
struct ScanState {
    /// The last good pod of each file.
    good: BTreeMap<PathBuf, Pod>,
    /// The error last logged per file, so it is logged once.
    logged: HashMap<PathBuf, String>,
    sent: Option<Vec<Pod>>,
    /// Each file's identity when it was last read: the periodic rescan
    /// parses only files that changed since.
    stamps: HashMap<PathBuf, FileStamp>,
}

/// What changes when a file is replaced or written: inode, size and both
/// times (to the nanosecond).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// How old a file's last change must be before its stamp stands for its
/// content.
const STAMP_SETTLE: Duration = Duration::from_secs(2);

impl FileStamp {
    fn settled(&self, now: std::time::SystemTime) -> bool {
        let changed = self.mtime.max(self.ctime);
        let Ok(now) = now.duration_since(std::time::UNIX_EPOCH) else { return false };
        (now.as_secs() as i64, i64::from(now.subsec_nanos())) >= (changed.0 + STAMP_SETTLE.as_secs() as i64, changed.1)
    }

    fn of(m: &std::fs::Metadata) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        FileStamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

impl FileSource {
    pub fn new(
        dir: PathBuf,
        node_name: String,
        check_frequency: Duration,
        sink: Arc<dyn PodSink>,
        errors: Counter,
    ) -> FileSource {
        FileSource { dir, node_name, check_frequency, sink, errors }
    }

    /// Scans, then watches, until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut state = ScanState::default();
        let mut watcher = None;
        let mut tick = tokio::time::interval(self.check_frequency.max(Duration::from_secs(1)));
        loop {
            if watcher.is_none() {
                watcher = match Inotify::watch(&self.dir) {
                    Ok(w) => Some(w),
                    Err(e) => {
                        debug!(dir = %self.dir.display(), "cannot watch the static pod directory (rescanning every {:?}): {e}", self.check_frequency);
                        None
                    }
                };
            }
            self.scan(&mut state);
            tokio::select! {
                r = async { match &mut watcher { Some(w) => w.wait().await, None => std::future::pending().await } } => {
                    if let Err(e) = r {
                        debug!("inotify: {e}");
                        watcher = None;
                    }
                    tokio::time::sleep(DEBOUNCE).await;
                    if let Some(w) = &mut watcher {
                        w.drain();
                    }
                }
                _ = tick.tick() => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }

    fn scan(&self, state: &mut ScanState) {
        let files = match manifest_files(&self.dir) {
            Ok(f) => f,
            Err(e) => {
                // As the kubelet: a missing directory is not an error, just
                // no static pods (yet).
                if state.logged.insert(self.dir.clone(), e.to_string()).is_none() {
                    info!(dir = %self.dir.display(), "no static pods: {e}");
                }
                Vec::new()
            }
        };
        if !files.is_empty() {
            state.logged.remove(&self.dir);
        }
        let present: HashSet<&PathBuf> = files.iter().map(|(p, _)| p).collect();
        let before = state.good.len() + state.logged.len();
        state.good.retain(|f, _| present.contains(f));
        state.logged.retain(|f, _| present.contains(f) || f == &self.dir);
        state.stamps.retain(|f, _| present.contains(f));
        let mut changed = state.good.len() + state.logged.len() != before;
        for (file, stamp) in &files {
            let known = state.good.contains_key(file) || state.logged.contains_key(file);
            if known && state.stamps.get(file) == Some(stamp) {
                continue;
            }
            changed = true;
            // As git's racy-clean rule: a file written within the last
            // moments may be written again within the same timestamp tick
            // (coarse on older kernels), so its stamp is not trusted yet.
            if stamp.settled(std::time::SystemTime::now()) {
                state.stamps.insert(file.clone(), *stamp);
            } else {
                state.stamps.remove(file);
            }
            match manifest::load(file, &self.node_name) {
                Ok(pod) => {
                    state.logged.remove(file);
                    state.good.insert(file.clone(), pod);
                }
                Err(e) => self.bad_file(state, file, e),
            }
        }
        if !changed && state.sent.is_some() {
            return;
        }
        let pods: Vec<Pod> = state.good.values().cloned().collect();
        if state.sent.as_ref() != Some(&pods) {
            debug!(count = pods.len(), "static pods changed");
            self.sink.set(PodSnapshot { source: SourceKind::File, pods: pods.clone() });
            state.sent = Some(pods);
        }
    }

    fn bad_file(&self, state: &mut ScanState, file: &Path, e: ManifestError) {
        let text = e.to_string();
        if state.logged.get(file) == Some(&text) {
            return;
        }
        self.errors.inc();
        if state.good.contains_key(file) {
            warn!("static pod manifest rejected, the pod it described keeps running: {text}");
        } else {
            warn!("static pod manifest rejected: {text}");
        }
        state.logged.insert(file.to_owned(), text);
    }
}

/// Regular files in `dir` (following symlinks), dotfiles excluded, sorted,
/// with their stamps.
fn manifest_files(dir: &Path) -> std::io::Result<Vec<(PathBuf, FileStamp)>> {
    let mut files = vec![];
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => files.push((path, FileStamp::of(&m))),
            _ => {}
        }
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(files)
}

/// An inotify watch on one directory.
struct Inotify {
    fd: AsyncFd<inotify::Inotify>,
}

impl Inotify {
    fn watch(dir: &Path) -> std::io::Result<Inotify> {
        use inotify::WatchMask;
        let inotify = inotify::Inotify::init()?;
        let mask = WatchMask::CREATE
            | WatchMask::DELETE
            | WatchMask::MODIFY
            | WatchMask::CLOSE_WRITE
            | WatchMask::MOVED_FROM
            | WatchMask::MOVED_TO
            | WatchMask::ATTRIB
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF;
        inotify.watches().add(dir, mask)?;
        // SAFETY: the Inotify owns its descriptor and keeps it open, the
        // same one, until it is dropped with the AsyncFd.
        let fd = unsafe { AsyncFd::register_with_interest(inotify, tokio::io::Interest::READABLE) }
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(Inotify { fd })
    }

    /// Waits for at least one event.
    async fn wait(&mut self) -> std::io::Result<()> {
        loop {
            let mut guard = self.fd.readable_mut().await?;
            if drain_events(guard.get_inner_mut()) {
                return Ok(());
            }
            guard.clear_ready();
        }
    }

    /// Reads every pending event; true if there was any. A watched
    /// directory that was removed ends the watch (reported as an error by
    /// the next wait once the descriptor has nothing more to give).
    fn drain(&mut self) -> bool {
        drain_events(self.fd.get_mut())
    }
}

/// Reads events until none is pending; true if there was any.
fn drain_events(inotify: &mut inotify::Inotify) -> bool {
    let mut buf = [0u8; 4096];
    let mut any = false;
    while inotify.read_events(&mut buf).is_ok() {
        any = true;
    }
    any
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[derive(Default)]
    struct Collect(Mutex<Vec<PodSnapshot>>);

    impl PodSink for Collect {
        fn set(&self, snapshot: PodSnapshot) {
            self.0.lock().unwrap().push(snapshot);
        }
    }

    impl Collect {
        fn names(&self) -> Vec<Vec<String>> {
            self.0
                .lock()
                .unwrap()
                .iter()
                .map(|s| s.pods.iter().map(|p| p.metadata.name.clone().unwrap_or_default()).collect())
                .collect()
        }
    }

    fn manifest(name: &str, image: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers:\n  - {{name: c, image: {image}}}\n"
        )
    }

    async fn wait_for(sink: &Collect, want: usize) {
        for _ in 0..100 {
            if sink.0.lock().unwrap().len() >= want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("expected {want} snapshots, got {:?}", sink.names());
    }

    #[tokio::test]
    async fn inotify_drives_snapshots_and_bad_files_do_not_take_pods_down() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), manifest("a", "busybox")).unwrap();
        std::fs::write(dir.path().join(".a.yaml.swp"), "garbage").unwrap();
        let sink = Arc::new(Collect::default());
        let errors = Counter::default();
        // A rescan period far beyond the test: only inotify can deliver.
        let src =
            FileSource::new(dir.path().into(), "n".into(), Duration::from_secs(3600), sink.clone(), errors.clone());
        let stop = CancellationToken::new();
        let shutdown = stop.clone();
        let task = tokio::spawn(src.run(shutdown));
        wait_for(&sink, 1).await;
        assert_eq!(sink.names(), vec![vec!["a-n"]]);

        std::fs::write(dir.path().join("b.json"), manifest("b", "busybox")).unwrap();
        wait_for(&sink, 2).await;
        assert_eq!(sink.names()[1], vec!["a-n", "b-n"]);

        // Breaking a.yaml keeps its last good pod; the error is counted once.
        std::fs::write(
            dir.path().join("a.yaml"),
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: []}\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("c.yaml"), manifest("c", "busybox")).unwrap();
        wait_for(&sink, 3).await;
        assert_eq!(sink.names()[2], vec!["a-n", "b-n", "c-n"]);
        assert_eq!(errors.get(), 1);

        // Editing a file replaces its pod (new uid); deleting one removes it.
        let before = sink.0.lock().unwrap()[2].pods[0].metadata.uid.clone();
        std::fs::write(dir.path().join("a.yaml"), manifest("a", "busybox:1.35")).unwrap();
        wait_for(&sink, 4).await;
        let after = sink.0.lock().unwrap()[3].pods[0].metadata.uid.clone();
        assert_ne!(before, after);
        std::fs::remove_file(dir.path().join("b.json")).unwrap();
        wait_for(&sink, 5).await;
        assert_eq!(sink.names()[4], vec!["a-n", "c-n"]);

        stop.cancel();
        task.await.unwrap();
        assert_eq!(errors.get(), 1);
    }

    #[test]
    fn a_rescan_reads_only_changed_files_and_sees_a_same_size_edit() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.yaml");
        std::fs::write(&file, manifest("a", "busybox")).unwrap();
        let sink = Arc::new(Collect::default());
        let src =
            FileSource::new(dir.path().into(), "n".into(), Duration::from_secs(1), sink.clone(), Counter::default());
        let mut state = ScanState::default();
        src.scan(&mut state);
        // Just written: not trusted yet, so read again next time.
        assert!(!state.stamps.contains_key(&file));
        let old = std::time::SystemTime::now() - Duration::from_secs(60);
        std::fs::File::options().write(true).open(&file).unwrap().set_modified(old).unwrap();
        src.scan(&mut state);
        // ctime moved with the new mtime; once both are old, the stamp holds.
        let stamp = FileStamp::of(&std::fs::metadata(&file).unwrap());
        assert!(stamp.settled(std::time::SystemTime::now() + Duration::from_secs(3)));
        assert!(!stamp.settled(std::time::SystemTime::now()));
        assert_eq!(sink.0.lock().unwrap().len(), 1, "an unchanged pod sends nothing");

        // Same length, new content, written at once: read at the next scan.
        std::fs::write(&file, manifest("a", "busyboy")).unwrap();
        src.scan(&mut state);
        let snapshots = sink.0.lock().unwrap();
        assert_eq!(snapshots.len(), 2);
        let image = snapshots[1].pods[0].spec.as_ref().unwrap().containers[0].image.clone();
        assert_eq!(image.as_deref(), Some("busyboy"));
    }

    #[tokio::test]
    async fn a_missing_directory_means_no_pods_until_it_appears() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("manifests");
        let sink = Arc::new(Collect::default());
        let src = FileSource::new(dir.clone(), "n".into(), Duration::from_secs(1), sink.clone(), Counter::default());
        let stop = CancellationToken::new();
        let shutdown = stop.clone();
        let task = tokio::spawn(src.run(shutdown));
        wait_for(&sink, 1).await;
        assert_eq!(sink.names(), vec![Vec::<String>::new()]);
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("a.yaml"), manifest("a", "busybox")).unwrap();
        wait_for(&sink, 2).await;
        assert_eq!(sink.names()[1], vec!["a-n"]);
        stop.cancel();
        task.await.unwrap();
    }
}
