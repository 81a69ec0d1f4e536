//! Reads one source file with `syn` and collects every reference it makes to
//! a top-level module of the crate: `crate::a::..` paths in code and types,
//! `use` trees with their nested groups, `super::` chains that climb to the
//! crate root, and the same path shapes inside macro invocations (whose
//! bodies `syn` leaves as tokens). Parsing with `syn` rather than scanning
//! text means comments and string literals can never be mistaken for paths.

use std::collections::{BTreeMap, BTreeSet};

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::visit::{self, Visit};

/// One reference from a file to a top-level module: the module it names
/// and the line it is named on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub target: String,
    pub line: usize,
}

/// What resolution needs to know about the crate: its top-level modules and
/// the names the crate root re-exports (`pub use a::Name;` in lib.rs), so
/// `crate::Name` counts as a reference to `a`.
#[derive(Debug, Default)]
pub struct CrateRoot {
    pub modules: BTreeSet<String>,
    pub reexports: BTreeMap<String, String>,
}

/// Whether the attributes make the item test support: `#[cfg(test)]`, an
/// `all(..)` that requires `test`, or an `any(..)` of `test` and the
/// `test-util` feature (in-memory twins other crates' tests turn on). Such
/// items are never in the product binary.
pub fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| a.path().is_ident("cfg") && a.parse_args::<syn::Meta>().is_ok_and(|m| is_test_support(&m)))
}

fn is_test_support(meta: &syn::Meta) -> bool {
    let items = |l: &syn::MetaList| {
        l.parse_args_with(syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated)
            .map(|p| p.into_iter().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    match meta {
        syn::Meta::Path(p) => p.is_ident("test"),
        syn::Meta::NameValue(nv) => {
            nv.path.is_ident("feature")
                && matches!(&nv.value, syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) if s.value() == "test-util")
        }
        syn::Meta::List(l) if l.path.is_ident("all") => items(l).iter().any(is_test_support),
        syn::Meta::List(l) if l.path.is_ident("any") => {
            let alternatives = items(l);
            !alternatives.is_empty() && alternatives.iter().all(is_test_support)
        }
        syn::Meta::List(_) => false,
    }
}

/// The modules a file declares without a body under `#[cfg(test)]`
/// (`#[cfg(test)] mod tests;`), as full module paths: their files are test
/// code wherever they live.
pub fn test_module_declarations(file: &syn::File, module: &[String]) -> Vec<Vec<String>> {
    fn walk(items: &[syn::Item], module: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        for item in items {
            let syn::Item::Mod(m) = item else { continue };
            module.push(m.ident.to_string());
            if is_test_only(&m.attrs) {
                out.push(module.clone());
            } else if let Some((_, inner)) = &m.content {
                walk(inner, module, out);
            }
            module.pop();
        }
    }
    let mut out = vec![];
    walk(&file.items, &mut module.to_vec(), &mut out);
    out
}

/// The names lib.rs re-exports from a top-level module (`pub use a::X;`,
/// `pub use crate::a::{X, Y as Z};`), mapped to that module.
pub fn root_reexports(file: &syn::File, modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for item in &file.items {
        let syn::Item::Use(u) = item else { continue };
        if !matches!(u.vis, syn::Visibility::Public(_)) || is_test_only(&u.attrs) {
            continue;
        }
        let mut leaves = vec![];
        use_leaves(&u.tree, &mut vec![], &mut leaves);
        for leaf in leaves {
            let path = if leaf.path.first().is_some_and(|s| s == "crate") { &leaf.path[1..] } else { &leaf.path[..] };
            if let (Some(first), Some(name)) = (path.first(), leaf.name)
                && modules.contains(first)
            {
                out.insert(name, first.clone());
            }
        }
    }
    out
}

/// Every reference to a top-level module in `file`, whose module path is
/// `module` (empty for the crate root). Items under `#[cfg(test)]` are
/// skipped.
pub fn references(file: &syn::File, module: &[String], root: &CrateRoot) -> Vec<Reference> {
    let mut collector = Collector { module: module.to_vec(), root, found: vec![] };
    collector.visit_file(file);
    collector.found
}

struct Collector<'a> {
    module: Vec<String>,
    root: &'a CrateRoot,
    found: Vec<Reference>,
}

impl Collector<'_> {
    /// Resolves a path written in the current module and records it when it
    /// names a top-level module.
    fn record(&mut self, segments: &[String], span: Span) {
        if let Some(target) = resolve(segments, &self.module, self.root) {
            self.found.push(Reference { target, line: span.start().line });
        }
    }

    /// Paths inside a macro's tokens: `crate :: a`, `$crate :: a` and
    /// `super :: super :: a`, in any nested group.
    fn scan_tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => self.scan_tokens(g.stream()),
                TokenTree::Ident(id) if (id == "crate" || id == "super") && !follows_path_separator(&trees, i) => {
                    let span = id.span();
                    let mut segments = vec![id.to_string()];
                    let mut j = i + 1;
                    while let Some(next) = path_separator_then_ident(&trees, j) {
                        segments.push(next);
                        j += 3;
                    }
                    if segments.len() > 1 {
                        self.record(&segments, span);
                    }
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

/// Whether the token before `i` is `::` (so `i` is in the middle of a path,
/// such as `std::crate` never is, but `a::super` would be).
fn follows_path_separator(trees: &[TokenTree], i: usize) -> bool {
    i >= 2
        && matches!((&trees[i - 2], &trees[i - 1]), (TokenTree::Punct(a), TokenTree::Punct(b)) if a.as_char() == ':' && b.as_char() == ':')
}

/// `:: ident` starting at `j`: the identifier.
fn path_separator_then_ident(trees: &[TokenTree], j: usize) -> Option<String> {
    match (trees.get(j), trees.get(j + 1), trees.get(j + 2)) {
        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)), Some(TokenTree::Ident(id)))
            if a.as_char() == ':' && b.as_char() == ':' =>
        {
            Some(id.to_string())
        }
        _ => None,
    }
}

/// The top-level module a path written in `module` names, if any: `crate::a`
/// names `a`, `super` climbs one module per segment, `self::` stays.
/// Paths that start anywhere else are external crates, locals or
/// children of the current module (in the same top-level module).
pub fn resolve(segments: &[String], module: &[String], root: &CrateRoot) -> Option<String> {
    let absolute: Vec<&str> = match segments.first().map(String::as_str) {
        Some("crate") => segments[1..].iter().map(String::as_str).collect(),
        Some("super") => {
            let climbs = segments.iter().take_while(|s| *s == "super").count();
            let base = module.get(..module.len().checked_sub(climbs)?)?;
            base.iter().chain(&segments[climbs..]).map(String::as_str).collect()
        }
        Some("self") => module.iter().chain(&segments[1..]).map(String::as_str).collect(),
        _ => return None,
    };
    let first = *absolute.first()?;
    if root.modules.contains(first) {
        return Some(first.to_owned());
    }
    root.reexports.get(first).cloned()
}

/// One leaf of a `use` tree.
struct UseLeaf {
    /// The full path the leaf imports (for a glob, the path before `*`).
    path: Vec<String>,
    /// The name it brings into scope (none for a glob).
    name: Option<String>,
    span: Span,
}

/// The leaves of a `use` tree, through nested groups.
fn use_leaves(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<UseLeaf>) {
    let leaf = |prefix: &Vec<String>, last: Option<&syn::Ident>, name: Option<&syn::Ident>, span: Span| UseLeaf {
        path: prefix.iter().cloned().chain(last.map(|i| i.to_string())).collect(),
        name: name.map(|i| i.to_string()),
        span,
    };
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_leaves(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => out.push(leaf(prefix, Some(&n.ident), Some(&n.ident), n.ident.span())),
        syn::UseTree::Rename(r) => out.push(leaf(prefix, Some(&r.ident), Some(&r.rename), r.ident.span())),
        syn::UseTree::Glob(g) => out.push(leaf(prefix, None, None, g.star_token.span)),
        syn::UseTree::Group(g) => {
            for item in &g.items {
                use_leaves(item, prefix, out);
            }
        }
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if item_attrs(item).is_some_and(is_test_only) {
            return;
        }
        visit::visit_item(self, item);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if let Some((_, items)) = &m.content {
            self.module.push(m.ident.to_string());
            for item in items {
                self.visit_item(item);
            }
            self.module.pop();
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Const(i) => &i.attrs,
            syn::ImplItem::Fn(i) => &i.attrs,
            syn::ImplItem::Type(i) => &i.attrs,
            syn::ImplItem::Macro(i) => &i.attrs,
            _ => return visit::visit_impl_item(self, item),
        };
        if !is_test_only(attrs) {
            visit::visit_impl_item(self, item);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut leaves = vec![];
        use_leaves(&u.tree, &mut vec![], &mut leaves);
        for mut leaf in leaves {
            // `use crate::a::{self}` imports `crate::a`.
            if leaf.path.last().is_some_and(|s| s == "self") {
                leaf.path.pop();
            }
            self.record(&leaf.path, leaf.span);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            if let Some(first) = path.segments.first() {
                self.record(&segments, first.ident.span());
            }
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.scan_tokens(mac.tokens.clone());
        visit::visit_macro(self, mac);
    }

    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {
        // Attribute paths (`#[derive(..)]`, `#[serde(..)]`) are never
        // references to the crate's modules.
    }
}

fn item_attrs(item: &syn::Item) -> Option<&[syn::Attribute]> {
    Some(match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => return None,
    })
}
