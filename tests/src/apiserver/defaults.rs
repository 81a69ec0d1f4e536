//! Defaulting the API server applies to pods on create (the fields the
//! kubelet reads), and the status a new pod starts with.

use serde_json::{Value, json};

fn default(obj: &mut Value, field: &str, v: Value) {
    if obj.get(field).is_none_or(Value::is_null) {
        obj[field] = v;
    }
}

fn image_pull_policy(image: &str) -> &'static str {
    // `:latest` or no tag (and no digest) → Always.
    let name = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') {
        return "IfNotPresent";
    }
    match name.split_once(':') {
        None => "Always",
        Some((_, "latest")) => "Always",
        Some(_) => "IfNotPresent",
    }
}

fn default_container(c: &mut Value) {
    let image = c.get("image").and_then(Value::as_str).unwrap_or("").to_owned();
    default(c, "imagePullPolicy", image_pull_policy(&image).into());
    default(c, "terminationMessagePath", "/dev/termination-log".into());
    default(c, "terminationMessagePolicy", "File".into());
    default(c, "resources", json!({}));
    if let Some(ports) = c.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports {
            default(p, "protocol", "TCP".into());
        }
    }
    // A limit without a request defaults the request to the limit.
    if let Some(limits) = c.pointer("/resources/limits").and_then(Value::as_object).cloned() {
        let requests = &mut c["resources"]["requests"];
        if !requests.is_object() {
            *requests = json!({});
        }
        for (k, v) in limits {
            if requests.get(&k).is_none() {
                requests[k] = v;
            }
        }
    }
}

/// QoS class as the API server computes it for status.qosClass.
pub(super) fn qos_class(spec: &Value) -> &'static str {
    let containers: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .filter_map(|f| spec.get(*f).and_then(Value::as_array))
        .flatten()
        .collect();
    let get = |c: &Value, kind: &str, r: &str| {
        c.pointer(&format!("/resources/{kind}/{r}")).and_then(Value::as_str).map(str::to_owned)
    };
    let any = containers.iter().any(|c| {
        ["requests", "limits"]
            .iter()
            .any(|k| c.pointer(&format!("/resources/{k}")).and_then(Value::as_object).is_some_and(|m| !m.is_empty()))
    });
    if !any {
        return "BestEffort";
    }
    let guaranteed = containers.iter().all(|c| {
        ["cpu", "memory"].iter().all(|r| {
            let (req, lim) = (get(c, "requests", r), get(c, "limits", r));
            lim.is_some() && (req.is_none() || req == lim)
        })
    });
    if guaranteed { "Guaranteed" } else { "Burstable" }
}

pub fn pod(obj: &mut Value) {
    if !obj.get("spec").is_some_and(Value::is_object) {
        obj["spec"] = json!({});
    }
    let spec = &mut obj["spec"];
    default(spec, "restartPolicy", "Always".into());
    default(spec, "terminationGracePeriodSeconds", 30.into());
    default(spec, "dnsPolicy", "ClusterFirst".into());
    default(spec, "schedulerName", "default-scheduler".into());
    default(spec, "securityContext", json!({}));
    default(spec, "enableServiceLinks", true.into());
    default(spec, "priority", 0.into());
    default(spec, "preemptionPolicy", "PreemptLowerPriority".into());
    default(spec, "serviceAccountName", "default".into());
    for f in ["containers", "initContainers"] {
        if let Some(cs) = spec.get_mut(f).and_then(Value::as_array_mut) {
            for c in cs {
                default_container(c);
            }
        }
    }
    // DefaultTolerationSeconds admission.
    let tolerations = spec.get("tolerations").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut t = tolerations.clone();
    for key in ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"] {
        if !tolerations.iter().any(|x| x.get("key").and_then(Value::as_str) == Some(key)) {
            t.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
        }
    }
    spec["tolerations"] = Value::Array(t);
    // The pod strategy's PrepareForCreate: the status is the server's.
    let qos = qos_class(spec);
    obj["status"] = json!({"phase": "Pending", "qosClass": qos});
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_defaults() {
        let mut p = json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "image": "busybox"},
            {"name": "b", "image": "registry:5000/busybox:1.36", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
        ]}});
        pod(&mut p);
        assert_eq!(p["spec"]["restartPolicy"], "Always");
        assert_eq!(p["spec"]["terminationGracePeriodSeconds"], 30);
        assert_eq!(p["spec"]["containers"][0]["imagePullPolicy"], "Always");
        assert_eq!(p["spec"]["containers"][1]["imagePullPolicy"], "IfNotPresent");
        assert_eq!(p["spec"]["containers"][1]["resources"]["requests"]["memory"], "1Gi");
        assert_eq!(p["status"]["phase"], "Pending");
        assert_eq!(p["status"]["qosClass"], "Burstable");
        assert_eq!(p["spec"]["tolerations"].as_array().unwrap().len(), 2);
        let mut g = json!({"spec": {"containers": [{"name": "a", "image": "x:1", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}});
        pod(&mut g);
        assert_eq!(g["status"]["qosClass"], "Guaranteed");
        let mut b = json!({"spec": {"restartPolicy": "Never", "containers": [{"name": "a", "image": "x@sha256:00"}]}});
        pod(&mut b);
        assert_eq!(b["status"]["qosClass"], "BestEffort");
        assert_eq!(b["spec"]["restartPolicy"], "Never");
        assert_eq!(b["spec"]["containers"][0]["imagePullPolicy"], "IfNotPresent");
    }
}
