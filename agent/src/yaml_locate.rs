//! Finding where in a YAML (or JSON) text a value sits, for error
//! messages: the text is read once more into a tree of positions, only
//! when an error found after decoding (a value of the wrong type, a bad
//! field) needs the line of its path.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

use crate::yaml_read::options;

/// One step of a path into a document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathStep<'a> {
    Key(&'a str),
    Index(usize),
}

/// A mapping key as text: YAML allows numbers, booleans and null as keys
/// (`1: x`), which name a field as their text does.
pub struct KeyText(pub String);

impl<'de> de::Deserialize<'de> for KeyText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<KeyText, D::Error> {
        d.deserialize_any(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = KeyText;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a mapping key that is a string")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyText, E> {
        Ok(KeyText(v.to_owned()))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<KeyText, E> {
        Ok(KeyText(v.to_string()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<KeyText, E> {
        Ok(KeyText(v.to_string()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<KeyText, E> {
        Ok(KeyText(v.to_string()))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<KeyText, E> {
        Ok(KeyText(v.to_string()))
    }
    fn visit_unit<E: de::Error>(self) -> Result<KeyText, E> {
        Ok(KeyText("null".to_owned()))
    }
    fn visit_none<E: de::Error>(self) -> Result<KeyText, E> {
        self.visit_unit()
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<KeyText, A::Error> {
        Err(de::Error::custom("a mapping key must be a string"))
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<KeyText, A::Error> {
        Err(de::Error::custom("a mapping key must be a string"))
    }
}

/// A document as positions only: what `locate` walks.
enum Located {
    Leaf,
    List(Vec<Spanned<Located>>),
    Map(Vec<(Spanned<KeyText>, Spanned<Located>)>),
}

impl<'de> de::Deserialize<'de> for Located {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Located, D::Error> {
        d.deserialize_any(LocatedVisitor)
    }
}

struct LocatedVisitor;

impl<'de> Visitor<'de> for LocatedVisitor {
    type Value = Located;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Located, E> {
        Ok(Located::Leaf)
    }
    fn visit_none<E: de::Error>(self) -> Result<Located, E> {
        Ok(Located::Leaf)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Located, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Located, E> {
        Ok(Located::Leaf)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Located, E> {
        Ok(Located::Leaf)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Located, E> {
        Ok(Located::Leaf)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Located, E> {
        Ok(Located::Leaf)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Located, E> {
        Ok(Located::Leaf)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Located, A::Error> {
        let mut out = vec![];
        while let Some(item) = seq.next_element()? {
            out.push(item);
        }
        Ok(Located::List(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Located, A::Error> {
        let mut out = vec![];
        while let Some(entry) = map.next_entry()? {
            out.push(entry);
        }
        Ok(Located::Map(out))
    }
}

/// The 1-based line of the value at `path` in `text` (of its key, for a
/// map entry; of the element, for a list item). None if the path is not
/// in the document.
pub fn locate(text: &str, path: &[PathStep<'_>]) -> Option<usize> {
    let root: Spanned<Located> = serde_saphyr::from_str_with_options(text, options()).ok()?;
    let mut line = root.referenced.line();
    let mut node = &root.value;
    for seg in path {
        node = match (node, seg) {
            (Located::Map(entries), PathStep::Key(want)) => {
                let (key, value) = entries.iter().find(|(k, _)| k.value.0 == *want)?;
                line = key.referenced.line();
                &value.value
            }
            (Located::List(items), PathStep::Index(i)) => {
                let item = items.get(*i)?;
                line = item.referenced.line();
                &item.value
            }
            _ => return None,
        };
    }
    usize::try_from(line).ok().filter(|l| *l > 0)
}
