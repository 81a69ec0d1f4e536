//! The API server's checks on volumes and volumeMounts, with its wording,
//! for static pods (which never go through an API server). Sources this
//! node cannot mount (persistentVolumeClaim, csi, ...) pass here and fail
//! at set-up with a FailedMount event, as they would on a kubelet without
//! the plugin. Part of pod validation (the API server validates volumes
//! as part of the pod spec), next to the rest of it.

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{Container, DownwardAPIVolumeFile, KeyToPath, PodSpec, Volume};

use super::validation::{FieldError, invalid, is_dns_label, unsupported};
use crate::volumes::payload::validate_path;

fn err(field: impl Into<String>, problem: impl Into<String>) -> FieldError {
    FieldError { field: field.into(), problem: problem.into() }
}

const HOST_PATH_TYPES: &[&str] =
    &["", "BlockDevice", "CharDevice", "Directory", "DirectoryOrCreate", "File", "FileOrCreate", "Socket"];

fn mode(at: &str, m: Option<i32>, errs: &mut Vec<FieldError>) {
    if let Some(m) = m
        && !(0..=0o777).contains(&m)
    {
        errs.push(invalid(at, m, "must be a number between 0 and 0777 (octal), both inclusive"));
    }
}

fn items(at: &str, list: Option<&[KeyToPath]>, errs: &mut Vec<FieldError>) {
    for (i, it) in list.into_iter().flatten().enumerate() {
        if it.key.is_empty() {
            errs.push(err(format!("{at}.items[{i}].key"), "Required value"));
        }
        if let Err(why) = validate_path(&it.path) {
            errs.push(invalid(format!("{at}.items[{i}].path"), &it.path, why));
        }
        mode(&format!("{at}.items[{i}].mode"), it.mode, errs);
    }
}

fn downward_items(at: &str, list: &[DownwardAPIVolumeFile], errs: &mut Vec<FieldError>) {
    for (i, it) in list.iter().enumerate() {
        let ip = format!("{at}.items[{i}]");
        if let Err(why) = validate_path(&it.path) {
            errs.push(invalid(format!("{ip}.path"), &it.path, why));
        }
        match (&it.field_ref, &it.resource_field_ref) {
            (Some(_), Some(_)) => errs.push(err(
                ip.clone(),
                "Invalid value: fieldRef and resourceFieldRef can not be specified simultaneously",
            )),
            (None, None) => {
                errs.push(err(ip.clone(), "Required value: one of fieldRef and resourceFieldRef is required"))
            }
            (Some(f), None) => {
                let p = f.field_path.as_str();
                let ok =
                    ["metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels", "metadata.annotations"]
                        .contains(&p)
                        || p.starts_with("metadata.labels[")
                        || p.starts_with("metadata.annotations[");
                if !ok {
                    errs.push(unsupported(
                        format!("{ip}.fieldRef.fieldPath"),
                        p,
                        &[
                            "metadata.annotations",
                            "metadata.labels",
                            "metadata.name",
                            "metadata.namespace",
                            "metadata.uid",
                        ],
                    ));
                }
            }
            (None, Some(r)) => {
                if r.container_name.as_deref().unwrap_or("").is_empty() {
                    errs.push(err(format!("{ip}.resourceFieldRef.containerName"), "Required value"));
                }
            }
        }
        mode(&format!("{ip}.mode"), it.mode, errs);
    }
}

fn volume(at: &str, v: &Volume, errs: &mut Vec<FieldError>) {
    let json = serde_json::to_value(v).unwrap_or_default();
    let sources = json.as_object().map_or(0, |o| o.keys().filter(|k| *k != "name").count());
    match sources {
        0 => errs.push(err(at, "Required value: must specify a volume type")),
        1 => {}
        _ => errs.push(err(at, "Forbidden: may not specify more than 1 volume type")),
    }
    if let Some(h) = &v.host_path {
        if h.path.is_empty() {
            errs.push(err(format!("{at}.hostPath.path"), "Required value"));
        } else if h.path.split('/').any(|s| s == "..") {
            errs.push(invalid(format!("{at}.hostPath.path"), &h.path, "must not contain '..'"));
        }
        if let Some(t) = h.type_.as_deref()
            && !HOST_PATH_TYPES.contains(&t)
        {
            errs.push(unsupported(format!("{at}.hostPath.type"), t, &HOST_PATH_TYPES[1..]));
        }
    }
    if let Some(e) = &v.empty_dir {
        if let Some(m) = e.medium.as_deref()
            && !["", "Memory", "HugePages"].contains(&m)
            && !m.starts_with("HugePages-")
        {
            errs.push(unsupported(format!("{at}.emptyDir.medium"), m, &["", "Memory", "HugePages"]));
        }
        if let Some(q) = &e.size_limit
            && q.0.parse::<crate::quantity::Quantity>().map_or(true, |q| q.is_negative())
        {
            errs.push(invalid(
                format!("{at}.emptyDir.sizeLimit"),
                &q.0,
                "must be a quantity greater than or equal to 0",
            ));
        }
    }
    if let Some(c) = &v.config_map {
        if c.name.is_empty() {
            errs.push(err(format!("{at}.configMap.name"), "Required value"));
        }
        mode(&format!("{at}.configMap.defaultMode"), c.default_mode, errs);
        items(&format!("{at}.configMap"), c.items.as_deref(), errs);
    }
    if let Some(s) = &v.secret {
        if s.secret_name.as_deref().unwrap_or("").is_empty() {
            errs.push(err(format!("{at}.secret.secretName"), "Required value"));
        }
        mode(&format!("{at}.secret.defaultMode"), s.default_mode, errs);
        items(&format!("{at}.secret"), s.items.as_deref(), errs);
    }
    if let Some(d) = &v.downward_api {
        mode(&format!("{at}.downwardAPI.defaultMode"), d.default_mode, errs);
        downward_items(&format!("{at}.downwardAPI"), d.items.as_deref().unwrap_or(&[]), errs);
    }
    if let Some(p) = &v.projected {
        mode(&format!("{at}.projected.defaultMode"), p.default_mode, errs);
        let mut paths = BTreeSet::new();
        for (i, s) in p.sources.iter().flatten().enumerate() {
            let sp = format!("{at}.projected.sources[{i}]");
            if let Some(c) = &s.config_map {
                items(&format!("{sp}.configMap"), c.items.as_deref(), errs);
                paths.extend(c.items.iter().flatten().map(|i| i.path.clone()));
            }
            if let Some(x) = &s.secret {
                items(&format!("{sp}.secret"), x.items.as_deref(), errs);
                paths.extend(x.items.iter().flatten().map(|i| i.path.clone()));
            }
            if let Some(d) = &s.downward_api {
                downward_items(&format!("{sp}.downwardAPI"), d.items.as_deref().unwrap_or(&[]), errs);
            }
            if let Some(t) = &s.service_account_token {
                if let Err(why) = validate_path(&t.path) {
                    errs.push(invalid(format!("{sp}.serviceAccountToken.path"), &t.path, why));
                }
                if let Some(e) = t.expiration_seconds
                    && e < 600
                {
                    errs.push(invalid(
                        format!("{sp}.serviceAccountToken.expirationSeconds"),
                        e,
                        "may not specify a duration less than 10 minutes",
                    ));
                }
            }
        }
        let _ = paths;
    }
}

fn mounts(at: &str, c: &Container, volumes: &HashMap<&str, &Volume>, errs: &mut Vec<FieldError>) {
    let mut paths = BTreeSet::new();
    let privileged = c.security_context.as_ref().and_then(|s| s.privileged).unwrap_or(false);
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        let mp = format!("{at}.volumeMounts[{i}]");
        if m.name.is_empty() {
            errs.push(err(format!("{mp}.name"), "Required value"));
        } else if !volumes.contains_key(m.name.as_str()) {
            errs.push(err(format!("{mp}.name"), format!("Not found: \"{}\"", m.name)));
        }
        if m.mount_path.is_empty() {
            errs.push(err(format!("{mp}.mountPath"), "Required value"));
        } else if !paths.insert(m.mount_path.as_str()) {
            errs.push(invalid(format!("{mp}.mountPath"), &m.mount_path, "must be unique"));
        }
        let sub = m.sub_path.as_deref().unwrap_or("");
        let expr = m.sub_path_expr.as_deref().unwrap_or("");
        if !sub.is_empty() && !expr.is_empty() {
            errs.push(invalid(format!("{mp}.subPathExpr"), expr, "subPathExpr and subPath are mutually exclusive"));
        }
        if !sub.is_empty() {
            if sub.starts_with('/') {
                errs.push(invalid(format!("{mp}.subPath"), sub, "must be a relative path"));
            } else if sub.split('/').any(|s| s == "..") {
                errs.push(invalid(format!("{mp}.subPath"), sub, "must not contain '..'"));
            }
        }
        if !expr.is_empty() && expr.starts_with('/') {
            errs.push(invalid(format!("{mp}.subPathExpr"), expr, "must be a relative path"));
        }
        match m.mount_propagation.as_deref() {
            None | Some("None") | Some("HostToContainer") => {}
            Some("Bidirectional") if privileged => {}
            Some("Bidirectional") => errs.push(err(
                format!("{mp}.mountPropagation"),
                "Forbidden: Bidirectional mount propagation is available only to privileged containers",
            )),
            Some(other) => errs.push(unsupported(
                format!("{mp}.mountPropagation"),
                other,
                &["Bidirectional", "HostToContainer", "None"],
            )),
        }
    }
}

/// Every problem with the pod's volumes and its containers' mounts.
pub fn validate(spec: &PodSpec) -> Vec<FieldError> {
    let mut errs = vec![];
    let mut by_name: HashMap<&str, &Volume> = HashMap::new();
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        let at = format!("spec.volumes[{i}]");
        if v.name.is_empty() {
            errs.push(err(format!("{at}.name"), "Required value"));
        } else if !is_dns_label(&v.name) {
            errs.push(invalid(
                format!("{at}.name"),
                &v.name,
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
            ));
        } else if by_name.insert(v.name.as_str(), v).is_some() {
            errs.push(err(format!("{at}.name"), format!("Duplicate value: \"{}\"", v.name)));
        }
        volume(&at, v, &mut errs);
    }
    for (list, cs) in [
        ("spec.initContainers", spec.init_containers.as_deref().unwrap_or(&[])),
        ("spec.containers", &spec.containers[..]),
    ] {
        for (i, c) in cs.iter().enumerate() {
            mounts(&format!("{list}[{i}]"), c, &by_name, &mut errs);
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        ConfigMapVolumeSource, EmptyDirVolumeSource, HostPathVolumeSource, SecurityContext, VolumeMount,
    };

    use super::*;

    fn hp(name: &str, path: &str, t: Option<&str>) -> Volume {
        Volume {
            name: name.into(),
            host_path: Some(HostPathVolumeSource { path: path.into(), type_: t.map(Into::into) }),
            ..Default::default()
        }
    }

    fn spec(volumes: Vec<Volume>, mounts: Vec<VolumeMount>) -> PodSpec {
        PodSpec {
            volumes: Some(volumes),
            containers: vec![Container { name: "c".into(), volume_mounts: Some(mounts), ..Default::default() }],
            ..Default::default()
        }
    }

    fn vm(name: &str, path: &str) -> VolumeMount {
        VolumeMount { name: name.into(), mount_path: path.into(), ..Default::default() }
    }

    fn messages(s: &PodSpec) -> Vec<String> {
        validate(s).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_valid_spec_passes() {
        let s = spec(
            vec![
                hp("etc", "/etc/kubernetes/pki", Some("DirectoryOrCreate")),
                Volume {
                    name: "scratch".into(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Default::default()
                },
            ],
            vec![
                VolumeMount { read_only: Some(true), ..vm("etc", "/etc/kubernetes/pki") },
                VolumeMount {
                    sub_path: Some("a/b".into()),
                    mount_propagation: Some("HostToContainer".into()),
                    ..vm("scratch", "/s")
                },
            ],
        );
        assert_eq!(messages(&s), Vec::<String>::new());
    }

    #[test]
    fn problems_in_the_api_servers_words() {
        let s = spec(
            vec![
                hp("a", "/x", Some("Pipe")),
                hp("a", "", None),
                Volume { name: "none".into(), ..Default::default() },
                Volume {
                    name: "cm".into(),
                    config_map: Some(ConfigMapVolumeSource {
                        name: "x".into(),
                        default_mode: Some(0o1777),
                        items: Some(vec![KeyToPath { key: "k".into(), path: "../up".into(), ..Default::default() }]),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ],
            vec![
                vm("missing", "/m"),
                vm("a", ""),
                vm("cm", "/dup"),
                VolumeMount { sub_path: Some("/abs".into()), ..vm("cm", "/dup") },
                VolumeMount { mount_propagation: Some("Bidirectional".into()), ..vm("a", "/b") },
                VolumeMount { sub_path: Some("x".into()), sub_path_expr: Some("y".into()), ..vm("a", "/c") },
            ],
        );
        let got = messages(&s);
        let want = [
            "spec.volumes[0].hostPath.type: Unsupported value: \"Pipe\": supported values: \"BlockDevice\", \"CharDevice\", \"Directory\", \"DirectoryOrCreate\", \"File\", \"FileOrCreate\", \"Socket\"",
            "spec.volumes[1].name: Duplicate value: \"a\"",
            "spec.volumes[1].hostPath.path: Required value",
            "spec.volumes[2]: Required value: must specify a volume type",
            "spec.volumes[3].configMap.defaultMode: Invalid value: 1023: must be a number between 0 and 0777 (octal), both inclusive",
            "spec.volumes[3].configMap.items[0].path: Invalid value: \"../up\": invalid path: must not start with '..': ../up",
            "spec.containers[0].volumeMounts[0].name: Not found: \"missing\"",
            "spec.containers[0].volumeMounts[1].mountPath: Required value",
            "spec.containers[0].volumeMounts[3].mountPath: Invalid value: \"/dup\": must be unique",
            "spec.containers[0].volumeMounts[3].subPath: Invalid value: \"/abs\": must be a relative path",
            "spec.containers[0].volumeMounts[4].mountPropagation: Forbidden: Bidirectional mount propagation is available only to privileged containers",
            "spec.containers[0].volumeMounts[5].subPathExpr: Invalid value: \"y\": subPathExpr and subPath are mutually exclusive",
        ];
        assert_eq!(got, want);
        let mut privileged = spec(
            vec![hp("a", "/x", None)],
            vec![VolumeMount { mount_propagation: Some("Bidirectional".into()), ..vm("a", "/b") }],
        );
        privileged.containers[0].security_context =
            Some(SecurityContext { privileged: Some(true), ..Default::default() });
        assert!(validate(&privileged).is_empty());
    }
}
