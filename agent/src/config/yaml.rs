//! Reading config files (YAML or JSON) into nodes, and finding the line of
//! a value for error messages.
//!
//! serde-saphyr reads the text straight into the config tree (no
//! intermediate YAML value), with the budgets and scalar rules of
//! [`crate::yaml_read`]; its errors carry the line. `locate` reads the
//! text once more into a tree of positions, only when an error found
//! later (a bad value, an unknown field) needs the line of a path.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::{
    error::ConfigError,
    tree::{Node, Origin, Seg, Value},
};
use crate::{
    yaml_locate::{self, KeyText, PathStep},
    yaml_read::{YamlError, options},
};

/// Parses one document. `Ok(None)` for an empty document.
pub fn parse(file: usize, path: &std::path::Path, text: &str) -> Result<Option<Node>, ConfigError> {
    let seed = NodeSeed { file, at: vec![] };
    let node = serde_saphyr::with_deserializer_from_str_with_options(text, options(), |de| seed.deserialize(de))
        .map_err(|e| {
            let e = YamlError::new(&e, text);
            ConfigError::file(path, e.line, format!("not valid YAML: {}", e.message))
        })?;
    Ok((!node.is_null()).then_some(node))
}

/// Builds a [`Node`] whose origin is its path in file `file`.
struct NodeSeed {
    file: usize,
    at: Vec<Seg>,
}

impl NodeSeed {
    fn node(self, value: Value) -> Node {
        Node::new(value, Origin::File { file: self.file, path: self.at })
    }

    fn child(&self, seg: Seg) -> NodeSeed {
        let mut at = self.at.clone();
        at.push(seg);
        NodeSeed { file: self.file, at }
    }
}

impl<'de> DeserializeSeed<'de> for NodeSeed {
    type Value = Node;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NodeSeed {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(self.node(Value::Null))
    }
    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(self.node(Value::Null))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Node, E> {
        Ok(self.node(Value::Bool(v)))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Node, E> {
        Ok(self.node(Value::Int(v)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node, E> {
        Ok(self.node(i64::try_from(v).map_or(Value::Float(v as f64), Value::Int)))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node, E> {
        Ok(self.node(Value::Float(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
        Ok(self.node(Value::Str(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Node, E> {
        Ok(self.node(Value::Str(v)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element_seed(self.child(Seg::Index(out.len())))? {
            out.push(item);
        }
        Ok(self.node(Value::List(out)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some(KeyText(key)) = map.next_key()? {
            let node = map.next_value_seed(self.child(Seg::Key(key.clone())))?;
            out.push((key, node));
        }
        Ok(self.node(Value::Map(out)))
    }
}

/// The 1-based line of the value at `path` in `text` (see
/// [`yaml_locate::locate`]).
pub fn locate(text: &str, path: &[Seg]) -> Option<usize> {
    let steps: Vec<PathStep<'_>> = path
        .iter()
        .map(|seg| match seg {
            Seg::Key(k) => PathStep::Key(k),
            Seg::Index(i) => PathStep::Index(*i),
        })
        .collect();
    yaml_locate::locate(text, &steps)
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
        let keys = parse(0, Path::new("k.yaml"), "1: x\ntrue: y\n~: z\n").unwrap().unwrap();
        let Value::Map(entries) = keys.value else { panic!("a map: {keys:?}") };
        assert_eq!(entries.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["1", "true", "null"]);
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let cases = [
            ("a: 1\nb: [1\n", "x.yaml:2: not valid YAML: unclosed bracket '['"),
            ("a: 1\na: 2\n", "x.yaml:2: not valid YAML: duplicate key \"a\""),
            (
                "a:\n  - b\n c: d\n",
                "x.yaml:3: not valid YAML: while parsing a block mapping, did not find expected key",
            ),
            ("a: 1\n---\nb: 2\n", "x.yaml:3: not valid YAML: more than one document"),
            ("? [a]\n: 1\n", "x.yaml:1: not valid YAML: a mapping key must be a string"),
        ];
        for (text, want) in cases {
            let got = parse(0, Path::new("x.yaml"), text).unwrap_err().to_string();
            assert_eq!(got, want, "{text:?}");
        }
    }
}
