//! How the kernel programs are built: one definition for the agent's build
//! script and for `cargo xtask build-ebpf`, so both produce the same object
//! in the same place and each finds the other's work up to date.

use std::{
    borrow::ToOwned,
    ffi::OsString,
    format,
    path::{Path, PathBuf},
    process::Command,
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

/// `rustup run nightly cargo build ...` for the kernel crate.
///
/// The flags: `bpf_target_arch` selects aya-ebpf's bindings; BTF and debug
/// info let the kernel print source lines in verifier errors; ISA v3 gives
/// 32-bit jumps and the atomic compare-and-exchange the programs use.
pub fn command(workspace_root: &Path, host_arch: &str) -> Command {
    let mut cmd = Command::new("rustup");
    cmd.current_dir(workspace_root)
        .args(["run", "nightly", "cargo", "build", "--package", PACKAGE, "--bins", "--release"])
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
