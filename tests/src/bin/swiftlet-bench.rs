//! The benchmark runner behind `cargo xtask bench`: runs the benches,
//! shows progress, writes report.md, results.json and SVG plots.

use std::{path::PathBuf, time::Instant};

use anyhow::{Context as _, Result, bail};
use swiftlet_tests::bench::{self, BenchResult, Ctx};

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    // The kubelet-api bench's load generator, as a second process.
    if argv.first().map(String::as_str) == Some("load") {
        return bench::server::load_main(&argv[1..]);
    }
    let mut out = PathBuf::from("target/bench");
    let mut quick = false;
    let mut names = vec![];
    let mut list = false;
    let mut emit_json = false;
    let mut imports: Vec<(String, PathBuf)> = vec![];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--out" => out = PathBuf::from(args.next().context("--out needs a directory")?),
            "--quick" => quick = true,
            "--list" => list = true,
            // This run's results as one line on stdout (for the kernel
            // matrix, whose VMs have only a serial console).
            "--emit-json" => emit_json = true,
            // Results another run emitted (`<label>=<file>`), added under
            // `<bench>@<label>`.
            "--import" => {
                let v = args.next().context("--import needs <label>=<file>")?;
                let (label, file) = v.split_once('=').context("--import needs <label>=<file>")?;
                imports.push((label.to_owned(), PathBuf::from(file)));
            }
            s if s.starts_with('-') => bail!("unknown option {s}"),
            s => names.push(s.to_owned()),
        }
    }
    let all = bench::all();
    if list {
        for (name, about, _) in &all {
            println!("{name:<16} {about}");
        }
        return Ok(());
    }
    for n in &names {
        if !all.iter().any(|(name, _, _)| name == n) {
            bail!("no bench named `{n}` (try --list)");
        }
    }
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let ctx = Ctx { quick, out: out.clone() };
    let mut results: Vec<BenchResult> = vec![];
    let mut failed = vec![];
    let started = Instant::now();
    for (label, file) in &imports {
        let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{}: not the JSON of --emit-json", file.display()))?;
        for b in v.as_array().context("--import: expected a JSON array of results")? {
            let mut r =
                from_json(b).with_context(|| format!("{}: a result without name, title or figures", file.display()))?;
            r.name = format!("{}@{label}", r.name);
            results.push(r);
        }
    }
    let run_benches = imports.is_empty() || !names.is_empty();
    for (name, about, f) in all.iter().filter(|_| run_benches).filter(|(n, _, _)| {
        if names.is_empty() {
            // Locking most of RAM does not belong in a smoke run (CI's):
            // --quick takes the node race only when it is named. The cache
            // race needs cgroup v2 and a disk: it runs only when named
            // (`cargo xtask bench eviction-race-cache` boots its VM).
            !(quick && *n == "eviction-race-node") && *n != "eviction-race-cache"
        } else {
            names.iter().any(|x| x == n)
        }
    }) {
        eprintln!("==> bench {name}: {about}");
        let t = Instant::now();
        let load_before = bench::load_average();
        let cpu_before = bench::cpu_times();
        match f(&ctx) {
            Ok(mut r) => {
                r.context = bench::RunContext {
                    load_before: load_before.clone(),
                    load_after: bench::load_average(),
                    steal: bench::steal_share(cpu_before, bench::cpu_times()),
                    ..bench::RunContext::of_this_build()
                };
                eprintln!(
                    "    commit {}, {} build, load average {} → {}, CPU time stolen by the hypervisor {}",
                    r.context.commit,
                    r.context.profile,
                    r.context.load_before,
                    r.context.load_after,
                    if r.context.steal.is_empty() { "unknown" } else { &r.context.steal }
                );
                for fig in &r.figures {
                    let v = match (fig.p50, fig.value) {
                        (Some(p50), _) => match fig.p99 {
                            Some(p99) => format!("p50 {p50:.3} p99 {p99:.3} max {:.3}", fig.max.unwrap_or(f64::NAN)),
                            None => format!("p50 {p50:.3} max {:.3}", fig.max.unwrap_or(f64::NAN)),
                        },
                        (None, Some(v)) => format!("{v:.3}"),
                        _ => "-".into(),
                    };
                    eprintln!("    {:<70} {v} {} (n={})", fig.name, fig.unit, fig.samples);
                }
                eprintln!("    done in {:.1}s", t.elapsed().as_secs_f64());
                results.push(r);
            }
            Err(e) => {
                eprintln!("    FAILED: {e:#}");
                failed.push(*name);
            }
        }
    }
    if emit_json {
        println!("@@BENCH-JSON {}", serde_json::to_string(&results)?);
    }
    let date = std::process::Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    // Merge with earlier results of benches not run this time.
    let json_path = out.join("results.json");
    let mut merged: Vec<serde_json::Value> = std::fs::read(&json_path)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v.get("benches").cloned())
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default();
    merged.retain(|b| !results.iter().any(|r| Some(r.name.as_str()) == b.get("name").and_then(|n| n.as_str())));
    merged.extend(results.iter().map(|r| serde_json::to_value(r).unwrap_or_default()));
    let machine: serde_json::Map<String, serde_json::Value> =
        bench::machine().into_iter().map(|(k, v)| (k, serde_json::Value::String(v))).collect();
    std::fs::write(
        &json_path,
        serde_json::to_vec_pretty(
            &serde_json::json!({"date": date, "quick": quick, "machine": machine, "benches": merged}),
        )?,
    )?;
    let all_results: Vec<BenchResult> = merged.iter().filter_map(from_json).collect();
    std::fs::write(out.join("report.md"), bench::render(&all_results, quick, &date))?;
    eprintln!("==> wrote {}/report.md and results.json in {:.1}s", out.display(), started.elapsed().as_secs_f64());
    if !failed.is_empty() {
        bail!("benches failed: {}", failed.join(", "));
    }
    Ok(())
}

/// Rebuilds a result from results.json (for benches kept from earlier runs).
fn from_json(v: &serde_json::Value) -> Option<BenchResult> {
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
    let strings = |k: &str| -> Vec<String> {
        v.get(k)
            .and_then(|x| x.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    };
    let figures = v
        .get("figures")?
        .as_array()?
        .iter()
        .filter_map(|f| {
            let n = |k: &str| f.get(k).and_then(|x| x.as_f64());
            Some(bench::Figure {
                name: f.get("name")?.as_str()?.to_owned(),
                unit: f.get("unit")?.as_str()?.to_owned(),
                samples: f.get("samples")?.as_u64()? as usize,
                p50: n("p50"),
                p99: n("p99"),
                max: n("max"),
                value: n("value"),
            })
        })
        .collect();
    let tables = v
        .get("tables")
        .and_then(|t| t.as_array())
        .map(|ts| {
            ts.iter()
                .map(|t| bench::Table {
                    header: t
                        .get("header")
                        .and_then(|h| h.as_array())
                        .map(|h| h.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect())
                        .unwrap_or_default(),
                    rows: t
                        .get("rows")
                        .and_then(|r| r.as_array())
                        .map(|rs| {
                            rs.iter()
                                .filter_map(|r| {
                                    r.as_array()
                                        .map(|c| c.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect())
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    let c = v.get("context");
    let cs = |k: &str| c.and_then(|c| c.get(k)).and_then(|x| x.as_str()).unwrap_or_default().to_owned();
    Some(BenchResult {
        name: s("name")?,
        title: s("title")?,
        context: bench::RunContext {
            commit: cs("commit"),
            profile: cs("profile"),
            load_before: cs("load_before"),
            load_after: cs("load_after"),
            steal: cs("steal"),
        },
        figures,
        tables,
        plots: strings("plots"),
        notes: strings("notes"),
    })
}
