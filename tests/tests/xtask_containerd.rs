//! `cargo xtask containerd` stopped with Ctrl-C, as from a terminal (SIGINT
//! to its whole process group), leaves nothing of its containers: their
//! processes (the sandbox's pause and the container's own) are gone, and so
//! are their cgroups.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use swiftlet::cri::CriClient;
use swiftlet_tests::{
    cgroup::TestCgroup,
    prereq,
    sandbox::{PodOptions, TestPod},
    workload::sibling_binary,
};

fn alive(pid: i32) -> bool {
    // A zombie has been killed; only its parent has not reaped it yet.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next()) != Some("Z"))
}

#[test]
fn ctrl_c_of_xtask_containerd_stops_the_containers_and_removes_their_cgroups() {
    prereq::require_root();
    let mut xtask = Command::new(sibling_binary("xtask"));
    xtask.arg("containerd").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    // A terminal's job: a process group of its own, which Ctrl-C signals.
    std::os::unix::process::CommandExt::process_group(&mut xtask, 0);
    let mut child = xtask.spawn().expect("start target/debug/xtask (cargo build --workspace builds it)");
    let pgid = child.id() as i32;
    struct Interrupt(i32);
    impl Drop for Interrupt {
        fn drop(&mut self) {
            // SAFETY: the process group this test started (a leftover on failure).
            unsafe { libc::kill(-self.0, libc::SIGINT) };
        }
    }
    let guard = Interrupt(pgid);
    // xtask reports on stderr; every line is kept for the failure message.
    let (tx, rx) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let mut said = vec![];
    let endpoint = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(180))
            .unwrap_or_else(|e| panic!("xtask containerd printed no endpoint ({e}):\n{}", said.join("\n")));
        said.push(line.clone());
        if let Some(ep) = line.split("CONTAINER_RUNTIME_ENDPOINT=").nth(1) {
            break ep.trim().to_owned();
        }
    };

    // A pod and its container, as an agent would have made them.
    let tc = TestCgroup::new();
    let logs = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // The client's channel connects on this runtime's reactor.
    let _entered = rt.enter();
    let cri = Arc::new(CriClient::new(&endpoint, Duration::from_secs(60)).unwrap());
    let pod = rt.block_on(TestPod::start(
        cri.clone(),
        PodOptions { name: "ctrl-c", logs_root: logs.path(), cgroup: &tc, foreign: false },
    ));
    let id = rt.block_on(pod.container("sleeper", 0, "sleep 3600", true));
    let pod_cgroup = format!("{}/pod{}", tc.root, pod.identity.uid);
    let container_cgroup = format!("{pod_cgroup}/{id}");
    let sandbox_cgroup = format!("{pod_cgroup}/{}", pod.id);
    let pids: Vec<i32> = [&container_cgroup, &sandbox_cgroup]
        .iter()
        .flat_map(|c| tc.fs.procs(c).unwrap_or_default())
        .map(|p| p as i32)
        .collect();
    assert!(pids.len() >= 2, "the pause and sleep processes: {pids:?}");

    // Ctrl-C.
    drop(guard);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "xtask containerd did not stop within 60s of Ctrl-C");
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_millis(200));
    said.extend(rx.try_iter());
    let stderr = said.join("\n");
    assert!(status.success(), "xtask containerd exited with {status}: {stderr}");
    let left: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    assert!(left.is_empty(), "container processes still running after Ctrl-C: {left:?}\n{stderr}");
    for c in [&container_cgroup, &sandbox_cgroup] {
        assert!(!tc.fs.exists(c), "{c} is still there after Ctrl-C");
    }
    // The pod's cgroup is the agent's (or here the test's) to remove.
    std::mem::forget(pod);
}
