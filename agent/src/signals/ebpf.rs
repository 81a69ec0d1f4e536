//! The eBPF signal source: loads and attaches the kernel programs, maps the
//! slot array into memory, registers cgroups into slots, and reads the ring
//! buffer on a dedicated thread.
//!
//! The reader is a thread blocked in poll(2) rather than a tokio task: on a
//! machine like ours a tokio wake-up costs about five times as much (p50
//! ≈ 209 µs vs ≈ 41 µs), and this is the path eviction waits on.

use std::{
    collections::HashMap,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::PathBuf,
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
    thread::JoinHandle,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, FEntry, FExit, TracePoint},
};
use swiftlet_common::{
    CgroupSlot, Control, MAX_SLOTS, NODE_MEMORY_BATCH, NODE_SLOT, NodePending, ProcCpu, VictimPlan, slot_flags,
};
use tracing::{debug, info, warn};

use super::{
    CgroupKind, CgroupUsage, EventSink, KernelVictim, NodeUsage, Signal, SignalError, SignalSource, Snapshot,
    SourceMode, Target, Threshold,
    btf::Btf,
    layout,
    mapped::MappedArray,
    node, page_size,
    plans::{self, PlanTable},
    probe::{self, InactiveHook, KernelFeatures, MarkVictim, MemoryStrategy},
    ring,
};
use crate::cgroups::CgroupFs;

/// The kernel programs, built by the agent's build script.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/swiftlet-ebpf.o"));

/// The embedded object.
pub fn object() -> &'static [u8] {
    OBJECT
}

/// How each signal is tracked in the kernel, for the log line and metric.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Strategies {
    pub memory: MemoryStrategy,
    pub processes: &'static str,
    pub inodes: &'static str,
    /// How kernel OOM kills are attributed to cgroups.
    pub oom: &'static str,
    /// How the kernel kills a planned victim at a crossing.
    pub kill: &'static str,
    /// Strategies more exact than the ones in use, and why they are not:
    /// refused by the probes, or failed to load or attach.
    pub passed_over: Vec<String>,
}

impl Strategies {
    /// (signal, strategy) pairs, for the metric.
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        vec![
            ("memory", self.memory.name().to_owned()),
            ("processes", self.processes.to_owned()),
            ("inodes", self.inodes.to_owned()),
            ("oom", self.oom.to_owned()),
            ("kill", self.kill.to_owned()),
        ]
    }
}

#[derive(Clone, Debug, Default)]
pub struct EbpfOptions {
    /// Load this object instead of the embedded one.
    pub object: Option<PathBuf>,
    /// Forward kernel-side aya-log records to the agent's log.
    pub kernel_log: bool,
    /// Fail the load on purpose (to exercise the fallback).
    pub force_load_failure: bool,
    /// Let the kernel kill planned victims at a crossing (`--kernel-eviction`).
    pub kernel_eviction: bool,
    /// Use this memory strategy or fail, instead of the most exact one this
    /// kernel supports (tests and benchmarks compare them).
    pub memory_strategy: Option<MemoryStrategy>,
    /// Pages each CPU gathers before adding them to the node's memory
    /// figures and line; `None` is the kernel's charge batch
    /// ([`NODE_MEMORY_BATCH`]). An observer that must see the node's line
    /// crossed at the very page (the eviction race) uses 1.
    pub node_memory_batch: Option<u32>,
    /// Run the ring buffer's reader thread under SCHED_FIFO at this
    /// priority (1..=99): the eviction fast path kills on that thread, and
    /// on a node whose cores are busy it would otherwise wait its turn.
    pub reader_priority: Option<u8>,
}

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
        let map = self.proc_cpu.lock().unwrap_or_else(|p| p.into_inner());
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
        let map = self.node_pending.lock().unwrap_or_else(|p| p.into_inner());
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

    /// Loads and attaches the kernel programs. Fails (and the caller falls
    /// back to cgroupfs) when there is no BTF, no CAP_BPF, or the verifier
    /// rejects a program.
    pub fn load(cgroupfs: CgroupFs, opts: &EbpfOptions) -> Result<EbpfSource, SignalError> {
        if opts.force_load_failure {
            return Err(SignalError::Ebpf("load failure forced by --ebpf-force-failure".into()));
        }
        let btf = Btf::from_sys_fs().map_err(|e| err("kernel BTF", e))?;
        let layout = layout::kernel_layout(&btf).map_err(|e| err("kernel layout", e))?;
        let aya_btf = aya::Btf::from_sys_fs().map_err(|e| err("kernel BTF (aya)", e))?;
        // sched_process_exit gained `group_dead` in 6.13.
        let exit_has_group_dead: u32 = u32::from(btf.tracepoint_args("sched_process_exit").unwrap_or(1) >= 2);
        let log_level: u8 = if opts.kernel_log { 0xff } else { 0 };

        let object = match &opts.object {
            Some(p) => std::fs::read(p).map_err(|e| err(&p.display().to_string(), e))?,
            None => OBJECT.to_vec(),
        };
        let pidns = pid_namespace().map_err(|e| err("the agent's pid namespace (/proc/self/ns/pid)", e))?;
        let refresh_tag = next_refresh_tag();

        // Feature probes: what this kernel offers, and from that the
        // strategies to try per signal, most exact first.
        let features = KernelFeatures::from_btf(&btf, &layout);
        let (memory_candidates, refused) = probe::memory_candidates(&features, opts.memory_strategy);
        let mut passed_over: Vec<String> = refused.iter().map(|(s, why)| format!("{s}: {why}")).collect();
        if memory_candidates.is_empty() {
            return Err(err("memory", format!("no eBPF strategy works on this kernel: {}", passed_over.join("; "))));
        }
        if !features.process_tracepoints {
            return Err(err("processes", "no BTF tracepoints sched_process_fork/exit and cgroup_attach_task"));
        }
        let Some(oom) = probe::oom_strategy(&features) else {
            return Err(err("OOM kills", "no BTF tracepoint oom/mark_victim"));
        };
        let mark_victim_pid_only = u32::from(features.mark_victim == Some(MarkVictim::Pid));

        let node_memory_batch = opts.node_memory_batch.unwrap_or(NODE_MEMORY_BATCH).max(1);
        let node_line_slack = u64::from(node_memory_batch) * possible_cpus();
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&aya_btf))
            .map_max_entries("PROCS", proc_table_entries(node::pid_max()))
            .override_global("LAYOUT", &layout, true)
            .override_global("EXIT_HAS_GROUP_DEAD", &exit_has_group_dead, true)
            .override_global("MARK_VICTIM_PID_ONLY", &mark_victim_pid_only, true)
            .override_global("AYA_LOG_LEVEL", &log_level, false)
            .override_global("AGENT_TGID", &std::process::id(), true)
            .override_global("AGENT_PIDNS_DEV", &pidns.0, true)
            .override_global("AGENT_PIDNS_INO", &pidns.1, true)
            .override_global("REFRESH_TAG", &refresh_tag, true)
            .override_global("NODE_MEMORY_BATCH", &node_memory_batch, true)
            .override_global("NODE_LINE_SLACK", &node_line_slack, true)
            .load(&object)
            .map_err(|e| err("loading the object", e))?;
        let logger = if opts.kernel_log {
            match aya_log::EbpfLogger::init(&mut ebpf) {
                Ok(l) => Some(l),
                Err(e) => {
                    warn!("kernel-side logging unavailable: {e}");
                    None
                }
            }
        } else {
            None
        };

        let mut program_names = Vec::new();
        // Memory is the signal the fast path exists for: without it the
        // eBPF source is not worth having.
        let mut memory = None;
        for candidate in memory_candidates {
            match attach_memory(&mut ebpf, candidate, &aya_btf) {
                Ok(names) => {
                    program_names.extend(names.iter().map(|n| n.to_string()));
                    memory = Some(candidate);
                    break;
                }
                Err(e) => passed_over.push(format!("{candidate}: {e}")),
            }
        }
        let Some(memory) = memory else {
            return Err(err("memory", format!("no strategy attaches: {}", passed_over.join("; "))));
        };
        for (prog, tp) in [
            ("process_fork", "sched_process_fork"),
            ("process_exit", "sched_process_exit"),
            ("cgroup_attach", "cgroup_attach_task"),
            ("oom_mark_victim", "mark_victim"),
        ] {
            attach_btf_tracepoint(&mut ebpf, prog, tp, &aya_btf)?;
            program_names.push(prog.to_owned());
        }
        attach_tp(&mut ebpf, "cgroup_mkdir", "cgroup", "cgroup_mkdir")?;
        attach_tp(&mut ebpf, "cgroup_rmdir", "cgroup", "cgroup_rmdir")?;
        attach_tp(&mut ebpf, "refresh", "syscalls", "sys_enter_getpgid")?;
        program_names.extend(["cgroup_mkdir", "cgroup_rmdir", "refresh"].map(String::from));
        let inodes = if !features.ext4_tracepoints {
            passed_over.push(format!("inodes {}: no ext4 tracepoints", probe::INODES_EXT4));
            probe::NONE
        } else {
            match attach_tp(&mut ebpf, "inode_alloc", "ext4", "ext4_allocate_inode")
                .and_then(|()| attach_tp(&mut ebpf, "inode_free", "ext4", "ext4_free_inode"))
            {
                Ok(()) => {
                    program_names.extend(["inode_alloc".to_owned(), "inode_free".to_owned()]);
                    probe::INODES_EXT4
                }
                Err(e) => {
                    passed_over.push(format!("inodes {}: {e}", probe::INODES_EXT4));
                    probe::NONE
                }
            }
        };
        let strategies =
            Strategies { memory, processes: probe::PROCESSES, inodes, oom, kill: probe::KILL_HELPER, passed_over };

        let take = |ebpf: &mut Ebpf, name: &str| ebpf.take_map(name).ok_or_else(|| err(name, "map missing"));
        let slots_map = take(&mut ebpf, "SLOTS")?;
        let control_map = take(&mut ebpf, "CONTROL")?;
        let aya::maps::Map::Array(slots_data) = &slots_map else {
            return Err(err("SLOTS", "not an array"));
        };
        let aya::maps::Map::Array(control_data) = &control_map else {
            return Err(err("CONTROL", "not an array"));
        };
        let slots = MappedArray::<CgroupSlot>::new(slots_data, MAX_SLOTS as usize).map_err(|e| err("mmap SLOTS", e))?;
        let control = MappedArray::<Control>::new(control_data, 1).map_err(|e| err("mmap CONTROL", e))?;
        // The mappings keep the maps alive on their own; the MapData handles
        // can go.
        drop((slots_map, control_map));
        let cgroup_slot = BpfHashMap::try_from(take(&mut ebpf, "CGROUP_SLOT")?).map_err(|e| err("CGROUP_SLOT", e))?;
        let plans_map = take(&mut ebpf, "PLANS")?;
        let aya::maps::Map::Array(plans_data) = &plans_map else {
            return Err(err("PLANS", "not an array"));
        };
        let plans = MappedArray::<VictimPlan>::new(plans_data, swiftlet_common::MAX_PLANS as usize)
            .map_err(|e| err("mmap PLANS", e))?;
        drop(plans_map);
        let watch_exit = BpfHashMap::try_from(take(&mut ebpf, "WATCH_EXIT")?).map_err(|e| err("WATCH_EXIT", e))?;
        let ring = RingBuf::try_from(take(&mut ebpf, "EVENTS")?).map_err(|e| err("EVENTS", e))?;
        let proc_cpu = PerCpuArray::try_from(take(&mut ebpf, "PROC_CPU")?).map_err(|e| err("PROC_CPU", e))?;
        let node_pending =
            PerCpuArray::try_from(take(&mut ebpf, "NODE_PENDING")?).map_err(|e| err("NODE_PENDING", e))?;

        let shared = Arc::new(Shared {
            slots,
            control,
            registry: RwLock::new(Registry { free: (1..MAX_SLOTS).rev().collect(), ..Default::default() }),
            sink: RwLock::new(None),
            events_received: AtomicU64::new(0),
            events_undecodable: AtomicU64::new(0),
            unknown_cgroup_events: AtomicU64::new(0),
        });
        let page = page_size();
        let memory_strategy = match memory {
            MemoryStrategy::StatTracepoint => swiftlet_common::memory_strategy::STAT_EVENTS,
            MemoryStrategy::PageCounter(_) => swiftlet_common::memory_strategy::PAGE_COUNTER,
        };
        // SAFETY: the control block is mapped for the source's lifetime.
        unsafe {
            let c = shared.control.at(0);
            std::ptr::write_volatile(&mut (*c).kernel_eviction, u32::from(opts.kernel_eviction));
            std::ptr::write_volatile(&mut (*c).memory_strategy, memory_strategy);
        }
        // The node's memory figures come from the kernel's per-node
        // statistics when their layout is known, else from deltas on a seed.
        let node_from_deltas = !features.node_stat;
        seed_node(&shared, &cgroupfs, page, node_from_deltas, refresh_tag);

        // SAFETY: eventfd has no preconditions; the fd is owned below.
        let stop_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if stop_fd < 0 {
            return Err(SignalError::Io(std::io::Error::last_os_error()));
        }
        // SAFETY: stop_fd is a fresh fd we own.
        let stop = unsafe { OwnedFd::from_raw_fd(stop_fd) };
        let reader_stop = stop.try_clone()?;
        let reader_shared = shared.clone();
        let priority = opts.reader_priority;
        let reader = std::thread::Builder::new()
            .name("swiftlet-ringbuf".into())
            .spawn(move || ring::read_events(ring, reader_stop, reader_shared, page, priority))?;
        let kernel_log = match logger {
            Some(logger) => {
                let log_stop = stop.try_clone()?;
                Some(
                    std::thread::Builder::new()
                        .name("swiftlet-bpflog".into())
                        .spawn(move || ring::forward_kernel_log(logger, log_stop))?,
                )
            }
            None => None,
        };

        info!(
            memory = %strategies.memory,
            processes = strategies.processes,
            inodes = strategies.inodes,
            oom = strategies.oom,
            kill = strategies.kill,
            passed_over = ?strategies.passed_over,
            "eBPF signal source attached"
        );
        Ok(EbpfSource {
            shared,
            cgroupfs,
            page,
            cgroup_slot: Mutex::new(cgroup_slot),
            plans: PlanTable::new(plans),
            refresh_tag,
            watch_exit: Mutex::new(watch_exit),
            proc_cpu: Mutex::new(proc_cpu),
            node_pending: Mutex::new(node_pending),
            node_from_deltas,
            strategies,
            program_names,
            stop,
            reader: Some(reader),
            kernel_log,
            ebpf: Mutex::new(ebpf),
        })
    }

    pub fn strategies(&self) -> &Strategies {
        &self.strategies
    }

    /// (program name, run count, total run time in ns) for every attached
    /// program; counts are zero unless `kernel.bpf_stats_enabled` is 1.
    pub fn program_stats(&self) -> Vec<(String, u64, u64)> {
        let ebpf = self.ebpf.lock().unwrap_or_else(|p| p.into_inner());
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
        let ebpf = self.ebpf.lock().unwrap_or_else(|p| p.into_inner());
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
        // SAFETY: mapped control block; the counter is only changed atomically.
        let watches = unsafe { AtomicU64::from_ptr(&mut (*self.shared.control.at(0)).exit_watches) };
        watches.fetch_add(1, Ordering::SeqCst);
        let inserted = self
            .watch_exit
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pid, 1, 0)
            .map_err(|e| err("WATCH_EXIT", e));
        if inserted.is_err() {
            watches.fetch_sub(1, Ordering::SeqCst);
        }
        inserted
    }

    /// The slot index of a registered cgroup (for plans and tests).
    pub fn slot_of(&self, cgroup: &str) -> Option<u32> {
        self.shared.registry.read().ok()?.by_path.get(cgroup).map(|e| e.index)
    }

    /// The kernel's cgroup id for a registered cgroup.
    pub fn cgroup_id_of(&self, cgroup: &str) -> Option<u64> {
        self.shared.registry.read().ok()?.by_path.get(cgroup).map(|e| e.cgroup_id)
    }

    /// Turns the in-kernel kill on or off (`--kernel-eviction`); plans stay.
    pub fn set_kernel_eviction(&self, on: bool) {
        // SAFETY: mapped control block; the kernel reads this field only.
        unsafe { std::ptr::write_volatile(&mut (*self.shared.control.at(0)).kernel_eviction, u32::from(on)) };
    }

    /// Runs the in-kernel refresh of every registered slot (what a snapshot
    /// does first).
    pub fn refresh(&self) {
        refresh_kernel_side(self.refresh_tag, self.high_water());
    }

    /// Runs of this instance's refresh program so far.
    pub fn refresh_runs(&self) -> u64 {
        // SAFETY: mapped control block; a plain read of a counter.
        unsafe { std::ptr::read_volatile(&(*self.shared.control.at(0)).refresh_runs) }
    }

    /// The cgroup id of the victim the kernel holds doomed, if any.
    pub fn doomed(&self) -> Option<u64> {
        // SAFETY: mapped control block; plain reads.
        unsafe {
            let c = self.shared.control.at(0);
            (std::ptr::read_volatile(&(*c).doomed_memcg) != 0).then(|| std::ptr::read_volatile(&(*c).doomed_cgroup_id))
        }
    }

    /// One past the highest slot in use.
    fn high_water(&self) -> u32 {
        // SAFETY: mapped control block; a plain read of a u32.
        unsafe { std::ptr::read_volatile(&(*self.shared.control.at(0)).slot_high_water) }
    }

    fn bump_generation(&self) {
        // SAFETY: mapped control block; the kernel bumps it atomically too.
        unsafe { AtomicU64::from_ptr(&mut (*self.shared.control.at(0)).generation) }.fetch_add(1, Ordering::SeqCst);
    }

    fn slot_index(&self, target: &Target) -> Result<u32, SignalError> {
        match target {
            Target::Node => Ok(NODE_SLOT),
            Target::Cgroup(c) => self.slot_of(c).ok_or_else(|| SignalError::NotRegistered(c.clone())),
        }
    }
}

/// Entries of the kernel's process table (indexed by tgid): one per possible
/// pid, `pid_max`, within the kernel's own limit; the kernel's default when
/// pid_max cannot be read.
fn proc_table_entries(pid_max: std::io::Result<u64>) -> u32 {
    match pid_max {
        Ok(n) => n.clamp(1, u64::from(swiftlet_common::PROC_TABLE_LIMIT)) as u32,
        Err(_) => swiftlet_common::PROC_TABLE_DEFAULT,
    }
}

/// Seeds the node slot. The programs are already attached, so deltas since
/// the reading are counted on top of it. With the layout of the kernel's
/// per-node statistics, the kernel reads the node's memory itself (the
/// refresh program, run here).
fn seed_node(shared: &Shared, cgroupfs: &CgroupFs, page: u64, node_from_deltas: bool, refresh_tag: u32) {
    let s = shared.slots.at(NODE_SLOT);
    let tasks = node::tasks().unwrap_or(0);
    // SAFETY: mapped slot; counters are updated atomically by the kernel.
    unsafe {
        (*s).cgroup_id = cgroupfs.cgroup_id("").unwrap_or(0);
        (*s).flags = slot_flags::ACTIVE | slot_flags::NODE;
        AtomicI64::from_ptr(&mut (*s).processes).fetch_add(tasks as i64, Ordering::SeqCst);
    }
    if node_from_deltas {
        let stat = cgroupfs.memory_stat("").unwrap_or_default();
        // SAFETY: as above.
        unsafe {
            AtomicI64::from_ptr(&mut (*s).usage_pages)
                .fetch_add(((stat.anon + stat.file) / page) as i64, Ordering::SeqCst);
            AtomicI64::from_ptr(&mut (*s).inactive_file_pages)
                .fetch_add((stat.inactive_file / page) as i64, Ordering::SeqCst);
        }
    } else {
        refresh_kernel_side(refresh_tag, 1);
    }
}

/// Loads and attaches the programs of one memory strategy, all or none.
fn attach_memory(ebpf: &mut Ebpf, strategy: MemoryStrategy, btf: &aya::Btf) -> Result<Vec<&'static str>, SignalError> {
    let programs: &[(&'static str, &'static str, bool)] = match strategy {
        MemoryStrategy::StatTracepoint => {
            attach_btf_tracepoint(ebpf, "memcg_lruvec_state", "mod_memcg_lruvec_state", btf)?;
            return Ok(vec!["memcg_lruvec_state"]);
        }
        // (program, kernel function, fexit?)
        MemoryStrategy::PageCounter(hook) => &[
            ("memcg_try_charge", "page_counter_try_charge", true),
            ("memcg_charge", "page_counter_charge", true),
            ("memcg_uncharge", "page_counter_uncharge", true),
            match hook {
                InactiveHook::UpdateLruSize => ("lru_size", "mem_cgroup_update_lru_size", false),
                InactiveHook::ModLruvecState => ("lruvec_state", "__mod_lruvec_state", false),
            },
        ],
    };
    let mut attached = vec![];
    for &(prog, function, exit) in programs {
        let r = if exit { attach_fexit(ebpf, prog, function, btf) } else { attach_fentry(ebpf, prog, function, btf) };
        if let Err(e) = r {
            // All or none: a half-attached strategy would count wrongly.
            for done in attached {
                unload(ebpf, done);
            }
            unload(ebpf, prog);
            return Err(e);
        }
        attached.push(prog);
    }
    Ok(attached)
}

fn program<'a, T>(ebpf: &'a mut Ebpf, prog: &str) -> Result<&'a mut T, SignalError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(prog).ok_or_else(|| err(prog, "missing from the object"))?.try_into().map_err(|e| err(prog, e))
}

fn attach_btf_tracepoint(ebpf: &mut Ebpf, prog: &str, tp: &str, btf: &aya::Btf) -> Result<(), SignalError> {
    let p: &mut BtfTracePoint = program(ebpf, prog)?;
    p.load(tp, btf).map_err(|e| err(&format!("{prog} (tp_btf/{tp})"), e))?;
    p.attach().map_err(|e| err(&format!("attaching {prog}"), e))?;
    Ok(())
}

fn attach_fexit(ebpf: &mut Ebpf, prog: &str, function: &str, btf: &aya::Btf) -> Result<(), SignalError> {
    let p: &mut FExit = program(ebpf, prog)?;
    p.load(function, btf).map_err(|e| err(&format!("{prog} (fexit/{function})"), e))?;
    p.attach().map_err(|e| err(&format!("attaching {prog} (fexit/{function})"), e))?;
    Ok(())
}

fn attach_fentry(ebpf: &mut Ebpf, prog: &str, function: &str, btf: &aya::Btf) -> Result<(), SignalError> {
    let p: &mut FEntry = program(ebpf, prog)?;
    p.load(function, btf).map_err(|e| err(&format!("{prog} (fentry/{function})"), e))?;
    p.attach().map_err(|e| err(&format!("attaching {prog} (fentry/{function})"), e))?;
    Ok(())
}

fn attach_tp(ebpf: &mut Ebpf, prog: &str, category: &str, name: &str) -> Result<(), SignalError> {
    let p: &mut TracePoint = program(ebpf, prog)?;
    p.load().map_err(|e| err(prog, e))?;
    p.attach(category, name).map_err(|e| err(&format!("attaching {prog} to {category}/{name}"), e))?;
    Ok(())
}

/// Detaches and unloads a program, if it was loaded.
fn unload(ebpf: &mut Ebpf, prog: &str) {
    use aya::programs::Program;
    let _ = match ebpf.program_mut(prog) {
        Some(Program::FExit(p)) => p.unload(),
        Some(Program::FEntry(p)) => p.unload(),
        Some(Program::BtfTracePoint(p)) => p.unload(),
        _ => Ok(()),
    };
}

impl Drop for EbpfSource {
    fn drop(&mut self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to our eventfd wakes the reader.
        unsafe { libc::write(self.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
        for t in [self.reader.take(), self.kernel_log.take()].into_iter().flatten() {
            let _ = t.join();
        }
    }
}

/// Runs the kernel's refresh program (attached to getpgid's entry and
/// filtered to our tgid and this instance's tag) for every batch of slots
/// up to `high_water`: the raw syscall, with the tag and the batch's first
/// slot as its argument (the call's answer, usually ESRCH, does not matter).
fn refresh_kernel_side(tag: u32, high_water: u32) {
    let mut start = 0;
    loop {
        refresh_batch(tag, start);
        start += swiftlet_common::REFRESH_BATCH;
        if start >= high_water {
            break;
        }
    }
}

/// One run of the refresh program: the REFRESH_BATCH slots from `start` on.
fn refresh_batch(tag: u32, start: u32) {
    let arg = (tag << swiftlet_common::REFRESH_TAG_SHIFT) | start;
    // SAFETY: getpgid takes a pid and only reads.
    unsafe { libc::syscall(libc::SYS_getpgid, arg as libc::pid_t) };
}

/// A tag no other instance in this process has (1..=REFRESH_TAG_MAX, then
/// again from 1: instances loaded 32767 apart never live side by side).
fn next_refresh_tag() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed) % swiftlet_common::REFRESH_TAG_MAX + 1
}

/// The device and inode of the agent's pid namespace, which the refresh
/// program needs to see the agent's tgid as the agent does.
fn pid_namespace() -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata("/proc/self/ns/pid")?;
    Ok((m.dev(), m.ino()))
}

/// CPUs the kernel may bring online: the length of every per-CPU map.
fn possible_cpus() -> u64 {
    aya::util::nr_cpus().map_or(1, |n| n as u64)
}

fn read_slot(shared: &Shared, index: u32) -> CgroupSlot {
    // SAFETY: mapped slot; a torn read across fields is acceptable for
    // figures that move independently anyway.
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
            let mut reg = self.shared.registry.write().unwrap_or_else(|p| p.into_inner());
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
        // SAFETY: the slot is ours (popped from the free list) and not yet
        // reachable from the kernel, which finds slots through CGROUP_SLOT.
        unsafe {
            let epoch = std::ptr::read_volatile(&(*s).epoch) + 1;
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
        let inserted = self.cgroup_slot.lock().unwrap_or_else(|p| p.into_inner()).insert(id, index, 0);
        if let Err(e) = inserted {
            let mut reg = self.shared.registry.write().unwrap_or_else(|p| p.into_inner());
            reg.by_path.remove(&cgroup);
            reg.by_id.remove(&id);
            reg.free.push(index);
            return Err(err("CGROUP_SLOT insert", e));
        }
        // SAFETY: mapped control block; only the agent writes this field.
        unsafe {
            let hw = &mut (*self.shared.control.at(0)).slot_high_water;
            if std::ptr::read_volatile(hw) <= index {
                std::ptr::write_volatile(hw, index + 1);
            }
        }
        self.bump_generation();
        debug!(cgroup, index, id, "registered cgroup");
        Ok(())
    }

    fn unregister(&self, cgroup: &str) {
        let cgroup = cgroup.trim_matches('/');
        let entry = {
            let mut reg = self.shared.registry.write().unwrap_or_else(|p| p.into_inner());
            let Some(entry) = reg.by_path.remove(cgroup) else { return };
            reg.by_id.remove(&entry.cgroup_id);
            entry
        };
        let _ = self.cgroup_slot.lock().unwrap_or_else(|p| p.into_inner()).remove(&entry.cgroup_id);
        self.bump_generation();
        let s = self.shared.slots.at(entry.index);
        // SAFETY: no longer reachable through CGROUP_SLOT or a current
        // resolution; keep the epoch so the next owner's differs.
        unsafe {
            let epoch = std::ptr::read_volatile(&(*s).epoch);
            std::ptr::write_volatile(s, CgroupSlot { epoch, ..CgroupSlot::EMPTY });
        }
        self.shared.registry.write().unwrap_or_else(|p| p.into_inner()).free.push(entry.index);
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
        // SAFETY: mapped slot; the kernel only reads thresholds and lines.
        unsafe {
            let th = &mut (*s).thresholds[signal as usize];
            std::ptr::write_volatile(&mut th.rearm, rearm);
            std::ptr::write_volatile(&mut th.trigger, trigger);
            // Which signals have a line: the kernel's counting skips the
            // evaluation of the others (set after the line is in place).
            let lines = std::sync::atomic::AtomicU32::from_ptr(&mut (*s).lines);
            if trigger != 0 {
                lines.fetch_or(signal.bit(), Ordering::SeqCst);
            } else {
                lines.fetch_and(!signal.bit(), Ordering::SeqCst);
            }
            // Re-arm, so the kernel reports anew against the new line.
            std::sync::atomic::AtomicU32::from_ptr(&mut (*s).above).fetch_and(!signal.bit(), Ordering::SeqCst);
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
        let reg = self.shared.registry.read().unwrap_or_else(|p| p.into_inner());
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
        *self.shared.sink.write().unwrap_or_else(|p| p.into_inner()) = Some(sink);
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
                let reg = self.shared.registry.read().unwrap_or_else(|p| p.into_inner());
                let e = reg
                    .by_path
                    .get(v.cgroup.trim_matches('/'))
                    .ok_or_else(|| SignalError::NotRegistered(v.cgroup.to_owned()))?;
                Some(plans::Wanted {
                    trigger_slot,
                    signal,
                    victim_slot: e.index,
                    victim_cgroup_id: e.cgroup_id,
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
        // SAFETY: mapped control block; the kernel reads this field only.
        unsafe { std::ptr::write_volatile(&mut (*self.shared.control.at(0)).reclaim_first, u32::from(on)) };
    }

    fn kernel_kill_finished(&self, cgroup_id: u64) {
        // SAFETY: mapped control block; the mark is cleared only if it is
        // still this victim's (the kernel may have doomed another since).
        unsafe {
            let c = self.shared.control.at(0);
            let memcg = AtomicU64::from_ptr(&raw mut (*c).doomed_memcg);
            let current = memcg.load(Ordering::SeqCst);
            if current != 0 && std::ptr::read_volatile(&(*c).doomed_cgroup_id) == cgroup_id {
                let _ = memcg.compare_exchange(current, 0, Ordering::SeqCst, Ordering::SeqCst);
            }
        }
    }

    fn strategies(&self) -> Vec<(&'static str, String)> {
        self.strategies.pairs()
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        // SAFETY: mapped control block.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_table_covers_every_pid_within_the_kernel_limit() {
        let cases: [(std::io::Result<u64>, u32); 5] = [
            (Ok(32768), 32768),
            (Ok(4_194_304), 4_194_304),
            (Ok(u64::MAX), swiftlet_common::PROC_TABLE_LIMIT),
            (Ok(0), 1),
            (Err(std::io::Error::other("no procfs")), swiftlet_common::PROC_TABLE_DEFAULT),
        ];
        for (pid_max, want) in cases {
            let shown = format!("{pid_max:?}");
            assert_eq!(proc_table_entries(pid_max), want, "pid_max {shown}");
        }
    }
}
