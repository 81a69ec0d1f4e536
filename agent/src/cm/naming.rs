//! Cgroup names of the pods' hierarchy, for the cgroupfs and systemd
//! drivers, and the kubelet's CPU conversions.

use super::qos::QosClass;
// The driver and the check of cgroupRoot are configuration values, read
// and validated with the rest of the configuration; the names are built here.
pub use crate::config::{CgroupDriver, KubeletConfiguration, systemd_root_parts};

impl KubeletConfiguration {
    /// Names of the pods' cgroups under cgroupRoot for the configured driver.
    pub fn cgroup_naming(&self) -> CgroupNaming {
        CgroupNaming::new(self.cgroup_driver, &self.cgroup_root)
    }
}

/// Names the cgroups of the pods' hierarchy under `cgroupRoot`.
///
/// With the cgroupfs driver the names are paths below `cgroupRoot`
/// (`kubepods/burstable/pod<uid>`). With the systemd driver they are the
/// kubelet's slices: each level adds a dash-separated part to the unit name
/// (dashes inside a part become underscores, as the kubelet escapes them),
/// and systemd nests `a-b-c.slice` in `a.slice/a-b.slice/a-b-c.slice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupNaming {
    pub driver: CgroupDriver,
    /// `cgroupRoot` as configured (`/` by default), without slashes at the ends.
    pub root: String,
    /// The systemd driver's name parts of `cgroupRoot` (none for `/`).
    root_parts: Vec<String>,
}

impl CgroupNaming {
    /// Names under `cgroup_root`. With the systemd driver a root that is
    /// not a slice path is treated as `/`; `systemd_root_parts` is the check
    /// the configuration runs first.
    pub fn new(driver: CgroupDriver, cgroup_root: &str) -> CgroupNaming {
        let root_parts = match driver {
            CgroupDriver::Systemd => systemd_root_parts(cgroup_root).unwrap_or_default(),
            CgroupDriver::Cgroupfs => vec![],
        };
        CgroupNaming { driver, root: cgroup_root.trim_matches('/').to_owned(), root_parts }
    }

    fn join(&self, rel: &str) -> String {
        if self.root.is_empty() { rel.to_owned() } else { format!("{}/{rel}", self.root) }
    }

    /// The systemd path (`/a.slice/a-b.slice/...`, without the leading
    /// slash) of the slice named by `root_parts` + `parts`.
    fn slice_path(&self, parts: &[&str]) -> String {
        let mut all: Vec<String> = self.root_parts.clone();
        all.extend(parts.iter().map(|p| p.replace('-', "_")));
        let mut path = vec![];
        for n in 1..=all.len() {
            path.push(format!("{}.slice", all[..n].join("-")));
        }
        path.join("/")
    }

    /// `kubepods` (cgroupfs) or `kubepods.slice` (systemd).
    pub fn kubepods(&self) -> String {
        match self.driver {
            CgroupDriver::Cgroupfs => self.join("kubepods"),
            CgroupDriver::Systemd => self.slice_path(&["kubepods"]),
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
            CgroupDriver::Systemd => self.slice_path(&["kubepods", name]),
        }
    }

    /// The pod's cgroup: `pod<uid>` (cgroupfs) or
    /// `kubepods-<qos>-pod<uid with _ for ->.slice` (systemd).
    pub fn pod(&self, qos: QosClass, uid: &str) -> String {
        let pod = format!("pod{uid}");
        match (self.driver, qos) {
            (CgroupDriver::Cgroupfs, _) => format!("{}/{pod}", self.qos(qos)),
            (CgroupDriver::Systemd, QosClass::Guaranteed) => self.slice_path(&["kubepods", &pod]),
            (CgroupDriver::Systemd, QosClass::Burstable) => self.slice_path(&["kubepods", "burstable", &pod]),
            (CgroupDriver::Systemd, QosClass::BestEffort) => self.slice_path(&["kubepods", "besteffort", &pod]),
        }
    }

    /// The pod cgroup as CRI's `cgroup_parent` wants it: an absolute path
    /// for cgroupfs, the slice name for systemd (containerd then asks
    /// systemd for `cri-containerd-<id>.scope` inside it).
    pub fn cri_parent(&self, qos: QosClass, uid: &str) -> String {
        match self.driver {
            CgroupDriver::Cgroupfs => format!("/{}", self.pod(qos, uid)),
            CgroupDriver::Systemd => unit_name(&self.pod(qos, uid)).to_owned(),
        }
    }
}

/// The systemd unit a cgroup path belongs to: its last component
/// (`kubepods.slice/kubepods-besteffort.slice` → `kubepods-besteffort.slice`).
pub fn unit_name(cgroup: &str) -> &str {
    cgroup.trim_matches('/').rsplit('/').next().unwrap_or_default()
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
        assert_eq!(n.kubepods(), "kubepods.slice");
        assert_eq!(n.qos(QosClass::BestEffort), "kubepods.slice/kubepods-besteffort.slice");
        let r = CgroupNaming::new(CgroupDriver::Systemd, "/swiftlet.slice");
        assert_eq!(r.kubepods(), "swiftlet.slice/swiftlet-kubepods.slice");
        assert_eq!(
            r.pod(QosClass::Burstable, "1-2"),
            "swiftlet.slice/swiftlet-kubepods.slice/swiftlet-kubepods-burstable.slice/swiftlet-kubepods-burstable-pod1_2.slice"
        );
        assert_eq!(r.cri_parent(QosClass::Guaranteed, "u"), "swiftlet-kubepods-podu.slice");
    }

    #[test]
    fn systemd_roots() {
        let ok: &[(&str, &[&str])] =
            &[("/", &[]), ("", &[]), ("/swiftlet.slice", &["swiftlet"]), ("/a.slice/a-b.slice/", &["a", "b"])];
        for (root, parts) in ok {
            assert_eq!(systemd_root_parts(root).unwrap(), *parts, "{root}");
        }
        for bad in ["/custom", "/a.slice/b.slice", "/a.slice/a-b-c.slice", "/.slice", "/a.slice/a-.slice"] {
            assert!(systemd_root_parts(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn unit_names() {
        assert_eq!(unit_name("kubepods.slice/kubepods-besteffort.slice/"), "kubepods-besteffort.slice");
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
