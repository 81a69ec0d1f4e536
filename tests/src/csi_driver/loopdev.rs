//! Loop devices over image files (the filesystems on them are `filesystems`).
//!
//! Attached devices are read from sysfs (`/sys/block/loopN/loop/backing_file`,
//! what `losetup -j` reads too); losetup attaches, detaches and refreshes.

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
};

use super::{HostError, run};

/// One attached loop device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopDevice {
    /// `/dev/loopN`.
    pub device: PathBuf,
    /// The image file (as the kernel resolved it when attaching).
    pub backing: PathBuf,
    /// Whether the image was deleted while attached.
    pub deleted: bool,
    /// (major, minor).
    pub dev: (u32, u32),
}

/// `"7:3"` → (7, 3).
fn parse_dev(s: &str) -> Option<(u32, u32)> {
    let (major, minor) = s.trim().split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Every attached loop device.
pub fn list() -> Vec<LoopDevice> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else { return Vec::new() };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        // Only attached devices have a backing file.
        let Ok(backing) = std::fs::read_to_string(e.path().join("loop/backing_file")) else { continue };
        let backing = backing.trim_end_matches('\n');
        let (backing, deleted) = match backing.strip_suffix(" (deleted)") {
            Some(b) => (b, true),
            None => (backing, false),
        };
        let Some(dev) = std::fs::read_to_string(e.path().join("dev")).ok().as_deref().and_then(parse_dev) else {
            continue;
        };
        out.push(LoopDevice { device: Path::new("/dev").join(&name), backing: backing.into(), deleted, dev });
    }
    out.sort_by(|a, b| a.device.cmp(&b.device));
    out
}

/// The loop devices attached to `image` (normally one).
pub fn find(image: &Path) -> Vec<LoopDevice> {
    let image = std::fs::canonicalize(image).unwrap_or_else(|_| image.to_owned());
    list().into_iter().filter(|l| !l.deleted && l.backing == image).collect()
}

/// The loop device of `image`, attaching one when there is none; true
/// when this call attached it.
pub fn attach(image: &Path) -> Result<(PathBuf, bool), HostError> {
    if let Some(l) = find(image).into_iter().next() {
        return Ok((l.device, false));
    }
    let out = run("losetup", &[OsStr::new("--find"), OsStr::new("--show"), image.as_os_str()])?;
    let device = out.trim();
    if device.is_empty() {
        return Err(HostError::Failed {
            cmd: format!("losetup --find --show {}", image.display()),
            status: "no device printed".into(),
            stderr: String::new(),
        });
    }
    Ok((PathBuf::from(device), true))
}

fn sysfs(device: &Path) -> PathBuf {
    Path::new("/sys/class/block").join(device.file_name().unwrap_or_default())
}

fn is_attached(device: &Path) -> bool {
    sysfs(device).join("loop/backing_file").exists()
}

/// Detaches `device`; a device already detached is fine. (A device still
/// mounted somewhere detaches when that mount goes: the kernel's autoclear.)
pub fn detach(device: &Path) -> Result<(), HostError> {
    if !is_attached(device) {
        return Ok(());
    }
    match run("losetup", &[OsStr::new("--detach"), device.as_os_str()]) {
        Err(_) if !is_attached(device) => Ok(()),
        other => other.map(drop),
    }
}

/// Makes `device` see its image's new size.
pub fn refresh(device: &Path) -> Result<(), HostError> {
    run("losetup", &[OsStr::new("--set-capacity"), device.as_os_str()]).map(drop)
}

fn sectors(path: &Path) -> Result<u64, HostError> {
    let s = std::fs::read_to_string(path).map_err(|e| HostError::io("cannot read", path, e))?;
    s.trim().parse::<u64>().map(|n| n.saturating_mul(512)).map_err(|e| {
        HostError::io("cannot parse", path, std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
    })
}

/// The size of the block device `device` in bytes.
pub fn size_bytes(device: &Path) -> Result<u64, HostError> {
    sectors(&sysfs(device).join("size"))
}

/// The size of the block device with these numbers, in bytes.
pub fn size_bytes_of(dev: (u32, u32)) -> Result<u64, HostError> {
    sectors(&PathBuf::from(format!("/sys/dev/block/{}:{}/size", dev.0, dev.1)))
}

/// Creates `image` as a sparse file of `size` bytes unless it exists, and
/// grows it when smaller (never shrinks). Its size after.
pub fn grow_image(image: &Path, size: u64) -> Result<u64, HostError> {
    if let Some(dir) = image.parent() {
        std::fs::create_dir_all(dir).map_err(|e| HostError::io("cannot create", dir, e))?;
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(image)
        .map_err(|e| HostError::io("cannot open", image, e))?;
    let now = f.metadata().map_err(|e| HostError::io("cannot stat", image, e))?.len();
    if now >= size {
        return Ok(now);
    }
    f.set_len(size).map_err(|e| HostError::io("cannot grow", image, e))?;
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers() {
        assert_eq!(parse_dev("7:12\n"), Some((7, 12)));
        assert_eq!(parse_dev("7"), None);
        assert_eq!(parse_dev("a:b"), None);
    }

    #[test]
    fn images_grow_sparse_and_never_shrink() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("v/a.img");
        assert_eq!(grow_image(&img, 16 << 20).unwrap(), 16 << 20);
        assert_eq!(grow_image(&img, 8 << 20).unwrap(), 16 << 20);
        assert_eq!(grow_image(&img, 32 << 20).unwrap(), 32 << 20);
        let meta = std::fs::metadata(&img).unwrap();
        assert_eq!(meta.len(), 32 << 20);
        use std::os::unix::fs::MetadataExt;
        assert!(meta.blocks() * 512 < 1 << 20, "the image is sparse");
    }
}
