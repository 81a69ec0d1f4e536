//! The kernel tunables the kubelet checks at start (its container
//! manager's setupKernelTunables) and the agent's open-file limit
//! (maxOpenFiles).
//!
//! With `protectKernelDefaults: true` a tunable that differs from the
//! kubelet's value stops the start, with the kubelet's message naming it
//! (`invalid kernel flag: vm/overcommit_memory, expected value: 1, actual
//! value: 0`). With `false` the kubelet writes its values into the running
//! kernel; swiftlet does not change the host's kernel settings and says at
//! start which ones differ (a deliberate difference: the node's
//! configuration management owns sysctls).

use std::path::{Path, PathBuf};

/// The tunables and the values the kubelet wants, as /proc/sys paths.
pub const DESIRED: &[(&str, i64)] = &[
    // Overcommit always: the kubelet's memory accounting assumes it.
    ("vm/overcommit_memory", 1),
    // The OOM killer runs rather than the kernel panicking.
    ("vm/panic_on_oom", 0),
    // Reboot 10 s after a panic, and panic on an oops.
    ("kernel/panic", 10),
    ("kernel/panic_on_oops", 1),
    // Room for keys for many containers.
    ("kernel/keys/root_maxkeys", 1_000_000),
    ("kernel/keys/root_maxbytes", 25_000_000),
];

/// What the kernel has for one tunable: its value, or why it could not be
/// read.
pub type Reading = Result<i64, String>;

/// The kubelet's message for each tunable that differs or cannot be read
/// (pure).
pub fn differences(read: impl Fn(&str) -> Reading) -> Vec<String> {
    let mut out = vec![];
    for (flag, want) in DESIRED {
        match read(flag) {
            Ok(v) if v == *want => {}
            Ok(v) => out.push(format!("invalid kernel flag: {flag}, expected value: {want}, actual value: {v}")),
            Err(e) => out.push(e),
        }
    }
    out
}

/// Reads a tunable under `proc_sys` (normally /proc/sys).
pub fn read_sysctl(proc_sys: &Path, flag: &str) -> Reading {
    let path: PathBuf = proc_sys.join(flag);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.trim().parse().map_err(|_| format!("{}: not a number: {:?}", path.display(), text.trim()))
}

/// Checks the running kernel: Err (the start is refused) with the
/// kubelet's aggregated message when `protect` and a tunable differs;
/// otherwise the differences, for a warning.
pub fn check(protect: bool) -> Result<Vec<String>, String> {
    let diffs = differences(|f| read_sysctl(Path::new("/proc/sys"), f));
    if protect && !diffs.is_empty() {
        return Err(aggregate(&diffs));
    }
    Ok(diffs)
}

/// Go's utilerrors aggregate: one error alone, several in brackets.
fn aggregate(errs: &[String]) -> String {
    match errs {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn each_differing_tunable_is_named_with_the_kubelets_message() {
        let good: HashMap<&str, i64> = DESIRED.iter().copied().collect();
        assert!(differences(|f| Ok(good[f])).is_empty());
        let mut bad = good.clone();
        bad.insert("vm/overcommit_memory", 0);
        bad.insert("kernel/panic", 0);
        let d = differences(|f| Ok(bad[f]));
        assert_eq!(
            d,
            vec![
                "invalid kernel flag: vm/overcommit_memory, expected value: 1, actual value: 0".to_owned(),
                "invalid kernel flag: kernel/panic, expected value: 10, actual value: 0".to_owned(),
            ]
        );
        assert_eq!(aggregate(&d[..1]), d[0]);
        assert!(aggregate(&d).starts_with("[invalid kernel flag: vm/overcommit_memory"));
        let unreadable =
            differences(|f| if f.starts_with("kernel/keys") { Err(format!("{f}: gone")) } else { Ok(good[f]) });
        assert_eq!(
            unreadable,
            vec!["kernel/keys/root_maxkeys: gone".to_owned(), "kernel/keys/root_maxbytes: gone".to_owned()]
        );
    }

    #[test]
    fn reads_proc_sys_layout() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("vm")).unwrap();
        std::fs::write(dir.path().join("vm/overcommit_memory"), "1\n").unwrap();
        std::fs::write(dir.path().join("vm/panic_on_oom"), "x\n").unwrap();
        assert_eq!(read_sysctl(dir.path(), "vm/overcommit_memory"), Ok(1));
        assert!(read_sysctl(dir.path(), "vm/panic_on_oom").unwrap_err().contains("not a number"));
        assert!(read_sysctl(dir.path(), "kernel/panic").is_err());
    }
}
