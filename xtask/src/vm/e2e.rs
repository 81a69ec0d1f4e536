//! The end-to-end checks on the node VM (`cargo xtask vmtest --e2e`): per
//! kernel and cgroup driver, one boot of the node disk (`node`) with a
//! payload disk holding swiftlet, the test binary (`tests/tests/node_e2e.rs`),
//! the images, kubectl and a runner. The runner waits for systemd to finish
//! booting, installs swiftlet's unit from `deploy/systemd/`, sets
//! containerd's cgroup driver, imports the images and runs each check
//! between markers on the serial console; this side reads the console and
//! prints a table of kernel × check with the driver used.

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
    initramfs::stripped,
    kernel::{KERNELS, KernelImage, KernelSpec, fetch_kernel},
    matrix::{Outcome, note_check_end, sections},
    node,
    qemu::{self, Boot, Drive},
};
use crate::{
    cmd::{self, note, step},
    images, setup,
};

/// One end-to-end check: a test of `tests/tests/node_e2e.rs`.
#[derive(Clone, Copy, Debug)]
pub struct E2eCheck {
    pub row: &'static str,
    pub test: &'static str,
}

/// The test target holding the checks.
const E2E_BIN: &str = "node_e2e";
/// The test CSI driver the storage checks start (found beside the test
/// binary, as `swiftlet_tests::csi::driver_binary` looks for it).
const CSI_DRIVER_BIN: &str = "swiftlet-test-csi-driver";

/// In the order they run. The node shutdown powers the VM off: it is last.
pub const E2E_CHECKS: &[E2eCheck] = &[
    E2eCheck {
        row: "pod: init, probes, liveness restart; slice limits",
        test: "a_pod_with_init_and_probes_runs_in_its_slice_with_the_kubelets_limits",
    },
    E2eCheck {
        row: "QoS slices, node allocatable, Burstable weight",
        test: "qos_classes_land_in_their_slices_under_node_allocatable",
    },
    E2eCheck {
        row: "memory.available: in-kernel kill, no OOM kill",
        test: "a_best_effort_hog_is_killed_in_the_kernel_at_memory_available",
    },
    E2eCheck {
        row: "reclaim first: page cache reclaimed, the hog evicted",
        test: "page_cache_over_the_line_is_reclaimed_and_an_anonymous_hog_evicted",
    },
    E2eCheck {
        row: "PID pressure: the fork bomb's pod evicted",
        test: "a_fork_bomb_pod_is_evicted_under_pid_pressure",
    },
    E2eCheck {
        row: "agent SIGKILL / containerd restart: re-adopted",
        test: "a_killed_agent_and_a_restarted_containerd_recreate_nothing",
    },
    E2eCheck {
        row: "PSI: stats, cadvisor, memory.pressure signal",
        test: "psi_in_stats_and_metrics_and_the_memory_pressure_signal_on_a_stalled_pod",
    },
    E2eCheck {
        row: "CSI claim: staged, published, data kept; in its slice",
        test: "storage::a_provisioned_claim_keeps_its_data_across_a_recreated_pod_in_its_slice",
    },
    E2eCheck {
        row: "local Block PV: the container writes the device",
        test: "storage::a_local_block_volume_is_a_device_the_container_writes",
    },
    E2eCheck {
        row: "agent SIGKILL with a CSI volume: no remount, no leak",
        test: "storage::a_killed_agent_keeps_the_csi_volume_mounted_once_and_leaks_nothing",
    },
    E2eCheck {
        row: "SIGTERM keeps pods; logind shutdown by priority",
        test: "graceful_node_shutdown_through_logind_stops_pods_by_priority",
    },
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    Systemd,
    Cgroupfs,
}

impl Driver {
    fn name(self) -> &'static str {
        match self {
            Driver::Systemd => "systemd",
            Driver::Cgroupfs => "cgroupfs",
        }
    }
}

/// What `cargo xtask test` runs: the production node's configuration on
/// the newer LTS kernel.
pub const CI_PLAN: (&str, &str) = ("6.12", "systemd");

/// The boots to make: `kernels` × `drivers` as asked, by default systemd on
/// every kernel and cgroupfs on 6.12.
fn plan(kernels: &[String], drivers: &[String]) -> Result<Vec<(KernelSpec, Driver)>> {
    let mut ks = vec![];
    for k in kernels {
        ks.push(*KERNELS.iter().find(|s| s.name == k).with_context(|| {
            format!(
                "no node VM kernel `{k}` (known: {})",
                KERNELS.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
            )
        })?);
    }
    let mut ds = vec![];
    for d in drivers {
        ds.push(match d.as_str() {
            "systemd" => Driver::Systemd,
            "cgroupfs" => Driver::Cgroupfs,
            other => bail!("no cgroup driver `{other}` (known: systemd, cgroupfs)"),
        });
    }
    Ok(match (ks.is_empty(), ds.is_empty()) {
        (true, true) => {
            let mut p: Vec<(KernelSpec, Driver)> = KERNELS.iter().rev().map(|k| (*k, Driver::Systemd)).collect();
            p.extend(KERNELS.iter().filter(|k| k.name == "6.12").map(|k| (*k, Driver::Cgroupfs)));
            p
        }
        (true, false) => KERNELS.iter().rev().flat_map(|k| ds.iter().map(move |d| (*k, *d))).collect(),
        (false, true) => ks.iter().map(|k| (*k, Driver::Systemd)).collect(),
        (false, false) => ks.iter().flat_map(|k| ds.iter().map(move |d| (*k, *d))).collect(),
    })
}

fn selected(filters: &[String]) -> Vec<E2eCheck> {
    E2E_CHECKS
        .iter()
        .copied()
        .filter(|c| filters.is_empty() || filters.iter().any(|f| c.test.contains(f.as_str())))
        .collect()
}

/// One boot's results.
pub struct E2eColumn {
    pub kernel: String,
    pub driver: &'static str,
    pub outcomes: BTreeMap<&'static str, Outcome>,
    /// qemu started → systemd reports the system running.
    pub boot_seconds: Option<f64>,
    pub seconds: f64,
    pub failures: Vec<(String, String)>,
}

impl E2eColumn {
    pub fn failed(&self) -> bool {
        !self.failures.is_empty() || self.outcomes.values().any(|o| matches!(o, Outcome::Fail(_) | Outcome::NotRun))
    }
}

/// `cargo xtask vmtest --e2e`.
pub fn run(args: Args) -> Result<()> {
    setup::require_root("the node VM")?;
    let tc = setup::all()?;
    setup::build_ebpf(&tc)?;
    let started = Instant::now();
    let columns = run_e2e(&tc, &args.kernels, &args.drivers, &args.filters)?;
    print_e2e(&columns, &args.filters);
    note(format!("node VM checks in {:.0}s", started.elapsed().as_secs_f64()));
    if columns.iter().any(E2eColumn::failed) {
        bail!("some end-to-end checks failed (console output above)");
    }
    Ok(())
}

/// What goes on the payload disk.
struct Payload {
    dir: PathBuf,
}

/// Builds swiftlet, the test binary and the test CSI driver.
fn build(tc: &setup::EbpfToolchain) -> Result<(PathBuf, PathBuf, PathBuf)> {
    step("building swiftlet, the node VM's test binary and the test CSI driver");
    let root = cmd::workspace_root();
    cmd::run(Command::new("cargo").current_dir(root).env("PATH", tc.path_env()).args(["build", "-p", "swiftlet"]))?;
    cmd::run(Command::new("cargo").current_dir(root).env("PATH", tc.path_env()).args([
        "build",
        "-p",
        "swiftlet-tests",
        "--bin",
        CSI_DRIVER_BIN,
    ]))?;
    let out = Command::new("cargo")
        .current_dir(root)
        .env("PATH", tc.path_env())
        .args([
            "test",
            "-p",
            "swiftlet-tests",
            "--test",
            E2E_BIN,
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run cargo test --no-run")?;
    if !out.status.success() {
        bail!("building tests/tests/{E2E_BIN}.rs failed");
    }
    let exe = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.pointer("/target/name").and_then(|n| n.as_str()) == Some(E2E_BIN))
        .find_map(|v| v.get("executable").and_then(|e| e.as_str()).map(PathBuf::from))
        .with_context(|| format!("cargo built no executable for tests/tests/{E2E_BIN}.rs"))?;
    Ok((root.join("target/debug/swiftlet"), exe, root.join("target/debug").join(CSI_DRIVER_BIN)))
}

/// The files every boot shares: binaries (debug info stripped), images,
/// kubectl and the project's systemd unit and drop-in.
fn payload(dir: &Path, (swiftlet, test, csi): (&Path, &Path, &Path), kubectl: &Path) -> Result<Payload> {
    let root = cmd::workspace_root();
    let _ = fs::remove_dir_all(dir);
    for d in ["bin", "images", "deploy"] {
        fs::create_dir_all(dir.join(d))?;
    }
    let scratch = dir.join(".scratch");
    fs::create_dir_all(&scratch)?;
    for (name, bin) in [("swiftlet", swiftlet), (E2E_BIN, test), (CSI_DRIVER_BIN, csi)] {
        fs::write(dir.join("bin").join(name), stripped(bin, &scratch)?)?;
    }
    fs::copy(kubectl, dir.join("bin/kubectl")).with_context(|| format!("cannot copy {}", kubectl.display()))?;
    for (_, tar) in images::ensure(root)? {
        let name = tar.file_name().context("image tar name")?;
        fs::copy(&tar, dir.join("images").join(name))?;
    }
    for f in ["swiftlet.service", "10-swiftlet.conf"] {
        fs::copy(root.join("deploy/systemd").join(f), dir.join("deploy").join(f))?;
    }
    fs::write(dir.join("containerd-cgroupfs.toml"), node::containerd_config(false))?;
    fs::remove_dir_all(&scratch)?;
    for e in fs::read_dir(dir.join("bin"))? {
        let p = e?.path();
        fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    }
    Ok(Payload { dir: dir.to_owned() })
}

/// The runner the node's `swiftlet-e2e.service` starts.
fn runner(driver: Driver, checks: &[E2eCheck]) -> String {
    let tmp = cmd::workspace_root().join("target/tmp");
    let mut s = format!(
        r#"#!/bin/sh
# The node VM's checks, written by `cargo xtask vmtest --e2e`.
# A node shutdown (the last check) must not stop the runner before it reports.
trap '' TERM
up() {{ cut -d' ' -f1 /proc/uptime; }}
echo "@@VM kernel=$(uname -r) driver={driver} userspace=$(up)"
state=$(systemctl is-system-running --wait)
echo "@@VM system=$state booted=$(up) cgroup=$(stat -fc %T /sys/fs/cgroup) controllers=$(cat /sys/fs/cgroup/cgroup.controllers)"
[ "$state" = running ] || systemctl --failed --no-pager
install -m 0755 /payload/bin/swiftlet /usr/bin/swiftlet
install -D -m 0644 /payload/deploy/swiftlet.service /etc/systemd/system/swiftlet.service
install -D -m 0644 /payload/deploy/10-swiftlet.conf /etc/systemd/system/swiftlet.service.d/10-swiftlet.conf
systemctl daemon-reload
{containerd_config}
n=0
until ctr version >/dev/null 2>&1 || [ $n -ge 100 ]; do sleep 0.2; n=$((n+1)); done
echo "@@VM containerd=$(up)"
for t in /payload/images/*.tar; do ctr -n k8s.io images import "$t" >/dev/null || echo "@@NOTE cannot import $t"; done
mkdir -p {tmp}
# The storage checks' loop devices (a module in Debian's kernels).
modprobe loop || echo "@@NOTE cannot load the loop driver"
echo "@@VM ready=$(up)"
export SWIFTLET_NODE_E2E=1 SWIFTLET_E2E_DRIVER={driver} SWIFTLET_TEST_KUBECTL=/payload/bin/kubectl
export SWIFTLET_TEST_CRI_ENDPOINT=unix:///run/containerd/containerd.sock RUST_BACKTRACE=1 HOME=/root
cd /tmp
check() {{
  id=$1; shift
  echo "@@BEGIN $id $(up)"
  "$@" </dev/null
  echo "@@END $id rc=$? $(up)"
}}
"#,
        driver = driver.name(),
        tmp = tmp.display(),
        containerd_config = match driver {
            Driver::Systemd => "",
            Driver::Cgroupfs =>
                "cp /payload/containerd-cgroupfs.toml /etc/containerd/config.toml && systemctl restart containerd",
        },
    );
    for (i, c) in checks.iter().enumerate() {
        s.push_str(&format!(
            "check {i} /payload/bin/{E2E_BIN} --exact {} --test-threads=1 --nocapture --include-ignored\n",
            c.test
        ));
    }
    s.push_str("echo @@DONE\nsync\nsystemctl poweroff -ff\n");
    s
}

/// How long one node boot may take: boot, image import and every check
/// under TCG, with room for the slow ones.
const NODE_TIMEOUT: Duration = Duration::from_secs(40 * 60);

/// Builds what the node needs and boots it once per (kernel, driver).
pub fn run_e2e(
    tc: &setup::EbpfToolchain,
    kernels: &[String],
    drivers: &[String],
    filters: &[String],
) -> Result<Vec<E2eColumn>> {
    let checks = selected(filters);
    if checks.is_empty() {
        bail!("no end-to-end check matches {filters:?}");
    }
    let plan = plan(kernels, drivers)?;
    setup::ensure_apt(setup::APT_VM)?;
    setup::ensure_apt(setup::APT_NODE_VM)?;
    let kubectl = setup::ensure_kubectl()?;
    let (swiftlet, test, csi) = build(tc)?;
    let root = cmd::workspace_root();
    let base = root.join("target/vmtest/node");
    fs::create_dir_all(&base)?;
    let payload = payload(&base.join("payload"), (&swiftlet, &test, &csi), &kubectl)?;
    // The disk carries every kernel's modules, whichever boot: one image
    // serves every plan.
    let mut images: Vec<(KernelSpec, KernelImage)> = vec![];
    for k in KERNELS {
        images.push((*k, fetch_kernel(k)?));
    }
    let disk = node::ensure_image(&images.iter().map(|(_, i)| i).collect::<Vec<_>>())?;
    let mut columns = vec![];
    for (k, driver) in plan {
        let image = &images.iter().find(|(s, _)| s.name == k.name).context("kernel fetched")?.1;
        let dir = base.join(format!("{}-{}", k.name, driver.name()));
        fs::create_dir_all(&dir)?;
        let initramfs = dir.join("boot.cpio");
        node::boot_initramfs(&initramfs, image)?;
        fs::write(payload.dir.join("run-e2e"), runner(driver, &checks))?;
        fs::set_permissions(payload.dir.join("run-e2e"), std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        let payload_disk = dir.join("payload.raw");
        make_disk(&payload.dir, &payload_disk)?;
        columns.push(boot_node(&k, image, driver, &disk, &payload_disk, &initramfs, &dir, &checks)?);
    }
    Ok(columns)
}

/// An ext4 image holding `dir`, sized for it.
fn make_disk(dir: &Path, image: &Path) -> Result<()> {
    let bytes: u64 = walk_size(dir)?;
    let mib = bytes / (1 << 20) * 13 / 10 + 64;
    let _ = fs::remove_file(image);
    cmd::run(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", "payload", "-d"])
            .arg(dir)
            .arg(image)
            .arg(format!("{mib}M"))
            .stdout(Stdio::null()),
    )
    .context("mkfs.ext4 -d (Debian e2fsprogs)")
}

fn walk_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for e in fs::read_dir(dir)? {
        let e = e?;
        let meta = e.metadata()?;
        total += if meta.is_dir() { walk_size(&e.path())? } else { meta.len() };
    }
    Ok(total)
}

#[allow(clippy::too_many_arguments)]
fn boot_node(
    k: &KernelSpec,
    image: &KernelImage,
    driver: Driver,
    disk: &Path,
    payload: &Path,
    initramfs: &Path,
    dir: &Path,
    checks: &[E2eCheck],
) -> Result<E2eColumn> {
    let boot = Boot {
        label: format!("node {} ({}, {} driver)", k.name, image.package, driver.name()),
        vmlinuz: &image.vmlinuz,
        initramfs,
        append: "root=/dev/vda rw quiet systemd.show_status=0 systemd.unified_cgroup_hierarchy=1 rdinit=/init".into(),
        drives: vec![
            Drive { image: disk.to_owned(), snapshot: true },
            Drive { image: payload.to_owned(), snapshot: true },
        ],
        memory_mib: 3072,
        cpu_max: false,
        timeout: NODE_TIMEOUT,
        dir,
    };
    let mut boot_seconds = None;
    let mut attempt = 0;
    let run = loop {
        attempt += 1;
        let run = qemu::boot(&boot, |line, t| {
            if line.starts_with("@@VM system=") {
                boot_seconds = Some(t);
            }
            note_check_end(line, t, |i| checks.get(i).map(|c| c.row));
        })?;
        // A kernel that dies before userspace (TCG has panicked in early
        // boot, once in tens of boots) says nothing about swiftlet, and
        // neither does a guest that dies on a stale int3 (TCG ran a stale
        // translation of kernel text just patched through a breakpoint, as
        // the kernel matrix sees too): boot it once more, and say so.
        let stale_int3 = run.early_end.is_some() && run.console.contains("Oops: int3");
        if (run.console.contains("@@VM kernel=") && !stale_int3) || attempt > 1 {
            break run;
        }
        note(if stale_int3 {
            format!("{}: the guest died on a stale int3 (a TCG artefact); booting again", boot.label)
        } else {
            format!("{}: the kernel did not reach userspace; booting again", boot.label)
        });
        let _ = fs::rename(dir.join("console.log"), dir.join("console-first-boot.log"));
    };
    let kernel = run
        .console
        .lines()
        .find_map(|l| l.strip_prefix("@@VM kernel=").and_then(|r| r.split_whitespace().next()))
        .unwrap_or(k.name)
        .to_owned();
    let mut col = E2eColumn {
        kernel,
        driver: driver.name(),
        outcomes: checks.iter().map(|c| (c.row, Outcome::NotRun)).collect(),
        boot_seconds,
        seconds: run.seconds,
        failures: vec![],
    };
    for sec in sections(&run.console) {
        let Some(c) = checks.get(sec.id) else { continue };
        let ok = sec.ok && sec.text.contains("test result: ok. 1 passed");
        col.outcomes.insert(c.row, if ok { Outcome::Pass(sec.seconds) } else { Outcome::Fail(sec.seconds) });
        if !ok {
            col.failures.push((c.row.to_owned(), sec.text));
        }
    }
    if let Some(why) = run.early_end {
        col.failures.push((format!("VM ({why})"), run.console));
    }
    Ok(col)
}

/// Prints each failure's console section, then the table of check ×
/// (kernel, driver), the boot times, and writes target/vmtest/node/e2e.md.
pub fn print_e2e(columns: &[E2eColumn], filters: &[String]) {
    for c in columns {
        for (row, text) in &c.failures {
            step(format!("FAILED on {} ({} driver): {row}; console output:", c.kernel, c.driver));
            eprintln!("{text}");
        }
    }
    let checks = selected(filters);
    let heads: Vec<String> = columns.iter().map(|c| format!("{} ({})", c.kernel, c.driver)).collect();
    let mut t = format!("| check | {} |\n|---|{}\n", heads.join(" | "), "---|".repeat(columns.len()));
    for ch in &checks {
        let cells: Vec<String> = columns
            .iter()
            .map(|c| match c.outcomes.get(ch.row) {
                Some(Outcome::Pass(s)) => format!("pass {s:.0}s"),
                Some(Outcome::Fail(s)) => format!("FAIL {s:.0}s"),
                Some(Outcome::NotApplicable(why)) => format!("n/a ({why})"),
                Some(Outcome::NotRun) | None => "NOT RUN".into(),
            })
            .collect();
        t.push_str(&format!("| {} | {} |\n", ch.row, cells.join(" | ")));
    }
    let boots: Vec<String> =
        columns.iter().map(|c| c.boot_seconds.map_or("—".into(), |s| format!("{s:.0}s"))).collect();
    t.push_str(&format!("| boot: qemu → systemd running | {} |\n", boots.join(" | ")));
    let totals: Vec<String> = columns.iter().map(|c| format!("{:.0}s", c.seconds)).collect();
    t.push_str(&format!("| total (boot, checks, power-off) | {} |\n", totals.join(" | ")));
    step("node VM: end-to-end checks");
    println!("{t}");
    let md = cmd::workspace_root().join("target/vmtest/node/e2e.md");
    let _ = fs::write(&md, format!("# Node VM end-to-end checks\n\n{t}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_check_has_a_test() {
        // `module::test` lives in tests/tests/<E2E_BIN>/module.rs.
        let dir = cmd::workspace_root().join("tests/tests");
        for c in E2E_CHECKS {
            let (path, name) = match c.test.rsplit_once("::") {
                Some((module, name)) => (dir.join(E2E_BIN).join(format!("{}.rs", module.replace("::", "/"))), name),
                None => (dir.join(format!("{E2E_BIN}.rs")), c.test),
            };
            let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(text.contains(&format!("fn {name}(")), "{} has no test {name}", path.display());
        }
    }

    #[test]
    fn the_default_plan_runs_systemd_everywhere_and_cgroupfs_on_6_12() {
        let p = plan(&[], &[]).unwrap();
        let names: Vec<(&str, Driver)> = p.iter().map(|(k, d)| (k.name, *d)).collect();
        assert_eq!(names, [("6.12", Driver::Systemd), ("6.1", Driver::Systemd), ("6.12", Driver::Cgroupfs)]);
        let one = plan(&["6.1".into()], &["cgroupfs".into()]).unwrap();
        assert_eq!(one.iter().map(|(k, d)| (k.name, *d)).collect::<Vec<_>>(), [("6.1", Driver::Cgroupfs)]);
        assert!(plan(&["5.10".into()], &[]).is_err());
        assert!(plan(&[], &["docker".into()]).is_err());
    }

    #[test]
    fn the_runner_runs_each_check_between_markers_and_sets_the_driver() {
        let r = runner(Driver::Cgroupfs, &E2E_CHECKS[..2]);
        assert!(r.contains("cp /payload/containerd-cgroupfs.toml /etc/containerd/config.toml"));
        assert!(r.contains(&format!("check 1 /payload/bin/{E2E_BIN} --exact {} ", E2E_CHECKS[1].test)));
        assert!(r.trim_end().ends_with("systemctl poweroff -ff"));
        assert!(!runner(Driver::Systemd, E2E_CHECKS).contains("containerd-cgroupfs.toml /etc"));
    }
}
