//! What a configMap, secret, downwardAPI or projected volume holds: the
//! files (relative path → bytes and mode) computed from the objects and
//! the pod, as the kubelet's `MakePayload` / `CollectData` do. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, DownwardAPIVolumeFile, KeyToPath, Pod, Secret};

use super::downward::{self, DownwardContext};

/// One file of a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileProjection {
    pub data: Vec<u8>,
    pub mode: u32,
}

/// Relative path → file. Ordered, so writes and comparisons are stable.
pub type Payload = BTreeMap<String, FileProjection>;

/// The API's default for defaultMode (0644).
pub const DEFAULT_MODE: u32 = 0o644;

fn mode_of(m: Option<i32>, default: u32) -> u32 {
    m.map_or(default, |m| (m as u32) & 0o7777)
}

/// `items` of a configMap volume or projection; all keys when there are
/// none. A listed key the map lacks is an error unless `optional`.
pub fn config_map_files(
    cm: &ConfigMap,
    items: Option<&[KeyToPath]>,
    default_mode: u32,
    optional: bool,
) -> Result<Payload, String> {
    let data = cm.data.as_ref();
    let binary = cm.binary_data.as_ref();
    let mut out = Payload::new();
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (k, v) in data.into_iter().flatten() {
                out.insert(k.clone(), FileProjection { data: v.clone().into_bytes(), mode: default_mode });
            }
            for (k, v) in binary.into_iter().flatten() {
                out.insert(k.clone(), FileProjection { data: v.0.clone(), mode: default_mode });
            }
        }
        Some(items) => {
            for item in items {
                let bytes = match (data.and_then(|d| d.get(&item.key)), binary.and_then(|b| b.get(&item.key))) {
                    (Some(s), _) => s.clone().into_bytes(),
                    (None, Some(b)) => b.0.clone(),
                    (None, None) if optional => continue,
                    (None, None) => return Err(format!("configmap references non-existent config key: {}", item.key)),
                };
                out.insert(item.path.clone(), FileProjection { data: bytes, mode: mode_of(item.mode, default_mode) });
            }
        }
    }
    Ok(out)
}

/// The bytes of a secret: `data`, with `stringData` over it (what the API
/// server would have merged).
fn secret_data(s: &Secret) -> BTreeMap<String, Vec<u8>> {
    let mut out: BTreeMap<String, Vec<u8>> = s.data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())).collect();
    for (k, v) in s.string_data.iter().flatten() {
        out.insert(k.clone(), v.clone().into_bytes());
    }
    out
}

pub fn secret_files(
    s: &Secret,
    items: Option<&[KeyToPath]>,
    default_mode: u32,
    optional: bool,
) -> Result<Payload, String> {
    let data = secret_data(s);
    let mut out = Payload::new();
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (k, v) in data {
                out.insert(k, FileProjection { data: v, mode: default_mode });
            }
        }
        Some(items) => {
            for item in items {
                match data.get(&item.key) {
                    Some(v) => {
                        out.insert(
                            item.path.clone(),
                            FileProjection { data: v.clone(), mode: mode_of(item.mode, default_mode) },
                        );
                    }
                    None if optional => {}
                    None => return Err(format!("references non-existent secret key: {}", item.key)),
                }
            }
        }
    }
    Ok(out)
}

/// Go's `%q` for the label and annotation files.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `key="value"` lines sorted by key, as the kubelet's `FormatMap`.
fn format_map(m: Option<&BTreeMap<String, String>>) -> String {
    m.into_iter().flatten().map(|(k, v)| format!("{k}={}", go_quote(v))).collect::<Vec<_>>().join("\n")
}

/// The fields a downwardAPI volume may show (the API server refuses
/// `spec.*` and `status.*` there).
pub fn downward_field(pod: &Pod, path: &str) -> Result<String, String> {
    match path {
        "metadata.labels" => Ok(format_map(pod.metadata.labels.as_ref())),
        "metadata.annotations" => Ok(format_map(pod.metadata.annotations.as_ref())),
        "metadata.name" | "metadata.namespace" | "metadata.uid" => {
            downward::field(pod, path, &DownwardContext::default()).map_err(|e| e.0)
        }
        p if p.starts_with("metadata.labels[") || p.starts_with("metadata.annotations[") => {
            downward::field(pod, path, &DownwardContext::default()).map_err(|e| e.0)
        }
        other => Err(format!("unsupported fieldRef {other:?} in a downwardAPI volume")),
    }
}

/// The files of a downwardAPI volume or projection.
pub fn downward_files(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: u32,
    cx: &DownwardContext,
) -> Result<Payload, String> {
    let mut out = Payload::new();
    let mut errors = vec![];
    for item in items {
        let value = if let Some(f) = &item.field_ref {
            downward_field(pod, &f.field_path)
        } else if let Some(r) = &item.resource_field_ref {
            let name = r.container_name.as_deref().unwrap_or("");
            let spec = pod.spec.as_ref();
            match spec
                .and_then(|s| s.containers.iter().chain(s.init_containers.iter().flatten()).find(|c| c.name == name))
            {
                Some(c) => downward::resource(c, &r.resource, r.divisor.as_ref().map(|d| d.0.as_str()), cx),
                None => Err(format!("container {name:?} not found in pod for resourceFieldRef")),
            }
        } else {
            Ok(String::new())
        };
        match value {
            Ok(v) => {
                out.insert(
                    clean(&item.path),
                    FileProjection { data: v.into_bytes(), mode: mode_of(item.mode, default_mode) },
                );
            }
            Err(e) => errors.push(format!("{}: {e}", item.path)),
        }
    }
    if errors.is_empty() { Ok(out) } else { Err(errors.join(", ")) }
}

/// Go's `filepath.Clean` for the relative paths of items.
fn clean(p: &str) -> String {
    let parts: Vec<&str> = p.split('/').filter(|s| !s.is_empty() && *s != ".").collect();
    parts.join("/")
}

/// The kubelet's `validatePath` for payload paths: relative, no `..`
/// element, not starting with `..`, bounded lengths.
pub fn validate_path(p: &str) -> Result<(), String> {
    if p.is_empty() {
        return Err("invalid path: must not be empty".into());
    }
    if p.len() > 4096 {
        return Err(format!("invalid path: must be less than or equal to 4096 characters: {p:?}"));
    }
    if p.starts_with('/') {
        return Err(format!("invalid path: must be relative path: {p}"));
    }
    if p.starts_with("..") {
        return Err(format!("invalid path: must not start with '..': {p}"));
    }
    for seg in p.split('/') {
        if seg == ".." {
            return Err(format!("invalid path: must not contain '..': {p}"));
        }
        if seg.len() > 255 {
            return Err(format!("invalid path: segments must be less than or equal to 255 characters: {p}"));
        }
    }
    Ok(())
}

/// Merges projected sources' files; a later source's path wins, as the
/// kubelet's map does.
pub fn merge(into: &mut Payload, more: Payload) {
    into.extend(more);
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        ByteString,
        api::core::v1::{ObjectFieldSelector, PodSpec, ResourceFieldSelector},
    };

    use super::*;

    fn cm() -> ConfigMap {
        ConfigMap {
            data: Some([("a".to_string(), "1".to_string()), ("b".to_string(), "2".to_string())].into()),
            binary_data: Some([("bin".to_string(), ByteString(vec![0, 1]))].into()),
            ..Default::default()
        }
    }

    fn item(key: &str, path: &str, mode: Option<i32>) -> KeyToPath {
        KeyToPath { key: key.into(), path: path.into(), mode, ..Default::default() }
    }

    #[test]
    fn config_map_keys_items_modes_and_optional() {
        let all = config_map_files(&cm(), None, 0o644, false).unwrap();
        assert_eq!(all.keys().collect::<Vec<_>>(), ["a", "b", "bin"]);
        assert_eq!(all["bin"], FileProjection { data: vec![0, 1], mode: 0o644 });
        let some =
            config_map_files(&cm(), Some(&[item("a", "dir/x", Some(0o400)), item("bin", "y", None)]), 0o640, false)
                .unwrap();
        assert_eq!(some.len(), 2);
        assert_eq!(some["dir/x"], FileProjection { data: b"1".to_vec(), mode: 0o400 });
        assert_eq!(some["y"].mode, 0o640);
        let e = config_map_files(&cm(), Some(&[item("zzz", "z", None)]), 0o644, false).unwrap_err();
        assert_eq!(e, "configmap references non-existent config key: zzz");
        assert!(config_map_files(&cm(), Some(&[item("zzz", "z", None)]), 0o644, true).unwrap().is_empty());
    }

    #[test]
    fn secret_keys_with_string_data_and_missing_keys() {
        let s = Secret {
            data: Some([("pw".to_string(), ByteString(b"hunter2".to_vec()))].into()),
            string_data: Some([("user".to_string(), "admin".to_string())].into()),
            ..Default::default()
        };
        let all = secret_files(&s, None, 0o400, false).unwrap();
        assert_eq!(all["pw"].data, b"hunter2");
        assert_eq!(all["user"], FileProjection { data: b"admin".to_vec(), mode: 0o400 });
        assert_eq!(
            secret_files(&s, Some(&[item("nope", "n", None)]), 0o644, false).unwrap_err(),
            "references non-existent secret key: nope"
        );
    }

    #[test]
    fn downward_files_as_the_kubelet_formats_them() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("web".into());
        pod.metadata.labels = Some([("b".to_string(), "x\"y".to_string()), ("a".to_string(), "1".to_string())].into());
        pod.spec = Some(PodSpec {
            containers: vec![k8s_openapi::api::core::v1::Container { name: "c".into(), ..Default::default() }],
            ..Default::default()
        });
        let field = |path: &str, f: &str| DownwardAPIVolumeFile {
            path: path.into(),
            field_ref: Some(ObjectFieldSelector { field_path: f.into(), ..Default::default() }),
            ..Default::default()
        };
        let items = vec![
            field("labels", "metadata.labels"),
            field("./name", "metadata.name"),
            field("app", "metadata.labels['a']"),
            DownwardAPIVolumeFile {
                path: "cpu_limit".into(),
                resource_field_ref: Some(ResourceFieldSelector {
                    container_name: Some("c".into()),
                    resource: "limits.cpu".into(),
                    divisor: None,
                }),
                mode: Some(0o600),
                ..Default::default()
            },
        ];
        let cx = DownwardContext { allocatable_cpu_milli: 2000, ..Default::default() };
        let got = downward_files(&pod, &items, 0o644, &cx).unwrap();
        assert_eq!(String::from_utf8(got["labels"].data.clone()).unwrap(), "a=\"1\"\nb=\"x\\\"y\"");
        assert_eq!(got["name"].data, b"web");
        assert_eq!(got["app"].data, b"1");
        assert_eq!(got["cpu_limit"], FileProjection { data: b"2".to_vec(), mode: 0o600 });
        let bad = downward_files(&pod, &[field("node", "spec.nodeName")], 0o644, &cx).unwrap_err();
        assert!(bad.contains("spec.nodeName"), "{bad}");
    }

    #[test]
    fn payload_paths_are_validated() {
        for ok in ["a", "a/b", "a..b", "x.."] {
            assert!(validate_path(ok).is_ok(), "{ok}");
        }
        for bad in ["", "/etc/passwd", "../x", "a/../b", "..data", &"x".repeat(256)] {
            assert!(validate_path(bad).is_err(), "{bad}");
        }
    }
}
