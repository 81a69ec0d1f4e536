//! Label and field selectors, as the API server parses and applies them.
//!
//! Label selectors: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`,
//! `k`, `!k`, comma-separated (all must hold). Field selectors: `path=v`,
//! `path==v`, `path!=v` on any dotted field path of the object's JSON
//! (`metadata.name`, `spec.nodeName`, `status.phase`, `involvedObject.uid`,
//! ...); a missing field compares as the empty string, as the API server's
//! field sets do.

use std::collections::BTreeSet;

use serde_json::Value;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    DoesNotExist(String),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<LabelRequirement>);

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = vec![];
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter().map(str::trim).filter(|p| !p.is_empty()).collect()
}

fn set_of(s: &str) -> Result<BTreeSet<String>, String> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("expected (values), got {s:?}"))?;
    Ok(inner.split(',').map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()).collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<LabelSelector, String> {
        let mut reqs = vec![];
        for part in split_top(s) {
            let req = if let Some(key) = part.strip_prefix('!') {
                LabelRequirement::DoesNotExist(key.trim().to_owned())
            } else if let Some((k, v)) = part.split_once("!=") {
                LabelRequirement::NotEquals(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, v)) = part.split_once("==") {
                LabelRequirement::Equals(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, v)) = part.split_once('=') {
                LabelRequirement::Equals(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                LabelRequirement::NotIn(k.trim().to_owned(), set_of(rest)?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                LabelRequirement::In(k.trim().to_owned(), set_of(rest)?)
            } else if part.chars().all(|c| c.is_alphanumeric() || "-_./".contains(c)) {
                LabelRequirement::Exists(part.to_owned())
            } else {
                return Err(format!("unable to parse requirement: {part:?}"));
            };
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelRequirement::Equals(k, v) => get(k) == Some(v.as_str()),
            LabelRequirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            LabelRequirement::In(k, set) => get(k).is_some_and(|x| set.contains(x)),
            LabelRequirement::NotIn(k, set) => get(k).is_none_or(|x| !set.contains(x)),
            LabelRequirement::Exists(k) => get(k).is_some(),
            LabelRequirement::DoesNotExist(k) => get(k).is_none(),
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldRequirement {
    pub path: String,
    pub value: String,
    pub equal: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<FieldRequirement>);

impl FieldSelector {
    pub fn parse(s: &str) -> Result<FieldSelector, String> {
        let mut reqs = vec![];
        for part in split_top(s) {
            let (path, value, equal) = if let Some((k, v)) = part.split_once("!=") {
                (k, v, false)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, v, true)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, v, true)
            } else {
                return Err(format!("invalid selector: {part:?}; expected field=value or field!=value"));
            };
            reqs.push(FieldRequirement { path: path.trim().to_owned(), value: value.trim().to_owned(), equal });
        }
        Ok(FieldSelector(reqs))
    }

    /// The value a field selector compares: strings as they are, numbers and
    /// booleans as text, missing as "".
    pub fn field(obj: &Value, path: &str) -> String {
        let mut v = obj;
        for p in path.split('.') {
            match v.get(p) {
                Some(x) => v = x,
                None => return String::new(),
            }
        }
        match v {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        }
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|r| (Self::field(obj, &r.path) == r.value) == r.equal)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn label_selectors() {
        let obj = json!({"metadata": {"labels": {"app": "web", "tier": "front"}}});
        let cases = [
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("app!=web", false),
            ("missing!=x", true),
            ("app in (web,db)", true),
            ("app in (db)", false),
            ("app notin (db)", true),
            ("missing notin (db)", true),
            ("app notin (web, db)", false),
            ("tier", true),
            ("missing", false),
            ("!missing", true),
            ("!tier", false),
            ("app=web,tier=front", true),
            ("app=web, tier=back", false),
            ("app in (web,db),tier", true),
            ("", true),
        ];
        for (sel, want) in cases {
            let s = LabelSelector::parse(sel).unwrap_or_else(|e| panic!("{sel}: {e}"));
            assert_eq!(s.matches(&obj), want, "{sel}");
        }
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("a b").is_err());
    }

    #[test]
    fn field_selectors() {
        let pod = json!({"metadata": {"name": "p", "namespace": "default"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        let cases = [
            ("spec.nodeName=n1", true),
            ("spec.nodeName==n1", true),
            ("spec.nodeName=n2", false),
            ("spec.nodeName!=n2", true),
            ("metadata.name=p,metadata.namespace=default", true),
            ("spec.nodeName=n1,status.phase!=Failed,status.phase!=Succeeded", true),
            ("status.phase!=Running", false),
            ("spec.missing=", true),
            ("spec.missing!=", false),
        ];
        for (sel, want) in cases {
            assert_eq!(FieldSelector::parse(sel).unwrap().matches(&pod), want, "{sel}");
        }
        assert!(FieldSelector::parse("spec.nodeName").is_err());
    }
}
