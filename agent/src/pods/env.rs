//! Container environment as the kubelet builds it: `envFrom` (ConfigMaps
//! and Secrets, with their prefix), then `env` in order, with `$(VAR)`
//! references to earlier variables expanded, values from the downward API
//! (`fieldRef`, `resourceFieldRef`) and from ConfigMap and Secret keys, and
//! the same expansion applied to command and args, and the service
//! variables (`service_env`) after them. The objects come prefetched
//! ([`EnvObjects`]), so building stays pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};

pub use crate::volumes::downward::{DownwardContext, EnvError, field, resource};
use crate::volumes::objects::EnvObjects;

/// Expands `$(NAME)` from `vars`; `$$` is a literal `$`; references to
/// unknown names stay as written (Kubernetes' expansion rules).
pub fn expand(input: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(input.len());
    let bytes = input.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' && i + 1 < bytes.len() {
            match bytes[i + 1] {
                b'$' => {
                    out.push('$');
                    i += 2;
                    continue;
                }
                b'(' => {
                    if let Some(end) = input[i + 2..].find(')') {
                        let name = &input[i + 2..i + 2 + end];
                        match vars.get(name) {
                            Some(v) => out.push_str(v),
                            None => out.push_str(&input[i..i + 3 + end]),
                        }
                        i += 3 + end;
                        continue;
                    }
                }
                _ => {}
            }
        }
        let ch = input[i..].chars().next().expect("i is on a char boundary");
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

fn is_env_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// The variables of `envFrom`, in source order (later sources win), keys
/// sorted within a source; keys that are not valid variable names are
/// skipped, as the kubelet does.
fn env_from(pod: &Pod, c: &Container, objects: &EnvObjects) -> Result<Vec<(String, String)>, EnvError> {
    let mut out: Vec<(String, String)> = vec![];
    let mut put = |k: String, v: String| {
        if !is_env_name(&k) {
            tracing::warn!(
                pod = pod.metadata.name.as_deref().unwrap_or(""),
                "envFrom key {k:?} skipped: not a valid environment variable name"
            );
            return;
        }
        match out.iter_mut().find(|(name, _)| *name == k) {
            Some(slot) => slot.1 = v,
            None => out.push((k, v)),
        }
    };
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        if let Some(r) = &from.config_map_ref {
            match objects.config_map(&r.name) {
                Ok(cm) => {
                    for (k, v) in cm.data.iter().flatten() {
                        put(format!("{prefix}{k}"), v.clone());
                    }
                }
                Err(e) if e.is_not_found() && r.optional == Some(true) => {}
                Err(e) => return Err(EnvError(e.to_string())),
            }
        }
        if let Some(r) = &from.secret_ref {
            match objects.secret(&r.name) {
                Ok(s) => {
                    for (k, v) in s.data.iter().flatten() {
                        put(format!("{prefix}{k}"), String::from_utf8_lossy(&v.0).into_owned());
                    }
                }
                Err(e) if e.is_not_found() && r.optional == Some(true) => {}
                Err(e) => return Err(EnvError(e.to_string())),
            }
        }
    }
    Ok(out)
}

/// The container's environment, in order: `envFrom`, then `env` (which
/// overrides it).
pub fn build(
    pod: &Pod,
    c: &Container,
    cx: &DownwardContext,
    objects: &EnvObjects,
) -> Result<Vec<(String, String)>, EnvError> {
    if let Some(e) = &objects.services_error {
        return Err(EnvError(format!("failed to list services when setting up env vars: {e}")));
    }
    // Service variables are there for `$(VAR)` and come last, unless the
    // container defines the same name.
    let services = super::service_env::service_env(pod, &objects.services);
    let mut vars: BTreeMap<String, String> = services.iter().cloned().collect();
    let mut ordered: Vec<(String, String)> = env_from(pod, c, objects)?;
    vars.extend(ordered.iter().cloned());
    for e in c.env.iter().flatten() {
        let Some(value) = value_of(pod, c, e, cx, &vars, objects)? else { continue };
        if let Some(slot) = ordered.iter_mut().find(|(k, _)| *k == e.name) {
            slot.1 = value.clone();
        } else {
            ordered.push((e.name.clone(), value.clone()));
        }
        vars.insert(e.name.clone(), value);
    }
    for (k, v) in services {
        if !ordered.iter().any(|(name, _)| *name == k) {
            ordered.push((k, v));
        }
    }
    Ok(ordered)
}

/// Command and args with `$(VAR)` expanded from the environment.
pub fn expand_all(items: Option<&Vec<String>>, env: &[(String, String)]) -> Vec<String> {
    let vars: BTreeMap<String, String> = env.iter().cloned().collect();
    items.into_iter().flatten().map(|s| expand(s, &vars)).collect()
}

fn value_of(
    pod: &Pod,
    c: &Container,
    e: &EnvVar,
    cx: &DownwardContext,
    vars: &BTreeMap<String, String>,
    objects: &EnvObjects,
) -> Result<Option<String>, EnvError> {
    if let Some(v) = &e.value {
        return Ok(Some(expand(v, vars)));
    }
    let Some(from) = &e.value_from else { return Ok(Some(String::new())) };
    if let Some(f) = &from.field_ref {
        return field(pod, &f.field_path, cx).map(Some);
    }
    if let Some(r) = &from.resource_field_ref {
        let target = match r.container_name.as_deref() {
            None | Some("") => c,
            Some(name) => pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.iter().chain(s.init_containers.iter().flatten()).find(|x| x.name == name))
                .ok_or_else(|| {
                    EnvError(format!("env {}: resourceFieldRef names unknown container {name:?}", e.name))
                })?,
        };
        return resource(target, &r.resource, r.divisor.as_ref().map(|d| d.0.as_str()), cx)
            .map(Some)
            .map_err(|why| EnvError(format!("env {}: {why}", e.name)));
    }
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    if let Some(k) = &from.config_map_key_ref {
        let optional = k.optional == Some(true);
        let cm = match objects.config_map(&k.name) {
            Ok(cm) => cm,
            Err(e) if e.is_not_found() && optional => return Ok(None),
            Err(e) => return Err(EnvError(e.to_string())),
        };
        return match cm.data.as_ref().and_then(|d| d.get(&k.key)) {
            Some(v) => Ok(Some(v.clone())),
            None if optional => Ok(None),
            None => Err(EnvError(format!("couldn't find key {} in ConfigMap {ns}/{}", k.key, k.name))),
        };
    }
    if let Some(k) = &from.secret_key_ref {
        let optional = k.optional == Some(true);
        let s = match objects.secret(&k.name) {
            Ok(s) => s,
            Err(e) if e.is_not_found() && optional => return Ok(None),
            Err(e) => return Err(EnvError(e.to_string())),
        };
        let value = s
            .data
            .as_ref()
            .and_then(|d| d.get(&k.key))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .or_else(|| s.string_data.as_ref().and_then(|d| d.get(&k.key)).cloned());
        return match value {
            Some(v) => Ok(Some(v)),
            None if optional => Ok(None),
            None => Err(EnvError(format!("couldn't find key {} in Secret {ns}/{}", k.key, k.name))),
        };
    }
    Ok(Some(String::new()))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{EnvVarSource, ObjectFieldSelector, PodSpec, ResourceFieldSelector, ResourceRequirements},
        apimachinery::pkg::api::resource::Quantity as Q,
    };

    use super::*;

    #[test]
    fn expansion_rules() {
        let vars: BTreeMap<String, String> = [("A".to_string(), "x".to_string())].into();
        for (input, want) in [
            ("$(A)", "x"),
            ("pre-$(A)-post", "pre-x-post"),
            ("$(B)", "$(B)"),
            ("$$(A)", "$(A)"),
            ("$$", "$"),
            ("$(A", "$(A"),
            ("cost: 5$", "cost: 5$"),
            ("ünï$(A)", "ünïx"),
        ] {
            assert_eq!(expand(input, &vars), want, "{input}");
        }
    }

    fn env(name: &str, from: EnvVarSource) -> EnvVar {
        EnvVar { name: name.into(), value_from: Some(from), ..Default::default() }
    }

    fn field_env(name: &str, path: &str) -> EnvVar {
        env(
            name,
            EnvVarSource {
                field_ref: Some(ObjectFieldSelector { field_path: path.into(), ..Default::default() }),
                ..Default::default()
            },
        )
    }

    #[test]
    fn downward_api_and_order() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("web".into());
        pod.metadata.namespace = Some("prod".into());
        pod.metadata.uid = Some("u1".into());
        pod.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
        let c = Container {
            name: "c".into(),
            env: Some(vec![
                field_env("POD", "metadata.name"),
                field_env("NS", "metadata.namespace"),
                field_env("APP", "metadata.labels['app']"),
                field_env("NODE", "spec.nodeName"),
                field_env("IP", "status.podIP"),
                field_env("HOST", "status.hostIP"),
                EnvVar { name: "GREETING".into(), value: Some("hi $(POD) in $(NS)".into()), ..Default::default() },
                env(
                    "MEM",
                    EnvVarSource {
                        resource_field_ref: Some(ResourceFieldSelector {
                            resource: "limits.memory".into(),
                            divisor: Some(Q("1Mi".into())),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ),
                env(
                    "CPU",
                    EnvVarSource {
                        resource_field_ref: Some(ResourceFieldSelector {
                            resource: "limits.cpu".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ),
            ]),
            resources: Some(ResourceRequirements {
                limits: Some([("memory".to_string(), Q("64Mi".into())), ("cpu".to_string(), Q("250m".into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        pod.spec = Some(PodSpec { node_name: Some("n1".into()), containers: vec![c.clone()], ..Default::default() });
        let cx = DownwardContext {
            host_ip: Some("10.0.0.1".into()),
            pod_ips: vec!["10.1.0.5".into()],
            ..Default::default()
        };
        let got = build(&pod, &c, &cx, &EnvObjects::default()).unwrap();
        let want: Vec<(String, String)> = [
            ("POD", "web"),
            ("NS", "prod"),
            ("APP", "web"),
            ("NODE", "n1"),
            ("IP", "10.1.0.5"),
            ("HOST", "10.0.0.1"),
            ("GREETING", "hi web in prod"),
            ("MEM", "64"),
            ("CPU", "1"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(got, want);
        assert_eq!(expand_all(Some(&vec!["echo".into(), "$(GREETING)".into()]), &got), vec!["echo", "hi web in prod"]);
    }

    #[test]
    fn unset_limits_read_node_allocatable_and_api_refs_fail_clearly() {
        let c = Container::default();
        let cx = DownwardContext { allocatable_cpu_milli: 3500, allocatable_memory: 1 << 30, ..Default::default() };
        assert_eq!(resource(&c, "limits.cpu", None, &cx).unwrap(), "4");
        assert_eq!(resource(&c, "limits.cpu", Some("1m"), &cx).unwrap(), "3500");
        assert_eq!(resource(&c, "limits.memory", Some("1Gi"), &cx).unwrap(), "1");
        assert!(resource(&c, "limits.gpu", None, &cx).unwrap_err().contains("limits.gpu"));
        let pod = Pod::default();
        let cm = Container {
            env: Some(vec![env(
                "X",
                EnvVarSource {
                    config_map_key_ref: Some(k8s_openapi::api::core::v1::ConfigMapKeySelector {
                        name: "settings".into(),
                        key: "x".into(),
                        optional: None,
                    }),
                    ..Default::default()
                },
            )]),
            ..Default::default()
        };
        assert_eq!(build(&pod, &cm, &cx, &EnvObjects::default()).unwrap_err().0, "configmap \"settings\" not found");
        assert!(field(&pod, "spec.bogus", &cx).unwrap_err().0.contains("spec.bogus"));
    }

    #[test]
    fn config_map_and_secret_references_and_env_from() {
        use k8s_openapi::{
            ByteString,
            api::core::v1::{
                ConfigMap, ConfigMapEnvSource, ConfigMapKeySelector, EnvFromSource, Secret, SecretEnvSource,
                SecretKeySelector,
            },
        };
        let cm = ConfigMap {
            data: Some(
                [
                    ("mode".to_string(), "fast".to_string()),
                    ("bad key".to_string(), "x".to_string()),
                    ("LEVEL".to_string(), "3".to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        };
        let secret =
            Secret { data: Some([("pw".to_string(), ByteString(b"hunter2".to_vec()))].into()), ..Default::default() };
        let mut objects = EnvObjects::default();
        objects.config_maps.insert("settings".into(), Ok(cm));
        objects.secrets.insert("creds".into(), Ok(secret));
        let mut pod = Pod::default();
        pod.metadata.namespace = Some("prod".into());
        let key = |cm: &str, key: &str, optional: Option<bool>| EnvVarSource {
            config_map_key_ref: Some(ConfigMapKeySelector { name: cm.into(), key: key.into(), optional }),
            ..Default::default()
        };
        let c = Container {
            env_from: Some(vec![
                EnvFromSource {
                    prefix: Some("CFG_".into()),
                    config_map_ref: Some(ConfigMapEnvSource { name: "settings".into(), optional: None }),
                    ..Default::default()
                },
                EnvFromSource {
                    secret_ref: Some(SecretEnvSource { name: "absent".into(), optional: Some(true) }),
                    ..Default::default()
                },
            ]),
            env: Some(vec![
                env("MODE", key("settings", "mode", None)),
                env("MISSING_OK", key("settings", "nope", Some(true))),
                env("GONE_OK", key("absent", "x", Some(true))),
                env(
                    "PW",
                    EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: "creds".into(),
                            key: "pw".into(),
                            optional: None,
                        }),
                        ..Default::default()
                    },
                ),
                EnvVar {
                    name: "CFG_LEVEL".into(),
                    value: Some("level $(CFG_LEVEL) overridden".into()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        let got = build(&pod, &c, &DownwardContext::default(), &objects).unwrap();
        let want: Vec<(String, String)> =
            [("CFG_LEVEL", "level 3 overridden"), ("CFG_mode", "fast"), ("MODE", "fast"), ("PW", "hunter2")]
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect();
        assert_eq!(got, want);
        let missing_key = Container { env: Some(vec![env("X", key("settings", "nope", None))]), ..Default::default() };
        assert_eq!(
            build(&pod, &missing_key, &DownwardContext::default(), &objects).unwrap_err().0,
            "couldn't find key nope in ConfigMap prod/settings"
        );
        let missing_secret = Container {
            env_from: Some(vec![EnvFromSource {
                secret_ref: Some(SecretEnvSource { name: "absent".into(), optional: None }),
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert_eq!(
            build(&pod, &missing_secret, &DownwardContext::default(), &objects).unwrap_err().0,
            "secret \"absent\" not found"
        );
    }
}
