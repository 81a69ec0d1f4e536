//! subPath mounts, made safe as the kubelet makes them: the path inside
//! the volume is resolved, checked to stay inside the volume, opened
//! component by component without following links (so a link swapped in
//! meanwhile is refused), and that open file is bind-mounted to
//! `<pod>/volume-subpaths/<volume>/<container>/<index>`, which the runtime
//! then mounts into the container. A path that does not exist yet is
//! created as a directory, the same safe way.
//!
//! Because the bind mount pins what the path resolved to, a subPath of a
//! configMap or secret volume keeps the content it had when the container
//! started (as with the kubelet).

use std::{
    fs, io,
    os::{
        fd::{AsRawFd, OwnedFd},
        unix::fs::PermissionsExt,
    },
    path::{Component, Path, PathBuf},
};

use rustix::{
    fs::{CWD, FileType, Mode, OFlags},
    io::Errno,
};

use super::mount;

/// Opens `name` relative to `dir` (or the working directory), close-on-exec.
fn open_at(dir: Option<&OwnedFd>, name: &std::ffi::OsStr, flags: OFlags) -> io::Result<OwnedFd> {
    let flags = flags | OFlags::CLOEXEC;
    Ok(match dir {
        Some(dir) => rustix::fs::openat(dir, name, flags, Mode::empty())?,
        None => rustix::fs::openat(CWD, name, flags, Mode::empty())?,
    })
}

/// Opens `path` (absolute, already resolved) one component at a time with
/// O_NOFOLLOW: a link anywhere on the way fails (ELOOP / ENOTDIR).
fn safe_open(path: &Path) -> io::Result<OwnedFd> {
    let mut fd = open_at(None, std::ffi::OsStr::new("/"), OFlags::PATH | OFlags::DIRECTORY)?;
    for c in path.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(name) => {
                fd = open_at(Some(&fd), name, OFlags::PATH | OFlags::NOFOLLOW)?;
                // O_PATH|O_NOFOLLOW opens a final link itself rather than
                // failing: refuse it here.
                if is_symlink(&fd)? {
                    return Err(Errno::LOOP.into());
                }
            }
            _ => {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not resolved", path.display())));
            }
        }
    }
    Ok(fd)
}

/// Whether the open file is a symbolic link (O_PATH descriptors accept
/// fstat).
fn is_symlink(fd: &OwnedFd) -> io::Result<bool> {
    Ok(FileType::from_raw_mode(rustix::fs::fstat(fd)?.st_mode) == FileType::Symlink)
}

/// Creates the missing directories of `rel` under `base` (resolved) without
/// following links, each with `mode`.
fn safe_mkdir(base: &Path, rel: &Path, mode: u32) -> io::Result<()> {
    let mut fd = safe_open(base)?;
    for c in rel.components() {
        let Component::Normal(name) = c else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "subPath must be a relative path without '..'"));
        };
        let dir_flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::DIRECTORY;
        match open_at(Some(&fd), name, dir_flags) {
            Ok(next) => fd = next,
            Err(e) if e.raw_os_error() == Some(Errno::NOENT.raw_os_error()) => {
                match rustix::fs::mkdirat(&fd, name, Mode::from_raw_mode(mode)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                fd = open_at(Some(&fd), name, dir_flags)?;
                // mkdirat is subject to the umask; the kubelet sets the mode.
                let path = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
                let _ = fs::set_permissions(path, fs::Permissions::from_mode(mode));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Makes the subPath mount for one volumeMount; returns the host path to
/// give the runtime. Reuses an existing bind mount at `target` (a container
/// restart).
pub fn prepare(volume_root: &Path, sub_path: &str, target: &Path) -> Result<PathBuf, String> {
    let table = mount::mount_table().map_err(|e| format!("reading the mount table: {e}"))?;
    if mount::is_mount_point(&table, target) {
        return Ok(target.to_owned());
    }
    let rel = Path::new(sub_path);
    if rel.is_absolute() || rel.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(format!("subPath {sub_path:?} must be a relative path without '..'"));
    }
    let root = volume_root
        .canonicalize()
        .map_err(|e| format!("volume path {} is not accessible: {e}", volume_root.display()))?;
    let full = root.join(rel);
    if fs::symlink_metadata(&full).is_err() {
        let mode = fs::metadata(&root).map(|m| m.permissions().mode() & 0o7777).unwrap_or(0o755);
        safe_mkdir(&root, rel, mode).map_err(|e| format!("failed to create subPath directory {sub_path:?}: {e}"))?;
    }
    let resolved = full.canonicalize().map_err(|e| format!("subPath {sub_path:?}: {e}"))?;
    if !resolved.starts_with(&root) {
        return Err(format!("subpath {:?} not within volume path {:?}", resolved.display(), root.display()));
    }
    let fd =
        safe_open(&resolved).map_err(|e| format!("subPath {sub_path:?}: cannot open {}: {e}", resolved.display()))?;
    let is_dir = fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd())).map(|m| m.is_dir()).unwrap_or(false);
    let io_err = |e: io::Error| format!("preparing the subPath mount point {}: {e}", target.display());
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent).map_err(io_err)?;
    }
    if is_dir {
        match fs::create_dir(target) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(io_err(e)),
            _ => {}
        }
    } else {
        fs::OpenOptions::new().create(true).append(true).open(target).map_err(io_err)?;
    }
    let source = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    mount::bind(&source, target, false).map_err(|e| format!("bind-mounting subPath {sub_path:?}: {e}"))?;
    drop(fd);
    Ok(target.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_open_refuses_links_and_safe_mkdir_creates_with_the_mode() {
        let d = tempfile::tempdir().unwrap();
        let base = d.path().canonicalize().unwrap();
        safe_mkdir(&base, Path::new("x/y"), 0o750).unwrap();
        assert_eq!(fs::metadata(base.join("x/y")).unwrap().permissions().mode() & 0o777, 0o750);
        assert!(safe_open(&base.join("x/y")).is_ok());
        std::os::unix::fs::symlink("/etc", base.join("link")).unwrap();
        assert!(safe_open(&base.join("link")).is_err(), "a link on the way is refused");
        assert!(safe_mkdir(&base, Path::new("link/z"), 0o755).is_err(), "no directory is made through a link");
        assert!(!Path::new("/etc/z").exists());
    }

    #[test]
    fn escapes_are_refused_before_any_mount() {
        let d = tempfile::tempdir().unwrap();
        let vol = d.path().join("vol");
        fs::create_dir(&vol).unwrap();
        std::os::unix::fs::symlink("/etc", vol.join("out")).unwrap();
        let target = d.path().join("t");
        let e = prepare(&vol, "out", &target).unwrap_err();
        assert!(e.contains("not within volume path"), "{e}");
        let e = prepare(&vol, "../x", &target).unwrap_err();
        assert!(e.contains("without '..'"), "{e}");
        assert!(!target.exists());
    }
}
