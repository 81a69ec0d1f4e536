//! Feature probes: which attach points the running kernel offers, and from
//! them, per signal, the strategies to try in order of exactness.
//!
//! Kernels differ in what they let a program see. The memcg statistics
//! tracepoints exist on recent kernels only (6.18 has them; Debian's 6.1
//! and 6.12 do not), fentry/fexit need BPF trampolines (refused on some
//! sandboxed hosts), the multi-gen LRU changes which functions see LRU
//! moves, and tracepoints change their arguments. [`KernelFeatures`] is
//! what the loader found; [`memory_candidates`] and friends are the pure
//! decision, tested below on the kernels we know. The loader then tries the
//! candidates in order and keeps the first that loads and attaches.

use std::fmt;

use swiftlet_common::KernelLayout;

use super::btf::Btf;

/// How the memory working set is kept in the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryStrategy {
    /// tp_btf `memcg/mod_memcg_lruvec_state`: every memcg statistics update
    /// (anon, file, inactive_file); the page counter is read at each.
    StatTracepoint,
    /// fexit on the page counter's charge and uncharge; inactive file pages
    /// from the hook named.
    PageCounter(InactiveHook),
}

/// Where inactive file pages come from with [`MemoryStrategy::PageCounter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InactiveHook {
    /// fentry `mem_cgroup_update_lru_size`: classic LRU list size changes.
    UpdateLruSize,
    /// fentry `__mod_lruvec_state`, NR_INACTIVE_FILE only: every LRU size
    /// update, the multi-gen LRU's included.
    ModLruvecState,
}

impl MemoryStrategy {
    /// Every strategy, most preferred first.
    pub const ALL: [MemoryStrategy; 3] = [
        MemoryStrategy::StatTracepoint,
        MemoryStrategy::PageCounter(InactiveHook::UpdateLruSize),
        MemoryStrategy::PageCounter(InactiveHook::ModLruvecState),
    ];

    /// The name used in the log line, the metric and `--ebpf-memory-strategy`.
    pub fn name(self) -> &'static str {
        match self {
            MemoryStrategy::StatTracepoint => "tp_btf:mod_memcg_lruvec_state",
            MemoryStrategy::PageCounter(InactiveHook::UpdateLruSize) => {
                "fexit:page_counter+fentry:mem_cgroup_update_lru_size"
            }
            MemoryStrategy::PageCounter(InactiveHook::ModLruvecState) => "fexit:page_counter+fentry:__mod_lruvec_state",
        }
    }

    pub fn from_name(name: &str) -> Option<MemoryStrategy> {
        MemoryStrategy::ALL.into_iter().find(|s| s.name() == name)
    }
}

impl fmt::Display for MemoryStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How `oom:mark_victim` identifies the victim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkVictim {
    /// `mark_victim(struct task_struct *task, uid_t uid)` (6.8 and later
    /// upstream).
    Task,
    /// `mark_victim(int pid)`: the victim's cgroup comes from the table of
    /// processes counted in registered cgroups.
    Pid,
}

/// What the running kernel offers the signal programs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelFeatures {
    /// BTF tracepoint `mod_memcg_lruvec_state`.
    pub memcg_tracepoint: bool,
    /// `page_counter_try_charge`, `page_counter_charge` and
    /// `page_counter_uncharge` are BTF functions, and the structs they need
    /// were found.
    pub page_counter: bool,
    /// `mem_cgroup_update_lru_size` is a BTF function.
    pub update_lru_size: bool,
    /// `__mod_lruvec_state` is a BTF function.
    pub mod_lruvec_state: bool,
    /// The multi-gen LRU is on (`/sys/kernel/mm/lru_gen/enabled` bit 0).
    pub lru_gen: bool,
    /// The path from a memory cgroup to the kernel's per-node statistics is
    /// known (BTF), for at most `MAX_NUMA_NODES` nodes.
    pub node_stat: bool,
    /// BTF tracepoints sched_process_fork, sched_process_exit and
    /// cgroup_attach_task.
    pub process_tracepoints: bool,
    /// The form of `mark_victim`, None without that BTF tracepoint.
    pub mark_victim: Option<MarkVictim>,
    /// Tracepoints ext4/ext4_allocate_inode and ext4_free_inode (tracefs).
    pub ext4_tracepoints: bool,
}

impl KernelFeatures {
    /// Reads BTF and sysfs.
    pub fn from_btf(btf: &Btf, layout: &KernelLayout) -> KernelFeatures {
        KernelFeatures {
            memcg_tracepoint: btf.tracepoint_args("mod_memcg_lruvec_state").is_some(),
            page_counter: layout.charge_valid == 1
                && ["page_counter_try_charge", "page_counter_charge", "page_counter_uncharge"]
                    .iter()
                    .all(|f| btf.has_func(f)),
            update_lru_size: btf.has_func("mem_cgroup_update_lru_size"),
            mod_lruvec_state: btf.has_func("__mod_lruvec_state"),
            lru_gen: lru_gen_enabled(),
            node_stat: layout.nr_node_ids != 0,
            process_tracepoints: ["sched_process_fork", "sched_process_exit", "cgroup_attach_task"]
                .iter()
                .all(|t| btf.tracepoint_args(t).is_some()),
            mark_victim: btf
                .tracepoint_arg_is_pointer("mark_victim", 0)
                .map(|ptr| if ptr { MarkVictim::Task } else { MarkVictim::Pid }),
            ext4_tracepoints: ["ext4_allocate_inode", "ext4_free_inode"]
                .iter()
                .all(|t| tracefs_event_exists("ext4", t)),
        }
    }
}

/// True when the multi-gen LRU is enabled (the file holds a hex mask; bit
/// 0 is the main switch). Absent on kernels built without it.
pub fn lru_gen_enabled() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/lru_gen/enabled").is_ok_and(|s| parse_lru_gen(&s))
}

fn parse_lru_gen(s: &str) -> bool {
    let t = s.trim().trim_start_matches("0x");
    u32::from_str_radix(t, 16).is_ok_and(|v| v & 1 == 1)
}

fn tracefs_event_exists(category: &str, name: &str) -> bool {
    ["/sys/kernel/tracing/events", "/sys/kernel/debug/tracing/events"]
        .iter()
        .any(|base| std::path::Path::new(base).join(category).join(name).is_dir())
}

/// Memory strategies to try, most exact first, and why the others are out.
/// `forced` limits the choice to one strategy (tests, benchmarks,
/// `--ebpf-memory-strategy`), which is still refused when this kernel cannot
/// support it exactly.
pub fn memory_candidates(
    f: &KernelFeatures,
    forced: Option<MemoryStrategy>,
) -> (Vec<MemoryStrategy>, Vec<(MemoryStrategy, &'static str)>) {
    let mut ok = vec![];
    let mut out = vec![];
    for s in MemoryStrategy::ALL {
        if forced.is_some_and(|x| x != s) {
            continue;
        }
        let refusal = match s {
            MemoryStrategy::StatTracepoint if !f.memcg_tracepoint => Some("no memcg/mod_memcg_lruvec_state tracepoint"),
            MemoryStrategy::StatTracepoint => None,
            MemoryStrategy::PageCounter(_) if !f.page_counter => {
                Some("no page_counter_{try_charge,charge,uncharge} in BTF, or struct layout unknown")
            }
            MemoryStrategy::PageCounter(_) if !f.node_stat => Some(
                "the node's statistics are out of reach: mem_cgroup.nodeinfo, lruvec.pgdat or pglist_data.vm_stat not in BTF, or more than 8 NUMA nodes",
            ),
            MemoryStrategy::PageCounter(InactiveHook::UpdateLruSize) if !f.update_lru_size => {
                Some("no mem_cgroup_update_lru_size in BTF")
            }
            MemoryStrategy::PageCounter(InactiveHook::UpdateLruSize) if f.lru_gen => {
                Some("the multi-gen LRU is on, and its moves bypass mem_cgroup_update_lru_size")
            }
            MemoryStrategy::PageCounter(InactiveHook::ModLruvecState) if !f.mod_lruvec_state => {
                Some("no __mod_lruvec_state in BTF")
            }
            MemoryStrategy::PageCounter(_) => None,
        };
        match refusal {
            Some(why) => out.push((s, why)),
            None => ok.push(s),
        }
    }
    (ok, out)
}

/// The name of the OOM-victim strategy, None when there is no way.
pub fn oom_strategy(f: &KernelFeatures) -> Option<&'static str> {
    match f.mark_victim? {
        MarkVictim::Task => Some("tp_btf:mark_victim(task)"),
        MarkVictim::Pid => Some("tp_btf:mark_victim(pid)+process table"),
    }
}

pub const PROCESSES: &str = "tp_btf:sched_process_fork/exit+cgroup_attach_task";
pub const INODES_EXT4: &str = "tracepoint:ext4_allocate_inode/free_inode";
pub const NONE: &str = "none";
/// The in-kernel kill, on every supported kernel: the allocating task at
/// the crossing, the victim's other tasks at their next charge, and the
/// whole cgroup by the agent once it reads the kill record.
pub const KILL_HELPER: &str =
    "helper:bpf_send_signal (current task; doomed tasks on their next charge; cgroup by the agent)";
/// The in-kernel kill where the kernel has `bpf_send_signal_task` (6.13
/// and later): as [`KILL_HELPER`], and a victim doomed from outside its
/// context (asleep at a statistics fold, or another pod allocating) has its
/// planned process signalled at once.
pub const KILL_SIGNAL_TASK: &str = "helper:bpf_send_signal + kfunc:bpf_send_signal_task (current task, or the \
     planned process when the crossing is outside the victim's context; doomed tasks on their next charge; cgroup by the agent)";

#[cfg(test)]
mod tests {
    use super::*;

    /// This host: 6.18 with the memcg tracepoints and classic LRU.
    fn host_618() -> KernelFeatures {
        KernelFeatures {
            memcg_tracepoint: true,
            page_counter: true,
            update_lru_size: true,
            mod_lruvec_state: true,
            lru_gen: false,
            node_stat: true,
            process_tracepoints: true,
            mark_victim: Some(MarkVictim::Task),
            ext4_tracepoints: true,
        }
    }

    /// Debian's 6.1 cloud kernel: no memcg tracepoints, classic LRU.
    fn debian_61() -> KernelFeatures {
        KernelFeatures { memcg_tracepoint: false, mark_victim: Some(MarkVictim::Pid), ..host_618() }
    }

    /// Debian's 6.12 cloud kernel: no memcg tracepoints, multi-gen LRU on.
    fn debian_612() -> KernelFeatures {
        KernelFeatures { lru_gen: true, ..debian_61() }
    }

    use InactiveHook::*;
    use MemoryStrategy::*;

    #[test]
    fn memory_strategies_per_kernel() {
        let table: [(&str, KernelFeatures, Vec<MemoryStrategy>); 5] = [
            (
                "6.18: the tracepoint first, both fallbacks behind it",
                host_618(),
                vec![StatTracepoint, PageCounter(UpdateLruSize), PageCounter(ModLruvecState)],
            ),
            (
                "6.1: page counter, classic LRU hook first",
                debian_61(),
                vec![PageCounter(UpdateLruSize), PageCounter(ModLruvecState)],
            ),
            ("6.12: MGLRU rules out mem_cgroup_update_lru_size", debian_612(), vec![PageCounter(ModLruvecState)]),
            (
                "no path to the node's statistics: only the tracepoint",
                KernelFeatures { node_stat: false, ..host_618() },
                vec![StatTracepoint],
            ),
            ("nothing at all", KernelFeatures { memcg_tracepoint: false, page_counter: false, ..host_618() }, vec![]),
        ];
        for (what, f, want) in table {
            let (got, refused) = memory_candidates(&f, None);
            assert_eq!(got, want, "{what}");
            assert_eq!(got.len() + refused.len(), MemoryStrategy::ALL.len(), "{what}: every strategy accounted for");
        }
    }

    #[test]
    fn forcing_a_strategy_keeps_the_refusal() {
        let (got, refused) = memory_candidates(&debian_612(), Some(PageCounter(UpdateLruSize)));
        assert!(got.is_empty());
        assert_eq!(refused.len(), 1);
        assert!(refused[0].1.contains("multi-gen LRU"), "{}", refused[0].1);
        let (got, refused) = memory_candidates(&debian_61(), Some(PageCounter(ModLruvecState)));
        assert_eq!(got, vec![PageCounter(ModLruvecState)]);
        assert!(refused.is_empty());
    }

    #[test]
    fn names_round_trip() {
        for s in MemoryStrategy::ALL {
            assert_eq!(MemoryStrategy::from_name(s.name()), Some(s));
        }
        assert_eq!(MemoryStrategy::from_name("kprobe:whatever"), None);
    }

    #[test]
    fn oom_forms() {
        assert_eq!(oom_strategy(&host_618()), Some("tp_btf:mark_victim(task)"));
        assert_eq!(oom_strategy(&debian_61()), Some("tp_btf:mark_victim(pid)+process table"));
        assert_eq!(oom_strategy(&KernelFeatures::default()), None);
    }

    #[test]
    fn lru_gen_mask() {
        for (text, on) in
            [("0x0007\n", true), ("0x0000\n", false), ("0x0001", true), ("0x0006", false), ("junk", false)]
        {
            assert_eq!(parse_lru_gen(text), on, "{text:?}");
        }
    }
}
