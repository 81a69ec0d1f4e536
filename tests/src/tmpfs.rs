//! A tmpfs a test mounts for itself (a small disk with a size and an inode
//! limit), unmounted with everything under it on drop.

use std::{ffi::CString, path::Path};

pub struct SmallFs {
    dir: tempfile::TempDir,
}

impl SmallFs {
    pub fn mount(size: u64, inodes: u64) -> SmallFs {
        crate::prereq::require_root();
        let dir = tempfile::Builder::new().prefix("swiftlet-nodefs-").tempdir().expect("temp dir");
        let target = CString::new(dir.path().to_str().unwrap()).unwrap();
        let opts = CString::new(format!("size={size},nr_inodes={inodes},mode=0755")).unwrap();
        // SAFETY: mounting a fresh tmpfs on our own temporary directory.
        let rc = unsafe { libc::mount(c"tmpfs".as_ptr(), target.as_ptr(), c"tmpfs".as_ptr(), 0, opts.as_ptr().cast()) };
        assert_eq!(rc, 0, "mount tmpfs on {}: {}", dir.path().display(), std::io::Error::last_os_error());
        SmallFs { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// (available bytes, total bytes, free inodes)
    pub fn stat(&self) -> (u64, u64, u64) {
        let s = swiftlet::signals::node::statfs(self.path()).expect("statfs");
        (s.available_bytes, s.capacity_bytes, s.inodes_free)
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        crate::agent::unmount_under(self.path());
        let target = CString::new(self.path().to_str().unwrap()).unwrap();
        // SAFETY: unmounting the tmpfs this guard mounted (EINVAL: already
        // unmounted with what was under it).
        if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0
            && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL)
        {
            eprintln!("warning: cannot unmount {}: {}", self.path().display(), std::io::Error::last_os_error());
        }
    }
}
