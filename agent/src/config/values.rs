//! Typed reads of tree nodes, with errors that name the source and field.
//!
//! Values from files must have the YAML type the kubelet's field has (a
//! string where it wants a string, an integer where it wants an integer).
//! Values from flags are always strings and are parsed as Go's flag package
//! parses them.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use super::{
    duration::{self, DurationError},
    error::ConfigError,
    tree::{Node, Origin, Sources, Value},
};
use crate::quantity::{Quantity, QuantityError};

/// Read context: where the files are, for error lines.
pub struct Ctx<'a> {
    pub sources: &'a Sources,
}

/// A short description of a value for "expected X, got Y".
pub fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Int(i) => format!("integer {i}"),
        Value::Float(f) => format!("number {f}"),
        Value::Str(s) => format!("string {s:?}"),
        Value::List(_) => "a list".to_owned(),
        Value::Map(_) => "a mapping".to_owned(),
    }
}

/// Go's strconv.ParseBool.
pub fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Go's strconv.ParseInt(s, 0, 64), which pflag uses for integer flags:
/// decimal, `0x`/`0o`/`0b` prefixes, a leading `0` for octal, and `_`
/// between digits when a prefix is given.
pub fn parse_go_int(s: &str) -> Option<i64> {
    let (negative, body) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits, prefixed) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d.to_owned(), true)
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d.to_owned(), true)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d.to_owned(), true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, lower[1..].to_owned(), true)
    } else {
        (10, lower.clone(), false)
    };
    // Go allows `_` only with a base prefix, between digits or right after
    // the prefix.
    if digits.is_empty() || digits.ends_with('_') || digits.contains("__") {
        return None;
    }
    if digits.contains('_') && !prefixed {
        return None;
    }
    let clean: String = digits.chars().filter(|c| *c != '_').collect();
    let magnitude = i128::from_str_radix(&clean, radix).ok()?;
    let v = if negative { -magnitude } else { magnitude };
    i64::try_from(v).ok()
}

/// The message for a quantity that does not parse.
pub fn quantity_problem(raw: &str, e: &QuantityError) -> String {
    match e {
        QuantityError::Empty => "the quantity is empty".to_owned(),
        QuantityError::Invalid(_) => format!(
            "{raw:?} is not a quantity: expected a number with an optional suffix \
             (Ki, Mi, Gi, Ti, Pi, Ei, n, u, m, k, M, G, T, P, E)"
        ),
        QuantityError::Overflow(_) => format!("{raw:?} is too large"),
    }
}

pub fn duration_problem(raw: &str, e: DurationError) -> String {
    match e {
        DurationError::Invalid => format!("{raw:?} is not a duration (examples: 10s, 1m30s, 2h, 500ms)"),
        DurationError::Negative => format!("{raw:?} is negative"),
    }
}

fn from_flag(node: &Node) -> bool {
    matches!(node.origin, Origin::Flag(_))
}

impl Ctx<'_> {
    pub fn err(&self, node: &Node, field: &str, message: impl Into<String>) -> ConfigError {
        self.sources.error(&node.origin, field, message)
    }

    fn expected(&self, node: &Node, field: &str, what: &str) -> ConfigError {
        self.err(node, field, format!("expected {what}, got {}", describe(&node.value)))
    }

    pub fn string(&self, node: &Node, field: &str) -> Result<String, ConfigError> {
        match &node.value {
            Value::Str(s) => Ok(s.clone()),
            _ => Err(self.expected(node, field, "a string")),
        }
    }

    /// A string, also accepting a number written without quotes (a quantity
    /// such as `cpu: 1`).
    pub fn scalar_string(&self, node: &Node, field: &str) -> Result<String, ConfigError> {
        match &node.value {
            Value::Str(s) => Ok(s.clone()),
            Value::Int(i) => Ok(i.to_string()),
            Value::Float(f) => Ok(f.to_string()),
            _ => Err(self.expected(node, field, "a string")),
        }
    }

    pub fn boolean(&self, node: &Node, field: &str) -> Result<bool, ConfigError> {
        match &node.value {
            Value::Bool(b) => Ok(*b),
            Value::Str(s) if from_flag(node) => {
                parse_go_bool(s).ok_or_else(|| self.err(node, field, format!("{s:?} is not a boolean (true or false)")))
            }
            _ => Err(self.expected(node, field, "true or false")),
        }
    }

    pub fn int(&self, node: &Node, field: &str) -> Result<i64, ConfigError> {
        match &node.value {
            Value::Int(i) => Ok(*i),
            Value::Str(s) if from_flag(node) => {
                parse_go_int(s).ok_or_else(|| self.err(node, field, format!("{s:?} is not an integer")))
            }
            _ => Err(self.expected(node, field, "an integer")),
        }
    }

    /// An integer within `min..=max`.
    pub fn int_in(&self, node: &Node, field: &str, min: i64, max: i64) -> Result<i64, ConfigError> {
        let v = self.int(node, field)?;
        if v < min || v > max {
            let range = if max == i64::MAX {
                format!("must be at least {min}")
            } else {
                format!("must be between {min} and {max}")
            };
            return Err(self.err(node, field, format!("{v} {range}")));
        }
        Ok(v)
    }

    pub fn float(&self, node: &Node, field: &str) -> Result<f64, ConfigError> {
        match &node.value {
            Value::Int(i) => Ok(*i as f64),
            Value::Float(f) => Ok(*f),
            Value::Str(s) if from_flag(node) => {
                s.parse().map_err(|_| self.err(node, field, format!("{s:?} is not a number")))
            }
            _ => Err(self.expected(node, field, "a number")),
        }
    }

    pub fn duration(&self, node: &Node, field: &str) -> Result<Duration, ConfigError> {
        match &node.value {
            Value::Str(s) => duration::parse(s).map_err(|e| self.err(node, field, duration_problem(s, e))),
            _ => Err(self.expected(node, field, "a duration such as \"10s\"")),
        }
    }

    pub fn quantity(&self, node: &Node, field: &str) -> Result<Quantity, ConfigError> {
        let s = self.scalar_string(node, field)?;
        s.parse().map_err(|e| self.err(node, field, quantity_problem(&s, &e)))
    }

    pub fn ip(&self, node: &Node, field: &str) -> Result<IpAddr, ConfigError> {
        let s = self.string(node, field)?;
        s.parse().map_err(|_| self.err(node, field, format!("{s:?} is not an IP address")))
    }

    /// A path; relative paths in a config file are relative to the file's
    /// directory, as the kubelet resolves them.
    pub fn path(&self, node: &Node, field: &str) -> Result<PathBuf, ConfigError> {
        let s = self.string(node, field)?;
        let p = PathBuf::from(&s);
        if p.is_relative()
            && !s.is_empty()
            && let Some(f) = self.sources.file_of(&node.origin)
        {
            return Ok(f.path.parent().unwrap_or(Path::new("")).join(p));
        }
        Ok(p)
    }

    pub fn list<'n>(&self, node: &'n Node, field: &str) -> Result<&'n [Node], ConfigError> {
        match &node.value {
            Value::List(items) => Ok(items),
            _ => Err(self.expected(node, field, "a list")),
        }
    }

    pub fn string_list(&self, node: &Node, field: &str) -> Result<Vec<String>, ConfigError> {
        self.list(node, field)?.iter().map(|n| self.string(n, field)).collect()
    }

    pub fn map<'n>(&self, node: &'n Node, field: &str) -> Result<&'n [(String, Node)], ConfigError> {
        match &node.value {
            Value::Map(entries) => Ok(entries),
            _ => Err(self.expected(node, field, "a mapping")),
        }
    }

    /// A map of strings: (key, value, the value's node for errors).
    pub fn string_map<'n>(&self, node: &'n Node, field: &str) -> Result<Vec<(String, String, &'n Node)>, ConfigError> {
        let entries = self.map(node, field)?;
        let mut out = Vec::with_capacity(entries.len());
        for (k, v) in entries {
            let s = match &v.value {
                Value::Str(s) => s.clone(),
                Value::Int(i) => i.to_string(),
                Value::Float(f) => f.to_string(),
                other => {
                    return Err(self.err(v, field, format!("{k:?}: expected a string, got {}", describe(other))));
                }
            };
            out.push((k.clone(), s, v));
        }
        Ok(out)
    }
}

/// Reads a mapping field by field, then reports the first key nobody asked
/// for as unknown, as the kubelet's strict decoding does.
pub struct Object<'a> {
    cx: &'a Ctx<'a>,
    entries: &'a [(String, Node)],
    used: Vec<bool>,
    /// The object's own field path ("" at the top).
    pub field: String,
}

impl<'a> Object<'a> {
    pub fn new(cx: &'a Ctx<'a>, node: &'a Node, field: &str) -> Result<Object<'a>, ConfigError> {
        let entries = cx.map(node, field)?;
        Ok(Object { cx, entries, used: vec![false; entries.len()], field: field.to_owned() })
    }

    /// The dotted path of a child field.
    pub fn child(&self, key: &str) -> String {
        if self.field.is_empty() { key.to_owned() } else { format!("{}.{key}", self.field) }
    }

    /// The value of `key`; an explicit null counts as absent.
    pub fn get(&mut self, key: &str) -> Option<&'a Node> {
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        self.used[i] = true;
        let node = &self.entries[i].1;
        (!node.is_null()).then_some(node)
    }

    pub fn string(&mut self, key: &str) -> Result<Option<String>, ConfigError> {
        let f = self.child(key);
        self.get(key).map(|n| self.cx.string(n, &f)).transpose()
    }

    pub fn boolean(&mut self, key: &str) -> Result<Option<bool>, ConfigError> {
        let f = self.child(key);
        self.get(key).map(|n| self.cx.boolean(n, &f)).transpose()
    }

    pub fn int_in(&mut self, key: &str, min: i64, max: i64) -> Result<Option<i64>, ConfigError> {
        let f = self.child(key);
        self.get(key).map(|n| self.cx.int_in(n, &f, min, max)).transpose()
    }

    pub fn duration(&mut self, key: &str) -> Result<Option<Duration>, ConfigError> {
        let f = self.child(key);
        self.get(key).map(|n| self.cx.duration(n, &f)).transpose()
    }

    /// A duration where zero (as kubeadm writes `0s`) means the default, as
    /// the kubelet's defaulting treats its non-pointer durations.
    pub fn duration_or(&mut self, key: &str, default: Duration) -> Result<Duration, ConfigError> {
        Ok(self.duration(key)?.filter(|d| !d.is_zero()).unwrap_or(default))
    }

    pub fn path(&mut self, key: &str) -> Result<Option<PathBuf>, ConfigError> {
        let f = self.child(key);
        Ok(self.get(key).map(|n| self.cx.path(n, &f)).transpose()?.filter(|p| !p.as_os_str().is_empty()))
    }

    pub fn string_list(&mut self, key: &str) -> Result<Option<Vec<String>>, ConfigError> {
        let f = self.child(key);
        self.get(key).map(|n| self.cx.string_list(n, &f)).transpose()
    }

    /// The first key not read, as an error at that key.
    pub fn finish(self) -> Result<(), ConfigError> {
        let Some(i) = self.used.iter().position(|u| !u) else { return Ok(()) };
        let (key, node) = &self.entries[i];
        Err(self.cx.err(node, &self.field, format!("unknown field {key:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_bools() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_go_bool(t), Some(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_go_bool(f), Some(false), "{f}");
        }
        for bad in ["", "yes", "no", "tRUE", "2"] {
            assert_eq!(parse_go_bool(bad), None, "{bad}");
        }
    }

    #[test]
    fn go_ints() {
        let cases: &[(&str, Option<i64>)] = &[
            ("110", Some(110)),
            ("-5", Some(-5)),
            ("+7", Some(7)),
            ("0", Some(0)),
            ("0x1F", Some(31)),
            ("0o17", Some(15)),
            ("017", Some(15)),
            ("0b101", Some(5)),
            ("0x_1f", Some(31)),
            ("0_17", Some(15)),
            ("0x", None),
            ("1_000", None),
            ("", None),
            ("-", None),
            ("12a", None),
            ("1.5", None),
            ("9223372036854775807", Some(i64::MAX)),
            ("9223372036854775808", None),
            ("-9223372036854775808", Some(i64::MIN)),
        ];
        for (s, want) in cases {
            assert_eq!(parse_go_int(s), *want, "{s}");
        }
    }

    #[test]
    fn describes_values() {
        assert_eq!(describe(&Value::Str("a".into())), "string \"a\"");
        assert_eq!(describe(&Value::Int(5)), "integer 5");
        assert_eq!(describe(&Value::Map(vec![])), "a mapping");
    }
}
