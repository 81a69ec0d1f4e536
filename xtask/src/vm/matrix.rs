//! The kernel matrix: the signal, eviction and kill tests on Debian's 6.1
//! and 6.12 cloud kernels (cgroup v2), each booted in qemu from an
//! initramfs holding the test binaries, and on this host.
//!
//! Per kernel: write a newc initramfs holding static busybox, the test
//! binaries (debug info stripped) with the glibc libraries `ldd` names, the
//! loop module, and an /init that mounts what the tests need and runs each
//! check between markers; boot it and read the serial console. The eBPF
//! object is inside the test binaries.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use super::{
    Args,
    initramfs::build_initramfs,
    kernel::{KERNELS, KernelImage, KernelSpec, fetch_kernel},
    qemu::{self, Boot, Drive, VmRun},
};
use crate::{
    cmd::{self, note, step},
    setup,
};

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
    check(
        "kill: a sleeping victim (bpf_send_signal_task)",
        "kill_safety",
        "a_sleeping_victim_is_signalled_where_the_kernel_can",
        false,
    ),
    check("kill: refresh in a pid namespace", "kill_safety", "the_refresh_knows_the_agent_in_a_pid_namespace", false),
    check("kill: one kill ends a fork storm", "kill_safety", "one_kill_ends_a_fork_storm", false),
    check(
        "kill: reclaim-first defers page cache",
        "kill_safety",
        "with_reclaim_first_only_anonymous_growth_is_killed_in_the_kernel",
        false,
    ),
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
pub(super) fn vm_prelude(root: &Path) -> String {
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

/// How long one matrix VM may take (boot, the checks, power-off) before it
/// is killed: TCG runs the tests several times slower than the host.
pub(super) const MATRIX_TIMEOUT: Duration = Duration::from_secs(25 * 60);

/// Boots a kernel with an initramfs that runs everything itself.
pub(super) fn boot_matrix_vm(
    k: &KernelSpec,
    image: &KernelImage,
    initramfs: &Path,
    dir: &Path,
    timeout: Duration,
    drives: Vec<Drive>,
    on_line: impl FnMut(&str, f64),
) -> Result<VmRun> {
    let boot = Boot {
        label: format!("kernel {} ({})", k.name, image.package),
        vmlinuz: &image.vmlinuz,
        initramfs,
        append: "quiet rdinit=/init".into(),
        drives,
        memory_mib: 3072,
        cpu_max: false,
        timeout,
        dir,
    };
    qemu::boot(&boot, on_line)
}

/// Notes a check's end as the VM's console reports it (`@@END <id>
/// rc=<code>`), by the row `row_of` gives for its index.
pub fn note_check_end(line: &str, t: f64, row_of: impl Fn(usize) -> Option<&'static str>) {
    let Some(rest) = line.strip_prefix("@@END ") else { return };
    let mut words = rest.split_whitespace();
    if let Some(row) = words.next().and_then(|i| i.parse().ok()).and_then(row_of) {
        let ok = words.next() == Some("rc=0");
        note(format!("{:<4} {row} ({t:.0}s so far)", if ok { "ok" } else { "FAIL" }));
    }
}

fn run_checks_in_vm(
    k: &KernelSpec,
    image: &KernelImage,
    initramfs: &Path,
    dir: &Path,
    checks: &[Check],
) -> Result<Column> {
    let mut attempt = 0;
    let run = loop {
        attempt += 1;
        let run = boot_matrix_vm(k, image, initramfs, dir, MATRIX_TIMEOUT, vec![], |line, t| {
            note_check_end(line, t, |i| checks.get(i).map(|c| c.row));
        })?;
        // TCG can run a stale translation of kernel text the kernel has
        // just patched (a static key flipped through int3), and the guest
        // then dies on the breakpoint ("Oops: int3"), in any code, once in
        // tens of runs. That says nothing about swiftlet: boot once more
        // and run every check again, and say so.
        if run.early_end.is_none() || !run.console.contains("Oops: int3") || attempt > 1 {
            break run;
        }
        note(format!("kernel {}: the guest died on a stale int3 (a TCG artefact); booting again", k.name));
        let _ = fs::rename(dir.join("console.log"), dir.join("console-first-boot.log"));
    };
    let mut col = parse_console(k, &run.console, checks, run.seconds);
    if let Some(why) = run.early_end {
        col.failures.push((format!("VM ({why})"), run.console));
    }
    Ok(col)
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
    for sec in sections(console) {
        let Some(c) = checks.get(sec.id) else { continue };
        let ok = sec.ok && sec.text.contains("test result: ok. 1 passed");
        col.outcomes.insert(c.row, if ok { Outcome::Pass(sec.seconds) } else { Outcome::Fail(sec.seconds) });
        if !ok {
            col.failures.push((c.row.to_owned(), sec.text));
        }
    }
    col
}

/// One check's part of a console: between `@@BEGIN <id> <uptime>` and
/// `@@END <id> rc=<code> <uptime>`.
pub struct Section {
    pub id: usize,
    pub ok: bool,
    pub seconds: f64,
    pub text: String,
}

/// Every finished check's section, in console order.
pub fn sections(console: &str) -> Vec<Section> {
    let mut out = vec![];
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
            let ok = rest.split_whitespace().nth(1) == Some("rc=0");
            out.push(Section { id, ok, seconds: t1 - t0, text });
        } else if let Some((_, _, text)) = section.as_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    out
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
    fn every_check_has_a_test_target() {
        for c in CHECKS {
            let path = cmd::workspace_root().join("tests/tests").join(format!("{}.rs", c.bin));
            let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(text.contains(&format!("fn {}(", c.test)), "{} has no test {}", path.display(), c.test);
        }
    }
}
