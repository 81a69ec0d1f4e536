//! The effective KubeletConfiguration (kubelet.config.k8s.io/v1beta1):
//! typed fields with the kubelet's defaults, read from the merged tree of
//! files and flags, validated as the kubelet validates them, and rendered
//! back for /configz.
//!
//! One module per group of fields: `configuration` holds the typed
//! struct and its defaults, `configz` renders it, and each of `server`,
//! `host`, `pods`, `node`, `runtime`, `resources` and `eviction` reads
//! its own fields (and owns the types only they use).

mod configuration;
mod configz;
mod eviction;
mod host;
mod node;
mod pods;
mod resources;
mod runtime;
mod server;
#[cfg(test)]
mod tests;

pub use self::{
    configuration::KubeletConfiguration,
    configz::format_quantity,
    host::Logging,
    resources::{Enforcement, Reservation, ReservedResource},
    server::{Authentication, Authorization, AuthorizationMode},
};

use super::{
    audit,
    error::ConfigError,
    kubelet_extra,
    tree::Node,
    values::{Ctx, Object},
};

pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
pub const KIND: &str = "KubeletConfiguration";

/// Reads the merged tree into the effective configuration.
pub fn read(cx: &Ctx, root: &Node, warnings: &mut Vec<String>) -> Result<KubeletConfiguration, ConfigError> {
    let mut c = KubeletConfiguration::default();
    let mut o = Object::new(cx, root, "")?;
    // Checked per file before merging.
    o.get("apiVersion");
    o.get("kind");

    // A group that checks a field against another group's comes after it:
    // crashLoopBackOff (pods) needs featureGates (host), and
    // reservedSystemCPUs (kubelet_extra) overrides the reserved cpu
    // (resources).
    server::read(cx, &mut o, &mut c)?;
    host::read(cx, &mut o, &mut c)?;
    pods::read(cx, &mut o, &mut c)?;
    node::read(cx, &mut o, &mut c)?;
    runtime::read(cx, root, &mut o, &mut c)?;
    resources::read(cx, root, &mut o, &mut c)?;
    eviction::read(cx, &mut o, &mut c)?;
    kubelet_extra::read(cx, &mut o, &mut c)?;
    audit::read_unimplemented(cx, &mut o, warnings)?;
    o.finish()?;
    warnings.extend(audit::typed_warnings(&c));
    Ok(c)
}

/// A count or rate the kubelet keeps in an int32 that must not be
/// negative (maxPods, the QPS and burst settings, ...).
fn non_negative(o: &mut Object, key: &str) -> Result<Option<u32>, ConfigError> {
    o.int_in(key, 0, i32::MAX as i64).map(|v| v.map(|v| v as u32))
}
