//! `cargo xtask lint`: the module-graph check. The agent's top-level modules
//! (`agent/src/<module>`) must depend on each other one way only: this
//! parses every product source file with `syn` (test files and
//! `#[cfg(test)]` items are left out), builds the graph of references
//! between top-level modules, and fails with each cycle and the file:line of
//! every reference along it. `--graph` prints the graph as mermaid text,
//! which docs/ARCHITECTURE.md shows.

mod graph;
mod scan;
#[cfg(test)]
mod tests;

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

pub use graph::{Graph, Location};

/// Dependencies that close a cycle today and are to be removed by work
/// under way elsewhere, each with the change that removes it. The check
/// ignores them when it looks for cycles, and fails once one no longer
/// exists, so the list can only shrink: delete the entry then.
pub const KNOWN_CYCLE_EDGES: &[KnownEdge] = &[];

/// A dependency the check tolerates for now (see [`KNOWN_CYCLE_EDGES`]).
pub struct KnownEdge {
    pub from: &'static str,
    pub to: &'static str,
    pub why: &'static str,
}

#[derive(clap::Args)]
pub struct Args {
    /// Print the module graph as mermaid text (its transitive reduction,
    /// without the tolerated edges) instead of checking it.
    #[arg(long, conflicts_with = "edges")]
    graph: bool,
    /// List every dependency between top-level modules with the file:line
    /// of each reference (to see what a cycle is made of).
    #[arg(long)]
    edges: bool,
}

/// The check as `cargo xtask test` runs it.
pub fn check_tree() -> Result<()> {
    run(Args { graph: false, edges: false })
}

pub fn run(args: Args) -> Result<()> {
    let src = crate::cmd::workspace_root().join("agent/src");
    let graph = graph_of_dir(&src)?;
    if args.graph {
        // The drawing is of the graph the check enforces to be one-way.
        let mut drawn = graph;
        for k in KNOWN_CYCLE_EDGES {
            drawn.edges.remove(&(k.from.to_owned(), k.to.to_owned()));
        }
        let text = drawn.mermaid();
        let (header, body) = text.split_once('\n').unwrap_or((&text, ""));
        println!("{header}");
        for k in KNOWN_CYCLE_EDGES {
            println!("  %% left out, tolerated for now: {} --> {}", k.from, k.to);
        }
        print!("{body}");
        return Ok(());
    }
    if args.edges {
        for ((from, to), at) in &graph.edges {
            let places: Vec<String> = at.iter().map(|l| format!("{}:{}", l.file, l.line)).collect();
            println!("{from} -> {to}: {}", places.join(" "));
        }
    }
    check(&graph, KNOWN_CYCLE_EDGES)?;
    crate::cmd::note(format!(
        "module graph: {} top-level modules, {} dependencies, no cycle",
        graph.nodes.len(),
        graph.edges.len()
    ));
    for k in KNOWN_CYCLE_EDGES {
        crate::cmd::note(format!("  tolerated for now: {} -> {} ({})", k.from, k.to, k.why));
    }
    Ok(())
}

/// Fails with every cycle described if the graph, without the `known`
/// edges, has one, or if a known edge is gone (so its entry is removed).
pub fn check(graph: &Graph, known: &[KnownEdge]) -> Result<()> {
    let stale: Vec<String> = known
        .iter()
        .filter(|k| !graph.edges.contains_key(&(k.from.to_owned(), k.to.to_owned())))
        .map(|k| format!("{} -> {}", k.from, k.to))
        .collect();
    if !stale.is_empty() {
        bail!(
            "KNOWN_CYCLE_EDGES in xtask/src/modgraph/mod.rs lists dependencies that no longer exist: {}; remove them",
            stale.join(", ")
        );
    }
    let mut checked = Graph { nodes: graph.nodes.clone(), edges: graph.edges.clone() };
    for k in known {
        checked.edges.remove(&(k.from.to_owned(), k.to.to_owned()));
    }
    let cycles = checked.cycles();
    if cycles.is_empty() {
        return Ok(());
    }
    bail!("the agent's top-level modules have {} import cycle(s):\n{}", cycles.len(), checked.describe_cycles(&cycles))
}

/// One source file: its path relative to the crate's `src/` and its text.
pub struct SourceFile {
    pub path: PathBuf,
    pub text: String,
}

/// Reads every `.rs` file under `src` (sorted, so the output is stable).
fn read_tree(src: &Path) -> Result<Vec<SourceFile>> {
    fn walk(dir: &Path, src: &Path, out: &mut Vec<SourceFile>) -> Result<()> {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()
            .with_context(|| format!("reading {}", dir.display()))?;
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, src, out)?;
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
                let rel = path.strip_prefix(src).unwrap_or(&path).to_path_buf();
                out.push(SourceFile { path: rel, text });
            }
        }
        Ok(())
    }
    let mut out = vec![];
    walk(src, src, &mut out)?;
    Ok(out)
}

pub fn graph_of_dir(src: &Path) -> Result<Graph> {
    graph_of(&read_tree(src)?)
}

/// The module path a file under `src/` defines: `lib.rs` is the root (empty),
/// `a.rs` and `a/mod.rs` are `a`, `a/b.rs` is `a::b`. `main.rs` and `bin/`
/// are separate crates and have none.
fn module_path(rel: &Path) -> Option<Vec<String>> {
    let parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let (file, dirs) = parts.split_last()?;
    if dirs.first().is_some_and(|d| d == "bin") || (dirs.is_empty() && file == "main.rs") {
        return None;
    }
    let stem = file.strip_suffix(".rs")?;
    let mut path = dirs.to_vec();
    if !(stem == "mod" || (dirs.is_empty() && stem == "lib")) {
        path.push(stem.to_owned());
    }
    Some(path)
}

/// Test files by name: `tests.rs`, `*_tests.rs`, `test_support.rs`.
fn is_test_file(rel: &Path) -> bool {
    let stem = rel.file_stem().map(|s| s.to_string_lossy()).unwrap_or_default();
    stem == "tests" || stem.ends_with("_tests") || stem == "test_support"
}

/// The graph of references between top-level modules in a crate's sources.
pub fn graph_of(files: &[SourceFile]) -> Result<Graph> {
    let mut parsed = vec![];
    for f in files {
        let Some(module) = module_path(&f.path) else { continue };
        let ast = syn::parse_file(&f.text).with_context(|| format!("parsing {}", f.path.display()))?;
        parsed.push((f, module, ast));
    }
    let Some((_, _, lib)) = parsed.iter().find(|(_, m, _)| m.is_empty()) else {
        bail!("no lib.rs among the sources: the module graph starts at the crate root");
    };
    let test_modules: BTreeSet<Vec<String>> =
        parsed.iter().flat_map(|(_, m, ast)| scan::test_module_declarations(ast, m)).collect();
    let modules: BTreeSet<String> = lib
        .items
        .iter()
        .filter_map(|i| match i {
            syn::Item::Mod(m) if !scan::is_test_only(&m.attrs) => Some(m.ident.to_string()),
            _ => None,
        })
        .collect();
    let root = scan::CrateRoot { reexports: scan::root_reexports(lib, &modules), modules };
    let mut graph = Graph { nodes: root.modules.clone(), ..Graph::default() };
    for (file, module, ast) in &parsed {
        let Some(top) = module.first() else { continue };
        let test_only = is_test_file(&file.path) || test_modules.iter().any(|t| module.starts_with(t));
        if test_only || !root.modules.contains(top) {
            continue;
        }
        for r in scan::references(ast, module, &root) {
            if &r.target != top {
                graph.add_edge(top, &r.target, Location { file: file.path.display().to_string(), line: r.line });
            }
        }
    }
    Ok(graph)
}
