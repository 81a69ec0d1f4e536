//! The fixtures of the streaming tests (`tests/tests/streaming.rs`): a
//! fake API server with swiftlet as its node and both kubectls, kubectl
//! runs with their input and protocol variants, tmux, and /proc look-ups.

use std::{
    io::{Read, Write},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::{
    apiserver::{
        Credentials, FakeApiServer, Options,
        auth::AccessRule,
        proxy::KUBELET_CLIENT_USER,
        resources::{NODES, PODS},
    },
    kubectl::{Kubectl, current_kubectl_binary, kubectl_binary},
    node_process::{NodeProcess, PodCleanup},
    prereq,
};

pub const IMAGE: &str = "swiftlet.local/busybox:1.35";

pub fn wait<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A fake API server with TLS, swiftlet as its node (kubelet API
/// authorized by SubjectAccessReview, the fake's CA trusted for client
/// certificates), and both kubectls as admin.
pub struct Cluster {
    pub server: FakeApiServer,
    pub node: String,
    pub agent: NodeProcess,
    /// (label, kubectl): the current one, then Debian's 1.20.
    pub kubectls: Vec<(&'static str, Kubectl)>,
    pub cleanup: PodCleanup,
}

pub fn cluster(tag: &str, config_extra: &str) -> Cluster {
    prereq::require_root();
    let node = format!("swl-{tag}-{}", std::process::id());
    let server = FakeApiServer::start(Options { tls: true, ..Default::default() }).unwrap();
    // The API server may proxy to kubelets; nobody else may.
    server.add_rule(AccessRule::allow().user(KUBELET_CLIENT_USER).resource("nodes"));
    let node_kubeconfig = server.dir().join("kubelet.kubeconfig");
    let (cert, key) = server.client_cert(&format!("system:node:{node}"), &["system:nodes"]).unwrap();
    server.write_kubeconfig(&node_kubeconfig, &Credentials::ClientCert { cert, key }).unwrap();
    let admin = server.dir().join("admin.kubeconfig");
    let (cert, key) = server.client_cert("admin", &["system:masters"]).unwrap();
    server.write_kubeconfig(&admin, &Credentials::ClientCert { cert, key }).unwrap();
    // Only memory evicts: on this shared disk a nodefs line would make
    // disk reclaim delete the locally built test images between tests.
    let config = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nnodeStatusUpdateFrequency: 1s\n\
         evictionHard:\n  memory.available: 100Mi\n{config_extra}"
    );
    let extra = vec![
        format!("--kubeconfig={}", node_kubeconfig.display()),
        format!("--hostname-override={node}"),
        "--node-ip=127.0.0.1".into(),
        format!("--client-ca-file={}", server.ca_file().unwrap().display()),
        "--authorization-mode=Webhook".into(),
    ];
    let mut agent = NodeProcess::start(Some(&config), &extra);
    wait("the node to register", Duration::from_secs(60), || {
        agent.assert_running();
        server.get(&NODES, "", &node).filter(|n| n.pointer("/status/daemonEndpoints").is_some())
    });
    let kubectls = vec![
        ("kubectl 1.32", Kubectl::with_binary(current_kubectl_binary(), &admin)),
        ("kubectl 1.20", Kubectl::with_binary(kubectl_binary(), &admin)),
    ];
    for (label, k) in &kubectls {
        println!("{label}: {} ({})", k.bin.display(), k.version());
    }
    Cluster { server, node, agent, kubectls, cleanup: PodCleanup::new() }
}

impl Cluster {
    /// Creates `pod` (nodeName set) and waits until all its containers run.
    pub fn run_pod(&mut self, mut pod: Value) -> String {
        pod["spec"]["nodeName"] = self.node.clone().into();
        crate::apiserver::defaults::pod(&mut pod);
        let name = pod["metadata"]["name"].as_str().unwrap().to_owned();
        let created = self.server.store().create(&PODS, "default", pod).unwrap();
        self.cleanup.track(created["metadata"]["uid"].as_str().unwrap());
        let n = created["spec"]["containers"].as_array().unwrap().len();
        let agent = &mut self.agent;
        let server = &self.server;
        wait(&format!("pod {name} running"), Duration::from_secs(90), || {
            agent.assert_running();
            let p = server.get(&PODS, "default", &name)?;
            let running = p
                .pointer("/status/containerStatuses")?
                .as_array()?
                .iter()
                .filter(|c| c.pointer("/state/running").is_some())
                .count();
            (running == n).then_some(())
        });
        name
    }

    pub fn log(&self) -> String {
        self.agent.log_text()
    }
}

/// Runs kubectl with `stdin`, returning (stdout, stderr, exit code).
pub fn kubectl_io(k: &Kubectl, args: &[&str], stdin: &[u8], env: &[(&str, &str)]) -> (Vec<u8>, String, i32) {
    let mut c = k.command(args);
    for (n, v) in env {
        c.env(n, v);
    }
    let mut child = c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    (out.stdout, String::from_utf8_lossy(&out.stderr).into_owned(), out.status.code().unwrap_or(-1))
}

pub fn busybox_pod(name: &str, http_port: u16) -> Value {
    let script = format!(
        "mkdir -p /www && echo hello-from-the-pod > /www/index.html && httpd -f -p {http_port} -h /www & \
         i=0; while true; do echo line $i; i=$((i+1)); sleep 0.3; done"
    );
    json!({
        "metadata": {"name": name},
        "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 1, "containers": [
            {"name": "app", "image": IMAGE, "imagePullPolicy": "Never", "command": ["sh", "-c", script]},
            {"name": "reader", "image": IMAGE, "imagePullPolicy": "Never", "stdin": true,
             "command": ["sh", "-c", "while read l; do echo got:$l; done"]},
        ]},
    })
}

/// A kubectl run: (label, binary, environment).
pub type Variant<'a> = (String, &'a Kubectl, Vec<(&'static str, &'static str)>);

/// The protocol variants each kubectl is run with: 1.32 as it comes
/// (WebSocket) and forced to SPDY; 1.20 (SPDY only).
pub fn variants(c: &Cluster) -> Vec<Variant<'_>> {
    let mut v = vec![];
    for (label, k) in &c.kubectls {
        if label.contains("1.32") {
            v.push((format!("{label} (WebSocket)"), k, vec![]));
            v.push((
                format!("{label} (SPDY)"),
                k,
                vec![("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false"), ("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false")],
            ));
        } else {
            v.push((format!("{label} (SPDY)"), k, vec![]));
        }
    }
    v
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One GET, read up to its Content-Length (as curl does: waiting for the
/// connection to close would wait out containerd's one-second linger on
/// every forwarded connection).
pub fn http_get(port: u16) -> std::io::Result<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET /index.html HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut buf = vec![];
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
                .and_then(|v| v.parse::<usize>().ok());
            if len.is_some_and(|n| body.len() >= n) {
                return Ok(text);
            }
        }
        match s.read(&mut chunk)? {
            0 => return Ok(text),
            n => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Reads `n` lines (or what comes within `timeout`).
pub fn read_lines(r: &mut impl Read, n: usize, timeout: Duration) -> Vec<String> {
    let deadline = Instant::now() + timeout;
    let mut buf = vec![];
    let mut byte = [0u8; 1];
    while buf.iter().filter(|b| **b == b'\n').count() < n && Instant::now() < deadline {
        match r.read(&mut byte) {
            Ok(1) => buf.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&buf).lines().map(str::to_owned).collect()
}

/// tmux on a socket of its own (`-L`), killed on drop.
pub struct Tmux {
    socket: String,
}

impl Tmux {
    pub fn new(tag: &str) -> Tmux {
        assert!(command_exists("tmux"), "this test needs tmux (`cargo xtask setup` installs it)");
        Tmux { socket: format!("swiftlet-{tag}-{}", std::process::id()) }
    }

    pub fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux").arg("-L").arg(&self.socket).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn screen(&self, session: &str) -> String {
        self.run(&["capture-pane", "-p", "-t", session])
    }

    /// Waits until the screen shows `what`.
    pub fn expect(&self, session: &str, what: &str) -> String {
        wait(&format!("{what:?} on the terminal"), Duration::from_secs(20), || {
            let s = self.screen(session);
            s.contains(what).then_some(s)
        })
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").arg("-L").arg(&self.socket).arg("kill-server").output();
        // The server leaves its socket file behind.
        let dir = std::env::var("TMUX_TMPDIR").unwrap_or_else(|_| "/tmp".into());
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let _ = std::fs::remove_file(format!("{dir}/tmux-{uid}/{}", self.socket));
    }
}

/// Processes on the machine whose command line is exactly `cmdline`.
pub fn processes(cmdline: &str) -> Vec<u32> {
    let want: Vec<u8> = cmdline.split(' ').flat_map(|a| a.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .collect()
}

pub fn count(dir: String) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

pub fn command_exists(c: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {c}")]).output().is_ok_and(|o| o.status.success())
}
