//! Ending the processes a test started (agents, containerd), by their PID.

use std::{
    process::Child,
    time::{Duration, Instant},
};

/// SIGTERM, then SIGKILL if `child` has not exited within `grace`; reaps
/// it either way. Returns whether it exited by itself.
pub fn terminate(child: &mut Child, grace: Duration) -> bool {
    // SAFETY: signalling the process we started, by its PID.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if child.try_wait().ok().flatten().is_some() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    false
}
