//! fsGroup ownership, as the kubelet's SetVolumeOwnership gives it to
//! emptyDir, configMap, secret, downwardAPI and projected volumes: every
//! file and directory's group becomes the pod's fsGroup, files become
//! group-readable (and group-writable unless the volume is read-only:
//! `0660` or `0440` added), directories also group-searchable with the
//! setgid bit so what the pod creates stays in the group; symlinks keep
//! their mode. `OnRootMismatch` skips the walk when the volume's root
//! already has the group and mode (upstream only passes a policy for
//! persistent volume types, so the volumes here are always walked).

use std::{
    fs, io,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::Path,
};

const RW_MASK: u32 = 0o660;
const RO_MASK: u32 = 0o440;
const EXEC_MASK: u32 = 0o110;
const SETGID: u32 = 0o2000;

/// The mode a file or directory gets (changeFilePermission).
pub fn mode_for(current: u32, is_dir: bool, read_only: bool) -> u32 {
    let mut mask = if read_only { RO_MASK } else { RW_MASK };
    if is_dir {
        mask |= SETGID | EXEC_MASK;
    }
    (current & 0o7777) | mask
}

/// Whether the walk can be skipped (OnRootMismatch with a root that
/// already has the group, the setgid bit and the mode).
pub fn root_matches(gid: u32, mode: u32, fs_group: u32, read_only: bool) -> bool {
    let mask = if read_only { RO_MASK } else { RW_MASK };
    gid == fs_group && mode & SETGID != 0 && mode & mask == mask && mode & EXEC_MASK == EXEC_MASK
}

fn change(path: &Path, fs_group: u32, read_only: bool) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    std::os::unix::fs::lchown(path, None, Some(fs_group))?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let mode = mode_for(meta.permissions().mode(), meta.is_dir(), read_only);
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    if meta.is_dir() {
        for e in fs::read_dir(path)? {
            change(&e?.path(), fs_group, read_only)?;
        }
    }
    Ok(())
}

/// Gives `dir` (a volume's root) and everything under it to `fs_group`;
/// false when `policy` is OnRootMismatch and nothing needed changing.
pub fn set_ownership(dir: &Path, fs_group: u32, read_only: bool, policy: Option<&str>) -> io::Result<bool> {
    if policy == Some("OnRootMismatch") {
        let m = fs::metadata(dir)?;
        if root_matches(m.gid(), m.mode(), fs_group, read_only) {
            return Ok(false);
        }
    }
    change(dir, fs_group, read_only)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(mode_for(0o644, false, false), 0o664);
        assert_eq!(mode_for(0o644, false, true), 0o644);
        assert_eq!(mode_for(0o600, false, true), 0o640);
        assert_eq!(mode_for(0o777, true, false), 0o2777);
        assert_eq!(mode_for(0o755, true, true), 0o2755);
        assert_eq!(mode_for(0o700, true, false), 0o2770);
        assert!(root_matches(2000, 0o2775, 2000, false));
        assert!(!root_matches(0, 0o2775, 2000, false), "another group");
        assert!(!root_matches(2000, 0o775, 2000, false), "no setgid");
    }

    #[test]
    fn walks_the_volume() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir(root.join("sub")).unwrap();
        fs::write(root.join("sub/f"), "x").unwrap();
        fs::set_permissions(root.join("sub/f"), fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink("sub/f", root.join("link")).unwrap();
        // The test runs as root (the integration suite needs it); as
        // another user only its own groups could be given.
        let gid = rustix::process::getegid().as_raw();
        assert!(set_ownership(root, gid, false, None).unwrap());
        let f = fs::metadata(root.join("sub/f")).unwrap();
        assert_eq!((f.gid(), f.mode() & 0o7777), (gid, 0o660));
        assert_eq!(fs::metadata(root.join("sub")).unwrap().mode() & 0o2000, 0o2000);
        assert!(!set_ownership(root, gid, false, Some("OnRootMismatch")).unwrap(), "already right");
    }
}
