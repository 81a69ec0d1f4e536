//! Certificates as kubeadm nodes use them, on the real binary and the fake
//! API server, with certificate lifetimes shortened to seconds:
//! rotateCertificates (the client certificate renewed by CSR and used
//! without a restart), serverTLSBootstrap (the serving certificate asked
//! for, served once issued, rotated), and --client-ca-file changes picked
//! up while running.

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    time::{Duration, Instant},
};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use swiftlet_tests::{
    apiserver::{
        FakeApiServer, Options,
        auth::{AccessRule, UserInfo},
        csr::Policy,
    },
    https::{Https, Identity},
    kubelet::RunningAgent,
    node_process::{NodeProcess, free_port},
    pki::TestCa,
};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// (serial, issuer CN, subject CN) of a DER certificate.
fn describe(der: &[u8]) -> (Vec<u8>, String, String) {
    let (_, c) = x509_parser::parse_x509_certificate(der).unwrap();
    let cn = |n: &x509_parser::x509::X509Name| {
        n.iter_common_name().next().and_then(|c| c.as_str().ok()).unwrap_or_default().to_owned()
    };
    (c.raw_serial().to_vec(), cn(c.issuer()), cn(c.subject()))
}

fn identity(cert: &std::path::Path, key: &std::path::Path) -> Identity {
    let chain = CertificateDer::pem_file_iter(cert).unwrap().map(|c| c.unwrap()).collect();
    Identity { chain, key: PrivateKeyDer::from_pem_file(key).unwrap() }
}

const LIFETIME: Duration = Duration::from_secs(12);

/// Client and serving certificates issued for 12 s rotate at 70–90 % of
/// that, for 35 s, while the node keeps its Lease and status going and a
/// client polls :10250: no request fails (the fake refuses an expired
/// client certificate at every request, as the API server does), no
/// restart, and the kubelet's certificate metrics show the TTLs. A new
/// bearer token each round makes the webhooks ask the API server each
/// time: their TokenReviews and SubjectAccessReviews go with the node's
/// current certificate (the bootstrap token may not make them, and the
/// first certificate expires within the test).
#[test]
fn client_and_serving_certificates_rotate_without_a_restart() {
    let server = FakeApiServer::start(Options {
        tls: true,
        csr: Policy { approve_client: true, approve_serving: true, lifetime: LIFETIME },
        ..Default::default()
    })
    .unwrap();
    let name = format!("swl-rot-{}", std::process::id());
    let port = free_port();
    let ca = server.ca_file().unwrap();
    let mut agent = NodeProcess::on_fake_apiserver(
        &server,
        &name,
        port,
        &[
            format!("--client-ca-file={}", ca.display()),
            "--authentication-token-webhook=true".into(),
            "--authorization-mode=Webhook".into(),
        ],
        "rotateCertificates: true\nserverTLSBootstrap: true\n",
    );
    server.add_rule(AccessRule::allow());
    let pid = agent.pid().unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let pki = server.dir().join(&name).join("pki");
    let (cert, key) = server.client_cert("admin", &["system:masters"]).unwrap();
    let https = Https::new(addr, Some(identity(&cert, &key)));
    let client_serial = || {
        let pem = std::fs::read(pki.join("kubelet-client-current.pem")).ok()?;
        let der = CertificateDer::pem_slice_iter(&pem).next()?.ok()?;
        Some(describe(&der))
    };
    let mut serving = BTreeSet::new();
    let mut clients = BTreeSet::new();
    let mut failures = vec![];
    let mut served = 0;
    let mut tokens_served = 0;
    rt().block_on(async {
        // The serving certificate is issued within seconds of the start.
        let deadline = Instant::now() + Duration::from_secs(30);
        while https.connect().await.is_err() {
            assert!(Instant::now() < deadline, "no serving certificate within 30s\n{}", agent.log_text());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(35) {
            match https.connect().await {
                Ok(mut c) => {
                    let (serial, issuer, subject) = describe(&c.server_certs[0]);
                    assert_eq!(issuer, "fake-apiserver-ca", "served: the certificate the CSR got");
                    assert_eq!(subject, format!("system:node:{name}"));
                    serving.insert(serial);
                    match c.get("/healthz").await {
                        Ok(r) if r.status == 200 => served += 1,
                        other => failures.push(format!("{:?}: {other:?}", t0.elapsed())),
                    }
                }
                Err(e) => failures.push(format!("{:?}: {e:#}", t0.elapsed())),
            }
            // A token (and user) never seen before: reviewed now.
            let round = served + failures.len();
            let token = format!("rotation-token-{round}");
            server.set_token(&token, UserInfo::new(&format!("viewer-{round}"), &["viewers"]));
            match Https::new(addr, None).with_token(&token).get("/pods").await {
                Ok(r) if r.status == 200 => tokens_served += 1,
                other => failures.push(format!("{:?}: token {round}: {other:?}", t0.elapsed())),
            }
            if let Some((serial, issuer, subject)) = client_serial() {
                assert_eq!((issuer.as_str(), subject), ("fake-apiserver-ca", format!("system:node:{name}")));
                clients.insert(serial);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let metrics = https.get("/metrics").await.unwrap().text();
        for family in
            ["kubelet_certificate_manager_client_ttl_seconds", "kubelet_certificate_manager_server_ttl_seconds"]
        {
            let v: f64 = metrics
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{family} ")))
                .unwrap_or_else(|| panic!("{family} missing:\n{metrics}"))
                .parse()
                .unwrap();
            assert!((0.0..=LIFETIME.as_secs_f64()).contains(&v), "{family} {v}");
        }
        assert!(metrics.contains("kubelet_certificate_manager_client_expiration_renew_errors 0"), "{metrics}");
        assert!(metrics.contains("kubelet_certificate_manager_server_rotation_seconds_count"), "{metrics}");
    });
    agent.assert_running();
    assert_eq!(agent.pid(), Some(pid), "no restart");
    assert!(failures.is_empty(), "requests to :10250 failed during rotation: {failures:?}");
    assert!(served > 50, "{served} requests served");
    assert_eq!(tokens_served, served, "every new token was reviewed and allowed");
    assert!(serving.len() >= 3, "serving certificates seen over 35 s of 12 s certificates: {}", serving.len());
    assert!(clients.len() >= 3, "client certificates seen over 35 s of 12 s certificates: {}", clients.len());
    // The API server never saw an expired (or no) client certificate.
    let refused: Vec<_> = server.requests().into_iter().filter(|r| r.status == 401 || r.status == 403).collect();
    assert!(refused.is_empty(), "requests refused by the API server: {refused:?}");
    let node_user = format!("system:node:{name}");
    let reviews: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.uri.contains("/tokenreviews") || r.uri.contains("/subjectaccessreviews"))
        .collect();
    assert!(reviews.len() >= 2 * tokens_served, "{} reviews for {tokens_served} tokens", reviews.len());
    assert!(reviews.iter().all(|r| r.user == node_user && r.status == 201), "reviews: {reviews:?}");
    let leases = server
        .requests()
        .into_iter()
        .filter(|r| r.method == "PUT" && r.uri.contains("/leases/") && r.user == node_user)
        .count();
    assert!(leases >= 30, "{leases} Lease renewals as {node_user}");
    let log = agent.log_text();
    assert!(log.matches("certificate rotated").count() >= 4, "{log}");
    assert!(agent.stop());
}

/// --client-ca-file is read again when it changes: a client of the new CA
/// is let in and one of the old CA refused, without a restart.
#[test]
fn client_ca_file_changes_apply_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.crt");
    let (old, new) = (TestCa::new("old-client-ca"), TestCa::new("new-client-ca"));
    old.write(&ca_file);
    let agent = RunningAgent::start(&[
        format!("--client-ca-file={}", ca_file.display()),
        "--authorization-mode=AlwaysAllow".into(),
    ]);
    let pid = agent.pid();
    rt().block_on(async {
        let old_client = agent.https(Some(old.client("admin", &[])));
        let new_client = agent.https(Some(new.client("admin", &[])));
        assert_eq!(old_client.get("/pods").await.unwrap().status, 200);
        assert_eq!(new_client.get("/pods").await.unwrap().status, 401);
        let tmp = dir.path().join("ca.crt.new");
        new.write(&tmp);
        std::fs::rename(&tmp, &ca_file).unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        while new_client.get("/pods").await.unwrap().status != 200 {
            assert!(Instant::now() < deadline, "the new client CA was not picked up\n{}", agent.log_text());
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert_eq!(old_client.get("/pods").await.unwrap().status, 401, "the old CA no longer applies");
        // A broken file leaves the last good CA in effect.
        std::fs::write(&ca_file, "garbage").unwrap();
        tokio::time::sleep(Duration::from_secs(7)).await;
        assert_eq!(new_client.get("/pods").await.unwrap().status, 200);
    });
    assert_eq!(agent.pid(), pid, "no restart");
    assert!(agent.log_text().contains("client CA reloaded"));
}
