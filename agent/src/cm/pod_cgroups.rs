//! The pods' cgroup hierarchy, applied through the configured driver: the
//! node allocatable cgroup (`kubepods`), the QoS cgroups, one cgroup per
//! pod, and the system's reserved cgroups when `enforceNodeAllocatable`
//! names them. What the limits are is `hierarchy`'s (pure); how a cgroup is
//! made is the driver's (`manager`, `systemd`).

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use parking_lot::Mutex;
use tracing::{info, warn};

use super::{
    blkio::{self, BlockDevices, DevNum},
    hierarchy::{CgroupLimits, qos_cgroup_limits, reserved_cgroup_limits},
    manager::{CgroupManager, CgroupfsManager, CmError},
    naming::{CgroupDriver, CgroupNaming},
    qos::QosClass,
    systemd::SystemdCgroupManager,
};
use crate::{
    cgroups::CgroupFs,
    config::{Enforcement, KubeletConfiguration},
};

/// Creates, limits and removes the pods' cgroups.
#[derive(Clone, Debug)]
pub struct PodCgroups {
    fs: CgroupFs,
    naming: CgroupNaming,
    manager: Arc<dyn CgroupManager>,
    /// The Burstable pods' summed cpu request last applied to their QoS
    /// cgroup, so an unchanged sum costs nothing.
    burstable_applied: Arc<Mutex<Option<i64>>>,
    block_devices: BlockDevices,
    /// Disks the kernel counts the pods' block I/O on (cgroup v1).
    block_io_counted: Arc<Mutex<BTreeSet<DevNum>>>,
}

impl PodCgroups {
    /// Writes through cgroupfs, whatever names `naming` gives.
    pub fn new(fs: CgroupFs, naming: CgroupNaming) -> PodCgroups {
        let manager = Arc::new(CgroupfsManager::new(fs.clone()));
        PodCgroups::with_manager(fs, naming, manager)
    }

    pub fn with_manager(fs: CgroupFs, naming: CgroupNaming, manager: Arc<dyn CgroupManager>) -> PodCgroups {
        PodCgroups {
            fs,
            naming,
            manager,
            burstable_applied: Arc::new(Mutex::new(None)),
            block_devices: BlockDevices::default(),
            block_io_counted: Arc::new(Mutex::new(BTreeSet::new())),
        }
    }

    /// Reads the disks and mounts from elsewhere than the host's (tests).
    pub fn with_block_devices(mut self, devices: BlockDevices) -> PodCgroups {
        self.block_devices = devices;
        self
    }

    /// For the configured driver and cgroupRoot: the systemd driver connects
    /// to systemd over D-Bus and fails where there is none.
    pub async fn for_config(fs: CgroupFs, config: &KubeletConfiguration) -> Result<PodCgroups, CmError> {
        let naming = config.cgroup_naming();
        let manager: Arc<dyn CgroupManager> = match naming.driver {
            CgroupDriver::Cgroupfs => Arc::new(CgroupfsManager::new(fs.clone())),
            CgroupDriver::Systemd => Arc::new(SystemdCgroupManager::connect(fs.clone()).await?),
        };
        Ok(PodCgroups::with_manager(fs, naming, manager))
    }

    pub fn fs(&self) -> &CgroupFs {
        &self.fs
    }

    pub fn naming(&self) -> &CgroupNaming {
        &self.naming
    }

    pub fn driver(&self) -> CgroupDriver {
        self.manager.driver()
    }

    /// Creates kubepods (with `kubepods` limits, see `kubepods_limits`), the
    /// Burstable and BestEffort QoS cgroups with the minimum cpu shares
    /// until `update_burstable_cpu_shares` knows the Burstable pods, and
    /// has the node's disks' block I/O counted where the kernel needs it
    /// ([`PodCgroups::account_block_io`]). Idempotent: safe at every start.
    pub async fn ensure_hierarchy(&self, kubepods: &CgroupLimits) -> Result<(), CmError> {
        self.manager.apply(&self.naming.kubepods(), kubepods).await?;
        for qos in [QosClass::Burstable, QosClass::BestEffort] {
            self.manager.apply(&self.naming.qos(qos), &qos_cgroup_limits(qos, 0)).await?;
        }
        *self.burstable_applied.lock() = Some(0);
        self.account_block_io(true).await;
        Ok(())
    }

    /// On cgroup v1 (see `cm::blkio`), tells the kernel to keep the pods'
    /// block I/O statistics on each disk in use it was not told about yet,
    /// through the pods' cgroup, without a limit. At start (logged whatever
    /// was done) and when a pod's cgroup is made, after its volumes are set
    /// up (a volume's loop device may be new). Failures are logged: the
    /// statistics are not worth refusing a pod. Returns the disks newly
    /// counted.
    pub async fn account_block_io(&self, at_start: bool) -> Vec<DevNum> {
        if !self.manager.block_io_needs_accounting() {
            return vec![];
        }
        let disks = blkio::scan_disks(&self.block_devices.sys_block);
        let counted = self.block_io_counted.lock().clone();
        let candidates: Vec<blkio::Disk> = disks.into_iter().filter(|d| !counted.contains(&d.dev)).collect();
        // mountinfo only tells about memory disks, and is long on a busy node.
        let mounted = if candidates.iter().any(|d| blkio::is_memory_disk(&d.name)) {
            blkio::mounted_devices(&std::fs::read_to_string(&self.block_devices.mountinfo).unwrap_or_default())
        } else {
            BTreeSet::new()
        };
        let wanted = blkio::disks_to_account(&candidates, &mounted);
        if wanted.is_empty() && !at_start {
            return vec![];
        }
        let kubepods = self.naming.kubepods();
        let result = match self.manager.account_block_io(&kubepods, &wanted).await {
            Ok(r) => r,
            Err(e) => {
                warn!("block I/O statistics per container stay empty: {e}");
                return vec![];
            }
        };
        self.block_io_counted.lock().extend(result.counted.iter().copied());
        let name = |dev: &DevNum| {
            candidates.iter().find(|d| d.dev == *dev).map_or_else(|| dev.to_string(), |d| format!("{} ({dev})", d.name))
        };
        let counted: Vec<String> = result.counted.iter().map(name).collect();
        info!(
            cgroup = kubepods,
            file = blkio::ACCOUNTING_FILE,
            "cgroup v1 block I/O statistics switched on, without a limit, for disks: [{}]{}",
            counted.join(", "),
            if at_start {
                " (kernels from 6.9 count a disk's I/O per cgroup only once a throttle rule was written for it)"
            } else {
                ""
            }
        );
        for (dev, e) in &result.failed {
            warn!(disk = name(dev), "block I/O statistics per container stay empty for this disk: {e}");
        }
        result.counted
    }

    /// `enforceNodeAllocatable`'s `system-reserved` and `kube-reserved`
    /// (or their `-compressible` forms): the reservation becomes the limits
    /// of `systemReservedCgroup` / `kubeReservedCgroup`, which the system
    /// made (the kubelet does not create them either).
    pub async fn enforce_reserved(&self, k: &KubeletConfiguration) -> Result<(), CmError> {
        let wanted = [
            (
                Enforcement::SystemReserved,
                Enforcement::SystemReservedCompressible,
                &k.system_reserved_cgroup,
                &k.system_reserved,
            ),
            (
                Enforcement::KubeReserved,
                Enforcement::KubeReservedCompressible,
                &k.kube_reserved_cgroup,
                &k.kube_reserved,
            ),
        ];
        for (full, compressible, cgroup, reservation) in wanted {
            let (on_full, on_compressible) = (k.enforces(full), k.enforces(compressible));
            // Validation makes sure the cgroup is named when enforced.
            let (Some(cgroup), true) = (cgroup, on_full || on_compressible) else { continue };
            let limits = reserved_cgroup_limits(reservation, !on_full);
            self.enforce_reserved_cgroup(cgroup, &limits).await?;
            info!(cgroup, enforced = full.as_str(), ?limits, "reserved resources enforced");
        }
        Ok(())
    }

    /// Applies `limits` to an existing cgroup of the system (the
    /// kubeReservedCgroup or systemReservedCgroup, absolute names such as
    /// `/system.slice`), which the kubelet requires to exist already.
    pub async fn enforce_reserved_cgroup(&self, cgroup: &str, limits: &CgroupLimits) -> Result<(), CmError> {
        self.manager.update(cgroup, limits).await.map_err(|e| CmError {
            what: format!("enforce reserved resources on {cgroup}: {}", e.what),
            source: e.source,
        })
    }

    /// The Burstable QoS cgroup's cpu shares (cpu.weight on v2) from the sum
    /// of its pods' cpu requests, as the kubelet's QoS container manager
    /// keeps them; nothing is written when the sum did not change.
    pub async fn update_burstable_cpu_shares(&self, total_request_milli: i64) -> Result<(), CmError> {
        if *self.burstable_applied.lock() == Some(total_request_milli) {
            return Ok(());
        }
        let qos = QosClass::Burstable;
        self.manager.apply(&self.naming.qos(qos), &qos_cgroup_limits(qos, total_request_milli)).await?;
        *self.burstable_applied.lock() = Some(total_request_milli);
        Ok(())
    }

    /// The pod's cgroup (relative to the hierarchy root).
    pub fn pod_cgroup(&self, qos: QosClass, uid: &str) -> String {
        self.naming.pod(qos, uid)
    }

    /// Creates the pod's cgroup with `limits` (see `pod_cgroup_config`), or
    /// updates it. Returns its relative path.
    pub async fn ensure_pod_cgroup(&self, qos: QosClass, uid: &str, limits: &CgroupLimits) -> Result<String, CmError> {
        let rel = self.pod_cgroup(qos, uid);
        self.manager.apply(&rel, limits).await?;
        self.account_block_io(false).await;
        Ok(rel)
    }

    /// Kills whatever still runs in the pod's cgroup and removes it (and
    /// any child cgroups the runtime left), waiting up to `timeout` for the
    /// processes to go. A missing cgroup is fine.
    pub async fn remove_pod_cgroup(&self, qos: QosClass, uid: &str, timeout: Duration) -> Result<(), CmError> {
        self.manager.destroy(&self.pod_cgroup(qos, uid), timeout).await
    }
}

#[cfg(test)]
mod tests {
    use std::{fs, path::Path};

    use super::*;
    use crate::{
        cgroups::{CpuLimits, Version, shares_to_weight},
        cm::{
            allocatable::{Resource, ResourceList},
            hierarchy::{kubepods_limits, pod_cgroup_config},
            manager::InMemoryCgroups,
            test_support::{container, reservation, spec},
        },
        config::ReservedResource,
    };

    const P: Duration = Duration::from_millis(100);
    const MI: u64 = 1 << 20;

    fn read(p: &Path) -> String {
        fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).trim().to_owned()
    }

    /// A fake cgroup2 tree in a temporary directory: directories are
    /// cgroups, files are their interface files.
    #[tokio::test]
    async fn v2_tree_in_a_temp_dir() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("cgroup.controllers"), "cpuset cpu io memory pids\n").unwrap();
        let cgfs = CgroupFs::with_layout(tmp.path(), Version::V2);
        let pc = PodCgroups::new(cgfs, CgroupNaming::new(CgroupDriver::Cgroupfs, "/swiftlet-unit"));
        let kubepods = CgroupLimits {
            memory: Some(29 << 30),
            cpu: CpuLimits { shares: Some(14_848), quota_us: None, period_us: 100_000 },
            pids: Some(1000),
            hugetlb: vec![],
        };
        pc.ensure_hierarchy(&kubepods).await.unwrap();
        let kp = tmp.path().join("swiftlet-unit/kubepods");
        assert_eq!(read(&kp.join("memory.max")), (29u64 << 30).to_string());
        assert_eq!(read(&kp.join("cpu.weight")), shares_to_weight(14_848).to_string());
        assert_eq!(read(&kp.join("cpu.max")), "max 100000");
        assert_eq!(read(&kp.join("pids.max")), "1000");
        assert_eq!(read(&kp.join("besteffort/cpu.weight")), "1");
        assert_eq!(read(&kp.join("burstable/cpu.weight")), "1");
        assert!(!kp.join("besteffort/memory.max").exists(), "QoS cgroups get no memory limit");
        assert_eq!(
            read(&tmp.path().join("cgroup.subtree_control")),
            "+memory +cpu +pids",
            "controllers are enabled for the children"
        );
        pc.update_burstable_cpu_shares(2_000).await.unwrap();
        assert_eq!(read(&kp.join("burstable/cpu.weight")), shares_to_weight(2048).to_string());

        let cfg = pod_cgroup_config(
            &spec(vec![container(&[("cpu", "250m")], &[("cpu", "500m"), ("memory", "64Mi")])]),
            true,
            P,
            100,
        );
        let rel = pc.ensure_pod_cgroup(QosClass::Burstable, "u-1", &cfg).await.unwrap();
        assert_eq!(rel, "swiftlet-unit/kubepods/burstable/podu-1");
        let pod = tmp.path().join(&rel);
        assert_eq!(read(&pod.join("memory.max")), (64 * MI).to_string());
        assert_eq!(read(&pod.join("cpu.max")), "50000 100000");
        assert_eq!(read(&pod.join("cpu.weight")), shares_to_weight(256).to_string());
        assert_eq!(read(&pod.join("pids.max")), "100");

        let with_pages = CgroupLimits { hugetlb: vec![(2 << 20, 64 * MI), (1 << 30, 0)], ..cfg };
        pc.ensure_pod_cgroup(QosClass::Burstable, "u-1", &with_pages).await.unwrap();
        assert_eq!(read(&pod.join("hugetlb.2MB.max")), (64 * MI).to_string());
        assert_eq!(read(&pod.join("hugetlb.1GB.max")), "0");
    }

    /// A fake v1 tree: one directory per controller, named as the systemd
    /// driver names them.
    #[tokio::test]
    async fn v1_tree_in_a_temp_dir_with_systemd_names() {
        let tmp = tempfile::tempdir().unwrap();
        for c in ["memory", "cpu", "cpuacct", "pids", "freezer"] {
            fs::create_dir(tmp.path().join(c)).unwrap();
        }
        let cgfs = CgroupFs::with_layout(tmp.path(), Version::V1);
        let pc = PodCgroups::new(cgfs, CgroupNaming::new(CgroupDriver::Systemd, "/"));
        let kubepods = kubepods_limits(&ResourceList::from([
            (Resource::Cpu, "2".parse().unwrap()),
            (Resource::Memory, "3Gi".parse().unwrap()),
        ]));
        pc.ensure_hierarchy(&kubepods).await.unwrap();
        let mem = tmp.path().join("memory/kubepods.slice");
        assert_eq!(read(&mem.join("memory.limit_in_bytes")), (3u64 << 30).to_string());
        let cpu_dir = tmp.path().join("cpu/kubepods.slice");
        assert_eq!(read(&cpu_dir.join("cpu.shares")), "2048");
        assert_eq!(read(&cpu_dir.join("cpu.cfs_quota_us")), "-1");
        assert_eq!(read(&cpu_dir.join("kubepods-besteffort.slice/cpu.shares")), "2");
        assert!(!tmp.path().join("pids/kubepods.slice/pids.max").exists(), "no pid capacity, no pids.max");

        let g = pod_cgroup_config(&spec(vec![container(&[], &[("cpu", "1"), ("memory", "256Mi")])]), true, P, -1);
        let rel = pc.ensure_pod_cgroup(QosClass::Guaranteed, "a-b", &g).await.unwrap();
        assert_eq!(rel, "kubepods.slice/kubepods-poda_b.slice");
        assert_eq!(read(&tmp.path().join("memory").join(&rel).join("memory.limit_in_bytes")), (256 * MI).to_string());
        assert_eq!(read(&tmp.path().join("cpu").join(&rel).join("cpu.cfs_quota_us")), "100000");
    }

    #[tokio::test]
    async fn a_reserved_cgroup_must_exist_and_gets_its_limits() {
        let r = reservation();
        let full = reserved_cgroup_limits(&r, false);
        let tmp = tempfile::tempdir().unwrap();
        let pc = PodCgroups::new(
            CgroupFs::with_layout(tmp.path(), Version::V2),
            CgroupNaming::new(CgroupDriver::Cgroupfs, "/"),
        );
        let err = pc.enforce_reserved_cgroup("/system.slice", &full).await.unwrap_err().to_string();
        assert!(err.starts_with("enforce reserved resources on /system.slice: "), "{err}");
        assert!(err.ends_with("the cgroup does not exist"), "{err}");
        fs::create_dir(tmp.path().join("system.slice")).unwrap();
        pc.enforce_reserved_cgroup("/system.slice", &full).await.unwrap();
        assert_eq!(read(&tmp.path().join("system.slice/memory.max")), (1u64 << 30).to_string());
        assert_eq!(read(&tmp.path().join("system.slice/pids.max")), "1000");
    }

    #[tokio::test]
    async fn enforce_node_allocatable_names_the_reserved_cgroups() {
        let mem = InMemoryCgroups::default();
        mem.add_existing("system.slice");
        mem.add_existing("kube.slice");
        let pc = PodCgroups::with_manager(
            CgroupFs::with_layout(Path::new("/nonexistent"), Version::V2),
            CgroupNaming::new(CgroupDriver::Cgroupfs, "/"),
            Arc::new(mem.clone()),
        );
        let q = |s: &str| s.parse().unwrap();
        let mut k = KubeletConfiguration {
            system_reserved: [(ReservedResource::Cpu, q("1")), (ReservedResource::Memory, q("1Gi"))].into(),
            kube_reserved: [(ReservedResource::Cpu, q("500m")), (ReservedResource::Memory, q("2Gi"))].into(),
            system_reserved_cgroup: Some("/system.slice".into()),
            kube_reserved_cgroup: Some("/kube.slice".into()),
            enforce_node_allocatable: [
                Enforcement::Pods,
                Enforcement::SystemReserved,
                Enforcement::KubeReservedCompressible,
            ]
            .into(),
            ..Default::default()
        };
        pc.enforce_reserved(&k).await.unwrap();
        let system = mem.get("system.slice").unwrap().limits;
        assert_eq!((system.memory, system.cpu.shares), (Some(1 << 30), Some(1024)));
        let kube = mem.get("kube.slice").unwrap().limits;
        assert_eq!((kube.memory, kube.cpu.shares), (None, Some(512)), "compressible: cpu only");

        k.enforce_node_allocatable = [Enforcement::Pods].into();
        let untouched = InMemoryCgroups::default();
        let pc = PodCgroups::with_manager(pc.fs.clone(), pc.naming.clone(), Arc::new(untouched.clone()));
        pc.enforce_reserved(&k).await.unwrap();
        assert!(untouched.get("system.slice").is_none(), "not enforced: not touched");
    }

    #[tokio::test]
    async fn burstable_shares_are_written_only_when_the_sum_changes() {
        let mem = InMemoryCgroups::default();
        let pc = PodCgroups::with_manager(
            CgroupFs::with_layout(Path::new("/nonexistent"), Version::V2),
            CgroupNaming::new(CgroupDriver::Systemd, "/"),
            Arc::new(mem.clone()),
        );
        pc.ensure_hierarchy(&CgroupLimits::default()).await.unwrap();
        let burstable = "kubepods.slice/kubepods-burstable.slice";
        assert_eq!(mem.get(burstable).unwrap().limits.cpu.shares, Some(2));
        pc.update_burstable_cpu_shares(0).await.unwrap();
        assert_eq!(mem.get(burstable).unwrap().applies, 1, "same sum: nothing written");
        pc.update_burstable_cpu_shares(750).await.unwrap();
        let b = mem.get(burstable).unwrap();
        assert_eq!((b.limits.cpu.shares, b.applies), (Some(768), 2));
        assert_eq!(mem.get("kubepods.slice/kubepods-besteffort.slice").unwrap().limits.cpu.shares, Some(2));
    }

    /// A fake `/sys/block`: (name, dev, size) disks, each with a queue.
    fn sys_block(disks: &[(&str, &str, u64)]) -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        for (name, dev, size) in disks {
            let d = tmp.path().join(name);
            fs::create_dir_all(d.join("queue")).unwrap();
            fs::write(d.join("dev"), format!("{dev}\n")).unwrap();
            fs::write(d.join("size"), format!("{size}\n")).unwrap();
        }
        fs::write(tmp.path().join("mountinfo"), "27 1 254:0 / / rw - ext4 /dev/vda rw\n").unwrap();
        tmp
    }

    fn with_disks(mem: &InMemoryCgroups, sys: &Path) -> PodCgroups {
        PodCgroups::with_manager(
            CgroupFs::with_layout(Path::new("/nonexistent"), Version::V1),
            CgroupNaming::new(CgroupDriver::Cgroupfs, "/"),
            Arc::new(mem.clone()),
        )
        .with_block_devices(BlockDevices { sys_block: sys.to_owned(), mountinfo: sys.join("mountinfo") })
    }

    #[tokio::test]
    async fn v1_disks_are_accounted_once_through_kubepods() {
        let sys = sys_block(&[("vda", "254:0", 1 << 29), ("zram0", "253:0", 1 << 20), ("loop0", "7:0", 0)]);
        let mem = InMemoryCgroups { v1_block_io: true, ..Default::default() };
        let pc = with_disks(&mem, sys.path());
        pc.ensure_hierarchy(&CgroupLimits::default()).await.unwrap();
        let dev = |s: &str| DevNum::parse(s).unwrap();
        assert_eq!(mem.block_io.lock().clone(), [("kubepods".to_owned(), vec![dev("254:0")])].into());
        // A pod whose volume bound a loop device: only the new disk.
        fs::write(sys.path().join("loop0/size"), "131072\n").unwrap();
        pc.ensure_pod_cgroup(QosClass::BestEffort, "u", &CgroupLimits::default()).await.unwrap();
        assert_eq!(mem.block_io.lock()["kubepods"], [dev("254:0"), dev("7:0")]);
        // Nothing new: nothing asked.
        assert!(pc.account_block_io(false).await.is_empty());
        assert_eq!(mem.block_io.lock()["kubepods"].len(), 2);
    }

    #[tokio::test]
    async fn v2_and_drivers_that_need_nothing_are_not_asked() {
        let sys = sys_block(&[("vda", "254:0", 1 << 29)]);
        let mem = InMemoryCgroups::default();
        let pc = with_disks(&mem, sys.path());
        pc.ensure_hierarchy(&CgroupLimits::default()).await.unwrap();
        assert!(pc.account_block_io(false).await.is_empty());
        assert!(mem.block_io.lock().is_empty());
        // The cgroupfs driver on v2 has nothing to do either.
        let tmp = tempfile::tempdir().unwrap();
        let v2 = PodCgroups::new(
            CgroupFs::with_layout(tmp.path(), Version::V2),
            CgroupNaming::new(CgroupDriver::Cgroupfs, "/"),
        )
        .with_block_devices(BlockDevices { sys_block: sys.path().to_owned(), mountinfo: sys.path().join("mountinfo") });
        v2.ensure_hierarchy(&CgroupLimits::default()).await.unwrap();
        assert!(!tmp.path().join("blkio").exists());
        assert!(!tmp.path().join("kubepods").join(blkio::ACCOUNTING_FILE).exists());
    }

    /// The cgroupfs driver on a fake v1 tree writes `254:0 0` into the
    /// pods' cgroup in the blkio tree (the kernel makes the file; here the
    /// test does).
    #[tokio::test]
    async fn v1_cgroupfs_writes_the_line_into_kubepods() {
        let sys = sys_block(&[("vda", "254:0", 1 << 29)]);
        let tmp = tempfile::tempdir().unwrap();
        for c in ["memory", "cpu", "blkio"] {
            fs::create_dir(tmp.path().join(c)).unwrap();
        }
        let file = tmp.path().join("blkio/swiftlet-unit/kubepods").join(blkio::ACCOUNTING_FILE);
        fs::create_dir_all(file.parent().unwrap()).unwrap();
        fs::write(&file, "").unwrap();
        let pc = PodCgroups::new(
            CgroupFs::with_layout(tmp.path(), Version::V1),
            CgroupNaming::new(CgroupDriver::Cgroupfs, "/swiftlet-unit"),
        )
        .with_block_devices(BlockDevices { sys_block: sys.path().to_owned(), mountinfo: sys.path().join("mountinfo") });
        pc.ensure_hierarchy(&CgroupLimits::default()).await.unwrap();
        assert_eq!(read(&file), "254:0 0");
    }

    #[tokio::test]
    async fn removing_a_missing_pod_cgroup_is_fine() {
        let tmp = tempfile::tempdir().unwrap();
        let pc = PodCgroups::new(
            CgroupFs::with_layout(tmp.path(), Version::V2),
            CgroupNaming::new(CgroupDriver::Cgroupfs, "/"),
        );
        pc.remove_pod_cgroup(QosClass::BestEffort, "nope", Duration::from_millis(10)).await.unwrap();
    }
}
