//! How the kernel programs are built: one definition for the agent's build
//! script and for `cargo xtask build-ebpf`, so both produce the same object
//! in the same place and each finds the other's work up to date.

use std::{
    borrow::ToOwned,
    ffi::OsString,
    format,
    path::{Path, PathBuf},
    process::Command,
    string::String,
};

/// The BPF target the programs are compiled for.
pub const TARGET: &str = "bpfel-unknown-none";
/// The package and binary name of the kernel programs.
pub const PACKAGE: &str = "swiftlet-ebpf";
const BIN: &str = "swiftlet";

/// Where the nested build keeps its artifacts: beside the host build, but in
/// a directory of its own (a nested cargo must not share the outer one's
/// lock), and shared by every host profile.
pub fn target_dir(workspace_root: &Path) -> PathBuf {
    workspace_root.join("target").join("ebpf")
}

/// The object file the build produces.
pub fn object_path(workspace_root: &Path) -> PathBuf {
    target_dir(workspace_root).join(TARGET).join("release").join(BIN)
}

/// The file pinning the nightly the kernel programs build with.
pub fn toolchain_file(workspace_root: &Path) -> PathBuf {
    workspace_root.join("ebpf").join("rust-toolchain.toml")
}

/// The pinned channel (`nightly-YYYY-MM-DD`) from [`toolchain_file`].
pub fn pinned_channel(workspace_root: &Path) -> Result<String, String> {
    let file = toolchain_file(workspace_root);
    let text = std::fs::read_to_string(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    parse_channel(&text).ok_or_else(|| format!("{}: no `channel = \"nightly-YYYY-MM-DD\"` line", file.display()))
}

fn parse_channel(toml: &str) -> Option<String> {
    toml.lines().find_map(|line| {
        let value = line.trim().strip_prefix("channel")?.trim_start().strip_prefix('=')?.trim();
        let channel = value.strip_prefix('"')?.strip_suffix('"')?;
        channel.strip_prefix("nightly-").filter(|date| date.len() == 10).map(|_| channel.to_owned())
    })
}

/// The rustup toolchain to build with: the pinned channel when rustup has it
/// under that name, or else the plain `nightly` when it is that same dated
/// build. rustup records an installed channel's date in its manifest, and
/// will not link a local toolchain under a dated channel's name, so a machine
/// that installed `nightly` on the pinned day (and cannot reach rustup's
/// server) still builds with exactly the pinned compiler.
pub fn toolchain(workspace_root: &Path) -> Result<String, String> {
    let pinned = pinned_channel(workspace_root)?;
    let date = pinned.trim_start_matches("nightly-");
    for candidate in [pinned.as_str(), "nightly"] {
        let Some(sysroot) = sysroot(candidate) else { continue };
        let manifest = sysroot.join("lib/rustlib/multirust-channel-manifest.toml");
        let installed = std::fs::read_to_string(&manifest).unwrap_or_default();
        if installed.lines().any(|l| l.trim() == format!("date = \"{date}\"")) {
            return Ok(candidate.to_owned());
        }
    }
    Err(format!(
        "the kernel programs build with {pinned} (pinned in {}), which rustup does not have; \
         install it with `rustup toolchain install {pinned} --component rust-src` or run `cargo xtask setup`",
        toolchain_file(workspace_root).display()
    ))
}

/// A toolchain's sysroot, if rustup has that toolchain.
pub fn sysroot(toolchain: &str) -> Option<PathBuf> {
    let out = Command::new("rustc").arg(format!("+{toolchain}")).args(["--print", "sysroot"]).output().ok()?;
    let path = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !path.trim().is_empty()).then(|| PathBuf::from(path.trim()))
}

/// `rustup run <pinned nightly> cargo build ...` for the kernel crate.
///
/// The flags: `bpf_target_arch` selects aya-ebpf's bindings; BTF and debug
/// info let the kernel print source lines in verifier errors; ISA v3 gives
/// 32-bit jumps and the atomic compare-and-exchange the programs use.
pub fn command(workspace_root: &Path, host_arch: &str, toolchain: &str) -> Command {
    let mut cmd = Command::new("rustup");
    cmd.current_dir(workspace_root)
        .args(["run", toolchain, "cargo", "build", "--package", PACKAGE, "--bins", "--release"])
        .args(["--target", TARGET, "-Z", "build-std=core"])
        .arg("--target-dir")
        .arg(target_dir(workspace_root));
    let flags = [
        format!("--cfg=bpf_target_arch=\"{host_arch}\""),
        "-Cdebuginfo=2".to_owned(),
        "-Clink-arg=--btf".to_owned(),
        "-Ctarget-cpu=v3".to_owned(),
        // Keep the global functions global (not internalized by LTO): the
        // verifier checks global functions once, on their own, rather than
        // in every state of every caller.
        "-Clink-arg=--export=swiftlet_execute_plan".to_owned(),
        "-Clink-arg=--export=swiftlet_resolve".to_owned(),
        "-Clink-arg=--export=swiftlet_evaluate".to_owned(),
        "-Clink-arg=--export=swiftlet_count_slot".to_owned(),
        "-Clink-arg=--export=swiftlet_memory_slot".to_owned(),
        // clippy never sees the BPF build, so warnings fail it here.
        "-Dwarnings".to_owned(),
    ];
    cmd.env("CARGO_ENCODED_RUSTFLAGS", OsString::from(flags.join("\x1f")));
    // The workspace's release LTO is for the agent; bpf-linker links the
    // programs' bitcode itself, as it always has.
    cmd.env("CARGO_PROFILE_RELEASE_LTO", "false");
    // And their optimisation level: the host's release profile optimises
    // for size; the verifier and the programs' cost want full optimisation.
    cmd.env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "3");
    // The outer cargo's compiler wrappers (clippy, sccache) and flags are for
    // the host, not for the nested nightly build.
    for key in
        ["RUSTC", "RUSTC_WRAPPER", "RUSTC_WORKSPACE_WRAPPER", "RUSTFLAGS", "CARGO_TARGET_DIR", "CARGO_BUILD_TARGET"]
    {
        cmd.env_remove(key);
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::parse_channel;

    #[test]
    fn the_channel_is_read_from_the_toolchain_file() {
        let file = "# comment\n[toolchain]\nchannel = \"nightly-2026-05-20\"\ncomponents = [\"rust-src\"]\n";
        assert_eq!(parse_channel(file).as_deref(), Some("nightly-2026-05-20"));
        assert_eq!(parse_channel("[toolchain]\nchannel=\"nightly-2026-05-20\"").as_deref(), Some("nightly-2026-05-20"));
        // An undated channel is not a pin.
        assert_eq!(parse_channel("[toolchain]\nchannel = \"nightly\"\n"), None);
        assert_eq!(parse_channel("[toolchain]\nchannel = \"stable\"\n"), None);
        assert_eq!(parse_channel(""), None);
    }
}
