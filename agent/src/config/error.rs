//! Configuration errors: one message naming where the bad value came from
//! (file and line, or flag) and the field.

use std::{fmt, path::PathBuf};

/// Where a configuration value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorSource {
    /// A config file or drop-in; `line` is 1-based, None when unknown.
    File { path: PathBuf, line: Option<usize> },
    /// A command-line flag, by its kubelet name (without dashes).
    Flag(String),
    /// The command line as a whole (stray arguments).
    CommandLine,
}

impl fmt::Display for ErrorSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorSource::File { path, line: Some(line) } => write!(f, "{}:{line}", path.display()),
            ErrorSource::File { path, line: None } => write!(f, "{}", path.display()),
            ErrorSource::Flag(name) => write!(f, "flag --{name}"),
            ErrorSource::CommandLine => f.write_str("command line"),
        }
    }
}

/// A configuration error. Its Display is the one line the binary prints:
/// `<file>:<line>: <field>: <problem>` or `flag --<name>: <problem>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub location: ErrorSource,
    /// The KubeletConfiguration field (dotted, e.g. `authentication.anonymous.enabled`);
    /// None when the source already names it (a flag) or there is none.
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.location)?;
        if let Some(field) = &self.field {
            write!(f, "{field}: ")?;
        }
        f.write_str(&self.message)
    }
}

impl ConfigError {
    pub fn flag(name: &str, message: impl Into<String>) -> ConfigError {
        ConfigError { location: ErrorSource::Flag(name.to_owned()), field: None, message: message.into() }
    }

    pub fn file(path: impl Into<PathBuf>, line: Option<usize>, message: impl Into<String>) -> ConfigError {
        ConfigError { location: ErrorSource::File { path: path.into(), line }, field: None, message: message.into() }
    }

    pub fn command_line(message: impl Into<String>) -> ConfigError {
        ConfigError { location: ErrorSource::CommandLine, field: None, message: message.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display() {
        let e = ConfigError {
            location: ErrorSource::File { path: "/etc/kubernetes/kubelet.yaml".into(), line: Some(12) },
            field: Some("evictionHard".into()),
            message: "\"memory.available\": \"2Gx\" is not a quantity".into(),
        };
        assert_eq!(
            e.to_string(),
            "/etc/kubernetes/kubelet.yaml:12: evictionHard: \"memory.available\": \"2Gx\" is not a quantity"
        );
        assert_eq!(ConfigError::flag("max-pods", "oops").to_string(), "flag --max-pods: oops");
        assert_eq!(ConfigError::file("a.yaml", None, "empty").to_string(), "a.yaml: empty");
        assert_eq!(ConfigError::command_line("x").to_string(), "command line: x");
    }
}
