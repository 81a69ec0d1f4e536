//! A project-local containerd: its own config, root, state and socket, the
//! CRI plugin with the cgroupfs driver and overlayfs, and our pause image as
//! the sandbox image. Nothing system-wide is touched.
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
    images,
};

pub struct Containerd {
    child: Option<Child>,
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

    /// Starts containerd, waits for its socket, imports the images.
    pub fn start(workspace: &Path, purpose: &str) -> Result<Containerd> {
        Containerd::start_in(workspace, purpose, false)
    }

    /// [`Containerd::start`] for a caller that handles SIGINT itself and
    /// drops this on it: containerd is kept out of the terminal's process
    /// group, so it is still up to stop its containers.
    pub fn start_interruptible(workspace: &Path, purpose: &str) -> Result<Containerd> {
        Containerd::start_in(workspace, purpose, true)
    }

    fn start_in(workspace: &Path, purpose: &str, own_group: bool) -> Result<Containerd> {
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
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

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
            root = disk_dir.join("root").display(),
            state = run_dir.join("state").display(),
            socket = socket.display(),
            pause = images::PAUSE_IMAGE,
            cni = cni_dir.display(),
        );
        let config_path = disk_dir.join("config.toml");
        fs::write(&config_path, config)?;
        let log = disk_dir.join("containerd.log");
        step(format!("starting containerd ({snapshotter}) on {}", socket.display()));
        let mut command = Command::new("containerd");
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
        let mut c = Containerd { child: Some(child), disk_dir, run_dir, socket, log, bridge };
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
fn ctr(socket: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("ctr")
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
fn stop_containers(socket: &Path) -> usize {
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
            let left = stop_containers(&self.socket);
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
