//! Static pod manifests: one v1 Pod per file, YAML or JSON, read and
//! turned into the pod the kubelet runs (its file source's applyDefaults):
//! the name suffixed with the node name, the uid a hash of the manifest,
//! the node and the config annotations set. Errors name the file, the
//! field and the value.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use k8s_openapi::api::core::v1::{Pod, Toleration};
use sha2::{Digest, Sha256};

use super::{defaults, validation};
use serde_path_to_error::Segment;

use crate::{
    yaml_locate::{self, PathStep},
    yaml_read::{self, YamlError},
};

pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";
pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {problem}", file.display())]
pub struct ManifestError {
    pub file: PathBuf,
    pub problem: String,
}

/// Reads one pod from a manifest's text.
pub fn read_pod(file: &Path, text: &str) -> Result<Pod, ManifestError> {
    let err = |problem: String| ManifestError { file: file.to_owned(), problem };
    let cannot_parse = |e: serde_saphyr::Error| err(format!("cannot parse: {}", YamlError::new(&e, text)));
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple_with_options(text, yaml_read::options()).map_err(cannot_parse)?;
    let mut docs: Vec<_> = docs.into_iter().filter(|d| !d.is_null()).collect();
    let mut value = match docs.len() {
        0 => return Err(err("the file holds no object; a static pod manifest holds one Pod".into())),
        1 => docs.remove(0),
        n => return Err(err(format!("the file holds {n} objects; a static pod manifest holds one Pod"))),
    };
    let field = |name: &str| value.get(name).and_then(|v| v.as_str()).map(str::to_owned);
    match (field("apiVersion"), field("kind")) {
        (None, _) => return Err(err("apiVersion: Required value".into())),
        (_, None) => return Err(err("kind: Required value".into())),
        (Some(v), _) if v != "v1" => {
            return Err(err(format!("apiVersion: Unsupported value: \"{v}\": supported values: \"v1\"")));
        }
        (_, Some(k)) if k != "Pod" => {
            return Err(err(format!("kind: Unsupported value: \"{k}\": supported values: \"Pod\"")));
        }
        _ => {}
    }
    unquoted_env_values(&value).map_err(err)?;
    octal_modes(&mut value);
    // One typed decoding, of the value read above, for every manifest
    // (YAML or JSON, one document or one among empty ones): the error
    // gives the path of the field that does not fit, and its line in the
    // text. (Decoding the text directly would give the line too, at the
    // cost of a second copy of the whole Pod decoder, megabytes of code,
    // and it would take unquoted numbers for strings, which the kubelet
    // refuses.)
    serde_path_to_error::deserialize::<_, Pod>(value).map_err(|e| {
        let steps: Vec<PathStep<'_>> = e
            .path()
            .iter()
            .map_while(|seg| match seg {
                Segment::Map { key } => Some(PathStep::Key(key)),
                Segment::Seq { index } => Some(PathStep::Index(*index)),
                Segment::Enum { .. } | Segment::Unknown => None,
            })
            .collect();
        let line = yaml_locate::locate(text, &steps).map(|l| format!(" at line {l}")).unwrap_or_default();
        let path = e.path().to_string();
        let problem = format!("{}{line}", e.inner());
        if path == "." { err(problem) } else { err(format!("{path}: {problem}")) }
    })
}

/// `env: [{name: N, value: 4}]`: YAML reads 4 as a number, and the
/// kubelet (like the API server) refuses a number where EnvVar.value
/// wants a string. The decoder would refuse it too, but this says how to
/// write it.
fn unquoted_env_values(pod: &serde_json::Value) -> Result<(), String> {
    use serde_json::Value;
    let Some(spec) = pod.get("spec") else { return Ok(()) };
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        let Some(containers) = spec.get(list).and_then(Value::as_array) else { continue };
        for (i, c) in containers.iter().enumerate() {
            let Some(env) = c.get("env").and_then(Value::as_array) else { continue };
            for (j, e) in env.iter().enumerate() {
                let what = match e.get("value") {
                    Some(Value::Number(n)) if n.is_f64() => format!("floating point {n}"),
                    Some(Value::Number(n)) => format!("integer {n}"),
                    Some(Value::Bool(b)) => format!("boolean {b}"),
                    _ => continue,
                };
                let shown = what.rsplit(' ').next().unwrap_or_default();
                return Err(format!(
                    "spec.{list}[{i}].env[{j}].value: invalid type: {what}, expected a string (quote it: \"{shown}\")"
                ));
            }
        }
    }
    Ok(())
}

/// File modes written the YAML 1.1 way (`defaultMode: 0640`), which the
/// kubelet's YAML reader takes as octal and the YAML 1.2 rules here read
/// as a string: turned into their number.
fn octal_modes(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            for (k, v) in m.iter_mut() {
                let is_mode = matches!(k.as_str(), "defaultMode" | "mode");
                if let (true, Value::String(s)) = (is_mode, &*v)
                    && let Some(octal) = s.strip_prefix('0').filter(|d| !d.is_empty())
                    && let Ok(n) = u32::from_str_radix(octal, 8)
                {
                    *v = Value::Number(n.into());
                } else {
                    octal_modes(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(octal_modes),
        _ => {}
    }
}

/// The hash the kubelet uses as a static pod's uid: the manifest as
/// decoded, the node and the file, so an edit makes a new pod.
pub fn config_hash(pod: &Pod, node_name: &str, file: &Path) -> String {
    let mut h = Sha256::new();
    h.update(serde_json::to_vec(pod).unwrap_or_default());
    h.update(format!("host:{node_name}"));
    h.update(format!("file:{}", file.display()));
    h.finalize()[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// The pod the kubelet runs for a manifest, validated.
pub fn static_pod(mut pod: Pod, file: &Path, node_name: &str) -> Result<Pod, ManifestError> {
    let err = |problem: String| ManifestError { file: file.to_owned(), problem };
    defaults::apply(&mut pod);
    let uid = match pod.metadata.uid.as_deref() {
        Some(u) if !u.is_empty() => u.to_owned(),
        _ => config_hash(&pod, node_name, file),
    };
    // Validate the name as written, so the error shows what the user wrote.
    let problems = validation::validate(&pod);
    if !problems.is_empty() {
        return Err(err(problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")));
    }
    let name = pod.metadata.name.clone().unwrap_or_default();
    pod.metadata.name = Some(format!("{name}-{node_name}"));
    if !validation::is_dns_subdomain(pod.metadata.name.as_deref().unwrap_or("")) {
        return Err(err(format!(
            "metadata.name: Invalid value: \"{name}\": with the node name appended (\"{name}-{node_name}\") it is not a valid name"
        )));
    }
    pod.metadata.uid = Some(uid.clone());
    if pod.metadata.namespace.as_deref().unwrap_or("").is_empty() {
        pod.metadata.namespace = Some("default".into());
    }
    let ann = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    ann.insert(CONFIG_HASH.into(), uid);
    ann.insert(CONFIG_SOURCE.into(), "file".into());
    let spec = pod.spec.as_mut().expect("validated: spec is present");
    spec.node_name = Some(node_name.to_owned());
    // Static pods tolerate every NoExecute taint, as the kubelet makes them.
    spec.tolerations.get_or_insert_with(Vec::new).push(Toleration {
        operator: Some("Exists".into()),
        effect: Some("NoExecute".into()),
        ..Default::default()
    });
    Ok(pod)
}

/// Reads and converts one manifest file.
pub fn load(file: &Path, node_name: &str) -> Result<Pod, ManifestError> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| ManifestError { file: file.to_owned(), problem: format!("cannot read: {e}") })?;
    static_pod(read_pod(file, &text)?, file, node_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WEB: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  hostNetwork: true
  containers:
  - name: httpd
    image: swiftlet.local/busybox:1.35
    command: ["httpd", "-f", "-p", "8080"]
    ports: [{containerPort: 8080}]
"#;

    fn file() -> &'static Path {
        Path::new("/etc/kubernetes/manifests/web.yaml")
    }

    #[test]
    fn a_static_pod_gets_the_kubelets_identity() {
        let pod = static_pod(read_pod(file(), WEB).unwrap(), file(), "node-a").unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("web-node-a"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        let uid = pod.metadata.uid.clone().unwrap();
        assert_eq!(uid.len(), 32);
        let ann = pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[CONFIG_HASH], uid);
        assert_eq!(ann[CONFIG_SOURCE], "file");
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(spec.containers[0].ports.as_ref().unwrap()[0].host_port, Some(8080));
        assert!(spec.tolerations.as_ref().unwrap().iter().any(|t| t.effect.as_deref() == Some("NoExecute")));
    }

    #[test]
    fn the_uid_follows_content_node_and_file_and_json_works_too() {
        let uid = |text: &str, node: &str, f: &Path| {
            static_pod(read_pod(f, text).unwrap(), f, node).unwrap().metadata.uid.unwrap()
        };
        let a = uid(WEB, "node-a", file());
        assert_eq!(a, uid(WEB, "node-a", file()), "stable across reads");
        assert_ne!(a, uid(&WEB.replace("8080", "8081"), "node-a", file()), "an edit makes a new pod");
        assert_ne!(a, uid(WEB, "node-b", file()));
        assert_ne!(a, uid(WEB, "node-a", Path::new("/other/web.yaml")));
        let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j"},"spec":{"containers":[{"name":"c","image":"busybox"}]}}"#;
        let pod = static_pod(read_pod(Path::new("j.json"), json).unwrap(), Path::new("j.json"), "n").unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("j-n"));
    }

    #[test]
    fn file_modes_written_in_octal_are_octal_as_the_kubelet_reads_them() {
        let text = |mode: &str| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: x}}\nspec:\n  containers: [{{name: c, image: b}}]\n  volumes:\n  - name: cm\n    configMap:\n      name: cm\n      defaultMode: {mode}\n      items: [{{key: k, path: k, mode: {mode}}}]\n"
            )
        };
        let modes = |mode: &str| -> Result<(i32, i32), String> {
            let pod = read_pod(Path::new("m.yaml"), &text(mode)).map_err(|e| e.to_string())?;
            let cm = pod.spec.unwrap().volumes.unwrap().remove(0).config_map.unwrap();
            Ok((cm.default_mode.unwrap(), cm.items.unwrap()[0].mode.unwrap()))
        };
        type Modes = Result<(i32, i32), &'static str>;
        let cases: [(&str, Modes); 6] = [
            ("0640", Ok((0o640, 0o640))),
            ("0400", Ok((0o400, 0o400))),
            ("0o600", Ok((0o600, 0o600))),
            ("420", Ok((420, 420))),
            ("0", Ok((0, 0))),
            (
                "0999",
                Err("spec.volumes[0].configMap.defaultMode: invalid type: string \"0999\", expected i32 at line 10"),
            ),
        ];
        for (mode, want) in cases {
            match (modes(mode), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{mode}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{mode}: want {want:?} in {got:?}"),
                (got, want) => panic!("{mode}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn errors_name_the_file_field_and_value() {
        let cases = [
            ("", "web.yaml: the file holds no object"),
            ("kind: Pod\napiVersion: v1\n---\nkind: Pod\napiVersion: v1\n", "holds 2 objects"),
            ("apiVersion: v1\nkind: Deployment\n", "kind: Unsupported value: \"Deployment\""),
            ("kind: Pod\n", "apiVersion: Required value"),
            ("apiVersion: v1\nkind: Pod\nspec: [\n", "cannot parse"),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n  - name: c\n    image: b\n    ports: [{containerPort: eighty}]\n",
                "spec.containers[0].ports[0].containerPort: invalid type: string \"eighty\", expected i32 at line 8",
            ),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n  - name: c\n    image: b\n    resources: {limits: {memory: 2Gx}}\n",
                "spec.containers[0].resources.limits[memory]: Invalid value: \"2Gx\"",
            ),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: []}\n",
                "spec.containers: Required value",
            ),
            // An unquoted number where a string belongs, refused as the
            // kubelet refuses it; a JSON manifest's line is found too.
            (
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n  labels: {tier: 1}\nspec: {containers: [{name: c, image: b}]}\n",
                "metadata.labels.tier: invalid type: integer `1`, expected a string at line 5",
            ),
            (
                "{\"apiVersion\": \"v1\", \"kind\": \"Pod\",\n \"spec\": {\"containers\": [{\"name\": \"c\",\n  \"image\": [1]}]}}\n",
                "spec.containers[0].image: invalid type: sequence, expected a string at line 3",
            ),
        ];
        let f = Path::new("web.yaml");
        for (text, want) in cases {
            let got = read_pod(f, text).and_then(|p| static_pod(p, f, "n")).unwrap_err().to_string();
            assert!(got.starts_with("web.yaml: "), "{got}");
            assert!(got.contains(want), "want {want:?} in {got:?}");
        }
    }
}
