//! exec, attach, port-forward, logs, cp and debug end to end: the real
//! kubectl binaries (the machine's current one, v1.32, WebSocket first,
//! and Debian's 1.20, SPDY only) against the fake API server, which
//! proxies the pod subresources to the real swiftlet binary's :10250
//! with its kubelet client certificate, over pods on the real containerd.

use std::{
    io::{Read, Write},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use swiftlet_tests::{
    apiserver::{
        Credentials, FakeApiServer, Options,
        auth::AccessRule,
        proxy::KUBELET_CLIENT_USER,
        resources::{NODES, PODS},
    },
    kubectl::{Kubectl, current_kubectl_binary, kubectl_binary},
    node_process::{NodeProcess, PodCleanup, free_port},
    prereq,
};

const IMAGE: &str = "swiftlet.local/busybox:1.35";

fn wait<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
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
struct Cluster {
    server: FakeApiServer,
    node: String,
    agent: NodeProcess,
    /// (label, kubectl): the current one, then Debian's 1.20.
    kubectls: Vec<(&'static str, Kubectl)>,
    cleanup: PodCleanup,
}

fn cluster(tag: &str, config_extra: &str) -> Cluster {
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
    let config = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nnodeStatusUpdateFrequency: 1s\n\
         evictionHard:\n  memory.available: 100Mi\n  nodefs.available: 1%\n{config_extra}"
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
    fn run_pod(&mut self, mut pod: Value) -> String {
        pod["spec"]["nodeName"] = self.node.clone().into();
        swiftlet_tests::apiserver::defaults::pod(&mut pod);
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

    fn log(&self) -> String {
        self.agent.log_text()
    }
}

/// Runs kubectl with `stdin`, returning (stdout, stderr, exit code).
fn kubectl_io(k: &Kubectl, args: &[&str], stdin: &[u8], env: &[(&str, &str)]) -> (Vec<u8>, String, i32) {
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

fn busybox_pod(name: &str, http_port: u16) -> Value {
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

/// The protocol variants each kubectl is run with: 1.32 as it comes
/// (WebSocket) and forced to SPDY; 1.20 (SPDY only).
fn variants(c: &Cluster) -> Vec<(String, &Kubectl, Vec<(&'static str, &'static str)>)> {
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

#[test]
fn exec_streams_exit_codes_stdin_and_cp_with_both_kubectls() {
    let mut c = cluster("exec", "");
    let pod = c.run_pod(busybox_pod("exec", free_port()));
    let mut payload = vec![0u8; 1 << 20];
    for (i, b) in payload.iter_mut().enumerate() {
        *b = (i.wrapping_mul(2_654_435_761) >> 13) as u8;
    }
    let sum = hex(&Sha256::digest(&payload));
    for (label, k, env) in variants(&c) {
        // Both streams and the exit code.
        let (out, err, code) = kubectl_io(
            k,
            &["exec", &pod, "-c", "app", "--", "sh", "-c", "echo out; echo err >&2; exit 3"],
            b"",
            &env,
        );
        assert_eq!(String::from_utf8_lossy(&out), "out\n", "{label}: stdout; stderr: {err}");
        assert!(err.contains("err\n"), "{label}: stderr: {err:?}");
        assert_eq!(code, 3, "{label}: the command's exit code; stderr: {err}");
        // 1 MiB through stdin and back, checked both ways.
        let (out, err, code) = kubectl_io(k, &["exec", "-i", &pod, "-c", "app", "--", "cat"], &payload, &env);
        assert_eq!(code, 0, "{label}: {err}");
        assert_eq!(out.len(), payload.len(), "{label}: bytes back");
        assert_eq!(hex(&Sha256::digest(&out)), sum, "{label}: the same bytes back");
        let (out, err, _) =
            kubectl_io(k, &["exec", "-i", &pod, "-c", "app", "--", "sha256sum"], &payload, &env);
        assert!(String::from_utf8_lossy(&out).starts_with(&sum), "{label}: in the container: {out:?} {err}");
        // kubectl cp in and out, byte-identical.
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path().join("blob.bin");
        std::fs::write(&local, &payload).unwrap();
        let remote = format!("{pod}:/tmp/blob-{}.bin", label.len() + env.len());
        let (_, err, code) = kubectl_io(k, &["cp", "-c", "app", &local.display().to_string(), &remote], b"", &env);
        assert_eq!(code, 0, "{label}: cp in: {err}");
        let back = dir.path().join("back.bin");
        let (_, err, code) = kubectl_io(k, &["cp", "-c", "app", &remote, &back.display().to_string()], b"", &env);
        assert_eq!(code, 0, "{label}: cp out: {err}");
        assert_eq!(hex(&Sha256::digest(std::fs::read(&back).unwrap())), sum, "{label}: cp round trip");
        println!("{label}: exec (exit 3, both streams), exec -i 1 MiB, cp in and out: ok");
    }
    let log = c.log();
    for proto in ["WebSocket v5.channel.k8s.io", "SPDY/3.1 v4.channel.k8s.io"] {
        assert!(log.contains(proto), "no session used {proto}:\n{log}");
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn attach_logs_and_port_forward_with_both_kubectls() {
    let mut c = cluster("pf", "");
    let http_port = free_port();
    let pod = c.run_pod(busybox_pod("pf", http_port));
    for (label, k, env) in variants(&c) {
        let t = Instant::now();
        // attach to the container reading stdin: each line comes back
        // while stdin is open (closing it ends the attach, as with the
        // kubelet: the runtime then closes the output streams).
        let mut attach = k.command(&["attach", "-i", &pod, "-c", "reader"]);
        for (n, v) in &env {
            attach.env(n, v);
        }
        let mut child =
            Killed(attach.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap());
        let mut stdin = child.0.stdin.take().unwrap();
        let mut stdout = child.0.stdout.take().unwrap();
        for word in ["hello", "world"] {
            stdin.write_all(format!("{word}\n").as_bytes()).unwrap();
            let line = read_lines(&mut stdout, 1, Duration::from_secs(20));
            assert_eq!(line, [format!("got:{word}")], "{label}: attach");
        }
        drop(stdin);
        let status = wait(&format!("{label}: attach to end with stdin"), Duration::from_secs(20), || {
            child.0.try_wait().unwrap()
        });
        assert!(status.success(), "{label}: attach exited {status}");
        println!("{label}: attach {:?}", t.elapsed());
        let t = Instant::now();
        // logs -f follows new lines.
        let mut follow = k.command(&["logs", "-f", &pod, "-c", "app", "--tail=1"]);
        for (n, v) in &env {
            follow.env(n, v);
        }
        let mut child = follow.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let lines = read_lines(&mut stdout, 4, Duration::from_secs(20));
        let _ = child.kill();
        let _ = child.wait();
        let n: Vec<u64> = lines.iter().filter_map(|l| l.strip_prefix("line ")?.parse().ok()).collect();
        assert!(n.len() >= 4 && n.windows(2).all(|w| w[1] == w[0] + 1), "{label}: logs -f: {lines:?}");
        println!("{label}: logs -f {:?}", t.elapsed());
        let t = Instant::now();
        // port-forward, then 100 requests through it.
        let local = free_port();
        let mut pf = k.command(&["port-forward", &format!("pod/{pod}"), &format!("{local}:{http_port}")]);
        for (n, v) in &env {
            pf.env(n, v);
        }
        let mut pf = Killed(pf.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap());
        wait(&format!("{label}: port-forward listening"), Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", local)).ok().map(drop)
        });
        for i in 0..100 {
            let body = http_get(local).unwrap_or_else(|e| {
                let mut err = String::new();
                let _ = pf.0.kill();
                let _ = pf.0.stderr.take().unwrap().read_to_string(&mut err);
                panic!("{label}: request {i} through port-forward: {e}; kubectl: {err}")
            });
            assert!(body.contains("hello-from-the-pod"), "{label}: request {i}: {body:?}");
        }
        drop(pf);
        println!("{label}: port-forward {:?}", t.elapsed());
        println!("{label}: attach, logs -f, port-forward (100 requests): ok");
    }
    let log = c.log();
    assert!(log.contains("portForward default/pf: WebSocket SPDY/3.1+portforward.k8s.io"), "{log}");
    assert!(log.contains("portForward default/pf: SPDY/3.1 portforward.k8s.io"), "{log}");
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One GET, read up to its Content-Length (as curl does: waiting for the
/// connection to close would wait out containerd's one-second linger on
/// every forwarded connection).
fn http_get(port: u16) -> std::io::Result<String> {
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
fn read_lines(r: &mut impl Read, n: usize, timeout: Duration) -> Vec<String> {
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

#[allow(dead_code)]
fn command_exists(c: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {c}")]).output().is_ok_and(|o| o.status.success())
}
