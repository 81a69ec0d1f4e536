//! `cargo xtask run`: the demo. Starts our own containerd and swiftlet in
//! standalone mode on the static pods in examples/, streams its log, and on
//! Ctrl-C stops everything and removes what it created.

use std::{
    process::{Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use crate::{
    cmd::{self, note, step},
    containerd::Containerd,
    setup,
};

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
    step("building swiftlet");
    cmd::run(Command::new("cargo").current_dir(root).env("PATH", tc.path_env()).args([
        "build",
        "-p",
        "swiftlet",
        "-p",
        "swiftlet-tests",
        "--bins",
    ]))?;
    install_handlers();
    let ctd = Containerd::start_interruptible(root, "run")?;
    let run_root = root.join("target").join("run");
    std::fs::create_dir_all(&run_root)?;
    let cgroup_root = format!("swiftlet-demo-{}", std::process::id());
    let config = demo_config(&run_root)?;
    step("starting swiftlet in standalone mode on examples/ (Ctrl-C stops everything)");
    note(format!("kubelet configuration: {}", config.display()));
    note("pods are limited to 1.5 GiB with evictionHard memory.available<768Mi: watch memory-hog get evicted");
    note("at the threshold crossing (about 40 s in), while `steady` and `web` keep running");
    note("try: curl http://127.0.0.1:8080/   and   ls target/run/logs/");
    let mut swiftlet = Command::new(root.join("target/debug/swiftlet"));
    swiftlet
        .arg(format!("--config={}", config.display()))
        .arg(format!("--pod-manifest-path={}", root.join("examples").display()))
        .arg(format!("--container-runtime-endpoint={}", ctd.endpoint()))
        .arg(format!("--root-dir={}", run_root.join("root").display()))
        .arg(format!("--cgroup-root=/{cgroup_root}"))
        .arg("--register-node=false")
        .args(&args.extra)
        .env("PATH", format!("{}:{}", root.join("target/debug").display(), std::env::var("PATH").unwrap_or_default()))
        .stdin(Stdio::null());
    // Its own process group: Ctrl-C reaches us, and we stop it in order.
    std::os::unix::process::CommandExt::process_group(&mut swiftlet, 0);
    let mut child = swiftlet.spawn().context("cannot start target/debug/swiftlet")?;
    note(format!(
        "watch the pods' memory live from another terminal: sudo target/debug/swiftlet top --agent-pid {}",
        child.id()
    ));
    note("(with one agent on the machine, `sudo target/debug/swiftlet top` alone finds it)");
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
        None => {
            step("stopping swiftlet");
            // SAFETY: signalling the process we started, by its PID.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(30);
            while child.try_wait()?.is_none() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    step("stopping containerd and removing the demo's cgroups");
    drop(ctd);
    remove_cgroup_tree(&cgroup_root);
    note("nothing left running");
    Ok(())
}

/// The demo's KubeletConfiguration: pods limited to 1.5 GiB of this
/// machine's memory (everything else reserved for the system and enforced
/// on the pods' cgroup), so the memory hog reaches the eviction threshold
/// in seconds instead of filling the whole machine. Image GC is off
/// (imageGCHighThresholdPercent 100): the demo's images are built locally
/// and could not be pulled back after a GC on a nearly full disk.
fn demo_config(run_root: &std::path::Path) -> Result<std::path::PathBuf> {
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
             enforceNodeAllocatable: [pods]\n\
             systemReserved:\n  memory: {reserved_mib}Mi\n\
             evictionHard:\n  memory.available: 768Mi\n\
             evictionPressureTransitionPeriod: 30s\n\
             imageGCHighThresholdPercent: 100\n",
            logs = run_root.join("logs").display()
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
