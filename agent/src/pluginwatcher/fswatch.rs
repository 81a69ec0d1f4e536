//! inotify on the registration directory and its subdirectories, so a
//! socket made or removed is seen at once rather than at the next rescan.
//! The events only wake the watcher: what changed is read by rescanning.

use std::{io, path::PathBuf};

use tokio::io::unix::AsyncFd;

/// Watches on a set of directories.
pub struct TreeWatch {
    fd: AsyncFd<inotify::Inotify>,
}

impl TreeWatch {
    pub fn new() -> io::Result<TreeWatch> {
        let inotify = inotify::Inotify::init()?;
        // SAFETY: the Inotify owns its descriptor and keeps it open, the
        // same one, until it is dropped with the AsyncFd.
        let fd = unsafe { AsyncFd::register_with_interest(inotify, tokio::io::Interest::READABLE) }
            .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(TreeWatch { fd })
    }

    /// Watches each of `dirs`. Adding a watch the directory already has is
    /// a no-op in the kernel, and a directory removed loses its watch by
    /// itself, so the full list is passed after every scan: one made again
    /// at the same path is watched again.
    pub fn watch(&mut self, dirs: &[PathBuf]) {
        use inotify::WatchMask;
        let mask = WatchMask::CREATE
            | WatchMask::DELETE
            | WatchMask::MOVED_FROM
            | WatchMask::MOVED_TO
            | WatchMask::DELETE_SELF
            | WatchMask::ONLYDIR;
        let mut watches = self.fd.get_ref().watches();
        for d in dirs {
            if let Err(e) = watches.add(d, mask) {
                tracing::debug!(dir = %d.display(), "plugin watcher: cannot watch: {e}");
            }
        }
    }

    /// Waits for at least one event and reads all that are pending.
    pub async fn wait(&mut self) -> io::Result<()> {
        let mut buf = [0u8; 4096];
        loop {
            let mut guard = self.fd.readable_mut().await?;
            let mut any = false;
            while guard.get_inner_mut().read_events(&mut buf).is_ok() {
                any = true;
            }
            guard.clear_ready();
            if any {
                return Ok(());
            }
        }
    }
}
