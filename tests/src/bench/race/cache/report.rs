//! The cache race's result: runs folded per mode into counts (cache pod
//! evicted, hog killed before the kernel OOM killer) and crossing → hog
//! dead (p50 and max; a p99 only over enough runs), a targets table and a
//! bar plot.

use anyhow::Result;

use super::MODES;
use crate::bench::{
    BenchResult, Ctx, Figure, Table,
    race::{Mode, Run, run::outcome_name},
    svg,
};

/// One mode's runs, folded.
#[derive(Clone, Debug)]
pub(super) struct ModeSummary {
    pub mode: Mode,
    pub runs: usize,
    /// Runs whose cache crossed the line before the hog started.
    pub cache_crossed: usize,
    /// Runs where the agent evicted the cache pod.
    pub cache_evicted: usize,
    /// Runs where the cache pod's reader died, before the hog started and
    /// in all.
    pub cache_killed_before_hog: usize,
    pub cache_killed: usize,
    /// Runs where the agent evicted the Guaranteed pod.
    pub steady_evicted: usize,
    /// Runs where the hog died and the kernel OOM killer did not fire.
    pub hog_killed_first: usize,
    pub oom_kills: usize,
    pub crossing_to_dead: Figure,
    /// What the kernel did at the agent's first crossing, by outcome name
    /// (in-kernel modes only).
    pub outcomes: Vec<(&'static str, usize)>,
}

pub(super) fn summarize(mode: Mode, runs: &[Run]) -> ModeSummary {
    let cell: Vec<&Run> = runs.iter().filter(|r| r.mode == mode).collect();
    let count = |f: &dyn Fn(&Run) -> bool| cell.iter().filter(|r| f(r)).count();
    let cache = |f: fn(&super::CacheOutcome) -> bool| move |r: &Run| r.cache.as_ref().is_some_and(f);
    let mut outcomes: Vec<(&'static str, usize)> = vec![];
    if mode.kernel_kills() {
        for r in &cell {
            let n = outcome_name(r.kernel_outcome);
            match outcomes.iter_mut().find(|(k, _)| *k == n) {
                Some((_, c)) => *c += 1,
                None => outcomes.push((n, 1)),
            }
        }
    }
    ModeSummary {
        mode,
        runs: cell.len(),
        cache_crossed: count(&cache(|c| c.crossed_ms.is_some())),
        cache_evicted: count(&cache(|c| c.evicted)),
        cache_killed_before_hog: count(&cache(|c| c.killed_before_hog)),
        cache_killed: count(&cache(|c| c.killed)),
        steady_evicted: count(&cache(|c| c.steady_evicted)),
        hog_killed_first: count(&|r| r.dead_ms.is_some() && !r.oom_killed),
        oom_kills: count(&|r| r.oom_killed),
        crossing_to_dead: Figure::distribution(
            format!("{}: crossing → hog dead", mode.label()),
            "ms",
            &cell.iter().filter_map(|r| r.crossing_to_dead_ms).collect::<Vec<_>>(),
        ),
        outcomes,
    }
}

fn fmt_ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3}"))
}

/// The per-mode table's row.
pub(super) fn row(s: &ModeSummary) -> Vec<String> {
    let f = &s.crossing_to_dead;
    vec![
        s.mode.label(),
        s.runs.to_string(),
        format!("{} of {}", s.cache_crossed, s.runs),
        s.cache_evicted.to_string(),
        format!("{} ({} before the hog)", s.cache_killed, s.cache_killed_before_hog),
        s.steady_evicted.to_string(),
        format!("{} of {}", s.hog_killed_first, s.runs),
        s.oom_kills.to_string(),
        f.samples.to_string(),
        fmt_ms(f.p50),
        fmt_ms(f.p99),
        fmt_ms(f.max),
        if s.outcomes.is_empty() {
            "-".into()
        } else {
            s.outcomes.iter().map(|(k, n)| format!("{k}: {n}")).collect::<Vec<_>>().join(", ")
        },
    ]
}

/// The targets: no cache eviction with reclaim-first, the hog killed
/// before the OOM killer in every run of every mode.
pub(super) fn targets(summaries: &[ModeSummary]) -> Table {
    let mut rows = vec![];
    if let Some(s) = summaries.iter().find(|s| s.mode == Mode::ReclaimFirst) {
        rows.push(vec![
            "reclaim-first: the cache pod is never evicted (0)".into(),
            format!("{} evicted, {} killed", s.cache_evicted, s.cache_killed),
            s.runs.to_string(),
        ]);
    }
    for s in summaries {
        rows.push(vec![
            format!("{}: the hog killed before the kernel OOM killer, every run", s.mode.label()),
            format!("{} of {}", s.hog_killed_first, s.runs),
            s.runs.to_string(),
        ]);
    }
    Table { header: ["target", "measured", "runs"].map(String::from).to_vec(), rows }
}

pub(super) fn report(ctx: &Ctx, title: String, runs: &[Run]) -> Result<BenchResult> {
    let summaries: Vec<ModeSummary> = MODES.iter().map(|&m| summarize(m, runs)).filter(|s| s.runs > 0).collect();
    let mut out = BenchResult { name: "eviction-race-cache".into(), title, ..Default::default() };
    let table = Table {
        header: [
            "mode",
            "runs",
            "cache crossed the line",
            "cache pod evicted (agent)",
            "cache pod killed",
            "Guaranteed pod evicted",
            "hog killed before the kernel OOM killer",
            "kernel OOM kills",
            "runs with a figure",
            "crossing → hog dead p50 (ms)",
            "p99 (ms)",
            "max (ms)",
            "kernel, at the agent's first crossing",
        ]
        .map(String::from)
        .to_vec(),
        rows: summaries.iter().map(row).collect(),
    };
    let mut bars = vec![];
    for s in &summaries {
        out.figures.push(s.crossing_to_dead.clone());
        out.figures.push(Figure::value(
            format!("{}: cache pod evicted", s.mode.label()),
            "runs",
            s.runs,
            s.cache_evicted as f64,
        ));
        out.figures.push(Figure::value(
            format!("{}: hog killed before the kernel OOM killer", s.mode.label()),
            "runs",
            s.runs,
            s.hog_killed_first as f64,
        ));
        if let Some(p) = s.crossing_to_dead.p50 {
            bars.push((s.mode.label(), p));
        }
    }
    // Ratios of p50s measured side by side: the kubelet-style poll over
    // each swiftlet mode.
    let p50 = |m: Mode| summaries.iter().find(|s| s.mode == m).and_then(|s| s.crossing_to_dead.p50);
    let poll = Mode::Poll(std::time::Duration::from_secs(10));
    for m in [Mode::Kernel, Mode::ReclaimFirst] {
        if let (Some(a), Some(b)) = (p50(poll), p50(m))
            && b > 0.0
        {
            let n = summaries.iter().find(|s| s.mode == m).map_or(0, |s| s.crossing_to_dead.samples);
            out.figures.push(Figure::value(
                format!("crossing → hog dead p50: {} / {}", poll.label(), m.label()),
                "×",
                n,
                a / b,
            ));
        }
    }
    out.tables.push(table);
    out.tables.push(targets(&summaries));
    if !bars.is_empty() {
        let plot = "eviction-race-cache-latency.svg".to_owned();
        std::fs::write(
            ctx.out.join(&plot),
            svg::log_bars("cache race: crossing → hog dead, p50 (log scale)", "ms", &[("256 MiB/s".to_owned(), bars)]),
        )?;
        out.plots.push(plot);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::race::{Scenario, cache::CacheOutcome};
    use swiftlet::signals::KillOutcome;

    fn run(mode: Mode, dead: Option<f64>, oom: bool, cache: CacheOutcome, outcome: Option<KillOutcome>) -> Run {
        Run {
            scenario: Scenario::Allocatable,
            mode,
            rate: 256,
            crossing_to_dead_ms: dead,
            crossing_to_decision_ms: None,
            crossing_to_kill_ms: None,
            overshoot_mib: None,
            oom_killed: oom,
            trace: vec![],
            dead_ms: dead.map(|d| d + 1000.0),
            line_ms: None,
            peer_line_ms: None,
            agent_crossing_ms: None,
            kernel_kill_ms: None,
            kernel_kill_current: false,
            kernel_kill_signal_error: 0,
            observer_crossing: None,
            agent_crossing: None,
            kernel_outcome: outcome,
            cache: Some(cache),
        }
    }

    fn crossed() -> CacheOutcome {
        CacheOutcome { crossed_ms: Some(900.0), crossings_before_hog: 1, ..Default::default() }
    }

    fn evicted() -> CacheOutcome {
        CacheOutcome { evicted: true, killed: true, killed_before_hog: true, ..crossed() }
    }

    #[test]
    fn runs_fold_into_counts_per_mode() {
        let poll = Mode::Poll(std::time::Duration::from_secs(10));
        let runs = vec![
            // The kubelet-style poll: the cache evicted, then the OOM killer
            // beats the poll to the hog.
            run(poll, Some(2500.0), true, evicted(), None),
            run(poll, Some(7000.0), false, evicted(), None),
            run(Mode::Kernel, Some(0.05), false, evicted(), Some(KillOutcome::Executed)),
            run(Mode::Kernel, Some(0.07), false, evicted(), Some(KillOutcome::Executed)),
            run(Mode::Kernel, None, false, crossed(), None),
        ];
        let p = summarize(poll, &runs);
        assert_eq!((p.runs, p.cache_evicted, p.cache_killed, p.hog_killed_first, p.oom_kills), (2, 2, 2, 1, 1));
        assert_eq!(p.crossing_to_dead.samples, 2);
        assert!(p.outcomes.is_empty(), "a polling mode has no kernel outcome");
        let k = summarize(Mode::Kernel, &runs);
        assert_eq!((k.runs, k.cache_crossed, k.cache_evicted, k.hog_killed_first), (3, 3, 2, 2));
        assert_eq!(k.outcomes, vec![("executed", 2), ("no crossing seen", 1)]);
        assert_eq!(
            (k.crossing_to_dead.p50, k.crossing_to_dead.max, k.crossing_to_dead.p99),
            (Some(0.05), Some(0.07), None)
        );
        let r = summarize(Mode::ReclaimFirst, &runs);
        assert_eq!((r.runs, r.crossing_to_dead.samples), (0, 0));
    }

    #[test]
    fn rows_and_targets_say_what_was_counted() {
        let runs = vec![
            run(Mode::ReclaimFirst, Some(0.04), false, crossed(), Some(KillOutcome::Executed)),
            run(Mode::ReclaimFirst, Some(0.06), false, evicted(), Some(KillOutcome::Executed)),
        ];
        let s = summarize(Mode::ReclaimFirst, &runs);
        let row = row(&s);
        assert_eq!(row[2], "2 of 2");
        assert_eq!(row[3], "1");
        assert_eq!(row[4], "1 (1 before the hog)");
        assert_eq!(row[5], "0");
        assert_eq!(row[6], "2 of 2");
        assert_eq!(row[11], "0.060");
        assert_eq!(row[12], "executed: 2");
        let t = targets(&[s]);
        assert_eq!(t.rows[0][1], "1 evicted, 1 killed");
        assert_eq!(t.rows[1][1], "2 of 2");
    }
}
