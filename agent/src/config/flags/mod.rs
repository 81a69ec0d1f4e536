//! The kubelet's command-line flags, parsed as Go's pflag parses them, and
//! swiftlet's own.
//!
//! Syntax: `--flag=value`, `--flag value`, booleans as `--flag` or
//! `--flag=false` (a bare `--flag false` does not consume `false`), `-v 4`
//! or `-v=4` for the one shorthand, `_` and `-` interchangeable in names,
//! `--` ends the flags. A flag given twice: the later value wins; map flags
//! (`--kube-reserved=cpu=1,memory=2Gi`) start afresh at their first
//! occurrence, replacing the file's map, and merge keys after that; list
//! flags append after their first occurrence (pflag's StringSlice).

mod table;
#[cfg(test)]
mod tests;

pub use self::table::FLAGS;
use super::{
    error::ConfigError,
    tree::{Node, Origin, Value},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Str,
    Bool,
    Int,
    Duration,
    /// `k=v,k2=v2`
    Map,
    /// `k<v,k2<v2` (eviction thresholds)
    LangleMap,
    /// `Gate=true,Other=false`
    BoolMap,
    /// `a,b,c`
    List,
    /// `key=value:Effect,key2:Effect`
    Taints,
    Help,
    Version,
}

impl Kind {
    fn type_name(self) -> &'static str {
        match self {
            Kind::Str => "string",
            Kind::Bool | Kind::Help => "",
            Kind::Int => "int32",
            Kind::Duration => "duration",
            Kind::Map | Kind::LangleMap => "mapStringString",
            Kind::BoolMap => "mapStringBool",
            Kind::List => "strings",
            Kind::Taints => "[]api.Taint",
            Kind::Version => "version[=true]",
        }
    }

    fn takes_no_value(self) -> bool {
        matches!(self, Kind::Bool | Kind::Help | Kind::Version)
    }
}

/// Where a flag's value goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// A KubeletConfiguration field, by its path of camelCase names.
    Config(&'static [&'static str]),
    /// A command-line-only setting (the kubelet's KubeletFlags, or swiftlet's).
    Flag,
}

#[derive(Debug)]
pub struct FlagDef {
    pub name: &'static str,
    pub shorthand: Option<char>,
    pub kind: Kind,
    pub target: Target,
    /// Shown in --help for command-line-only flags (config fields show
    /// their KubeletConfiguration default).
    pub default: Option<&'static str>,
    pub help: &'static str,
}

use Kind::*;

pub fn lookup(name: &str) -> Option<&'static FlagDef> {
    FLAGS.iter().find(|f| f.name == name)
}

fn lookup_short(c: char) -> Option<&'static FlagDef> {
    FLAGS.iter().find(|f| f.shorthand == Some(c))
}

/// pflag with the kubelet's WordSepNormalizeFunc: `_` is `-`.
fn normalize(name: &str) -> String {
    name.replace('_', "-")
}

/// The command line after parsing: each flag given, once, with its final
/// value (later occurrences merged in as pflag does), in order of first
/// appearance.
#[derive(Debug, Default)]
pub struct ParsedFlags {
    pub values: Vec<(&'static FlagDef, Node)>,
}

impl ParsedFlags {
    pub fn get(&self, name: &str) -> Option<&Node> {
        self.values.iter().find(|(d, _)| d.name == name).map(|(_, n)| n)
    }

    /// A command-line-only string flag's value.
    pub fn string(&self, name: &str) -> Option<&str> {
        match &self.get(name)?.value {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    fn is_true(&self, name: &str) -> bool {
        matches!(self.string(name), Some(s) if super::values::parse_go_bool(s) == Some(true) || s == "raw")
    }

    pub fn help(&self) -> bool {
        self.is_true("help")
    }

    pub fn version(&self) -> bool {
        self.is_true("version")
    }
}

/// Parses the arguments (without the program name).
pub fn parse<I, S>(args: I) -> Result<ParsedFlags, ConfigError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let args: Vec<String> = args.into_iter().map(Into::into).collect();
    let mut out = ParsedFlags::default();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            if let Some(extra) = args.get(i) {
                return Err(ConfigError::command_line(format!("unexpected argument {extra:?}")));
            }
            break;
        }
        let (def, inline) = if let Some(body) = arg.strip_prefix("--") {
            if body.starts_with('-') || body.starts_with('=') {
                return Err(ConfigError::command_line(format!("bad flag syntax: {arg}")));
            }
            let (name, value) = match body.split_once('=') {
                Some((n, v)) => (normalize(n), Some(v.to_owned())),
                None => (normalize(body), None),
            };
            let def = lookup(&name)
                .ok_or_else(|| ConfigError::flag(&name, "unknown flag (swiftlet --help lists the flags)"))?;
            (def, value)
        } else if let Some(body) = arg.strip_prefix('-').filter(|b| !b.is_empty()) {
            let c = body.chars().next().unwrap_or_default();
            let def = lookup_short(c).ok_or_else(|| {
                ConfigError::command_line(format!("unknown shorthand flag {c:?} in {arg} (flags start with --)"))
            })?;
            let rest = &body[c.len_utf8()..];
            let value = if let Some(v) = rest.strip_prefix('=') {
                Some(v.to_owned())
            } else if !rest.is_empty() && !def.kind.takes_no_value() {
                Some(rest.to_owned())
            } else if !rest.is_empty() {
                return Err(ConfigError::command_line(format!("bad flag syntax: {arg}")));
            } else {
                None
            };
            (def, value)
        } else {
            return Err(ConfigError::command_line(format!("unexpected argument {arg:?} (flags start with --)")));
        };
        let value = match inline {
            Some(v) => v,
            None if def.kind.takes_no_value() => "true".to_owned(),
            None => match args.get(i) {
                Some(v) => {
                    i += 1;
                    v.clone()
                }
                None => return Err(ConfigError::flag(def.name, "needs a value")),
            },
        };
        set(&mut out, def, &value)?;
    }
    Ok(out)
}

/// Records one occurrence of a flag.
fn set(out: &mut ParsedFlags, def: &'static FlagDef, raw: &str) -> Result<(), ConfigError> {
    let origin = Origin::Flag(def.name);
    let existing = out.values.iter().position(|(d, _)| d.name == def.name);
    let node = match def.kind {
        Map | LangleMap | BoolMap => {
            let sep = if def.kind == LangleMap { '<' } else { '=' };
            let mut entries = match existing.map(|i| &out.values[i].1.value) {
                Some(Value::Map(e)) => e.clone(),
                _ => vec![],
            };
            for pair in raw.split(',').filter(|p| !p.is_empty()) {
                let Some((k, v)) = pair.split_once(sep) else {
                    let expected = if def.kind == LangleMap {
                        "is not a threshold: expected <signal><<value>, e.g. memory.available<100Mi (the operator must be <)"
                    } else {
                        "is not a key=value pair"
                    };
                    return Err(ConfigError::flag(def.name, format!("{pair:?} {expected}")));
                };
                let (k, v) = (k.trim().to_owned(), v.trim().to_owned());
                let v = Node::str(v, origin.clone());
                match entries.iter_mut().find(|(ek, _)| *ek == k) {
                    Some(e) => e.1 = v,
                    None => entries.push((k, v)),
                }
            }
            Node::new(Value::Map(entries), origin)
        }
        List => {
            let mut items = match existing.map(|i| &out.values[i].1.value) {
                Some(Value::List(l)) => l.clone(),
                _ => vec![],
            };
            items.extend(
                raw.split(',').filter(|s| !raw.is_empty() || !s.is_empty()).map(|s| Node::str(s, origin.clone())),
            );
            Node::new(Value::List(items), origin)
        }
        Taints => Node::new(Value::List(parse_taints(def.name, raw)?), origin),
        Str | Bool | Int | Duration | Help | Version => Node::str(raw, origin),
    };
    match existing {
        Some(i) => out.values[i].1 = node,
        None => out.values.push((def, node)),
    }
    Ok(())
}

/// `key=value:Effect`, `key:Effect` or `key`, comma separated, into the
/// shape of `registerWithTaints` entries (validated with them later).
fn parse_taints(flag: &'static str, raw: &str) -> Result<Vec<Node>, ConfigError> {
    let origin = Origin::Flag(flag);
    let mut out = vec![];
    for spec in raw.split(',').filter(|s| !s.is_empty()) {
        let invalid = || {
            ConfigError::flag(
                flag,
                format!("{spec:?} is not a taint: expected <key>=<value>:<effect> or <key>:<effect>"),
            )
        };
        let parts: Vec<&str> = spec.split(':').collect();
        let (kv, effect) = match parts.as_slice() {
            [kv] => (*kv, None),
            [kv, effect] => (*kv, Some(*effect)),
            _ => return Err(invalid()),
        };
        let kvs: Vec<&str> = kv.split('=').collect();
        let (key, value) = match kvs.as_slice() {
            [k] => (*k, None),
            [k, v] => (*k, Some(*v)),
            _ => return Err(invalid()),
        };
        let mut entries = vec![("key".to_owned(), Node::str(key, origin.clone()))];
        if let Some(v) = value {
            entries.push(("value".to_owned(), Node::str(v, origin.clone())));
        }
        if let Some(e) = effect {
            entries.push(("effect".to_owned(), Node::str(e, origin.clone())));
        }
        out.push(Node::new(Value::Map(entries), origin.clone()));
    }
    Ok(out)
}

/// `swiftlet --help`. `config_default` gives the KubeletConfiguration
/// default of a config field, as flag text, for the `(default ...)` note.
pub fn help_text(config_default: impl Fn(&[&str]) -> Option<String>) -> String {
    let mut rows = vec![];
    for f in FLAGS {
        let short = f.shorthand.map(|c| format!("-{c}, ")).unwrap_or_default();
        let left = format!("  {short:>4}--{} {}", f.name, f.kind.type_name());
        let default = match f.target {
            Target::Config(path) => config_default(path),
            Target::Flag => f.default.map(str::to_owned),
        };
        // pflag quotes string defaults only.
        let default = default.map(|d| if f.kind == Str { format!("{d:?}") } else { d });
        let note = default.map(|d| format!(" (default {d})")).unwrap_or_default();
        rows.push((left, format!("{}{note}", f.help)));
    }
    let width = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0) + 3;
    let mut s = String::from(
        "swiftlet is a Kubernetes node agent (a kubelet) whose eviction path runs in the kernel through eBPF.\n\
         It reads the kubelet's flags and KubeletConfiguration (kubelet.config.k8s.io/v1beta1) files.\n\
         Precedence: defaults < --config < --config-dir drop-ins (lexical order) < flags; a flag given twice: the later wins.\n\n\
         Usage:\n  swiftlet [flags]\n\nFlags:\n",
    );
    for (left, right) in rows {
        s.push_str(&format!("{left:width$}{right}\n"));
    }
    s
}
