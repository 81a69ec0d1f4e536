//! A full nodefs. The agent's root dir, its pods' log dir and the root of a
//! containerd of the test's own all live on one small tmpfs the test mounts
//! (size and inode limits), as on a node with a single disk: nodefs is the
//! root dir's filesystem and the images share it.
//!
//! A pod filling an emptyDir raises DiskPressure; the agent first reclaims
//! node-level resources (the dead containers of a finished pod, an image no
//! container uses), and as the pod keeps writing, evicts it, the pod with
//! the most bytes on nodefs, while a pod beside it keeps running. The agent
//! is then SIGKILLed while it still reports the pressure and started again:
//! its state files parse, it reuses them, and it re-adopts the surviving pod
//! with zero restarts. A second test fills a tiny filesystem (bytes, then
//! inodes) and checks that the agent's atomic writer fails cleanly there and
//! leaves the old file whole.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::Value;
use swiftlet::cri::{ImageService, api};
use swiftlet_tests::{
    agent::{AgentProcess, AgentSetup},
    containerd::TestContainerd,
    https::Https,
    kubelet::free_port,
    registry::Registry,
    tmpfs::SmallFs,
};

const BUSYBOX: &str = "swiftlet.local/busybox:1.35";
const MI: u64 = 1 << 20;
/// The small disk, and the hard threshold on it.
const DISK: u64 = 160 * MI;
const THRESHOLD: u64 = 56 * MI;

/// The log without colour codes.
fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' && chars.peek() == Some(&'[') {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn pod(name: &str, body: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n{body}"
    )
}

/// Ran once and finished: its dead containers are for reclaim.
fn done() -> String {
    pod(
        "done",
        &format!(
            "  restartPolicy: Never\n  containers:\n  - name: a\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"echo finished\"]\n  - name: b\n    image: {BUSYBOX}\n    command: [\"true\"]\n"
        ),
    )
}

fn steady() -> String {
    pod(
        "steady",
        &format!(
            "  containers:\n  - name: steady\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"echo up; exec sleep 3600\"]\n    readinessProbe:\n      exec: {{command: [\"cat\", \"/etc/hostname\"]}}\n      periodSeconds: 1\n"
        ),
    )
}

/// Writes 1 MiB every 100 ms into a disk emptyDir for as long as it lives
/// (a failed write, once the disk is full, is tried again).
fn filler() -> String {
    pod(
        "filler",
        &format!(
            "  containers:\n  - name: fill\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"i=0; while :; do dd if=/dev/zero of=/scratch/f$i bs=1048576 count=1 2>/dev/null && i=$((i+1)); sleep 0.1; done\"]\n    volumeMounts:\n    - {{name: scratch, mountPath: /scratch}}\n  volumes:\n  - name: scratch\n    emptyDir: {{}}\n"
        ),
    )
}

fn uid(setup: &AgentSetup, file: &str) -> String {
    swiftlet::pods::manifest::load(&setup.manifests.join(file), &setup.node).unwrap().metadata.uid.unwrap()
}

const RUNNING: i32 = api::ContainerState::ContainerRunning as i32;
const EXITED: i32 = api::ContainerState::ContainerExited as i32;

fn wait_until(what: &str, timeout: Duration, log: impl Fn() -> String, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "{what} did not happen within {timeout:?}\n{}", log());
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn text(agent: &AgentProcess) -> String {
    plain(&agent.log())
}

/// The log of the agent's second run.
fn second(agent: &AgentProcess, from: usize) -> String {
    text(agent)[from..].to_owned()
}

/// The pods the agent reports on :10250/pods, by name.
fn pods(agent: &AgentProcess, https: &Https) -> Vec<Value> {
    let Ok(r) = agent.rt.block_on(https.get("/pods")) else { return vec![] };
    if r.status != 200 {
        return vec![];
    }
    let list: Value = serde_json::from_slice(&r.body).unwrap_or_default();
    list["items"].as_array().cloned().unwrap_or_default()
}

fn status_of(agent: &AgentProcess, https: &Https, name: &str) -> Option<Value> {
    // Static pods are named <name>-<node>.
    let name = format!("{name}-{}", agent.setup.node);
    pods(agent, https).into_iter().find(|p| p["metadata"]["name"].as_str() == Some(&name)).map(|p| p["status"].clone())
}

fn steady_ok(s: &Value) -> bool {
    s["phase"] == "Running"
        && s["containerStatuses"]
            .as_array()
            .is_some_and(|cs| cs.len() == 1 && cs[0]["ready"] == true && cs[0]["restartCount"] == 0)
}

/// The regular files under `dir`, relative.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                out.push(e.path().strip_prefix(dir).unwrap().to_owned());
            }
        }
    }
    out.sort();
    out
}

/// The agent's own state files must parse: the serving certificate and key
/// it reuses at start, and no half-written temporary file anywhere.
fn check_state_files(root: &Path) -> Vec<PathBuf> {
    let files = files_under(root);
    let leftovers: Vec<&PathBuf> = files.iter().filter(|f| f.to_string_lossy().contains(".tmp")).collect();
    assert!(leftovers.is_empty(), "temporary files left in the root dir: {leftovers:?}");
    let pki = root.join("pki");
    let certs = swiftlet::server::tls::read_certs(&pki.join("kubelet.crt")).expect("kubelet.crt parses");
    assert!(!certs.is_empty());
    swiftlet::server::tls::read_key(&pki.join("kubelet.key")).expect("kubelet.key parses");
    files
}

#[test]
fn a_full_nodefs_reclaims_first_then_evicts_the_filler_and_state_survives_a_sigkill() {
    // Dropped last: everything below lives on it.
    let disk = SmallFs::mount(DISK, 20_000);
    let root_dir = disk.path().join("root");
    let logs_dir = disk.path().join("logs");
    std::fs::create_dir_all(&logs_dir).unwrap();

    // An image no container will use, pulled from a registry of the test's own.
    let registry = Registry::start();
    let unused = registry.add_image("nodefs/unused", "1", "");
    let ctd = TestContainerd::start_with_root("nodefs", Some(&disk.path().join("containerd")));

    let mut setup = AgentSetup::new(
        &format!(
            "evictionHard:\n  memory.available: 100Mi\n  nodefs.available: \"{THRESHOLD}\"\n  nodefs.inodesFree: \"5%\"\n\
             evictionPressureTransitionPeriod: 60s\nimageMinimumGCAge: 1s\n"
        ),
        &[
            "--signal-source=cgroupfs",
            "--evict-static-pods",
            &format!("--container-runtime-endpoint={}", ctd.endpoint()),
            &format!("--root-dir={}", root_dir.display()),
            &format!("--cert-dir={}", root_dir.join("pki").display()),
            "--housekeeping-interval=2s",
            "--address=127.0.0.1",
            "--anonymous-auth=true",
            "--authorization-mode=AlwaysAllow",
        ],
    );
    let port = free_port();
    setup.args.push(format!("--port={port}"));
    setup.args.push(format!("--healthz-port={}", free_port()));
    // The pods' logs on the small disk too: a drop-in, as an operator would.
    let drop_ins = setup.dir.path().join("kubelet.conf.d");
    std::fs::create_dir_all(&drop_ins).unwrap();
    std::fs::write(
        drop_ins.join("10-logs.conf"),
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\npodLogsDir: {}\n",
            logs_dir.display()
        ),
    )
    .unwrap();
    setup.args.push(format!("--config-dir={}", drop_ins.display()));
    setup.add_manifest("done.yaml", &done());
    setup.add_manifest("steady.yaml", &steady());
    let (done_uid, steady_uid) = (uid(&setup, "done.yaml"), uid(&setup, "steady.yaml"));

    let mut agent = AgentProcess::start(setup);
    let https = Https::new(std::net::SocketAddr::from(([127, 0, 0, 1], port)), None);
    agent.rt.block_on(agent.cri.pull_image(&unused.reference, None, None)).expect("pull the unused image");

    // The finished pod's containers are dead, the steady pod runs.
    let dead = |a: &AgentProcess| {
        let (_, c) = a.runtime_state(&done_uid);
        c.len() == 2 && c.iter().all(|c| c.state == EXITED)
    };
    wait_until("the finished pod's containers exited", Duration::from_secs(60), || text(&agent), || dead(&agent));
    wait_until(
        "the steady pod ready",
        Duration::from_secs(60),
        || format!("{:?}\n{}", status_of(&agent, &https, "steady"), text(&agent)),
        || status_of(&agent, &https, "steady").is_some_and(|s| steady_ok(&s)),
    );
    let steady_before = agent.runtime_state(&steady_uid);
    assert_eq!(steady_before.1.len(), 1);
    assert_eq!(steady_before.1[0].state, RUNNING);
    let images_before: Vec<String> =
        agent.rt.block_on(agent.cri.list_images()).unwrap().into_iter().flat_map(|i| i.repo_tags).collect();
    assert!(images_before.contains(&unused.reference), "{images_before:?}");
    let (available, total, inodes_free) = disk.stat();
    println!(
        "nodefs: {} MiB of {} MiB available, {inodes_free} inodes free; threshold {} MiB",
        available / MI,
        total / MI,
        THRESHOLD / MI
    );
    assert!(available > THRESHOLD + 40 * MI, "room for the filler to cross the threshold: {available}");
    assert!(!text(&agent).contains("DiskPressure"), "no pressure before the filler:\n{}", text(&agent));

    // The filler: DiskPressure, reclaim, then its eviction.
    let filler_uid = {
        std::fs::write(agent.setup.manifests.join("filler.yaml"), filler()).unwrap();
        uid(&agent.setup, "filler.yaml")
    };
    wait_until(
        "the filler evicted",
        Duration::from_secs(120),
        || text(&agent),
        || status_of(&agent, &https, "filler").is_some_and(|s| s["reason"] == "Evicted"),
    );
    let evicted_at = text(&agent);
    let filler = status_of(&agent, &https, "filler").unwrap();
    println!("filler: {}", filler["message"]);

    // In order: the condition, the reclaim, then the eviction.
    let at =
        |needle: &str| evicted_at.find(needle).unwrap_or_else(|| panic!("the log has no {needle:?}:\n{evicted_at}"));
    let pressure = at("node pressure conditions changed conditions=[\"DiskPressure\"]");
    let reclaim = at("disk pressure: reclaiming dead containers and unused images first");
    let reclaimed = at("reclaimed node-level disk resources");
    let evicting = at("evicting: The node was low on resource: ephemeral-storage.");
    assert!(pressure < reclaim && reclaim < reclaimed && reclaimed < evicting, "{evicted_at}");
    let reclaim_line = evicted_at[reclaimed..].lines().next().unwrap();
    println!("{reclaim_line}");
    assert!(reclaim_line.contains("containers=2"), "both dead containers removed: {reclaim_line}");
    assert!(!reclaim_line.contains("images=0"), "the unused image removed: {reclaim_line}");

    // The reclaim, seen from the runtime: the finished pod's containers and
    // sandbox are gone (and it did not run again), the unused image too;
    // the images in use stay.
    assert_eq!(agent.runtime_state(&done_uid), (vec![], vec![]), "the dead containers were removed");
    let images: Vec<String> =
        agent.rt.block_on(agent.cri.list_images()).unwrap().into_iter().flat_map(|i| i.repo_tags).collect();
    assert!(!images.contains(&unused.reference), "the unused image was deleted: {images:?}");
    assert!(images.iter().any(|i| i.contains("busybox")), "the image in use stays: {images:?}");
    let done_status = status_of(&agent, &https, "done").expect("the finished pod is still listed");
    assert_eq!(done_status["phase"], "Succeeded", "{done_status}");

    // The filler, ranked first by its bytes on nodefs, is evicted with the
    // kubelet's reason and message; only it.
    assert_eq!(filler["phase"], "Failed");
    let message = filler["message"].as_str().unwrap();
    assert!(
        message.starts_with("The node was low on resource: ephemeral-storage. Threshold quantity: ")
            && message.contains("Signal: nodefs.available."),
        "{message}"
    );
    assert_eq!(evicted_at.matches("evicting: ").count(), 1, "one pod evicted:\n{evicted_at}");
    let steady_now = status_of(&agent, &https, "steady").unwrap();
    assert!(steady_ok(&steady_now), "the steady pod keeps running, no restart: {steady_now}");
    assert_eq!(agent.runtime_state(&steady_uid), steady_before, "same sandbox and container");

    // SIGKILL while the agent still reports the pressure (the transition
    // period holds it) and the evicted pod is being torn down.
    std::fs::remove_file(agent.setup.manifests.join("filler.yaml")).unwrap();
    agent.kill();
    let killed_log = text(&agent);
    assert!(
        !killed_log[evicting..].contains("node pressure conditions changed conditions=[]"),
        "killed under pressure:\n{killed_log}"
    );
    let files = check_state_files(&root_dir);
    println!("the root dir after the SIGKILL holds {} files: {files:?}", files.len());

    // Started again: it reuses its state, re-adopts the steady pod as it
    // was, finishes cleaning up the filler and frees its bytes.
    let log_len = killed_log.len();
    agent.spawn();
    wait_until(
        "the restarted agent serving",
        Duration::from_secs(60),
        || second(&agent, log_len),
        || status_of(&agent, &https, "steady").is_some_and(|s| steady_ok(&s)),
    );
    assert!(
        second(&agent, log_len).contains("self-signed, reused"),
        "the state files were read back:\n{}",
        second(&agent, log_len)
    );
    wait_until(
        "the filler's data removed",
        Duration::from_secs(60),
        || second(&agent, log_len),
        || agent.runtime_state(&filler_uid) == (vec![], vec![]) && !root_dir.join("pods").join(&filler_uid).exists(),
    );
    wait_until(
        "the space back",
        Duration::from_secs(30),
        || second(&agent, log_len),
        || disk.stat().0 > THRESHOLD + 16 * MI,
    );
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(agent.runtime_state(&steady_uid), steady_before, "re-adopted: same sandbox and container, 0 restarts");
    let s = status_of(&agent, &https, "steady").unwrap();
    assert!(steady_ok(&s), "{s}");
    assert!(!second(&agent, log_len).contains("evicting: "), "nothing else evicted:\n{}", second(&agent, log_len));
    check_state_files(&root_dir);
    drop(agent);
    drop(ctd);
    drop(registry);
}

/// Fills `dir`'s filesystem with one file until the kernel refuses more.
fn fill(dir: &Path, name: &str) {
    use std::io::Write;
    let mut f = std::fs::File::create(dir.join(name)).expect("ballast");
    let chunk = vec![7u8; 64 << 10];
    loop {
        if let Err(e) = f.write_all(&chunk) {
            assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
            break;
        }
    }
    // The last partial chunk may have landed: the filesystem is full.
    let _ = f.sync_all();
}

#[test]
fn an_atomic_write_on_a_full_filesystem_fails_and_leaves_the_old_file() {
    let fs = SmallFs::mount(1 << 20, 64);
    let state = fs.path().join("state");
    swiftlet::host::write_atomic(&state, b"old state", 0o600).expect("the first write");

    // Out of bytes.
    fill(fs.path(), "ballast");
    let big = vec![1u8; 256 << 10];
    let e = swiftlet::host::write_atomic(&state, &big, 0o600).expect_err("no room for the new file");
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    assert_eq!(std::fs::read(&state).unwrap(), b"old state", "the old file is whole");
    assert_eq!(files_under(fs.path()), [PathBuf::from("ballast"), PathBuf::from("state")], "no temporary file left");
    std::fs::remove_file(fs.path().join("ballast")).unwrap();

    // Out of inodes.
    let mut n = 0;
    while std::fs::File::create(fs.path().join(format!("i{n}"))).is_ok() {
        n += 1;
    }
    let e = swiftlet::host::write_atomic(&state, b"new state", 0o600).expect_err("no inode for the new file");
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    assert_eq!(std::fs::read(&state).unwrap(), b"old state");
    assert_eq!(files_under(fs.path()).len(), n + 1, "no temporary file left");

    // With room again, the write goes through.
    for i in 0..n {
        std::fs::remove_file(fs.path().join(format!("i{i}"))).unwrap();
    }
    swiftlet::host::write_atomic(&state, &big, 0o600).expect("room again");
    assert_eq!(std::fs::read(&state).unwrap(), big);
    assert_eq!(files_under(fs.path()), [PathBuf::from("state")]);
}
