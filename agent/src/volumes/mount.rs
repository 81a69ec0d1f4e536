//! The few mount operations volumes need (tmpfs, bind, make-rshared,
//! unmount), and the mount table read from `/proc/self/mountinfo`.
//!
//! Everything here acts on paths under the agent's root dir, which the
//! volume manager makes; nothing else is ever mounted or unmounted.

use std::{
    ffi::CString,
    io,
    path::{Path, PathBuf},
};

use rustix::{
    io::Errno,
    mount::{MountFlags, MountPropagationFlags, UnmountFlags},
};

/// One line of mountinfo, the fields volumes care about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    pub id: u32,
    pub parent: u32,
    /// (major, minor) of the mounted filesystem.
    pub dev: (u32, u32),
    /// The directory of the filesystem that is mounted (`/loop0` for a
    /// bind mount of /dev/loop0), unescaped.
    pub root: String,
    /// The mount point, unescaped.
    pub mount_point: PathBuf,
    /// Per-mount options (`rw`, `ro`, `nosuid`, ...).
    pub options: Vec<String>,
    /// Propagation tags: `shared:N`, `master:N`, `propagate_from:N`, `unbindable`.
    pub optional: Vec<String>,
    pub fs_type: String,
    pub source: String,
    /// Per-superblock options (tmpfs `size=`, ...).
    pub super_options: Vec<String>,
}

impl MountEntry {
    pub fn shared(&self) -> bool {
        self.optional.iter().any(|o| o.starts_with("shared:"))
    }

    pub fn slave(&self) -> bool {
        self.optional.iter().any(|o| o.starts_with("master:"))
    }

    pub fn read_only(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        // Escapes above \377 are not bytes: kept as they are.
        let value = octal.map(|d| u32::from(d[0] - b'0') * 64 + u32::from(d[1] - b'0') * 8 + u32::from(d[2] - b'0'));
        if let Some(v) = value.and_then(|v| u8::try_from(v).ok()) {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses mountinfo text (proc(5)); lines that do not parse are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mut l = left.split(' ');
            let id = l.next()?.parse().ok()?;
            let parent = l.next()?.parse().ok()?;
            let (major, minor) = l.next()?.split_once(':')?;
            let dev = (major.parse().ok()?, minor.parse().ok()?);
            let root = unescape(l.next()?);
            let mount_point = PathBuf::from(unescape(l.next()?));
            let options = l.next()?.split(',').map(str::to_owned).collect();
            let optional = l.filter(|s| !s.is_empty()).map(str::to_owned).collect();
            let mut r = right.split(' ');
            let fs_type = r.next()?.to_owned();
            let source = unescape(r.next().unwrap_or(""));
            let super_options = r.next().unwrap_or("").split(',').map(str::to_owned).collect();
            Some(MountEntry { id, parent, dev, root, mount_point, options, optional, fs_type, source, super_options })
        })
        .collect()
}

/// The current mount table of this process's mount namespace.
pub fn mount_table() -> io::Result<Vec<MountEntry>> {
    Ok(parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// Mount points at or under `dir` (component-wise), deepest first: the
/// order to unmount them in.
pub fn mounts_under(table: &[MountEntry], dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> =
        table.iter().filter(|m| m.mount_point.starts_with(dir)).map(|m| m.mount_point.clone()).collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out.dedup();
    out
}

/// The mount that holds `path` (the last-mounted one with the longest
/// matching mount point).
pub fn mount_of<'a>(table: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    table
        .iter()
        .enumerate()
        .filter(|(_, m)| path.starts_with(&m.mount_point))
        .max_by_key(|(i, m)| (m.mount_point.components().count(), *i))
        .map(|(_, m)| m)
}

/// Whether `path` is itself a mount point.
pub fn is_mount_point(table: &[MountEntry], path: &Path) -> bool {
    table.iter().any(|m| m.mount_point == path)
}

/// Mounts a tmpfs at `target` (nosuid, nodev), `size` bytes when given,
/// mode 0777 for emptyDir (as the kubelet) or as asked.
pub fn mount_tmpfs(target: &Path, size: Option<u64>, mode: u32) -> io::Result<()> {
    let mut data = format!("mode={mode:o}");
    if let Some(s) = size {
        data.push_str(&format!(",size={s}"));
    }
    let data = CString::new(data)?;
    Ok(rustix::mount::mount("tmpfs", target, "tmpfs", MountFlags::NOSUID | MountFlags::NODEV, data.as_c_str())?)
}

/// Bind-mounts `source` (a path or `/proc/self/fd/N`) onto `target`.
pub fn bind(source: &Path, target: &Path, recursive: bool) -> io::Result<()> {
    if recursive {
        Ok(rustix::mount::mount_bind_recursive(source, target)?)
    } else {
        Ok(rustix::mount::mount_bind(source, target)?)
    }
}

/// `mount -o remount,bind,ro target`: a bind mount made read-only.
pub fn remount_read_only(target: &Path) -> io::Result<()> {
    use rustix::mount::{MountFlags, mount_remount};
    Ok(mount_remount(target, MountFlags::BIND | MountFlags::RDONLY, "")?)
}

/// `mount --make-rshared target`.
pub fn make_rshared(target: &Path) -> io::Result<()> {
    Ok(rustix::mount::mount_change(target, MountPropagationFlags::SHARED | MountPropagationFlags::REC)?)
}

/// Unmounts `target`; a busy mount is detached lazily so it leaves the
/// tree at once and goes when its last user does.
pub fn unmount(target: &Path) -> io::Result<()> {
    match rustix::mount::unmount(target, UnmountFlags::NOFOLLOW) {
        Err(Errno::BUSY) => Ok(rustix::mount::unmount(target, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW)?),
        other => Ok(other?),
    }
}

/// Unmounts everything at or under `dir`, deepest first. Returns what is
/// still mounted there afterwards (empty on success).
pub fn unmount_all_under(dir: &Path) -> io::Result<Vec<PathBuf>> {
    for _ in 0..3 {
        let table = mount_table()?;
        let left = mounts_under(&table, dir);
        if left.is_empty() {
            return Ok(vec![]);
        }
        for m in &left {
            if let Err(e) = unmount(m)
                && !matches!(Errno::from_io_error(&e), Some(Errno::INVAL | Errno::NOENT))
            {
                tracing::warn!("unmounting {}: {e}", m.display());
            }
        }
    }
    Ok(mounts_under(&mount_table()?, dir))
}

/// Makes `dir` a shared mount, as the kubelet does with its root dir so
/// that mounts made under it later (tmpfs volumes) reach containers that
/// asked for HostToContainer propagation: if the mount holding it is not
/// shared already, `dir` is bind-mounted on itself and made rshared.
/// Returns whether a bind mount was made.
pub fn ensure_shared(dir: &Path) -> io::Result<bool> {
    let table = mount_table()?;
    let dir = dir.canonicalize()?;
    if mount_of(&table, &dir).is_some_and(MountEntry::shared) {
        return Ok(false);
    }
    // Not recursive, as the kubelet's doMakeRShared.
    let made = if is_mount_point(&table, &dir) {
        false
    } else {
        bind(&dir, &dir, false)?;
        true
    };
    make_rshared(&dir)?;
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
90 27 254:0 /var/lib/kubelet /var/lib/kubelet rw,relatime shared:55 - ext4 /dev/vda rw
91 90 0:60 / /var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/cache rw,nosuid,nodev shared:56 - tmpfs tmpfs rw,size=1024k,mode=777
92 90 254:0 /data/with\\040space /var/lib/kubelet/pods/u1/volume-subpaths/v/c/0 ro,relatime master:55 - ext4 /dev/vda rw
93 90 0:61 / /var/lib/kubelet/pods/u10/volumes/kubernetes.io~secret/s rw shared:57 - tmpfs tmpfs rw
";

    #[test]
    fn parses_mountinfo_with_optional_fields_and_escapes() {
        let t = parse_mountinfo(SAMPLE);
        assert_eq!(t.len(), 6);
        assert!(t[2].shared() && !t[2].slave());
        assert_eq!(t[3].fs_type, "tmpfs");
        assert!(t[3].super_options.contains(&"size=1024k".to_string()));
        assert!(t[4].read_only() && t[4].slave());
        assert_eq!(t[4].mount_point, Path::new("/var/lib/kubelet/pods/u1/volume-subpaths/v/c/0"));
        assert_eq!(parse_mountinfo("91 90 0:60 / /a\\040b rw - tmpfs tmpfs rw")[0].mount_point, Path::new("/a b"));
        // An escape at the end, and one that is no byte, do not panic.
        assert_eq!(unescape("/a\\040"), "/a ");
        assert_eq!(unescape("/a\\777b"), "/a\\777b");
        assert_eq!(unescape("a\\040b\\134c\\011"), "a b\\c\t");
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
        assert_eq!(unescape("\\999"), "\\999");
    }

    #[test]
    fn mounts_under_a_pod_dir_deepest_first_and_not_its_neighbours() {
        let t = parse_mountinfo(SAMPLE);
        let got = mounts_under(&t, Path::new("/var/lib/kubelet/pods/u1"));
        assert_eq!(
            got,
            vec![
                PathBuf::from("/var/lib/kubelet/pods/u1/volume-subpaths/v/c/0"),
                PathBuf::from("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/cache"),
            ]
        );
        assert!(mounts_under(&t, Path::new("/var/lib/kubelet/pods/u")).is_empty());
    }

    #[test]
    fn finds_the_mount_holding_a_path() {
        let t = parse_mountinfo(SAMPLE);
        assert_eq!(mount_of(&t, Path::new("/var/lib/kubelet/pods/u2")).unwrap().id, 90);
        assert_eq!(mount_of(&t, Path::new("/etc")).unwrap().id, 27);
        assert!(is_mount_point(&t, Path::new("/var/lib/kubelet")));
        assert!(!is_mount_point(&t, Path::new("/var/lib")));
    }
}
