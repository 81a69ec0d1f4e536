//! Loading and attaching the kernel programs, one program or one memory
//! strategy at a time.

use aya::{
    Ebpf,
    programs::{BtfTracePoint, FEntry, FExit, Program, ProgramError, TracePoint},
};

use super::err;
use crate::signals::{
    SignalError,
    probe::{self, InactiveHook, KernelFeatures, MemoryStrategy},
};

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

/// Attaches every program: the first memory strategy that attaches whole
/// (memory is the signal the fast path exists for: without one the eBPF
/// source is not worth having), the process, cgroup, OOM and refresh
/// programs, and the inode programs where ext4's tracepoints exist.
/// Returns the strategies in use and the names of the attached programs.
pub(super) fn attach_all(
    ebpf: &mut Ebpf,
    btf: &aya::Btf,
    features: &KernelFeatures,
    memory_candidates: Vec<MemoryStrategy>,
    mut passed_over: Vec<String>,
) -> Result<(Strategies, Vec<String>), SignalError> {
    let Some(oom) = probe::oom_strategy(features) else {
        return Err(err("OOM kills", "no BTF tracepoint oom/mark_victim"));
    };
    let mut program_names = Vec::new();
    let mut memory = None;
    for candidate in memory_candidates {
        match attach_memory(ebpf, candidate, btf) {
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
        attach_btf_tracepoint(ebpf, prog, tp, btf)?;
        program_names.push(prog.to_owned());
    }
    // The node read again where the kernel folds its per-CPU statistics
    // (idle entry): only where the node comes from those statistics.
    if features.node_stat {
        match attach_btf_tracepoint(ebpf, "node_fold", "cpu_idle", btf) {
            Ok(()) => program_names.push("node_fold".to_owned()),
            Err(e) => passed_over.push(format!("node memory at the kernel's folds: {e}")),
        }
    }
    attach_tp(ebpf, "cgroup_mkdir", "cgroup", "cgroup_mkdir")?;
    attach_tp(ebpf, "cgroup_rmdir", "cgroup", "cgroup_rmdir")?;
    attach_tp(ebpf, "refresh", "syscalls", "sys_enter_getpgid")?;
    program_names.extend(["cgroup_mkdir", "cgroup_rmdir", "refresh"].map(String::from));
    let inodes = if !features.ext4_tracepoints {
        passed_over.push(format!("inodes {}: no ext4 tracepoints", probe::INODES_EXT4));
        probe::NONE
    } else {
        match attach_tp(ebpf, "inode_alloc", "ext4", "ext4_allocate_inode")
            .and_then(|()| attach_tp(ebpf, "inode_free", "ext4", "ext4_free_inode"))
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
    Ok((strategies, program_names))
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
    &'a mut T: TryFrom<&'a mut Program, Error = ProgramError>,
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
    let _ = match ebpf.program_mut(prog) {
        Some(Program::FExit(p)) => p.unload(),
        Some(Program::FEntry(p)) => p.unload(),
        Some(Program::BtfTracePoint(p)) => p.unload(),
        _ => Ok(()),
    };
}
