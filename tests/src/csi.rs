//! Running the test CSI driver (`swiftlet-test-csi-driver`, see
//! `crate::csi_driver`) from a test: start it, read what it was asked,
//! steer it, crash and restart it, and sweep away what it left mounted.
//!
//! Unix socket paths must stay under 108 bytes: keep the directories short
//! (a `tempfile::tempdir()` under /tmp is).

use std::{
    ffi::OsString,
    io,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use swiftlet::volumes::csi::api::{ProbeRequest, identity_client::IdentityClient};
use tonic::transport::Channel;

use crate::csi_driver::{control, loopdev, mounts, run};

/// The driver's name unless a test picks another.
pub const DEFAULT_NAME: &str = "csi.swiftlet.dev";
/// The topology key the driver reports unless a test turns it off.
pub const DEFAULT_TOPOLOGY_KEY: &str = "topology.swiftlet.dev/node";
const BINARY: &str = "swiftlet-test-csi-driver";
const READY_TIMEOUT: Duration = Duration::from_secs(15);

/// The driver's command line.
#[derive(Debug, Clone)]
pub struct CsiDriverOptions {
    pub name: String,
    pub node_id: String,
    pub csi_socket: PathBuf,
    pub registry_dir: PathBuf,
    pub state: PathBuf,
    pub topology_key: Option<String>,
    /// 0: no limit.
    pub max_volumes: i64,
    pub no_stage: bool,
    pub require_attach: bool,
    /// Serve no registration socket.
    pub no_register: bool,
    /// More arguments (`--fail NodeStageVolume`, `--delay Probe=100`).
    pub extra: Vec<String>,
    /// The driver binary; None finds it beside the running executable.
    pub binary: Option<PathBuf>,
}

impl CsiDriverOptions {
    /// Everything under `dir`: the CSI socket `<dir>/csi/csi.sock`, the
    /// registration socket in `<dir>/plugins_registry`, the state in
    /// `<dir>/state`; name `csi.swiftlet.dev`, topology key
    /// `topology.swiftlet.dev/node`, no volume limit, staging on.
    pub fn new(dir: &Path, node_id: &str) -> CsiDriverOptions {
        CsiDriverOptions {
            name: DEFAULT_NAME.into(),
            node_id: node_id.into(),
            csi_socket: dir.join("csi").join("csi.sock"),
            registry_dir: dir.join("plugins_registry"),
            state: dir.join("state"),
            topology_key: Some(DEFAULT_TOPOLOGY_KEY.into()),
            max_volumes: 0,
            no_stage: false,
            require_attach: false,
            no_register: false,
            extra: Vec::new(),
            binary: None,
        }
    }

    /// Laid out as node-driver-registrar is beside a kubelet whose
    /// `--root-dir` is `root_dir`: the CSI socket at
    /// `<root_dir>/plugins/<name>/csi.sock`, registration in
    /// `<root_dir>/plugins_registry`; the state in `state`.
    pub fn for_kubelet(root_dir: &Path, node_id: &str, state: &Path) -> CsiDriverOptions {
        let mut o = CsiDriverOptions::new(root_dir, node_id);
        o.csi_socket = root_dir.join("plugins").join(DEFAULT_NAME).join("csi.sock");
        o.state = state.to_owned();
        o
    }

    /// `<registry_dir>/<name>-reg.sock`.
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir.join(format!("{}-reg.sock", self.name))
    }

    /// The arguments after the program name.
    pub fn args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec![
            "--name".into(),
            self.name.clone().into(),
            "--node-id".into(),
            self.node_id.clone().into(),
            "--csi-socket".into(),
            self.csi_socket.clone().into(),
            "--registry-dir".into(),
            self.registry_dir.clone().into(),
            "--state".into(),
            self.state.clone().into(),
            "--max-volumes".into(),
            self.max_volumes.to_string().into(),
        ];
        if let Some(k) = &self.topology_key {
            a.extend(["--topology-key".into(), k.clone().into()]);
        }
        for (flag, on) in [
            ("--no-stage", self.no_stage),
            ("--require-attach", self.require_attach),
            ("--no-register", self.no_register),
        ] {
            if on {
                a.push(flag.into());
            }
        }
        a.extend(self.extra.iter().map(OsString::from));
        a
    }
}

/// `swiftlet-test-csi-driver` built beside the running executable (test
/// binaries are in target/<profile>/deps, the driver one level up).
pub fn driver_binary() -> io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dirs = exe.ancestors().skip(1).take(2);
    dirs.map(|d| d.join(BINARY)).find(|p| p.is_file()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{BINARY} is missing beside {}: build it with `cargo build -p swiftlet-tests --bins`",
                exe.display()
            ),
        )
    })
}

/// Asks the driver on `socket` for Probe once, within `timeout`. Blocking,
/// and usable from inside a tokio runtime (it runs on a thread of its own).
pub fn probe(socket: &Path, timeout: Duration) -> Result<(), String> {
    let socket = socket.to_owned();
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("tokio runtime: {e}"))?;
            rt.block_on(async {
                let channel = swiftlet::grpc::dial_unix(&socket, timeout, "CSI driver").await?;
                let ready =
                    swiftlet::grpc::timed("Probe", timeout, IdentityClient::new(channel).probe(ProbeRequest {}))
                        .await?;
                match ready.ready {
                    Some(false) => Err("Probe: not ready".to_owned()),
                    _ => Ok(()),
                }
            })
        })
        .join()
        .unwrap_or_else(|_| Err("the probe thread panicked".into()))
    })
}

/// The driver process; killed on drop, and whatever it left mounted or
/// attached under its state dir swept away ([`cleanup_state`]).
pub struct CsiDriverProcess {
    opts: CsiDriverOptions,
    child: Option<Child>,
}

impl CsiDriverProcess {
    /// Starts the driver and waits until it answers Probe (its registration
    /// socket, when it serves one, is bound by then).
    pub fn start(opts: &CsiDriverOptions) -> io::Result<CsiDriverProcess> {
        let mut p = CsiDriverProcess { opts: opts.clone(), child: None };
        p.spawn()?;
        Ok(p)
    }

    fn spawn(&mut self) -> io::Result<()> {
        let binary = match &self.opts.binary {
            Some(b) => b.clone(),
            None => driver_binary()?,
        };
        std::fs::create_dir_all(&self.opts.state)?;
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path())?;
        let child = Command::new(&binary)
            .args(self.opts.args())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("starting {}: {e}", binary.display())))?;
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let exited = match self.child.as_mut() {
                Some(c) => c.try_wait()?,
                None => return Err(io::Error::other("the driver is not running")),
            };
            if let Some(status) = exited {
                self.child = None;
                return Err(io::Error::other(format!("the driver exited ({status}): {}", self.log_tail())));
            }
            let last = match probe(&self.opts.csi_socket, Duration::from_secs(1)) {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if Instant::now() > deadline {
                self.kill();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the driver did not answer Probe within {READY_TIMEOUT:?} ({last}): {}", self.log_tail()),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `<state>/driver.log`: the driver's stderr, over all its runs.
    pub fn log_path(&self) -> PathBuf {
        self.opts.state.join("driver.log")
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    pub fn options(&self) -> &CsiDriverOptions {
        &self.opts
    }

    pub fn socket(&self) -> &Path {
        &self.opts.csi_socket
    }

    pub fn registration_socket(&self) -> PathBuf {
        self.opts.registration_socket()
    }

    pub fn state(&self) -> &Path {
        &self.opts.state
    }

    /// The running process's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// A gRPC channel to the CSI socket.
    pub async fn channel(&self) -> Result<Channel, String> {
        swiftlet::grpc::dial_unix(&self.opts.csi_socket, Duration::from_secs(5), "CSI driver").await
    }

    /// The lines of `<state>/calls.log`, oldest first.
    pub fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.opts.state.join(control::CALLS_FILE))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The first calls.log line starting with `prefix`, waiting up to
    /// `timeout` for it.
    pub fn wait_for_call(&self, prefix: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.calls().into_iter().find(|l| l.starts_with(prefix)) {
                return Some(l);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// From now on these methods fail with Internal "injected failure"
    /// (beside `--fail` flags); an empty list switches that off.
    pub fn set_fail(&self, methods: &[&str]) -> io::Result<()> {
        self.write_control(control::FAIL_FILE, methods.iter().map(|m| m.to_string()))
    }

    /// From now on these methods sleep first (milliseconds).
    pub fn set_delay(&self, delays: &[(&str, u64)]) -> io::Result<()> {
        self.write_control(control::DELAY_FILE, delays.iter().map(|(m, ms)| format!("{m}={ms}")))
    }

    /// NodeGetVolumeStats reports these volumes' condition abnormal.
    pub fn set_abnormal(&self, volume_ids: &[&str]) -> io::Result<()> {
        self.write_control(control::ABNORMAL_FILE, volume_ids.iter().map(|v| v.to_string()))
    }

    fn write_control(&self, file: &str, lines: impl Iterator<Item = String>) -> io::Result<()> {
        let text: String = lines.map(|l| l + "\n").collect();
        // Whole files at once: the driver never reads half a list.
        let path = self.opts.state.join(file);
        let tmp = self.opts.state.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text)?;
        std::fs::rename(tmp, path)
    }

    /// SIGKILL, as a crash: the sockets and mounts stay.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for the exit (the driver removes its sockets);
    /// SIGKILL after 10 s.
    pub fn stop(&mut self) -> io::Result<()> {
        let Some(mut c) = self.child.take() else { return Ok(()) };
        let pid = rustix::process::Pid::from_raw(i32::try_from(c.id()).unwrap_or(0))
            .ok_or_else(|| io::Error::other("the driver has no pid"))?;
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).map_err(io::Error::from)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while c.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = c.kill();
                c.wait()?;
                return Err(io::Error::new(io::ErrorKind::TimedOut, "the driver ignored SIGTERM for 10 s"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Stops the driver if it runs (SIGTERM) and starts it again with the
    /// same options; mounts and state stay.
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop()?;
        self.spawn()
    }
}

impl Drop for CsiDriverProcess {
    fn drop(&mut self) {
        self.kill();
        cleanup_state(&self.opts.state);
    }
}

/// Unmounts every mount of a loop device whose image is under `state`
/// (its ext4 anywhere, and the device bind-mounted onto block volume
/// files), newest first, then detaches those loop devices. Problems go to
/// stderr: this runs in `Drop`.
pub fn cleanup_state(state: &Path) {
    let Ok(state) = std::fs::canonicalize(state) else { return };
    let loops: Vec<loopdev::LoopDevice> =
        loopdev::list().into_iter().filter(|l| l.backing.starts_with(&state)).collect();
    for _ in 0..3 {
        let table = mounts::table();
        let ours: Vec<u32> = loops.iter().flat_map(|l| mounts::of_device(&table, l.dev)).map(|m| m.id).collect();
        if ours.is_empty() {
            break;
        }
        for m in table.iter().rev().filter(|m| ours.contains(&m.id)) {
            let target = m.mount_point.as_os_str();
            if run("umount", &[target]).is_err()
                && let Err(e) = run("umount", &["-l".as_ref(), target])
            {
                eprintln!("warning: cleanup: {e}");
            }
        }
    }
    for l in &loops {
        if let Err(e) = loopdev::detach(&l.device) {
            eprintln!("warning: cleanup: {e}");
        }
    }
}
