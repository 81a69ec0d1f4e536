//! The race's tables, plots and targets. Every table counts the runs
//! without a figure apart from those with one, reports a p99 only over
//! 200 runs or more (the maximum otherwise), and takes overshoot from the
//! kernel's peak counter.

use std::collections::HashMap;

use anyhow::Result;
use swiftlet::signals::KillOutcome;

use super::{
    ALLOCATABLE, ALLOCATABLE_THRESHOLD, MIB, Mode, NODE_HEADROOM, NODE_RAMP_TO_LINE, Run, Scenario, ms,
    run::outcome_name,
};
use crate::bench::{BenchResult, Ctx, Figure, MIN_SAMPLES_FOR_P99, Table, median, svg};

pub(super) fn title(scenario: Scenario, fast: usize, slow: usize, no_balloon: bool) -> String {
    match scenario {
        Scenario::Allocatable => format!(
            "A BestEffort hog (oom_score_adj 1000) ramps past allocatableMemory.available<256Mi with kubepods \
             limited to {} MiB (the kernel OOM-kills at the limit) and a Guaranteed pod beside it. Crossing and \
             death are kernel timestamps from an independent observer (its own programs: the line crossing \
             event and the hog's sched_process_exit); overshoot is kubepods' peak usage (the kernel's \
             max_usage_in_bytes / memory.peak) above the line. Modes run interleaved; {fast} runs per rate for \
             the swiftlet modes, {slow} for the others. A p99 is given over {MIN_SAMPLES_FOR_P99} runs or more, \
             the maximum always.",
            ALLOCATABLE / MIB
        ),
        Scenario::Node => format!(
            "The same race on the node-level memory.available, where earlyoom (which only watches \
             MemAvailable) competes. Each is timed from its own line: swiftlet's sits {ramp} MiB below \
             memory.available at the start of each run, earlyoom's -M {ramp} MiB below MemAvailable then, and \
             the bench records when MemAvailable crosses it (every 0.5 ms). Overshoot is the hog pod's peak \
             usage (the kernel's counter) beyond the {ramp} MiB the line allowed it. {} Modes interleaved; \
             {fast} runs per rate for the swiftlet modes, {slow} for the others.",
            if no_balloon {
                "Run without the balloon (SWIFTLET_BENCH_NO_BALLOON, a smoke check): only the modes that stop at \
                 the line, the hog stopping 256 MiB past it."
                    .to_owned()
            } else {
                format!(
                    "A balloon locks all but {} MiB of RAM, and one uncounted run lets memory settle behind it.",
                    NODE_HEADROOM / MIB
                )
            },
            ramp = NODE_RAMP_TO_LINE / MIB
        ),
    }
}

fn fmt(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into())
}

/// "p99 X" over enough runs, else "max X (n runs)".
fn tail(f: &Figure) -> String {
    match (f.p99, f.max) {
        (Some(p99), _) => format!("p99 {}", ms(Some(p99))),
        (None, Some(max)) => format!("max {} ({} runs: too few for a p99)", ms(Some(max)), f.samples),
        _ => "-".into(),
    }
}

pub(super) fn report(ctx: &Ctx, scenario: Scenario, modes: &[Mode], runs: &[Run], out: &mut BenchResult) -> Result<()> {
    let rates = [256u64, 1024];
    let mut table = Table {
        header: [
            "rate",
            "mode",
            "runs",
            "runs with a figure",
            "crossing→dead p50 (ms)",
            "p99 (ms)",
            "max (ms)",
            "overshoot p50 (MiB)",
            "overshoot max (MiB)",
            "kernel OOM kills",
        ]
        .map(String::from)
        .to_vec(),
        rows: vec![],
    };
    let mut outcomes = Table {
        header: ["rate", "in-kernel runs", "executed by the kernel", "refused, by check"].map(String::from).to_vec(),
        rows: vec![],
    };
    let mut lines = Table {
        header: [
            "rate",
            "mode",
            "memory.available crossed, p50 (ms after start)",
            "MemAvailable crossed, p50",
            "MemAvailable − memory.available, p50 / max (ms)",
        ]
        .map(String::from)
        .to_vec(),
        rows: vec![],
    };
    let mut bars = vec![];
    for rate in rates {
        let mut group = vec![];
        let mut p50_of = HashMap::new();
        for &mode in modes {
            let cell: Vec<&Run> = runs.iter().filter(|r| r.mode == mode && r.rate == rate).collect();
            if cell.is_empty() {
                continue;
            }
            let lat: Vec<f64> = cell.iter().filter_map(|r| r.crossing_to_dead_ms).collect();
            let over: Vec<f64> = cell.iter().filter_map(|r| r.overshoot_mib).collect();
            let name = format!("{}: {} at {rate} MiB/s", scenario.label(), mode.label());
            let f = Figure::distribution(format!("{name}: crossing → dead"), "ms", &lat);
            let ooms = cell.iter().filter(|r| r.oom_killed).count();
            table.rows.push(vec![
                format!("{rate} MiB/s"),
                mode.label(),
                cell.len().to_string(),
                lat.len().to_string(),
                fmt(f.p50),
                fmt(f.p99),
                fmt(f.max),
                if over.is_empty() { "-".into() } else { format!("{:.1}", median(&over)) },
                over.iter().copied().reduce(f64::max).map_or("-".into(), |m| format!("{m:.1}")),
                ooms.to_string(),
            ]);
            if mode == Mode::Kernel {
                let executed = cell.iter().filter(|r| r.kernel_outcome == Some(KillOutcome::Executed)).count();
                let mut refused: Vec<(&str, usize)> = vec![];
                for r in cell.iter().filter(|r| r.kernel_outcome != Some(KillOutcome::Executed)) {
                    let n = outcome_name(r.kernel_outcome);
                    match refused.iter_mut().find(|(k, _)| *k == n) {
                        Some((_, c)) => *c += 1,
                        None => refused.push((n, 1)),
                    }
                }
                outcomes.rows.push(vec![
                    format!("{rate} MiB/s"),
                    cell.len().to_string(),
                    executed.to_string(),
                    if refused.is_empty() {
                        "none".into()
                    } else {
                        refused.iter().map(|(k, n)| format!("{k}: {n}")).collect::<Vec<_>>().join(", ")
                    },
                ]);
            }
            if scenario == Scenario::Node {
                let bench_line: Vec<f64> = cell.iter().filter_map(|r| r.line_ms).collect();
                let peer_line: Vec<f64> = cell.iter().filter_map(|r| r.peer_line_ms).collect();
                let gap: Vec<f64> = cell.iter().filter_map(|r| Some(r.peer_line_ms? - r.line_ms?)).collect();
                lines.rows.push(vec![
                    format!("{rate} MiB/s"),
                    mode.label(),
                    if bench_line.is_empty() { "-".into() } else { format!("{:.1}", median(&bench_line)) },
                    if peer_line.is_empty() { "-".into() } else { format!("{:.1}", median(&peer_line)) },
                    if gap.is_empty() {
                        "-".into()
                    } else {
                        format!("{:.1} / {:.1}", median(&gap), gap.iter().copied().fold(f64::MIN, f64::max))
                    },
                ]);
            }
            if let Some(p) = f.p50 {
                group.push((mode.label(), p));
                p50_of.insert(mode, p);
            }
            out.figures.push(f);
            out.figures.push(Figure::value(format!("{name}: kernel OOM kills"), "runs", cell.len(), ooms as f64));
        }
        // Ratios against the event-driven userspace path and the kernel path,
        // measured side by side in this run.
        let userspace = Mode::Ebpf { realtime: true };
        for base in [Mode::Kernel, userspace] {
            for other in modes.iter().copied().filter(|m| *m != base && *m != Mode::Kernel) {
                if let (Some(a), Some(b)) = (p50_of.get(&base), p50_of.get(&other)) {
                    let n = runs.iter().filter(|r| r.mode == other && r.rate == rate).count();
                    out.figures.push(Figure::value(
                        format!("{}: {} / {} at {rate} MiB/s (p50)", scenario.label(), other.label(), base.label()),
                        "×",
                        n,
                        b / a,
                    ));
                }
            }
        }
        bars.push((format!("{rate} MiB/s"), group));
        plot_ramp(ctx, scenario, modes, runs, rate, out)?;
    }
    let bar_plot = format!("eviction-race-{}-latency.svg", scenario.label().replace('.', "-"));
    std::fs::write(
        ctx.out.join(&bar_plot),
        svg::log_bars(&format!("{}: crossing → victim dead, p50 (log scale)", scenario.label()), "ms", &bars),
    )?;
    out.plots.push(bar_plot);
    out.tables.push(table);
    if !outcomes.rows.is_empty() {
        out.tables.push(outcomes);
    }
    if !lines.rows.is_empty() {
        out.tables.push(lines);
    }
    Ok(())
}

/// One run per mode at `rate`: the ramp as the observer sampled it.
fn plot_ramp(
    ctx: &Ctx,
    scenario: Scenario,
    modes: &[Mode],
    runs: &[Run],
    rate: u64,
    out: &mut BenchResult,
) -> Result<()> {
    let mut series = vec![];
    let mut markers = vec![];
    for (i, &mode) in modes.iter().enumerate() {
        if let Some(r) = runs.iter().find(|r| r.mode == mode && r.rate == rate) {
            series.push(svg::Series { name: mode.label(), points: r.trace.clone() });
            if let Some(d) = r.dead_ms {
                let y = r.trace.iter().rev().find(|p| p.0 <= d).map_or(0.0, |p| p.1);
                markers.push(svg::Marker {
                    label: if r.oom_killed { "OOM".into() } else { "dead".into() },
                    x: d,
                    y,
                    series: i,
                });
            }
        }
    }
    let plot = format!("eviction-race-{}-{rate}.svg", scenario.label().replace('.', "-"));
    let mut hlines = vec![(format!("eviction line ({} threshold)", scenario.label()), 0.0)];
    if scenario == Scenario::Allocatable {
        hlines.push(("kubepods limit (kernel OOM)".into(), ALLOCATABLE_THRESHOLD as f64 / MIB as f64));
    }
    std::fs::write(
        ctx.out.join(&plot),
        svg::line_chart(
            &format!("{}: a {rate} MiB/s ramp, one run per mode (sampled every 2 ms)", scenario.label()),
            "ms since the hog started",
            "MiB above the eviction line",
            &series,
            &hlines,
            &markers,
        ),
    )?;
    out.plots.push(plot);
    Ok(())
}

/// Every run of a mode in a scenario, both rates: the headline figures and
/// the project's targets next to them.
pub(super) fn summarize(scenario: Scenario, all: &[Run], out: &mut BenchResult) {
    let label = scenario.label();
    let of = |mode: Mode, f: fn(&Run) -> Option<f64>| -> Vec<f64> {
        all.iter().filter(|r| r.mode == mode).filter_map(f).collect()
    };
    let count = |mode: Mode| all.iter().filter(|r| r.mode == mode).count();
    let ooms = |mode: Mode| all.iter().filter(|r| r.mode == mode && r.oom_killed).count();
    let userspace = Mode::Ebpf { realtime: true };
    let dead = |r: &Run| r.crossing_to_dead_ms;
    let kernel = Figure::distribution(
        format!("{label}, all runs: swiftlet in-kernel kill: crossing → dead"),
        "ms",
        &of(Mode::Kernel, dead),
    );
    let agent = Figure::distribution(
        format!("{label}, all runs: swiftlet userspace kill: crossing → dead"),
        "ms",
        &of(userspace, dead),
    );
    let agent_decision = Figure::distribution(
        format!("{label}, all runs: swiftlet userspace kill: crossing → decision"),
        "ms",
        &of(userspace, |r| r.crossing_to_decision_ms),
    );
    let kubelet = Figure::distribution(
        format!("{label}, all runs: cgroupfs poll 10s (kubelet): crossing → dead"),
        "ms",
        &of(Mode::Poll(std::time::Duration::from_secs(10)), dead),
    );
    let executed =
        all.iter().filter(|r| r.mode == Mode::Kernel && r.kernel_outcome == Some(KillOutcome::Executed)).count();
    let ratio = |a: &Figure, b: &Figure| match (a.p50, b.p50) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.0}×", a / b),
        _ => "-".into(),
    };
    let with_figure = |f: &Figure, mode: Mode| format!("{} of {}", f.samples, count(mode));
    let mut rows = vec![
        vec!["in-kernel kill: crossing → dead p99 ≤ 100 µs".into(), tail(&kernel), with_figure(&kernel, Mode::Kernel)],
        vec![
            "every in-kernel run executed by the kernel (0 fallbacks)".into(),
            format!("{executed} executed"),
            count(Mode::Kernel).to_string(),
        ],
        vec!["userspace fast path: crossing → dead p99 ≤ 5 ms".into(), tail(&agent), with_figure(&agent, userspace)],
        vec![
            "userspace fast path: crossing → decision".into(),
            format!("p50 {}, {}", ms(agent_decision.p50), tail(&agent_decision)),
            agent_decision.samples.to_string(),
        ],
        vec![
            "zero kernel OOM kills with the in-kernel kill".into(),
            ooms(Mode::Kernel).to_string(),
            count(Mode::Kernel).to_string(),
        ],
        vec![
            "zero kernel OOM kills with the userspace kill".into(),
            ooms(userspace).to_string(),
            count(userspace).to_string(),
        ],
        vec![
            "kubelet-style 10 s poll / userspace kill (p50) ≥ 100×".into(),
            ratio(&kubelet, &agent),
            kubelet.samples.to_string(),
        ],
    ];
    let mut figures = vec![kernel, agent, agent_decision, kubelet];
    if scenario == Scenario::Node {
        let earlyoom = Figure::distribution(
            format!("{label}, all runs: earlyoom: MemAvailable crossing its -M → dead"),
            "ms",
            &of(Mode::Earlyoom, dead),
        );
        rows.push(vec![
            "earlyoom / userspace kill (p50) ≥ 10×".into(),
            ratio(&earlyoom, &figures[1]),
            earlyoom.samples.to_string(),
        ]);
        rows.push(vec![
            "earlyoom / in-kernel kill (p50) ≥ 1000×".into(),
            ratio(&earlyoom, &figures[0]),
            earlyoom.samples.to_string(),
        ]);
        figures.push(earlyoom);
    }
    out.tables.push(Table { header: ["target", "measured", "runs (with a figure)"].map(String::from).to_vec(), rows });
    out.figures.extend(figures);
}

/// The busy-cores bench's result.
pub(super) fn busy(modes: &[Mode], runs: &[Run], n: usize) -> BenchResult {
    let mut figures = vec![];
    let mut rows = vec![];
    for &mode in modes {
        let cell: Vec<&Run> = runs.iter().filter(|r| r.mode == mode).collect();
        let kill = Figure::distribution(
            format!("both cores busy: {}: crossing → kill", mode.label()),
            "ms",
            &cell.iter().filter_map(|r| r.crossing_to_kill_ms).collect::<Vec<_>>(),
        );
        let dead = Figure::distribution(
            format!("both cores busy: {}: crossing → dead", mode.label()),
            "ms",
            &cell.iter().filter_map(|r| r.crossing_to_dead_ms).collect::<Vec<_>>(),
        );
        rows.push(vec![
            mode.label(),
            format!("{} of {}", kill.samples, cell.len()),
            format!("p50 {}, {}", ms(kill.p50), tail(&kill)),
            format!("p50 {}, {}", ms(dead.p50), tail(&dead)),
            cell.iter().filter(|r| r.oom_killed).count().to_string(),
        ]);
        figures.extend([kill, dead]);
    }
    BenchResult {
        name: "eviction-busy".into(),
        title: format!(
            "The userspace kill while both cores are kept busy by spinning threads: the allocatable race at \
             256 MiB/s, the agent's reader thread (which kills at the crossing) in the normal scheduler and \
             under SCHED_FIFO (--eviction-realtime-priority, 10 by default), interleaved, {n} runs each. \
             Crossing → kill is the agent's own histogram (crossing timestamp to the cgroup kill written); \
             crossing → dead the observer's kernel timestamps. Target: crossing → kill p99 ≤ 1 ms."
        ),
        figures,
        tables: vec![Table {
            header: ["reader thread", "runs with a figure", "crossing → kill", "crossing → dead", "kernel OOM kills"]
                .map(String::from)
                .to_vec(),
            rows,
        }],
        ..Default::default()
    }
}
