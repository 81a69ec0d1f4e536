//! Kernel-level observability end to end: /debug/events streaming a real
//! threshold crossing from the eBPF programs with its pod, `swiftlet events`
//! reading the agent's stream and attaching by itself to report a real OOM
//! kill, and `swiftlet top` drawing real pods under tmux, and finding the
//! running agent's pods without its flags.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Child, Command, Stdio},
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use swiftlet::signals::{
    CgroupKind, SignalEvent, SignalSource, Target, Threshold,
    ebpf::{EbpfOptions, EbpfSource},
};
use swiftlet_common::Signal;
use swiftlet_tests::{
    cgroup::TestCgroup,
    cri::{self, StaticPods, TestPod},
    https::read_until,
    kubelet::{InProcess, swiftlet_binary},
    prereq,
    workload::{self, Steps},
};

const MIB: u64 = 1 << 20;

/// A child process killed (by its PID) on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Lines of a child's pipe, read on a thread.
fn lines(r: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

fn wait_line(rx: &mpsc::Receiver<String>, timeout: Duration, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + timeout;
    let mut seen = vec![];
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) if ok(&l) => return l,
            Ok(l) => seen.push(l),
            Err(_) => panic!("no line with {what} within {timeout:?}; lines seen: {seen:#?}"),
        }
    }
}

fn pod(uid: &str, name: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            uid: Some(uid.into()),
            name: Some(name.into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[test]
fn debug_events_stream_kernel_crossings_with_their_pod() {
    prereq::require_root();
    prereq::require_btf();
    let tc = TestCgroup::new();
    let cg = tc.child("kubepods/besteffort/podevt-uid");
    let src = Arc::new(EbpfSource::load(tc.fs.clone(), &EbpfOptions::default()).expect("load the eBPF programs"));
    src.register(&cg, CgroupKind::Pod).unwrap();
    let base = src.snapshot().unwrap().cgroups[&cg].working_set_bytes;
    let trigger = base + 16 * MIB;
    src.set_threshold(
        &Target::Cgroup(cg.clone()),
        Signal::MemoryWorkingSet,
        Some(Threshold { trigger, rearm: base + 8 * MIB }),
    )
    .unwrap();
    let (tx, _) = tokio::sync::broadcast::channel(64);
    let sink_tx = tx.clone();
    src.subscribe(Arc::new(move |e: SignalEvent| {
        let _ = sink_tx.send(e);
    }));
    let pods = Arc::new(StaticPods::default());
    pods.set(vec![pod("evt-uid", "evt-pod")]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let s = InProcess::start(pods, &tc.root, None, &[]).await;
        s.events.forward(tx.subscribe());
        let (status, mut body) = s.https(None).stream("/debug/events").await.unwrap();
        assert_eq!(status, 200);
        // `swiftlet events` reads the same stream from the debug socket.
        let sock = swiftlet::server::debug_socket_path(s.dir.path());
        let mut cli = Command::new(swiftlet_binary())
            .args(["events", &format!("--socket={}", sock.display())])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("swiftlet events");
        let cli_lines = lines(cli.stdout.take().unwrap());
        let _cli = Killed(cli);
        // Give both streams a moment to subscribe.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut w = tokio::task::spawn_blocking({
            let fs = tc.fs.clone();
            let cg = cg.clone();
            move || {
                let mut w = Steps::spawn(&fs, &cg);
                w.run("anon 32");
                w
            }
        })
        .await
        .unwrap();
        let text =
            read_until(&mut body, Duration::from_secs(10), |t| t.contains("\"type\":\"crossing\"")).await.unwrap();
        let line = text.lines().find(|l| l.contains("\"type\":\"crossing\"")).unwrap();
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(
            v["pod"],
            serde_json::json!({"namespace": "default", "name": "evt-pod", "uid": "evt-uid"}),
            "{line}"
        );
        assert_eq!((v["direction"].as_str(), v["target"].as_str()), (Some("up"), Some("cgroup")));
        assert_eq!(v["cgroup"].as_str(), Some(cg.as_str()));
        assert_eq!(v["threshold"].as_u64(), Some(trigger), "{line}");
        assert!(v["kernel_ns"].as_u64().unwrap() > 0 && v["received_ns"].as_u64() >= v["kernel_ns"].as_u64());
        assert!(v["time"].as_str().unwrap().ends_with('Z'));
        let from_cli = wait_line(&cli_lines, Duration::from_secs(10), "a crossing from swiftlet events", |l| {
            l.contains("\"type\":\"crossing\"")
        });
        assert_eq!(serde_json::from_str::<serde_json::Value>(&from_cli).unwrap()["pod"]["name"], "evt-pod");
        w.run("free-anon");
        s.shutdown().await;
    });
}

#[test]
fn swiftlet_events_attaches_and_reports_an_oom_kill_with_its_pod() {
    prereq::require_root();
    prereq::require_btf();
    let tc = TestCgroup::new();
    let container = tc.child("kubepods/burstable/podoom-uid/c0ffee");
    tc.fs.set_memory_limit(&container, Some(32 * MIB)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut events = Command::new(swiftlet_binary())
        .args([
            "events",
            "--attach",
            &format!("--cgroup-root={}", tc.root),
            &format!("--root-dir={}", dir.path().display()),
            &format!("--container-runtime-endpoint=unix://{}/none.sock", dir.path().display()),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("swiftlet events --attach");
    let out = lines(events.stdout.take().unwrap());
    let err = lines(events.stderr.take().unwrap());
    let _events = Killed(events);
    let attached = wait_line(&err, Duration::from_secs(30), "the attach message", |l| l.contains("attached"));
    assert!(attached.contains("ebpf source"), "{attached}");
    // A process in the container allocates past its limit.
    let mut cmd = Command::new(workload::binary());
    cmd.arg("steps").stdin(Stdio::piped()).stdout(Stdio::null());
    workload::in_cgroup(&mut cmd, &tc.fs, &container);
    let mut hog = cmd.spawn().unwrap();
    writeln!(hog.stdin.take().unwrap(), "anon 64").unwrap();
    let status = hog.wait().unwrap();
    assert!(!status.success(), "the hog must be OOM-killed ({status})");
    let line = wait_line(&out, Duration::from_secs(10), "an oom_kill", |l| l.contains("\"type\":\"oom_kill\""));
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["pod"]["uid"], "oom-uid", "{line}");
    assert_eq!(v["cgroup"].as_str(), Some(container.as_str()), "{line}");
    assert!(v["kernel_ns"].as_u64().unwrap() > 0);
    assert!(v["pid"].as_u64().unwrap() > 0);
}

/// tmux on a server socket of our own.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn new() -> Tmux {
        if Command::new("tmux").arg("-V").stdout(Stdio::null()).status().is_err() {
            panic!("this test needs tmux (Debian package tmux; `cargo xtask test` installs it)");
        }
        Tmux { socket: format!("swiftlet-test-{}", std::process::id()) }
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux").args(["-L", &self.socket]).args(args).output().expect("tmux");
        assert!(out.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn capture(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "top"])
    }

    /// Captures until `ok` holds.
    fn wait(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let screen = self.capture();
            if ok(&screen) {
                return screen;
            }
            assert!(Instant::now() < deadline, "the pane never showed {what}:\n{screen}");
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["-L", &self.socket, "kill-server"]).stderr(Stdio::null()).status();
    }
}

#[test]
fn swiftlet_top_shows_pods_live_under_tmux() {
    prereq::require_root();
    let tmux = Tmux::new();
    let tc = TestCgroup::new();
    let logs = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _entered = rt.enter();
    let client = cri::client();
    let hog = rt.block_on(TestPod::start(
        client.clone(),
        &tc.root,
        logs.path(),
        "top-pod",
        // The loop keeps the shell (and its 24 MB variable) from exec'ing sleep.
        &[
            ("hog", "x=$(yes aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa | head -c 24000000); while true; do sleep 3600; done"),
            ("idle", "sleep 3600"),
        ],
    ));
    let quiet = rt.block_on(TestPod::start(client, &tc.root, logs.path(), "quiet-pod", &[("idle", "sleep 3600")]));
    let hog_cg = hog.container_cgroup("hog");
    let deadline = Instant::now() + Duration::from_secs(30);
    while tc.fs.memory_usage(&hog_cg).unwrap_or(0) < 20 * MIB {
        assert!(
            Instant::now() < deadline,
            "the hog never reached 20 MiB: usage {:?}, stat {:?}, procs {:?}, log {:?}",
            tc.fs.memory_usage(&hog_cg),
            tc.fs.memory_stat(&hog_cg),
            tc.fs.procs(&hog_cg),
            std::fs::read_to_string(hog.log_dir.join("hog/0.log"))
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let cmd = format!(
        "{} top --cgroup-root={} --container-runtime-endpoint={} --interval=0.5",
        swiftlet_binary().display(),
        tc.root,
        cri::endpoint()
    );
    tmux.run(&["new-session", "-d", "-s", "top", "-x", "200", "-y", "40", &cmd]);
    let screen = tmux.wait("both pods and the hog's container", |s| {
        s.contains("top-pod") && s.contains("quiet-pod") && s.contains("└ hog") && s.contains("└ idle")
    });
    assert!(screen.contains("swiftlet top · node"), "{screen}");
    let row = screen.lines().find(|l| l.contains("└ hog")).unwrap();
    let cols: Vec<&str> = row.split_whitespace().collect();
    // NAMESPACE POD └ CONTAINER WORKING-SET LIMIT HEADROOM PROCS INODES
    assert_eq!((cols[0], cols[1], cols[3]), ("default", "top-pod", "hog"), "{row}");
    let ws = cols[4];
    let mib: f64 = ws.strip_suffix("Mi").unwrap_or_else(|| panic!("working set in Mi: {row}")).parse().unwrap();
    assert!(
        mib >= 20.0,
        "the hog holds 24 MB: {row}\ncgroupfs {hog_cg}: usage {:?}, stat {:?}\n{screen}",
        tc.fs.memory_usage(&hog_cg),
        tc.fs.memory_stat(&hog_cg)
    );
    assert!(cols[7].parse::<u64>().unwrap() >= 1, "processes: {row}");
    // Sorted by memory: the hog's pod comes first.
    let first_pod = screen.lines().position(|l| l.contains("top-pod")).unwrap();
    let other_pod = screen.lines().position(|l| l.contains("quiet-pod")).unwrap();
    assert!(first_pod < other_pod, "{screen}");
    // Filter from the keyboard.
    tmux.run(&["send-keys", "-t", "top", "/", "q", "u", "i", "e", "t", "Enter"]);
    let filtered = tmux.wait("only quiet-pod", |s| s.contains("filter quiet") && !s.contains("top-pod"));
    assert!(filtered.contains("quiet-pod") && filtered.contains("1 pods"), "{filtered}");
    tmux.run(&["send-keys", "-t", "top", "Escape"]);
    tmux.wait("both pods again", |s| s.contains("top-pod") && s.contains("quiet-pod"));
    // Sort by name: quiet-pod before top-pod.
    tmux.run(&["send-keys", "-t", "top", "n"]);
    let by_name = tmux.wait("sort by name", |s| s.contains("sort name"));
    let q = by_name.lines().position(|l| l.contains("quiet-pod")).unwrap();
    let t = by_name.lines().position(|l| l.contains("top-pod")).unwrap();
    assert!(q < t, "{by_name}");
    tmux.run(&["send-keys", "-t", "top", "q"]);
    drop(quiet);
    drop(hog);
}

/// `swiftlet top` looks where the running agent looks: given only the
/// agent's pid (several agents run on this shared machine; with one,
/// nothing at all is needed), it reads the agent's command line (config
/// file, root dir, cgroup root, runtime endpoint) and lists its pods.
#[test]
fn swiftlet_top_finds_the_running_agents_pods_without_its_flags() {
    prereq::require_root();
    let _ = cri::endpoint();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(
        manifests.join("watched.yaml"),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: watched\nspec:\n  hostNetwork: true\n  containers:\n  - name: sleeper\n    image: {}\n    command: [\"sleep\", \"3600\"]\n",
            cri::BUSYBOX_IMAGE
        ),
    )
    .unwrap();
    let agent = swiftlet_tests::kubelet::RunningAgent::start(&[
        format!("--pod-manifest-path={}", manifests.display()),
        "--authorization-mode=AlwaysAllow".into(),
    ]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = Command::new(swiftlet_binary())
            .args(["top", "--once", "--agent-pid", &agent.pid().to_string()])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "swiftlet top failed: {stderr}");
        assert!(stderr.contains(&format!("the agent's (pid {})", agent.pid())), "{stderr}");
        if stdout.lines().any(|l| l.contains("watched-test-node")) && stdout.contains("└ sleeper") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "top never listed the agent's pod:\n{stdout}\n{stderr}\nagent log:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}
