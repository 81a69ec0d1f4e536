//! Pods: where they come from (static manifests, the API server), the
//! worker per pod that drives CRI toward the spec, and their status.
//!
//! Sources deliver a full snapshot of their pods each time something
//! changes (the kubelet's config "SET" operation): simple to reason about,
//! and a re-list after a watch gap needs no special case.
//!
//! Pure decisions: `admission`, `backoff`, `defaults`, `env`, `hosts`,
//! `manifest`, `plan`, `security`, `service_env`, `spec`, `status`,
//! `validation` (with `volume_validation`); `sysctl` is the crate's, here
//! under its old path. At the edges: `file` (the static
//! pod source), `observed` (reading the runtime), `probe` (running probes
//! and hooks), `worker` (one per pod) and `manager` (all of them).

pub mod admission;
pub mod conditions;
pub mod defaults;
pub mod env;
pub mod ephemeral;
pub mod file;
pub mod hosts;
pub mod local_storage;
pub mod manager;
pub mod manifest;
pub mod metrics;
pub mod observed;
pub mod plan;
pub mod probe;
pub mod pull;
pub mod resize;
pub mod runtime_class;
pub mod security;
pub mod service_env;
pub mod sidecars;
pub mod source;
pub mod spec;
pub mod status;
pub use crate::sysctl;
pub mod pod_level_validation;
pub mod validation;
pub mod validation_extra;
pub mod volume_validation;
pub mod worker;

#[cfg(test)]
mod tests;
