//! A containerd of a test's own, for tests that stop and restart the
//! runtime without disturbing the one every other test shares.
//!
//! It is made from the shared one's configuration (`cargo xtask test` gives
//! its path in `SWIFTLET_TEST_CONTAINERD_CONFIG`) with root, state and
//! socket moved to directories named after this process, and gets the same
//! locally built images. On drop it stops containerd (by the PID it
//! started), the shims that containerd started, and unmounts what is left
//! under its directories.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

pub struct TestContainerd {
    child: Option<Child>,
    config: PathBuf,
    /// Where its root (images, snapshots, metadata) lives.
    pub root: PathBuf,
    pub disk_dir: PathBuf,
    pub run_dir: PathBuf,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl TestContainerd {
    /// Starts a containerd named after `purpose` and this process, and
    /// imports the test images into it.
    pub fn start(purpose: &str) -> TestContainerd {
        TestContainerd::start_with_root(purpose, None)
    }

    /// [`TestContainerd::start`] with its root at `root` (a filesystem of
    /// the test's own, say) instead of under target/containerd.
    pub fn start_with_root(purpose: &str, root: Option<&Path>) -> TestContainerd {
        crate::prereq::require_root();
        let shared_config = PathBuf::from(std::env::var("SWIFTLET_TEST_CONTAINERD_CONFIG").unwrap_or_else(|_| {
            panic!(
                "SWIFTLET_TEST_CONTAINERD_CONFIG is not set: this test starts a containerd of its own from the \
                 configuration of the one `cargo xtask test` starts"
            )
        }));
        let shared_disk = shared_config.parent().expect("the shared containerd's directory").to_owned();
        let shared_socket = swiftlet::cri::client::socket_path(&crate::agent::cri_endpoint())
            .unwrap_or_else(|e| panic!("SWIFTLET_TEST_CRI_ENDPOINT: {e}"));
        let shared_run = shared_socket.parent().expect("the shared containerd's run directory").to_owned();
        let id = format!("{purpose}-{}", std::process::id());
        let disk_dir = shared_disk.parent().expect("target/containerd").join(&id);
        let run_dir = PathBuf::from(format!("/run/swiftlet-ctd-{id}"));
        let _ = fs::remove_dir_all(&disk_dir);
        for d in [&disk_dir, &run_dir, &disk_dir.join("cni")] {
            fs::create_dir_all(d).unwrap_or_else(|e| panic!("cannot create {}: {e}", d.display()));
        }
        let mut text = fs::read_to_string(&shared_config)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", shared_config.display()))
            .replace(&*shared_disk.to_string_lossy(), &disk_dir.to_string_lossy())
            .replace(&*shared_run.to_string_lossy(), &run_dir.to_string_lossy());
        let default_root = disk_dir.join("root");
        let root = root.map_or(default_root.clone(), Path::to_owned);
        text = text.replace(&*default_root.to_string_lossy(), &root.to_string_lossy());
        // The pod network (the same bridge and address range: host-local
        // allocates under a lock, so both runtimes may share it).
        for e in fs::read_dir(shared_disk.join("cni")).into_iter().flatten().flatten() {
            let _ = fs::copy(e.path(), disk_dir.join("cni").join(e.file_name()));
        }
        let config = disk_dir.join("config.toml");
        fs::write(&config, text).expect("write the containerd config");
        let socket = run_dir.join("containerd.sock");
        let log = disk_dir.join("containerd.log");
        let mut c = TestContainerd { child: None, config, root, disk_dir, run_dir, socket, log };
        c.spawn();
        let images = shared_disk.parent().and_then(Path::parent).expect("target/").join("images");
        let tars: Vec<PathBuf> = fs::read_dir(&images)
            .unwrap_or_else(|e| panic!("the test images in {}: {e} (cargo xtask test builds them)", images.display()))
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().ends_with(".oci.tar"))
            .collect();
        assert!(!tars.is_empty(), "no test image in {}", images.display());
        for tar in tars {
            let out = Command::new("ctr")
                .arg("--address")
                .arg(&c.socket)
                .args(["--namespace", "k8s.io", "images", "import"])
                .arg(&tar)
                .output()
                .expect("run ctr (package containerd)");
            assert!(out.status.success(), "importing {}: {}", tar.display(), String::from_utf8_lossy(&out.stderr));
        }
        c
    }

    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Starts containerd (again) on the same root and state, and waits for
    /// it to answer: after a restart it finds the shims of what runs.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "containerd is already running");
        let _ = fs::remove_file(&self.socket);
        let log = fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("containerd log");
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start containerd (package containerd)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let answered = Command::new("ctr")
                .arg("--address")
                .arg(&self.socket)
                .args(["--namespace", "k8s.io", "version"])
                .output()
                .is_ok_and(|o| o.status.success());
            if answered {
                return;
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("containerd exited ({status}); its log is {}", self.log.display());
            }
            assert!(
                Instant::now() < deadline,
                "containerd did not answer within 30s; its log is {}",
                self.log.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM, as `systemctl stop containerd` does; the shims, and the
    /// containers they hold, keep running.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            crate::process::terminate(&mut child, Duration::from_secs(10));
        }
    }

    /// Shims started for this containerd: their command line names its socket.
    fn shims(&self) -> Vec<i32> {
        let needle = self.socket.to_string_lossy().into_owned();
        let mut pids = vec![];
        for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
            let Ok(cmdline) = fs::read(e.path().join("cmdline")) else { continue };
            let cmdline = String::from_utf8_lossy(&cmdline);
            if cmdline.contains("containerd-shim") && cmdline.split('\0').any(|a| a == needle) {
                pids.push(pid);
            }
        }
        pids
    }
}

impl Drop for TestContainerd {
    fn drop(&mut self) {
        let shims = self.shims();
        self.stop();
        for pid in shims.iter().chain(self.shims().iter()) {
            // SAFETY: a shim started by our containerd, found by our socket.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
        let mut mounts: Vec<String> = fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4).map(str::to_owned))
            .filter(|p| {
                p.starts_with(&*self.disk_dir.to_string_lossy())
                    || p.starts_with(&*self.run_dir.to_string_lossy())
                    || p.starts_with(&*self.root.to_string_lossy())
            })
            .collect();
        mounts.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for m in mounts {
            let c = std::ffi::CString::new(m.clone()).expect("mount path without NUL");
            // SAFETY: unmounting a mount point under our own directories.
            if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
                eprintln!("warning: cannot unmount {m}: {}", std::io::Error::last_os_error());
            }
        }
        let _ = fs::remove_dir_all(&self.run_dir);
        // Keep the config and log for a post-mortem; the root is the bulk.
        let _ = fs::remove_dir_all(&self.root);
    }
}
