//! Secrets and state on disk: the real binary bootstraps its client
//! certificate with a bootstrap token against the fake API server, logging
//! at the most verbose level (`--v=10`: trace for every crate). Neither the
//! token nor the private key may appear in its log; the root dir and the
//! cert dir are root-only (0700, an existing root dir open to others is
//! tightened) and the key and kubeconfig files 0600.
//!
//! swiftlet pins no BPF map or program: they live only as long as the
//! agent's file descriptors, so there is nothing under /sys/fs/bpf to
//! protect (`grep -rn "pin(" agent/src` finds none).

use std::{os::unix::fs::PermissionsExt, path::Path, time::Duration};

use serde_json::Value;
use swiftlet_tests::{
    apiserver::{Credentials, FakeApiServer, Options, auth::UserInfo, resources::NODES},
    node_process::NodeProcess,
};

const TOKEN_ID: &str = "swlsec";
const TOKEN_SECRET: &str = "0f1e2d3c4b5a6978";

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions().mode() & 0o7777
}

fn ready(node: &Value) -> bool {
    node.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

#[test]
fn no_secret_in_the_log_and_state_is_root_only() {
    let name = format!("swl-sec-{}", std::process::id());
    let server = FakeApiServer::start(Options { tls: true, ..Default::default() }).unwrap();
    let token = format!("{TOKEN_ID}.{TOKEN_SECRET}");
    server.set_token(&token, UserInfo::new(&format!("system:bootstrap:{TOKEN_ID}"), &["system:bootstrappers"]));
    let bootstrap = server.dir().join("bootstrap.kubeconfig");
    server.write_kubeconfig(&bootstrap, &Credentials::Token(token.clone())).unwrap();
    let state = tempfile::tempdir().unwrap();
    // A root dir that exists, open to everyone: the agent closes it.
    let root = state.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let kubeconfig = state.path().join("kubelet.conf");
    let pki = state.path().join("pki");
    let extra = vec![
        format!("--bootstrap-kubeconfig={}", bootstrap.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--cert-dir={}", pki.display()),
        format!("--root-dir={}", root.display()),
        format!("--hostname-override={name}"),
        "--v=10".into(),
    ];
    let config = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nnodeStatusUpdateFrequency: 1s\nevictionHard:\n  memory.available: 100Mi\n";
    // What --v=10 sets when RUST_LOG is not given.
    let mut agent = NodeProcess::start_logging(Some(config), &extra, "trace,kube_client::client::builder=off");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !server.get(&NODES, "", &name).is_some_and(|n| ready(&n)) {
        agent.assert_running();
        assert!(std::time::Instant::now() < deadline, "the node did not register within 60s\n{}", agent.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    // A few status updates and lease renewals with the new credentials.
    std::thread::sleep(Duration::from_secs(3));
    assert!(agent.stop(), "swiftlet stops on SIGTERM");

    let log = agent.log_text();
    assert!(log.lines().count() > 50, "the trace log is there: {} lines", log.lines().count());
    assert!(log.contains("client certificate issued"), "the bootstrap ran:\n{log}");
    assert!(!log.contains(TOKEN_SECRET), "the bootstrap token's secret is in the log");
    assert!(!log.contains("PRIVATE KEY"), "a private key is in the log");
    let pem_link = pki.join("kubelet-client-current.pem");
    let pem = std::fs::read_to_string(&pem_link).expect("the client certificate and key");
    let key_body: Vec<&str> = pem
        .split("-----BEGIN PRIVATE KEY-----")
        .nth(1)
        .and_then(|k| k.split("-----END PRIVATE KEY-----").next())
        .expect("a PKCS#8 key in the pem")
        .lines()
        .filter(|l| l.len() >= 16)
        .collect();
    assert!(!key_body.is_empty());
    for line in key_body {
        assert!(!log.contains(line), "a line of the private key is in the log");
    }

    assert_eq!(mode(&root), 0o700, "the root dir");
    assert_eq!(mode(&pki), 0o700, "the cert dir");
    assert_eq!(mode(&kubeconfig), 0o600, "the kubeconfig");
    let mut files = 0;
    for e in std::fs::read_dir(&pki).unwrap().flatten() {
        let p = e.path();
        if std::fs::symlink_metadata(&p).unwrap().file_type().is_symlink() {
            continue;
        }
        // Certificates are public (the kubelet writes them 0644); keys and
        // anything else are for root alone.
        if p.extension().is_some_and(|e| e == "crt") {
            assert_eq!(mode(&p) & 0o022, 0, "{} is writable by others", p.display());
        } else {
            assert_eq!(mode(&p), 0o600, "{}", p.display());
        }
        files += 1;
    }
    assert!(files >= 1, "the key file is in {}", pki.display());
}
