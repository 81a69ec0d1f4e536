//! A project-local containerd: its own config, root, state and socket, the
//! CRI plugin with the cgroupfs driver and overlayfs, and our pause image as
//! the sandbox image. Nothing system-wide is touched.
//!
//! Two versions: this host's containerd 1.6 (Debian 12's package, config
//! version 2) and containerd 2.1 from Debian sid, unpacked under
//! ~/.cache/swiftlet (see `debian`) and run from there (config version 3,
//! where the CRI plugin is split into `io.containerd.cri.v1.runtime` and
//! `io.containerd.cri.v1.images`). `--version` of `cargo xtask containerd`,
//! or `SWIFTLET_CONTAINERD_VERSION` for every command, picks one.
//!
//! On drop it stops the containers first, through containerd (`ctr`: every
//! task killed and deleted, so runc removes their cgroups, then every
//! container deleted), then containerd itself (by the PID it started) and
//! the shims it started, and unmounts what is left under its root.
//! For the commands that wait for Ctrl-C (`containerd`, `run`), containerd
//! runs in a process group of its own ([`Containerd::start_interruptible`]),
//! so a Ctrl-C at the terminal reaches only xtask, which then stops it in
//! that order; elsewhere it shares xtask's group and a Ctrl-C ends both.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    cmd::{note, step},
    debian, images,
};

/// The containerd versions xtask can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Version {
    /// This host's package (Debian 12).
    #[value(name = "1.6")]
    V1_6,
    /// Debian 13's package, unpacked, never installed.
    #[value(name = "1.7")]
    V1_7,
    /// Debian sid's package, unpacked, never installed.
    #[value(name = "2.1")]
    V2_1,
}

/// The version used when neither `--version` nor the environment names one:
/// what new nodes run.
pub const DEFAULT_VERSION: Version = Version::V2_1;
/// The older versions `cargo xtask test` keeps a smoke subset for.
pub const SMOKE_VERSIONS: [Version; 2] = [Version::V1_7, Version::V1_6];
/// Names the version for every command that starts a containerd (`test`,
/// `run`, `bench`, `containerd`), e.g. `SWIFTLET_CONTAINERD_VERSION=2.1`.
pub const VERSION_ENV: &str = "SWIFTLET_CONTAINERD_VERSION";
/// Debian sid's containerd 2.1 (pinned by version prefix; see `debian`).
const SID_CONTAINERD_PREFIX: &str = "2.1.";
/// Debian 13's containerd 1.7.
const TRIXIE_CONTAINERD_PREFIX: &str = "1.7.";

impl Version {
    /// `SWIFTLET_CONTAINERD_VERSION`, else the default.
    pub fn from_env() -> Result<Version> {
        match std::env::var(VERSION_ENV) {
            Ok(v) if !v.trim().is_empty() => <Version as clap::ValueEnum>::from_str(v.trim(), false).map_err(|_| {
                anyhow::anyhow!("{VERSION_ENV}={v} is not a containerd version xtask runs (1.6, 1.7, 2.1)")
            }),
            _ => Ok(DEFAULT_VERSION),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Version::V1_6 => "1.6",
            Version::V1_7 => "1.7",
            Version::V2_1 => "2.1",
        }
    }
}

/// Where a version's binaries are.
struct Binaries {
    containerd: PathBuf,
    ctr: PathBuf,
    /// Put first on containerd's PATH, so it starts the shim of its own
    /// version (`containerd-shim-runc-v2` is looked up on PATH, and the
    /// host's 1.6 shim is in /usr/bin); None for the host's package.
    bin_dir: Option<PathBuf>,
    /// For messages, e.g. `2.1.9+ds1-5`.
    label: String,
}

impl Binaries {
    /// A Debian suite's containerd, unpacked (never installed).
    fn unpacked(suite: &str, prefix: &str, what: &str) -> Result<Binaries> {
        let u = debian::unpack(suite, "containerd", prefix)
            .with_context(|| format!("cannot fetch containerd {prefix}x from {what}"))?;
        let bin = u.root.join("usr/bin");
        Ok(Binaries {
            containerd: bin.join("containerd"),
            ctr: bin.join("ctr"),
            bin_dir: Some(bin),
            label: format!("{} ({what})", u.version),
        })
    }

    fn of(version: Version) -> Result<Binaries> {
        match version {
            Version::V1_6 => Ok(Binaries {
                containerd: "containerd".into(),
                ctr: "ctr".into(),
                bin_dir: None,
                label: "1.6 (this host's package)".into(),
            }),
            Version::V1_7 => Binaries::unpacked("trixie", TRIXIE_CONTAINERD_PREFIX, "Debian 13"),
            Version::V2_1 => Binaries::unpacked("sid", SID_CONTAINERD_PREFIX, "Debian sid"),
        }
    }
}

pub struct Containerd {
    child: Option<Child>,
    pub version: Version,
    /// `ctr` of the same version, for the cleanup on drop.
    ctr: PathBuf,
    /// Where its binaries are, when not on the host's PATH (see [`Containerd::path_env`]).
    pub bin_dir: Option<PathBuf>,
    /// Root, state and config live here (root on disk, state on /run).
    pub disk_dir: PathBuf,
    pub run_dir: PathBuf,
    pub socket: PathBuf,
    pub log: PathBuf,
    /// The bridge of its CNI network, removed on drop.
    pub bridge: Option<String>,
}

impl Containerd {
    /// The CRI endpoint, in kubelet form.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// A PATH with this version's binaries first, for processes that start
    /// a containerd or `ctr` of their own from this one's configuration (the
    /// runtime-restart tests): `base` when they are the host's.
    pub fn path_env(&self, base: &std::ffi::OsStr) -> std::ffi::OsString {
        let Some(bin) = &self.bin_dir else { return base.to_owned() };
        let mut paths = vec![bin.clone()];
        paths.extend(std::env::split_paths(base));
        std::env::join_paths(paths).unwrap_or_else(|_| base.to_owned())
    }

    /// Starts containerd of the version `SWIFTLET_CONTAINERD_VERSION`
    /// names (else the default), waits for its socket, imports the images.
    pub fn start(workspace: &Path, purpose: &str) -> Result<Containerd> {
        Containerd::start_in(workspace, purpose, Version::from_env()?, false)
    }

    /// [`Containerd::start`] for a caller that handles SIGINT itself and
    /// drops this on it: containerd is kept out of the terminal's process
    /// group, so it is still up to stop its containers.
    pub fn start_interruptible(workspace: &Path, purpose: &str) -> Result<Containerd> {
        Containerd::start_in(workspace, purpose, Version::from_env()?, true)
    }

    /// [`Containerd::start`] of a given version.
    pub fn start_version(workspace: &Path, purpose: &str, version: Version) -> Result<Containerd> {
        Containerd::start_in(workspace, purpose, version, false)
    }

    /// [`Containerd::start_interruptible`] of a given version.
    pub fn start_version_interruptible(workspace: &Path, purpose: &str, version: Version) -> Result<Containerd> {
        Containerd::start_in(workspace, purpose, version, true)
    }

    fn start_in(workspace: &Path, purpose: &str, version: Version, own_group: bool) -> Result<Containerd> {
        let bins = Binaries::of(version)?;
        let images = images::ensure(workspace)?;
        let id = format!("{purpose}-{}", std::process::id());
        let disk_dir = workspace.join("target").join("containerd").join(&id);
        // Unix socket paths are limited to 108 bytes: keep state short.
        let run_dir = PathBuf::from(format!("/run/swiftlet-ctd-{id}"));
        let socket = run_dir.join("containerd.sock");
        let cni_dir = disk_dir.join("cni");
        for d in [&disk_dir, &run_dir, &cni_dir] {
            fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
        }
        let bridge = write_cni_config(&cni_dir, &run_dir)?;
        let snapshotter = if overlay_supported() { "overlayfs" } else { "native" };
        let paths = ConfigPaths {
            root: disk_dir.join("root"),
            state: run_dir.join("state"),
            socket: socket.clone(),
            cni: cni_dir.clone(),
            snapshotter,
        };
        let config = match version {
            Version::V1_6 | Version::V1_7 => config_v2(&paths),
            Version::V2_1 => config_v3(&paths),
        };
        let config_path = disk_dir.join("config.toml");
        fs::write(&config_path, config)?;
        let log = disk_dir.join("containerd.log");
        step(format!("starting containerd {} ({snapshotter}) on {}", bins.label, socket.display()));
        let mut command = Command::new(&bins.containerd);
        if let Some(bin) = &bins.bin_dir {
            let mut paths = vec![bin.clone()];
            paths.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
            command.env("PATH", std::env::join_paths(paths).context("a PATH entry holds ':'")?);
        }
        command
            .arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&log)?)
            .stderr(fs::File::create(&log)?.try_clone()?);
        if own_group {
            // Not in the terminal's foreground group: a Ctrl-C must leave it
            // up until its containers are stopped (see Drop).
            std::os::unix::process::CommandExt::process_group(&mut command, 0);
        }
        let child =
            command.spawn().context("cannot start containerd (package containerd; `cargo xtask setup` installs it)")?;
        let mut c = Containerd {
            child: Some(child),
            version,
            ctr: bins.ctr,
            bin_dir: bins.bin_dir,
            disk_dir,
            run_dir,
            socket,
            log,
            bridge,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !c.socket.exists() {
            if let Some(status) = c.child.as_mut().and_then(|ch| ch.try_wait().ok().flatten()) {
                bail!("containerd exited ({status}); its log is {}", c.log.display());
            }
            if Instant::now() > deadline {
                bail!("containerd did not open {} within 20s; its log is {}", c.socket.display(), c.log.display());
            }
            thread::sleep(Duration::from_millis(50));
        }
        images::import(&c.socket, &images)?;
        note(format!("imported {}", images.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")));
        Ok(c)
    }
}

/// What a config names.
struct ConfigPaths {
    root: PathBuf,
    state: PathBuf,
    socket: PathBuf,
    cni: PathBuf,
    snapshotter: &'static str,
}

/// Plugins neither version needs here: snapshotters for other filesystems,
/// tracing exporters.
const DISABLED_PLUGINS_V1: &str = r#""io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing""#;

/// containerd 1.x: config version 2, one CRI plugin.
fn config_v2(p: &ConfigPaths) -> String {
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = [{DISABLED_PLUGINS_V1}]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{state}/containerd.sock.ttrpc"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # This kind of machine withholds CAP_SYS_RESOURCE, so no process may lower
  # an oom_score_adj below its own (0): the sandbox's -998 and Guaranteed
  # pods' -997 are raised to containerd's own instead of failing runc.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "{snapshotter}"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
        root = p.root.display(),
        state = p.state.display(),
        socket = p.socket.display(),
        pause = images::PAUSE_IMAGE,
        cni = p.cni.display(),
        snapshotter = p.snapshotter,
    )
}

/// containerd 2.x: config version 3. The CRI plugin is split in three: the
/// runtime side (`io.containerd.cri.v1.runtime`: runtimes, CNI, OOM score
/// handling), the image side (`io.containerd.cri.v1.images`: snapshotter,
/// the sandbox image as a pinned image) and the gRPC service
/// (`io.containerd.grpc.v1.cri`: the stream server). The same features as
/// [`config_v2`]; NRI (new in 1.7) is disabled, since its socket is
/// machine-wide, as are 2.x's new snapshotters.
fn config_v3(p: &ConfigPaths) -> String {
    format!(
        r#"version = 3
root = "{root}"
state = "{state}"
disabled_plugins = [{DISABLED_PLUGINS_V1}, "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs", "io.containerd.nri.v1.nri"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{state}/containerd.sock.ttrpc"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "{snapshotter}"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause}"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  # As in version 2: this kind of machine withholds CAP_SYS_RESOURCE.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{cni}"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#,
        root = p.root.display(),
        state = p.state.display(),
        socket = p.socket.display(),
        pause = images::PAUSE_IMAGE,
        cni = p.cni.display(),
        snapshotter = p.snapshotter,
    )
}

/// A pod network, so the runtime reports NetworkReady (a node is Ready
/// only then, as with the kubelet) and pods without hostNetwork get an
/// address: the bridge plugin on a bridge and a /24 of our own (named and
/// numbered after our PID, so concurrent runs do not meet), addresses from
/// host-local kept under our run dir. No iptables rules (no masquerade, no
/// portmap). Returns the bridge's name; None when the CNI plugins are not
/// installed (package containernetworking-plugins).
fn write_cni_config(cni_dir: &Path, run_dir: &Path) -> Result<Option<String>> {
    if !Path::new("/usr/lib/cni/bridge").exists() {
        note("no CNI plugins in /usr/lib/cni (containernetworking-plugins): the runtime's network will not be ready");
        return Ok(None);
    }
    let pid = std::process::id();
    let bridge = format!("swl{pid}");
    let subnet = format!("10.{}.{}.0/24", 200 + (pid / 256) % 50, pid % 256);
    let conf = format!(
        r#"{{
  "cniVersion": "1.0.0",
  "name": "swiftlet-{pid}",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "{bridge}",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {{ "type": "host-local", "ranges": [[{{ "subnet": "{subnet}" }}]], "dataDir": "{ipam}" }}
    }},
    {{ "type": "loopback" }}
  ]
}}
"#,
        ipam = run_dir.join("cni-ipam").display(),
    );
    let path = cni_dir.join("10-swiftlet.conflist");
    fs::write(&path, conf).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(Some(bridge))
}

/// overlayfs needs kernel support and an upper dir filesystem that allows it.
fn overlay_supported() -> bool {
    fs::read_to_string("/proc/filesystems").map(|s| s.contains("overlay")).unwrap_or(false)
}

/// Shim processes started for this containerd: their command line names our
/// socket (`-address <socket>`).
fn our_shims(socket: &Path) -> Vec<i32> {
    let needle = socket.to_string_lossy().into_owned();
    let mut pids = vec![];
    if let Ok(rd) = fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
            let Ok(cmdline) = fs::read(e.path().join("cmdline")) else { continue };
            let cmdline = String::from_utf8_lossy(&cmdline);
            if cmdline.contains("containerd-shim") && cmdline.split('\0').any(|a| a == needle) {
                pids.push(pid);
            }
        }
    }
    pids
}

/// Mount points under `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.to_string_lossy().into_owned();
    let mut m: Vec<String> = fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(str::to_owned))
        .filter(|p| p.starts_with(&prefix))
        .collect();
    m.sort_by_key(|p| std::cmp::Reverse(p.len()));
    m
}

/// `ctr` against this containerd, in the CRI's namespace; its stdout.
fn ctr(ctr: &Path, socket: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new(ctr)
        .arg("--address")
        .arg(socket)
        .args(["--namespace", "k8s.io"])
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Kills every container's processes and deletes the tasks and containers,
/// through containerd: runc removes each container's cgroup as its task is
/// deleted. Returns how many tasks were left.
fn stop_containers(ctr_bin: &Path, socket: &Path) -> usize {
    let ctr = |socket: &Path, args: &[&str]| ctr(ctr_bin, socket, args);
    let Some(list) = ctr(socket, &["tasks", "list", "--quiet"]) else { return usize::MAX };
    let tasks: Vec<String> = list.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned).collect();
    for t in &tasks {
        let _ = ctr(socket, &["tasks", "kill", "--all", "--signal", "SIGKILL", t]);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut left = tasks.clone();
    while !left.is_empty() && Instant::now() < deadline {
        // A killed task is deleted once it has stopped (runc delete, which
        // removes its cgroup); `--force` would race the kill.
        left.retain(|t| ctr(socket, &["tasks", "delete", t]).is_none());
        if !left.is_empty() {
            thread::sleep(Duration::from_millis(100));
        }
    }
    for t in &left {
        let _ = ctr(socket, &["tasks", "delete", "--force", t]);
    }
    if let Some(list) = ctr(socket, &["containers", "list", "--quiet"]) {
        for c in list.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let _ = ctr(socket, &["containers", "delete", c]);
        }
    }
    ctr(socket, &["tasks", "list", "--quiet"])
        .map_or(usize::MAX, |l| l.lines().filter(|l| !l.trim().is_empty()).count())
}

/// The processes whose parent is `pid` (a shim's containers).
fn children_of(pid: i32) -> Vec<i32> {
    let mut out = vec![];
    if let Ok(rd) = fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Ok(child) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
            let Ok(stat) = fs::read_to_string(e.path().join("stat")) else { continue };
            // The parent pid is the second field after the command's ')'.
            let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
            if ppid == Some(pid) {
                out.push(child);
            }
        }
    }
    out
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let alive = self.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_none());
        if alive {
            let left = stop_containers(&self.ctr, &self.socket);
            if left > 0 {
                eprintln!("warning: containerd left {left} tasks running; stopping their processes by hand");
            }
        }
        let shims = our_shims(&self.socket);
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling the process we started, by its PID.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // Shims outlive containerd by design; they, and any container a
        // shim still holds (containerd was gone before its tasks could be
        // deleted), are ours to stop.
        for pid in shims.iter().chain(our_shims(&self.socket).iter()) {
            for c in children_of(*pid) {
                // SAFETY: a container process of a shim of our containerd.
                unsafe { libc::kill(c, libc::SIGKILL) };
            }
            // SAFETY: a shim started by our containerd, found by our socket.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
        for dir in [&self.disk_dir, &self.run_dir] {
            for m in mounts_under(dir) {
                let c = std::ffi::CString::new(m.clone()).expect("mount path without NUL");
                // SAFETY: unmounting a mount point under our own directory.
                if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
                    eprintln!("warning: cannot unmount {m}: {}", std::io::Error::last_os_error());
                }
            }
        }
        // The CNI bridge outlives its last pod.
        if let Some(b) = &self.bridge
            && Path::new("/sys/class/net").join(b).exists()
        {
            let _ = Command::new("ip").args(["link", "delete", b]).status();
        }
        let _ = fs::remove_dir_all(&self.run_dir);
        // Keep the config and log for a post-mortem; the root (images,
        // snapshots) is the bulk.
        let _ = fs::remove_dir_all(self.disk_dir.join("root"));
    }
}
