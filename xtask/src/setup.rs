//! Installs every prerequisite of the build, the tests and the demo.
//!
//! Each step checks before it installs, so a warm machine passes through in
//! about a second. The eBPF recipe follows TOOLCHAIN.md: the nightly's
//! rust-src, and bpf-linker linked against the LLVM that ships inside the
//! nightly (Debian has no LLVM new enough to read the nightly's bitcode).

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::cmd::{self, note, step};

/// The bpf-linker release that links against LLVM 22.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Debian packages, grouped by what needs them.
pub const APT_BUILD: &[&str] = &["protobuf-compiler", "libprotobuf-dev", "gcc", "libc6-dev"];
/// e2fsprogs, btrfs-progs: the test CSI driver formats and grows its volumes (mkfs.ext4, resize2fs;
/// mkfs.btrfs and `btrfs filesystem resize`, which grows online where resize2fs lacks CAP_SYS_RESOURCE).
pub const APT_RUNTIME: &[&str] =
    &["containerd", "runc", "busybox-static", "iproute2", "containernetworking-plugins", "e2fsprogs", "btrfs-progs"];
/// Debian's kubectl, which the API server tests drive (see `ensure_kubectl`).
pub const KUBECTL_PACKAGE: &str = "kubernetes-client";
/// The eviction race compares against earlyoom.
pub const APT_BENCH: &[&str] = &["earlyoom"];
/// The kubelet API's tests: promtool and a real Prometheus (package
/// prometheus) check the metrics endpoints; `swiftlet top` runs under tmux.
pub const APT_TEST: &[&str] = &["prometheus", "tmux"];
/// The kernel matrix boots Debian's kernels under emulation (installed with
/// --no-install-recommends, as every package here).
pub const APT_VM: &[&str] = &["qemu-system-x86"];
/// The node VM's disk is made with debootstrap and mkfs.ext4 -d; the 6.12
/// kernel's modules are xz-compressed.
pub const APT_NODE_VM: &[&str] = &["debootstrap", "e2fsprogs", "xz-utils"];

/// What the eBPF build needs on PATH.
pub struct EbpfToolchain {
    /// Directory holding `bpf-linker`, to put first on PATH for cargo.
    pub bin_dir: PathBuf,
}

impl EbpfToolchain {
    /// A PATH value with bpf-linker's directory first.
    pub fn path_env(&self) -> std::ffi::OsString {
        let mut paths = vec![self.bin_dir.clone()];
        if let Some(p) = env::var_os("PATH") {
            paths.extend(env::split_paths(&p));
        }
        env::join_paths(paths).expect("PATH entries contain no separator")
    }
}

pub fn require_root(why: &str) -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "{why} needs root (it loads eBPF programs, creates cgroups and starts containerd); run it with sudo or as root"
        );
    }
    Ok(())
}

/// Installs the Debian packages that are missing, in one apt-get call.
pub fn ensure_apt(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !apt_installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    require_root("installing Debian packages")?;
    step(format!("installing Debian packages: {}", missing.join(" ")));
    let install = || {
        let mut c = Command::new("apt-get");
        c.env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing);
        cmd::run(&mut c)
    };
    if install().is_err() {
        note("apt-get install failed; refreshing package lists and retrying once");
        cmd::run(Command::new("apt-get").args(["update", "-q"]))?;
        install().context("cannot install Debian packages; check that the Debian mirror is reachable")?;
    }
    Ok(())
}

fn apt_installed(package: &str) -> bool {
    cmd::output(Command::new("dpkg-query").args(["-W", "-f=${db:Status-Status}", package]))
        .map(|s| s.trim() == "installed")
        .unwrap_or(false)
}

/// Makes sure the stable toolchain has clippy and rustfmt, which `test` runs.
pub fn ensure_host_components() -> Result<()> {
    for (component, probe) in [("clippy", "cargo-clippy"), ("rustfmt", "rustfmt")] {
        if !cmd::succeeds(probe, &["--version"]) {
            step(format!("installing rustup component {component}"));
            cmd::run(Command::new("rustup").args(["component", "add", component])).with_context(|| {
                format!("cannot add the {component} component; run `rustup component add {component}`")
            })?;
        }
    }
    Ok(())
}

/// The pinned nightly (ebpf/rust-toolchain.toml) and its sysroot, installing
/// it when rustup has neither it nor a plain `nightly` of the same date.
fn pinned_nightly() -> Result<(String, PathBuf)> {
    let root = cmd::workspace_root();
    let pinned = swiftlet_common::build::pinned_channel(root).map_err(anyhow::Error::msg)?;
    if swiftlet_common::build::toolchain(root).is_err() {
        step(format!("installing the pinned nightly {pinned} (ebpf/rust-toolchain.toml)"));
        cmd::run(
            Command::new("rustup")
                .args(["toolchain", "install", &pinned, "--profile", "minimal"])
                .args(["--component", "rust-src"]),
        )
        .with_context(|| {
            format!(
                "the eBPF programs build with {pinned}, pinned in ebpf/rust-toolchain.toml, and rustup cannot \
                 install it; install it by hand (`rustup toolchain install {pinned} --component rust-src`)"
            )
        })?;
    }
    let toolchain = swiftlet_common::build::toolchain(root).map_err(anyhow::Error::msg)?;
    let sysroot = swiftlet_common::build::sysroot(&toolchain)
        .with_context(|| format!("rustup has {toolchain} but `rustc +{toolchain} --print sysroot` fails"))?;
    Ok((toolchain, sysroot))
}

/// The nightly's bundled LLVM shared library (found by glob, not by name, so a
/// new nightly keeps working). `libLLVM-<ver>.so` beside it is a linker script
/// pointing at this file, which lld cannot follow from another directory, so
/// only the real ELF (`libLLVM.so.<ver>`) qualifies.
fn nightly_libllvm(sysroot: &Path) -> Result<PathBuf> {
    let lib = sysroot.join("lib");
    let mut found: Vec<PathBuf> = fs::read_dir(&lib)
        .with_context(|| format!("cannot read {}", lib.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libLLVM.so.")))
        .collect();
    found.sort();
    found.into_iter().next().with_context(|| {
        format!("the nightly at {} ships no libLLVM; bpf-linker needs the nightly's own LLVM", sysroot.display())
    })
}

/// ~/.cache/swiftlet: what xtask downloads or builds once per machine.
pub fn cache_dir() -> PathBuf {
    let home = env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"));
    home.join(".cache").join("swiftlet")
}

fn cargo_bin_dir() -> PathBuf {
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cargo"));
    cargo_home.join("bin")
}

/// rust-src for the nightly, then bpf-linker against the nightly's LLVM.
pub fn ensure_ebpf_toolchain() -> Result<EbpfToolchain> {
    let (toolchain, sysroot) = pinned_nightly()?;
    if !sysroot.join("lib/rustlib/src/rust/library/core/Cargo.toml").exists() {
        step(format!("installing {toolchain}'s rust-src (needed by -Z build-std=core)"));
        cmd::run(Command::new("rustup").args([&format!("+{toolchain}"), "component", "add", "rust-src"]))
            .with_context(|| format!("cannot add rust-src; run `rustup +{toolchain} component add rust-src`"))?;
    }

    let bin_dir = cargo_bin_dir();
    let linker = bin_dir.join("bpf-linker");
    if bpf_linker_works(&linker) {
        return Ok(EbpfToolchain { bin_dir });
    }
    let libllvm = nightly_libllvm(&sysroot)?;
    step(format!(
        "installing bpf-linker {BPF_LINKER_VERSION} against the nightly's LLVM ({}); about a minute",
        libllvm.file_name().unwrap_or_default().to_string_lossy()
    ));
    // An LLVM "prefix" holding only the shared library, under both the name
    // the linker asks for (libLLVM.so) and its own name, which the rpath of the
    // installed binary resolves at run time.
    let prefix = cache_dir().join("llvm-rust");
    let prefix_lib = prefix.join("lib");
    fs::create_dir_all(&prefix_lib).with_context(|| format!("cannot create {}", prefix_lib.display()))?;
    for name in [std::ffi::OsString::from("libLLVM.so"), libllvm.file_name().unwrap_or_default().to_os_string()] {
        let link = prefix_lib.join(&name);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&libllvm, &link)
            .with_context(|| format!("cannot create symlink {}", link.display()))?;
    }
    cmd::run(
        Command::new("cargo")
            .env("LLVM_PREFIX", &prefix)
            .args(["install", "bpf-linker", "--force", "--locked", "--version", BPF_LINKER_VERSION])
            .args(["--no-default-features", "--features", "llvm-22"]),
    )
    .context("cannot build bpf-linker; see cargo's error above")?;
    if !bpf_linker_works(&linker) {
        bail!("{} was installed but does not run; check that {} exists", linker.display(), libllvm.display());
    }
    Ok(EbpfToolchain { bin_dir })
}

/// bpf-linker's rpath points into the nightly: when the nightly changes, the
/// binary stops starting, so "installed" means "runs and is our version".
fn bpf_linker_works(linker: &Path) -> bool {
    cmd::output(Command::new(linker).arg("--version")).map(|v| v.contains(BPF_LINKER_VERSION)).unwrap_or(false)
}

/// Everything `test` and `run` need, in order; returns the eBPF toolchain.
pub fn all() -> Result<EbpfToolchain> {
    let started = std::time::Instant::now();
    step("checking prerequisites");
    ensure_host_components()?;
    ensure_apt(APT_BUILD)?;
    ensure_apt(APT_RUNTIME)?;
    ensure_apt(APT_TEST)?;
    let tc = ensure_ebpf_toolchain()?;
    ensure_tracefs()?;
    ensure_kubectl()?;
    note(format!("prerequisites ready in {:.1}s", started.elapsed().as_secs_f64()));
    Ok(tc)
}

/// Debian's kubectl (package kubernetes-client), for the API server tests;
/// returns its path. Installed with apt; when another package already owns
/// /usr/bin/kubectl (Google Cloud SDK's `kubectl`, for one), the Debian
/// package is unpacked under ~/.cache/swiftlet/kubernetes-client instead,
/// so the machine's own kubectl is left alone.
pub fn ensure_kubectl() -> Result<PathBuf> {
    let system = PathBuf::from("/usr/bin/kubectl");
    if apt_installed(KUBECTL_PACKAGE) {
        return Ok(system);
    }
    let unpacked_root = cache_dir().join(KUBECTL_PACKAGE);
    let unpacked = unpacked_root.join("usr/bin/kubectl");
    if cmd::succeeds(&unpacked, &["version", "--client"]) {
        return Ok(unpacked);
    }
    let owner = cmd::output(Command::new("dpkg-query").args(["-S", "/usr/bin/kubectl"])).ok();
    if !system.exists() && owner.is_none() {
        ensure_apt(&[KUBECTL_PACKAGE])?;
        return Ok(system);
    }
    require_root("installing kubectl")?;
    step(format!(
        "unpacking Debian's {KUBECTL_PACKAGE} into {} (/usr/bin/kubectl belongs to {})",
        unpacked_root.display(),
        owner.as_deref().and_then(|o| o.split(':').next()).unwrap_or("another install")
    ));
    let download_dir = cache_dir().join("debs");
    fs::create_dir_all(&download_dir).with_context(|| format!("cannot create {}", download_dir.display()))?;
    let download =
        || cmd::run(Command::new("apt-get").current_dir(&download_dir).args(["download", "-q", KUBECTL_PACKAGE]));
    if download().is_err() {
        note("apt-get download failed; refreshing package lists and retrying once");
        cmd::run(Command::new("apt-get").args(["update", "-q"]))?;
        download().context("cannot download kubernetes-client; check that the Debian mirror is reachable")?;
    }
    let deb = fs::read_dir(&download_dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("kubernetes-client_") && n.ends_with(".deb"))
        })
        .max()
        .context("apt-get download left no kubernetes-client .deb")?;
    let _ = fs::remove_dir_all(&unpacked_root);
    cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked_root))?;
    if !cmd::succeeds(&unpacked, &["version", "--client"]) {
        bail!("{} was unpacked but does not run", unpacked.display());
    }
    Ok(unpacked)
}

/// Tracepoint attachment reads event ids from tracefs.
pub fn ensure_tracefs() -> Result<()> {
    let events = Path::new("/sys/kernel/tracing/events");
    if events.exists() || Path::new("/sys/kernel/debug/tracing/events").exists() {
        return Ok(());
    }
    require_root("mounting tracefs")?;
    step("mounting tracefs at /sys/kernel/tracing");
    cmd::run(Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]))
}

/// Builds the kernel programs with visible progress (the agent's build
/// script then finds them up to date).
pub fn build_ebpf(tc: &EbpfToolchain) -> Result<()> {
    step("building the eBPF programs (nightly, bpfel-unknown-none)");
    let root = cmd::workspace_root();
    let toolchain = swiftlet_common::build::toolchain(root).map_err(anyhow::Error::msg)?;
    let mut c = swiftlet_common::build::command(root, std::env::consts::ARCH, &toolchain);
    c.env("PATH", tc.path_env());
    cmd::run(&mut c)?;
    note(format!("object: {}", swiftlet_common::build::object_path(root).display()));
    Ok(())
}
