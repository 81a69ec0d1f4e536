//! The eBPF source's reader thread: drains the ring buffer the kernel
//! programs write, decodes each record into a [`SignalEvent`] and hands it
//! to the subscribed sink.

use std::{
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    sync::{Arc, atomic::Ordering},
};

use aya::maps::{MapData, RingBuf};
use rustix::event::{PollFd, PollFlags, Timespec};
use swiftlet_common::{EventKind, NODE_SLOT};
use tracing::{debug, warn};

use super::{Direction, KillOutcome, Signal, SignalEvent, Target, ebpf::Shared, monotonic_ns};

/// The reader thread: blocks in poll(2) on the ring buffer and the stop
/// eventfd, drains the ring, decodes records and hands them to the sink.
/// Under [`ReaderScheduling::Realtime`] (the agent's) it runs under
/// SCHED_FIFO, so a crossing reaches the sink (and the eviction fast path,
/// which kills on this thread) ahead of every ordinary thread on a busy
/// node; under [`ReaderScheduling::Idle`] (an observer's) it never
/// preempts anything. When the kernel commits records without waking it
/// (`records_wait`, an observer's), it drains the ring every
/// [`UNWOKEN_READER_POLL`].
pub(super) fn read_events(
    mut ring: RingBuf<MapData>,
    stop: OwnedFd,
    shared: Arc<Shared>,
    page: u64,
    scheduling: ReaderScheduling,
    records_wait: bool,
) {
    let backstop = if records_wait { UNWOKEN_READER_POLL } else { HELD_WAKEUP_BACKSTOP };
    match scheduling {
        ReaderScheduling::Normal => {}
        ReaderScheduling::Realtime(p) => match set_realtime(p) {
            Ok(()) => debug!(priority = p, "ring buffer reader runs under SCHED_FIFO"),
            Err(e) => warn!(priority = p, "ring buffer reader stays in the normal scheduler: SCHED_FIFO: {e}"),
        },
        ReaderScheduling::Idle => {
            if let Err(e) = set_idle() {
                warn!("ring buffer reader stays in the normal scheduler: SCHED_IDLE: {e}");
            }
        }
    }
    loop {
        match wait_readable(ring.as_fd(), &stop, Some(&backstop)) {
            Ok((_, true)) => return,
            Ok(_) => {}
            Err(e) => {
                warn!("ring buffer poll failed, reader stops: {e}");
                return;
            }
        }
        while let Some(item) = ring.next() {
            let received_ns = monotonic_ns();
            shared.events_received.fetch_add(1, Ordering::Relaxed);
            match decode(&item, &shared, page, received_ns) {
                Some(ev) => {
                    let sink = shared.sink.read().clone();
                    if let Some(sink) = sink {
                        sink.on_event(ev);
                    }
                }
                None => {
                    shared.events_undecodable.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// The scheduling policy of the reader thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReaderScheduling {
    Normal,
    /// SCHED_FIFO at this priority: the agent's fast path on a busy node.
    Realtime(u8),
    /// SCHED_IDLE: its wake-ups never preempt a running task.
    Idle,
}

/// Puts the calling thread under SCHED_IDLE.
fn set_idle() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: as in `set_realtime`.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Puts the calling thread under SCHED_FIFO at `priority` (1..=99).
/// Through libc: rustix has no sched_setscheduler.
pub fn set_realtime(priority: u8) -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: i32::from(priority.clamp(1, 99)) };
    // SAFETY: 0 names the calling thread; `param` is a valid sched_param
    // that the call only reads.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn decode(bytes: &[u8], shared: &Shared, page: u64, received_ns: u64) -> Option<SignalEvent> {
    if bytes.len() < std::mem::size_of::<swiftlet_common::Event>() {
        return None;
    }
    // SAFETY: the length is checked above, the read is unaligned, and
    // `Event` is plain integers, valid for any bytes the kernel wrote.
    let ev: swiftlet_common::Event = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
    let reg = shared.registry.read();
    let path = reg.by_id.get(&ev.cgroup_id).cloned();
    // Kernel kills name the slot whose crossing triggered them.
    let trigger = if ev.kind != EventKind::KernelKill as u32 {
        None
    } else if ev.direction == NODE_SLOT {
        Some(Target::Node)
    } else {
        reg.by_path.iter().find(|(_, e)| e.index == ev.direction).map(|(p, _)| Target::Cgroup(p.clone()))
    };
    drop(reg);
    match EventKind::from_u32(ev.kind)? {
        EventKind::Crossing => {
            let signal = Signal::from_u32(ev.signal)?;
            let target = if ev.slot == NODE_SLOT {
                Target::Node
            } else {
                match path {
                    Some(p) => Target::Cgroup(p),
                    None => {
                        // Unregistered between the crossing and now.
                        shared.unknown_cgroup_events.fetch_add(1, Ordering::Relaxed);
                        return None;
                    }
                }
            };
            let scale = if signal == Signal::MemoryWorkingSet { page } else { 1 };
            Some(SignalEvent::Crossing {
                target,
                signal,
                direction: if ev.direction == swiftlet_common::DIRECTION_UP { Direction::Up } else { Direction::Down },
                value: ev.value * scale,
                threshold: ev.threshold * scale,
                at_ns: ev.ts_ns,
                received_ns,
                pid: ev.pid,
                kernel_generation: ev.aux,
                kernel_outcome: KillOutcome::from_u32(ev.outcome).unwrap_or(KillOutcome::NotAttempted),
            })
        }
        EventKind::OomVictim => Some(SignalEvent::OomKill {
            cgroup: path,
            cgroup_id: ev.cgroup_id,
            pid: ev.pid,
            at_ns: ev.ts_ns,
            received_ns,
        }),
        EventKind::CgroupRemoved => Some(SignalEvent::CgroupRemoved { cgroup: path?, at_ns: ev.ts_ns }),
        EventKind::ProcessExit => Some(SignalEvent::ProcessExit { pid: ev.pid, at_ns: ev.ts_ns, received_ns }),
        EventKind::KernelKill => Some(SignalEvent::KernelKill {
            target: trigger?,
            cgroup: path,
            cgroup_id: ev.cgroup_id,
            signal: Signal::from_u32(ev.signal)?,
            pid: ev.pid,
            signal_error: ev.signal_error,
            generation: ev.aux,
            crossing_ns: ev.value,
            crossing_value: ev.threshold * if ev.signal == Signal::MemoryWorkingSet as u32 { page } else { 1 },
            at_ns: ev.ts_ns,
            received_ns,
        }),
    }
}

/// How long the event reader sleeps at most without a wake-up. The kernel
/// commits records without waking it for a moment after an in-kernel kill
/// (see the kernel side's `wakeup.rs`), and ends that hold with a wake-up
/// record, which it could not reserve in a full ring: this bounds how long
/// records could then wait.
const HELD_WAKEUP_BACKSTOP: Timespec = Timespec { tv_sec: 0, tv_nsec: 100_000_000 };

/// How often a reader whose records never wake it drains the ring.
const UNWOKEN_READER_POLL: Timespec = Timespec { tv_sec: 0, tv_nsec: 5_000_000 };

/// Blocks until either fd is readable, or `timeout` passes; true when
/// `stop` fired.
fn wait_readable(fd: BorrowedFd<'_>, stop: &OwnedFd, timeout: Option<&Timespec>) -> std::io::Result<(bool, bool)> {
    let mut fds = [PollFd::from_borrowed_fd(fd, PollFlags::IN), PollFd::new(stop, PollFlags::IN)];
    loop {
        match rustix::event::poll(&mut fds, timeout) {
            Ok(_) => return Ok((!fds[0].revents().is_empty(), !fds[1].revents().is_empty())),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Drains aya-log records from the kernel into the agent's log.
pub(super) fn forward_kernel_log(mut logger: aya_log::EbpfLogger<&'static dyn log::Log>, stop: OwnedFd) {
    loop {
        match wait_readable(logger.as_fd(), &stop, None) {
            Ok((_, true)) | Err(_) => return,
            Ok((true, false)) => logger.flush(),
            Ok((false, false)) => {}
        }
    }
}
