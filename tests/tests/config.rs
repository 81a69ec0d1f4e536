//! The real `swiftlet` binary on malformed configurations: exit code 1 and
//! one exact message naming the file and line (or flag) and the field.
//! Cases live in tests/fixtures/bad-config (see its README).

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
};

/// target/<profile>/swiftlet, built beside the test binaries.
fn swiftlet() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test> → target/<profile>/swiftlet
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let p = dir.join("swiftlet");
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build -p swiftlet` (cargo xtask test builds the workspace first)",
        p.display()
    );
    p
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/bad-config")
}

fn run(dir: &Path, args: &[String]) -> Output {
    Command::new(swiftlet())
        .args(args)
        .current_dir(dir)
        // The message must not depend on the caller's log settings.
        .env_remove("RUST_LOG")
        .output()
        .expect("run swiftlet")
}

#[test]
fn bad_configs_exit_1_with_their_message() {
    let dir = fixtures();
    let mut cases: Vec<PathBuf> = fs::read_dir(&dir)
        .expect("fixtures/bad-config")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "expected"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 15, "expected the bad-config fixtures in {}, found {}", dir.display(), cases.len());
    let mut failures = vec![];
    for expected_file in &cases {
        let name = expected_file.file_stem().unwrap().to_string_lossy().into_owned();
        let expected = fs::read_to_string(expected_file).unwrap();
        let args_file = dir.join(format!("{name}.args"));
        let args: Vec<String> = if args_file.exists() {
            fs::read_to_string(&args_file).unwrap().lines().map(str::to_owned).collect()
        } else {
            vec![format!("--config={name}.yaml")]
        };
        let out = run(&dir, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        println!("{name}: exit {:?}: {}", out.status.code(), stderr.trim_end());
        if out.status.code() != Some(1) {
            failures.push(format!("{name}: exit code {:?}, expected 1", out.status.code()));
        }
        if stderr != expected {
            failures.push(format!("{name}:\n  expected: {}\n  got:      {}", expected.trim_end(), stderr.trim_end()));
        }
        if !out.stdout.is_empty() {
            failures.push(format!("{name}: unexpected stdout {:?}", String::from_utf8_lossy(&out.stdout)));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn help_lists_the_flags_and_version_prints() {
    let dir = fixtures();
    let help = run(&dir, &["--help".into()]);
    assert_eq!(help.status.code(), Some(0));
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--config string",
        "--config-dir string",
        "--kubeconfig string",
        "--eviction-hard mapStringString",
        "--kube-reserved mapStringString",
        "--register-with-taints",
        "--signal-source string",
        "--kernel-eviction",
        "--housekeeping-interval duration",
        "--standalone",
        "-v, --v int32",
    ] {
        assert!(text.contains(flag), "--help does not list {flag}:\n{text}");
    }
    // Help is answered before any file is read.
    let help_first = run(&dir, &["--config=missing.yaml".into(), "-h".into()]);
    assert_eq!(help_first.status.code(), Some(0));

    let version = run(&dir, &["--version".into()]);
    assert_eq!(version.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&version.stdout).trim(), format!("swiftlet v{}", env!("CARGO_PKG_VERSION")));
}

/// Settings swiftlet accepts but does not act on are named once in the
/// log at start, each with what is in effect instead; the agent runs.
#[test]
fn unimplemented_settings_are_logged_once_at_start() {
    // Only memory evicts: the shared disk here is often past the default
    // nodefs and imagefs thresholds, whose reclaim would delete the
    // locally built test images.
    let config = "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
evictionHard:
  memory.available: 100Mi
hairpinMode: hairpin-veth
cpuManagerReconcilePeriod: 5s
kubeletCgroups: /kubelet.slice
featureGates:
  MemoryQoS: true
";
    let extra = vec!["--standalone".to_owned(), "--lock-file=/run/swiftlet-test.lock".to_owned()];
    let mut agent = swiftlet_tests::node_process::NodeProcess::start(Some(config), &extra);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !agent.log_text().contains("swiftlet started") {
        agent.assert_running();
        assert!(std::time::Instant::now() < deadline, "the agent did not start:\n{}", agent.log_text());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let log = agent.log_text();
    for line in [
        "KubeletConfiguration hairpinMode: \"hairpin-veth\" is not implemented (the runtime's CNI network configures hairpin traffic); in effect: \"none\"",
        "KubeletConfiguration cpuManagerReconcilePeriod: \"5s\" is not implemented (swiftlet has no CPU manager); in effect: \"10s\"",
        "KubeletConfiguration kubeletCgroups: \"/kubelet.slice\" is not implemented (swiftlet stays in the cgroup it was started in)",
        "KubeletConfiguration featureGates: MemoryQoS=true is not implemented",
        "--lock-file is not implemented (no lock file is taken)",
    ] {
        assert_eq!(log.matches(line).count(), 1, "{line:?} once in:\n{log}");
    }
    assert!(agent.stop(), "the agent stops on SIGTERM");
}
