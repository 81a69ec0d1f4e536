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

/// The machine's current kubectl (v1.32 here, WebSocket first, 1.27 or
/// later so that it validates through OpenAPI v3): the versioned binary
/// behind Google Cloud SDK's dispatcher when present (the dispatcher would
/// pick another version to match the server's), else
/// $SWIFTLET_TEST_KUBECTL_CURRENT, else /usr/bin/kubectl.
pub fn current_kubectl_binary() -> PathBuf {
    let bin = match std::env::var_os("SWIFTLET_TEST_KUBECTL_CURRENT") {
        Some(p) => PathBuf::from(p),
        None => {
            let versioned = PathBuf::from("/usr/lib/google-cloud-sdk/bin/kubectl.1.32");
            if versioned.exists() { versioned } else { PathBuf::from("/usr/bin/kubectl") }
        }
    };
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

pub struct Kubectl {
    pub bin: PathBuf,
    pub kubeconfig: PathBuf,
    cache: tempfile::TempDir,
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
        Kubectl::with_binary(kubectl_binary(), kubeconfig)
    }

    /// A kubectl of the caller's choice ([`current_kubectl_binary`], say).
    pub fn with_binary(bin: PathBuf, kubeconfig: &Path) -> Kubectl {
        Kubectl {
            bin,
            kubeconfig: kubeconfig.to_owned(),
            cache: tempfile::Builder::new()
                .prefix(&format!("kubectl-cache-{}-", std::process::id()))
                .tempdir()
                .expect("tempdir"),
        }
    }

    pub fn run(&self, args: &[&str]) -> Output {
        let mut a = vec!["--request-timeout=20s"];
        a.extend_from_slice(args);
        self.command(&a).output().unwrap_or_else(|e| panic!("cannot run {}: {e}", self.bin.display()))
    }

    /// The command `run` runs, to spawn it with pipes of one's own.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--cache-dir={}", self.cache.path().display()))
            .args(args)
            .env("HOME", self.cache.path());
        c
    }

    /// The command line `command` runs, quoted for a shell (tmux).
    pub fn shell_line(&self, args: &[&str]) -> String {
        let mut parts = vec![
            self.bin.display().to_string(),
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--cache-dir={}", self.cache.path().display()),
        ];
        parts.extend(args.iter().map(|a| (*a).to_owned()));
        let quoted: Vec<String> = parts.iter().map(|p| format!("'{}'", p.replace('\'', "'\\''"))).collect();
        format!("HOME='{}' {}", self.cache.path().display(), quoted.join(" "))
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
        let out = Command::new(&self.bin).args(["version", "--client"]).output();
        let text = out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_default();
        text.lines().next().unwrap_or_default().to_owned()
    }
}

/// Rows of `kubectl get` output as columns (split on runs of spaces),
/// header first.
pub fn table(text: &str) -> Vec<Vec<String>> {
    text.lines().map(|l| l.split_whitespace().map(str::to_owned).collect()).collect()
}
