//! exec, attach, port-forward, logs, cp and debug end to end: the real
//! kubectl binaries (the machine's current one, v1.32, WebSocket first,
//! and Debian's 1.20, SPDY only) against the fake API server, which
//! proxies the pod subresources to the real swiftlet binary's :10250
//! with its kubelet client certificate, over pods on the real containerd.

use std::{
    io::{Read, Write},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use sha2::{Digest, Sha256};
use swiftlet_tests::{
    apiserver::resources::PODS,
    kubectl::Kubectl,
    node_process::free_port,
    prereq,
    streaming::{
        IMAGE, Killed, Tmux, busybox_pod, cluster, count, hex, http_get, kubectl_io, processes, read_lines, variants,
        wait,
    },
};

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
        let (out, err, code) =
            kubectl_io(k, &["exec", &pod, "-c", "app", "--", "sh", "-c", "echo out; echo err >&2; exit 3"], b"", &env);
        assert_eq!(String::from_utf8_lossy(&out), "out\n", "{label}: stdout; stderr: {err}");
        assert!(err.contains("err\n"), "{label}: stderr: {err:?}");
        assert_eq!(code, 3, "{label}: the command's exit code; stderr: {err}");
        // 1 MiB through stdin and back, checked both ways.
        let (out, err, code) = kubectl_io(k, &["exec", "-i", &pod, "-c", "app", "--", "cat"], &payload, &env);
        assert_eq!(code, 0, "{label}: {err}");
        assert_eq!(out.len(), payload.len(), "{label}: bytes back");
        assert_eq!(hex(&Sha256::digest(&out)), sum, "{label}: the same bytes back");
        let (out, err, _) = kubectl_io(k, &["exec", "-i", &pod, "-c", "app", "--", "sha256sum"], &payload, &env);
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

#[test]
fn attach_logs_and_port_forward_with_both_kubectls() {
    let mut c = cluster("pf", "");
    let http_port = free_port();
    let pod = c.run_pod(busybox_pod("pf", http_port));
    // The pod is on the host's network: its httpd answers here too, so a
    // failure below is port-forward's, not a server that never started.
    wait("the pod's httpd answering on the host", Duration::from_secs(20), || {
        http_get(http_port).ok().filter(|b| b.contains("hello-from-the-pod")).map(drop)
    });
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
            let failure = match http_get(local) {
                Ok(b) if b.contains("hello-from-the-pod") => None,
                Ok(b) => Some(format!("body {b:?}")),
                Err(e) => Some(e.to_string()),
            };
            if let Some(e) = failure {
                let mut err = String::new();
                let _ = pf.0.kill();
                let _ = pf.0.stderr.take().unwrap().read_to_string(&mut err);
                let direct = http_get(http_port).map(|b| b.contains("hello-from-the-pod"));
                panic!("{label}: request {i} through port-forward: {e}; kubectl: {err}; httpd directly: {direct:?}")
            }
        }
        // Connections at once, as a browser opens them: their stream pairs
        // are opened on the runtime's connection concurrently.
        let concurrent: Vec<_> = (0..16).map(|_| std::thread::spawn(move || http_get(local))).collect();
        for (i, r) in concurrent.into_iter().enumerate() {
            match r.join().unwrap() {
                Ok(b) if b.contains("hello-from-the-pod") => {}
                other => {
                    let mut err = String::new();
                    let _ = pf.0.kill();
                    let _ = pf.0.stderr.take().unwrap().read_to_string(&mut err);
                    panic!("{label}: concurrent request {i} through port-forward: {other:?}; kubectl: {err}")
                }
            }
        }
        drop(pf);
        println!("{label}: port-forward {:?}", t.elapsed());
        println!("{label}: attach, logs -f, port-forward (100 requests, then 16 at once): ok");
    }
    let log = c.log();
    assert!(log.contains("portForward default/pf: WebSocket SPDY/3.1+portforward.k8s.io"), "{log}");
    assert!(log.contains("portForward default/pf: SPDY/3.1 portforward.k8s.io"), "{log}");
}

#[test]
fn exec_with_a_terminal_follows_resizes() {
    let mut c = cluster("tty", "");
    let pod = c.run_pod(busybox_pod("tty", free_port()));
    let tmux = Tmux::new("tty");
    for (i, (label, k, env)) in variants(&c).into_iter().enumerate() {
        let session = format!("s{i}");
        let envs: String = env.iter().map(|(n, v)| format!("{n}={v} ")).collect();
        let line = format!("{envs}{}", k.shell_line(&["exec", "-it", &pod, "-c", "app", "--", "sh"]));
        tmux.run(&["new-session", "-d", "-s", &session, "-x", "100", "-y", "30", &line]);
        tmux.expect(&session, "/ #");
        tmux.run(&["send-keys", "-t", &session, "echo TTY-$(tty)", "Enter"]);
        tmux.expect(&session, "TTY-/dev/pts");
        // kubectl sends the terminal's size right after the streams open,
        // while the shell may already be reading: ask until it is there.
        let ask = |want: &str| {
            wait(&format!("{label}: stty size {want} in the container"), Duration::from_secs(20), || {
                tmux.run(&["send-keys", "-t", &session, "clear; stty size", "Enter"]);
                std::thread::sleep(Duration::from_millis(300));
                let s = tmux.screen(&session);
                s.contains(want).then_some(s)
            })
        };
        ask("30 100");
        tmux.run(&["resize-window", "-t", &session, "-x", "120", "-y", "40"]);
        let screen = ask("40 120");
        tmux.run(&["send-keys", "-t", &session, "exit 7", "Enter"]);
        wait(&format!("{label}: the session to end"), Duration::from_secs(20), || {
            (!tmux.run(&["list-sessions"]).contains(&format!("{session}:"))).then_some(())
        });
        println!("{label}: exec -it: stty size 30 100, then after the resize: {}", screen.trim());
    }
    // kubectl debug -it: an ephemeral container with a terminal, attached
    // to once it runs, in the target's process namespace.
    for (i, (label, k)) in c.kubectls.iter().enumerate() {
        let session = format!("d{i}");
        let name = format!("shell{i}");
        let args = [
            "debug",
            "-it",
            &pod,
            &format!("--image={IMAGE}"),
            "--target=app",
            &format!("--container={name}"),
            "--",
            "sh",
        ];
        tmux.run(&["new-session", "-d", "-s", &session, "-x", "100", "-y", "30", &k.shell_line(&args)]);
        // The shell's first prompt may come before the attach: ask again.
        wait(&format!("{label}: the debug shell's prompt"), Duration::from_secs(60), || {
            tmux.run(&["send-keys", "-t", &session, "", "Enter"]);
            std::thread::sleep(Duration::from_millis(300));
            tmux.screen(&session).contains("/ #").then_some(())
        });
        tmux.run(&["send-keys", "-t", &session, "ps -o pid,comm", "Enter"]);
        let screen = tmux.expect(&session, "httpd");
        tmux.run(&["send-keys", "-t", &session, "exit", "Enter"]);
        let server = &c.server;
        wait(&format!("{label}: {name} terminated after exit"), Duration::from_secs(30), || {
            let p = server.get(&PODS, "default", &pod)?;
            let s = p
                .pointer("/status/ephemeralContainerStatuses")?
                .as_array()?
                .iter()
                .find(|s| s["name"] == name)?
                .clone();
            s.pointer("/state/terminated").map(drop)
        });
        println!("{label}: kubectl debug -it --target=app: ps sees the target's httpd:\n{}", screen.trim());
    }
}

#[test]
fn debug_adds_an_ephemeral_container_that_sees_the_targets_processes() {
    let mut c = cluster("debug", "");
    let pod = c.run_pod(busybox_pod("debug", free_port()));
    let kubectls: Vec<(&str, &Kubectl)> = c.kubectls.iter().map(|(l, k)| (*l, k)).collect();
    for (i, (label, k)) in kubectls.into_iter().enumerate() {
        let name = format!("dbg{i}");
        let out = k.run(&[
            "debug",
            &pod,
            &format!("--image={IMAGE}"),
            "--target=app",
            &format!("--container={name}"),
            "--",
            "sleep",
            &format!("360{i}"),
        ]);
        assert!(out.status.success(), "{label}: kubectl debug: {}", String::from_utf8_lossy(&out.stderr));
        let server = &c.server;
        let status = wait(&format!("{label}: {name} running"), Duration::from_secs(60), || {
            let p = server.get(&PODS, "default", &pod)?;
            let s = p
                .pointer("/status/ephemeralContainerStatuses")?
                .as_array()?
                .iter()
                .find(|s| s["name"] == name)?
                .clone();
            s.pointer("/state/running").is_some().then_some(s)
        });
        assert!(status["containerID"].as_str().is_some_and(|id| id.starts_with("containerd://")), "{status}");
        // In the target's process namespace: the app's httpd and its shell loop.
        let (out, err, code) = kubectl_io(k, &["exec", &pod, "-c", &name, "--", "ps"], b"", &[]);
        let ps = String::from_utf8_lossy(&out);
        assert_eq!(code, 0, "{label}: {err}");
        assert!(ps.contains("httpd") && ps.contains(&format!("sleep 360{i}")), "{label}: ps in {name}:\n{ps}");
        // The app container itself does not see the debugger (its own namespace).
        let (out, _, _) = kubectl_io(k, &["exec", &pod, "-c", "reader", "--", "ps"], b"", &[]);
        assert!(!String::from_utf8_lossy(&out).contains("httpd"), "reader has its own process namespace");
        println!("{label}: kubectl debug --target=app: {name} running, ps:\n{ps}");
    }
    // Ephemeral containers are not restarted: end one, it stays terminated.
    for pid in processes("sleep 3600") {
        // SAFETY: kill(2) on the debugger's own process, found by its command line.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    let server = &c.server;
    wait("dbg0 terminated", Duration::from_secs(30), || {
        let p = server.get(&PODS, "default", &pod)?;
        let s =
            p.pointer("/status/ephemeralContainerStatuses")?.as_array()?.iter().find(|s| s["name"] == "dbg0")?.clone();
        s.pointer("/state/terminated").map(drop)
    });
    std::thread::sleep(Duration::from_secs(3));
    let p = c.server.get(&PODS, "default", &pod).unwrap();
    let s = p["status"]["ephemeralContainerStatuses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "dbg0")
        .unwrap()
        .clone();
    assert!(s["state"]["terminated"].is_object(), "not restarted: {s}");
}

#[test]
fn dropped_and_idle_sessions_leave_nothing_and_fifty_sessions_run_at_once() {
    let mut c = cluster("cleanup", "streamingConnectionIdleTimeout: 4s\n");
    let pod = c.run_pod(busybox_pod("cleanup", free_port()));
    let agent_pid = c.agent.pid().unwrap();
    // Settle: one session first, so lazily made things (the CRI channel,
    // TLS state) exist before the baseline.
    let (_, err, code) = kubectl_io(&c.kubectls[0].1, &["exec", &pod, "-c", "app", "--", "true"], b"", &[]);
    assert_eq!(code, 0, "{err}");
    std::thread::sleep(Duration::from_secs(1));
    let fds = || count(format!("/proc/{agent_pid}/fd"));
    let tasks = || count(format!("/proc/{agent_pid}/task"));
    let (fds0, tasks0) = (fds(), tasks());
    // Clients killed mid-stream: their commands are killed too.
    for (n, (label, k, env)) in variants(&c).into_iter().enumerate() {
        let marker = format!("sleep {}", 7700 + n);
        let mut cmd = k.command(&["exec", "-i", &pod, "-c", "app", "--", "sleep", &(7700 + n).to_string()]);
        for (k, v) in &env {
            cmd.env(k, v);
        }
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        wait(&format!("{label}: {marker} running"), Duration::from_secs(20), || {
            (processes(&marker).len() == 1).then_some(())
        });
        child.kill().unwrap();
        child.wait().unwrap();
        let t = Instant::now();
        wait(&format!("{label}: {marker} gone after the client went"), Duration::from_secs(20), || {
            processes(&marker).is_empty().then_some(())
        });
        println!("{label}: client killed; its command ended {:?} later", t.elapsed());
    }
    // An idle session (no byte either way) is closed after 4 s, and its
    // command killed.
    let t = Instant::now();
    let (_, err, code) = kubectl_io(&c.kubectls[0].1, &["exec", &pod, "-c", "app", "--", "sleep", "7799"], b"", &[]);
    let took = t.elapsed();
    assert!(
        code != 0 && took >= Duration::from_secs(4) && took < Duration::from_secs(15),
        "{code} after {took:?}: {err}"
    );
    wait("sleep 7799 gone after the idle timeout", Duration::from_secs(10), || {
        processes("sleep 7799").is_empty().then_some(())
    });
    assert!(c.log().contains("streamingConnectionIdleTimeout"), "the idle close is logged");
    println!("idle session closed after {took:?}: {}", err.trim());
    // 50 sessions at once, half over WebSocket (1.32), half over SPDY (1.20).
    let t = Instant::now();
    let children: Vec<(usize, Child)> = (0..50)
        .map(|i| {
            let k = &c.kubectls[i % 2].1;
            let script = format!("echo session-{i}; echo $(({i} * {i}))");
            let child = k
                .command(&["exec", &pod, "-c", "app", "--", "sh", "-c", &script])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (i, child)
        })
        .collect();
    for (i, child) in children {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "session {i}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(text, format!("session-{i}\n{}\n", i * i), "session {i}");
    }
    println!("50 concurrent exec sessions: all complete in {:?}", t.elapsed());
    // Nothing left: the agent's descriptors and threads are back where
    // they were (tokio's blocking pool may keep idle threads for 10 s).
    std::thread::sleep(Duration::from_secs(2));
    let (fds1, _) = (fds(), tasks());
    let tasks1 = wait("the agent's threads to settle", Duration::from_secs(20), || {
        let n = tasks();
        (n <= tasks0 + 1).then_some(n)
    });
    println!("agent fds {fds0} -> {fds1}, threads {tasks0} -> {tasks1}");
    assert!(fds1 <= fds0 + 1, "the agent's descriptors: {fds0} before, {fds1} after");
}

/// Port-forward over WebSocket channels, the kubelet's older protocol
/// (clients other than kubectl use it): through the fake API server, the
/// port is the first message on channels 0 and 1, then data on channel 0.
#[test]
fn port_forward_over_websocket_channels() {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};
    let mut c = cluster("wspf", "");
    let http_port = free_port();
    let pod = c.run_pod(busybox_pod("wspf", http_port));
    let (cert, key) = c.server.client_cert("admin", &["system:masters"]).unwrap();
    let tls = swiftlet_tests::apiserver::proxy::kubelet_client_config(
        &std::fs::read_to_string(cert).unwrap(),
        &std::fs::read_to_string(key).unwrap(),
    )
    .unwrap();
    let addr = c.server.addr();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let stream = tokio_rustls::TlsConnector::from(tls).connect(name, tcp).await.unwrap();
        let url = format!("wss://{addr}/api/v1/namespaces/default/pods/{pod}/portforward?ports={http_port}");
        let mut req = url.into_client_request().unwrap();
        req.headers_mut().insert("sec-websocket-protocol", "v4.channel.k8s.io".parse().unwrap());
        let (mut ws, resp) = tokio_tungstenite::client_async(req, stream).await.unwrap();
        assert_eq!(resp.headers()["sec-websocket-protocol"], "v4.channel.k8s.io");
        let port = http_port.to_le_bytes();
        for want in [[0, port[0], port[1]], [1, port[0], port[1]]] {
            let got = loop {
                match tokio::time::timeout(Duration::from_secs(20), ws.next()).await {
                    Ok(Some(Ok(Message::Binary(b)))) => break b.to_vec(),
                    Ok(Some(Ok(_))) => continue,
                    other => panic!("no message: {other:?}"),
                }
            };
            assert_eq!(got, want, "the port first on channel {}", want[0]);
        }
        let mut get = vec![0u8];
        get.extend_from_slice(b"GET /index.html HTTP/1.0\r\nHost: localhost\r\n\r\n");
        ws.send(Message::Binary(get.into())).await.unwrap();
        let mut body = vec![];
        while !String::from_utf8_lossy(&body).contains("hello-from-the-pod") {
            match tokio::time::timeout(Duration::from_secs(20), ws.next()).await {
                Ok(Some(Ok(Message::Binary(b)))) if b.first() == Some(&0) => body.extend_from_slice(&b[1..]),
                Ok(Some(Ok(_))) => {}
                other => panic!("the response: {other:?}; so far {:?}", String::from_utf8_lossy(&body)),
            }
        }
        println!(
            "WebSocket v4.channel.k8s.io port-forward: {}",
            String::from_utf8_lossy(&body).lines().next().unwrap_or("")
        );
    });
    assert!(c.log().contains("portForward default/wspf: WebSocket v4.channel.k8s.io (1 port(s))"));
}

/// 401 and 403 on the streaming paths, as on the others: the server
/// module in this process, its webhooks asking a stand-in API server.
/// POST (SPDY, and the /run form) is `create` on nodes/proxy, GET
/// (WebSocket) is `get`.
#[test]
fn streaming_paths_are_nodes_proxy_create_or_get() {
    use std::sync::Arc;

    use swiftlet_tests::{
        cgroup::TestCgroup, cri::StaticPods, kubelet::InProcess, pki::TestCa, review_stub::ReviewStub,
    };
    prereq::require_root();
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test-client-ca");
    let ca_file = dir.path().join("ca.crt");
    ca.write(&ca_file);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let stub = ReviewStub::start().await;
        stub.rules.lock().unwrap().allow.push(("admin".into(), "proxy".into()));
        let kubeconfig = dir.path().join("kubeconfig");
        stub.write_kubeconfig(&kubeconfig);
        let tc = TestCgroup::new();
        let s = InProcess::start_with(
            Arc::new(StaticPods::default()),
            &tc.root,
            Default::default(),
            &[
                format!("--client-ca-file={}", ca_file.display()),
                "--anonymous-auth=false".into(),
                "--authorization-mode=Webhook".into(),
                format!("--kubeconfig={}", kubeconfig.display()),
            ],
            Some(&kubeconfig),
        )
        .await;
        let paths = [
            ("POST", "/exec/default/p/c?command=ls&output=1", "create"),
            ("GET", "/exec/default/p/uid/c?command=ls&output=1", "get"),
            ("POST", "/attach/default/p/c?output=1", "create"),
            ("GET", "/portForward/default/p", "get"),
            ("POST", "/portForward/default/p/uid", "create"),
            ("POST", "/run/default/p/c?cmd=ls", "create"),
        ];
        for (method, path, verb) in paths {
            let r = s.https(None).send(method, path, &[]).await.unwrap();
            assert_eq!(r.status, 401, "{method} {path} without credentials");
            let r = s.https(Some(ca.client("mallory", &["staff"]))).send(method, path, &[]).await.unwrap();
            assert_eq!(r.status, 403, "{method} {path} as mallory");
            assert_eq!(
                r.text(),
                format!("Forbidden (user=mallory, verb={verb}, resource=nodes, subresource(s)=[proxy])\n"),
                "{method} {path}"
            );
            // Allowed: past authorization to the handler (no such pod here).
            let r = s.https(Some(ca.client("admin", &[]))).send(method, path, &[]).await.unwrap();
            assert_eq!((r.status, r.text().as_str()), (404, "pod does not exist"), "{method} {path} as admin");
        }
        let seen = stub.rules.lock().unwrap().seen.clone();
        let sar = seen
            .iter()
            .find(|(k, spec)| k == "SubjectAccessReview" && spec["user"] == "mallory")
            .expect("a SubjectAccessReview for mallory");
        assert_eq!(sar.1["resourceAttributes"]["subresource"], "proxy");
        assert_eq!(sar.1["resourceAttributes"]["resource"], "nodes");
        s.shutdown().await;
    });
}
