//! The agent's own process and the host checks at start: oomScoreAdj,
//! protectKernelDefaults, failSwapOn, logging and the feature gates.

use std::time::Duration;

use serde_json::Value as Json;

use super::configuration::KubeletConfiguration;
use crate::config::{
    audit,
    error::ConfigError,
    tree::{Node, Value},
    values::{Ctx, Object},
};

#[derive(Clone, Debug, PartialEq)]
pub struct Logging {
    /// `text` or `json`.
    pub format: String,
    /// `--v`.
    pub verbosity: u32,
    pub flush_frequency: Duration,
    /// vmodule and options, kept verbatim.
    pub other: serde_json::Map<String, Json>,
}

/// Reads oomScoreAdj, protectKernelDefaults, failSwapOn, logging and
/// featureGates.
pub(super) fn read(cx: &Ctx, o: &mut Object, c: &mut KubeletConfiguration) -> Result<(), ConfigError> {
    if let Some(v) = o.int_in("oomScoreAdj", -1000, 1000)? {
        c.oom_score_adj = v as i32;
    }
    if let Some(v) = o.boolean("protectKernelDefaults")? {
        c.protect_kernel_defaults = v;
    }
    if let Some(v) = o.boolean("failSwapOn")? {
        c.fail_swap_on = v;
    }
    if let Some(n) = o.get("logging") {
        read_logging(cx, n, &mut c.logging)?;
    }
    if let Some(n) = o.get("featureGates") {
        for (k, v) in cx.map(n, "featureGates")? {
            let on = cx
                .boolean(v, "featureGates")
                .map_err(|e| ConfigError { message: format!("{k:?}: {}", e.message), ..e })?;
            c.feature_gates.insert(k.clone(), on);
        }
    }
    Ok(())
}

fn read_logging(cx: &Ctx, node: &Node, l: &mut Logging) -> Result<(), ConfigError> {
    let mut o = Object::new(cx, node, "logging")?;
    if let Some(n) = o.get("format") {
        let f = cx.string(n, "logging.format")?;
        match f.as_str() {
            "" => {}
            "text" | "json" => l.format = f,
            other => return Err(cx.err(n, "logging.format", format!("{other:?} is not one of text, json"))),
        }
    }
    if let Some(n) = o.get("flushFrequency") {
        // A duration string, or nanoseconds as an integer (kubeadm writes 0).
        let d = match &n.value {
            Value::Int(ns) if *ns >= 0 => Duration::from_nanos(*ns as u64),
            _ => cx.duration(n, "logging.flushFrequency")?,
        };
        if !d.is_zero() {
            l.flush_frequency = d;
        }
    }
    if let Some(v) = o.int_in("verbosity", 0, u32::MAX as i64)? {
        l.verbosity = v as u32;
    }
    for key in ["vmodule", "options"] {
        if let Some(n) = o.get(key) {
            l.other.insert(key.to_owned(), audit::node_json(n));
        }
    }
    o.finish()
}
