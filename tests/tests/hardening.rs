//! The kubelet API under abuse, on the real `swiftlet` binary: stalled
//! connections against a small open-file limit, and (with the fake API
//! server) a flood of random bearer tokens.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use swiftlet_tests::{
    apiserver::{FakeApiServer, Options, auth::UserInfo},
    https::Https,
    kubelet::RunningAgent,
    node_process::NodeProcess,
    pki::TestCa,
};
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
            // Their handshakes ended after the stalled connections were
            // accepted, so their timeouts end later: wait for the close
            // without sending anything (a request would make them busy).
            while !c.is_closed() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
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

/// 10,000 random bearer tokens: at most the configured TokenReviews per
/// second reach the API server (the rest get 429 at once), the Lease is
/// still renewed every second meanwhile, and a token authenticated before
/// the flood is still served from the cache after it.
#[test]
fn a_flood_of_random_tokens_is_bounded_and_heartbeats_go_on() {
    let server = FakeApiServer::start(Options { tls: true, ..Default::default() }).unwrap();
    let name = format!("swl-flood-{}", std::process::id());
    let port = swiftlet_tests::node_process::free_port();
    let (qps, burst) = (5u32, 5u32);
    let mut agent = NodeProcess::on_fake_apiserver(
        &server,
        &name,
        port,
        &[
            "--authentication-token-webhook=true".into(),
            "--authorization-mode=AlwaysAllow".into(),
            format!("--token-review-qps={qps}"),
            format!("--token-review-burst={burst}"),
        ],
        "",
    );
    server.set_token("good-token", UserInfo::new("alice", &["monitoring"]));
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let reviews = |s: &FakeApiServer| -> Vec<Instant> {
        s.requests().into_iter().filter(|r| r.uri.contains("/tokenreviews")).map(|r| r.at).collect()
    };
    rt().block_on(async {
        let good = Https::new(addr, None).with_token("good-token");
        assert_eq!(good.get("/pods").await.unwrap().status, 200, "the good token authenticates");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = reviews(&server).len();
        let t0 = Instant::now();
        let mut tasks = vec![];
        for worker in 0..50 {
            tasks.push(tokio::spawn(async move {
                let mut counts = (0u32, 0u32, 0u32);
                let mut conn = Https::new(addr, None).connect().await.unwrap();
                // 200 each, and for at least 5 s: long enough for the
                // Lease to be renewed several times during the flood.
                let mut i = 0u32;
                while i < 200 || t0.elapsed() < Duration::from_secs(5) {
                    i += 1;
                    let token = format!("random-{worker}-{i}-{:x}", rand_u64());
                    let r = match conn.get_with("/pods", &[("authorization", &format!("Bearer {token}"))]).await {
                        Ok(r) => r,
                        Err(_) => {
                            conn = Https::new(addr, None).connect().await.unwrap();
                            continue;
                        }
                    };
                    match r.status {
                        401 => counts.0 += 1,
                        429 => counts.1 += 1,
                        _ => counts.2 += 1,
                    }
                }
                counts
            }));
        }
        let mut total = (0, 0, 0);
        for t in tasks {
            let c = t.await.unwrap();
            total = (total.0 + c.0, total.1 + c.1, total.2 + c.2);
        }
        let took = t0.elapsed();
        let sent = reviews(&server)[before..].to_vec();
        eprintln!("flood: {total:?} (401, 429, other) in {took:?}; {} TokenReviews", sent.len());
        assert_eq!(total.2, 0, "random tokens are never allowed");
        assert!(total.0 + total.1 > 9_000, "{total:?}");
        let allowed = f64::from(burst) + f64::from(qps) * took.as_secs_f64() + 1.0;
        assert!(sent.len() as f64 <= allowed, "{} TokenReviews in {took:?} (limit {allowed})", sent.len());
        // In any one-second window, at most qps + burst.
        for (i, t) in sent.iter().enumerate() {
            let in_window = sent[i..].iter().take_while(|u| u.duration_since(*t) < Duration::from_secs(1)).count();
            assert!(in_window as u32 <= qps + burst, "{in_window} reviews within a second");
        }
        // The Lease went on being renewed every second during the flood.
        let leases: Vec<Instant> = server
            .requests()
            .into_iter()
            .filter(|r| r.method == "PUT" && r.uri.contains("/leases/") && r.at >= t0 && r.at <= t0 + took)
            .map(|r| r.at)
            .collect();
        assert!(took >= Duration::from_secs(5), "{took:?}");
        assert!(leases.len() as f64 >= took.as_secs_f64() - 2.0, "{} Lease updates in {took:?}", leases.len());
        let worst = leases.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default();
        assert!(worst < Duration::from_secs(2), "a Lease update waited: {worst:?} between two renewals");
        // The positive entry survived: the token no longer authenticates
        // at the API server, and still does here (cached for 2 minutes).
        server.remove_token("good-token");
        let after = reviews(&server).len();
        assert_eq!(good.get("/pods").await.unwrap().status, 200, "the cached good token");
        assert_eq!(reviews(&server).len(), after, "served from the cache");
    });
    agent.assert_running();
    assert!(agent.stop());
}

/// A random number for tokens nobody can have cached.
fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish()
}
