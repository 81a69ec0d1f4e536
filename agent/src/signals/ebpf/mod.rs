//! The eBPF signal source: loads and attaches the kernel programs, maps the
//! slot array into memory, registers cgroups into slots, and reads the ring
//! buffer on a dedicated thread.
//!
//! The reader is a thread blocked in poll(2) rather than a tokio task: on a
//! machine like ours a tokio wake-up costs about five times as much (p50
//! ≈ 209 µs vs ≈ 41 µs), and this is the path eviction waits on.

mod attach;
mod load;
mod refresh;

use std::{
    collections::HashMap,
    os::fd::OwnedFd,
    sync::{
        Arc,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
    thread::JoinHandle,
};

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray},
};
use parking_lot::{Mutex, RwLock};
use swiftlet_common::{CgroupSlot, Control, NODE_SLOT, NodePending, ProcCpu, VictimPlan, slot_flags};
use tracing::debug;

use self::refresh::{refresh_batch, refresh_kernel_side};
pub use self::{
    attach::Strategies,
    load::{EbpfOptions, object},
};
use super::{
    CgroupKind, CgroupUsage, EventSink, KernelVictim, NodeUsage, Signal, SignalError, SignalSource, Snapshot,
    SourceMode, Target, Threshold,
    mapped::MappedArray,
    plans::{self, PlanTable},
};
use crate::cgroups::CgroupFs;

#[derive(Clone, Debug)]
pub(super) struct SlotEntry {
    pub(super) index: u32,
    pub(super) cgroup_id: u64,
}

#[derive(Default)]
pub(super) struct Registry {
    pub(super) by_path: HashMap<String, SlotEntry>,
    pub(super) by_id: HashMap<u64, String>,
    /// Free slot indices; slot 0 is the node's and never free.
    free: Vec<u32>,
}

/// What the source shares with its reader thread.
pub(super) struct Shared {
    slots: MappedArray<CgroupSlot>,
    control: MappedArray<Control>,
    pub(super) registry: RwLock<Registry>,
    pub(super) sink: RwLock<Option<Arc<dyn EventSink>>>,
    pub(super) events_received: AtomicU64,
    pub(super) events_undecodable: AtomicU64,
    pub(super) unknown_cgroup_events: AtomicU64,
}

pub struct EbpfSource {
    shared: Arc<Shared>,
    cgroupfs: CgroupFs,
    page: u64,
    cgroup_slot: Mutex<BpfHashMap<MapData, u64, u32>>,
    plans: PlanTable<MappedArray<VictimPlan>>,
    /// This instance's refresh tag (see `REFRESH_TAG_SHIFT`).
    refresh_tag: u32,
    watch_exit: Mutex<BpfHashMap<MapData, u32, u32>>,
    /// The process programs' per-CPU state: the node task deltas each CPU
    /// holds back from the node slot.
    proc_cpu: Mutex<PerCpuArray<MapData, ProcCpu>>,
    /// The node memory deltas each CPU holds back from the node slot.
    node_pending: Mutex<PerCpuArray<MapData, NodePending>>,
    /// The node's memory figures are the seed plus the kernel's deltas (its
    /// per-node statistics out of reach): the pending deltas complete them.
    node_from_deltas: bool,
    strategies: Strategies,
    /// Program names and ids, for the run-time metrics.
    program_names: Vec<String>,
    stop: OwnedFd,
    reader: Option<JoinHandle<()>>,
    kernel_log: Option<JoinHandle<()>>,
    // Keeps programs, links and the remaining maps alive; dropped last.
    ebpf: Mutex<Ebpf>,
}

fn err(context: &str, e: impl std::fmt::Display) -> SignalError {
    SignalError::Ebpf(format!("{context}: {e}"))
}

impl EbpfSource {
    /// Node tasks the CPUs have counted and not yet added to the node slot
    /// (the process programs batch them per CPU, `ProcCpu::node_tasks`):
    /// with them the node's task count is exact. One lookup of the per-CPU
    /// map; 0 if it fails, which leaves the count behind by less than
    /// `NODE_TASK_BATCH` per CPU.
    fn pending_node_tasks(&self) -> i64 {
        let map = self.proc_cpu.lock();
        match map.get(&0, 0) {
            Ok(values) => values.iter().map(|c| c.node_tasks).sum(),
            Err(e) => {
                debug!(error = %e, "reading the per-CPU node task deltas");
                0
            }
        }
    }

    /// Node memory pages each CPU has counted since it last brought the node
    /// slot up to date (usage, inactive file), summed. Where the node's
    /// figures are kept from deltas, these complete them, as
    /// [`Self::pending_node_tasks`] does for tasks.
    pub fn pending_node_memory(&self) -> NodePending {
        let map = self.node_pending.lock();
        match map.get(&0, 0) {
            Ok(values) => values.iter().fold(NodePending::default(), |sum, c| NodePending {
                usage_pages: sum.usage_pages + c.usage_pages,
                inactive_file_pages: sum.inactive_file_pages + c.inactive_file_pages,
            }),
            Err(e) => {
                debug!(error = %e, "reading the per-CPU node memory deltas");
                NodePending::default()
            }
        }
    }

    pub fn strategies(&self) -> &Strategies {
        &self.strategies
    }

    /// (program name, run count, total run time in ns) for every attached
    /// program; counts are zero unless `kernel.bpf_stats_enabled` is 1.
    pub fn program_stats(&self) -> Vec<(String, u64, u64)> {
        let ebpf = self.ebpf.lock();
        self.program_names
            .iter()
            .filter_map(|n| {
                let info = ebpf.program(n)?.info().ok()?;
                Some((n.clone(), info.run_count(), info.run_time().as_nanos() as u64))
            })
            .collect()
    }

    /// (program name, instructions the verifier processed) for every
    /// attached program (kernel 5.16 and later report it): what loading
    /// costs, which matters on slow or emulated CPUs.
    pub fn verified_instructions(&self) -> Vec<(String, u32)> {
        let ebpf = self.ebpf.lock();
        self.program_names
            .iter()
            .filter_map(|n| Some((n.clone(), ebpf.program(n)?.info().ok()?.verified_instruction_count()?)))
            .collect()
    }

    /// Reports the exit of process `pid` as [`SignalEvent::ProcessExit`],
    /// timestamped by the kernel.
    pub fn watch_exit(&self, pid: u32) -> Result<(), SignalError> {
        // The kernel looks the table up only while this count is non-zero:
        // raised before the entry exists, so an exit right after the insert
        // is not missed, and lowered again if the insert fails. The kernel
        // lowers it for each entry it reports and removes.
        // SAFETY: the control block is mapped as long as `self` lives, the
        // field is 8-byte aligned, and every writer (kernel and agent)
        // changes it atomically.
        let watches = unsafe { AtomicU64::from_ptr(&raw mut (*self.shared.control.at(0)).exit_watches) };
        watches.fetch_add(1, Ordering::SeqCst);
        let inserted = self.watch_exit.lock().insert(pid, 1, 0).map_err(|e| err("WATCH_EXIT", e));
        if inserted.is_err() {
            watches.fetch_sub(1, Ordering::SeqCst);
        }
        inserted
    }

    /// The slot index of a registered cgroup (for plans and tests).
    pub fn slot_of(&self, cgroup: &str) -> Option<u32> {
        self.shared.registry.read().by_path.get(cgroup).map(|e| e.index)
    }

    /// The kernel's cgroup id for a registered cgroup.
    pub fn cgroup_id_of(&self, cgroup: &str) -> Option<u64> {
        self.shared.registry.read().by_path.get(cgroup).map(|e| e.cgroup_id)
    }

    /// Turns the in-kernel kill on or off (`--kernel-eviction`); plans stay.
    pub fn set_kernel_eviction(&self, on: bool) {
        // SAFETY: the control block is mapped as long as `self` lives; the
        // kernel only reads this field, so a volatile write through a raw
        // pointer cannot race a kernel write.
        unsafe { std::ptr::write_volatile(&raw mut (*self.shared.control.at(0)).kernel_eviction, u32::from(on)) };
    }

    /// Runs the in-kernel refresh of every registered slot (what a snapshot
    /// does first).
    pub fn refresh(&self) {
        refresh_kernel_side(self.refresh_tag, self.high_water());
    }

    /// Runs of this instance's refresh program so far.
    pub fn refresh_runs(&self) -> u64 {
        // SAFETY: the control block is mapped as long as `self` lives; an
        // aligned volatile read of a u64 the kernel bumps is never torn.
        unsafe { std::ptr::read_volatile(&raw const (*self.shared.control.at(0)).refresh_runs) }
    }

    /// The cgroup id of the victim the kernel holds doomed, if any.
    pub fn doomed(&self) -> Option<u64> {
        // SAFETY: the control block is mapped as long as `self` lives;
        // aligned volatile reads through raw pointers (the two fields may
        // be from different kills; the caller only compares ids).
        unsafe {
            let c = self.shared.control.at(0);
            (std::ptr::read_volatile(&raw const (*c).doomed_memcg) != 0)
                .then(|| std::ptr::read_volatile(&raw const (*c).doomed_cgroup_id))
        }
    }

    /// One past the highest slot in use.
    fn high_water(&self) -> u32 {
        // SAFETY: the control block is mapped as long as `self` lives; only
        // the agent writes this field.
        unsafe { std::ptr::read_volatile(&raw const (*self.shared.control.at(0)).slot_high_water) }
    }

    fn bump_generation(&self) {
        // SAFETY: the control block is mapped as long as `self` lives, the
        // field is aligned, and the kernel bumps it atomically too.
        unsafe { AtomicU64::from_ptr(&raw mut (*self.shared.control.at(0)).generation) }.fetch_add(1, Ordering::SeqCst);
    }

    fn slot_index(&self, target: &Target) -> Result<u32, SignalError> {
        match target {
            Target::Node => Ok(NODE_SLOT),
            Target::Cgroup(c) => self.slot_of(c).ok_or_else(|| SignalError::NotRegistered(c.clone())),
        }
    }
}

impl Drop for EbpfSource {
    fn drop(&mut self) {
        // Adding 1 to the stop eventfd wakes the threads; it cannot fail
        // short of the counter's overflow, which would wake them too.
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
        for t in [self.reader.take(), self.kernel_log.take()].into_iter().flatten() {
            let _ = t.join();
        }
    }
}

fn read_slot(shared: &Shared, index: u32) -> CgroupSlot {
    // SAFETY: `at` checks the index against the mapping, which lives as
    // long as `shared`; a torn read across fields is acceptable for figures
    // that move independently anyway, and every field is plain data.
    unsafe { std::ptr::read_volatile(shared.slots.at(index)) }
}

fn usage_of(slot: &CgroupSlot, page: u64, has_inodes: bool) -> CgroupUsage {
    CgroupUsage {
        usage_bytes: slot.usage_pages.max(0) as u64 * page,
        inactive_file_bytes: slot.inactive_file_pages.max(0) as u64 * page,
        working_set_bytes: slot.working_set_pages() * page,
        processes: slot.processes.max(0) as u64,
        inodes: has_inodes.then_some(slot.inodes),
    }
}

impl SignalSource for EbpfSource {
    fn mode(&self) -> SourceMode {
        SourceMode::Ebpf
    }

    fn register(&self, cgroup: &str, kind: CgroupKind) -> Result<(), SignalError> {
        let cgroup = cgroup.trim_matches('/').to_owned();
        if self.slot_of(&cgroup).is_some() {
            return Ok(());
        }
        let id = self.cgroupfs.cgroup_id(&cgroup)?;
        // Seed from cgroupfs before the kernel starts counting for the slot.
        let usage = self.cgroupfs.memory_usage(&cgroup)?;
        let inactive = self.cgroupfs.memory_stat(&cgroup)?.inactive_file;
        let processes = self.cgroupfs.procs_recursive(&cgroup)?.len();
        let index = {
            let mut reg = self.shared.registry.write();
            let index = reg.free.pop().ok_or_else(|| SignalError::SlotsFull(cgroup.clone()))?;
            reg.by_path.insert(cgroup.clone(), SlotEntry { index, cgroup_id: id });
            reg.by_id.insert(id, cgroup.clone());
            index
        };
        let flags = slot_flags::ACTIVE
            | match kind {
                CgroupKind::Kubepods => slot_flags::KUBEPODS,
                CgroupKind::Pod => slot_flags::POD,
                CgroupKind::Container => slot_flags::CONTAINER,
                CgroupKind::Qos | CgroupKind::Other => 0,
            };
        let s = self.shared.slots.at(index);
        // SAFETY: `s` is in bounds of the slot mapping, which lives as long
        // as `self`; the slot is ours (popped from the free list) and not
        // yet reachable from the kernel, which finds slots through
        // CGROUP_SLOT.
        unsafe {
            let epoch = std::ptr::read_volatile(&raw const (*s).epoch) + 1;
            std::ptr::write_volatile(
                s,
                CgroupSlot {
                    cgroup_id: id,
                    flags,
                    epoch,
                    usage_pages: (usage / self.page) as i64,
                    inactive_file_pages: (inactive / self.page) as i64,
                    processes: processes as i64,
                    ..CgroupSlot::EMPTY
                },
            );
        }
        let inserted = self.cgroup_slot.lock().insert(id, index, 0);
        if let Err(e) = inserted {
            let mut reg = self.shared.registry.write();
            reg.by_path.remove(&cgroup);
            reg.by_id.remove(&id);
            reg.free.push(index);
            return Err(err("CGROUP_SLOT insert", e));
        }
        // SAFETY: the control block is mapped as long as `self` lives and
        // the field is aligned; the kernel only reads it, and registrations
        // on several threads raise it atomically.
        unsafe { AtomicU32::from_ptr(&raw mut (*self.shared.control.at(0)).slot_high_water) }
            .fetch_max(index + 1, Ordering::SeqCst);
        self.bump_generation();
        debug!(cgroup, index, id, "registered cgroup");
        Ok(())
    }

    fn unregister(&self, cgroup: &str) {
        let cgroup = cgroup.trim_matches('/');
        let entry = {
            let mut reg = self.shared.registry.write();
            let Some(entry) = reg.by_path.remove(cgroup) else { return };
            reg.by_id.remove(&entry.cgroup_id);
            entry
        };
        let _ = self.cgroup_slot.lock().remove(&entry.cgroup_id);
        self.bump_generation();
        let s = self.shared.slots.at(entry.index);
        // SAFETY: `s` is in bounds of the slot mapping, which lives as long
        // as `self`; the slot is no longer reachable through CGROUP_SLOT or
        // a current resolution. The epoch is kept so the next owner's
        // differs.
        unsafe {
            let epoch = std::ptr::read_volatile(&raw const (*s).epoch);
            std::ptr::write_volatile(s, CgroupSlot { epoch, ..CgroupSlot::EMPTY });
        }
        self.shared.registry.write().free.push(entry.index);
        self.plans.drop_lines_of(cgroup);
    }

    fn set_threshold(&self, target: &Target, signal: Signal, threshold: Option<Threshold>) -> Result<(), SignalError> {
        let index = self.slot_index(target)?;
        let t = threshold.unwrap_or_default();
        let (trigger, rearm) = match signal {
            // Memory thresholds are in pages in the kernel; round the
            // trigger up so the kernel never fires below the byte value.
            Signal::MemoryWorkingSet => (t.trigger.div_ceil(self.page), t.rearm / self.page),
            _ => (t.trigger, t.rearm),
        };
        let s = self.shared.slots.at(index);
        // SAFETY: `s` is in bounds of the slot mapping, which lives as long
        // as `self`; the kernel only reads thresholds, and changes `lines`
        // and `above` atomically, as the atomics here do. No reference to
        // the mapped memory is made, only raw pointers.
        unsafe {
            let th = &raw mut (*s).thresholds[signal as usize];
            std::ptr::write_volatile(&raw mut (*th).rearm, rearm);
            std::ptr::write_volatile(&raw mut (*th).trigger, trigger);
            // Which signals have a line: the kernel's counting skips the
            // evaluation of the others (set after the line is in place).
            let lines = AtomicU32::from_ptr(&raw mut (*s).lines);
            if trigger != 0 {
                lines.fetch_or(signal.bit(), Ordering::SeqCst);
            } else {
                lines.fetch_and(!signal.bit(), Ordering::SeqCst);
            }
            // Re-arm, so the kernel reports anew against the new line.
            AtomicU32::from_ptr(&raw mut (*s).above).fetch_and(!signal.bit(), Ordering::SeqCst);
        }
        if signal == Signal::MemoryWorkingSet && index != NODE_SLOT {
            // The kernel skips evaluating a cgroup whose page counter has not
            // moved, so the new line is evaluated now (the refresh program,
            // from this slot's batch) rather than at its next charge batch.
            refresh_batch(self.refresh_tag, index);
        }
        Ok(())
    }

    fn snapshot(&self) -> Result<Snapshot, SignalError> {
        refresh_kernel_side(self.refresh_tag, self.high_water());
        let mut node = read_slot(&self.shared, NODE_SLOT);
        if self.node_from_deltas {
            let pending = self.pending_node_memory();
            node.usage_pages += pending.usage_pages;
            node.inactive_file_pages += pending.inactive_file_pages;
        }
        let has_inodes = self.strategies.inodes != "none";
        let reg = self.shared.registry.read();
        let cgroups = reg
            .by_path
            .iter()
            .map(|(path, e)| (path.clone(), usage_of(&read_slot(&self.shared, e.index), self.page, has_inodes)))
            .collect();
        Ok(Snapshot {
            node: NodeUsage {
                usage_bytes: node.usage_pages.max(0) as u64 * self.page,
                inactive_file_bytes: node.inactive_file_pages.max(0) as u64 * self.page,
                working_set_bytes: node.working_set_pages() * self.page,
                tasks: (node.processes + self.pending_node_tasks()).max(0) as u64,
            },
            cgroups,
            taken_at: std::time::Instant::now(),
        })
    }

    fn subscribe(&self, sink: Arc<dyn EventSink>) {
        *self.shared.sink.write() = Some(sink);
    }

    fn set_kernel_victim(
        &self,
        target: &Target,
        signal: Signal,
        victim: Option<KernelVictim<'_>>,
    ) -> Result<bool, SignalError> {
        let trigger_slot = self.slot_index(target)?;
        let wanted = match victim {
            Some(v) => {
                let reg = self.shared.registry.read();
                let e = reg
                    .by_path
                    .get(v.cgroup.trim_matches('/'))
                    .ok_or_else(|| SignalError::NotRegistered(v.cgroup.to_owned()))?;
                Some(plans::Wanted {
                    trigger_slot,
                    signal,
                    victim_slot: e.index,
                    victim_cgroup_id: e.cgroup_id,
                    victim_tgid: v.tgid,
                    planned_ns: v.planned_ns,
                    max_age_ns: v.max_age.map_or(0, |d| d.as_nanos().clamp(1, u128::from(u64::MAX)) as u64),
                })
            }
            None => None,
        };
        self.plans.set((target.clone(), signal), wanted).map_err(|e| err("PLANS", e))?;
        Ok(true)
    }

    fn set_reclaim_first(&self, on: bool) {
        // SAFETY: the control block is mapped as long as `self` lives; the
        // kernel only reads this field.
        unsafe { std::ptr::write_volatile(&raw mut (*self.shared.control.at(0)).reclaim_first, u32::from(on)) };
    }

    fn kernel_kill_finished(&self, cgroup_id: u64) {
        // SAFETY: the control block is mapped as long as `self` lives and
        // the mark is aligned and changed atomically by the kernel too. It
        // is cleared only if it is still this victim's (the kernel may have
        // doomed another since).
        unsafe {
            let c = self.shared.control.at(0);
            let memcg = AtomicU64::from_ptr(&raw mut (*c).doomed_memcg);
            let current = memcg.load(Ordering::SeqCst);
            if current != 0 && std::ptr::read_volatile(&raw const (*c).doomed_cgroup_id) == cgroup_id {
                let _ = memcg.compare_exchange(current, 0, Ordering::SeqCst, Ordering::SeqCst);
            }
        }
    }

    fn strategies(&self) -> Vec<(&'static str, String)> {
        self.strategies.pairs()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        // SAFETY: the control block is mapped as long as `self` lives and
        // is plain data; a volatile copy of it may mix moments, which the
        // counters it gives tolerate.
        let c = unsafe { std::ptr::read_volatile(self.shared.control.at(0)) };
        vec![
            ("ring_drops", c.ring_drops),
            ("proc_table_full", c.proc_table_full),
            ("kernel_kills", c.kernel_kills),
            ("refresh_runs", c.refresh_runs),
            ("events_received", self.shared.events_received.load(Ordering::Relaxed)),
            ("events_undecodable", self.shared.events_undecodable.load(Ordering::Relaxed)),
            ("unknown_cgroup_events", self.shared.unknown_cgroup_events.load(Ordering::Relaxed)),
        ]
    }
}
