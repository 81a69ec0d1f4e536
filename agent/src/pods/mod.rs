//! Pods: where they come from (static manifests, the API server), the
//! worker per pod that drives CRI toward the spec, and their status.
//!
//! Sources deliver a full snapshot of their pods each time something
//! changes (the kubelet's config "SET" operation): simple to reason about,
//! and a re-list after a watch gap needs no special case.

pub mod backoff;
pub mod defaults;
pub mod env;
pub mod file;
pub mod manifest;
pub mod observed;
pub mod plan;
pub mod source;
pub mod spec;
pub mod status;
pub mod validation;
