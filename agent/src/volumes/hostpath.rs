//! hostPath volumes: the `type` check (and creation for the `OrCreate`
//! types) the kubelet makes before a pod's containers start, with its
//! messages. The volume is the host path itself: nothing is mounted on the
//! node, the runtime bind-mounts it into the containers.

use std::{
    fs, io,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::Path,
};

/// What is at a path (following links, as the kubelet's `os.Stat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    Directory,
    File,
    Socket,
    CharDevice,
    BlockDevice,
    Other,
}

/// What to do about a path before mounting it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    Ok,
    CreateDirectory,
    CreateFile,
    Fail(String),
}

/// The kubelet's `checkTypeInternal`: `found` is what is at `path`
/// (None: nothing).
pub fn check(path: &str, host_path_type: Option<&str>, found: Option<FileKind>) -> Check {
    let is = |k: FileKind| found == Some(k);
    let fail = |what: &str| Check::Fail(format!("hostPath type check failed: {path} is not {what}"));
    match host_path_type.unwrap_or("") {
        "" => Check::Ok,
        "DirectoryOrCreate" if found.is_none() => Check::CreateDirectory,
        "DirectoryOrCreate" | "Directory" if is(FileKind::Directory) => Check::Ok,
        "DirectoryOrCreate" | "Directory" => fail("a directory"),
        "FileOrCreate" if found.is_none() => Check::CreateFile,
        "FileOrCreate" | "File" if is(FileKind::File) => Check::Ok,
        "FileOrCreate" | "File" => fail("a file"),
        "Socket" if is(FileKind::Socket) => Check::Ok,
        "Socket" => fail("a socket file"),
        "CharDevice" if is(FileKind::CharDevice) => Check::Ok,
        "CharDevice" => fail("a character device"),
        "BlockDevice" if is(FileKind::BlockDevice) => Check::Ok,
        "BlockDevice" => fail("a block device"),
        other => Check::Fail(format!("{other} is an invalid volume type")),
    }
}

pub fn kind_of(path: &Path) -> Option<FileKind> {
    let ft = fs::metadata(path).ok()?.file_type();
    Some(if ft.is_dir() {
        FileKind::Directory
    } else if ft.is_file() {
        FileKind::File
    } else if ft.is_socket() {
        FileKind::Socket
    } else if ft.is_char_device() {
        FileKind::CharDevice
    } else if ft.is_block_device() {
        FileKind::BlockDevice
    } else {
        FileKind::Other
    })
}

/// Checks (and creates) the path; the error is the message for the pod.
pub fn prepare(path: &str, host_path_type: Option<&str>) -> Result<(), String> {
    let p = Path::new(path);
    let io_err = |e: io::Error| format!("hostPath {path}: {e}");
    match check(path, host_path_type, kind_of(p)) {
        Check::Ok => Ok(()),
        Check::Fail(m) => Err(m),
        // As the kubelet: 0755 directories (parents too), 0644 files (the
        // parent must exist).
        Check::CreateDirectory => {
            fs::create_dir_all(p).map_err(io_err)?;
            fs::set_permissions(p, fs::Permissions::from_mode(0o755)).map_err(io_err)
        }
        Check::CreateFile => {
            fs::OpenOptions::new().create(true).append(true).open(p).map_err(io_err)?;
            fs::set_permissions(p, fs::Permissions::from_mode(0o644)).map_err(io_err)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_against_every_kind() {
        use FileKind::*;
        let ok = Check::Ok;
        let cases: &[(Option<&str>, Option<FileKind>, Check)] = &[
            (None, None, ok.clone()),
            (Some(""), Some(Socket), ok.clone()),
            (Some("DirectoryOrCreate"), None, Check::CreateDirectory),
            (Some("DirectoryOrCreate"), Some(Directory), ok.clone()),
            (
                Some("DirectoryOrCreate"),
                Some(File),
                Check::Fail("hostPath type check failed: /p is not a directory".into()),
            ),
            (Some("Directory"), None, Check::Fail("hostPath type check failed: /p is not a directory".into())),
            (Some("Directory"), Some(Directory), ok.clone()),
            (Some("FileOrCreate"), None, Check::CreateFile),
            (Some("FileOrCreate"), Some(File), ok.clone()),
            (Some("FileOrCreate"), Some(Directory), Check::Fail("hostPath type check failed: /p is not a file".into())),
            (Some("File"), Some(CharDevice), Check::Fail("hostPath type check failed: /p is not a file".into())),
            (Some("File"), Some(File), ok.clone()),
            (Some("Socket"), Some(Socket), ok.clone()),
            (Some("Socket"), Some(File), Check::Fail("hostPath type check failed: /p is not a socket file".into())),
            (Some("CharDevice"), Some(CharDevice), ok.clone()),
            (
                Some("CharDevice"),
                Some(BlockDevice),
                Check::Fail("hostPath type check failed: /p is not a character device".into()),
            ),
            (Some("BlockDevice"), Some(BlockDevice), ok.clone()),
            (Some("BlockDevice"), None, Check::Fail("hostPath type check failed: /p is not a block device".into())),
            (Some("Pipe"), Some(File), Check::Fail("Pipe is an invalid volume type".into())),
        ];
        for (t, found, want) in cases {
            assert_eq!(&check("/p", *t, *found), want, "{t:?} {found:?}");
        }
    }

    #[test]
    fn creates_and_recognizes_real_files() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("a/b");
        prepare(dir.to_str().unwrap(), Some("DirectoryOrCreate")).unwrap();
        assert_eq!(kind_of(&dir), Some(FileKind::Directory));
        let file = dir.join("f");
        prepare(file.to_str().unwrap(), Some("FileOrCreate")).unwrap();
        assert_eq!(kind_of(&file), Some(FileKind::File));
        assert_eq!(fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o644);
        assert!(prepare(d.path().join("missing/f").to_str().unwrap(), Some("FileOrCreate")).is_err());
        assert_eq!(kind_of(Path::new("/dev/null")), Some(FileKind::CharDevice));
        let e = prepare(file.to_str().unwrap(), Some("Directory")).unwrap_err();
        assert!(e.ends_with("is not a directory"), "{e}");
    }
}
