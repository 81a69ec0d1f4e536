//! The registration directory as it is on disk: every unix socket under it
//! and its subdirectories, names starting with `.` left out, each with
//! what tells one socket file from another made at the same path.

use std::{
    collections::BTreeMap,
    fs, io,
    os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
};

/// Which file a socket path holds. A driver that restarts removes its
/// socket and binds it again: the new file has another inode, or at least
/// another change time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stamp {
    pub dev: u64,
    pub ino: u64,
    pub ctime_ns: i128,
}

impl Stamp {
    fn of(m: &fs::Metadata) -> Stamp {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        }
    }
}

/// One pass over the directory.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan {
    pub sockets: BTreeMap<PathBuf, Stamp>,
    /// The directory and every subdirectory walked (to watch).
    pub dirs: Vec<PathBuf>,
}

/// How deep subdirectories are walked (the kubelet walks them all; a
/// bound keeps a runaway tree from costing every second).
const MAX_DEPTH: usize = 8;

/// Creates `dir` with mode 0750 if it does not exist.
pub fn ensure_dir(dir: &Path) -> io::Result<()> {
    match fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(io::Error::other(format!("{} exists and is not a directory", dir.display()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::DirBuilder::new().recursive(true).mode(0o750).create(dir)?;
            // The umask may have taken bits off; the mode is the kubelet's.
            fs::set_permissions(dir, fs::Permissions::from_mode(0o750))
        }
        Err(e) => Err(e),
    }
}

fn hidden(name: &std::ffi::OsStr) -> bool {
    name.as_encoded_bytes().first() == Some(&b'.')
}

/// Walks `root` (not following symlinks). An unreadable subdirectory is
/// skipped; an unreadable root is an error.
pub fn scan(root: &Path) -> io::Result<Scan> {
    let mut out = Scan::default();
    let mut stack = vec![(root.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if depth == 0 => return Err(e),
            Err(_) => continue,
        };
        out.dirs.push(dir.clone());
        for entry in entries.flatten() {
            if hidden(&entry.file_name()) {
                continue;
            }
            let Ok(kind) = entry.file_type() else { continue };
            if kind.is_dir() && depth < MAX_DEPTH {
                stack.push((entry.path(), depth + 1));
            } else if kind.is_socket()
                && let Ok(m) = entry.metadata()
            {
                out.sockets.insert(entry.path(), Stamp::of(&m));
            }
        }
    }
    out.dirs.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::*;

    #[test]
    fn sockets_in_the_tree_count_and_dot_names_and_plain_files_do_not() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("plugins_registry");
        ensure_dir(&root).unwrap();
        assert_eq!(fs::metadata(&root).unwrap().permissions().mode() & 0o777, 0o750);
        let _a = UnixListener::bind(root.join("a.sock")).unwrap();
        fs::create_dir(root.join("sub")).unwrap();
        let _b = UnixListener::bind(root.join("sub/b.sock")).unwrap();
        let _hidden = UnixListener::bind(root.join(".hidden.sock")).unwrap();
        fs::create_dir(root.join(".dotdir")).unwrap();
        let _in_hidden = UnixListener::bind(root.join(".dotdir/c.sock")).unwrap();
        fs::write(root.join("plain"), "not a socket").unwrap();

        let s = scan(&root).unwrap();
        let names: Vec<_> = s.sockets.keys().map(|p| p.strip_prefix(&root).unwrap().to_path_buf()).collect();
        assert_eq!(names, [PathBuf::from("a.sock"), PathBuf::from("sub/b.sock")]);
        assert_eq!(s.dirs, [root.clone(), root.join("sub")]);

        // A socket made again at the same path is another file.
        let before = s.sockets[&root.join("a.sock")];
        drop(_a);
        fs::remove_file(root.join("a.sock")).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let _a2 = UnixListener::bind(root.join("a.sock")).unwrap();
        let after = scan(&root).unwrap().sockets[&root.join("a.sock")];
        assert_ne!(before, after);
        // An existing directory is left as it is; a missing root is an error.
        ensure_dir(&root).unwrap();
        assert!(scan(&tmp.path().join("missing")).is_err());
        assert!(ensure_dir(&root.join("plain")).is_err());
    }
}
