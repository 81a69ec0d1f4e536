//! The allocated resources of every admitted pod, checkpointed as the
//! kubelet's allocation manager does (`<root-dir>/allocated_pods_state`,
//! its unversioned "v1" format): a restarted agent runs its pods' containers
//! with the resources it had admitted, neither forgetting an admitted resize
//! nor taking a pending one for admitted.
//!
//! The file is `{"data":"<json>","checksum":N}` where `<json>` is
//! `{"entries":{"<pod uid>":{"ContainerResources":{"<container>":
//! {"limits":{..},"requests":{..}}},"PodLevelResources":null}}}` and the
//! checksum is FNV-1a 32 over the text the kubelet's hasher prints for a
//! string (`(string)` then the data).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use k8s_openapi::api::core::v1::ResourceRequirements;
use serde::{Deserialize, Serialize};

/// The name the kubelet gives the checkpoint in its root directory.
pub const FILE_NAME: &str = "allocated_pods_state";

/// One pod's allocation: each resizable container's requests and limits.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PodAllocation {
    #[serde(rename = "ContainerResources", default)]
    pub containers: BTreeMap<String, ResourceRequirements>,
    /// Pod-level resources; kept as read so that a file another agent
    /// wrote survives a round trip.
    #[serde(rename = "PodLevelResources", default)]
    pub pod_level: Option<ResourceRequirements>,
}

/// Every pod's allocation, by pod UID.
pub type Allocations = BTreeMap<String, PodAllocation>;

#[derive(Serialize, Deserialize)]
struct Data {
    #[serde(default)]
    entries: Allocations,
}

#[derive(Serialize, Deserialize)]
struct File {
    data: String,
    checksum: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

fn checksum(data: &str) -> u64 {
    let bytes = b"(string)".iter().chain(data.as_bytes());
    u64::from(bytes.fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)))
}

/// The file's bytes for `allocations`.
pub fn encode(allocations: &Allocations) -> Vec<u8> {
    let data = serde_json::to_string(&Data { entries: allocations.clone() }).unwrap_or_default();
    let checksum = checksum(&data);
    serde_json::to_vec(&File { data, checksum }).unwrap_or_default()
}

/// Reads the file's bytes; a checksum that does not match is an error, as
/// the kubelet's (which then refuses to start; the caller decides).
pub fn decode(path: &Path, bytes: &[u8]) -> Result<Allocations, CheckpointError> {
    let corrupt = |message: String| CheckpointError::Corrupt { path: path.to_owned(), message };
    let file: File = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
    let sum = checksum(&file.data);
    if sum != file.checksum {
        return Err(corrupt(format!("checksum {} does not match the data ({sum})", file.checksum)));
    }
    let data: Data = serde_json::from_str(&file.data).map_err(|e| corrupt(e.to_string()))?;
    Ok(data.entries)
}

/// The checkpoint at `path`; a missing file is an empty one.
pub fn load(path: &Path) -> Result<Allocations, CheckpointError> {
    match std::fs::read(path) {
        Ok(bytes) => decode(path, &bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Allocations::new()),
        Err(source) => Err(CheckpointError::Io { path: path.to_owned(), source }),
    }
}

/// Writes the checkpoint atomically (mode 0644, as the kubelet's).
pub fn save(path: &Path, allocations: &Allocations) -> Result<(), CheckpointError> {
    crate::host::write_atomic(path, &encode(allocations), 0o644)
        .map_err(|source| CheckpointError::Io { path: path.to_owned(), source })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;

    use super::*;

    fn sample() -> Allocations {
        let rr = ResourceRequirements {
            limits: Some([("cpu".to_string(), Q("500m".into())), ("memory".to_string(), Q("64Mi".into()))].into()),
            requests: Some([("cpu".to_string(), Q("250m".into()))].into()),
            ..Default::default()
        };
        Allocations::from([(
            "uid-1".to_string(),
            PodAllocation { containers: BTreeMap::from([("app".to_string(), rr)]), pod_level: None },
        )])
    }

    #[test]
    fn the_kubelets_layout_round_trips() {
        let bytes = encode(&sample());
        let file: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let data = file["data"].as_str().unwrap();
        assert_eq!(
            data,
            r#"{"entries":{"uid-1":{"ContainerResources":{"app":{"limits":{"cpu":"500m","memory":"64Mi"},"requests":{"cpu":"250m"}}},"PodLevelResources":null}}}"#
        );
        assert_eq!(file["checksum"].as_u64().unwrap(), checksum(data));
        assert_eq!(decode(Path::new("x"), &bytes).unwrap(), sample());
    }

    #[test]
    fn a_tampered_file_is_refused_and_a_missing_one_is_empty() {
        let text = String::from_utf8(encode(&sample())).unwrap().replace("500m", "900m");
        let e = decode(Path::new("/x/allocated_pods_state"), text.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("checksum") && e.contains("/x/allocated_pods_state"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        assert!(load(&path).unwrap().is_empty());
        save(&path, &sample()).unwrap();
        assert_eq!(load(&path).unwrap(), sample());
    }

    #[test]
    fn a_file_with_fields_of_newer_kubelets_is_read() {
        let data = r#"{"entries":{"u":{"ContainerResources":{"c":{"requests":{"cpu":"1"}}},"PodLevelResources":null,"EmptyDirVolumeLimits":null}}}"#;
        let file = serde_json::json!({"data": data, "checksum": checksum(data)}).to_string();
        let a = decode(Path::new("x"), file.as_bytes()).unwrap();
        assert_eq!(a["u"].containers["c"].requests.as_ref().unwrap()["cpu"], Q("1".into()));
    }
}
