//! The downward API's values: what a `fieldRef` or `resourceFieldRef`
//! reads from the pod, its container and the node. Both consumers use it,
//! the container environment (`pods::env`) and downwardAPI volumes
//! ([`super::payload`]); it sits here, below the pod worker, so the volume
//! code need not reach up into the pods module.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::{cm::qos::container_resources, quantity::Quantity};

/// What `fieldRef` and `resourceFieldRef` can read that is not in the pod
/// object itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DownwardContext {
    pub host_ip: Option<String>,
    pub pod_ips: Vec<String>,
    /// Node allocatable, the value of a limit the container does not set.
    pub allocatable_cpu_milli: i64,
    pub allocatable_memory: i64,
    pub allocatable_ephemeral_storage: i64,
}

/// Why an environment could not be built: the kubelet reports it as
/// CreateContainerConfigError.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EnvError(pub String);

/// `metadata.labels['app']` → ("metadata.labels", "app").
fn subscript(path: &str) -> Option<(&str, &str)> {
    let (base, rest) = path.split_once('[')?;
    let key = rest.strip_suffix(']')?.trim_matches(|c| c == '\'' || c == '"');
    Some((base, key))
}

pub fn field(pod: &Pod, path: &str, cx: &DownwardContext) -> Result<String, EnvError> {
    let m = &pod.metadata;
    let spec = pod.spec.as_ref();
    if let Some((base, key)) = subscript(path) {
        let map = match base {
            "metadata.labels" => m.labels.as_ref(),
            "metadata.annotations" => m.annotations.as_ref(),
            _ => return Err(EnvError(format!("unsupported fieldRef {path:?}"))),
        };
        return Ok(map.and_then(|m| m.get(key)).cloned().unwrap_or_default());
    }
    let map_text = |map: Option<&BTreeMap<String, String>>| {
        map.into_iter().flatten().map(|(k, v)| format!("{k}=\"{v}\"")).collect::<Vec<_>>().join("\n")
    };
    Ok(match path {
        "metadata.name" => m.name.clone().unwrap_or_default(),
        "metadata.namespace" => m.namespace.clone().unwrap_or_default(),
        "metadata.uid" => m.uid.clone().unwrap_or_default(),
        "metadata.labels" => map_text(m.labels.as_ref()),
        "metadata.annotations" => map_text(m.annotations.as_ref()),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()).unwrap_or_default(),
        "status.hostIP" => cx.host_ip.clone().unwrap_or_default(),
        "status.hostIPs" => cx.host_ip.clone().unwrap_or_default(),
        "status.podIP" => cx.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => cx.pod_ips.join(","),
        other => return Err(EnvError(format!("unsupported fieldRef {other:?}"))),
    })
}

/// A `resourceFieldRef` value: the amount divided by the divisor, rounded
/// up, with node allocatable standing in for an unset limit.
pub fn resource(c: &Container, name: &str, divisor: Option<&str>, cx: &DownwardContext) -> Result<String, String> {
    let r = container_resources(c);
    let raw = |key: &str| {
        c.resources
            .as_ref()
            .and_then(|res| if key.starts_with("limits.") { res.limits.as_ref() } else { res.requests.as_ref() })
            .and_then(|m| m.get(key.split_once('.').map_or(key, |(_, k)| k)))
            .and_then(|q| q.0.parse::<Quantity>().ok())
    };
    // In milli-units, to divide exactly.
    let milli = match name {
        "limits.cpu" => r.cpu_limit.map(|q| q.milli_value()).unwrap_or(cx.allocatable_cpu_milli),
        "requests.cpu" => r.cpu_request.map(|q| q.milli_value()).unwrap_or(0),
        "limits.memory" => {
            r.memory_limit.map(|q| q.milli_value()).unwrap_or(cx.allocatable_memory.saturating_mul(1000))
        }
        "requests.memory" => r.memory_request.map(|q| q.milli_value()).unwrap_or(0),
        "limits.ephemeral-storage" => {
            raw(name).map(|q| q.milli_value()).unwrap_or(cx.allocatable_ephemeral_storage.saturating_mul(1000))
        }
        "requests.ephemeral-storage" => raw(name).map(|q| q.milli_value()).unwrap_or(0),
        other => return Err(format!("unsupported resource {other:?}")),
    };
    let divisor = match divisor {
        None | Some("") | Some("0") => Quantity::from_units(1),
        Some(d) => d.parse::<Quantity>().map_err(|e| format!("divisor {d:?}: {e}"))?,
    };
    let d = divisor.milli_value().max(1);
    Ok(((milli + d - 1) / d).to_string())
}
