//! Running external commands with progress output and errors that say what to do.

use std::{
    ffi::OsStr,
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

/// Prints a progress line in a form that stands out from cargo's own output.
pub fn step(msg: impl AsRef<str>) {
    eprintln!("\x1b[1;36m==>\x1b[0m {}", msg.as_ref());
}

/// Prints a secondary line under the current step.
pub fn note(msg: impl AsRef<str>) {
    eprintln!("    {}", msg.as_ref());
}

/// Describes a command for messages: program and arguments, space-separated.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs a command with inherited stdio and fails when it exits non-zero.
pub fn run(cmd: &mut Command) -> Result<()> {
    let started = Instant::now();
    let status = cmd.status().with_context(|| format!("cannot start `{}`", describe(cmd)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", describe(cmd));
    }
    let secs = started.elapsed().as_secs_f64();
    if secs > 5.0 {
        note(format!("done in {secs:.1}s"));
    }
    Ok(())
}

/// Runs a command and returns its stdout; stderr is shown only if it fails.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("cannot start `{}`", describe(cmd)))?;
    if !out.status.success() {
        bail!("`{}` failed ({}): {}", describe(cmd), out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// True when the command starts and exits zero; all output is discarded.
pub fn succeeds(program: impl AsRef<OsStr>, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// The workspace root: xtask lives one level below it.
pub fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask has a parent directory")
}
