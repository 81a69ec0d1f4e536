//! The systemd cgroup driver, as the kubelet drives it through runc's
//! libcontainer: each cgroup of the pods' hierarchy is a transient slice
//! (`kubepods.slice`, `kubepods-burstable.slice`,
//! `kubepods-burstable-pod<uid>.slice`) started over D-Bus with its limits
//! as unit properties, then the exact values written to cgroupfs (systemd
//! keeps CPU quotas in whole percents); stopping the slice removes it.
//! containerd (`SystemdCgroup = true`) puts each container in a
//! `cri-containerd-<id>.scope` inside the pod's slice.

use std::time::Duration;

use async_trait::async_trait;

use super::{
    hierarchy::CgroupLimits,
    manager::{CgroupManager, CmCause, CmError, ctx, existing, kill_and_remove, write_limits},
    naming::{CgroupDriver, unit_name},
};
use crate::{
    cgroups::{CgroupFs, shares_to_weight},
    systemd::{
        Systemd,
        properties::{SliceResources, resource_properties, slice_properties},
    },
};

#[derive(Clone, Debug)]
pub struct SystemdCgroupManager {
    systemd: Systemd,
    fs: CgroupFs,
}

/// A cgroup's limits as slice properties.
fn resources(limits: &CgroupLimits) -> SliceResources {
    SliceResources {
        memory_max: limits.memory,
        cpu_weight: limits.cpu.shares.map(shares_to_weight),
        cpu_quota_us: limits.cpu.quota_us,
        cpu_period_us: limits.cpu.period_us,
        tasks_max: limits.pids,
    }
}

impl SystemdCgroupManager {
    /// Connects to systemd; fails, naming what is missing, where systemd is
    /// not PID 1 (the kubelet refuses to start there too).
    pub async fn connect(fs: CgroupFs) -> Result<SystemdCgroupManager, CmError> {
        let systemd = Systemd::connect().await.map_err(ctx(|| "cgroupDriver systemd".to_owned()))?;
        let version = systemd.version().await.map_err(ctx(|| "cgroupDriver systemd".to_owned()))?;
        tracing::info!(systemd = version, "cgroup driver: systemd (transient slices over D-Bus)");
        Ok(SystemdCgroupManager { systemd, fs })
    }

    fn slice<'a>(&self, cgroup: &'a str) -> Result<&'a str, CmError> {
        let unit = unit_name(cgroup);
        if unit.ends_with(".slice") {
            Ok(unit)
        } else {
            Err(CmError {
                what: format!("cgroup {cgroup}"),
                source: Box::new(CmCause::Missing(
                    "the systemd driver manages slices only (name ends in .slice)".into(),
                )),
            })
        }
    }
}

#[async_trait]
impl CgroupManager for SystemdCgroupManager {
    fn driver(&self) -> CgroupDriver {
        CgroupDriver::Systemd
    }

    async fn apply(&self, cgroup: &str, limits: &CgroupLimits) -> Result<(), CmError> {
        let unit = self.slice(cgroup)?;
        let r = resources(limits);
        let props = slice_properties(&format!("swiftlet: {unit}"), &r);
        self.systemd
            .start_transient_unit(unit, &props, &resource_properties(&r))
            .await
            .map_err(ctx(|| format!("start {unit}")))?;
        write_limits(&self.fs, cgroup, limits)
    }

    async fn update(&self, cgroup: &str, limits: &CgroupLimits) -> Result<(), CmError> {
        let rel = existing(&self.fs, cgroup)?;
        // The system's own units (system.slice, a kube.slice the operator
        // made) keep their settings across daemon reloads only as
        // properties.
        let unit = unit_name(rel);
        if unit.ends_with(".slice") || unit.ends_with(".service") || unit.ends_with(".scope") {
            self.systemd
                .set_unit_properties(unit, &resource_properties(&resources(limits)))
                .await
                .map_err(ctx(|| format!("set limits on {unit}")))?;
        }
        write_limits(&self.fs, rel, limits)
    }

    async fn destroy(&self, cgroup: &str, timeout: Duration) -> Result<(), CmError> {
        let unit = self.slice(cgroup)?;
        // The pod's processes go first (the kubelet kills what is left
        // before it destroys the pod cgroup), so stopping the slice does
        // not wait for its scopes' stop timeouts.
        if self.fs.exists(cgroup) {
            let _ = self.fs.kill_all(cgroup);
        }
        self.systemd.stop_unit(unit).await.map_err(ctx(|| format!("stop {unit}")))?;
        // A slice systemd never knew (made by an older agent through
        // cgroupfs) is still a directory.
        kill_and_remove(&self.fs, cgroup, timeout).await
    }
}
