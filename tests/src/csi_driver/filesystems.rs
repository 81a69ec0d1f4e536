//! The filesystems on the driver's volumes, ext4 and btrfs: finding one
//! (blkid), making one (mkfs) and growing one to its device's size.
//!
//! A mounted ext4 grows with resize2fs, which needs CAP_SYS_RESOURCE (some
//! sandboxes withhold it even from root); an unmounted one grows offline.
//! A btrfs grows only while mounted (`btrfs filesystem resize`, with
//! CAP_SYS_ADMIN), and the kernel refuses to resize one to less than
//! [`BTRFS_MIN_RESIZE`].

use std::{ffi::OsStr, path::Path};

use super::{HostError, loopdev, run};

/// The kernel's floor for a btrfs resize (`SZ_256M` in
/// `btrfs_ioctl_resize`): a smaller btrfs can be made, not grown.
pub const BTRFS_MIN_RESIZE: u64 = 256 << 20;
/// mkfs.btrfs puts data and metadata in one kind of block group below
/// this, as its manual recommends for small filesystems; separate ones
/// need about 109 MiB, mixed ones 16 MiB.
const BTRFS_MIXED_BELOW: u64 = 1 << 30;

/// A filesystem the driver makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsType {
    Ext4,
    Btrfs,
}

impl FsType {
    /// A capability's `fs_type`: empty means ext4; None for a type this
    /// driver does not make.
    pub fn parse(s: &str) -> Option<FsType> {
        match s {
            "" | "ext4" => Some(FsType::Ext4),
            "btrfs" => Some(FsType::Btrfs),
            _ => None,
        }
    }

    /// The name mount and blkid use.
    pub fn name(self) -> &'static str {
        match self {
            FsType::Ext4 => "ext4",
            FsType::Btrfs => "btrfs",
        }
    }
}

/// The filesystem type blkid finds on `path` (a device or an image file),
/// None when there is none.
pub fn detect(path: &Path) -> Result<Option<String>, HostError> {
    let args = [OsStr::new("-p"), OsStr::new("-o"), OsStr::new("value"), OsStr::new("-s"), OsStr::new("TYPE")];
    let cmd = format!("blkid -p -o value -s TYPE {}", path.display());
    let out = std::process::Command::new("blkid")
        .args(args)
        .arg(path)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| HostError::Spawn { cmd: cmd.clone(), source })?;
    match out.status.code() {
        Some(0) => {
            let t = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            Ok((!t.is_empty()).then_some(t))
        }
        // blkid's "nothing was found".
        Some(2) => Ok(None),
        _ => Err(HostError::Failed {
            cmd,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        }),
    }
}

/// Formats `device` as `fs` unless it has a filesystem already; the type
/// on it after (the one found, which may differ from `fs`).
pub fn format_unless_formatted(device: &Path, fs: FsType) -> Result<String, HostError> {
    if let Some(found) = detect(device)? {
        return Ok(found);
    }
    tracing::info!("formatting {} as {}", device.display(), fs.name());
    match fs {
        FsType::Ext4 => run("mkfs.ext4", &[OsStr::new("-q"), device.as_os_str()])?,
        FsType::Btrfs if loopdev::size_bytes(device)? < BTRFS_MIXED_BELOW => {
            run("mkfs.btrfs", &[OsStr::new("-q"), OsStr::new("--mixed"), device.as_os_str()])?
        }
        FsType::Btrfs => run("mkfs.btrfs", &[OsStr::new("-q"), device.as_os_str()])?,
    };
    Ok(fs.name().to_owned())
}

/// CAP_SYS_RESOURCE, which the kernel asks of whoever grows a mounted
/// ext4 (some sandboxes withhold it even from root).
const CAP_SYS_RESOURCE: u32 = 24;

/// Whether this process may grow a mounted ext4.
pub fn can_resize_online() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

/// Grows the mounted ext4 on `device` to the device's size.
pub fn resize_ext4_online(device: &Path) -> Result<(), HostError> {
    run("resize2fs", &[device.as_os_str()]).map(drop).map_err(|e| match e {
        HostError::Failed { cmd, status, stderr } if !can_resize_online() => HostError::Failed {
            cmd,
            status,
            stderr: format!(
                "{stderr} (growing a mounted ext4 needs CAP_SYS_RESOURCE, which this process lacks; \
                 the filesystem grows when the volume is next staged)"
            ),
        },
        other => other,
    })
}

/// The size of the ext4 on `device` (block count × block size).
pub fn ext4_size(device: &Path) -> Result<u64, HostError> {
    let out = run("dumpe2fs", &[OsStr::new("-h"), device.as_os_str()])?;
    let field = |name: &str| -> Option<u64> {
        out.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse().ok())
    };
    match (field("Block count:"), field("Block size:")) {
        (Some(count), Some(size)) => Ok(count.saturating_mul(size)),
        _ => Err(HostError::Failed {
            cmd: format!("dumpe2fs -h {}", device.display()),
            status: "no block count or size".into(),
            stderr: String::new(),
        }),
    }
}

/// Grows the unmounted ext4 on `device` when the device outgrew it (an
/// expansion that could not happen online), checking it first as
/// resize2fs wants.
pub fn grow_ext4_offline(device: &Path) -> Result<(), HostError> {
    if ext4_size(device)? >= loopdev::size_bytes(device)? {
        return Ok(());
    }
    tracing::info!("growing the ext4 on {} offline", device.display());
    let cmd = format!("e2fsck -f -p {}", device.display());
    let out = std::process::Command::new("e2fsck")
        .args(["-f", "-p"])
        .arg(device)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| HostError::Spawn { cmd: cmd.clone(), source })?;
    // 0: clean, 1: errors corrected; anything else needs a human.
    if !matches!(out.status.code(), Some(0 | 1)) {
        return Err(HostError::Failed {
            cmd,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    run("resize2fs", &[device.as_os_str()]).map(drop)
}

/// The devices' sizes in `btrfs filesystem show --raw` output, summed.
fn parse_btrfs_show(out: &str) -> Option<u64> {
    let mut total = None;
    for line in out.lines().map(str::trim).filter(|l| l.starts_with("devid ")) {
        let mut words = line.split_whitespace();
        words.find(|w| *w == "size")?;
        let size: u64 = words.next()?.parse().ok()?;
        total = Some(total.unwrap_or(0u64).saturating_add(size));
    }
    total
}

/// The size of the btrfs mounted at `path` (what its devices give it).
pub fn btrfs_size(path: &Path) -> Result<u64, HostError> {
    let args = [OsStr::new("filesystem"), OsStr::new("show"), OsStr::new("--raw"), path.as_os_str()];
    let out = run("btrfs", &args)?;
    parse_btrfs_show(&out).ok_or_else(|| HostError::Failed {
        cmd: format!("btrfs filesystem show --raw {}", path.display()),
        status: "no device size".into(),
        stderr: String::new(),
    })
}

/// Whether the btrfs mounted at `path` is smaller than `device`.
pub fn btrfs_outgrown(path: &Path, device: &Path) -> Result<bool, HostError> {
    Ok(btrfs_size(path)? < loopdev::size_bytes(device)?)
}

/// Grows the btrfs mounted at `path` (any mount of it, a bind mount too)
/// to its device's size; the device must be [`BTRFS_MIN_RESIZE`] or more.
pub fn resize_btrfs(path: &Path) -> Result<(), HostError> {
    let args = [OsStr::new("filesystem"), OsStr::new("resize"), OsStr::new("max"), path.as_os_str()];
    run("btrfs", &args).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fs_types() {
        assert_eq!(FsType::parse(""), Some(FsType::Ext4));
        assert_eq!(FsType::parse("ext4"), Some(FsType::Ext4));
        assert_eq!(FsType::parse("btrfs"), Some(FsType::Btrfs));
        assert_eq!(FsType::parse("xfs"), None);
        assert_eq!(FsType::parse("BTRFS"), None);
        assert_eq!(FsType::Btrfs.name(), "btrfs");
    }

    #[test]
    fn btrfs_show_sizes() {
        let one = "Label: none  uuid: c30b2093-8549-4dc5-8724-75e096f42ab7\n\
                   \tTotal devices 1 FS bytes used 36864\n\
                   \tdevid    1 size 67108864 used 10878976 path /dev/loop0\n\n";
        assert_eq!(parse_btrfs_show(one), Some(64 << 20));
        let two = "\tdevid    1 size 100 used 1 path /dev/loop0\n\tdevid    2 size 50 used 1 path /dev/loop1\n";
        assert_eq!(parse_btrfs_show(two), Some(150));
        assert_eq!(parse_btrfs_show("Label: none\n"), None);
        assert_eq!(parse_btrfs_show("\tdevid 1 size lots used 1\n"), None);
    }
}
