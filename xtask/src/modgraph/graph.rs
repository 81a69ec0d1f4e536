//! The graph of top-level modules: its strongly connected components (every
//! one with more than one module is an import cycle), a shortest cycle
//! through each to print, and the graph as mermaid text for the docs.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    fmt::Write as _,
};

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

    fn successors(&self, node: &str) -> impl Iterator<Item = &str> {
        self.edges.keys().filter(move |(from, _)| from == node).map(|(_, to)| to.as_str())
    }

    /// Every strongly connected component with more than one module.
    pub fn cycles(&self) -> Vec<Cycle> {
        self.components()
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|members| {
                let path = self.shortest_cycle(&members);
                Cycle { members: members.into_iter().collect(), path }
            })
            .collect()
    }

    /// Tarjan's algorithm; the graph has a few dozen modules, so recursion
    /// depth is no concern.
    fn components(&self) -> Vec<BTreeSet<String>> {
        struct State<'g> {
            index: BTreeMap<&'g str, usize>,
            low: BTreeMap<&'g str, usize>,
            stack: Vec<&'g str>,
            on_stack: BTreeSet<&'g str>,
            out: Vec<BTreeSet<String>>,
        }
        fn connect<'g>(g: &'g Graph, v: &'g str, s: &mut State<'g>) {
            let i = s.index.len();
            s.index.insert(v, i);
            s.low.insert(v, i);
            s.stack.push(v);
            s.on_stack.insert(v);
            for w in g.successors(v) {
                if !s.index.contains_key(w) {
                    connect(g, w, s);
                    let low = s.low[v].min(s.low[w]);
                    s.low.insert(v, low);
                } else if s.on_stack.contains(w) {
                    let low = s.low[v].min(s.index[w]);
                    s.low.insert(v, low);
                }
            }
            if s.low[v] == s.index[v] {
                let mut component = BTreeSet::new();
                while let Some(w) = s.stack.pop() {
                    s.on_stack.remove(w);
                    component.insert(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                s.out.push(component);
            }
        }
        let mut s = State {
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: vec![],
            on_stack: BTreeSet::new(),
            out: vec![],
        };
        for v in &self.nodes {
            if !s.index.contains_key(v.as_str()) {
                connect(self, v, &mut s);
            }
        }
        s.out.sort();
        s.out
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

    /// Whether `to` is reachable from `from` along a path of two or more edges.
    fn reachable_without(&self, from: &str, to: &str) -> bool {
        let mut seen = BTreeSet::new();
        let mut queue: VecDeque<&str> = self.successors(from).filter(|w| *w != to).collect();
        while let Some(v) = queue.pop_front() {
            if v == to {
                return true;
            }
            if seen.insert(v) {
                queue.extend(self.successors(v).filter(|w| *w != from));
            }
        }
        false
    }
}
