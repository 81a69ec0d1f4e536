//! The in-kernel refresh: the agent asks its refresh program (attached to
//! getpgid's entry, filtered to the agent's tgid and an instance's tag) to
//! bring slots up to date by making that system call with a crafted
//! argument.

use std::sync::atomic::{AtomicU32, Ordering};

use swiftlet_common::{REFRESH_BATCH, REFRESH_TAG_MAX, REFRESH_TAG_SHIFT};

/// Runs the kernel's refresh program for every batch of slots up to
/// `high_water`: the system call, with the tag and the batch's first slot
/// as its argument (the call's answer, usually ESRCH, does not matter).
pub(super) fn refresh_kernel_side(tag: u32, high_water: u32) {
    let mut start = 0;
    loop {
        refresh_batch(tag, start);
        start += REFRESH_BATCH;
        if start >= high_water {
            break;
        }
    }
}

/// One run of the refresh program: the REFRESH_BATCH slots from `start` on.
pub(super) fn refresh_batch(tag: u32, start: u32) {
    let arg = refresh_argument(tag, start);
    // A tag is at least 1, so the argument is a positive "pid"; the answer
    // is for no process of ours and does not matter.
    if let Some(pid) = rustix::process::Pid::from_raw(arg) {
        let _ = rustix::process::getpgid(Some(pid));
    }
}

/// The getpgid argument that names an instance's tag and a batch's first
/// slot to the refresh program.
fn refresh_argument(tag: u32, start: u32) -> i32 {
    ((tag << REFRESH_TAG_SHIFT) | start) as i32
}

/// A tag no other instance in this process has (1..=REFRESH_TAG_MAX, then
/// again from 1: instances loaded 32767 apart never live side by side).
pub(super) fn next_refresh_tag() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed) % REFRESH_TAG_MAX + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tag_and_slot_gives_a_positive_pid() {
        for (tag, start) in [(1, 0), (REFRESH_TAG_MAX, 0), (REFRESH_TAG_MAX, MAX_START), (1, MAX_START)] {
            let arg = refresh_argument(tag, start);
            assert!(arg > 0, "tag {tag} start {start}: {arg}");
            assert_eq!(arg as u32 >> REFRESH_TAG_SHIFT, tag, "tag {tag} start {start}");
            assert_eq!(arg as u32 & ((1 << REFRESH_TAG_SHIFT) - 1), start, "tag {tag} start {start}");
        }
    }

    const MAX_START: u32 = swiftlet_common::MAX_SLOTS - 1;

    #[test]
    fn tags_stay_in_range() {
        for _ in 0..3 {
            let t = next_refresh_tag();
            assert!((1..=REFRESH_TAG_MAX).contains(&t), "{t}");
        }
    }
}
