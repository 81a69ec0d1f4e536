//! Benches inside the VM kernels (`cargo xtask bench --vm`): the
//! benchmark runner and the workload generator in an initramfs with the
//! kernel matrix's prelude, the results back over the serial console, and
//! for the cache race an ext4 disk of its own.

use std::{fs, path::Path, process::Command, time::Duration};

use anyhow::{Result, bail};

use super::{
    cache_disk,
    initramfs::build_initramfs,
    kernel::{KERNELS, KernelSpec, fetch_kernel},
    matrix::{MATRIX_TIMEOUT, boot_matrix_vm, vm_prelude},
};
use crate::{
    cmd::{self, note, step},
    setup,
};

/// Benches run inside VM kernels: each of `names` in each of `kernels`
/// (their results come back over the console), added to `report_dir`'s
/// report as `<bench>@<kernel>`. `runner` and `workload` are the runner's
/// build. Timings under TCG are emulated; the benches report ratios of
/// modes measured side by side in the same VM.
pub fn bench(
    runner: &Path,
    workload: &Path,
    report_dir: &Path,
    quick: bool,
    kernels: &[String],
    names: &[String],
) -> Result<()> {
    setup::ensure_apt(setup::APT_VM)?;
    let root = cmd::workspace_root();
    let out = report_dir.join("kernels");
    fs::create_dir_all(&out)?;
    let mut imports = vec![];
    let selected: Vec<&KernelSpec> =
        KERNELS.iter().filter(|k| kernels.is_empty() || kernels.iter().any(|n| n == k.name)).collect();
    for n in kernels {
        if !KERNELS.iter().any(|k| k.name == n) {
            bail!("no VM kernel `{n}` (known: {})", KERNELS.iter().map(|k| k.name).collect::<Vec<_>>().join(", "));
        }
    }
    for k in selected {
        let image = fetch_kernel(k)?;
        let dir = root.join("target/vmtest").join(format!("bench-{}", k.name));
        fs::create_dir_all(&dir)?;
        let initramfs = dir.join("initramfs.cpio");
        let mut script = vm_prelude(root);
        // The run counts the benches read, passed on from this shell.
        for var in ["SWIFTLET_BENCH_RACE_RUNS", "SWIFTLET_BENCH_CACHE_RUNS"] {
            if let Ok(v) = std::env::var(var)
                && v.chars().all(|c| c.is_ascii_digit() || c == ',')
            {
                script.push_str(&format!("export {var}={v}\n"));
            }
        }
        // The cache race's page cache lives on a disk of its own.
        let drives = if cache_disk::wanted(names) { vec![cache_disk::disk(&dir)?] } else { vec![] };
        if !drives.is_empty() {
            script.push_str(cache_disk::SCRIPT);
        }
        script.push_str(&format!(
            "check 0 /t/swiftlet-bench --out /tmp/bench --emit-json {}{}\necho @@DONE\nsync\npoweroff -f\n",
            if quick { "--quick " } else { "" },
            names.join(" ")
        ));
        step(format!("kernel {}: initramfs with the benchmark runner", k.name));
        let payload = vec![
            ("/t/swiftlet-bench".to_owned(), runner.to_owned()),
            ("/t/swiftlet-workload".to_owned(), workload.to_owned()),
        ];
        build_initramfs(&initramfs, &image, &payload, &script)?;
        if !drives.is_empty() {
            cache_disk::add_disk_modules(&initramfs, &image)?;
        }
        // A full race run is hundreds of runs under emulation.
        let timeout = if quick { MATRIX_TIMEOUT } else { Duration::from_secs(4 * 3600) };
        let run = boot_matrix_vm(k, &image, &initramfs, &dir, timeout, drives, |line, _| {
            if line.starts_with("    ") || line.starts_with("==> ") {
                note(line.trim());
            }
        })?;
        let json = run.console.lines().find_map(|l| l.strip_prefix("@@BENCH-JSON ")).map(str::to_owned);
        match (json, run.early_end) {
            (Some(json), None) => {
                let file = out.join(format!("{}-{}.json", k.name, names.join("+")));
                fs::write(&file, json)?;
                imports.push(format!("{}={}", k.name, file.display()));
            }
            (_, why) => {
                eprintln!("{}", run.console);
                bail!(
                    "the benches {} did not finish on {} ({}); its console is above",
                    names.join(", "),
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
