//! `cargo xtask package`: the Debian package an operator installs on a
//! node, built with dpkg-deb from a staged tree:
//!
//! | path | from |
//! |---|---|
//! | `/usr/bin/swiftlet` | the release build (debug info stripped) |
//! | `/usr/lib/systemd/system/swiftlet.service` | `deploy/systemd/` |
//! | `/usr/lib/systemd/system/swiftlet.service.d/10-swiftlet.conf` | the kubeadm-style drop-in, where kubeadm's package puts the kubelet's |
//! | `/usr/share/swiftlet/prometheus/` | the alerts and their unit tests |
//! | `/usr/share/swiftlet/grafana/` | the eviction dashboard |
//! | `/usr/share/doc/swiftlet/` | copyright, README |
//!
//! with `deploy/debian/`'s maintainer scripts (never started beside a
//! running kubelet; restarted on upgrade only where it ran; a removal that
//! would leave the node without an agent refused).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    cmd::{self, note, step},
    setup,
};

#[derive(clap::Args)]
pub struct Args {
    /// Package the dev-profile binary instead of a release build (quicker;
    /// for trying the maintainer scripts, not for nodes).
    #[arg(long)]
    debug: bool,
    /// The package's version (default: the workspace's).
    #[arg(long)]
    version: Option<String>,
    /// Where the .deb goes (default target/package).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// What the package's control file says.
struct Control<'a> {
    version: &'a str,
    arch: &'a str,
    installed_kib: u64,
}

impl Control<'_> {
    fn render(&self) -> String {
        format!(
            "Package: swiftlet\n\
             Version: {version}\n\
             Architecture: {arch}\n\
             Maintainer: swiftlet developers <swiftlet@swiftlet.dev>\n\
             Installed-Size: {kib}\n\
             Depends: libc6 (>= 2.36), systemd\n\
             Recommends: containerd\n\
             Section: admin\n\
             Priority: optional\n\
             Homepage: https://github.com/swiftlet-dev/swiftlet\n\
             Description: Kubernetes node agent (kubelet) with in-kernel eviction\n \
             swiftlet runs the pods bound to its node through a CRI runtime, as the\n \
             kubelet does, with the kubelet's flags, configuration file, ports and\n \
             metrics. Its eviction runs in the kernel through eBPF: memory, process\n \
             and inode pressure is seen at the crossing and a pre-ranked victim is\n \
             killed there, before the kernel OOM killer.\n \
             .\n \
             It replaces kubelet.service (the unit conflicts with it) and reads\n \
             kubeadm's files, so `kubeadm join` configures it alike.\n",
            version = self.version,
            arch = self.arch,
            kib = self.installed_kib,
        )
    }
}

/// The files of the package: (path in the package, source, mode).
fn payload(root: &Path, binary: &Path) -> Vec<(&'static str, PathBuf, u32)> {
    let deploy = root.join("deploy");
    vec![
        ("usr/bin/swiftlet", binary.to_owned(), 0o755),
        ("usr/lib/systemd/system/swiftlet.service", deploy.join("systemd/swiftlet.service"), 0o644),
        ("usr/lib/systemd/system/swiftlet.service.d/10-swiftlet.conf", deploy.join("systemd/10-swiftlet.conf"), 0o644),
        ("usr/share/swiftlet/prometheus/swiftlet.rules.yaml", deploy.join("prometheus/swiftlet.rules.yaml"), 0o644),
        (
            "usr/share/swiftlet/prometheus/swiftlet.rules.test.yaml",
            deploy.join("prometheus/swiftlet.rules.test.yaml"),
            0o644,
        ),
        ("usr/share/swiftlet/grafana/swiftlet-eviction.json", deploy.join("grafana/swiftlet-eviction.json"), 0o644),
        ("usr/share/doc/swiftlet/README.md", root.join("README.md"), 0o644),
    ]
}

const SCRIPTS: &[&str] = &["postinst", "prerm", "postrm"];

/// The workspace's version, from its Cargo.toml.
fn workspace_version(root: &Path) -> Result<String> {
    let text = fs::read_to_string(root.join("Cargo.toml"))?;
    text.lines()
        .skip_while(|l| l.trim() != "[workspace.package]")
        .find_map(|l| l.trim().strip_prefix("version = ").map(|v| v.trim_matches('"').to_owned()))
        .context("no version in Cargo.toml's [workspace.package]")
}

/// `cargo xtask package`: builds swiftlet and its .deb; returns its path.
pub fn run(args: Args) -> Result<PathBuf> {
    let root = cmd::workspace_root();
    let tc = setup::all()?;
    setup::build_ebpf(&tc)?;
    let profile = if args.debug { "debug" } else { "release" };
    step(format!("building swiftlet ({profile})"));
    let mut build = Command::new("cargo");
    build.current_dir(root).env("PATH", tc.path_env()).args(["build", "-p", "swiftlet", "--bin", "swiftlet"]);
    if !args.debug {
        build.arg("--release");
    }
    cmd::run(&mut build)?;
    let version = match args.version {
        Some(v) => v,
        None => workspace_version(root)?,
    };
    let out = args.out.unwrap_or_else(|| root.join("target/package"));
    build_deb(root, &root.join("target").join(profile).join("swiftlet"), &version, &out)
}

/// Stages the tree and runs dpkg-deb; returns the package's path.
pub fn build_deb(root: &Path, binary: &Path, version: &str, out: &Path) -> Result<PathBuf> {
    let arch = cmd::output(Command::new("dpkg").arg("--print-architecture"))
        .context("dpkg --print-architecture (a Debian host)")?
        .trim()
        .to_owned();
    let stage = out.join(format!("swiftlet_{version}_{arch}"));
    let _ = fs::remove_dir_all(&stage);
    let mut bytes = 0;
    for (path, source, mode) in payload(root, binary) {
        let dest = stage.join(path);
        fs::create_dir_all(dest.parent().context("a file has a parent")?)?;
        if path == "usr/bin/swiftlet" {
            // Debug info is half the binary and no use on a node.
            cmd::run(Command::new("objcopy").arg("--strip-debug").arg(&source).arg(&dest))
                .context("objcopy (binutils)")?;
        } else {
            fs::copy(&source, &dest).with_context(|| format!("cannot copy {}", source.display()))?;
        }
        fs::set_permissions(&dest, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        bytes += fs::metadata(&dest)?.len();
    }
    let copyright = stage.join("usr/share/doc/swiftlet/copyright");
    fs::write(
        &copyright,
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
         Upstream-Name: swiftlet\n\nFiles: *\nCopyright: swiftlet developers\nLicense: Apache-2.0\n \
         On Debian systems, the full text of the Apache License 2.0 is in\n \
         /usr/share/common-licenses/Apache-2.0.\n",
    )?;
    let debian = stage.join("DEBIAN");
    fs::create_dir_all(&debian)?;
    for s in SCRIPTS {
        let dest = debian.join(s);
        fs::copy(root.join("deploy/debian").join(s), &dest)?;
        fs::set_permissions(&dest, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    }
    let control = Control { version, arch: &arch, installed_kib: bytes.div_ceil(1024) };
    fs::write(debian.join("control"), control.render())?;
    let deb = out.join(format!("swiftlet_{version}_{arch}.deb"));
    cmd::run(Command::new("dpkg-deb").args(["--root-owner-group", "-Zxz", "--build"]).arg(&stage).arg(&deb))?;
    if !deb.exists() {
        bail!("dpkg-deb wrote no {}", deb.display());
    }
    note(format!("{} ({:.1} MiB installed)", deb.display(), bytes as f64 / f64::from(1 << 20)));
    Ok(deb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_file_has_every_field_dpkg_needs() {
        let c = Control { version: "0.1.0", arch: "amd64", installed_kib: 12345 }.render();
        for field in ["Package: swiftlet", "Version: 0.1.0", "Architecture: amd64", "Installed-Size: 12345"] {
            assert!(c.lines().any(|l| l == field), "{field} in\n{c}");
        }
        assert!(c.contains("Maintainer: ") && c.contains("Description: "), "{c}");
        // Description continuation lines start with a space; a blank one is " .".
        let after = c.lines().skip_while(|l| !l.starts_with("Description:")).skip(1);
        assert!(after.clone().all(|l| l.starts_with(' ')), "{c}");
        assert!(after.clone().any(|l| l == " ."), "{c}");
    }

    #[test]
    fn every_payload_file_and_script_is_in_the_repository() {
        let root = cmd::workspace_root();
        for (path, source, _) in payload(root, Path::new("/bin/true")) {
            assert!(source.exists(), "{path}: {} is missing", source.display());
        }
        for s in SCRIPTS {
            assert!(root.join("deploy/debian").join(s).exists(), "deploy/debian/{s}");
        }
        assert!(workspace_version(root).is_ok_and(|v| !v.is_empty()));
    }

    /// Runs a maintainer script with a stub `systemctl` (logging its calls;
    /// `is-active` true for the units in `active`) in a mount namespace
    /// whose /run has /run/systemd/system, as on a systemd node; returns
    /// (exit status, systemctl calls, stderr).
    fn script(name: &str, args: &[&str], active: &[&str], env: &[(&str, &str)]) -> (i32, Vec<String>, String) {
        let dir = tempfile_dir();
        let log = dir.join("calls");
        let stub = dir.join("systemctl");
        fs::write(
            &stub,
            format!(
                "#!/bin/sh\necho \"$*\" >> {log}\nif [ \"$1\" = is-active ]; then\n  for u in {active}; do [ \"$u\" = \"$3\" ] && exit 0; done\n  exit 3\nfi\nexit 0\n",
                log = log.display(),
                active = active.join(" "),
            ),
        )
        .unwrap();
        fs::set_permissions(&stub, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let script = cmd::workspace_root().join("deploy/debian").join(name);
        let out = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg("mount -t tmpfs swiftlet-test /run && mkdir -p /run/systemd/system && exec sh \"$@\"")
            .arg("sh")
            .arg(&script)
            .args(args)
            .env("PATH", format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", dir.display()))
            .envs(env.iter().copied())
            .output()
            .expect("unshare (util-linux)");
        let calls = fs::read_to_string(&log).unwrap_or_default().lines().map(str::to_owned).collect();
        let _ = fs::remove_dir_all(&dir);
        (out.status.code().unwrap_or(-1), calls, String::from_utf8_lossy(&out.stderr).into_owned())
    }

    fn tempfile_dir() -> PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("swiftlet-pkg-test-{}-{n}", std::process::id()));
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn changes(calls: &[String]) -> Vec<&str> {
        calls.iter().map(String::as_str).filter(|c| !c.starts_with("is-active") && *c != "daemon-reload").collect()
    }

    #[test]
    fn maintainer_scripts_never_start_beside_the_kubelet_nor_leave_the_node_without_an_agent() {
        if unsafe_not_root() {
            panic!("this test needs root (a mount namespace for /run/systemd/system); run it as root");
        }
        // A fresh install: started where no kubelet runs, left alone where one does.
        let (rc, calls, _) = script("postinst", &["configure", ""], &[], &[]);
        assert_eq!((rc, changes(&calls)), (0, vec!["enable swiftlet.service", "start swiftlet.service"]));
        let (rc, calls, err) = script("postinst", &["configure", ""], &["kubelet.service"], &[]);
        assert_eq!((rc, changes(&calls)), (0, vec![]));
        assert!(err.contains("systemctl disable --now kubelet && systemctl enable --now swiftlet"), "{err}");
        // An upgrade restarts it only where it ran.
        let (rc, calls, _) = script("postinst", &["configure", "0.0.9"], &["swiftlet.service"], &[]);
        assert_eq!((rc, changes(&calls)), (0, vec!["restart swiftlet.service"]));
        let (rc, calls, _) = script("postinst", &["configure", "0.0.9"], &[], &[]);
        assert_eq!((rc, changes(&calls)), (0, vec![]));
        // An upgrade's prerm leaves it running.
        let (rc, calls, _) = script("prerm", &["upgrade", "0.2.0"], &["swiftlet.service"], &[]);
        assert_eq!((rc, changes(&calls)), (0, vec![]));
        // Removing the node's running agent is refused unless meant.
        let (rc, calls, err) = script("prerm", &["remove"], &["swiftlet.service"], &[]);
        assert_eq!((rc, changes(&calls)), (1, vec![]));
        assert!(err.contains("SWIFTLET_REMOVE_WITHOUT_AGENT=1"), "{err}");
        let (rc, calls, _) =
            script("prerm", &["remove"], &["swiftlet.service"], &[("SWIFTLET_REMOVE_WITHOUT_AGENT", "1")]);
        assert_eq!((rc, changes(&calls)), (0, vec!["stop swiftlet.service", "disable swiftlet.service"]));
        let (rc, calls, _) = script("prerm", &["remove"], &[], &[]);
        assert_eq!((rc, changes(&calls)), (0, vec!["stop swiftlet.service", "disable swiftlet.service"]));
        let (rc, calls, _) = script("postrm", &["purge"], &[], &[]);
        assert_eq!((rc, calls), (0, vec!["daemon-reload".to_owned()]));
    }

    fn unsafe_not_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() != 0 }
    }
}
