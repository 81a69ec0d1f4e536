//! Configuration as the kubelet reads it: KubeletConfiguration
//! (kubelet.config.k8s.io/v1beta1) from `--config`, drop-ins from
//! `--config-dir`, and the kubelet's command-line flags.
//!
//! Precedence: defaults < config file < drop-ins (lexical order, merged as
//! JSON merge patches) < flags; a flag repeated later wins. Errors name the
//! source (file and line, or flag) and the field.
//!
//! Pipeline: `flags::parse` (pflag rules) → read the files into trees of
//! nodes that remember their origin (`yaml`, `tree`) → merge → put flag
//! values over the merged tree → `kubelet::read` / `options::read` turn it
//! into typed values, checking each against the kubelet's rules.

pub mod audit;
mod cgroups;
pub mod duration;
mod error;
mod flags;
mod kubelet;
mod kubelet_extra;
mod options;
pub mod thresholds;
mod tree;
pub mod validation;
mod values;
mod yaml;

use std::{
    io,
    path::{Path, PathBuf},
};

pub use cgroups::{CgroupDriver, systemd_root_parts};
pub use error::{ConfigError, ErrorSource};
pub use kubelet::{
    API_VERSION, Authentication, Authorization, AuthorizationMode, Enforcement, KIND, KubeletConfiguration, Logging,
    Reservation, ReservedResource, format_quantity,
};
pub use options::{KubeletFlags, MemoryPressureSignal, ServerLimits, SwiftletOptions};
use serde_json::json;
use tree::{Node, Origin, Sources, Value};
use values::Ctx;

/// The effective configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Command-line-only kubelet settings (--kubeconfig, --node-ip, ...).
    pub flags: KubeletFlags,
    /// The effective KubeletConfiguration.
    pub kubelet: KubeletConfiguration,
    /// swiftlet's own flags.
    pub swiftlet: SwiftletOptions,
    /// Remarks for the log once logging is up (deprecated flags and the like).
    pub warnings: Vec<String>,
}

impl Config {
    /// The body of GET /configz: `{"kubeletconfig": {...}}`.
    pub fn configz(&self) -> serde_json::Value {
        json!({ "kubeletconfig": self.kubelet.to_json() })
    }

    /// True when swiftlet runs without an API server: --standalone, or no
    /// --kubeconfig (and no bootstrap kubeconfig), as the kubelet.
    pub fn standalone(&self) -> bool {
        self.swiftlet.standalone || (self.flags.kubeconfig.is_none() && self.flags.bootstrap_kubeconfig.is_none())
    }

    /// The node's name: --hostname-override, else the host name, lowercased.
    pub fn node_name(&self) -> io::Result<String> {
        if let Some(h) = &self.flags.hostname_override {
            return Ok(h.clone());
        }
        // uname's node name is what gethostname(3) returns.
        Ok(rustix::system::uname().nodename().to_string_lossy().trim().to_lowercase())
    }
}

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Invocation {
    Run(Box<Config>),
    /// --help: the text to print.
    Help(String),
    /// --version: the text to print.
    Version(String),
}

/// File access for the loader, so tests can use an in-memory tree.
pub trait ConfigFs {
    fn read_to_string(&self, path: &Path) -> io::Result<String>;
    /// Entries of a directory: (path, is_dir).
    fn read_dir(&self, dir: &Path) -> io::Result<Vec<(PathBuf, bool)>>;
}

/// The real filesystem.
pub struct OsFs;

impl ConfigFs for OsFs {
    fn read_to_string(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<(PathBuf, bool)>> {
        std::fs::read_dir(dir)?.map(|e| e.and_then(|e| Ok((e.path(), e.file_type()?.is_dir())))).collect()
    }
}

/// Loads the configuration from the command line (without the program
/// name) and the files it names. --help and --version are ignored here.
pub fn load<I, S>(args: I) -> Result<Config, ConfigError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    load_with(args, &OsFs)
}

/// What the command line asks for: run with a configuration, or print help
/// or the version (checked before any file is read, as the kubelet does).
pub fn invocation<I, S>(args: I) -> Result<Invocation, ConfigError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    invocation_with(args, &OsFs)
}

pub fn invocation_with<I, S>(args: I, fs: &dyn ConfigFs) -> Result<Invocation, ConfigError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let parsed = flags::parse(args)?;
    if parsed.help() {
        return Ok(Invocation::Help(help()));
    }
    if parsed.version() {
        return Ok(Invocation::Version(version()));
    }
    build(&parsed, fs).map(|c| Invocation::Run(Box::new(c)))
}

pub fn load_with<I, S>(args: I, fs: &dyn ConfigFs) -> Result<Config, ConfigError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    build(&flags::parse(args)?, fs)
}

pub fn version() -> String {
    format!("swiftlet v{}", env!("CARGO_PKG_VERSION"))
}

/// The --help text, listing every flag with its default.
pub fn help() -> String {
    let defaults = KubeletConfiguration::default().to_json();
    flags::help_text(|path| {
        let mut v = &defaults;
        for p in path {
            v = v.get(p)?;
        }
        let langle = path == ["evictionHard"];
        match v {
            serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
            serde_json::Value::Number(n) if n.as_f64() != Some(0.0) => Some(n.to_string()),
            serde_json::Value::Bool(true) => Some("true".to_owned()),
            serde_json::Value::Array(a) if !a.is_empty() => {
                Some(a.iter().map(|x| x.as_str().unwrap_or_default().to_owned()).collect::<Vec<_>>().join(","))
            }
            serde_json::Value::Object(m) if !m.is_empty() => Some(
                m.iter()
                    .map(|(k, x)| format!("{k}{}{}", if langle { "<" } else { "=" }, x.as_str().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            _ => None,
        }
    })
}

/// Reads a config file or drop-in; None for an empty drop-in.
fn read_file(sources: &mut Sources, fs: &dyn ConfigFs, path: &Path, main: bool) -> Result<Option<Node>, ConfigError> {
    let text =
        fs.read_to_string(path).map_err(|e| ConfigError::file(path, None, format!("cannot read the file: {e}")))?;
    let idx = sources.add(path, text);
    let text = &sources.files[idx].text;
    let Some(node) = yaml::parse(idx, path, text)? else {
        if main {
            return Err(ConfigError::file(path, None, "the file is empty; expected a KubeletConfiguration"));
        }
        return Ok(None);
    };
    let cx = Ctx { sources };
    if !matches!(node.value, Value::Map(_)) {
        return Err(ConfigError::file(
            path,
            Some(1),
            format!("expected a KubeletConfiguration mapping, got {}", values::describe(&node.value)),
        ));
    }
    for (field, want) in [("apiVersion", API_VERSION), ("kind", KIND)] {
        match node.get(field) {
            None => {
                return Err(ConfigError {
                    location: ErrorSource::File { path: path.to_owned(), line: None },
                    field: Some(field.to_owned()),
                    message: format!("missing; expected {want:?}"),
                });
            }
            Some(n) => {
                let got = cx.string(n, field)?;
                if got != want {
                    return Err(cx.err(n, field, format!("{got:?} is not supported; expected {want:?}")));
                }
            }
        }
    }
    Ok(Some(node))
}

/// The files of a drop-in directory, as Go's filepath.WalkDir visits them
/// (lexical order, depth first), that end in `.conf`.
fn drop_ins(fs: &dyn ConfigFs, dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let mut entries = fs
        .read_dir(dir)
        .map_err(|e| ConfigError::file(dir, None, format!("cannot read the drop-in directory: {e}")))?;
    entries.sort_by(|a, b| a.0.file_name().cmp(&b.0.file_name()));
    let mut out = vec![];
    for (path, is_dir) in entries {
        if is_dir {
            out.extend(drop_ins(fs, &path)?);
        } else if path.extension().is_some_and(|e| e == "conf") {
            out.push(path);
        }
    }
    Ok(out)
}

fn build(parsed: &flags::ParsedFlags, fs: &dyn ConfigFs) -> Result<Config, ConfigError> {
    let mut sources = Sources::default();
    let mut root = Node::empty_map(Origin::Default);
    let nonempty = |name: &str| parsed.string(name).filter(|s| !s.is_empty()).map(PathBuf::from);
    if let Some(path) = nonempty("config")
        && let Some(node) = read_file(&mut sources, fs, &path, true)?
    {
        root = node;
    }
    // An absent evictionHard is the defaults, put in before the drop-ins so
    // that a drop-in's evictionHard merges into them, as the kubelet does.
    if root.get("evictionHard").is_none_or(Node::is_null) {
        let defaults = thresholds::DEFAULT_EVICTION_HARD
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Node::str(*v, Origin::Default)))
            .collect();
        root.set_path(&["evictionHard"], Node::new(Value::Map(defaults), Origin::Default));
    }
    if let Some(dir) = nonempty("config-dir") {
        for path in drop_ins(fs, &dir)? {
            if let Some(node) = read_file(&mut sources, fs, &path, false)? {
                tree::merge_patch(&mut root, node);
            }
        }
    }
    for (def, node) in &parsed.values {
        let flags::Target::Config(path) = def.target else { continue };
        if def.kind == flags::Kind::BoolMap {
            // Feature gates from flags add to the file's, as the kubelet does.
            let mut patch = Node::empty_map(node.origin.clone());
            patch.set_path(path, node.clone());
            tree::merge_patch(&mut root, patch);
        } else {
            root.set_path(path, node.clone());
        }
    }
    let cx = Ctx { sources: &sources };
    let mut warnings = vec![];
    let kubelet = kubelet::read(&cx, &root, &mut warnings)?;
    let (flags, swiftlet, flag_warnings) = options::read(&cx, parsed)?;
    warnings.extend(flag_warnings);
    Ok(Config { flags, kubelet, swiftlet, warnings })
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod audit_tests;
