//! `cargo xtask run`: the demo. Starts our own containerd, the fake API
//! server (with its storage controllers), the in-repo CSI driver, and
//! swiftlet as its node; creates the storage objects of examples/storage/
//! and the pods in examples/ through the API server (so a user watches
//! them, and the eviction, with kubectl as in a cluster); streams the
//! agent's log; on Ctrl-C stops everything and removes what it created.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    cmd::{self, note, step},
    containerd::Containerd,
    setup,
};

/// The demo node's name.
const NODE: &str = "swiftlet-demo";
/// The in-repo CSI driver's name (examples/storage/class.yaml).
const CSI_DRIVER: &str = "csi.swiftlet.dev";

#[derive(clap::Args)]
pub struct Args {
    /// Extra swiftlet flags (after `--`).
    #[arg(last = true)]
    extra: Vec<String>,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

pub fn install_handlers() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

/// Blocks until SIGINT or SIGTERM.
pub fn wait_for_interrupt() {
    install_handlers();
    while !INTERRUPTED.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(100));
    }
}

pub fn run(args: Args) -> Result<()> {
    setup::require_root("the demo")?;
    let tc = setup::all()?;
    setup::build_ebpf(&tc)?;
    let root = cmd::workspace_root();
    step("building swiftlet and the fake API server");
    cmd::run(Command::new("cargo").current_dir(root).env("PATH", tc.path_env()).args([
        "build",
        "-p",
        "swiftlet",
        "-p",
        "swiftlet-tests",
        "--bins",
    ]))?;
    let kubectl = setup::ensure_kubectl()?;
    install_handlers();
    let ctd = Containerd::start_interruptible(root, "run")?;
    let run_root = root.join("target").join("run");
    std::fs::create_dir_all(&run_root)?;
    // Dropped after swiftlet (declared later): whatever ends the demo, its
    // cgroups and mounts go, and containerd (declared before) goes last.
    let csi_state = run_root.join("csi-state");
    let cleanup = DemoCleanup {
        cgroup: format!("swiftlet-demo-{}", std::process::id()),
        root_dir: run_root.join("root"),
        csi_state: csi_state.clone(),
    };
    let csi_socket = run_root.join("root/plugins").join(CSI_DRIVER).join("csi.sock");
    let cgroup_root = cleanup.cgroup.clone();
    // The fake API server's CA: it signs the client certificate the server
    // proxies `kubectl exec`, `logs`, `port-forward` and `debug` with, which
    // swiftlet trusts through the configuration's clientCAFile.
    let ca = run_root.join("apiserver-ca.crt");
    let _ = std::fs::remove_file(&ca);
    let config = demo_config(&run_root, &ca)?;

    step("starting the fake API server");
    let kubeconfig = run_root.join("kubeconfig");
    let _ = std::fs::remove_file(&kubeconfig);
    let mut apiserver = Stopped(Some(spawn_in_group(
        Command::new(root.join("target/debug/fake-apiserver"))
            .arg("--tls")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--ca-file={}", ca.display()))
            .arg("--storage")
            .arg(format!("--csi-controller={CSI_DRIVER}={}", csi_socket.display()))
            .stdout(Stdio::null()),
    )?));
    wait_for("the fake API server's kubeconfig", Duration::from_secs(30), || kubeconfig.exists() && ca.exists())?;

    step(format!("starting swiftlet as node {NODE} (Ctrl-C stops everything)"));
    note(format!("kubelet configuration: {}", config.display()));
    let mut swiftlet = Command::new(root.join("target/debug/swiftlet"));
    swiftlet
        .arg(format!("--config={}", config.display()))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--hostname-override={NODE}"))
        .arg(format!("--container-runtime-endpoint={}", ctd.endpoint()))
        .arg(format!("--root-dir={}", run_root.join("root").display()))
        .arg(format!("--cgroup-root=/{cgroup_root}"))
        .args(&args.extra)
        .env("PATH", format!("{}:{}", root.join("target/debug").display(), std::env::var("PATH").unwrap_or_default()))
        .stdin(Stdio::null());
    let mut child = Stopped(Some(spawn_in_group(&mut swiftlet).context("cannot start target/debug/swiftlet")?));
    // The CSI driver registers with swiftlet through its plugins_registry,
    // as node-driver-registrar does beside a kubelet.
    step(format!("starting the CSI driver {CSI_DRIVER}"));
    let mut driver = Stopped(Some(spawn_in_group(
        Command::new(root.join("target/debug/swiftlet-test-csi-driver"))
            .args(["--name", CSI_DRIVER, "--node-id", NODE, "--topology-key", "topology.swiftlet.dev/node"])
            .arg("--csi-socket")
            .arg(&csi_socket)
            .arg("--registry-dir")
            .arg(run_root.join("root/plugins_registry"))
            .arg("--state")
            .arg(&csi_state)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )?));
    if let Some(agent) = child.0.as_ref() {
        note(format!(
            "watch the pods' memory live from another terminal: sudo target/debug/swiftlet top --agent-pid {}",
            agent.id()
        ));
        note("(with one agent on the machine, `sudo target/debug/swiftlet top` alone finds it)");
    }
    let kubectl_cmd = |args: &[&str]| {
        let mut c = Command::new(&kubectl);
        c.arg(format!("--kubeconfig={}", kubeconfig.display())).args(args);
        c
    };
    wait_for("the node registered", Duration::from_secs(60), || {
        kubectl_cmd(&["get", "node", NODE])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })?;
    step("creating the storage of examples/storage/ and the pods of examples/ through the API server");
    if !kubectl_cmd(&["create", "--validate=false", "-f"]).arg(root.join("examples/storage")).status()?.success() {
        bail!("kubectl create of examples/storage/ failed");
    }
    for manifest in example_manifests(&root.join("examples"))? {
        let text = std::fs::read_to_string(&manifest)?;
        // The fake API server has no scheduler (the pods name their node)
        // and no /openapi/v2, which older kubectls validate against.
        let Some(pod) = with_node(&text, NODE) else {
            bail!("{}: no top-level `spec:` to bind to the node", manifest.display());
        };
        let mut create = kubectl_cmd(&["create", "--validate=false", "-f", "-"]).stdin(Stdio::piped()).spawn()?;
        std::io::Write::write_all(create.stdin.as_mut().context("kubectl stdin")?, pod.as_bytes())?;
        drop(create.stdin.take());
        if !create.wait()?.success() {
            bail!("kubectl create of {} failed", manifest.display());
        }
    }
    note("pods are limited to 1.5 GiB with evictionHard memory.available<768Mi: memory-hog is evicted at the");
    note("threshold crossing (about 40 s in) while `steady` and `web` keep running. Watch it as a cluster user:");
    note(format!("  kubectl --kubeconfig {} get nodes,pods -w", kubeconfig.display()));
    note(format!("  kubectl --kubeconfig {} get events", kubeconfig.display()));
    note("try: curl http://127.0.0.1:8080/   and   ls target/run/logs/");
    note("the notes pod writes to a PersistentVolumeClaim; delete and re-create it, and its log shows both runs");
    note("  (target/run/logs/default_notes_*/notes/0.log):");
    note(format!("  kubectl --kubeconfig {} get pvc,pv", kubeconfig.display()));
    note(format!(
        "  kubectl --kubeconfig {k} delete pod notes && kubectl --kubeconfig {k} create -f examples/notes.yaml",
        k = kubeconfig.display()
    ));
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break Some(s);
        }
        if INTERRUPTED.load(Ordering::SeqCst) {
            break None;
        }
        thread::sleep(Duration::from_millis(100));
    };
    match status {
        Some(s) => note(format!("swiftlet exited ({s})")),
        None => step("stopping swiftlet and the fake API server"),
    }
    child.stop();
    driver.stop();
    apiserver.stop();
    step("stopping containerd and removing the demo's cgroups");
    drop(cleanup);
    drop(ctd);
    note("nothing left running");
    Ok(())
}

/// The demo's cgroup tree (killed and removed) and the root dir's shared
/// bind mount swiftlet leaves, as the kubelet does (unmounted), when dropped.
struct DemoCleanup {
    cgroup: String,
    root_dir: PathBuf,
    /// The CSI driver's images: their loop devices are detached.
    csi_state: PathBuf,
}

impl Drop for DemoCleanup {
    fn drop(&mut self) {
        remove_cgroup_tree(&self.cgroup);
        if let Ok(c) = std::ffi::CString::new(self.root_dir.as_os_str().as_encoded_bytes()) {
            // SAFETY: unmounting the demo's own root dir (EINVAL when it is
            // not a mount point: nothing to do).
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
        detach_loop_devices_under(&self.csi_state);
    }
}

/// Detaches the loop devices whose backing file is under `dir` (the CSI
/// driver's volumes, once nothing mounts them).
fn detach_loop_devices_under(dir: &Path) {
    let Ok(blocks) = std::fs::read_dir("/sys/block") else { return };
    for b in blocks.flatten() {
        let name = b.file_name().to_string_lossy().into_owned();
        let Ok(backing) = std::fs::read_to_string(b.path().join("loop/backing_file")) else { continue };
        if Path::new(backing.trim()).starts_with(dir) {
            let _ = Command::new("losetup").args(["-d", &format!("/dev/{name}")]).status();
        }
    }
}

/// A child in its own process group (Ctrl-C reaches us, and we stop it in
/// order), stopped with SIGTERM (then SIGKILL) when dropped.
struct Stopped(Option<Child>);

impl Stopped {
    fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        match &mut self.0 {
            Some(c) => c.try_wait(),
            None => Ok(None),
        }
    }

    fn stop(&mut self) {
        let Some(mut child) = self.0.take() else { return };
        // SAFETY: signalling the process we started, by its PID.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.stop();
    }
}

fn spawn_in_group(c: &mut Command) -> std::io::Result<Child> {
    std::os::unix::process::CommandExt::process_group(c, 0);
    c.spawn()
}

fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !ok() {
        if INTERRUPTED.load(Ordering::SeqCst) {
            bail!("interrupted while waiting for {what}");
        }
        if Instant::now() > deadline {
            bail!("{what} did not happen within {timeout:?}");
        }
        thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// The pod manifests of examples/, in name order.
fn example_manifests(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    Ok(files)
}

/// The manifest with `nodeName: <node>` as the first field of its
/// top-level `spec:`; None without one.
fn with_node(manifest: &str, node: &str) -> Option<String> {
    if manifest.contains("\n  nodeName: ") {
        return Some(manifest.to_owned());
    }
    let at = if manifest.starts_with("spec:\n") { 0 } else { manifest.find("\nspec:\n")? + 1 };
    let after = at + "spec:\n".len();
    Some(format!("{}  nodeName: {node}\n{}", &manifest[..after], &manifest[after..]))
}

/// The demo's KubeletConfiguration: pods limited to 1.5 GiB of this
/// machine's memory (everything else reserved for the system and enforced
/// on the pods' cgroup), so the memory hog reaches the eviction threshold
/// in seconds instead of filling the whole machine. Image GC is off
/// (imageGCHighThresholdPercent 100): the demo's images are built locally
/// and could not be pulled back after a GC on a nearly full disk.
fn demo_config(run_root: &std::path::Path, client_ca: &std::path::Path) -> Result<std::path::PathBuf> {
    const PODS_MIB: u64 = 1536;
    let meminfo = std::fs::read_to_string("/proc/meminfo")?;
    let total_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("cannot read MemTotal from /proc/meminfo")?;
    let reserved_mib = (total_kib / 1024).saturating_sub(PODS_MIB);
    anyhow::ensure!(reserved_mib > 0, "this machine has less than {PODS_MIB} MiB of memory; the demo needs more");
    let path = run_root.join("kubelet.yaml");
    std::fs::write(
        &path,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             podLogsDir: {logs}\n\
             authentication:\n  x509:\n    clientCAFile: {client_ca}\n\
             enforceNodeAllocatable: [pods]\n\
             systemReserved:\n  memory: {reserved_mib}Mi\n\
             evictionHard:\n  memory.available: 768Mi\n\
             evictionPressureTransitionPeriod: 30s\n\
             imageGCHighThresholdPercent: 100\n",
            logs = run_root.join("logs").display(),
            client_ca = client_ca.display(),
        ),
    )?;
    Ok(path)
}

/// Kills whatever is left in the demo's cgroup tree and removes it, in every
/// hierarchy (v1 controllers, or the unified tree).
fn remove_cgroup_tree(rel: &str) {
    let base = std::path::Path::new("/sys/fs/cgroup");
    let mut roots = vec![base.join(rel)];
    if let Ok(rd) = std::fs::read_dir(base) {
        roots.extend(rd.flatten().map(|e| e.path().join(rel)));
    }
    for dir in roots.into_iter().filter(|d| d.is_dir()) {
        kill_and_remove(&dir);
    }
}

fn kill_and_remove(dir: &std::path::Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                kill_and_remove(&e.path());
            }
        }
    }
    for _ in 0..100 {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                // SAFETY: a process inside the demo's own cgroup.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        thread::sleep(Duration::from_millis(50));
    }
    eprintln!("warning: cannot remove {}", dir.display());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_are_bound_to_the_node() {
        let m = "# a comment\napiVersion: v1\nkind: Pod\nmetadata:\n  name: x\nspec:\n  containers: []\n";
        assert_eq!(
            with_node(m, "n1").unwrap(),
            "# a comment\napiVersion: v1\nkind: Pod\nmetadata:\n  name: x\nspec:\n  nodeName: n1\n  containers: []\n"
        );
        assert_eq!(with_node("spec:\n  a: 1\n", "n").unwrap(), "spec:\n  nodeName: n\n  a: 1\n");
        assert_eq!(with_node("kind: Pod\n", "n"), None);
        for f in example_manifests(&cmd::workspace_root().join("examples")).unwrap() {
            assert!(with_node(&std::fs::read_to_string(&f).unwrap(), "n").is_some(), "{}", f.display());
        }
    }
}
