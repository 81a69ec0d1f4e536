//! The mount table (/proc/self/mountinfo), and mount and umount.

use std::{
    ffi::OsStr,
    os::unix::fs::{FileTypeExt, MetadataExt},
    path::Path,
};

use super::{HostError, run};

/// One line of mountinfo, as the agent reads it.
pub use swiftlet::volumes::mount::{MountEntry, parse_mountinfo as parse};

/// This process's mount table.
pub fn table() -> Vec<MountEntry> {
    parse(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
}

/// The topmost mount on `path`, if something is mounted there.
pub fn mounted_at(path: &Path) -> Option<MountEntry> {
    let path = std::fs::canonicalize(path).ok()?;
    table().into_iter().rev().find(|m| m.mount_point == path)
}

/// (major, minor) of a device node, None for anything else.
pub fn device_node(path: &Path) -> Option<(u32, u32)> {
    let meta = std::fs::metadata(path).ok()?;
    meta.file_type().is_block_device().then(|| (rustix::fs::major(meta.rdev()), rustix::fs::minor(meta.rdev())))
}

/// Whether `m` mounts the block device `dev`: its filesystem (an ext4
/// mount carries the device's numbers, a btrfs one an anonymous device,
/// so the source device is asked too), or the device node itself
/// bind-mounted onto a file (a block volume).
pub fn is_of(m: &MountEntry, dev: (u32, u32)) -> bool {
    m.dev == dev
        || (m.source.starts_with("/dev/") && device_node(Path::new(&m.source)) == Some(dev))
        || device_node(&m.mount_point) == Some(dev)
}

/// The mounts of the block device `dev` (see [`MountEntry::is_of`]).
pub fn of_device(table: &[MountEntry], dev: (u32, u32)) -> Vec<MountEntry> {
    table.iter().filter(|m| is_of(m, dev)).cloned().collect()
}

/// `mount [-t fs_type] [-o options] source target`.
pub fn mount(source: &Path, target: &Path, fs_type: Option<&str>, options: &[String]) -> Result<(), HostError> {
    let opts = options.join(",");
    let mut args: Vec<&OsStr> = Vec::new();
    if let Some(t) = fs_type {
        args.extend([OsStr::new("-t"), OsStr::new(t)]);
    }
    if !opts.is_empty() {
        args.extend([OsStr::new("-o"), OsStr::new(&opts)]);
    }
    args.extend([source.as_os_str(), target.as_os_str()]);
    run("mount", &args).map(drop)
}

/// Bind-mounts `source` on `target`, then makes it read-only and applies
/// `flags` when asked (a bind mount takes them only on a remount).
pub fn bind(source: &Path, target: &Path, read_only: bool, flags: &[String]) -> Result<(), HostError> {
    run("mount", &[OsStr::new("--bind"), source.as_os_str(), target.as_os_str()])?;
    if read_only || !flags.is_empty() {
        let mut opts = vec!["remount".to_owned(), "bind".to_owned()];
        if read_only {
            opts.push("ro".into());
        }
        opts.extend(flags.iter().cloned());
        if let Err(e) = run("mount", &[OsStr::new("-o"), OsStr::new(&opts.join(",")), target.as_os_str()]) {
            // Not half done: a writable mount where read-only was asked.
            let _ = unmount(target);
            return Err(e);
        }
    }
    Ok(())
}

/// Unmounts everything stacked on `path`; nothing mounted is fine.
pub fn unmount(path: &Path) -> Result<(), HostError> {
    for _ in 0..16 {
        if mounted_at(path).is_none() {
            return Ok(());
        }
        run("umount", &[path.as_os_str()])?;
    }
    Err(HostError::Failed {
        cmd: format!("umount {}", path.display()),
        status: "still mounted".into(),
        stderr: String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,mode=755
90 27 7:0 / /tmp/x/staging\\040dir rw,relatime shared:5 - ext4 /dev/loop0 rw
91 27 7:0 / /tmp/x/target ro,relatime - ext4 /dev/loop0 rw
92 27 0:6 /loop1 /tmp/x/block rw - devtmpfs devtmpfs rw
bogus line
";

    #[test]
    fn parses_mountinfo() {
        let t = parse(SAMPLE);
        assert_eq!(t.len(), 5);
        let s = &t[2];
        assert_eq!(s.id, 90);
        assert_eq!(s.dev, (7, 0));
        assert_eq!(s.mount_point, std::path::PathBuf::from("/tmp/x/staging dir"));
        assert_eq!((s.fs_type.as_str(), s.source.as_str()), ("ext4", "/dev/loop0"));
        assert!(!s.read_only());
        assert!(t[3].read_only());
        assert_eq!(t[4].root, "/loop1");
        let on_loop0: Vec<u32> = of_device(&t, (7, 0)).iter().map(|m| m.id).collect();
        assert_eq!(on_loop0, [90, 91]);
    }
}
