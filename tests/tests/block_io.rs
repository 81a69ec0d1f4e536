//! Block I/O per container, as cAdvisor reports it: a pod writes and
//! reads 8 MiB with O_DIRECT in an emptyDir on the node's disk, and again
//! on a disk new to the kernel (a loop device made for the test, mounted
//! before the agent starts, given to the pod as a hostPath), and
//! /metrics/cadvisor shows at least that much under its container with
//! each disk's `device` label. On cgroup v1 from Linux 6.9 the kernel
//! counts a disk's I/O per cgroup only once blk-throttle was switched on
//! for it: the test first checks, in a cgroup of its own, that the new
//! disk is not counted, then that the agent switched it on at start
//! without setting a limit (`swiftlet::cm::blkio`). cgroup v2 counts in
//! io.stat by itself.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use swiftlet::cgroups::Version;
use swiftlet_tests::{cri, kubelet::RunningAgent, pki::TestCa, prereq};

const MIB: f64 = 1_048_576.0;
const LOOP_CTL_ADD: libc::c_ulong = 0x4C80;
const LOOP_CTL_REMOVE: libc::c_ulong = 0x4C81;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// `/dev/loop-control` add or remove of loop device `n`.
fn loop_control(request: libc::c_ulong, n: u32) -> std::io::Result<()> {
    let ctl = std::fs::File::open("/dev/loop-control")?;
    // SAFETY: LOOP_CTL_ADD/REMOVE take the device number as an integer
    // argument (no pointer); the descriptor is open for the call.
    let r = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&ctl), request, n as libc::c_ulong) };
    if r < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

/// A loop device with a number never used since boot or since removed (so
/// a request queue the kernel was never told about), an ext4 image
/// attached and mounted; unmounted, detached and removed on drop.
struct FreshDisk {
    n: u32,
    dev: String,
    mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl FreshDisk {
    fn new() -> FreshDisk {
        // The image on disk rather than /tmp, which may be a tmpfs.
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let image = dir.path().join("disk.img");
        std::fs::File::create(&image).unwrap().set_len(64 << 20).unwrap();
        run("mkfs.ext4", &["-q", "-F", image.to_str().unwrap()]);
        let n = (200..1000)
            .find(|n| !Path::new(&format!("/sys/block/loop{n}")).exists() && loop_control(LOOP_CTL_ADD, *n).is_ok())
            .expect("a free loop device number");
        let device = format!("/dev/loop{n}");
        run("losetup", &[&device, image.to_str().unwrap()]);
        let dev = std::fs::read_to_string(format!("/sys/block/loop{n}/dev")).unwrap().trim().to_owned();
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        run("mount", &[&device, mnt.to_str().unwrap()]);
        FreshDisk { n, dev, mnt, _dir: dir }
    }
}

impl Drop for FreshDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
        let _ = Command::new("losetup").args(["-d", &format!("/dev/loop{}", self.n)]).status();
        // The detach completes asynchronously; removal fails while busy.
        for _ in 0..50 {
            if loop_control(LOOP_CTL_REMOVE, self.n).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("warning: loop{} not removed", self.n);
    }
}

/// Whether this kernel keeps v1 blkio statistics only for disks
/// blk-throttle was switched on for (6.9 on).
fn kernel_needs_switching_on() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = release.split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (6, 9)
}

/// The bytes written on `dev` that a cgroup of the test's own in the v1
/// blkio tree counts after an O_DIRECT write of 1 MiB to `dir`.
fn counted_in_a_scratch_cgroup(dev: &str, dir: &Path) -> Option<u64> {
    let cg = PathBuf::from(format!("/sys/fs/cgroup/blkio/swiftlet-test-blkio-{}", std::process::id()));
    std::fs::create_dir(&cg).unwrap();
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec dd if=/dev/zero of={}/control bs=1M count=1 oflag=direct status=none",
        cg.display(),
        dir.display()
    );
    run("sh", &["-c", &script]);
    let stats = std::fs::read_to_string(cg.join("blkio.throttle.io_service_bytes_recursive")).unwrap();
    std::fs::remove_dir(&cg).unwrap();
    stats.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() == 3 && f[0] == dev && f[1] == "Write").then(|| f[2].parse().ok()).flatten()
    })
}

/// `/dev/<name>` of the whole disk a path's filesystem is on, as cAdvisor
/// names it (blkio counts per disk), or None for a filesystem on no disk
/// (a tmpfs).
fn disk_of(path: &Path) -> Option<String> {
    let st = rustix::fs::stat(path).ok()?;
    let (major, minor) = (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev));
    if major == 0 {
        return None;
    }
    let mut sys = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    if sys.join("partition").exists() {
        sys = sys.parent()?.to_owned();
    }
    let uevent = std::fs::read_to_string(sys.join("uevent")).ok()?;
    uevent.lines().find_map(|l| l.strip_prefix("DEVNAME=")).map(|n| format!("/dev/{}", n.trim()))
}

/// A pod writing then reading 8 MiB with O_DIRECT (past the page cache, so
/// the I/O is the container's and not the flusher's) in an emptyDir,
/// which lives under the agent's root dir, and in `fresh`.
fn write_pod(dir: &Path, fresh: &Path) {
    let io = |d: &str| {
        format!("dd if=/dev/zero of={d}/x bs=1M count=8 oflag=direct && dd if={d}/x of=/dev/null bs=1M iflag=direct")
    };
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: dio
  namespace: default
spec:
  containers:
  - name: app
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "{data} && {fresh_io} && sleep 3600"]
    volumeMounts:
    - {{name: data, mountPath: /data}}
    - {{name: fresh, mountPath: /fresh}}
  volumes:
  - name: data
    emptyDir: {{}}
  - name: fresh
    hostPath: {{path: {fresh}, type: Directory}}
"#,
        image = cri::BUSYBOX_IMAGE,
        data = io("/data"),
        fresh_io = io("/fresh"),
        fresh = fresh.display(),
    );
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("dio.yaml"), manifest).unwrap();
}

/// The series of `name` whose labels contain every one of `labels`, as
/// (labels, value), in the text format.
fn series<'a>(text: &'a str, name: &str, labels: &[&str]) -> Vec<(&'a str, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (s, value) = l.rsplit_once(' ')?;
            let (n, rest) = s.split_once('{')?;
            (n == name && labels.iter().all(|x| rest.contains(x))).then_some((rest, value.parse().ok()?))
        })
        .collect()
}

#[test]
fn a_containers_direct_io_is_reported_per_device() {
    prereq::require_root();
    let _ = cri::endpoint();
    let fresh = FreshDisk::new();
    let fs = swiftlet::cgroups::CgroupFs::detect().unwrap();
    let v1 = fs.version() == Version::V1 && fs.root().join("blkio").is_dir();
    if v1 && kernel_needs_switching_on() {
        assert_eq!(
            counted_in_a_scratch_cgroup(&fresh.dev, &fresh.mnt),
            None,
            "the new disk {} is counted before anything switched it on",
            fresh.dev
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    write_pod(&manifests, &fresh.mnt);
    let ca = TestCa::new("block-io-client-ca");
    ca.write(&dir.path().join("ca.crt"));
    let agent = RunningAgent::start(&[
        format!("--pod-manifest-path={}", manifests.display()),
        format!("--client-ca-file={}", dir.path().join("ca.crt").display()),
        "--authorization-mode=AlwaysAllow".into(),
        "--housekeeping-interval=1s".into(),
    ]);
    if v1 {
        let log = agent.log_text();
        let line = log.lines().find(|l| l.contains("block I/O statistics switched on, without a limit"));
        let line = line.unwrap_or_else(|| panic!("no log line at start:\n{log}"));
        assert!(line.contains(&format!("loop{} ({})", fresh.n, fresh.dev)), "{line}");
        // No limit was set: the throttle file of the pods' cgroup lists no rule.
        let kubepods = fs.controller_dir("blkio", &format!("{}/kubepods", agent.cgroup.root));
        let rules = std::fs::read_to_string(kubepods.join("blkio.throttle.read_bps_device")).unwrap();
        assert_eq!(rules.trim(), "", "a limit was set on the pods' cgroup");
    }
    // The emptyDir's disk; none where the root dir is on a tmpfs.
    let root_disk = disk_of(agent.dir.path());
    let fresh_disk = format!("/dev/loop{}", fresh.n);
    let disks: Vec<&str> = root_disk.iter().map(String::as_str).chain([fresh_disk.as_str()]).collect();
    let c = agent.https(Some(ca.client("admin", &[])));
    rt().block_on(async {
        let (_, pod) = c.wait_running("dio").await;
        let pod_label = format!("pod=\"{pod}\"");
        let at_least = |text: &str, name: &str, disk: &str, min: f64| {
            let device = format!("device=\"{disk}\"");
            series(text, name, &["container=\"app\"", pod_label.as_str(), device.as_str()])
                .iter()
                .any(|(_, v)| *v >= min)
        };
        // The housekeeping pass after the container's I/O.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = c.get("/metrics/cadvisor").await.unwrap().text();
            // Bytes, and operations: 8 of 1 MiB at least (a disk may split them).
            let missing: Vec<String> = disks
                .iter()
                .flat_map(|d| {
                    [
                        ("container_fs_writes_bytes_total", 8.0 * MIB),
                        ("container_fs_reads_bytes_total", 8.0 * MIB),
                        ("container_fs_writes_total", 8.0),
                        ("container_fs_reads_total", 8.0),
                    ]
                    .into_iter()
                    .filter(|(name, min)| !at_least(&text, name, d, *min))
                    .map(move |(name, min)| format!("{name}{{device=\"{d}\"}} >= {min}"))
                })
                .collect();
            if missing.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "missing for the container after 60s: {missing:?}; agent log:\n{}\n/metrics/cadvisor:\n{}",
                agent.log_text(),
                text.lines().filter(|l| l.starts_with("container_fs_")).collect::<Vec<_>>().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    drop(agent);
    drop(fresh);
}
