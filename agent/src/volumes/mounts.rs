//! A container's volumeMounts as the runtime gets them (the kubelet's
//! `makeMounts`): which volume, read-only or not, the subPath (with
//! `subPathExpr` expanded from the container's environment) and the mount
//! propagation. Pure; the subPath bind mounts are made afterwards.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Component, Path, PathBuf},
};

use k8s_openapi::api::core::v1::Container;

use crate::cri::api;

/// Where a set-up volume is on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumePath {
    pub path: PathBuf,
    /// The plugin mounts it read-only whatever the volumeMount says
    /// (configMap, secret, downwardAPI, projected).
    pub read_only: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedMount {
    /// Index in the container's volumeMounts (names the subPath mount).
    pub index: usize,
    pub volume: String,
    pub container_path: String,
    /// The volume's path on the node.
    pub volume_path: PathBuf,
    pub sub_path: Option<String>,
    pub read_only: bool,
    pub propagation: api::MountPropagation,
}

/// Expands `$(VAR)` from the environment; a reference to a variable that
/// is unset or empty is an error, as the kubelet's
/// `ExpandContainerVolumeMounts`.
pub fn expand_sub_path_expr(expr: &str, env: &[(String, String)]) -> Result<String, String> {
    let vars: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut missing = BTreeSet::new();
    let mut out = String::new();
    let mut rest = expr;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(body) = after.strip_prefix('(')
            && let Some(end) = body.find(')')
        {
            let name = &body[..end];
            match vars.get(name).filter(|v| !v.is_empty()) {
                Some(v) => out.push_str(v),
                None => {
                    missing.insert(name.to_owned());
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    if !missing.is_empty() {
        return Err(format!("missing value for {}", missing.into_iter().collect::<Vec<_>>().join(", ")));
    }
    Ok(out)
}

fn propagation(mode: Option<&str>) -> api::MountPropagation {
    match mode {
        Some("HostToContainer") => api::MountPropagation::PropagationHostToContainer,
        Some("Bidirectional") => api::MountPropagation::PropagationBidirectional,
        _ => api::MountPropagation::PropagationPrivate,
    }
}

/// The container's mounts, in volumeMounts order.
pub fn plan(
    c: &Container,
    volumes: &BTreeMap<String, VolumePath>,
    env: &[(String, String)],
) -> Result<Vec<PlannedMount>, String> {
    let mut out = vec![];
    for (index, m) in c.volume_mounts.iter().flatten().enumerate() {
        let Some(v) = volumes.get(&m.name) else {
            return Err(format!("cannot find volume {:?} to mount into container {:?}", m.name, c.name));
        };
        let mut sub_path = m.sub_path.clone().filter(|s| !s.is_empty());
        if let Some(expr) = m.sub_path_expr.as_deref().filter(|s| !s.is_empty()) {
            sub_path = Some(expand_sub_path_expr(expr, env)?).filter(|s| !s.is_empty());
        }
        if let Some(s) = &sub_path {
            if Path::new(s).is_absolute() {
                return Err(format!("error SubPath `{s}` must not be an absolute path"));
            }
            if Path::new(s).components().any(|c| matches!(c, Component::ParentDir)) {
                return Err(format!("unable to provision SubPath `{s}`: must not contain '..'"));
            }
        }
        let privileged = c.security_context.as_ref().and_then(|s| s.privileged).unwrap_or(false);
        let prop = propagation(m.mount_propagation.as_deref());
        if prop == api::MountPropagation::PropagationBidirectional && !privileged {
            return Err(format!(
                "volumeMount {:?} of container {:?}: Bidirectional mount propagation is available only to privileged containers",
                m.name, c.name
            ));
        }
        out.push(PlannedMount {
            index,
            volume: m.name.clone(),
            container_path: m.mount_path.clone(),
            volume_path: v.path.clone(),
            sub_path,
            read_only: m.read_only.unwrap_or(false) || v.read_only,
            propagation: prop,
        });
    }
    Ok(out)
}

/// The CRI mount for a planned one, given the host path to use (the
/// volume, or its subPath bind mount).
pub fn cri_mount(p: &PlannedMount, host_path: &Path) -> api::Mount {
    api::Mount {
        container_path: p.container_path.clone(),
        host_path: host_path.to_string_lossy().into_owned(),
        readonly: p.read_only,
        propagation: p.propagation as i32,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{SecurityContext, VolumeMount};

    use super::*;

    fn vm(name: &str, path: &str) -> VolumeMount {
        VolumeMount { name: name.into(), mount_path: path.into(), ..Default::default() }
    }

    fn volumes() -> BTreeMap<String, VolumePath> {
        [
            (
                "data".to_string(),
                VolumePath {
                    path: "/var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/data".into(),
                    read_only: false,
                },
            ),
            (
                "cfg".to_string(),
                VolumePath {
                    path: "/var/lib/kubelet/pods/u/volumes/kubernetes.io~configmap/cfg".into(),
                    read_only: true,
                },
            ),
            ("host".to_string(), VolumePath { path: "/srv".into(), read_only: false }),
        ]
        .into()
    }

    #[test]
    fn mounts_with_read_only_sub_paths_and_propagation() {
        let c = Container {
            name: "app".into(),
            volume_mounts: Some(vec![
                VolumeMount { read_only: Some(true), ..vm("data", "/data") },
                vm("cfg", "/etc/app"),
                VolumeMount {
                    sub_path: Some("logs".into()),
                    mount_propagation: Some("HostToContainer".into()),
                    ..vm("host", "/logs")
                },
                VolumeMount { sub_path_expr: Some("pods/$(POD_NAME)".into()), ..vm("data", "/mine") },
            ]),
            ..Default::default()
        };
        let env = vec![("POD_NAME".to_string(), "web-1".to_string())];
        let got = plan(&c, &volumes(), &env).unwrap();
        assert_eq!(got.len(), 4);
        assert!(got[0].read_only && got[0].sub_path.is_none());
        assert!(got[1].read_only, "configMap volumes are always read-only");
        assert_eq!(got[2].sub_path.as_deref(), Some("logs"));
        assert_eq!(got[2].propagation, api::MountPropagation::PropagationHostToContainer);
        assert!(!got[2].read_only);
        assert_eq!(got[3].sub_path.as_deref(), Some("pods/web-1"));
        assert_eq!(got[3].index, 3);
        let m = cri_mount(&got[2], Path::new("/x"));
        assert_eq!((m.host_path.as_str(), m.container_path.as_str(), m.propagation), ("/x", "/logs", 1));
    }

    #[test]
    fn errors_in_the_kubelets_words() {
        let one = |m: VolumeMount| Container { name: "app".into(), volume_mounts: Some(vec![m]), ..Default::default() };
        let err = |c: Container| plan(&c, &volumes(), &[]).unwrap_err();
        assert_eq!(err(one(vm("nope", "/x"))), "cannot find volume \"nope\" to mount into container \"app\"");
        assert_eq!(
            err(one(VolumeMount { sub_path: Some("/abs".into()), ..vm("data", "/x") })),
            "error SubPath `/abs` must not be an absolute path"
        );
        assert!(err(one(VolumeMount { sub_path: Some("a/../../b".into()), ..vm("data", "/x") })).contains("'..'"));
        assert_eq!(
            err(one(VolumeMount { sub_path_expr: Some("$(A)/$(B)".into()), ..vm("data", "/x") })),
            "missing value for A, B"
        );
        let bidi = VolumeMount { mount_propagation: Some("Bidirectional".into()), ..vm("host", "/h") };
        assert!(err(one(bidi.clone())).contains("only to privileged containers"));
        let mut privileged = one(bidi);
        privileged.security_context = Some(SecurityContext { privileged: Some(true), ..Default::default() });
        assert_eq!(
            plan(&privileged, &volumes(), &[]).unwrap()[0].propagation,
            api::MountPropagation::PropagationBidirectional
        );
    }

    #[test]
    fn sub_path_expr_expansion() {
        let env = vec![("A".to_string(), "x".to_string()), ("E".to_string(), String::new())];
        assert_eq!(expand_sub_path_expr("$(A)/y", &env).unwrap(), "x/y");
        assert_eq!(expand_sub_path_expr("$$(A)", &env).unwrap(), "$(A)");
        assert_eq!(expand_sub_path_expr("cost$", &env).unwrap(), "cost$");
        assert_eq!(expand_sub_path_expr("$(E)", &env).unwrap_err(), "missing value for E");
    }
}
