//! Prometheus and promtool from Debian's `prometheus` package, for the
//! tests that check what a monitoring stack sees: a real server started on
//! a free port with the test's configuration, queried over its HTTP API,
//! and stopped (by its PID) when dropped.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use crate::kubelet::{free_port, plain_get};

/// promtool, or a panic naming the package that has it.
pub fn promtool() -> &'static str {
    require("promtool");
    "promtool"
}

fn require(binary: &str) {
    if Command::new(binary).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
        panic!("this test needs {binary} (Debian package prometheus; `cargo xtask test` installs it)");
    }
}

/// A Prometheus server started by the test.
pub struct Prometheus {
    child: Child,
    pub port: u16,
    log: PathBuf,
}

impl Prometheus {
    /// Starts Prometheus on `config` (written to `dir/prometheus.yml`),
    /// with its TSDB and log under `dir`.
    pub fn start(dir: &Path, config: &str) -> Prometheus {
        require("prometheus");
        let port = free_port();
        std::fs::write(dir.join("prometheus.yml"), config).expect("write prometheus.yml");
        let log = dir.join("prometheus.log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("prometheus log"))
            .spawn()
            .expect("start prometheus");
        Prometheus { child, port, log }
    }

    /// The result vector of an instant query (None: Prometheus did not
    /// answer); a query Prometheus refuses fails the test.
    pub fn query(&self, expr: &str) -> Option<Vec<serde_json::Value>> {
        let path = format!("/api/v1/query?query={}", encode(expr));
        let (status, body) = plain_get(SocketAddr::from(([127, 0, 0, 1], self.port)), &path).ok()?;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        assert!(status == 200 && v["status"] == "success", "Prometheus refused {expr}: {body}");
        v["data"]["result"].as_array().cloned()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        // SAFETY: signalling the Prometheus this test started, by its PID.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// Percent-encodes a query value.
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
