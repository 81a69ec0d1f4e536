//! The kubelet API under abuse, on the real `swiftlet` binary: stalled
//! connections against a small open-file limit, and (with the fake API
//! server) a flood of random bearer tokens.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use swiftlet_tests::{kubelet::RunningAgent, pki::TestCa};
use tokio::io::AsyncReadExt;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// The agent's open-file limit as /proc shows it: (soft, hard).
fn nofile(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = text.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let v: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    (v[0], v[1])
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// 300 connections that never finish a TLS handshake (and 20 that finish
/// it but never send a request), against an agent whose open-file limit
/// is 256 (maxOpenFiles): an authenticated /healthz still answers within
/// a second, the agent never runs out of descriptors, and every stalled
/// connection is closed once the request-header timeout (2 s here) passes.
#[test]
fn stalled_connections_do_not_lock_out_an_authenticated_client() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test-client-ca");
    ca.write(&dir.path().join("ca.crt"));
    let agent = RunningAgent::start(&[
        format!("--client-ca-file={}", dir.path().join("ca.crt").display()),
        "--authorization-mode=AlwaysAllow".into(),
        "--anonymous-auth=false".into(),
        "--max-open-files=256".into(),
        "--server-request-header-timeout=2s".into(),
    ]);
    assert_eq!(nofile(agent.pid()), (256, 256), "maxOpenFiles is applied with setrlimit");
    let addr = SocketAddr::from(([127, 0, 0, 1], agent.port));
    let client = agent.https(Some(ca.client("admin", &["system:masters"])));
    rt().block_on(async {
        // Warm: the first request pays for nothing the test measures.
        assert_eq!(client.get("/healthz").await.unwrap().status, 200);
        let mut stalled = vec![];
        for _ in 0..300 {
            stalled.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        let mut idle = vec![];
        for _ in 0..20 {
            idle.push(agent.https(None).connect().await.unwrap());
        }
        let t0 = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(5), client.get("/healthz")).await;
        let took = t0.elapsed();
        let r = r.expect("/healthz answered").expect("/healthz");
        assert_eq!((r.status, r.text().as_str()), (200, "ok"));
        assert!(took < Duration::from_secs(1), "/healthz took {took:?} behind 320 stalled connections");
        assert!(open_fds(agent.pid()) < 256, "{} descriptors open", open_fds(agent.pid()));
        // Every stalled connection is closed by the server within the
        // header timeout (plus slack): a read sees EOF or a reset.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
        for (i, s) in stalled.iter_mut().enumerate() {
            let mut b = [0u8; 1];
            let r = tokio::time::timeout_at(deadline, s.read(&mut b)).await;
            assert!(matches!(r, Ok(Ok(0)) | Ok(Err(_))), "stalled connection {i} still open: {r:?}");
        }
        for (i, c) in idle.iter_mut().enumerate() {
            // The server closed it: a request on it fails.
            assert!(c.get("/healthz").await.is_err(), "idle TLS connection {i} still open");
        }
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(1500), "closed before the timeout: {took:?}");
        // And the agent serves on.
        assert_eq!(client.get("/healthz").await.unwrap().status, 200);
    });
    let log = agent.log_text();
    assert!(!log.contains("panicked"), "{log}");
}
