//! KubeletConfiguration fields read apart from `kubelet/` (which holds
//! the bulk): the pods' unsafe sysctls, how OOM kills end a container, the
//! agent's own file limit, the host's cgroup version policy and the CPUs
//! reserved for the system.

use super::{
    error::ConfigError,
    kubelet::{KubeletConfiguration, ReservedResource},
    values::{Ctx, Object},
};
use crate::{quantity::Quantity, sysctl::Allowlist};

/// Counts the CPUs of a list such as `0-3,8` (None when malformed).
fn cpu_count(list: &str) -> Option<i64> {
    let mut n = 0;
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (i64, i64) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a || a < 0 {
                    return None;
                }
                b - a + 1
            }
            None => {
                part.parse::<u32>().ok()?;
                1
            }
        };
    }
    Some(n)
}

/// Reads allowedUnsafeSysctls, singleProcessOOMKill, failCgroupV1,
/// maxOpenFiles and reservedSystemCPUs (after kubeReserved and
/// systemReserved, whose cpu the last one overrides, as the kubelet does).
pub fn read(cx: &Ctx, o: &mut Object, c: &mut KubeletConfiguration) -> Result<(), ConfigError> {
    if let Some(n) = o.get("allowedUnsafeSysctls") {
        let list = cx.string_list(n, "allowedUnsafeSysctls")?;
        // Checked against a kernel new enough for every safe sysctl: only
        // the unsafe entries can be refused here.
        Allowlist::new((u32::MAX, 0), &list).map_err(|e| cx.err(n, "allowedUnsafeSysctls", e))?;
        c.allowed_unsafe_sysctls = list;
    }
    c.single_process_oom_kill = o.boolean("singleProcessOOMKill")?;
    if let Some(v) = o.boolean("failCgroupV1")? {
        c.fail_cgroup_v1 = v;
    }
    if let Some(n) = o.get("maxOpenFiles") {
        let v = cx.int_in(n, "maxOpenFiles", 0, i64::MAX)?;
        if v > 0 {
            c.max_open_files = v as u64;
        }
    }
    if let Some(n) = o.get("reservedSystemCPUs") {
        let raw = cx.string(n, "reservedSystemCPUs")?;
        if !raw.trim().is_empty() {
            let count = cpu_count(&raw).ok_or_else(|| {
                cx.err(n, "reservedSystemCPUs", format!("{raw:?} is not a CPU list (for example \"0-1,4\")"))
            })?;
            // The kubelet: "it will overwrite the cpu setting in
            // KubeReserved and SystemReserved".
            c.kube_reserved.remove(&ReservedResource::Cpu);
            c.system_reserved.insert(ReservedResource::Cpu, Quantity::from_units(count));
            c.reserved_system_cpus = Some(raw);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(cpu_count("0-3,8"), Some(5));
        assert_eq!(cpu_count("1"), Some(1));
        assert_eq!(cpu_count("3-1"), None);
        assert_eq!(cpu_count("a"), None);
    }
}
