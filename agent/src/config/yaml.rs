//! Reading config files (YAML or JSON) into nodes, and finding the line of
//! a value for error messages.
//!
//! serde_yaml reports positions only in its errors. To find where a value
//! sits, `locate` deserializes the document once more with a visitor that
//! walks down the path and fails on purpose at the target (its key, for a
//! map entry): serde_yaml attaches the position of the node being read to
//! that error. This costs a second parse, but only when reporting an error.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{
    error::ConfigError,
    tree::{Node, Origin, Seg, Value},
};

/// Parses one document. `Ok(None)` for an empty document.
pub fn parse(file: usize, path: &std::path::Path, text: &str) -> Result<Option<Node>, ConfigError> {
    if let Err(e) = crate::yaml_depth::check(text) {
        return Err(ConfigError::file(path, None, format!("not valid YAML: {e}")));
    }
    let value: serde_yaml::Value = serde_yaml::from_str(text).map_err(|e| {
        let line = e.location().map(|l| l.line());
        ConfigError::file(path, line, format!("not valid YAML: {}", strip_position(&e.to_string())))
    })?;
    if value.is_null() {
        return Ok(None);
    }
    let mut at = vec![];
    convert(value, file, &mut at).map(Some).map_err(|(at, message)| ConfigError::file(path, locate(text, &at), message))
}

/// serde_yaml appends ` at line L column C` (and a path prefix for
/// semantic errors); the caller prints the line itself.
fn strip_position(msg: &str) -> String {
    match msg.find(" at line ") {
        Some(i) => {
            let (head, tail) = msg.split_at(i);
            // Keep libyaml's context (", while parsing ...") without its position.
            match tail.find(", ") {
                Some(j) => format!("{head}{}", tail[j..].split(" at line ").next().unwrap_or_default()),
                None => head.to_owned(),
            }
        }
        None => msg.to_owned(),
    }
}

fn convert(value: serde_yaml::Value, file: usize, at: &mut Vec<Seg>) -> Result<Node, (Vec<Seg>, String)> {
    let origin = Origin::File { file, path: at.clone() };
    let v = match value {
        serde_yaml::Value::Null => Value::Null,
        serde_yaml::Value::Bool(b) => Value::Bool(b),
        serde_yaml::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_yaml::Value::String(s) => Value::Str(s),
        serde_yaml::Value::Sequence(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                at.push(Seg::Index(i));
                out.push(convert(item, file, at)?);
                at.pop();
            }
            Value::List(out)
        }
        serde_yaml::Value::Mapping(m) => {
            let mut out = Vec::with_capacity(m.len());
            for (k, v) in m {
                let key = match k {
                    serde_yaml::Value::String(s) => s,
                    serde_yaml::Value::Number(n) => n.to_string(),
                    serde_yaml::Value::Bool(b) => b.to_string(),
                    serde_yaml::Value::Null => "null".to_owned(),
                    _ => return Err((at.clone(), "a mapping key must be a string".to_owned())),
                };
                at.push(Seg::Key(key.clone()));
                let node = convert(v, file, at)?;
                at.pop();
                out.push((key, node));
            }
            Value::Map(out)
        }
        serde_yaml::Value::Tagged(t) => return convert(t.value, file, at),
    };
    Ok(Node::new(v, origin))
}

const FOUND: &str = "\u{0}swiftlet: located";

/// The 1-based line of the value at `path` in `text` (of its key, for a
/// map entry; of the element, for a list item). None if the path is not
/// in the document.
pub fn locate(text: &str, path: &[Seg]) -> Option<usize> {
    let de = serde_yaml::Deserializer::from_str(text);
    match (Finder { path }).deserialize(de) {
        Ok(()) => None,
        Err(e) if e.to_string().contains(FOUND) => e.location().map(|l| l.line()),
        Err(_) => None,
    }
}

struct Finder<'p> {
    path: &'p [Seg],
}

impl<'de> DeserializeSeed<'de> for Finder<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        if self.path.is_empty() {
            // Fail while the deserializer holds this node, so the error
            // carries its position.
            d.deserialize_any(Fail)
        } else {
            d.deserialize_any(Walk { path: self.path })
        }
    }
}

/// Fails on whatever it is given.
struct Fail;

impl<'de> Visitor<'de> for Fail {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("anything")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(FOUND))
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(FOUND))
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(FOUND))
    }
}

/// Walks down `path`, skipping everything else.
struct Walk<'p> {
    path: &'p [Seg],
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("anything")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some(Seg::Key(want)) = self.path.first() else {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            return Ok(());
        };
        let last = self.path.len() == 1;
        while let Some(hit) = map.next_key_seed(Key { want, last })? {
            if hit {
                map.next_value_seed(Finder { path: &self.path[1..] })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Some(Seg::Index(want)) = self.path.first() else {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(());
        };
        let mut i = 0;
        loop {
            let more = if i == *want {
                seq.next_element_seed(Finder { path: &self.path[1..] })?.is_some()
            } else {
                seq.next_element::<IgnoredAny>()?.is_some()
            };
            if !more {
                return Ok(());
            }
            i += 1;
        }
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Ok(())
    }
}

/// A map key: true when it is the one wanted; fails at the key itself when
/// it is the path's last step, so the position is the key's.
struct Key<'p> {
    want: &'p str,
    last: bool,
}

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        match (v == self.want, self.last) {
            (true, true) => Err(E::custom(FOUND)),
            (hit, _) => Ok(hit),
        }
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<bool, E> {
        self.visit_str(&v.to_string())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<bool, E> {
        self.visit_str(&v.to_string())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<bool, E> {
        self.visit_str(&v.to_string())
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
        self.visit_str(&v.to_string())
    }
    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        self.visit_str("null")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(false)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    const DOC: &str = "\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
evictionHard:
  memory.available: 2Gx
  \"nodefs.available\": 10%
flow: {a: 1, b: [x, y]}
registerWithTaints:
- key: k
  effect: NoSchedule
- key: k2
# a comment
maxPods: 10
";

    fn key(k: &str) -> Seg {
        Seg::Key(k.to_owned())
    }

    #[test]
    fn locates_keys_elements_and_flow_values() {
        let cases: Vec<(Vec<Seg>, Option<usize>)> = vec![
            (vec![key("kind")], Some(2)),
            (vec![key("evictionHard")], Some(3)),
            (vec![key("evictionHard"), key("memory.available")], Some(4)),
            (vec![key("evictionHard"), key("nodefs.available")], Some(5)),
            (vec![key("flow"), key("b"), Seg::Index(1)], Some(6)),
            (vec![key("registerWithTaints"), Seg::Index(1)], Some(10)),
            (vec![key("registerWithTaints"), Seg::Index(0), key("effect")], Some(9)),
            (vec![key("maxPods")], Some(12)),
            (vec![key("nope")], None),
            (vec![key("evictionHard"), key("nope")], None),
            (vec![key("registerWithTaints"), Seg::Index(7)], None),
        ];
        for (path, want) in cases {
            assert_eq!(locate(DOC, &path), want, "{path:?}");
        }
    }

    #[test]
    fn parse_keeps_origins() {
        let node = parse(3, Path::new("k.yaml"), DOC).unwrap().unwrap();
        let m = node.get("evictionHard").unwrap().get("memory.available").unwrap();
        assert_eq!(m.value, Value::Str("2Gx".into()));
        assert_eq!(m.origin, Origin::File { file: 3, path: vec![key("evictionHard"), key("memory.available")] });
        assert_eq!(node.get("maxPods").unwrap().value, Value::Int(10));
        assert!(parse(0, Path::new("e.yaml"), "  \n# nothing\n").unwrap().is_none());
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let cases = [
            (
                "a: 1\nb: [1\n",
                "x.yaml:3: not valid YAML: did not find expected ',' or ']', while parsing a flow sequence",
            ),
            ("a: 1\na: 2\n", "x.yaml:1: not valid YAML: duplicate entry with key \"a\""),
            (
                "a:\n  - b\n c: d\n",
                "x.yaml:3: not valid YAML: did not find expected key, while parsing a block mapping",
            ),
            (
                "a: 1\n---\nb: 2\n",
                "x.yaml: not valid YAML: deserializing from YAML containing more than one document is not supported",
            ),
            ("? [a]\n: 1\n", "x.yaml:1: a mapping key must be a string"),
        ];
        for (text, want) in cases {
            let got = parse(0, Path::new("x.yaml"), text).unwrap_err().to_string();
            assert_eq!(got, want, "{text:?}");
        }
    }
}
