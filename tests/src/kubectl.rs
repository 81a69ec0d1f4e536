//! Debian's kubectl (package kubernetes-client), run against a test's API
//! server with its own discovery cache.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

/// Where Debian's kubectl is: $SWIFTLET_TEST_KUBECTL (set by `cargo xtask
/// test`), the copy xtask unpacks when /usr/bin/kubectl belongs to another
/// package, or /usr/bin/kubectl when kubernetes-client is installed.
pub fn kubectl_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("SWIFTLET_TEST_KUBECTL") {
        return p.into();
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| "/root".into());
    let unpacked = home.join(".cache/swiftlet/kubernetes-client/usr/bin/kubectl");
    if unpacked.exists() {
        return unpacked;
    }
    let installed = Command::new("dpkg-query")
        .args(["-W", "-f=${db:Status-Status}", "kubernetes-client"])
        .output()
        .is_ok_and(|o| o.stdout == b"installed");
    if installed {
        return "/usr/bin/kubectl".into();
    }
    panic!(
        "Debian's kubectl (package kubernetes-client) is missing: `cargo xtask setup` installs it \
         (or set SWIFTLET_TEST_KUBECTL to a kubectl binary)"
    )
}

pub struct Kubectl {
    pub bin: PathBuf,
    pub kubeconfig: PathBuf,
    cache: tempfile::TempDir,
}

/// A current kubectl (the machine's /usr/bin/kubectl, 1.27 or later, or
/// $SWIFTLET_TEST_KUBECTL_CURRENT): what validates through OpenAPI v3.
pub fn current_kubectl_binary() -> PathBuf {
    let bin: PathBuf = std::env::var_os("SWIFTLET_TEST_KUBECTL_CURRENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/usr/bin/kubectl".into());
    let out = Command::new(&bin).args(["version", "--client", "-o", "json"]).output();
    let minor = out
        .ok()
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
        .and_then(|v| v["clientVersion"]["minor"].as_str().map(|m| m.trim_end_matches('+').to_owned()))
        .and_then(|m| m.parse::<u32>().ok());
    match minor {
        Some(m) if m >= 27 => bin,
        other => panic!(
            "this test needs kubectl 1.27 or later at {} (found minor version {other:?}); set SWIFTLET_TEST_KUBECTL_CURRENT",
            bin.display()
        ),
    }
}

impl Kubectl {
    /// [`Kubectl::new`] with a current kubectl ([`current_kubectl_binary`]).
    pub fn current(kubeconfig: &Path) -> Kubectl {
        Kubectl { bin: current_kubectl_binary(), ..Kubectl::new_with(PathBuf::new(), kubeconfig) }
    }

    fn new_with(bin: PathBuf, kubeconfig: &Path) -> Kubectl {
        Kubectl {
            bin,
            kubeconfig: kubeconfig.to_owned(),
            cache: tempfile::Builder::new()
                .prefix(&format!("kubectl-cache-{}-", std::process::id()))
                .tempdir()
                .expect("tempdir"),
        }
    }

    /// Runs with `stdin` fed to kubectl (`-f -`).
    pub fn run_with_input(&self, args: &[&str], stdin: &str) -> Output {
        use std::io::Write;
        let mut child = Command::new(&self.bin)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--cache-dir={}", self.cache.path().display()))
            .arg("--request-timeout=20s")
            .args(args)
            .env("HOME", self.cache.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.bin.display()));
        child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("write stdin");
        child.wait_with_output().expect("kubectl output")
    }

    pub fn new(kubeconfig: &Path) -> Kubectl {
        Kubectl {
            bin: kubectl_binary(),
            kubeconfig: kubeconfig.to_owned(),
            cache: tempfile::Builder::new()
                .prefix(&format!("kubectl-cache-{}-", std::process::id()))
                .tempdir()
                .expect("tempdir"),
        }
    }

    pub fn run(&self, args: &[&str]) -> Output {
        Command::new(&self.bin)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--cache-dir={}", self.cache.path().display()))
            .arg("--request-timeout=20s")
            .args(args)
            .env("HOME", self.cache.path())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.bin.display()))
    }

    /// Runs and returns stdout; panics with stderr when kubectl fails.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "kubectl {} failed ({}):\nstdout: {stdout}\nstderr: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// kubectl's version line (to say which kubectl a test used).
    pub fn version(&self) -> String {
        let out = Command::new(&self.bin).args(["version", "--client", "--short"]).output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_default()
    }
}

/// Rows of `kubectl get` output as columns (split on runs of spaces),
/// header first.
pub fn table(text: &str) -> Vec<Vec<String>> {
    text.lines().map(|l| l.split_whitespace().map(str::to_owned).collect()).collect()
}
