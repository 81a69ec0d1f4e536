//! A cgroup tree owned by one test: `swiftlet-test-<pid>-<n>` at the top of
//! the hierarchy, killed and removed on drop.

use std::{
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use swiftlet::cgroups::CgroupFs;

static NEXT: AtomicU32 = AtomicU32::new(0);

pub struct TestCgroup {
    pub fs: CgroupFs,
    /// Relative path of the test's own root cgroup.
    pub root: String,
}

impl TestCgroup {
    /// Creates a fresh tree on this machine's hierarchy.
    pub fn new() -> TestCgroup {
        crate::prereq::require_root();
        let fs = CgroupFs::detect().unwrap_or_else(|e| panic!("this test needs a cgroup memory controller: {e}"));
        let root = format!("swiftlet-test-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst));
        fs.create(&root).unwrap_or_else(|e| panic!("cannot create test cgroup {root}: {e}"));
        TestCgroup { fs, root }
    }

    /// Creates `name` below the test root and returns its relative path.
    pub fn child(&self, name: &str) -> String {
        let rel = format!("{}/{name}", self.root);
        self.fs.create(&rel).unwrap_or_else(|e| panic!("cannot create test cgroup {rel}: {e}"));
        rel
    }

    /// Whether the memory cgroup with kernel id `id` is this tree's root or
    /// lies below it. Kernel OOM events name the victim's memory cgroup by
    /// id, and other work on the machine has OOM kills of its own.
    pub fn holds_cgroup_id(&self, id: u64) -> bool {
        let mut stack = vec![self.fs.memory_dir(&self.root)];
        while let Some(dir) = stack.pop() {
            if std::fs::metadata(&dir).is_ok_and(|m| std::os::unix::fs::MetadataExt::ino(&m) == id) {
                return true;
            }
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            stack.extend(entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()));
        }
        false
    }
}

impl Default for TestCgroup {
    fn default() -> Self {
        TestCgroup::new()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = self.fs.kill_all(&self.root);
        if let Err(e) = self.fs.remove(&self.root, Duration::from_secs(10)) {
            eprintln!("warning: cannot remove test cgroup {}: {e}", self.root);
        }
    }
}
