//! How the agent reads the YAML it is given (KubeletConfiguration files,
//! static pod manifests, the credential provider config): serde-saphyr
//! with budgets, and errors that give the line and column.
//!
//! The budgets bound what a broken or hostile file can cost: nesting depth
//! (block and flow), nodes (counted after alias expansion, so a billion
//! laughs stops early), scalar bytes and documents. The scalar rules are
//! the ones serde_yaml had, so files read as before: YAML 1.2 booleans
//! only (`yes` is a string), and `0640` or `1_000` stay strings where the
//! target is untyped (the manifest reader turns octal modes into numbers
//! itself, as the kubelet reads them).

use serde_saphyr::{DefaultMessageFormatter, Error, MessageFormatter, Options, budget::BudgetBreach};

/// Deeper nesting than this is refused. Kubernetes objects nest about
/// fifteen levels; the YAML parser recurses once per level.
pub const MAX_DEPTH: usize = 64;
/// More values than this (aliases expanded) are refused.
pub const MAX_NODES: usize = 250_000;
/// More bytes of scalar text than this are refused (the API server
/// refuses objects far smaller).
pub const MAX_SCALAR_BYTES: usize = 16 << 20;
/// More documents than this in one file are refused.
pub const MAX_DOCUMENTS: usize = 64;
/// More events replayed through aliases than this are refused: files
/// written for Kubernetes seldom use aliases at all, and an alias bomb
/// stops here long before the node budget.
pub const MAX_ALIAS_EVENTS: usize = 10_000;

/// The options every YAML read in the agent uses.
pub fn options() -> Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_depth: MAX_DEPTH,
            flow_nesting_limit: MAX_DEPTH,
            max_nodes: MAX_NODES,
            max_total_scalar_bytes: MAX_SCALAR_BYTES,
            max_documents: MAX_DOCUMENTS,
        },
        alias_limits: serde_saphyr::alias_limits! { max_total_replayed_events: MAX_ALIAS_EVENTS },
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
        underscored_numbers_as_strings: true,
        with_snippet: false,
    }
}

/// A YAML error as shown to users: what is wrong and, when known, where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}{}", self.line.map(|l| format!(" at line {l} column {}", self.column.unwrap_or(1))).unwrap_or_default())]
pub struct YamlError {
    pub message: String,
    /// 1-based.
    pub line: Option<usize>,
    /// 1-based.
    pub column: Option<usize>,
}

impl YamlError {
    /// Describes `e`, raised while reading `text`.
    pub fn new(e: &Error, text: &str) -> Self {
        let at = e.location().filter(|l| l.line() > 0);
        Self {
            message: message(root(e), text),
            line: at.map(|l| usize::try_from(l.line()).unwrap_or(usize::MAX)),
            column: at.map(|l| usize::try_from(l.column()).unwrap_or(usize::MAX)),
        }
    }
}

/// The error itself, out of the wrappers that only add locations.
fn root(e: &Error) -> &Error {
    match e {
        Error::WithSnippet { error, .. } | Error::AliasError { error, .. } => root(error),
        other => other,
    }
}

fn message(e: &Error, text: &str) -> String {
    match e {
        Error::Budget { breach, .. } => match breach {
            BudgetBreach::Depth { .. } => format!("nesting deeper than {MAX_DEPTH} levels"),
            BudgetBreach::Nodes { .. } => format!("more than {MAX_NODES} values (aliases expanded)"),
            BudgetBreach::ScalarBytes { .. } => format!("more than {MAX_SCALAR_BYTES} bytes of text"),
            BudgetBreach::Documents { .. } => format!("more than {MAX_DOCUMENTS} documents"),
            other => format!("too large to read: {other:?}"),
        },
        Error::AliasReplayLimitExceeded { .. } => {
            format!("more than {MAX_ALIAS_EVENTS} values reached through aliases")
        }
        Error::DuplicateMappingKey { key: Some(key), .. } => format!("duplicate key {key:?}"),
        Error::DuplicateMappingKey { key: None, .. } => "duplicate key".to_owned(),
        Error::MultipleDocuments { .. } => "more than one document".to_owned(),
        // saphyr names the type only; the value is in the text.
        Error::InvalidScalar { ty, location } => match source_text(text, location) {
            Some(value) => format!("invalid {ty}: {value:?}"),
            None => format!("invalid {ty}"),
        },
        other => match DefaultMessageFormatter.format_message(other) {
            // The parser's own name for the flow nesting limit.
            m if m == "recursion limit exceeded" => format!("nesting deeper than {MAX_DEPTH} levels"),
            m => m.into_owned(),
        },
    }
}

/// The text a location covers, when it is one short line.
fn source_text<'t>(text: &'t str, at: &serde_saphyr::Location) -> Option<&'t str> {
    let span = at.span();
    let start = usize::try_from(span.byte_offset()?).ok()?;
    let len = usize::try_from(span.byte_len()?).ok()?;
    let s = text.get(start..start.checked_add(len)?)?;
    (!s.is_empty() && s.len() <= 80 && !s.contains('\n')).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<serde_json::Value, YamlError> {
        serde_saphyr::from_str_with_options(text, options()).map_err(|e| YamlError::new(&e, text))
    }

    #[test]
    fn scalars_read_as_serde_yaml_read_them() {
        let v = read("a: yes\nb: 0640\nc: 1_000\nd: 0o17\ne: true\nf: 0s\ng: ~\nh: 1.5\n").unwrap();
        assert_eq!(
            v,
            serde_json::json!({"a": "yes", "b": "0640", "c": "1_000", "d": 15, "e": true, "f": "0s", "g": null, "h": 1.5})
        );
        assert_eq!(
            read("{\"a\": [1, \"x\", null]}").unwrap(),
            serde_json::json!({"a": [1, "x", null]}),
            "JSON is YAML"
        );
    }

    #[test]
    fn errors_say_what_and_where() {
        let laughs = (1..9).fold("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n".to_owned(), |doc, i| {
            let refs = vec![format!("*a{}", i - 1); 10].join(", ");
            format!("{doc}a{i}: &a{i} [{refs}]\n")
        });
        let cases = [
            ("a: 1\na: 2\n", "duplicate key \"a\" at line 2 column 1"),
            ("a: 1\nb: [1\n", "unclosed bracket '[' at line 2 column 4"),
            ("a: 1\n---\nb: 2\n", "more than one document at line 3 column 1"),
            ("a: !!int soon\n", "invalid u64: \"soon\""),
            (&laughs, "more than 10000 values reached through aliases"),
            (&"- ".repeat(MAX_DEPTH + 1), "nesting deeper than 64 levels"),
            (&"[".repeat(100_000), "nesting deeper than 64 levels at line 1 column 65"),
        ];
        for (text, want) in cases {
            let got = read(text).unwrap_err().to_string();
            assert!(got.starts_with(want), "{text:.40?}: want {want:?}, got {got:?}");
        }
    }
}
