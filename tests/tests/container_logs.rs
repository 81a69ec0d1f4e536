//! Container log rotation on the real containerd: a busybox container
//! writing numbered lines fast; its CRI log is rotated past the size
//! limit, older rotated files are gzipped, their number is capped, and
//! after each ReopenContainerLog the container keeps writing to the live
//! file with no line lost or repeated across the files. Needs root.

use std::{
    fs,
    io::Read,
    path::Path,
    time::{Duration, Instant},
};

use swiftlet::{
    cri::RuntimeService,
    logs::{ContainerLogManager, LogPolicy},
};
use swiftlet_tests::{
    cgroup::TestCgroup,
    sandbox::{PodOptions, TestPod, client},
};

/// The numbers of `line <n> ...` entries in CRI log text
/// (`<timestamp> stdout F line <n> ...`).
fn line_numbers(text: &str) -> Vec<u64> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(4, ' ');
            let (_ts, stream, tag, msg) = (f.next()?, f.next()?, f.next()?, f.next()?);
            assert_eq!((stream, tag), ("stdout", "F"), "unexpected CRI log line {l:?}");
            msg.strip_prefix("line ")?.split(' ').next()?.parse().ok()
        })
        .collect()
}

fn read(path: &Path) -> String {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if path.extension().is_some_and(|e| e == "gz") {
        let mut s = String::new();
        flate2::read::GzDecoder::new(bytes.as_slice())
            .read_to_string(&mut s)
            .unwrap_or_else(|e| panic!("{} is not gzip: {e}", path.display()));
        s
    } else {
        String::from_utf8(bytes).unwrap()
    }
}

#[tokio::test]
async fn a_busy_containers_log_is_rotated_compressed_and_capped() {
    let cri = client().await;
    let tc = TestCgroup::new();
    let logs_root = tempfile::tempdir().unwrap();
    let pod = TestPod::start(
        cri.clone(),
        PodOptions { name: "logs", logs_root: logs_root.path(), cgroup: &tc, foreign: false },
    )
    .await;
    // ~450-byte lines, as fast as sh goes with a 100 µs pause: even on a
    // busy machine far more than the 16 KiB limit per rotation round.
    let script = "pad=$(printf '%0400d' 0); i=0; while true; do echo \"line $i $pad\"; i=$((i+1)); usleep 100; done";
    let id = pod.container("writer", 0, script, true).await;
    let dir = pod.log_dir.join("writer");
    let live = dir.join("0.log");

    let policy = LogPolicy { max_size_bytes: 16 << 10, max_files: 4 };
    let manager = ContainerLogManager::new(cri.clone(), policy).unwrap();
    let mut rotations = 0;
    let mut compressed = 0;
    let deadline = Instant::now() + Duration::from_secs(8);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let r = manager.rotate_logs().await.unwrap();
        assert_eq!(r.failed, 0, "{r:?}");
        rotations += r.rotated.iter().filter(|c| **c == id).count();
        compressed += r.compressed;
        // Never more than containerLogMaxFiles files.
        let n = fs::read_dir(&dir).unwrap().count();
        assert!(n <= 4, "{n} files in {}", dir.display());
    }
    // Rotated names carry a one-second timestamp, so at most one rotation
    // per second.
    assert!(rotations >= 4, "only {rotations} rotations in 8 s");
    assert!(compressed >= 3, "only {compressed} files compressed");

    let mut files: Vec<_> = fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let names: Vec<String> = files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(files.len(), 4, "{names:?}");
    assert_eq!(names[0], "0.log");
    let gz: Vec<_> = names.iter().filter(|n| n.ends_with(".gz")).collect();
    assert_eq!(gz.len(), 2, "two compressed: {names:?}");
    assert!(!names[3].ends_with(".gz"), "the newest rotated file stays plain: {names:?}");

    // Oldest rotated first, then the live log: one unbroken run of lines,
    // so the runtime kept writing to the new live file after each reopen
    // and nothing was lost or duplicated.
    let mut all = vec![];
    for f in files[1..].iter().chain(std::iter::once(&live)) {
        let numbers = line_numbers(&read(f));
        assert!(!numbers.is_empty(), "{} has no lines", f.display());
        all.push((f.clone(), numbers));
    }
    let mut expected = all[0].1[0];
    for (f, numbers) in &all {
        for n in numbers {
            assert_eq!(*n, expected, "{}: line {n}, expected {expected}", f.display());
            expected += 1;
        }
    }
    let before = fs::metadata(&live).unwrap().len();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(fs::metadata(&live).unwrap().len() > before, "the container still writes to the live log");

    // Cleaning removes every file of the container.
    cri.stop_container(&id, Duration::ZERO).await.unwrap();
    assert_eq!(manager.clean(&id).await.unwrap(), 4);
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
    drop(pod);
    drop(tc);
}
