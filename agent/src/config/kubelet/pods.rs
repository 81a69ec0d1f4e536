//! What the kubelet gives every pod: where pods come from (the static pod
//! directory and how often it is read), their log directory, DNS, the
//! default seccomp profile and the cap of the restart back-off.

use std::time::Duration;

use super::configuration::KubeletConfiguration;
use crate::config::{
    duration,
    error::ConfigError,
    values::{Ctx, Object},
};

/// Reads staticPodPath, podLogsDir, syncFrequency, fileCheckFrequency,
/// clusterDomain, clusterDNS, resolvConf, seccompDefault and
/// crashLoopBackOff (after featureGates, which gate the last one).
pub(super) fn read(cx: &Ctx, o: &mut Object, c: &mut KubeletConfiguration) -> Result<(), ConfigError> {
    c.static_pod_path = o.path("staticPodPath")?;
    if let Some(p) = o.path("podLogsDir")? {
        c.pod_logs_dir = p;
    }
    c.sync_frequency = o.duration_or("syncFrequency", c.sync_frequency)?;
    c.file_check_frequency = o.duration_or("fileCheckFrequency", c.file_check_frequency)?;
    c.volume_stats_agg_period = o.duration_or("volumeStatsAggPeriod", c.volume_stats_agg_period)?;
    read_dns(cx, o, c)?;
    if let Some(v) = o.boolean("seccompDefault")? {
        c.seccomp_default = v;
    }
    read_crash_loop_back_off(cx, o, c)
}

/// clusterDomain, clusterDNS and resolvConf.
fn read_dns(cx: &Ctx, o: &mut Object, c: &mut KubeletConfiguration) -> Result<(), ConfigError> {
    c.cluster_domain = o.string("clusterDomain")?.filter(|s| !s.is_empty());
    if let Some(n) = o.get("clusterDNS") {
        c.cluster_dns = cx.list(n, "clusterDNS")?.iter().map(|ip| cx.ip(ip, "clusterDNS")).collect::<Result<_, _>>()?;
    }
    if let Some(n) = o.get("resolvConf") {
        let p = cx.path(n, "resolvConf")?;
        c.resolv_conf = (!p.as_os_str().is_empty()).then_some(p);
    }
    Ok(())
}

/// crashLoopBackOff.maxContainerRestartPeriod, refused unless the feature
/// gate KubeletCrashLoopBackOffMax is on, as the kubelet's validation.
fn read_crash_loop_back_off(cx: &Ctx, o: &mut Object, c: &mut KubeletConfiguration) -> Result<(), ConfigError> {
    if let Some(n) = o.get("crashLoopBackOff") {
        let mut b = Object::new(cx, n, "crashLoopBackOff")?;
        if let Some(v) = b.duration("maxContainerRestartPeriod")? {
            let field = "crashLoopBackOff.maxContainerRestartPeriod";
            let at = b.get("maxContainerRestartPeriod").unwrap_or(n);
            if c.feature_gates.get("KubeletCrashLoopBackOffMax") != Some(&true) {
                return Err(cx.err(at, field, "FeatureGate KubeletCrashLoopBackOffMax not enabled"));
            }
            if v < Duration::from_secs(1) || v > Duration::from_secs(300) {
                return Err(cx.err(at, field, format!("{} must be between 1s and 300s", duration::format(v))));
            }
            c.crash_loop_back_off_max = Some(v);
        }
        b.finish()?;
    }
    Ok(())
}
