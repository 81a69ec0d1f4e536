//! One cgroup directory, opened once.
//!
//! The stats pass reads five or six files in each of hundreds of cgroups
//! every housekeeping interval. Opening each by its full path walks every
//! component of the path (kernfs revalidates each) every time; opening the
//! directory once and the files relative to it walks it once. A single
//! read goes by full path ([`CgroupDir::at`]), one open fewer.

use std::{
    fs::File,
    io::{self, Read},
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
};

use rustix::fs::{CWD, Mode, OFlags};

use super::{CgroupError, Result};

#[derive(Debug)]
pub struct CgroupDir {
    /// The open directory; None for a single read by full path, where
    /// opening the directory first would only add a syscall.
    fd: Option<OwnedFd>,
    path: PathBuf,
}

impl CgroupDir {
    pub fn open(path: &Path) -> Result<CgroupDir> {
        let fd = open_at(CWD, path, OFlags::PATH | OFlags::DIRECTORY).map_err(|e| CgroupError::io(path, e))?;
        Ok(CgroupDir { fd: Some(fd), path: path.to_owned() })
    }

    /// The directory by path, not opened: each read opens its file by full
    /// path, as for one read.
    pub fn at(path: PathBuf) -> CgroupDir {
        CgroupDir { fd: None, path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The contents of the file `name` in this directory.
    pub fn read(&self, name: &str) -> Result<String> {
        match &self.fd {
            Some(fd) => open_at(fd.as_fd(), Path::new(name), OFlags::RDONLY),
            None => open_at(CWD, &self.path.join(name), OFlags::RDONLY),
        }
        .map(File::from)
        .and_then(read_whole)
        .map_err(|e| CgroupError::io(&self.path.join(name), e))
    }

    /// A file holding one number, or `max` (read as u64::MAX).
    pub fn read_u64(&self, name: &str) -> Result<u64> {
        let text = self.read(name)?;
        let t = text.trim();
        if t == "max" {
            return Ok(u64::MAX);
        }
        t.parse().map_err(|_| CgroupError::Parse { path: self.path.join(name), value: t.to_owned() })
    }
}

/// The stack buffer a cgroup file is read into. kernfs formats the whole
/// file at the first read, and the largest the stats pass reads (v2's
/// memory.stat) is about 2 KiB, so one call takes it. Reading into an
/// empty string would probe with 32 bytes and then double, a system call
/// and a reallocation each time; reading into a page-sized heap buffer
/// would be a large request each time, which makes glibc consolidate its
/// free lists on every read. The text is then copied out at its size,
/// mostly a few bytes.
const READ_BUFFER: usize = 4096;

/// The whole contents of an open cgroup file.
pub(super) fn read_whole(mut file: File) -> io::Result<String> {
    let mut buf = [0u8; READ_BUFFER];
    let mut len = 0;
    loop {
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => {
                len += n;
                if len == buf.len() {
                    // Larger than the buffer: the rest on the heap.
                    let mut bytes = buf.to_vec();
                    file.read_to_end(&mut bytes)?;
                    return String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    String::from_utf8(buf[..len].to_vec()).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

fn open_at(dir: BorrowedFd<'_>, path: &Path, flags: OFlags) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(dir, path, flags | OFlags::CLOEXEC, Mode::empty())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_files_relative_to_the_directory_and_names_them_in_errors() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("memory.max"), "max\n").unwrap();
        std::fs::write(tmp.path().join("memory.current"), "4096\n").unwrap();
        std::fs::write(tmp.path().join("bad"), "12k\n").unwrap();
        for dir in [CgroupDir::open(tmp.path()).unwrap(), CgroupDir::at(tmp.path().to_owned())] {
            assert_eq!(dir.read_u64("memory.max").unwrap(), u64::MAX);
            assert_eq!(dir.read_u64("memory.current").unwrap(), 4096);
            let e = dir.read_u64("bad").unwrap_err().to_string();
            assert!(e.contains("bad") && e.contains("12k"), "{e}");
            // Files as long as the read buffer, or longer, come whole.
            for (name, len) in [("full", READ_BUFFER), ("big", READ_BUFFER * 2 + 7)] {
                let text = "x".repeat(len);
                std::fs::write(tmp.path().join(name), &text).unwrap();
                assert_eq!(dir.read(name).unwrap(), text, "{name}");
            }
            let e = dir.read("missing").unwrap_err();
            assert!(e.is_not_found() && e.to_string().contains("missing"), "{e}");
        }
        assert!(CgroupDir::open(&tmp.path().join("gone")).unwrap_err().is_not_found());
    }
}
