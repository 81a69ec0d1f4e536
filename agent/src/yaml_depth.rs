//! A guard run before YAML text reaches serde_yaml: its scanner takes time
//! quadratic in the depth of flow nesting (`[[[[…`) before the parser's
//! recursion limit (128) refuses it, so a 200 KB file of brackets would
//! hold a parser for many minutes. Counting brackets is linear, and no
//! document that serde_yaml accepts nests anywhere near the limit here.

/// Deeper than this many unclosed `[`/`{` is refused. Quotes and comments
/// are not followed: brackets inside them only make the count higher, and
/// a real document stays far below the limit either way.
pub const MAX_FLOW_DEPTH: usize = 512;

/// Err with the 1-based line where the nesting passes [`MAX_FLOW_DEPTH`].
pub fn check(text: &str) -> Result<(), String> {
    let mut depth = 0usize;
    let mut line = 1;
    for b in text.bytes() {
        match b {
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_FLOW_DEPTH {
                    return Err(format!("nesting deeper than {MAX_FLOW_DEPTH} levels at line {line}"));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b'\n' => line += 1,
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_nesting_is_refused_with_its_line() {
        assert!(check("a: [1, {b: [2]}]\n").is_ok());
        assert!(check(&"[]".repeat(100_000)).is_ok(), "closed brackets do not add up");
        let deep = format!("a: 1\nb: {}", "[".repeat(MAX_FLOW_DEPTH + 1));
        assert_eq!(check(&deep), Err(format!("nesting deeper than {MAX_FLOW_DEPTH} levels at line 2")));
    }
}
