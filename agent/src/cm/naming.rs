//! Cgroup names of the pods' hierarchy, for the cgroupfs and systemd
//! drivers, and the kubelet's CPU conversions.

use super::qos::QosClass;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CgroupDriver {
    #[default]
    Cgroupfs,
    Systemd,
}

/// Names the cgroups of the pods' hierarchy under `cgroupRoot`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupNaming {
    pub driver: CgroupDriver,
    /// `cgroupRoot` as configured (`/` by default), without slashes at the ends.
    pub root: String,
}

impl CgroupNaming {
    pub fn new(driver: CgroupDriver, cgroup_root: &str) -> CgroupNaming {
        CgroupNaming { driver, root: cgroup_root.trim_matches('/').to_owned() }
    }

    fn join(&self, rel: &str) -> String {
        if self.root.is_empty() { rel.to_owned() } else { format!("{}/{rel}", self.root) }
    }

    /// `kubepods` (cgroupfs) or `kubepods.slice` (systemd).
    pub fn kubepods(&self) -> String {
        match self.driver {
            CgroupDriver::Cgroupfs => self.join("kubepods"),
            CgroupDriver::Systemd => self.join("kubepods.slice"),
        }
    }

    /// The QoS cgroup: kubepods itself for Guaranteed pods.
    pub fn qos(&self, qos: QosClass) -> String {
        let name = match qos {
            QosClass::Guaranteed => return self.kubepods(),
            QosClass::Burstable => "burstable",
            QosClass::BestEffort => "besteffort",
        };
        match self.driver {
            CgroupDriver::Cgroupfs => format!("{}/{name}", self.kubepods()),
            CgroupDriver::Systemd => format!("{}/kubepods-{name}.slice", self.kubepods()),
        }
    }

    /// The pod's cgroup: `pod<uid>` (cgroupfs) or
    /// `kubepods-<qos>-pod<uid with _ for ->.slice` (systemd).
    pub fn pod(&self, qos: QosClass, uid: &str) -> String {
        match self.driver {
            CgroupDriver::Cgroupfs => format!("{}/pod{uid}", self.qos(qos)),
            CgroupDriver::Systemd => {
                let uid = uid.replace('-', "_");
                let prefix = match qos {
                    QosClass::Guaranteed => "kubepods".to_owned(),
                    QosClass::Burstable => "kubepods-burstable".to_owned(),
                    QosClass::BestEffort => "kubepods-besteffort".to_owned(),
                };
                format!("{}/{prefix}-pod{uid}.slice", self.qos(qos))
            }
        }
    }

    /// The pod cgroup as CRI's `cgroup_parent` wants it: an absolute path
    /// for cgroupfs, the slice name for systemd.
    pub fn cri_parent(&self, qos: QosClass, uid: &str) -> String {
        match self.driver {
            CgroupDriver::Cgroupfs => format!("/{}", self.pod(qos, uid)),
            CgroupDriver::Systemd => self.pod(qos, uid).rsplit('/').next().unwrap_or_default().to_owned(),
        }
    }
}

/// Smallest and largest cpu.shares the kernel accepts.
pub const MIN_SHARES: u64 = 2;
pub const MAX_SHARES: u64 = 262_144;
/// The CFS period the kubelet uses (100 ms).
pub const QUOTA_PERIOD_US: u64 = 100_000;
/// Smallest CFS quota the kernel accepts (1 ms).
pub const MIN_QUOTA_US: i64 = 1_000;

/// cpu.shares for a milli-CPU request (the kubelet's MilliCPUToShares).
pub fn milli_cpu_to_shares(milli: i64) -> u64 {
    if milli <= 0 {
        return MIN_SHARES;
    }
    ((milli as u64 * 1024) / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// CFS quota for a milli-CPU limit (the kubelet's MilliCPUToQuota); None
/// for no limit.
pub fn milli_cpu_to_quota(milli: i64, period_us: u64) -> Option<i64> {
    if milli <= 0 {
        return None;
    }
    Some(((milli as i128 * period_us as i128) / 1000).max(MIN_QUOTA_US as i128) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroupfs_names() {
        let n = CgroupNaming::new(CgroupDriver::Cgroupfs, "/");
        assert_eq!(n.kubepods(), "kubepods");
        assert_eq!(n.pod(QosClass::Guaranteed, "u1"), "kubepods/podu1");
        assert_eq!(n.pod(QosClass::Burstable, "u1"), "kubepods/burstable/podu1");
        assert_eq!(n.pod(QosClass::BestEffort, "u1"), "kubepods/besteffort/podu1");
        assert_eq!(n.cri_parent(QosClass::BestEffort, "u1"), "/kubepods/besteffort/podu1");
        let r = CgroupNaming::new(CgroupDriver::Cgroupfs, "/swiftlet-test/");
        assert_eq!(r.pod(QosClass::Burstable, "u"), "swiftlet-test/kubepods/burstable/podu");
    }

    #[test]
    fn systemd_names() {
        let n = CgroupNaming::new(CgroupDriver::Systemd, "/");
        assert_eq!(n.pod(QosClass::Guaranteed, "a-b"), "kubepods.slice/kubepods-poda_b.slice");
        assert_eq!(
            n.pod(QosClass::Burstable, "a-b"),
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda_b.slice"
        );
        assert_eq!(n.cri_parent(QosClass::BestEffort, "x"), "kubepods-besteffort-podx.slice");
    }

    #[test]
    fn cpu_conversions() {
        for (milli, shares) in [(0, 2), (1, 2), (100, 102), (1000, 1024), (500_000, 262_144)] {
            assert_eq!(milli_cpu_to_shares(milli), shares, "{milli}m");
        }
        assert_eq!(milli_cpu_to_quota(0, QUOTA_PERIOD_US), None);
        assert_eq!(milli_cpu_to_quota(5, QUOTA_PERIOD_US), Some(1_000));
        assert_eq!(milli_cpu_to_quota(250, QUOTA_PERIOD_US), Some(25_000));
        assert_eq!(milli_cpu_to_quota(2000, QUOTA_PERIOD_US), Some(200_000));
    }
}
