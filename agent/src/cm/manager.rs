//! How the pods' cgroups are created, limited and removed: the kubelet's
//! CgroupManager, one implementation per cgroup driver (`cgroupfs` here,
//! `systemd` in `cm::systemd`) and an in-memory one for tests, in the shape
//! of youki's libcgroups. Reading cgroups (usage, limits, processes) stays
//! with `cgroups::CgroupFs`, whatever the driver: both drivers' cgroups are
//! plain cgroupfs directories, named by `CgroupNaming`.

use std::{collections::BTreeMap, fmt::Debug, sync::Arc, time::Duration};

use async_trait::async_trait;
use parking_lot::Mutex;
use thiserror::Error;

use super::{
    blkio::{self, Accounting, DevNum},
    hierarchy::CgroupLimits,
    naming::CgroupDriver,
};
use crate::{
    cgroups::{CgroupError, CgroupFs, Version},
    systemd::SystemdError,
};

#[derive(Debug, Error)]
#[error("{what}: {source}")]
pub struct CmError {
    pub what: String,
    /// Boxed: a D-Bus error is large, and every cgroup call returns this.
    #[source]
    pub source: Box<CmCause>,
}

#[derive(Debug, Error)]
pub enum CmCause {
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error(transparent)]
    Systemd(#[from] SystemdError),
    #[error("{0}")]
    Missing(String),
}

pub(crate) fn ctx<E: Into<CmCause>>(what: impl FnOnce() -> String) -> impl FnOnce(E) -> CmError {
    move |source| CmError { what: what(), source: Box::new(source.into()) }
}

/// A cgroup driver. Cgroups are named by their path below the hierarchy
/// root (`kubepods/burstable/pod<uid>`, `kubepods.slice/...`), as
/// `CgroupNaming` gives them.
#[async_trait]
pub trait CgroupManager: Send + Sync + Debug {
    fn driver(&self) -> CgroupDriver;

    /// Creates `cgroup` (and the parents this driver needs) with `limits`,
    /// or sets them on a cgroup that exists.
    async fn apply(&self, cgroup: &str, limits: &CgroupLimits) -> Result<(), CmError>;

    /// Sets `limits` on a cgroup this agent does not own (the system's
    /// `systemReservedCgroup` and `kubeReservedCgroup`), which must exist.
    async fn update(&self, cgroup: &str, limits: &CgroupLimits) -> Result<(), CmError>;

    /// Kills what still runs in `cgroup` and removes it, waiting up to
    /// `timeout` for its processes to go. A missing cgroup is fine.
    async fn destroy(&self, cgroup: &str, timeout: Duration) -> Result<(), CmError>;

    /// Whether the kernel keeps per-cgroup block I/O statistics on a disk
    /// only once told to ([`CgroupManager::account_block_io`]): cgroup v1's
    /// blkio (see `cm::blkio`). cgroup v2's io.stat needs nothing.
    fn block_io_needs_accounting(&self) -> bool {
        false
    }

    /// Makes the kernel keep every cgroup's block I/O statistics on
    /// `disks`, through `cgroup` (the pods' cgroup, made in the blkio tree
    /// if missing). No limit is set.
    async fn account_block_io(&self, _cgroup: &str, _disks: &[DevNum]) -> Result<Accounting, CmError> {
        Ok(Accounting::default())
    }
}

/// Writes the limits of an existing cgroup through cgroupfs (either
/// driver: systemd's properties are rounded, cgroupfs gets exact values).
pub(crate) fn write_limits(fs: &CgroupFs, rel: &str, limits: &CgroupLimits) -> Result<(), CmError> {
    if let Some(m) = limits.memory {
        fs.set_memory_limit(rel, Some(m)).map_err(ctx(|| format!("memory limit of {rel}")))?;
    }
    if limits.cpu.shares.is_some() || limits.cpu.quota_us.is_some() {
        fs.set_cpu(rel, limits.cpu).map_err(ctx(|| format!("cpu of {rel}")))?;
    }
    if let Some(p) = limits.pids {
        fs.set_pids_max(rel, Some(p)).map_err(ctx(|| format!("pids.max of {rel}")))?;
    }
    if !limits.hugetlb.is_empty() {
        // Enables the hugetlb controller down to the cgroup (systemd, which
        // has no hugetlb property, does not), as runc does.
        fs.create(rel).map_err(ctx(|| format!("hugetlb controller for {rel}")))?;
        for (size, limit) in &limits.hugetlb {
            let page = super::hugepages::cri_page_size(*size);
            fs.set_hugetlb_limit(rel, &page, *limit).map_err(ctx(|| format!("hugetlb.{page} of {rel}")))?;
        }
    }
    Ok(())
}

/// The cgroupfs driver: directories made and removed directly.
#[derive(Clone, Debug)]
pub struct CgroupfsManager {
    fs: CgroupFs,
}

impl CgroupfsManager {
    pub fn new(fs: CgroupFs) -> CgroupfsManager {
        CgroupfsManager { fs }
    }
}

/// Kills a cgroup's processes and removes its directories (the cgroupfs
/// driver's destroy, and the systemd driver's for what systemd left).
/// The cgroup's path relative to the hierarchy, if it exists: an update
/// never creates the cgroup it changes.
pub(crate) fn existing<'a>(fs: &CgroupFs, cgroup: &'a str) -> Result<&'a str, CmError> {
    let rel = cgroup.trim_matches('/');
    if fs.exists(rel) {
        return Ok(rel);
    }
    Err(CmError {
        what: format!("set limits on {cgroup}"),
        source: Box::new(CmCause::Missing("the cgroup does not exist".into())),
    })
}

pub(crate) async fn kill_and_remove(fs: &CgroupFs, rel: &str, timeout: Duration) -> Result<(), CmError> {
    if !fs.exists(rel) {
        return Ok(());
    }
    match fs.kill_all(rel) {
        Ok(_) => {}
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) => return Err(CmError { what: format!("kill the processes of {rel}"), source: Box::new(e.into()) }),
    }
    // rmdir waits (polling EBUSY) for the killed tasks to leave.
    let (fs, owned) = (fs.clone(), rel.to_owned());
    tokio::task::spawn_blocking(move || fs.remove(&owned, timeout))
        .await
        .unwrap_or_else(|e| Err(CgroupError::Io { path: rel.into(), source: std::io::Error::other(e) }))
        .map_err(ctx(|| format!("remove cgroup {rel}")))
}

#[async_trait]
impl CgroupManager for CgroupfsManager {
    fn driver(&self) -> CgroupDriver {
        CgroupDriver::Cgroupfs
    }

    async fn apply(&self, cgroup: &str, limits: &CgroupLimits) -> Result<(), CmError> {
        self.fs.create(cgroup).map_err(ctx(|| format!("create cgroup {cgroup}")))?;
        write_limits(&self.fs, cgroup, limits)
    }

    async fn update(&self, cgroup: &str, limits: &CgroupLimits) -> Result<(), CmError> {
        let rel = existing(&self.fs, cgroup)?;
        write_limits(&self.fs, rel, limits)
    }

    async fn destroy(&self, cgroup: &str, timeout: Duration) -> Result<(), CmError> {
        kill_and_remove(&self.fs, cgroup, timeout).await
    }

    fn block_io_needs_accounting(&self) -> bool {
        self.fs.version() == Version::V1 && self.fs.root().join("blkio").is_dir()
    }

    async fn account_block_io(&self, cgroup: &str, disks: &[DevNum]) -> Result<Accounting, CmError> {
        if !self.block_io_needs_accounting() {
            return Ok(Accounting::default());
        }
        blkio::account_v1(&self.fs, cgroup, disks).map_err(ctx(|| format!("block I/O accounting on {cgroup}")))
    }
}

/// What an [`InMemoryCgroups`] holds for one cgroup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecordedCgroup {
    pub limits: CgroupLimits,
    /// How many times limits were applied.
    pub applies: u32,
}

/// A driver in memory, for unit tests of what the container manager asks
/// for: cgroups are entries; `existing` ones stand for the system's.
#[derive(Clone, Debug, Default)]
pub struct InMemoryCgroups {
    pub cgroups: Arc<Mutex<BTreeMap<String, RecordedCgroup>>>,
    /// Acts as a v1 cgroupfs driver for block I/O accounting.
    pub v1_block_io: bool,
    /// The disks accounted through each cgroup, in the order asked.
    pub block_io: Arc<Mutex<BTreeMap<String, Vec<DevNum>>>>,
}

impl InMemoryCgroups {
    pub fn get(&self, cgroup: &str) -> Option<RecordedCgroup> {
        self.cgroups.lock().get(cgroup.trim_matches('/')).cloned()
    }

    /// A cgroup someone else made (for `update`).
    pub fn add_existing(&self, cgroup: &str) {
        self.cgroups.lock().insert(cgroup.trim_matches('/').to_owned(), RecordedCgroup::default());
    }
}

#[async_trait]
impl CgroupManager for InMemoryCgroups {
    fn driver(&self) -> CgroupDriver {
        CgroupDriver::Cgroupfs
    }

    async fn apply(&self, cgroup: &str, limits: &CgroupLimits) -> Result<(), CmError> {
        let mut all = self.cgroups.lock();
        let entry = all.entry(cgroup.trim_matches('/').to_owned()).or_default();
        entry.limits = limits.clone();
        entry.applies += 1;
        Ok(())
    }

    async fn update(&self, cgroup: &str, limits: &CgroupLimits) -> Result<(), CmError> {
        match self.cgroups.lock().get_mut(cgroup.trim_matches('/')) {
            Some(entry) => {
                entry.limits = limits.clone();
                entry.applies += 1;
                Ok(())
            }
            None => Err(CmError {
                what: format!("set limits on {cgroup}"),
                source: Box::new(CmCause::Missing("the cgroup does not exist".into())),
            }),
        }
    }

    async fn destroy(&self, cgroup: &str, _timeout: Duration) -> Result<(), CmError> {
        self.cgroups.lock().remove(cgroup.trim_matches('/'));
        Ok(())
    }

    fn block_io_needs_accounting(&self) -> bool {
        self.v1_block_io
    }

    async fn account_block_io(&self, cgroup: &str, disks: &[DevNum]) -> Result<Accounting, CmError> {
        if !self.v1_block_io {
            return Ok(Accounting::default());
        }
        self.block_io.lock().entry(cgroup.trim_matches('/').to_owned()).or_default().extend(disks);
        Ok(Accounting { counted: disks.to_vec(), failed: vec![] })
    }
}
