//! The kernel matrix: the signal, eviction and kill tests on Debian's 6.1 and
//! 6.12 cloud kernels (cgroup v2), each booted in qemu, and on this host.
//!
//! Per kernel: `apt-get download` the image package (cached in
//! ~/.cache/swiftlet/vm), `dpkg-deb -x` it, write a newc initramfs holding
//! static busybox, the test binaries (debug info stripped) with the glibc
//! libraries `ldd` names, the loop module, and an /init that mounts what the
//! tests need and runs each check between markers; boot it with
//! qemu-system-x86_64 under TCG (KVM does not work here) and read the
//! serial console. The eBPF object is inside the test binaries.

use std::{
    collections::BTreeMap,
    fs,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    cmd::{self, note, step},
    setup,
};

/// A kernel of the matrix.
#[derive(Clone, Copy, Debug)]
pub struct KernelSpec {
    pub name: &'static str,
    /// The Debian meta-package that depends on the current image.
    meta: &'static str,
    /// What the image package's name starts with (checks the meta's choice,
    /// and finds an image when the meta is unavailable).
    prefix: &'static str,
}

pub const KERNELS: &[KernelSpec] = &[
    KernelSpec { name: "6.1", meta: "linux-image-cloud-amd64", prefix: "linux-image-6.1.0-" },
    KernelSpec { name: "6.12", meta: "linux-image-6.12-cloud-amd64", prefix: "linux-image-6.12." },
];

/// The kernel `cargo xtask test` boots by default: the oldest LTS, which
/// differs most from this host (no memcg tracepoints, no kill kfuncs,
/// mark_victim with a pid).
pub const CI_KERNEL: &str = "6.1";

/// One check of the matrix: a test of the swiftlet-tests crate.
#[derive(Clone, Copy, Debug)]
pub struct Check {
    pub row: &'static str,
    /// The test target (tests/tests/<bin>.rs).
    pub bin: &'static str,
    pub test: &'static str,
    /// Needs cgroup v2 (`#[ignore]`d on this v1 host, run in the VMs).
    pub v2_only: bool,
}

const fn check(row: &'static str, bin: &'static str, test: &'static str, v2_only: bool) -> Check {
    Check { row, bin, test, v2_only }
}

pub const CHECKS: &[Check] = &[
    check("strategies chosen by the probes", "kernel", "strategy_probe_picks_the_most_exact_hooks", false),
    check("working set vs cgroupfs", "signals", "ebpf_working_set_matches_cgroupfs", false),
    check("working set, every strategy", "kernel", "every_memory_strategy_this_kernel_supports_tracks_cgroupfs", false),
    check("node memory = /proc/vmstat", "signals", "the_node_slot_holds_the_kernels_own_node_statistics", false),
    check("PIDs", "signals", "process_counts_follow_forks_and_exits", false),
    check("inodes", "signals", "inode_counts_follow_creates_and_unlinks", false),
    check("threshold crossing event", "signals", "a_crossing_produces_exactly_one_event", false),
    check("OOM kill event", "signals", "oom_kill_in_a_test_cgroup_is_reported", false),
    check("kill: userspace fast path", "eviction", "besteffort_hog_is_evicted_before_the_oom_killer_ebpf", false),
    check("kill: in the kernel", "eviction", "the_kernel_kills_the_planned_victim_at_the_crossing", false),
    check("kill: the doomed mark dies with its cgroup", "kill_safety", "a_doomed_mark_dies_with_its_cgroup", false),
    check(
        "kill: at any depth below the pod",
        "kill_safety",
        "the_allocating_task_is_killed_at_any_depth_below_the_pod",
        false,
    ),
    check("kill: refresh in a pid namespace", "kill_safety", "the_refresh_knows_the_agent_in_a_pid_namespace", false),
    check("kill: one kill ends a fork storm", "kill_safety", "one_kill_ends_a_fork_storm", false),
    check("fallback: auto → cgroupfs", "signals", "auto_mode_falls_back_to_cgroupfs_when_ebpf_cannot_load", false),
    check(
        "fallback: cgroupfs poll 100ms evicts",
        "eviction",
        "besteffort_hog_is_evicted_before_the_oom_killer_cgroupfs_100ms",
        false,
    ),
    check(
        "fallback: v2 events, poll 10s, evicts",
        "eviction",
        "besteffort_hog_is_evicted_before_the_oom_killer_cgroupfs_v2_events",
        true,
    ),
    check("fallback: v2 events see a crossing", "kernel", "v2_events_report_a_crossing_long_before_the_poll", true),
    check("cgroup v2: readings, limits, cgroup.kill", "kernel", "cgroup_v2_readings_limits_and_kill", true),
    check("cm: hierarchy, limits, pod cgroups", "cm", "hierarchy_limits_and_pod_cgroups_on_this_machine", false),
];

#[derive(clap::Args, Clone)]
pub struct Args {
    /// Kernels to run (6.1, 6.12, host); default: all.
    #[arg(long = "kernel")]
    pub kernels: Vec<String>,
    /// Only the checks whose test name contains one of these.
    pub filters: Vec<String>,
}

/// The outcome of one check on one kernel.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Pass(f64),
    Fail(f64),
    NotApplicable(&'static str),
    /// The VM died or timed out before the check ran.
    NotRun,
}

/// One column of the matrix.
pub struct Column {
    pub kernel: String,
    pub cgroup: String,
    pub outcomes: BTreeMap<&'static str, Outcome>,
    /// (signal, strategy) as the probe check printed them.
    pub strategies: Vec<(String, String)>,
    pub seconds: f64,
    /// Console sections of failed checks, or the whole console if the VM died.
    pub failures: Vec<(String, String)>,
}

/// `cargo xtask vmtest`.
pub fn run(args: Args) -> Result<()> {
    setup::require_root("the kernel matrix")?;
    let tc = setup::all()?;
    setup::build_ebpf(&tc)?;
    let started = Instant::now();
    let columns = run_matrix(&tc, &args.kernels, &args.filters)?;
    print_matrix(&columns, &args.filters);
    note(format!("kernel matrix in {:.0}s", started.elapsed().as_secs_f64()));
    if columns.iter().any(|c| c.outcomes.values().any(|o| matches!(o, Outcome::Fail(_) | Outcome::NotRun))) {
        bail!("some checks failed on some kernels (console output above)");
    }
    Ok(())
}

fn selected(filters: &[String]) -> Vec<Check> {
    CHECKS
        .iter()
        .copied()
        .filter(|c| filters.is_empty() || filters.iter().any(|f| c.test.contains(f.as_str())))
        .collect()
}

/// Builds what the checks need, then runs them on each kernel (host
/// included). `kernels` empty means all.
pub fn run_matrix(tc: &setup::EbpfToolchain, kernels: &[String], filters: &[String]) -> Result<Vec<Column>> {
    for k in kernels {
        if k != "host" && !KERNELS.iter().any(|s| s.name == k) {
            bail!(
                "no kernel `{k}` in the matrix (known: host, {})",
                KERNELS.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
            );
        }
    }
    let wanted = |name: &str| kernels.is_empty() || kernels.iter().any(|k| k == name);
    let checks = selected(filters);
    if checks.is_empty() {
        bail!("no check matches {filters:?}");
    }
    let root = cmd::workspace_root();
    let binaries = build_test_binaries(tc)?;
    let mut columns = vec![];
    if wanted("host") {
        columns.push(run_on_host(&binaries, &checks)?);
    }
    let vm_kernels: Vec<KernelSpec> = KERNELS.iter().copied().filter(|k| wanted(k.name)).collect();
    if !vm_kernels.is_empty() {
        setup::ensure_apt(setup::APT_VM)?;
        for k in vm_kernels {
            let image = fetch_kernel(&k)?;
            let dir = root.join("target/vmtest").join(k.name);
            fs::create_dir_all(&dir)?;
            let initramfs = dir.join("initramfs.cpio");
            step(format!("kernel {}: initramfs with the tests", k.name));
            build_initramfs(&initramfs, &image, &test_payload(&binaries), &vm_script(&checks, root))?;
            columns.push(run_checks_in_vm(&k, &image, &initramfs, &dir, &checks)?);
        }
    }
    Ok(columns)
}

/// The test executables by target name, and the workload generator.
pub struct Binaries {
    pub tests: BTreeMap<String, PathBuf>,
    pub bins: Vec<PathBuf>,
}

fn build_test_binaries(tc: &setup::EbpfToolchain) -> Result<Binaries> {
    step("building the test binaries");
    let root = cmd::workspace_root();
    let mut c = Command::new("cargo");
    c.current_dir(root).env("PATH", tc.path_env());
    c.args(["test", "-p", "swiftlet-tests", "--no-run", "--message-format=json-render-diagnostics"]);
    c.stderr(Stdio::inherit());
    let out = c.output().context("cannot run cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the test binaries failed");
    }
    let mut tests = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let kinds = v.pointer("/target/kind").and_then(|k| k.as_array()).cloned().unwrap_or_default();
        if v.get("reason").and_then(|r| r.as_str()) != Some("compiler-artifact")
            || !kinds.iter().any(|k| k.as_str() == Some("test"))
        {
            continue;
        }
        if let (Some(name), Some(exe)) =
            (v.pointer("/target/name").and_then(|n| n.as_str()), v.get("executable").and_then(|e| e.as_str()))
        {
            tests.insert(name.to_owned(), PathBuf::from(exe));
        }
    }
    cmd::run(Command::new("cargo").current_dir(root).env("PATH", tc.path_env()).args([
        "build",
        "-p",
        "swiftlet-tests",
        "--bins",
    ]))?;
    let bins = vec![root.join("target/debug/swiftlet-workload")];
    for c in CHECKS {
        if !tests.contains_key(c.bin) {
            bail!("cargo built no test target `{}` (tests/tests/{}.rs)", c.bin, c.bin);
        }
    }
    Ok(Binaries { tests, bins })
}

/// The checks on this machine, as the VMs run them.
fn run_on_host(binaries: &Binaries, checks: &[Check]) -> Result<Column> {
    let started = Instant::now();
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned();
    step(format!("host {kernel}: the checks on this machine"));
    let mut col = Column {
        kernel: format!("{kernel} (host)"),
        cgroup: cgroup_layout(),
        outcomes: BTreeMap::new(),
        strategies: vec![],
        seconds: 0.0,
        failures: vec![],
    };
    for c in checks {
        if c.v2_only && col.cgroup != "v2" {
            col.outcomes.insert(c.row, Outcome::NotApplicable("v1"));
            continue;
        }
        let t = Instant::now();
        let out = Command::new(&binaries.tests[c.bin])
            .current_dir(cmd::workspace_root().join("tests"))
            .args(["--exact", c.test, "--test-threads=1", "--nocapture", "--include-ignored"])
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot run {}", binaries.tests[c.bin].display()))?;
        let secs = t.elapsed().as_secs_f64();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        col.strategies.extend(parse_strategies(&text));
        let ok = out.status.success() && text.contains("test result: ok. 1 passed");
        note(format!("{:<4} {} ({secs:.1}s)", if ok { "ok" } else { "FAIL" }, c.row));
        if ok {
            col.outcomes.insert(c.row, Outcome::Pass(secs));
        } else {
            col.outcomes.insert(c.row, Outcome::Fail(secs));
            col.failures.push((c.row.to_owned(), text));
        }
    }
    col.seconds = started.elapsed().as_secs_f64();
    Ok(col)
}

fn cgroup_layout() -> String {
    if fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").is_ok_and(|c| c.contains("memory")) {
        "v2".into()
    } else {
        "v1 (hybrid)".into()
    }
}

/// `STRATEGY <signal>=<strategy>` lines printed by the probe check.
fn parse_strategies(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("STRATEGY "))
        .filter_map(|l| l.split_once('=').map(|(a, b)| (a.trim().to_owned(), b.trim().to_owned())))
        .collect()
}

/// The image package's vmlinuz (and its root, for modules), downloaded and
/// unpacked once into ~/.cache/swiftlet/vm.
pub struct KernelImage {
    pub package: String,
    pub vmlinuz: PathBuf,
    pub tree: PathBuf,
}

fn vm_cache() -> PathBuf {
    setup::cache_dir().join("vm")
}

fn fetch_kernel(k: &KernelSpec) -> Result<KernelImage> {
    let cache = vm_cache();
    fs::create_dir_all(&cache).with_context(|| format!("cannot create {}", cache.display()))?;
    let remembered = cache.join(format!("{}.package", k.meta));
    let package = match resolve_package(k) {
        Ok(p) => {
            let _ = fs::write(&remembered, &p);
            p
        }
        // Offline: the image fetched last time will do.
        Err(e) => match fs::read_to_string(&remembered) {
            Ok(p) => {
                note(format!("cannot ask apt for the {} image ({e:#}); using the cached {}", k.name, p.trim()));
                p.trim().to_owned()
            }
            Err(_) => return Err(e),
        },
    };
    let tree = cache.join(&package);
    let vmlinuz = |tree: &Path| -> Option<PathBuf> {
        fs::read_dir(tree.join("boot"))
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("vmlinuz-")))
    };
    if let Some(v) = vmlinuz(&tree) {
        return Ok(KernelImage { package, vmlinuz: v, tree });
    }
    let deb = match find_deb(&cache, &package) {
        Some(d) => d,
        None => {
            step(format!("downloading {package} (kernel {})", k.name));
            cmd::run(
                Command::new("apt-get")
                    .current_dir(&cache)
                    // As root into a root-owned cache: no _apt sandbox.
                    .args(["-q", "-o", "APT::Sandbox::User=root", "download", &package]),
            )
            .with_context(|| format!("cannot download {package}; check that the Debian mirror is reachable"))?;
            find_deb(&cache, &package).with_context(|| format!("apt-get download left no {package}_*.deb"))?
        }
    };
    let partial = cache.join(format!("{package}.partial"));
    let _ = fs::remove_dir_all(&partial);
    cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial))?;
    fs::rename(&partial, &tree)?;
    let v = vmlinuz(&tree).with_context(|| format!("{} has no boot/vmlinuz-*", deb.display()))?;
    Ok(KernelImage { package, vmlinuz: v, tree })
}

fn find_deb(dir: &Path, package: &str) -> Option<PathBuf> {
    let prefix = format!("{package}_");
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb")))
}

/// The current image package of a kernel series: what the meta-package
/// depends on, else the newest package of that series apt knows.
fn resolve_package(k: &KernelSpec) -> Result<String> {
    let ask = || -> Result<Option<String>> {
        let deps = cmd::output(Command::new("apt-cache").args(["depends", "--important", k.meta]))?;
        if let Some(p) = deps
            .lines()
            .filter_map(|l| l.trim().strip_prefix("Depends: "))
            .map(str::trim)
            .find(|p| p.starts_with(k.prefix) && p.ends_with("-cloud-amd64"))
        {
            return Ok(Some(p.to_owned()));
        }
        let found = cmd::output(Command::new("apt-cache").args(["search", "--names-only", &format!("^{}", k.prefix)]))?;
        let mut names: Vec<&str> =
            found.lines().filter_map(|l| l.split_whitespace().next()).filter(|n| n.ends_with("-cloud-amd64")).collect();
        names.sort_by_key(|n| natural_key(n));
        Ok(names.last().map(|s| (*s).to_owned()))
    };
    if let Some(p) = ask().unwrap_or(None) {
        return Ok(p);
    }
    note("refreshing the package lists (apt-get update)");
    cmd::run(Command::new("apt-get").args(["update", "-q"]))?;
    ask()?.with_context(|| format!("apt knows no {}*-cloud-amd64 package (kernel {})", k.prefix, k.name))
}

/// Sorts 6.1.0-9 before 6.1.0-56.
fn natural_key(s: &str) -> Vec<(u64, String)> {
    let mut out = vec![];
    let mut num = String::new();
    let mut text = String::new();
    for ch in s.chars() {
        if ch.is_ascii_digit() {
            if !text.is_empty() {
                out.push((0, std::mem::take(&mut text)));
            }
            num.push(ch);
        } else {
            if !num.is_empty() {
                out.push((num.parse().unwrap_or(0), String::new()));
                num.clear();
            }
            text.push(ch);
        }
    }
    if !num.is_empty() {
        out.push((num.parse().unwrap_or(0), String::new()));
    }
    if !text.is_empty() {
        out.push((0, text));
    }
    out
}

/// The directory the tests were compiled to use as CARGO_TARGET_TMPDIR.
fn target_tmpdir(root: &Path) -> PathBuf {
    root.join("target").join("tmp")
}

/// The VM's /init: mounts, an ext4 scratch filesystem where the tests keep
/// their files (the inode check needs ext4), then each check between
/// markers, then power off.
fn vm_script(checks: &[Check], root: &Path) -> String {
    let mut s = vm_prelude(root);
    for (i, c) in checks.iter().enumerate() {
        s.push_str(&format!(
            "check {i} /t/deps/{bin} --exact {test} --test-threads=1 --nocapture --include-ignored\n",
            bin = c.bin,
            test = c.test
        ));
    }
    s.push_str("echo @@DONE\nsync\npoweroff -f\n");
    s
}

/// The mounts and scratch filesystem every VM run starts with, and the
/// `check` function that runs a command between markers.
fn vm_prelude(root: &Path) -> String {
    let tmp = target_tmpdir(root);
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin HOME=/root RUST_BACKTRACE=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tracefs tracefs /sys/kernel/tracing
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mkdir -p /tmp /root /var/lib/kubelet {tmp}
insmod /modules/loop.ko 2>/dev/null
truncate -s 512M /scratch.img && mke2fs -q -F /scratch.img >/dev/null 2>&1 \
  && losetup /dev/loop0 /scratch.img && mount -t ext4 /dev/loop0 {tmp} \
  || echo "@@NOTE no ext4 scratch filesystem; the inode check will fail"
echo "@@VM kernel=$(uname -r) lru_gen=$(cat /sys/kernel/mm/lru_gen/enabled 2>/dev/null) controllers=$(cat /sys/fs/cgroup/cgroup.controllers)"
check() {{
  id=$1; shift
  echo "@@BEGIN $id $(cut -d' ' -f1 /proc/uptime)"
  "$@" </dev/null
  echo "@@END $id rc=$? $(cut -d' ' -f1 /proc/uptime)"
}}
cd /
"#,
        tmp = tmp.display()
    )
}

/// A newc cpio archive, written entry by entry.
struct Cpio {
    out: std::io::BufWriter<fs::File>,
    ino: u32,
}

impl Cpio {
    fn create(path: &Path) -> Result<Cpio> {
        let f = fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        Ok(Cpio { out: std::io::BufWriter::new(f), ino: 1 })
    }

    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) -> Result<()> {
        let name = name.trim_start_matches('/');
        let header = format!(
            "070701{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}",
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len(),
            0,
            0,
            0,
            0,
            name.len() + 1,
            0
        );
        self.ino += 1;
        self.out.write_all(header.as_bytes())?;
        self.out.write_all(name.as_bytes())?;
        self.out.write_all(&[0])?;
        let pad = |n: usize| (4 - n % 4) % 4;
        self.out.write_all(&[0; 3][..pad(110 + name.len() + 1)])?;
        self.out.write_all(data)?;
        self.out.write_all(&[0; 3][..pad(data.len())])?;
        Ok(())
    }

    fn dir(&mut self, name: &str) -> Result<()> {
        self.entry(name, 0o040755, &[])
    }

    fn file(&mut self, name: &str, data: &[u8], executable: bool) -> Result<()> {
        self.entry(name, if executable { 0o100755 } else { 0o100644 }, data)
    }

    fn finish(mut self) -> Result<()> {
        self.entry("TRAILER!!!", 0, &[])?;
        self.out.flush()?;
        Ok(())
    }
}

/// Every directory leading to `path` (for cpio, which needs them listed).
fn parents(path: &str) -> Vec<String> {
    let mut out = vec![];
    let mut cur = String::new();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    for p in &parts[..parts.len().saturating_sub(1)] {
        cur = format!("{cur}/{p}");
        out.push(cur.clone());
    }
    out
}

/// The shared libraries a dynamically linked binary loads, from ldd.
fn libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = cmd::output(Command::new("ldd").arg(bin))?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// The binary without its debug info (the initramfs stays small).
fn stripped(bin: &Path, scratch: &Path) -> Result<Vec<u8>> {
    let out = scratch.join(bin.file_name().context("binary has a name")?);
    cmd::run(Command::new("objcopy").arg("--strip-debug").arg(bin).arg(&out).stdout(Stdio::null()))?;
    let data = fs::read(&out)?;
    let _ = fs::remove_file(&out);
    Ok(data)
}

/// The test binaries of the checks (in /t/deps, so they find the workload
/// generator one level up, as in target/debug) and the generator.
fn test_payload(binaries: &Binaries) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = binaries
        .tests
        .iter()
        .filter(|(name, _)| CHECKS.iter().any(|c| c.bin == name.as_str()))
        .map(|(name, bin)| (format!("/t/deps/{name}"), bin.clone()))
        .collect();
    for bin in &binaries.bins {
        if let Some(name) = bin.file_name().and_then(|n| n.to_str()) {
            out.push((format!("/t/{name}"), bin.clone()));
        }
    }
    out
}

/// Writes the initramfs: busybox, `init`, the binaries (debug info
/// stripped) at their destinations with the libraries they load, and the
/// kernel's loop module.
fn build_initramfs(path: &Path, image: &KernelImage, binaries: &[(String, PathBuf)], init: &str) -> Result<()> {
    let started = Instant::now();
    let scratch = path.with_extension("scratch");
    fs::create_dir_all(&scratch)?;
    let mut cpio = Cpio::create(path)?;
    let mut dirs: std::collections::BTreeSet<String> =
        ["/bin", "/dev", "/proc", "/sys", "/tmp", "/t", "/t/deps", "/modules"].into_iter().map(String::from).collect();
    let mut files: Vec<(String, Vec<u8>, bool)> = vec![];
    files.push(("/init".into(), init.as_bytes().to_vec(), true));
    let busybox = fs::read("/bin/busybox").context("static busybox at /bin/busybox (Debian busybox-static)")?;
    files.push(("/bin/busybox".into(), busybox, true));
    let mut libs = std::collections::BTreeSet::new();
    for (dest, bin) in binaries {
        files.push((dest.clone(), stripped(bin, &scratch)?, true));
        libs.extend(libraries(bin)?);
    }
    for lib in libs {
        let data = fs::read(&lib).with_context(|| format!("cannot read {}", lib.display()))?;
        files.push((lib.display().to_string(), data, true));
    }
    if let Some(module) = find_module(&image.tree, "loop")? {
        files.push(("/modules/loop.ko".into(), module, false));
    }
    for (name, _, _) in &files {
        dirs.extend(parents(name));
    }
    for d in &dirs {
        cpio.dir(d)?;
    }
    let mut bytes = 0;
    for (name, data, exec) in &files {
        bytes += data.len();
        cpio.file(name, data, *exec)?;
    }
    cpio.finish()?;
    let _ = fs::remove_dir_all(&scratch);
    note(format!("{} ({} MiB) in {:.1}s", path.display(), bytes >> 20, started.elapsed().as_secs_f64()));
    Ok(())
}

/// A module of the image, decompressed (busybox insmod reads plain .ko).
fn find_module(tree: &Path, name: &str) -> Result<Option<Vec<u8>>> {
    let Some(modules) = fs::read_dir(tree.join("lib/modules")).ok().and_then(|mut d| d.next()).and_then(|e| e.ok())
    else {
        return Ok(None);
    };
    let base = modules.path().join("kernel/drivers/block");
    let plain = base.join(format!("{name}.ko"));
    if plain.exists() {
        return Ok(Some(fs::read(plain)?));
    }
    let xz = base.join(format!("{name}.ko.xz"));
    if xz.exists() {
        let out = Command::new("xz").arg("-dc").arg(&xz).output().context("xz (Debian xz-utils)")?;
        if !out.status.success() {
            bail!("cannot decompress {}", xz.display());
        }
        return Ok(Some(out.stdout));
    }
    Ok(None)
}

/// How long one VM may take (boot, the checks, power-off) before it is
/// killed: TCG runs the tests several times slower than the host.
const VM_TIMEOUT: Duration = Duration::from_secs(25 * 60);

/// What a VM run left: its console, how long it took, and why it ended
/// early if it did.
struct VmRun {
    console: String,
    seconds: f64,
    early_end: Option<String>,
}

/// Boots `image` with `initramfs` and reads the serial console until the VM
/// powers off (or overruns [`VM_TIMEOUT`] and is killed); `on_line` sees
/// each line as it comes.
fn boot_vm(
    k: &KernelSpec,
    image: &KernelImage,
    initramfs: &Path,
    dir: &Path,
    mut on_line: impl FnMut(&str, f64),
) -> Result<VmRun> {
    step(format!("kernel {}: booting {} under qemu (TCG)", k.name, image.package));
    let console_path = dir.join("console.log");
    let started = Instant::now();
    let mut child = Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg", "-m", "3072", "-smp", "2", "-nographic", "-no-reboot"])
        .arg("-kernel")
        .arg(&image.vmlinuz)
        .arg("-initrd")
        .arg(initramfs)
        .args(["-append", "console=ttyS0 quiet panic=-1 rdinit=/init"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start qemu-system-x86_64 (Debian qemu-system-x86)")?;
    let pid = child.id();
    // A watchdog ends qemu (by its pid) if the VM overruns.
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if done_rx.recv_timeout(VM_TIMEOUT).is_err() {
            // SAFETY: kill(2) on the qemu we started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            true
        } else {
            false
        }
    });
    let mut console = String::new();
    let mut log = fs::File::create(&console_path)?;
    let stdout = child.stdout.take().context("qemu stdout")?;
    for line in BufReader::new(stdout).split(b'\n') {
        let line = String::from_utf8_lossy(&line?).replace('\r', "");
        writeln!(log, "{line}")?;
        console.push_str(&line);
        console.push('\n');
        if line.starts_with("@@VM") || line.starts_with("@@NOTE") {
            note(line.trim_start_matches("@@"));
        }
        on_line(&line, started.elapsed().as_secs_f64());
    }
    let status = child.wait()?;
    let _ = done_tx.send(());
    let timed_out = watchdog.join().unwrap_or(false);
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    let seconds = started.elapsed().as_secs_f64();
    let early_end = if timed_out {
        Some(format!("the VM did not finish within {}s and was killed", VM_TIMEOUT.as_secs()))
    } else if !console.contains("@@DONE") {
        Some(format!("the VM stopped before the end ({status}); qemu said: {}", stderr.trim()))
    } else {
        None
    };
    note(format!("kernel {}: {:.0}s, console in {}", k.name, seconds, console_path.display()));
    Ok(VmRun { console, seconds, early_end })
}

fn run_checks_in_vm(
    k: &KernelSpec,
    image: &KernelImage,
    initramfs: &Path,
    dir: &Path,
    checks: &[Check],
) -> Result<Column> {
    let run = boot_vm(k, image, initramfs, dir, |line, t| {
        if let Some(rest) = line.strip_prefix("@@END ") {
            let id: Option<usize> = rest.split_whitespace().next().and_then(|i| i.parse().ok());
            if let Some(c) = id.and_then(|i| checks.get(i)) {
                let ok = rest.split_whitespace().nth(1) == Some("rc=0");
                note(format!("{:<4} {} ({t:.0}s so far)", if ok { "ok" } else { "FAIL" }, c.row));
            }
        }
    })?;
    let mut col = parse_console(k, &run.console, checks, run.seconds);
    if let Some(why) = run.early_end {
        col.failures.push((format!("VM ({why})"), run.console));
    }
    Ok(col)
}

/// The kernel-matrix bench in each VM kernel: its results come back over the
/// console and are added to `report_dir`'s report under
/// `kernel-matrix@<kernel>`. `runner` and `workload` are the runner's build.
pub fn bench(runner: &Path, workload: &Path, report_dir: &Path, quick: bool) -> Result<()> {
    setup::ensure_apt(setup::APT_VM)?;
    let root = cmd::workspace_root();
    let out = report_dir.join("kernels");
    fs::create_dir_all(&out)?;
    let mut imports = vec![];
    for k in KERNELS {
        let image = fetch_kernel(k)?;
        let dir = root.join("target/vmtest").join(format!("bench-{}", k.name));
        fs::create_dir_all(&dir)?;
        let initramfs = dir.join("initramfs.cpio");
        let mut script = vm_prelude(root);
        script.push_str(&format!(
            "check 0 /t/swiftlet-bench --out /tmp/bench --emit-json {}kernel-matrix\necho @@DONE\nsync\npoweroff -f\n",
            if quick { "--quick " } else { "" }
        ));
        step(format!("kernel {}: initramfs with the benchmark runner", k.name));
        let payload = vec![
            ("/t/swiftlet-bench".to_owned(), runner.to_owned()),
            ("/t/swiftlet-workload".to_owned(), workload.to_owned()),
        ];
        build_initramfs(&initramfs, &image, &payload, &script)?;
        let run = boot_vm(k, &image, &initramfs, &dir, |line, _| {
            if line.starts_with("    ") || line.starts_with("==> ") {
                note(line.trim());
            }
        })?;
        let json = run.console.lines().find_map(|l| l.strip_prefix("@@BENCH-JSON ")).map(str::to_owned);
        match (json, run.early_end) {
            (Some(json), None) => {
                let file = out.join(format!("{}.json", k.name));
                fs::write(&file, json)?;
                imports.push(format!("{}={}", k.name, file.display()));
            }
            (_, why) => {
                eprintln!("{}", run.console);
                bail!(
                    "the kernel-matrix bench did not finish on {} ({}); its console is above",
                    k.name,
                    why.unwrap_or_else(|| "no results printed".into())
                );
            }
        }
    }
    let mut c = Command::new(runner);
    c.arg("--out").arg(report_dir);
    for i in &imports {
        c.arg("--import").arg(i);
    }
    if quick {
        c.arg("--quick");
    }
    step(format!("adding the VM kernels' rows to {}/report.md", report_dir.display()));
    cmd::run(&mut c)
}

/// Outcomes, strategies and failure sections from a VM's console.
pub fn parse_console(k: &KernelSpec, console: &str, checks: &[Check], seconds: f64) -> Column {
    let kernel = console
        .lines()
        .find_map(|l| l.strip_prefix("@@VM kernel=").and_then(|r| r.split_whitespace().next()))
        .unwrap_or(k.name)
        .to_owned();
    let mut col = Column {
        kernel,
        cgroup: "v2".into(),
        outcomes: checks.iter().map(|c| (c.row, Outcome::NotRun)).collect(),
        strategies: parse_strategies(console),
        seconds,
        failures: vec![],
    };
    let mut section: Option<(usize, f64, String)> = None;
    for line in console.lines() {
        if let Some(rest) = line.strip_prefix("@@BEGIN ") {
            let mut it = rest.split_whitespace();
            let id = it.next().and_then(|i| i.parse().ok());
            let t = it.next().and_then(|t| t.parse().ok()).unwrap_or(0.0);
            section = id.map(|i| (i, t, String::new()));
        } else if let Some(rest) = line.strip_prefix("@@END ") {
            let Some((id, t0, text)) = section.take() else { continue };
            let t1: f64 = rest.split_whitespace().nth(2).and_then(|t| t.parse().ok()).unwrap_or(t0);
            let Some(c) = checks.get(id) else { continue };
            let ok = rest.split_whitespace().nth(1) == Some("rc=0") && text.contains("test result: ok. 1 passed");
            col.outcomes.insert(c.row, if ok { Outcome::Pass(t1 - t0) } else { Outcome::Fail(t1 - t0) });
            if !ok {
                col.failures.push((c.row.to_owned(), text));
            }
        } else if let Some((_, _, text)) = section.as_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    col
}

/// Prints the matrix (checks × kernels), the strategies, and the console
/// output of every failure.
pub fn print_matrix(columns: &[Column], filters: &[String]) {
    let checks = selected(filters);
    for c in columns {
        for (row, text) in &c.failures {
            step(format!("FAILED on {}: {row}; console output:", c.kernel));
            eprintln!("{text}");
        }
    }
    let mut table = String::new();
    let w0 = checks.iter().map(|c| c.row.chars().count()).max().unwrap_or(10).max(24);
    let widths: Vec<usize> = columns.iter().map(|c| c.kernel.chars().count().max(14)).collect();
    let pad = |s: &str, w: usize| format!("{s}{}", " ".repeat(w.saturating_sub(s.chars().count())));
    let row = |first: &str, cells: Vec<String>| {
        let mut l = format!("| {} |", pad(first, w0));
        for (cell, w) in cells.iter().zip(&widths) {
            l.push_str(&format!(" {} |", pad(cell, *w)));
        }
        l
    };
    table.push_str(&row("check", columns.iter().map(|c| c.kernel.clone()).collect()));
    table.push('\n');
    table.push_str(&row(&"-".repeat(w0), widths.iter().map(|w| "-".repeat(*w)).collect()));
    table.push('\n');
    table.push_str(&row("cgroup", columns.iter().map(|c| c.cgroup.clone()).collect()));
    table.push('\n');
    for ch in &checks {
        let cells = columns
            .iter()
            .map(|c| match c.outcomes.get(ch.row) {
                Some(Outcome::Pass(s)) => format!("pass {s:.0}s"),
                Some(Outcome::Fail(s)) => format!("FAIL {s:.0}s"),
                Some(Outcome::NotApplicable(why)) => format!("n/a ({why})"),
                Some(Outcome::NotRun) | None => "NOT RUN".into(),
            })
            .collect();
        table.push_str(&row(ch.row, cells));
        table.push('\n');
    }
    table.push_str(&row("total time", columns.iter().map(|c| format!("{:.0}s", c.seconds)).collect()));
    table.push('\n');
    step("kernel matrix");
    println!("{table}");
    // Strategies: one block per kernel (they are long).
    for c in columns {
        let mut seen = std::collections::BTreeSet::new();
        println!("strategies on {}:", c.kernel);
        for (signal, strategy) in &c.strategies {
            if seen.insert(signal.clone()) {
                println!("  {signal:<10} {strategy}");
            }
        }
        if c.strategies.is_empty() {
            println!("  (the probe check did not run or printed nothing)");
        }
    }
    let md = cmd::workspace_root().join("target/vmtest/matrix.md");
    let mut text = format!("# Kernel matrix\n\n{table}\n");
    for c in columns {
        text.push_str(&format!("\n## {}\n\n", c.kernel));
        for (signal, strategy) in &c.strategies {
            text.push_str(&format!("- {signal}: `{strategy}`\n"));
        }
    }
    let _ = fs::create_dir_all(md.parent().unwrap_or(Path::new(".")));
    let _ = fs::write(&md, text);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order_of_kernel_packages() {
        let mut v =
            ["linux-image-6.1.0-9-cloud-amd64", "linux-image-6.1.0-56-cloud-amd64", "linux-image-6.1.0-10-cloud-amd64"];
        v.sort_by_key(|n| natural_key(n));
        assert_eq!(v.last(), Some(&"linux-image-6.1.0-56-cloud-amd64"));
    }

    #[test]
    fn console_parsing() {
        let checks = &CHECKS[..3];
        let console = "noise\n@@VM kernel=6.1.0-56-cloud-amd64 lru_gen=0x0000\n@@BEGIN 0 5.00\nSTRATEGY memory=fexit:x\n\
                       test result: ok. 1 passed; 0 failed\n@@END 0 rc=0 9.50\n@@BEGIN 1 9.6\nboom\n@@END 1 rc=101 12.0\n";
        let col = parse_console(&KERNELS[0], console, checks, 20.0);
        assert_eq!(col.kernel, "6.1.0-56-cloud-amd64");
        assert_eq!(col.outcomes[checks[0].row], Outcome::Pass(4.5));
        assert!(matches!(col.outcomes[checks[1].row], Outcome::Fail(_)));
        assert_eq!(col.outcomes[checks[2].row], Outcome::NotRun);
        assert_eq!(col.strategies, vec![("memory".to_owned(), "fexit:x".to_owned())]);
        assert_eq!(col.failures.len(), 1);
        assert!(col.failures[0].1.contains("boom"));
    }

    #[test]
    fn cpio_paths() {
        assert_eq!(parents("/lib/x86_64-linux-gnu/libc.so.6"), vec!["/lib", "/lib/x86_64-linux-gnu"]);
        assert!(parents("/init").is_empty());
    }

    #[test]
    fn every_check_has_a_test_target() {
        for c in CHECKS {
            let path = cmd::workspace_root().join("tests/tests").join(format!("{}.rs", c.bin));
            let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(text.contains(&format!("fn {}(", c.test)), "{} has no test {}", path.display(), c.test);
        }
    }
}
