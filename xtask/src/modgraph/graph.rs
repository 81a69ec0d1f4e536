//! The graph of top-level modules: its strongly connected components (every
//! one with more than one module is an import cycle, found with petgraph's
//! Tarjan), a shortest cycle through each to print, and the graph as
//! mermaid text for the docs.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    fmt::Write as _,
};

use petgraph::{algo, graphmap::DiGraphMap};

/// Where an edge is written: a file relative to the crate's `src/` and a line.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Location {
    pub file: String,
    pub line: usize,
}

#[derive(Debug, Default)]
pub struct Graph {
    pub nodes: BTreeSet<String>,
    /// (from, to) to every place the reference is written.
    pub edges: BTreeMap<(String, String), Vec<Location>>,
}

/// An import cycle: the modules of one strongly connected component and a
/// shortest cycle through its first module, as the modules in order (the
/// first is repeated at the end).
#[derive(Debug, PartialEq, Eq)]
pub struct Cycle {
    pub members: Vec<String>,
    pub path: Vec<String>,
}

impl Graph {
    pub fn add_edge(&mut self, from: &str, to: &str, at: Location) {
        self.nodes.insert(from.to_owned());
        self.nodes.insert(to.to_owned());
        self.edges.entry((from.to_owned(), to.to_owned())).or_default().push(at);
    }

    /// The same graph for petgraph's algorithms, without the edge `skip`.
    fn digraph(&self, skip: Option<(&str, &str)>) -> DiGraphMap<&str, ()> {
        let mut g = DiGraphMap::new();
        for n in &self.nodes {
            g.add_node(n.as_str());
        }
        for (from, to) in self.edges.keys() {
            if skip != Some((from.as_str(), to.as_str())) {
                g.add_edge(from.as_str(), to.as_str(), ());
            }
        }
        g
    }

    fn successors(&self, node: &str) -> impl Iterator<Item = &str> {
        self.edges.keys().filter(move |(from, _)| from == node).map(|(_, to)| to.as_str())
    }

    /// Every strongly connected component with more than one module.
    pub fn cycles(&self) -> Vec<Cycle> {
        let mut components: Vec<BTreeSet<String>> = algo::tarjan_scc(&self.digraph(None))
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|c| c.into_iter().map(str::to_owned).collect())
            .collect();
        components.sort();
        components
            .into_iter()
            .map(|members| {
                let path = self.shortest_cycle(&members);
                Cycle { members: members.into_iter().collect(), path }
            })
            .collect()
    }

    /// A shortest cycle through the component's first module, found by a
    /// breadth-first search that stays inside the component.
    fn shortest_cycle(&self, members: &BTreeSet<String>) -> Vec<String> {
        let Some(start) = members.first() else { return vec![] };
        let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = VecDeque::from([start.as_str()]);
        while let Some(v) = queue.pop_front() {
            for w in self.successors(v).filter(|w| members.contains(*w)) {
                if w == start {
                    let mut path = vec![start.clone()];
                    let mut at = v;
                    while at != start {
                        path.push(at.to_owned());
                        at = parent[at];
                    }
                    path.push(start.clone());
                    path.reverse();
                    return path;
                }
                if !parent.contains_key(w) {
                    parent.insert(w, v);
                    queue.push_back(w);
                }
            }
        }
        vec![]
    }

    /// The cycles, each with the file:line of every reference along it, as
    /// the text the check fails with.
    pub fn describe_cycles(&self, cycles: &[Cycle]) -> String {
        const SHOWN: usize = 5;
        let mut out = String::new();
        for cycle in cycles {
            let _ = writeln!(out, "import cycle among {{{}}}:", cycle.members.join(", "));
            let _ = writeln!(out, "  {}", cycle.path.join(" -> "));
            for pair in cycle.path.windows(2) {
                let at = &self.edges[&(pair[0].clone(), pair[1].clone())];
                let _ = writeln!(out, "  {} -> {}:", pair[0], pair[1]);
                for l in at.iter().take(SHOWN) {
                    let _ = writeln!(out, "    {}:{}", l.file, l.line);
                }
                if at.len() > SHOWN {
                    let _ = writeln!(out, "    ... and {} more", at.len() - SHOWN);
                }
            }
        }
        out
    }

    /// The graph without the edges implied by others (its transitive
    /// reduction; on a graph with cycles, only edges with another path are
    /// dropped), so a drawing of it stays readable. Each module is drawn
    /// above the modules it uses.
    pub fn mermaid(&self) -> String {
        let mut out = String::from("graph TD\n");
        for (from, to) in self.edges.keys() {
            if !self.reachable_without(from, to) {
                let _ = writeln!(out, "  {from} --> {to}");
            }
        }
        let isolated: Vec<&String> =
            self.nodes.iter().filter(|n| !self.edges.keys().any(|(a, b)| a == *n || b == *n)).collect();
        for n in isolated {
            let _ = writeln!(out, "  {n}");
        }
        out
    }

    /// Whether `to` is reachable from `from` along a path of two or more
    /// edges (another path than the edge itself).
    fn reachable_without(&self, from: &str, to: &str) -> bool {
        algo::has_path_connecting(&self.digraph(Some((from, to))), from, to, None)
    }
}
