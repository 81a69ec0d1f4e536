//! Booting a kernel under qemu (TCG: KVM does not work on these machines)
//! and reading its serial console until it powers off.

use std::{
    fs,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use crate::cmd::{note, step};

/// What the VM prints when it has finished what it was booted for.
pub const DONE: &str = "@@DONE";

/// What the VM's userspace prints first (with the kernel's release),
/// after whatever escapes the console left on that line.
pub const USERSPACE: &str = "@@VM kernel=";

/// How long a kernel may take to reach userspace. Under TCG a kernel has
/// hung in early boot, idle and silent, until the whole timeout ran out
/// (40 minutes of the suite); a normal boot reaches userspace in under
/// 30 s, several times that on a loaded machine.
const USERSPACE_WITHIN: Duration = Duration::from_secs(240);

/// A disk of the VM (virtio, `/dev/vda`, `/dev/vdb`, … in order).
pub struct Drive {
    pub image: PathBuf,
    /// Writes go to a temporary overlay and are dropped at power-off, so one
    /// cached image serves every run.
    pub snapshot: bool,
}

/// One boot.
pub struct Boot<'a> {
    /// For messages: "kernel 6.12", "node 6.12 (systemd)".
    pub label: String,
    pub vmlinuz: &'a Path,
    pub initramfs: &'a Path,
    /// The kernel command line after `console=ttyS0 panic=-1`.
    pub append: String,
    pub drives: Vec<Drive>,
    pub memory_mib: u32,
    /// `-cpu max` (every feature TCG emulates) rather than qemu's default
    /// model.
    pub cpu_max: bool,
    /// The VM is killed (by its pid) when it runs longer.
    pub timeout: Duration,
    /// Where console.log goes.
    pub dir: &'a Path,
}

/// What a VM run left: its console, how long it took, and why it ended
/// early if it did.
pub struct VmRun {
    pub console: String,
    pub seconds: f64,
    pub early_end: Option<String>,
}

/// Boots and reads the serial console until the VM powers off (or overruns
/// its timeout and is killed); `on_line` sees each line as it comes, with
/// the seconds since qemu started. A boot that has not reached userspace
/// within [`USERSPACE_WITHIN`] is killed and booted once more (the first
/// console kept as `console-hung-boot.log`).
pub fn boot(b: &Boot, mut on_line: impl FnMut(&str, f64)) -> Result<VmRun> {
    match boot_once(b, &mut on_line)? {
        Ended::Run(run) => Ok(run),
        Ended::HungBeforeUserspace => {
            note(format!(
                "{}: no userspace within {}s (a kernel hung in early boot); booting again",
                b.label,
                USERSPACE_WITHIN.as_secs()
            ));
            let _ = fs::rename(b.dir.join("console.log"), b.dir.join("console-hung-boot.log"));
            match boot_once(b, &mut on_line)? {
                Ended::Run(run) => Ok(run),
                Ended::HungBeforeUserspace => Ok(VmRun {
                    console: fs::read_to_string(b.dir.join("console.log")).unwrap_or_default(),
                    seconds: USERSPACE_WITHIN.as_secs_f64(),
                    early_end: Some(format!(
                        "the kernel reached no userspace within {}s, twice",
                        USERSPACE_WITHIN.as_secs()
                    )),
                }),
            }
        }
    }
}

enum Ended {
    Run(VmRun),
    HungBeforeUserspace,
}

fn boot_once(b: &Boot, on_line: &mut impl FnMut(&str, f64)) -> Result<Ended> {
    step(format!("{}: booting under qemu (TCG)", b.label));
    let console_path = b.dir.join("console.log");
    let started = Instant::now();
    let mut c = Command::new("qemu-system-x86_64");
    c.args(["-accel", "tcg", "-smp", "2", "-nographic", "-no-reboot", "-nic", "none"]);
    if b.cpu_max {
        c.args(["-cpu", "max"]);
    }
    c.arg("-m")
        .arg(b.memory_mib.to_string())
        .arg("-kernel")
        .arg(b.vmlinuz)
        .arg("-initrd")
        .arg(b.initramfs)
        .arg("-append")
        .arg(format!("console=ttyS0 panic=-1 {}", b.append));
    for d in &b.drives {
        let mut spec = format!("file={},format=raw,if=virtio", d.image.display());
        if d.snapshot {
            spec.push_str(",snapshot=on");
        }
        c.arg("-drive").arg(spec);
    }
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start qemu-system-x86_64 (Debian qemu-system-x86)")?;
    let pid = child.id();
    // A watchdog ends qemu (by its pid) if the VM overruns, or has not
    // reached userspace in time.
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let timeout = b.timeout;
    let reached_userspace = Arc::new(AtomicBool::new(false));
    let watchdog = std::thread::spawn({
        let reached_userspace = reached_userspace.clone();
        move || {
            // SAFETY: kill(2) on the qemu we started.
            let kill = || unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let first = USERSPACE_WITHIN.min(timeout);
            if done_rx.recv_timeout(first).is_ok() {
                return Watchdog::Quiet;
            }
            if !reached_userspace.load(Ordering::SeqCst) {
                kill();
                return Watchdog::Hung;
            }
            if done_rx.recv_timeout(timeout.saturating_sub(first)).is_err() {
                kill();
                return Watchdog::TimedOut;
            }
            Watchdog::Quiet
        }
    });
    let mut console = String::new();
    let mut log = fs::File::create(&console_path)?;
    let stdout = child.stdout.take().context("qemu stdout")?;
    for line in BufReader::new(stdout).split(b'\n') {
        let line = String::from_utf8_lossy(&line?).replace('\r', "");
        writeln!(log, "{line}")?;
        console.push_str(&line);
        console.push('\n');
        if line.contains(USERSPACE) {
            reached_userspace.store(true, Ordering::SeqCst);
        }
        if line.starts_with("@@VM") || line.starts_with("@@NOTE") {
            note(line.trim_start_matches("@@"));
        }
        on_line(&line, started.elapsed().as_secs_f64());
    }
    let status = child.wait()?;
    let _ = done_tx.send(());
    let watchdog = watchdog.join().unwrap_or(Watchdog::Quiet);
    if watchdog == Watchdog::Hung {
        return Ok(Ended::HungBeforeUserspace);
    }
    let timed_out = watchdog == Watchdog::TimedOut;
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    let seconds = started.elapsed().as_secs_f64();
    let early_end = if timed_out {
        Some(format!("the VM did not finish within {}s and was killed", timeout.as_secs()))
    } else if !console.contains(DONE) {
        Some(format!("the VM stopped before the end ({status}); qemu said: {}", stderr.trim()))
    } else {
        None
    };
    note(format!("{}: {:.0}s, console in {}", b.label, seconds, console_path.display()));
    Ok(Ended::Run(VmRun { console, seconds, early_end }))
}

/// What the watchdog did.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Watchdog {
    Quiet,
    Hung,
    TimedOut,
}
