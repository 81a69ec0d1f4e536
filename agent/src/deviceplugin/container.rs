//! What the plugins' Allocate answers add to a container, as the
//! kubelet's `deviceRunContainerOptions` merges them: environment
//! variables, mounts, device nodes, annotations and CDI devices, each
//! keyed (by name, container path or CDI name) so that two resources
//! asking for the same key with different values keep the first one and
//! the conflict is reported. Pure.

use std::collections::BTreeMap;

use super::api::ContainerAllocateResponse;
use crate::cri::api as cri;

/// The merged options for one container.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceRunOptions {
    pub envs: BTreeMap<String, String>,
    pub mounts: Vec<cri::Mount>,
    pub devices: Vec<cri::Device>,
    pub annotations: BTreeMap<String, String>,
    pub cdi_devices: Vec<String>,
    /// Conflicting settings left out, for the log.
    pub conflicts: Vec<String>,
}

/// Adds `from`'s entries to `into`; a key already there with another
/// value keeps the first and is reported as a conflict.
fn merge_first_wins<'a>(
    into: &mut BTreeMap<String, String>,
    from: impl IntoIterator<Item = (&'a String, &'a String)>,
    what: &str,
    resource: &str,
    conflicts: &mut Vec<String>,
) {
    for (k, v) in from {
        match into.get(k) {
            Some(old) if old != v => {
                conflicts.push(format!("{what} {k} from {resource}: {v:?} conflicts with {old:?}"))
            }
            Some(_) => {}
            None => {
                into.insert(k.clone(), v.clone());
            }
        }
    }
}

/// Merges the answers (resource, response) in order.
pub fn run_options<'a>(
    responses: impl IntoIterator<Item = (&'a str, &'a ContainerAllocateResponse)>,
) -> DeviceRunOptions {
    let mut o = DeviceRunOptions::default();
    for (resource, r) in responses {
        merge_first_wins(&mut o.envs, &r.envs, "environment variable", resource, &mut o.conflicts);
        for m in &r.mounts {
            match o.mounts.iter().find(|x| x.container_path == m.container_path) {
                Some(old) if old.host_path != m.host_path || old.readonly != m.read_only => o.conflicts.push(format!(
                    "mount {} from {resource}: {} conflicts with {}",
                    m.container_path, m.host_path, old.host_path
                )),
                Some(_) => {}
                None => o.mounts.push(cri::Mount {
                    container_path: m.container_path.clone(),
                    host_path: m.host_path.clone(),
                    readonly: m.read_only,
                    ..Default::default()
                }),
            }
        }
        for d in &r.devices {
            match o.devices.iter().find(|x| x.container_path == d.container_path) {
                Some(old) if old.host_path != d.host_path || old.permissions != d.permissions => {
                    o.conflicts.push(format!(
                        "device {} from {resource}: {} conflicts with {}",
                        d.container_path, d.host_path, old.host_path
                    ))
                }
                Some(_) => {}
                None => o.devices.push(cri::Device {
                    container_path: d.container_path.clone(),
                    host_path: d.host_path.clone(),
                    permissions: d.permissions.clone(),
                }),
            }
        }
        merge_first_wins(&mut o.annotations, &r.annotations, "annotation", resource, &mut o.conflicts);
        for c in &r.cdi_devices {
            if !o.cdi_devices.contains(&c.name) {
                o.cdi_devices.push(c.name.clone());
            }
        }
    }
    o
}

/// Adds the options to a container config: the devices' environment and
/// mounts come before the container's own (as the kubelet orders them, so
/// the pod's settings win where the runtime takes the last one).
pub fn apply(config: &mut cri::ContainerConfig, o: &DeviceRunOptions) {
    let mut envs: Vec<cri::KeyValue> =
        o.envs.iter().map(|(key, value)| cri::KeyValue { key: key.clone(), value: value.clone() }).collect();
    envs.append(&mut config.envs);
    config.envs = envs;
    let mut mounts = o.mounts.clone();
    mounts.append(&mut config.mounts);
    config.mounts = mounts;
    config.devices.extend(o.devices.iter().cloned());
    for (k, v) in &o.annotations {
        config.annotations.entry(k.clone()).or_insert_with(|| v.clone());
    }
    config.cdi_devices.extend(o.cdi_devices.iter().map(|name| cri::CdiDevice { name: name.clone() }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deviceplugin::api;

    fn response(
        envs: &[(&str, &str)],
        mounts: &[(&str, &str, bool)],
        devices: &[(&str, &str, &str)],
    ) -> ContainerAllocateResponse {
        ContainerAllocateResponse {
            envs: envs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            mounts: mounts
                .iter()
                .map(|(c, h, ro)| api::Mount {
                    container_path: c.to_string(),
                    host_path: h.to_string(),
                    read_only: *ro,
                })
                .collect(),
            devices: devices
                .iter()
                .map(|(c, h, p)| api::DeviceSpec {
                    container_path: c.to_string(),
                    host_path: h.to_string(),
                    permissions: p.to_string(),
                })
                .collect(),
            annotations: [("a.com/ids".to_string(), "0".to_string())].into(),
            cdi_devices: vec![api::CdiDevice { name: "a.com/x=0".into() }],
        }
    }

    #[test]
    fn responses_merge_by_key_and_conflicts_keep_the_first() {
        let a =
            response(&[("A", "1"), ("SHARED", "x")], &[("/opt/a", "/host/a", true)], &[("/dev/a0", "/dev/null", "rw")]);
        let b = response(
            &[("B", "2"), ("SHARED", "y")],
            &[("/opt/a", "/host/other", true), ("/opt/b", "/host/b", false)],
            &[("/dev/a0", "/dev/null", "rw"), ("/dev/b0", "/dev/zero", "r")],
        );
        let o = run_options([("a.com/x", &a), ("b.com/y", &b)]);
        assert_eq!(
            o.envs,
            BTreeMap::from([("A".into(), "1".into()), ("B".into(), "2".into()), ("SHARED".into(), "x".into())])
        );
        let mounts: Vec<(&str, &str, bool)> =
            o.mounts.iter().map(|m| (m.container_path.as_str(), m.host_path.as_str(), m.readonly)).collect();
        assert_eq!(mounts, vec![("/opt/a", "/host/a", true), ("/opt/b", "/host/b", false)]);
        let devices: Vec<(&str, &str, &str)> = o
            .devices
            .iter()
            .map(|d| (d.container_path.as_str(), d.host_path.as_str(), d.permissions.as_str()))
            .collect();
        assert_eq!(devices, vec![("/dev/a0", "/dev/null", "rw"), ("/dev/b0", "/dev/zero", "r")]);
        assert_eq!(o.cdi_devices, vec!["a.com/x=0".to_string()]);
        assert_eq!(
            o.conflicts,
            vec![
                "environment variable SHARED from b.com/y: \"y\" conflicts with \"x\"".to_string(),
                "mount /opt/a from b.com/y: /host/other conflicts with /host/a".to_string(),
            ]
        );
    }

    #[test]
    fn apply_puts_device_settings_before_the_containers_own() {
        let o = run_options([(
            "a.com/x",
            &response(&[("FAKE", "0")], &[("/fake", "/h", true)], &[("/dev/f", "/dev/null", "rw")]),
        )]);
        let mut config = cri::ContainerConfig {
            envs: vec![cri::KeyValue { key: "FAKE".into(), value: "mine".into() }],
            mounts: vec![cri::Mount { container_path: "/data".into(), ..Default::default() }],
            annotations: [("a.com/ids".to_string(), "pod's".to_string())].into(),
            ..Default::default()
        };
        apply(&mut config, &o);
        let envs: Vec<(&str, &str)> = config.envs.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect();
        assert_eq!(envs, vec![("FAKE", "0"), ("FAKE", "mine")]);
        let mounts: Vec<&str> = config.mounts.iter().map(|m| m.container_path.as_str()).collect();
        assert_eq!(mounts, vec!["/fake", "/data"]);
        assert!(config.mounts[0].readonly);
        assert_eq!(config.devices.len(), 1);
        assert_eq!(config.devices[0].permissions, "rw");
        assert_eq!(config.annotations["a.com/ids"], "pod's");
        assert_eq!(config.cdi_devices, vec![cri::CdiDevice { name: "a.com/x=0".into() }]);
    }
}
