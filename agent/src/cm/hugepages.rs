//! Huge pages as the kubelet sees them: the page sizes the host offers
//! (`/sys/kernel/mm/hugepages/hugepages-<n>kB`) with their pre-allocated
//! pages (capacity `hugepages-2Mi`, `hugepages-1Gi`), and a container's
//! HugeTLB limits through CRI (every size the host has, 0 unless the
//! container's limits name it; sizes written `2MB`, `1GB` as runc's cgroup
//! files are). The naming and limits are pure; reading sysfs is the edge.

use std::{fs, io, path::Path};

use k8s_openapi::api::core::v1::Container;

use crate::{
    cgroups::{CgroupFs, Version},
    cri::api,
    quantity::Quantity,
};

/// The resource name prefix (`hugepages-2Mi`).
pub const PREFIX: &str = "hugepages-";

/// One page size the host offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PageSize {
    pub bytes: u64,
    /// Pages pre-allocated (nr_hugepages): capacity is bytes × pages.
    pub pages: u64,
}

impl PageSize {
    /// `hugepages-2Mi`.
    pub fn resource_name(self) -> String {
        resource_name(self.bytes)
    }

    pub fn capacity(self) -> u64 {
        self.bytes.saturating_mul(self.pages)
    }
}

/// The resource name of a page size, as Kubernetes prints the quantity.
pub fn resource_name(bytes: u64) -> String {
    let mut v = bytes;
    for unit in ["", "Ki", "Mi", "Gi", "Ti", "Pi"] {
        if !v.is_multiple_of(1024) || unit == "Pi" {
            return format!("{PREFIX}{v}{unit}");
        }
        v /= 1024;
    }
    format!("{PREFIX}{bytes}")
}

/// The page size a resource name stands for (`hugepages-2Mi` → 2 MiB).
pub fn page_bytes(resource: &str) -> Option<u64> {
    let q: Quantity = resource.strip_prefix(PREFIX)?.parse().ok()?;
    let v = q.value();
    (v > 0).then_some(v as u64)
}

/// The size as runc's cgroup files name it (`2MB`, `1GB`): the kubelet's
/// HugePageUnitSizeFromByteSize.
pub fn cri_page_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KB", "MB", "GB", "TB", "PB"];
    let (mut v, mut i) = (bytes, 0);
    while v != 0 && v.is_multiple_of(1024) && i < UNITS.len() - 1 {
        v /= 1024;
        i += 1;
    }
    format!("{v}{}", UNITS[i])
}

/// Reads the host's page sizes; none when sysfs has no huge pages.
pub fn host_page_sizes(root: &Path) -> io::Result<Vec<PageSize>> {
    let mut out = vec![];
    let entries = match fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for e in entries {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(kb) = name.strip_prefix("hugepages-").and_then(|s| s.strip_suffix("kB")) else { continue };
        let Ok(kb) = kb.parse::<u64>() else { continue };
        let pages = fs::read_to_string(e.path().join("nr_hugepages"))?.trim().parse().unwrap_or(0);
        out.push(PageSize { bytes: kb * 1024, pages });
    }
    out.sort();
    Ok(out)
}

/// Whether the cgroup hierarchy has a hugetlb controller to enforce
/// limits with (runc refuses limits it cannot set).
pub fn limits_supported(fs: &CgroupFs) -> bool {
    match fs.version() {
        Version::V1 => fs.root().join("hugetlb").is_dir(),
        Version::V2 => fs::read_to_string(fs.root().join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "hugetlb")),
    }
}

/// The sysfs directory of the host's huge pages.
pub const SYSFS: &str = "/sys/kernel/mm/hugepages";

/// A container's HugeTLB limits: every host size, limited to what the
/// container's limits give it (0 when it names none).
pub fn container_limits(c: &Container, host_sizes: &[u64]) -> Vec<api::HugepageLimit> {
    let limits = c.resources.as_ref().and_then(|r| r.limits.as_ref());
    host_sizes
        .iter()
        .map(|&size| {
            let limit = limits
                .into_iter()
                .flatten()
                .find(|(name, _)| page_bytes(name) == Some(size))
                .and_then(|(_, q)| q.0.parse::<Quantity>().ok())
                .map_or(0, |q| q.value().max(0) as u64);
            api::HugepageLimit { page_size: cri_page_size(size), limit }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{api::core::v1::ResourceRequirements, apimachinery::pkg::api::resource::Quantity as Q};

    use super::*;

    const MI2: u64 = 2 << 20;
    const GI1: u64 = 1 << 30;

    #[test]
    fn names_and_sizes() {
        assert_eq!(resource_name(MI2), "hugepages-2Mi");
        assert_eq!(resource_name(GI1), "hugepages-1Gi");
        assert_eq!(resource_name(64 << 10), "hugepages-64Ki");
        assert_eq!(page_bytes("hugepages-2Mi"), Some(MI2));
        assert_eq!(page_bytes("hugepages-1Gi"), Some(GI1));
        assert_eq!(page_bytes("memory"), None);
        assert_eq!(cri_page_size(MI2), "2MB");
        assert_eq!(cri_page_size(GI1), "1GB");
        assert_eq!(cri_page_size(64 << 10), "64KB");
        assert_eq!(PageSize { bytes: MI2, pages: 512 }.capacity(), 1 << 30);
    }

    #[test]
    fn limits_cover_every_host_size() {
        let c = Container {
            resources: Some(ResourceRequirements {
                limits: Some(
                    [("hugepages-2Mi".to_string(), Q("100Mi".into())), ("memory".to_string(), Q("1Gi".into()))].into(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        let l = container_limits(&c, &[MI2, GI1]);
        assert_eq!(
            l,
            vec![
                api::HugepageLimit { page_size: "2MB".into(), limit: 100 << 20 },
                api::HugepageLimit { page_size: "1GB".into(), limit: 0 },
            ]
        );
        assert!(container_limits(&c, &[]).is_empty(), "a host without huge pages sets none");
    }

    #[test]
    fn reads_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        for (name, n) in [("hugepages-2048kB", "16\n"), ("hugepages-1048576kB", "0\n")] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
            std::fs::write(dir.path().join(name).join("nr_hugepages"), n).unwrap();
        }
        let sizes = host_page_sizes(dir.path()).unwrap();
        assert_eq!(sizes, vec![PageSize { bytes: MI2, pages: 16 }, PageSize { bytes: GI1, pages: 0 }]);
        assert!(host_page_sizes(&dir.path().join("absent")).unwrap().is_empty());
    }
}
