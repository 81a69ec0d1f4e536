//! The agent's own heap (glibc malloc).
//!
//! The agent is a long-running daemon with a small, steady working set and
//! one large burst at start (loading the eBPF programs parses the kernel's
//! BTF: aya's loader parses it once when it is made and the agent once
//! more, since aya 0.14 cannot be handed a parse before then; tens of MiB,
//! all freed when the load returns). glibc's
//! defaults suit the opposite: up to 8 arenas per core, each keeping its
//! own free memory, and a trim threshold that rises after every large free,
//! so the burst would stay in the agent's RSS for its whole life.

/// Fixes malloc's tuning before any thread starts: two arenas (the agent's
/// threads mostly wait on I/O, so contention is rare), and a fixed mmap
/// threshold, which also fixes the trim threshold at its 128 KiB default
/// instead of letting it grow. (These are glibc's own functions, not system
/// calls, so they go through libc: rustix has no binding for them.)
pub fn configure() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt takes plain integers and changes only malloc's
    // tuning; it is called before other threads run, as glibc asks.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
    }
}

/// Hands the heap's free pages back to the kernel: after a burst that the
/// agent will not repeat (the eBPF load), and after each stats pass. A pass
/// allocates and frees thousands of small strings (one per cgroup file
/// read) beside what lives on, so the arenas are left with free pages in
/// their middle, which the trim threshold (only the top of a heap) never
/// returns, and which with a hundred pods are a large share of the agent's
/// resident heap. The trim walks the free lists once per housekeeping
/// interval.
pub fn release_freed() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim takes no pointers, has no preconditions and is
    // thread-safe (it takes each arena's lock).
    unsafe {
        libc::malloc_trim(0);
    }
}
