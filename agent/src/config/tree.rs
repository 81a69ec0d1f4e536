//! The configuration as a tree of values that remember where they came
//! from, so that merging files and flags keeps every value's source for the
//! error message that may name it later.

use std::path::{Path, PathBuf};

use super::{
    error::{ConfigError, ErrorSource},
    yaml,
};

/// One step of a path into a YAML document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    Key(String),
    Index(usize),
}

/// Where a node came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// `Sources::files[file]`, at `path` inside the document.
    File { file: usize, path: Vec<Seg> },
    /// A command-line flag (kubelet name).
    Flag(&'static str),
    /// A built-in default.
    Default,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<Node>),
    /// Entries in document order (keys unique).
    Map(Vec<(String, Node)>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub value: Value,
    pub origin: Origin,
}

impl Node {
    pub fn new(value: Value, origin: Origin) -> Node {
        Node { value, origin }
    }

    pub fn str(s: impl Into<String>, origin: Origin) -> Node {
        Node::new(Value::Str(s.into()), origin)
    }

    pub fn empty_map(origin: Origin) -> Node {
        Node::new(Value::Map(vec![]), origin)
    }

    pub fn is_null(&self) -> bool {
        matches!(self.value, Value::Null)
    }

    /// The entry `key` of a map node (None for other nodes).
    pub fn get(&self, key: &str) -> Option<&Node> {
        match &self.value {
            Value::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Sets `path` (map keys) to `node`, creating maps on the way and
    /// replacing whatever was there: a flag overrides a field wholesale.
    pub fn set_path(&mut self, path: &[&str], node: Node) {
        let Some((first, rest)) = path.split_first() else {
            *self = node;
            return;
        };
        if !matches!(self.value, Value::Map(_)) {
            self.value = Value::Map(vec![]);
        }
        let Value::Map(entries) = &mut self.value else { unreachable!("made a map above") };
        let idx = match entries.iter().position(|(k, _)| k == first) {
            Some(i) => i,
            None => {
                entries.push(((*first).to_owned(), Node::empty_map(node.origin.clone())));
                entries.len() - 1
            }
        };
        entries[idx].1.set_path(rest, node);
    }
}

/// Applies `patch` to `base` as a JSON merge patch (RFC 7396), the way the
/// kubelet merges drop-in files: maps merge key by key, a null removes a
/// key, anything else (scalars, lists) replaces.
pub fn merge_patch(base: &mut Node, patch: Node) {
    let Node { value, origin } = patch;
    match (&mut base.value, value) {
        (Value::Map(entries), Value::Map(patch_entries)) => {
            for (key, v) in patch_entries {
                if v.is_null() {
                    entries.retain(|(k, _)| *k != key);
                    continue;
                }
                match entries.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, existing)) => merge_patch(existing, v),
                    None => entries.push((key, strip_nulls(v))),
                }
            }
        }
        (_, value) => *base = strip_nulls(Node { value, origin }),
    }
}

/// A patch applied to nothing: its map entries that are null disappear.
fn strip_nulls(mut node: Node) -> Node {
    if let Value::Map(entries) = &mut node.value {
        entries.retain(|(_, v)| !v.is_null());
        for (_, v) in entries.iter_mut() {
            *v = strip_nulls(std::mem::replace(v, Node::new(Value::Null, Origin::Default)));
        }
    }
    node
}

/// A file that contributed to the configuration, kept to find line numbers
/// for errors.
#[derive(Debug, Clone)]
pub struct SourceFile {
    pub path: PathBuf,
    pub text: String,
}

/// The files read so far, indexed by `Origin::File::file`.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    pub files: Vec<SourceFile>,
}

impl Sources {
    pub fn add(&mut self, path: &Path, text: String) -> usize {
        self.files.push(SourceFile { path: path.to_owned(), text });
        self.files.len() - 1
    }

    /// The file a node came from, if any.
    pub fn file_of(&self, origin: &Origin) -> Option<&SourceFile> {
        match origin {
            Origin::File { file, .. } => self.files.get(*file),
            _ => None,
        }
    }

    /// An error about `node`'s value, naming its source (file and line of
    /// its key, or its flag) and, for files, the field.
    pub fn error(&self, origin: &Origin, field: &str, message: impl Into<String>) -> ConfigError {
        let message = message.into();
        match origin {
            Origin::File { file, path } => {
                let f = &self.files[*file];
                ConfigError {
                    location: ErrorSource::File { path: f.path.clone(), line: yaml::locate(&f.text, path) },
                    field: (!field.is_empty()).then(|| field.to_owned()),
                    message,
                }
            }
            Origin::Flag(name) => ConfigError::flag(name, message),
            Origin::Default => ConfigError {
                location: ErrorSource::CommandLine,
                field: (!field.is_empty()).then(|| field.to_owned()),
                message,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Node {
        Node::str(v, Origin::Default)
    }

    fn map(entries: Vec<(&str, Node)>) -> Node {
        Node::new(Value::Map(entries.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()), Origin::Default)
    }

    fn null() -> Node {
        Node::new(Value::Null, Origin::Default)
    }

    #[test]
    fn merge_patch_follows_rfc7396() {
        let mut base = map(vec![
            ("a", s("1")),
            ("m", map(vec![("x", s("1")), ("y", s("2"))])),
            ("l", Node::new(Value::List(vec![s("1"), s("2")]), Origin::Default)),
            ("gone", s("1")),
        ]);
        let patch = map(vec![
            ("m", map(vec![("y", s("20")), ("z", s("30")), ("x", null())])),
            ("l", Node::new(Value::List(vec![s("9")]), Origin::Default)),
            ("gone", null()),
            ("new", map(vec![("k", null()), ("v", s("1"))])),
        ]);
        merge_patch(&mut base, patch);
        let want = map(vec![
            ("a", s("1")),
            ("m", map(vec![("y", s("20")), ("z", s("30"))])),
            ("l", Node::new(Value::List(vec![s("9")]), Origin::Default)),
            ("new", map(vec![("v", s("1"))])),
        ]);
        assert_eq!(base, want);
    }

    #[test]
    fn merge_patch_replaces_non_maps() {
        let mut base = map(vec![("a", s("1"))]);
        merge_patch(&mut base, map(vec![("a", map(vec![("b", s("2"))]))]));
        assert_eq!(base, map(vec![("a", map(vec![("b", s("2"))]))]));
        merge_patch(&mut base, map(vec![("a", s("3"))]));
        assert_eq!(base, map(vec![("a", s("3"))]));
    }

    #[test]
    fn set_path_creates_and_replaces() {
        let mut root = map(vec![("authentication", map(vec![("webhook", map(vec![("enabled", s("true"))]))]))]);
        root.set_path(&["authentication", "anonymous", "enabled"], s("false"));
        root.set_path(&["authentication", "webhook"], s("x"));
        let want = map(vec![(
            "authentication",
            map(vec![("webhook", s("x")), ("anonymous", map(vec![("enabled", s("false"))]))]),
        )]);
        assert_eq!(root, want);
        let mut scalar = s("oops");
        scalar.set_path(&["a"], s("1"));
        assert_eq!(scalar.get("a"), Some(&s("1")));
    }
}
