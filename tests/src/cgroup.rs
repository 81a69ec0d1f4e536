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
