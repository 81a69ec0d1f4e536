//! The benchmark harness: each bench returns figures (with unit, sample
//! count, and p50/p99/max for distributions), tables and plots; the runner
//! writes target/bench/report.md, results.json and the SVG plots.
//!
//! Comparisons are ratios of figures measured side by side in the same run:
//! this machine is shared and noisy, so absolute numbers drift between runs
//! while ratios hold.

pub mod kernels;
pub mod pods;
pub mod pods_pvc;
pub mod race;
pub mod server;
pub mod signals;
pub mod svg;

use std::{fmt::Write as _, path::PathBuf};

use serde::Serialize;

/// What a bench needs from the runner.
pub struct Ctx {
    /// Short runs for smoke checks.
    pub quick: bool,
    /// Where plots go.
    pub out: PathBuf,
}

impl Ctx {
    /// `full` normally, `quick` with --quick.
    pub fn pick<T>(&self, full: T, quick: T) -> T {
        if self.quick { quick } else { full }
    }
}

/// The fewest samples a p99 is reported over: with fewer, the 99th
/// percentile by nearest rank is the maximum (or next to it), and the
/// figure says max only.
pub const MIN_SAMPLES_FOR_P99: usize = 200;

#[derive(Clone, Debug, Serialize)]
pub struct Figure {
    pub name: String,
    pub unit: String,
    pub samples: usize,
    /// Set for distributions.
    pub p50: Option<f64>,
    /// Only over [`MIN_SAMPLES_FOR_P99`] samples or more.
    pub p99: Option<f64>,
    pub max: Option<f64>,
    /// Set for single values (ratios, averages).
    pub value: Option<f64>,
}

impl Figure {
    /// A distribution's summary. `samples` need not be sorted.
    pub fn distribution(name: impl Into<String>, unit: &str, samples: &[f64]) -> Figure {
        let mut s = samples.to_vec();
        s.sort_by(|a, b| a.total_cmp(b));
        Figure {
            name: name.into(),
            unit: unit.into(),
            samples: s.len(),
            p50: percentile(&s, 0.50),
            p99: if s.len() >= MIN_SAMPLES_FOR_P99 { percentile(&s, 0.99) } else { None },
            max: s.last().copied(),
            value: None,
        }
    }

    pub fn value(name: impl Into<String>, unit: &str, samples: usize, value: f64) -> Figure {
        Figure { name: name.into(), unit: unit.into(), samples, p50: None, p99: None, max: None, value: Some(value) }
    }
}

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

pub fn median(samples: &[f64]) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    percentile(&s, 0.5).unwrap_or(f64::NAN)
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Table {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// What a result was measured with: the commit and build the binary came
/// from, and how loaded the machine was (the load averages before and
/// after the bench, and in a VM the share of its CPU time the hypervisor
/// gave to others while the bench ran, which no load average shows).
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunContext {
    pub commit: String,
    pub profile: String,
    pub load_before: String,
    pub load_after: String,
    pub steal: String,
}

impl RunContext {
    /// The commit and profile of this binary (`SWIFTLET_COMMIT` is set by
    /// `cargo xtask bench` when it builds the runner).
    pub fn of_this_build() -> RunContext {
        RunContext {
            commit: option_env!("SWIFTLET_COMMIT").unwrap_or("unknown").to_owned(),
            profile: if cfg!(debug_assertions) { "debug" } else { "release" }.to_owned(),
            ..Default::default()
        }
    }
}

/// The load averages (1, 5, 15 minutes) from /proc/loadavg.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The machine's CPU time so far, from /proc/stat's first line, in ticks:
/// (stolen by the hypervisor, all). None where it cannot be read.
pub fn cpu_times() -> Option<(u64, u64)> {
    parse_cpu_times(&std::fs::read_to_string("/proc/stat").ok()?)
}

fn parse_cpu_times(stat: &str) -> Option<(u64, u64)> {
    let fields: Vec<u64> =
        stat.lines().next()?.strip_prefix("cpu ")?.split_whitespace().map(|f| f.parse().ok()).collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal (guest time is
    // already counted in user and nice).
    let steal = *fields.get(7)?;
    Some((steal, fields.iter().take(8).sum()))
}

/// The stolen share of the CPU time between two [`cpu_times`] readings,
/// as a percentage for the report ("" when either is missing).
pub fn steal_share(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> String {
    match (before, after) {
        (Some((s0, t0)), Some((s1, t1))) if t1 > t0 => {
            format!("{:.1}%", s1.saturating_sub(s0) as f64 * 100.0 / (t1 - t0) as f64)
        }
        _ => String::new(),
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct BenchResult {
    pub name: String,
    pub title: String,
    /// Commit, build and load this result was measured with.
    pub context: RunContext,
    pub figures: Vec<Figure>,
    pub tables: Vec<Table>,
    /// Plot file names, relative to the output directory.
    pub plots: Vec<String>,
    pub notes: Vec<String>,
}

pub type BenchFn = fn(&Ctx) -> anyhow::Result<BenchResult>;

/// Every bench, in report order.
pub fn all() -> Vec<(&'static str, &'static str, BenchFn)> {
    vec![
        ("signal-latency", "kernel crossing → agent receipt latency, idle and loaded", signals::latency),
        ("snapshot-cost", "one snapshot of 110 pod cgroups: BPF maps vs cgroupfs", signals::snapshot_cost),
        ("program-cost", "per-program cost from kernel.bpf_stats_enabled", signals::program_cost),
        ("overhead", "workload slowdown with the programs attached vs detached", signals::overhead),
        (
            "eviction-race",
            "memory hog vs eviction on allocatable: crossing → victim dead, per mode and ramp rate",
            race::race,
        ),
        (
            "eviction-race-node",
            "the same race on node memory.available with earlyoom (locks most of RAM: run it alone)",
            race::race_node,
        ),
        (
            "eviction-busy",
            "the userspace kill with both cores busy: reader thread in the normal scheduler vs SCHED_FIFO",
            race::busy,
        ),
        (
            "eviction-race-cache",
            "a cache pod's hot page cache crosses the line, a hog starts later: evictions per mode (cgroup v2 VM)",
            race::race_cache,
        ),
        ("pod-start", "pod start latency vs the same CRI calls made directly", pods::pod_start),
        ("pods-110", "110 pause pods started, listed, deleted; agent RSS and idle CPU", pods::pods_110),
        (
            "pods-110-pvc",
            "pods-110 through the API server, a tenth of the pods with a provisioned CSI claim; RSS and idle CPU",
            pods_pvc::pods_110_pvc,
        ),
        (
            "kernel-matrix",
            "per kernel: crossing → decision and → dead per signal mode, as ratios to cgroupfs polling",
            kernels::kernels,
        ),
        (
            "kubelet-api",
            "/metrics, /metrics/resource, /stats/summary latency with 110 pods; req/s from a second process",
            server::kubelet_api,
        ),
    ]
}

/// Facts about the machine, for the report header.
pub fn machine() -> Vec<(String, String)> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| l.strip_prefix("model name").map(|r| r.trim_start_matches([' ', '\t', ':']).to_owned()))
        .unwrap_or_else(|| "unknown".into());
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_owned();
    let mem = swiftlet::signals::node::mem_total()
        .map(|b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64))
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map(|n| n.get().to_string()).unwrap_or_default();
    let cgroup = swiftlet::cgroups::CgroupFs::detect().map(|c| format!("{:?}", c.version())).unwrap_or_default();
    vec![
        ("kernel".into(), kernel),
        ("cpu".into(), cpu),
        ("cores".into(), cores),
        ("memory".into(), mem),
        ("cgroup".into(), cgroup),
    ]
}

fn fmt_num(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// The Markdown report.
pub fn render(results: &[BenchResult], quick: bool, date: &str) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# swiftlet benchmarks\n");
    let _ =
        writeln!(md, "Run {date}{}.\n", if quick { " in --quick mode (few samples; smoke check only)" } else { "" });
    let _ = writeln!(md, "| machine | |\n|---|---|");
    for (k, v) in machine() {
        let _ = writeln!(md, "| {k} | {v} |");
    }
    for r in results {
        let _ = writeln!(md, "\n## {}\n\n{}\n", r.name, r.title);
        let c = &r.context;
        let _ = writeln!(
            md,
            "Measured with commit {}, {} build, load average {} before and {} after, \
             CPU time stolen by the hypervisor during the bench {}.\n",
            if c.commit.is_empty() { "unknown" } else { &c.commit },
            if c.profile.is_empty() { "unknown" } else { &c.profile },
            if c.load_before.is_empty() { "unknown" } else { &c.load_before },
            if c.load_after.is_empty() { "unknown" } else { &c.load_after },
            if c.steal.is_empty() { "unknown" } else { &c.steal },
        );
        if !r.figures.is_empty() {
            let _ =
                writeln!(md, "| figure | unit | samples | p50 | p99 | max | value |\n|---|---|---|---|---|---|---|");
            for f in &r.figures {
                let o = |v: Option<f64>| v.map(fmt_num).unwrap_or_default();
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} |",
                    f.name,
                    f.unit,
                    f.samples,
                    o(f.p50),
                    o(f.p99),
                    o(f.max),
                    o(f.value)
                );
            }
        }
        for t in &r.tables {
            let _ = writeln!(md, "\n| {} |\n|{}", t.header.join(" | "), "---|".repeat(t.header.len()));
            for row in &t.rows {
                let _ = writeln!(md, "| {} |", row.join(" | "));
            }
        }
        for p in &r.plots {
            let _ = writeln!(md, "\n![{p}]({p})");
        }
        for n in &r.notes {
            let _ = writeln!(md, "\n- {n}");
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&s, 0.5), Some(50.0));
        assert_eq!(percentile(&s, 0.99), Some(99.0));
        assert_eq!(percentile(&s, 1.0), Some(100.0));
        assert_eq!(percentile(&[], 0.5), None);
        let f = Figure::distribution("x", "µs", &[3.0, 1.0, 2.0]);
        assert_eq!((f.p50, f.max, f.samples), (Some(2.0), Some(3.0), 3));
        // Under 200 samples the p99 would be the maximum: not reported.
        assert_eq!(f.p99, None);
        let f = Figure::distribution("x", "µs", &(1..=199).map(f64::from).collect::<Vec<_>>());
        assert_eq!((f.p99, f.max), (None, Some(199.0)));
        let f = Figure::distribution("x", "µs", &(1..=200).map(f64::from).collect::<Vec<_>>());
        assert_eq!((f.p99, f.max), (Some(198.0), Some(200.0)));
    }

    #[test]
    fn steal_is_the_eighth_field_of_the_machine_line() {
        let stat = "cpu  236963 0 56024 1964875 2435 0 605 48860 0 0\ncpu0 113745 0 28697 986489 853 0 81 25055 0 0\n";
        assert_eq!(parse_cpu_times(stat), Some((48860, 236963 + 56024 + 1964875 + 2435 + 605 + 48860)));
        // Kernels before steal accounting, and garbage, give nothing.
        assert_eq!(parse_cpu_times("cpu  1 2 3 4\n"), None);
        assert_eq!(parse_cpu_times("cpu0 1 2 3 4 5 6 7 8\n"), None);
        assert_eq!(parse_cpu_times("cpu  1 2 x 4 5 6 7 8\n"), None);
    }

    #[test]
    fn the_steal_share_is_of_the_time_between_the_readings() {
        assert_eq!(steal_share(Some((100, 1000)), Some((355, 3000))), "12.8%");
        assert_eq!(steal_share(Some((100, 1000)), Some((100, 1000))), "");
        assert_eq!(steal_share(None, Some((1, 2))), "");
    }
}
