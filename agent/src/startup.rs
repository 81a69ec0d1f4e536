//! What the kubelet checks on the host and sets on its own process at
//! start: swap (failSwapOn), cgroup v1 (failCgroupV1, and
//! singleProcessOOMKill, which v1 cannot turn off), the agent's
//! oom_score_adj (oomScoreAdj) and its open-file limit (maxOpenFiles).
//! The decisions are pure; reading /proc and setting limits are the edge.

use rustix::process::{Resource, Rlimit};

use crate::{cgroups::Version, config::KubeletConfiguration};

/// Why the host refuses this configuration, in the kubelet's words.
pub fn host_refusal(k: &KubeletConfiguration, swaps: &str, cgroups: Version) -> Option<String> {
    let swap_lines: Vec<&str> = swaps.trim().lines().collect();
    if k.fail_swap_on && swap_lines.len() > 1 {
        return Some(format!(
            "running with swap on is not supported, please disable swap or set --fail-swap-on flag to false. \
             /proc/swaps contained: [{}]",
            swap_lines.join(" ")
        ));
    }
    if cgroups == Version::V1 && k.fail_cgroup_v1 {
        return Some(
            "kubelet is configured to not run on a host using cgroup v1. cgroup v1 support is unsupported and will \
             be removed in a future release (failCgroupV1)"
                .into(),
        );
    }
    if cgroups == Version::V1 && k.single_process_oom_kill == Some(false) {
        return Some(
            "invalid configuration: singleProcessOOMKill must not be explicitly set to false when using cgroup v1"
                .into(),
        );
    }
    None
}

/// Whether an OOM kill ends the whole container (memory.oom.group=1): on
/// cgroup v2 unless singleProcessOOMKill is true, as the kubelet.
pub fn oom_kills_whole_container(k: &KubeletConfiguration, cgroups: Version) -> bool {
    cgroups == Version::V2 && k.single_process_oom_kill != Some(true)
}

/// Whether the host enforces AppArmor profiles (runc's check: the
/// securityfs directory and the module's `enabled` parameter).
pub fn apparmor_enabled() -> bool {
    std::path::Path::new("/sys/kernel/security/apparmor").is_dir()
        && std::fs::read_to_string("/sys/module/apparmor/parameters/enabled").is_ok_and(|v| v.starts_with('Y'))
}

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    rustix::system::uname().release().to_string_lossy().into_owned()
}

/// Applies oomScoreAdj and maxOpenFiles to this process; what could not be
/// applied is returned for the log (the kubelet logs and runs on).
pub fn apply_process_settings(k: &KubeletConfiguration) -> Vec<String> {
    let mut problems = vec![];
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", k.oom_score_adj.to_string()) {
        problems.push(format!("cannot set the agent's oom_score_adj to {} (oomScoreAdj): {e}", k.oom_score_adj));
    }
    let limit = Rlimit { current: Some(k.max_open_files), maximum: Some(k.max_open_files) };
    if let Err(e) = rustix::process::setrlimit(Resource::Nofile, limit) {
        problems.push(format!(
            "cannot set the open file limit to {} (maxOpenFiles): {}",
            k.max_open_files,
            std::io::Error::from(e)
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_SWAP: &str = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n";
    const SWAP: &str = "Filename\tType\tSize\tUsed\tPriority\n/swapfile\tfile\t1048572\t0\t-2\n";

    #[test]
    fn refusals() {
        let mut k = KubeletConfiguration::default();
        assert_eq!(host_refusal(&k, NO_SWAP, Version::V1), None);
        let swap = host_refusal(&k, SWAP, Version::V2).unwrap();
        assert!(swap.starts_with("running with swap on is not supported"), "{swap}");
        assert!(swap.contains("/swapfile"), "{swap}");
        k.fail_swap_on = false;
        assert_eq!(host_refusal(&k, SWAP, Version::V2), None);
        k.fail_cgroup_v1 = true;
        assert!(host_refusal(&k, NO_SWAP, Version::V1).unwrap().contains("cgroup v1"));
        assert_eq!(host_refusal(&k, NO_SWAP, Version::V2), None);
        k.fail_cgroup_v1 = false;
        k.single_process_oom_kill = Some(false);
        assert!(host_refusal(&k, NO_SWAP, Version::V1).unwrap().contains("singleProcessOOMKill"));
        assert_eq!(host_refusal(&k, NO_SWAP, Version::V2), None);
    }

    #[test]
    fn oom_group_on_v2_by_default() {
        let mut k = KubeletConfiguration::default();
        assert!(oom_kills_whole_container(&k, Version::V2));
        assert!(!oom_kills_whole_container(&k, Version::V1));
        k.single_process_oom_kill = Some(true);
        assert!(!oom_kills_whole_container(&k, Version::V2));
    }
}
