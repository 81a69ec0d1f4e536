use std::path::PathBuf;

use super::{KnownEdge, SourceFile, check, graph_of, module_path};

fn tree(files: &[(&str, &str)]) -> Vec<SourceFile> {
    files.iter().map(|(p, t)| SourceFile { path: PathBuf::from(p), text: (*t).to_owned() }).collect()
}

fn edges(files: &[(&str, &str)]) -> Vec<(String, String)> {
    graph_of(&tree(files)).unwrap().edges.into_keys().collect()
}

fn pair(a: &str, b: &str) -> (String, String) {
    (a.to_owned(), b.to_owned())
}

const LIB: &str = "pub mod a;\npub mod b;\npub mod c;\n";

#[test]
fn module_paths_follow_the_file_layout() {
    let cases: &[(&str, Option<&[&str]>)] = &[
        ("lib.rs", Some(&[])),
        ("main.rs", None),
        ("bin/tool.rs", None),
        ("a.rs", Some(&["a"])),
        ("a/mod.rs", Some(&["a"])),
        ("a/b.rs", Some(&["a", "b"])),
        ("a/b/mod.rs", Some(&["a", "b"])),
        ("a/lib.rs", Some(&["a", "lib"])),
    ];
    for (path, want) in cases {
        let want = want.map(|w| w.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        assert_eq!(module_path(&PathBuf::from(path)), want, "{path}");
    }
}

#[test]
fn a_dag_passes() {
    let files = [
        ("lib.rs", LIB),
        ("a.rs", "use crate::b::Thing;\nfn f() { crate::c::g(); }\n"),
        ("b.rs", "pub struct Thing(crate::c::Other);\n"),
        ("c.rs", "pub struct Other;\npub fn g() {}\n"),
    ];
    let graph = graph_of(&tree(&files)).unwrap();
    assert_eq!(graph.edges.keys().cloned().collect::<Vec<_>>(), [pair("a", "b"), pair("a", "c"), pair("b", "c")]);
    check(&graph, &[]).unwrap();
}

#[test]
fn a_cycle_is_found_and_printed_with_every_edge_location() {
    let files = [
        ("lib.rs", LIB),
        ("a/mod.rs", "mod inner;\n"),
        ("a/inner.rs", "\n\nuse crate::b::X;\n"),
        ("b.rs", "pub struct X;\nfn f() -> crate::c::Y { todo!() }\n"),
        ("c.rs", "pub struct Y;\nimpl Y {\n    fn g(&self) { let _ = crate::a::Z; }\n}\n"),
    ];
    let graph = graph_of(&tree(&files)).unwrap();
    let cycles = graph.cycles();
    assert_eq!(cycles.len(), 1);
    assert_eq!(cycles[0].members, ["a", "b", "c"]);
    assert_eq!(cycles[0].path, ["a", "b", "c", "a"]);
    let err = format!("{:#}", check(&graph, &[]).unwrap_err());
    assert!(err.contains("a -> b -> c -> a"), "{err}");
    assert!(err.contains("a/inner.rs:3"), "{err}");
    assert!(err.contains("b.rs:2"), "{err}");
    assert!(err.contains("c.rs:3"), "{err}");
}

#[test]
fn grouped_imports_are_seen_through_nested_braces() {
    let files = [
        ("lib.rs", LIB),
        ("a.rs", "use crate::{\n    b::{self, x::{Y, Z}},\n    c::*,\n};\n"),
        ("b.rs", ""),
        ("c.rs", ""),
    ];
    let graph = graph_of(&tree(&files)).unwrap();
    assert_eq!(graph.edges.keys().cloned().collect::<Vec<_>>(), [pair("a", "b"), pair("a", "c")]);
    // One location per leaf, on the leaf's own line.
    let b = &graph.edges[&pair("a", "b")];
    assert_eq!(b.iter().map(|l| l.line).collect::<Vec<_>>(), [2, 2, 2]);
    assert_eq!(graph.edges[&pair("a", "c")][0].line, 3);
}

#[test]
fn super_paths_count_only_when_they_climb_to_the_root() {
    let files = [
        ("lib.rs", LIB),
        ("a/mod.rs", "mod x;\nmod y;\n"),
        // super:: stays in a; super::super:: reaches the root, then b.
        ("a/x.rs", "use super::y::Thing;\nuse super::super::b::B;\n"),
        ("a/y.rs", "pub struct Thing;\nmod deep { fn f() { let _ = super::super::super::c::C; } }\n"),
        ("b.rs", "pub struct B;\n"),
        ("c.rs", "pub struct C;\n"),
    ];
    assert_eq!(edges(&files), [pair("a", "b"), pair("a", "c")]);
}

#[test]
fn test_modules_and_test_files_are_skipped() {
    let files = [
        ("lib.rs", LIB),
        ("a/mod.rs", "#[cfg(test)]\nmod checks;\n#[cfg(test)]\nmod inline { use crate::b::B; }\n"),
        ("a/checks.rs", "use crate::b::B;\n"),
        ("a/tests.rs", "use crate::b::B;\n"),
        ("a/parse_tests.rs", "use crate::b::B;\n"),
        ("a/test_support.rs", "use crate::c::C;\n"),
        (
            "b.rs",
            "#[cfg(test)]\nfn helper() -> crate::a::A { todo!() }\nstruct S;\nimpl S {\n    #[cfg(all(test, unix))]\n    fn t() { crate::c::f() }\n}\n",
        ),
        (
            "c.rs",
            "#[cfg(any(test, feature = \"x\"))]\npub fn kept() { crate::a::f() }\n#[cfg(any(test, feature = \"test-util\"))]\npub mod fake { fn f() { crate::b::g() } }\n",
        ),
    ];
    // Only the item under `any(test, ..)`, which product builds can have.
    assert_eq!(edges(&files), [pair("c", "a")]);
}

#[test]
fn macros_comments_and_strings() {
    let files = [
        ("lib.rs", LIB),
        (
            "a.rs",
            "// crate::b::not_a_reference\n/// crate::b::neither\nfn f() {\n    let _ = \"crate::b::nor_this\";\n    tracing::info!(x = ?crate::c::value());\n}\n",
        ),
        ("b.rs", ""),
        ("c.rs", "macro_rules! m { () => { $crate::b::B } }\n"),
    ];
    let graph = graph_of(&tree(&files)).unwrap();
    assert_eq!(graph.edges.keys().cloned().collect::<Vec<_>>(), [pair("a", "c"), pair("c", "b")]);
    assert_eq!(graph.edges[&pair("a", "c")][0].line, 5);
}

#[test]
fn root_reexports_resolve_to_their_module() {
    let files = [
        ("lib.rs", "pub mod a;\npub mod b;\npub use b::Widget;\npub use crate::b::{Gadget as Gizmo};\n"),
        ("a.rs", "use crate::Widget;\nfn f() -> crate::Gizmo { todo!() }\n"),
        ("b.rs", "pub struct Widget;\npub struct Gadget;\n"),
    ];
    let graph = graph_of(&tree(&files)).unwrap();
    assert_eq!(graph.edges[&pair("a", "b")].len(), 2);
}

#[test]
fn pub_use_reexports_are_edges() {
    let files = [("lib.rs", LIB), ("a.rs", "pub use crate::b::B;\n"), ("b.rs", "pub use super::c::C;\n"), ("c.rs", "")];
    assert_eq!(edges(&files), [pair("a", "b"), pair("b", "c")]);
}

#[test]
fn mermaid_drops_implied_edges() {
    let files = [
        ("lib.rs", LIB),
        ("a.rs", "use crate::b::B;\nuse crate::c::C;\n"),
        ("b.rs", "use crate::c::C;\n"),
        ("c.rs", ""),
    ];
    let text = graph_of(&tree(&files)).unwrap().mermaid();
    assert_eq!(text, "graph TD\n  a --> b\n  b --> c\n");
}

#[test]
fn unparsable_source_names_the_file() {
    let files = [("lib.rs", LIB), ("a/broken.rs", "fn (")];
    let err = format!("{:#}", graph_of(&tree(&files)).unwrap_err());
    assert!(err.contains("a/broken.rs"), "{err}");
}

#[test]
fn known_edges_are_tolerated_and_must_still_exist() {
    let files = [("lib.rs", LIB), ("a.rs", "use crate::b::B;\n"), ("b.rs", "use crate::a::A;\n"), ("c.rs", "")];
    let graph = graph_of(&tree(&files)).unwrap();
    check(&graph, &[]).unwrap_err();
    check(&graph, &[KnownEdge { from: "b", to: "a", why: "" }]).unwrap();
    let stale = format!("{:#}", check(&graph, &[KnownEdge { from: "c", to: "a", why: "" }]).unwrap_err());
    assert!(stale.contains("c -> a") && stale.contains("remove"), "{stale}");
}
