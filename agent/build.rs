//! Builds the kernel programs and hands the object to the agent, which embeds
//! it. `SWIFTLET_EBPF_OBJECT=<path>` uses a prebuilt object instead.
//!
//! Also generates the gRPC APIs the kubelet speaks to node plugins, with
//! tonic-prost-build, as k8s-cri generates the CRI: client and server, so
//! the in-repo test plugins serve the same types the agent dials:
//! - proto/deviceplugin/v1beta1: device plugins;
//! - proto/pluginregistration/v1: the plugin watcher's registration;
//! - proto/csi/v1: the Container Storage Interface (spec v1.9.0).

use std::{env, fs, path::PathBuf, process::Command};

use swiftlet_common::build;

fn main() {
    plugin_apis();
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dest = out.join("swiftlet-ebpf.o");
    println!("cargo:rerun-if-env-changed=SWIFTLET_EBPF_OBJECT");
    if let Some(prebuilt) = env::var_os("SWIFTLET_EBPF_OBJECT") {
        let prebuilt = PathBuf::from(prebuilt);
        println!("cargo:rerun-if-changed={}", prebuilt.display());
        copy(&prebuilt, &dest);
        return;
    }

    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the agent crate sits inside the workspace")
        .to_path_buf();
    for watched in
        ["ebpf/src", "ebpf/Cargo.toml", "ebpf/build.rs", "ebpf/rust-toolchain.toml", "common/src", "common/Cargo.toml"]
    {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    if Command::new("bpf-linker").arg("--version").output().is_err() {
        fail("bpf-linker is not on PATH; run `cargo xtask setup` (it installs bpf-linker against the nightly's LLVM)");
    }
    let host_arch = env::var("CARGO_CFG_TARGET_ARCH").expect("cargo sets CARGO_CFG_TARGET_ARCH");
    let toolchain = build::toolchain(&root).unwrap_or_else(|e| fail(&e));
    let mut cmd = build::command(&root, &host_arch, &toolchain);
    match cmd.output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            for line in String::from_utf8_lossy(&o.stderr).lines() {
                println!("cargo:warning={line}");
            }
            fail(
                "building the eBPF programs failed (see the warnings above); `cargo xtask build-ebpf` shows the full output",
            );
        }
        Err(e) => fail(&format!("cannot run rustup to build the eBPF programs: {e}")),
    }
    copy(&build::object_path(&root), &dest);
}

fn plugin_apis() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("proto");
    for proto in ["deviceplugin/v1beta1/api.proto", "pluginregistration/v1/api.proto", "csi/v1/csi.proto"] {
        let file = dir.join(proto);
        println!("cargo:rerun-if-changed={}", file.display());
        if let Err(e) = tonic_prost_build::configure().compile_protos(&[&file], &[&dir]) {
            fail(&format!("generating the API in {}: {e} (protoc comes with `cargo xtask setup`)", file.display()));
        }
    }
}

fn copy(from: &std::path::Path, to: &std::path::Path) {
    if let Err(e) = fs::copy(from, to) {
        fail(&format!("cannot copy the eBPF object {}: {e}", from.display()));
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1);
}
