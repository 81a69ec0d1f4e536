//! Opening container log files without following a symlink a pod planted.
//!
//! A pod that can write under the pod log directory (a log shipper with a
//! hostPath to /var/log) could replace `0.log` with a symlink to
//! /etc/shadow, and the agent, reading as root, would serve that file to
//! `kubectl logs`, or compress it. So log files are opened:
//! - below `podLogsDir` with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
//!   from the directory itself: no symlink anywhere in the path below it;
//! - elsewhere (a runtime's own log path), and on kernels without openat2,
//!   with O_NOFOLLOW: no symlink as the file itself;
//!
//! and then refused unless the file is a regular file owned by root or the
//! agent (the runtime writes them as root).

use std::{fs::File, io, os::unix::fs::MetadataExt, path::Path};

use rustix::{
    fs::{Mode, OFlags, ResolveFlags},
    io::Errno,
};

/// Opens the log file at `path` for reading; `logs_dir` is podLogsDir.
pub fn open_log(path: &Path, logs_dir: &Path) -> io::Result<File> {
    let f = match path.strip_prefix(logs_dir) {
        Ok(rel) if !rel.as_os_str().is_empty() => match open_beneath(logs_dir, rel) {
            Err(Errno::NOSYS) => open_nofollow(path)?,
            other => other?,
        },
        _ => open_nofollow(path)?,
    };
    check_owner(&f, path)?;
    Ok(f)
}

/// How a log file is opened: read-only, never as the controlling
/// terminal, not through a symlink as the file itself.
const LOG_FLAGS: OFlags = OFlags::RDONLY.union(OFlags::CLOEXEC).union(OFlags::NOFOLLOW).union(OFlags::NOCTTY);

pub(super) fn open_nofollow(path: &Path) -> io::Result<File> {
    Ok(rustix::fs::open(path, LOG_FLAGS, Mode::empty())?.into())
}

fn open_beneath(dir: &Path, rel: &Path) -> Result<File, Errno> {
    let root = rustix::fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    Ok(rustix::fs::openat2(&root, rel, LOG_FLAGS, Mode::empty(), resolve)?.into())
}

/// A regular file owned by root or by the agent.
pub fn check_owner(f: &File, path: &Path) -> io::Result<()> {
    let m = f.metadata()?;
    if !m.file_type().is_file() {
        return Err(io::Error::other(format!("{} is not a regular file", path.display())));
    }
    let me = rustix::process::geteuid().as_raw();
    if m.uid() != 0 && m.uid() != me {
        return Err(io::Error::other(format!(
            "{} is owned by uid {}, not by root: not read as a container log",
            path.display(),
            m.uid()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planted_symlinks_are_refused() {
        let logs = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("shadow");
        std::fs::write(&secret, "root:secret\n").unwrap();
        let dir = logs.path().join("ns_pod_uid").join("app");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("0.log"), "real\n").unwrap();
        assert!(open_log(&dir.join("0.log"), logs.path()).is_ok());
        // The log itself a symlink.
        std::os::unix::fs::symlink(&secret, dir.join("1.log")).unwrap();
        assert!(open_log(&dir.join("1.log"), logs.path()).is_err());
        // A directory on the way a symlink.
        std::fs::write(outside.path().join("0.log"), "root:secret\n").unwrap();
        std::os::unix::fs::symlink(outside.path(), logs.path().join("ns_pod_uid").join("evil")).unwrap();
        assert!(open_log(&logs.path().join("ns_pod_uid/evil/0.log"), logs.path()).is_err());
        // Outside podLogsDir, the last component still may not be a link.
        assert!(open_log(&dir.join("1.log"), Path::new("/nonexistent")).is_err());
        // Not owned by root.
        let foreign = dir.join("2.log");
        std::fs::write(&foreign, "x\n").unwrap();
        if rustix::process::geteuid().is_root() {
            std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
            let e = open_log(&foreign, logs.path()).unwrap_err();
            assert!(e.to_string().contains("owned by uid 65534"), "{e}");
        }
    }
}
