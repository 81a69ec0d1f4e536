//! Loading the eBPF signal source: the kernel's BTF read once, the feature
//! probes, the object's load-time constants, the programs attached, the
//! maps taken and mapped, the node slot seeded and the reader threads
//! started.

use std::{
    os::fd::OwnedFd,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, Map, MapData, PerCpuArray, RingBuf},
};
use parking_lot::{Mutex, RwLock};
use rustix::mm::Advice;
use swiftlet_common::{
    CgroupSlot, Control, KernelLayout, MAX_PLANS, MAX_SLOTS, NODE_MEMORY_BATCH, NODE_SLOT, NodePending, ProcCpu,
    VictimPlan, slot_flags,
};
use tracing::{debug, info, warn};

use super::{
    EbpfSource, Registry, Shared, attach, err,
    refresh::{next_refresh_tag, refresh_kernel_side},
};
use crate::{
    cgroups::CgroupFs,
    signals::{
        SignalError,
        btf::Btf,
        kfunc, layout,
        mapped::MappedArray,
        node, page_size,
        plans::PlanTable,
        probe::{self, KernelFeatures, MarkVictim, MemoryStrategy},
        ring::{self, ReaderScheduling},
    },
};

/// The kernel programs, built by the agent's build script.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/swiftlet-ebpf.o"));

/// The embedded object.
pub fn object() -> &'static [u8] {
    OBJECT
}

/// Hands back the pages of the binary that hold the embedded object, once
/// it is copied for the loader: a megabyte the agent reads once at start
/// and would otherwise keep mapped for its whole life. The pages stay in
/// the page cache, and a later read of `OBJECT` maps them again.
fn release_embedded_pages() {
    let page = rustix::param::page_size();
    let start = (OBJECT.as_ptr() as usize).next_multiple_of(page);
    let end = (OBJECT.as_ptr() as usize + OBJECT.len()) / page * page;
    if end <= start {
        return;
    }
    // SAFETY: [start, end) is whole pages inside OBJECT, a read-only
    // private mapping of the binary that nothing writes. MADV_DONTNEED on
    // such a mapping only unmaps the pages: the next read of any byte in
    // the range maps the same bytes again from the file, so every
    // reference to OBJECT stays valid.
    let released = unsafe { rustix::mm::madvise(start as *mut std::ffi::c_void, end - start, Advice::LinuxDontNeed) };
    if let Err(e) = released {
        debug!("cannot release the embedded object's pages: {e}");
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
    /// figures and line, far from the line; `None` is the kernel's charge
    /// batch ([`NODE_MEMORY_BATCH`]). An observer that must see the node's
    /// line crossed at the very page (the eviction race) uses 1.
    pub node_memory_batch: Option<u32>,
    /// Run the ring buffer's reader thread under SCHED_FIFO at this
    /// priority (1..=99): the eviction fast path kills on that thread, and
    /// on a node whose cores are busy it would otherwise wait its turn.
    pub reader_priority: Option<u8>,
    /// Run the reader thread under SCHED_IDLE instead, so that its
    /// wake-ups never preempt a running task: for an observer whose records
    /// may wait (the eviction race's), which must not delay the very
    /// process whose death it times.
    pub reader_idle: bool,
    /// Commit records without waking the reader, which drains the ring
    /// every few milliseconds instead: for an observer that needs its
    /// records only after the fact (the eviction race's). A wake-up is an
    /// irq_work raised by a self-IPI on the CPU of the event, which in a VM
    /// is an exit to the host, inside the very path the observer times.
    pub records_wait: bool,
}

/// The object's load-time constants (its `static` globals), each named as
/// the kernel programs declare it.
struct Globals {
    layout: KernelLayout,
    exit_has_group_dead: u32,
    mark_victim_pid_only: u32,
    log_level: u8,
    agent_tgid: u32,
    pidns_dev: u64,
    pidns_ino: u64,
    refresh_tag: u32,
    node_memory_batch: u32,
    node_line_slack: u64,
    records_wake_reader: u32,
    signal_task: u32,
}

impl Globals {
    fn new(
        btf: &Btf,
        layout: KernelLayout,
        features: &KernelFeatures,
        opts: &EbpfOptions,
        kfuncs: &kfunc::Patched,
    ) -> Result<Globals, SignalError> {
        let (pidns_dev, pidns_ino) =
            pid_namespace().map_err(|e| err("the agent's pid namespace (/proc/self/ns/pid)", e))?;
        let node_memory_batch = opts.node_memory_batch.unwrap_or(NODE_MEMORY_BATCH).max(1);
        Ok(Globals {
            layout,
            // sched_process_exit gained `group_dead` in 6.13.
            exit_has_group_dead: u32::from(btf.tracepoint_args("sched_process_exit").unwrap_or(1) >= 2),
            mark_victim_pid_only: u32::from(features.mark_victim == Some(MarkVictim::Pid)),
            log_level: if opts.kernel_log { 0xff } else { 0 },
            agent_tgid: std::process::id(),
            pidns_dev,
            pidns_ino,
            refresh_tag: next_refresh_tag(),
            node_memory_batch,
            node_line_slack: node_line_slack(node_memory_batch, kernel_stat_threshold(), possible_cpus()),
            records_wake_reader: u32::from(!opts.records_wait),
            signal_task: u32::from(kfuncs.all_resolved()),
        })
    }

    /// Sets every constant on the loader (all must exist in the object but
    /// the aya-log level, which is there only when the programs log).
    fn apply<'a>(&'a self, loader: &mut EbpfLoader<'a>) {
        loader
            .override_global("LAYOUT", &self.layout, true)
            .override_global("EXIT_HAS_GROUP_DEAD", &self.exit_has_group_dead, true)
            .override_global("MARK_VICTIM_PID_ONLY", &self.mark_victim_pid_only, true)
            .override_global("AYA_LOG_LEVEL", &self.log_level, false)
            .override_global("AGENT_TGID", &self.agent_tgid, true)
            .override_global("AGENT_PIDNS_DEV", &self.pidns_dev, true)
            .override_global("AGENT_PIDNS_INO", &self.pidns_ino, true)
            .override_global("REFRESH_TAG", &self.refresh_tag, true)
            .override_global("NODE_MEMORY_BATCH", &self.node_memory_batch, true)
            .override_global("NODE_LINE_SLACK", &self.node_line_slack, true)
            .override_global("RECORDS_WAKE_READER", &self.records_wake_reader, true)
            .override_global("SIGNAL_TASK", &self.signal_task, true);
    }
}

/// The maps the agent keeps, taken out of the loaded object.
struct Maps {
    slots: MappedArray<CgroupSlot>,
    control: MappedArray<Control>,
    plans: MappedArray<VictimPlan>,
    cgroup_slot: BpfHashMap<MapData, u64, u32>,
    watch_exit: BpfHashMap<MapData, u32, u32>,
    ring: RingBuf<MapData>,
    proc_cpu: PerCpuArray<MapData, ProcCpu>,
    node_pending: PerCpuArray<MapData, NodePending>,
}

impl Maps {
    fn take(ebpf: &mut Ebpf) -> Result<Maps, SignalError> {
        let mut take = |name: &str| ebpf.take_map(name).ok_or_else(|| err(name, "map missing"));
        Ok(Maps {
            slots: mapped(take("SLOTS")?, "SLOTS", MAX_SLOTS)?,
            control: mapped(take("CONTROL")?, "CONTROL", 1)?,
            plans: mapped(take("PLANS")?, "PLANS", MAX_PLANS)?,
            cgroup_slot: BpfHashMap::try_from(take("CGROUP_SLOT")?).map_err(|e| err("CGROUP_SLOT", e))?,
            watch_exit: BpfHashMap::try_from(take("WATCH_EXIT")?).map_err(|e| err("WATCH_EXIT", e))?,
            ring: RingBuf::try_from(take("EVENTS")?).map_err(|e| err("EVENTS", e))?,
            proc_cpu: PerCpuArray::try_from(take("PROC_CPU")?).map_err(|e| err("PROC_CPU", e))?,
            node_pending: PerCpuArray::try_from(take("NODE_PENDING")?).map_err(|e| err("NODE_PENDING", e))?,
        })
    }
}

/// Maps an array map of `len` entries into memory. The mapping keeps the
/// map alive on its own; the map's handle can go.
fn mapped<T>(map: Map, name: &str, len: u32) -> Result<MappedArray<T>, SignalError> {
    let Map::Array(data) = &map else {
        return Err(err(name, "not an array"));
    };
    MappedArray::new(data, len as usize).map_err(|e| err(&format!("mmap {name}"), e))
}

impl EbpfSource {
    /// Loads and attaches the kernel programs. Fails (and the caller falls
    /// back to cgroupfs) when there is no BTF, no CAP_BPF, or the verifier
    /// rejects a program.
    pub fn load(cgroupfs: CgroupFs, opts: &EbpfOptions) -> Result<EbpfSource, SignalError> {
        if opts.force_load_failure {
            return Err(SignalError::Ebpf("load failure forced by --ebpf-force-failure".into()));
        }
        let mut object = match &opts.object {
            Some(p) => std::fs::read(p).map_err(|e| err(&p.display().to_string(), e))?,
            None => {
                let copy = OBJECT.to_vec();
                release_embedded_pages();
                copy
            }
        };
        // aya's loader parses the kernel's BTF when it is made; that parse
        // goes before ours is made, so that one is in memory at a time.
        let mut loader = EbpfLoader::new();
        loader.btf(None);
        let btf = Btf::from_sys_fs().map_err(|e| err("kernel BTF", e))?;
        let (layout, held_back_missing) = layout::kernel_layout_explained(&btf).map_err(|e| err("kernel layout", e))?;
        if let Some(why) = held_back_missing {
            warn!(
                %why,
                "the node's memory is read without the pages each CPU holds back: near the node's line, \
                 a crossing may be seen only when a CPU folds them in"
            );
        }

        // Feature probes: what this kernel offers, and from that the
        // strategies to try per signal, most exact first.
        let features = KernelFeatures::from_btf(&btf, &layout);
        let (memory_candidates, refused) = probe::memory_candidates(&features, opts.memory_strategy);
        let passed_over: Vec<String> = refused.iter().map(|(s, why)| format!("{s}: {why}")).collect();
        if memory_candidates.is_empty() {
            return Err(err("memory", format!("no eBPF strategy works on this kernel: {}", passed_over.join("; "))));
        }
        if !features.process_tracepoints {
            return Err(err("processes", "no BTF tracepoints sched_process_fork/exit and cgroup_attach_task"));
        }

        // The kfunc calls made real where this kernel has the functions.
        let kfuncs = kfunc::patch(&mut object, &btf).map_err(|e| err("patching the object's kfunc calls", e))?;
        let globals = Globals::new(&btf, layout, &features, opts, &kfuncs)?;
        loader.btf(Some(btf.aya())).map_max_entries("PROCS", proc_table_entries(node::pid_max()));
        globals.apply(&mut loader);
        let mut ebpf = loader.load(&object).map_err(|e| err("loading the object", e))?;
        drop(loader);
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

        let (mut strategies, program_names) =
            attach::attach_all(&mut ebpf, btf.aya(), &features, memory_candidates, passed_over)?;
        if kfuncs.all_resolved() {
            strategies.kill = probe::KILL_SIGNAL_TASK;
        } else {
            let missing: Vec<&str> =
                kfuncs.calls.iter().filter(|(_, id)| id.is_none()).map(|(name, _)| name.as_str()).collect();
            strategies.passed_over.push(format!("kill {}: the kernel lacks {missing:?}", probe::KILL_SIGNAL_TASK));
        }
        let maps = Maps::take(&mut ebpf)?;
        let shared = Arc::new(Shared {
            slots: maps.slots,
            control: maps.control,
            registry: RwLock::new(Registry { free: (1..MAX_SLOTS).rev().collect(), ..Default::default() }),
            sink: RwLock::new(None),
            events_received: AtomicU64::new(0),
            events_undecodable: AtomicU64::new(0),
            unknown_cgroup_events: AtomicU64::new(0),
        });
        let page = page_size();
        let memory_strategy = match strategies.memory {
            MemoryStrategy::StatTracepoint => swiftlet_common::memory_strategy::STAT_EVENTS,
            MemoryStrategy::PageCounter(_) => swiftlet_common::memory_strategy::PAGE_COUNTER,
        };
        let c = shared.control.at(0);
        // SAFETY: `c` points into the control block, mapped for as long as
        // `shared` lives; these fields are the agent's to write (the kernel
        // only reads them), written through raw pointers, never references.
        unsafe {
            std::ptr::write_volatile(&raw mut (*c).kernel_eviction, u32::from(opts.kernel_eviction));
            std::ptr::write_volatile(&raw mut (*c).memory_strategy, memory_strategy);
        }
        // The node's memory figures come from the kernel's per-node
        // statistics when their layout is known, else from deltas on a seed.
        let node_from_deltas = !features.node_stat;
        seed_node(&shared, &cgroupfs, page, node_from_deltas, globals.refresh_tag);

        let stop: OwnedFd =
            rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).map_err(|e| SignalError::Io(e.into()))?;
        let reader_stop = stop.try_clone()?;
        let reader_shared = shared.clone();
        let scheduling = match (opts.reader_idle, opts.reader_priority) {
            (true, _) => ReaderScheduling::Idle,
            (false, Some(p)) => ReaderScheduling::Realtime(p),
            (false, None) => ReaderScheduling::Normal,
        };
        let ring = maps.ring;
        let records_wait = opts.records_wait;
        let reader = std::thread::Builder::new()
            .name("swiftlet-ringbuf".into())
            .spawn(move || ring::read_events(ring, reader_stop, reader_shared, page, scheduling, records_wait))?;
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
            cgroup_slot: Mutex::new(maps.cgroup_slot),
            plans: PlanTable::new(maps.plans),
            refresh_tag: globals.refresh_tag,
            watch_exit: Mutex::new(maps.watch_exit),
            proc_cpu: Mutex::new(maps.proc_cpu),
            node_pending: Mutex::new(maps.node_pending),
            node_from_deltas,
            strategies,
            program_names,
            stop,
            reader: Some(reader),
            kernel_log,
            ebpf: Mutex::new(ebpf),
        })
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
    let cgroup_id = cgroupfs.cgroup_id("").unwrap_or(0);
    // SAFETY: `s` is in bounds of the slot mapping, which lives as long as
    // `shared`; the kernel only reads the id and flags, and changes the
    // aligned counters atomically, as the agent does here.
    unsafe {
        std::ptr::write_volatile(&raw mut (*s).cgroup_id, cgroup_id);
        std::ptr::write_volatile(&raw mut (*s).flags, slot_flags::ACTIVE | slot_flags::NODE);
        AtomicI64::from_ptr(&raw mut (*s).processes).fetch_add(tasks as i64, Ordering::SeqCst);
    }
    if node_from_deltas {
        let stat = cgroupfs.memory_stat("").unwrap_or_default();
        // SAFETY: as above: in bounds, mapped, aligned, changed atomically.
        unsafe {
            AtomicI64::from_ptr(&raw mut (*s).usage_pages)
                .fetch_add(((stat.anon + stat.file) / page) as i64, Ordering::SeqCst);
            AtomicI64::from_ptr(&raw mut (*s).inactive_file_pages)
                .fetch_add((stat.inactive_file / page) as i64, Ordering::SeqCst);
        }
    } else {
        refresh_kernel_side(refresh_tag, 1);
    }
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

/// How close to the node's memory line (in pages) the programs add every
/// page at once: the most by which the node's figure, as one CPU sees it,
/// can be behind the figure an observer reading the kernel at every page
/// crosses the line with. On each CPU that is this agent's own `batch`
/// plus the swing of the kernel's own lag: each of the three per-node
/// counters the working set is made of (anon, file, inactive file) is
/// behind by up to a stat `threshold` per CPU either way, and a fold moves
/// it by a whole threshold at one page, so between two of the agent's
/// reads the working set's lag can swing by six thresholds per CPU.
fn node_line_slack(batch: u32, threshold: u64, cpus: u64) -> u64 {
    (u64::from(batch) + 6 * threshold) * cpus
}

/// The kernel's largest per-CPU vm statistics threshold (`vm stats
/// threshold` in /proc/zoneinfo), the pages a CPU holds back from the
/// per-node counters; the kernel's ceiling (125) when it cannot be read.
fn kernel_stat_threshold() -> u64 {
    std::fs::read_to_string("/proc/zoneinfo").ok().and_then(|z| largest_stat_threshold(&z)).unwrap_or(125)
}

fn largest_stat_threshold(zoneinfo: &str) -> Option<u64> {
    zoneinfo.lines().filter_map(|l| l.trim().strip_prefix("vm stats threshold:")?.trim().parse().ok()).max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_line_slack_covers_the_agents_batch_and_the_kernels_lag() {
        let zoneinfo = "Node 0, zone      DMA\n  pages free     3840\n  pagesets\n    cpu: 0\n              count: 0\n  \
                        vm stats threshold: 4\nNode 0, zone   Normal\n    cpu: 1\n  vm stats threshold: 36\n";
        assert_eq!(largest_stat_threshold(zoneinfo), Some(36));
        assert_eq!(largest_stat_threshold("Node 0, zone DMA\n"), None);
        // 64 pages of this agent's batch and 6 × 36 of the kernel's, per CPU.
        assert_eq!(node_line_slack(64, 36, 2), 560);
        // A batch of one (the race's observer) still covers the kernel's lag.
        assert_eq!(node_line_slack(1, 36, 2), 434);
    }

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
