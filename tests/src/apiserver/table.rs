//! Server-side printing: the `meta.k8s.io/v1` Table kubectl asks for
//! (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), with the
//! columns and cell logic of the API server's printers for nodes, pods,
//! events, leases, namespaces, CSRs and the storage kinds (in
//! storage::printers), and Name/Created At for the rest.

use serde_json::{Value, json};

use super::resources::ResourceType;

pub(crate) struct Column {
    pub(crate) name: &'static str,
    pub(crate) ty: &'static str,
    pub(crate) format: &'static str,
    pub(crate) priority: i64,
}

pub(crate) const fn col(name: &'static str, ty: &'static str, priority: i64) -> Column {
    Column { name, ty, format: "", priority }
}

pub(crate) const NAME: Column = Column { name: "Name", ty: "string", format: "name", priority: 0 };

/// The API server's duration.HumanDuration.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        let s = secs % 60;
        return if s == 0 { format!("{minutes}m") } else { format!("{minutes}m{s}s") };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 { format!("{hours}h") } else { format!("{hours}h{m}m") };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 { format!("{}d", hours / 24) } else { format!("{}d{h}h", hours / 24) };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 { format!("{}y", hours / 24 / 365) } else { format!("{}y{dy}d", hours / 24 / 365) };
    }
    format!("{}y", hours / 24 / 365)
}

fn parse_time(s: &str) -> Option<i64> {
    s.parse::<k8s_openapi::jiff::Timestamp>().ok().map(|t| t.as_second())
}

fn now() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

/// "5m", "<unknown>" for a missing time.
pub(crate) fn age(obj: &Value, pointer: &str) -> String {
    match obj.pointer(pointer).and_then(Value::as_str).and_then(parse_time) {
        Some(t) => human_duration(now() - t),
        None => "<unknown>".into(),
    }
}

fn s<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn or_none(v: String) -> String {
    if v.is_empty() { "<none>".into() } else { v }
}

fn node_row(n: &Value) -> (Vec<Column>, Vec<Value>) {
    let conditions = n.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut status: Vec<String> = vec![];
    // The printer reports the Ready condition (and others only if True).
    for c in &conditions {
        let (t, st) = (s(c, "/type"), s(c, "/status"));
        if t == "Ready" {
            status.push(if st == "True" { "Ready".into() } else { "NotReady".into() });
        }
    }
    if status.is_empty() {
        status.push("Unknown".into());
    }
    if n.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        status.push("SchedulingDisabled".into());
    }
    let mut roles: Vec<String> = n
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|l| {
            l.iter()
                .filter_map(|(k, v)| {
                    if let Some(r) = k.strip_prefix("node-role.kubernetes.io/") {
                        Some(r.to_owned())
                    } else if k == "kubernetes.io/role" {
                        v.as_str().map(str::to_owned)
                    } else {
                        None
                    }
                })
                .filter(|r| !r.is_empty())
                .collect()
        })
        .unwrap_or_default();
    roles.sort();
    let address = |t: &str| {
        n.pointer("/status/addresses")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find(|x| s(x, "/type") == t))
            .map(|x| s(x, "/address").to_owned())
            .unwrap_or_else(|| "<none>".into())
    };
    let cols = vec![
        NAME,
        col("Status", "string", 0),
        col("Roles", "string", 0),
        col("Age", "string", 0),
        col("Version", "string", 0),
        col("Internal-IP", "string", 1),
        col("External-IP", "string", 1),
        col("OS-Image", "string", 1),
        col("Kernel-Version", "string", 1),
        col("Container-Runtime", "string", 1),
    ];
    let cells = vec![
        json!(s(n, "/metadata/name")),
        json!(status.join(",")),
        json!(if roles.is_empty() { "<none>".into() } else { roles.join(",") }),
        json!(age(n, "/metadata/creationTimestamp")),
        json!(s(n, "/status/nodeInfo/kubeletVersion")),
        json!(address("InternalIP")),
        json!(address("ExternalIP")),
        json!(or_none(s(n, "/status/nodeInfo/osImage").to_owned()).replace("<none>", "<unknown>")),
        json!(or_none(s(n, "/status/nodeInfo/kernelVersion").to_owned()).replace("<none>", "<unknown>")),
        json!(or_none(s(n, "/status/nodeInfo/containerRuntimeVersion").to_owned()).replace("<none>", "<unknown>")),
    ];
    (cols, cells)
}

/// printPod: READY, STATUS (reason, init progress, waiting/terminated
/// reasons, Terminating), RESTARTS.
fn pod_row(p: &Value) -> (Vec<Column>, Vec<Value>) {
    let empty = vec![];
    let spec_containers = p.pointer("/spec/containers").and_then(Value::as_array).unwrap_or(&empty);
    let init_count = p.pointer("/spec/initContainers").and_then(Value::as_array).map_or(0, Vec::len);
    let mut reason = s(p, "/status/reason").to_owned();
    if reason.is_empty() {
        reason = s(p, "/status/phase").to_owned();
    }
    let mut restarts = 0;
    let mut initializing = false;
    let init_statuses = p.pointer("/status/initContainerStatuses").and_then(Value::as_array).unwrap_or(&empty);
    for (i, c) in init_statuses.iter().enumerate() {
        restarts += c.get("restartCount").and_then(Value::as_i64).unwrap_or(0);
        let term = c.pointer("/state/terminated");
        let waiting = c.pointer("/state/waiting");
        if term.is_some_and(|t| t.get("exitCode").and_then(Value::as_i64) == Some(0)) {
            continue;
        }
        if let Some(t) = term {
            reason = if !s(t, "/reason").is_empty() {
                format!("Init:{}", s(t, "/reason"))
            } else if t.get("signal").and_then(Value::as_i64).unwrap_or(0) != 0 {
                format!("Init:Signal:{}", t["signal"])
            } else {
                format!("Init:ExitCode:{}", t.get("exitCode").and_then(Value::as_i64).unwrap_or(0))
            };
        } else if let Some(w) = waiting.filter(|w| !s(w, "/reason").is_empty() && s(w, "/reason") != "PodInitializing")
        {
            reason = format!("Init:{}", s(w, "/reason"));
        } else {
            reason = format!("Init:{i}/{init_count}");
        }
        initializing = true;
        break;
    }
    let statuses = p.pointer("/status/containerStatuses").and_then(Value::as_array).unwrap_or(&empty);
    let mut ready = 0;
    if !initializing {
        restarts = 0;
        let mut has_running = false;
        for c in statuses.iter().rev() {
            restarts += c.get("restartCount").and_then(Value::as_i64).unwrap_or(0);
            if let Some(w) = c.pointer("/state/waiting").filter(|w| !s(w, "/reason").is_empty()) {
                reason = s(w, "/reason").to_owned();
            } else if let Some(t) = c.pointer("/state/terminated") {
                reason = if !s(t, "/reason").is_empty() {
                    s(t, "/reason").to_owned()
                } else if t.get("signal").and_then(Value::as_i64).unwrap_or(0) != 0 {
                    format!("Signal:{}", t["signal"])
                } else {
                    format!("ExitCode:{}", t.get("exitCode").and_then(Value::as_i64).unwrap_or(0))
                };
            } else if c.get("ready").and_then(Value::as_bool) == Some(true) && c.pointer("/state/running").is_some() {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            let pod_ready = p
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|c| s(c, "/type") == "Ready"))
                .is_some_and(|c| s(c, "/status") == "True");
            reason = if pod_ready { "Running".into() } else { "NotReady".into() };
        }
    }
    if p.pointer("/metadata/deletionTimestamp").is_some() && s(p, "/status/reason") != "NodeLost" {
        reason = "Terminating".into();
    }
    let ips: Vec<String> = p
        .pointer("/status/podIPs")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|x| s(x, "/ip").to_owned()).collect())
        .filter(|v: &Vec<String>| !v.is_empty())
        .unwrap_or_else(
            || if s(p, "/status/podIP").is_empty() { vec![] } else { vec![s(p, "/status/podIP").to_owned()] },
        );
    let gates = p.pointer("/spec/readinessGates").and_then(Value::as_array).map_or(0, Vec::len);
    let cols = vec![
        NAME,
        col("Ready", "string", 0),
        col("Status", "string", 0),
        col("Restarts", "string", 0),
        col("Age", "string", 0),
        col("IP", "string", 1),
        col("Node", "string", 1),
        col("Nominated Node", "string", 1),
        col("Readiness Gates", "string", 1),
    ];
    let cells = vec![
        json!(s(p, "/metadata/name")),
        json!(format!("{ready}/{}", spec_containers.len())),
        json!(reason),
        json!(restarts.to_string()),
        json!(age(p, "/metadata/creationTimestamp")),
        json!(ips.first().cloned().unwrap_or_else(|| "<none>".into())),
        json!(or_none(s(p, "/spec/nodeName").to_owned())),
        json!(or_none(s(p, "/status/nominatedNodeName").to_owned())),
        json!(if gates == 0 { "<none>".to_owned() } else { format!("0/{gates}") }),
    ];
    (cols, cells)
}

fn event_row(e: &Value) -> (Vec<Column>, Vec<Value>) {
    let last = [s(e, "/lastTimestamp"), s(e, "/eventTime"), s(e, "/metadata/creationTimestamp")]
        .into_iter()
        .find(|t| !t.is_empty())
        .and_then(parse_time);
    let first = [s(e, "/firstTimestamp"), s(e, "/eventTime"), s(e, "/metadata/creationTimestamp")]
        .into_iter()
        .find(|t| !t.is_empty())
        .and_then(parse_time);
    let fmt = |t: Option<i64>| t.map_or_else(|| "<unknown>".to_owned(), |t| human_duration(now() - t));
    let object = format!("{}/{}", s(e, "/involvedObject/kind").to_lowercase(), s(e, "/involvedObject/name"));
    let source = [s(e, "/source/component"), s(e, "/source/host")]
        .into_iter()
        .filter(|x| !x.is_empty())
        .collect::<Vec<_>>()
        .join(", ");
    let cols = vec![
        col("Last Seen", "string", 0),
        col("Type", "string", 0),
        col("Reason", "string", 0),
        col("Object", "string", 0),
        col("Subobject", "string", 1),
        col("Source", "string", 1),
        col("Message", "string", 0),
        col("First Seen", "string", 1),
        col("Count", "string", 1),
        col("Name", "string", 1),
    ];
    let cells = vec![
        json!(fmt(last)),
        json!(s(e, "/type")),
        json!(s(e, "/reason")),
        json!(object),
        json!(s(e, "/involvedObject/fieldPath")),
        json!(source),
        json!(s(e, "/message").trim()),
        json!(fmt(first)),
        json!(e.get("count").and_then(Value::as_i64).unwrap_or(1).to_string()),
        json!(s(e, "/metadata/name")),
    ];
    (cols, cells)
}

fn lease_row(l: &Value) -> (Vec<Column>, Vec<Value>) {
    (
        vec![NAME, col("Holder", "string", 0), col("Age", "string", 0)],
        vec![
            json!(s(l, "/metadata/name")),
            json!(s(l, "/spec/holderIdentity")),
            json!(age(l, "/metadata/creationTimestamp")),
        ],
    )
}

fn namespace_row(n: &Value) -> (Vec<Column>, Vec<Value>) {
    (
        vec![NAME, col("Status", "string", 0), col("Age", "string", 0)],
        vec![json!(s(n, "/metadata/name")), json!(s(n, "/status/phase")), json!(age(n, "/metadata/creationTimestamp"))],
    )
}

fn csr_row(c: &Value) -> (Vec<Column>, Vec<Value>) {
    let conditions: Vec<String> = c
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|x| s(x, "/type").to_owned()).collect())
        .unwrap_or_default();
    let mut condition = if conditions.is_empty() { "Pending".to_owned() } else { conditions.join(",") };
    if c.pointer("/status/certificate").and_then(Value::as_str).is_some_and(|x| !x.is_empty()) {
        condition.push_str(",Issued");
    }
    (
        vec![
            NAME,
            col("Age", "string", 0),
            col("SignerName", "string", 0),
            col("Requestor", "string", 0),
            col("RequestedDuration", "string", 0),
            col("Condition", "string", 0),
        ],
        vec![
            json!(s(c, "/metadata/name")),
            json!(age(c, "/metadata/creationTimestamp")),
            json!(s(c, "/spec/signerName")),
            json!(s(c, "/spec/username")),
            json!(c.pointer("/spec/expirationSeconds").and_then(Value::as_i64).map_or("<none>".into(), human_duration)),
            json!(condition),
        ],
    )
}

fn default_row(o: &Value) -> (Vec<Column>, Vec<Value>) {
    (
        vec![NAME, Column { name: "Created At", ty: "date", format: "", priority: 0 }],
        vec![json!(s(o, "/metadata/name")), json!(s(o, "/metadata/creationTimestamp"))],
    )
}

fn row_for(rt: &ResourceType, obj: &Value) -> (Vec<Column>, Vec<Value>) {
    match rt.kind {
        "Node" => node_row(obj),
        "Pod" => pod_row(obj),
        "Event" => event_row(obj),
        "Lease" => lease_row(obj),
        "Namespace" => namespace_row(obj),
        "CertificateSigningRequest" => csr_row(obj),
        "PersistentVolume" => super::storage::printers::pv_row(obj),
        "PersistentVolumeClaim" => super::storage::printers::pvc_row(obj),
        "StorageClass" => super::storage::printers::storage_class_row(obj),
        "CSIDriver" => super::storage::printers::csi_driver_row(obj),
        "CSINode" => super::storage::printers::csi_node_row(obj),
        "VolumeAttachment" => super::storage::printers::volume_attachment_row(obj),
        _ => default_row(obj),
    }
}

/// How much of each object a row carries (`includeObject`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(s: Option<&str>) -> IncludeObject {
        match s {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        }
    }
}

pub fn table(rt: &ResourceType, objects: &[Value], resource_version: Option<String>, include: IncludeObject) -> Value {
    let (cols, _) = row_for(rt, &json!({}));
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let (_, cells) = row_for(rt, o);
            let object = match include {
                IncludeObject::None => Value::Null,
                IncludeObject::Object => o.clone(),
                IncludeObject::Metadata => json!({
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": o.get("metadata").cloned().unwrap_or(json!({})),
                }),
            };
            let mut row = json!({"cells": cells});
            if !object.is_null() {
                row["object"] = object;
            }
            row
        })
        .collect();
    let mut meta = json!({});
    if let Some(rv) = resource_version {
        meta["resourceVersion"] = rv.into();
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": cols.iter().map(|c| json!({
            "name": c.name,
            "type": c.ty,
            "format": c.format,
            "description": "",
            "priority": c.priority,
        })).collect::<Vec<_>>(),
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::{NODES, PODS};

    #[test]
    fn human_durations() {
        for (secs, want) in [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (150, "2m30s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 120, "3h2m"),
            (47 * 3600, "47h"),
            (50 * 3600, "2d2h"),
            (10 * 86400, "10d"),
            (3 * 365 * 86400, "3y"),
            (3 * 365 * 86400 + 86400, "3y1d"),
            (9 * 365 * 86400, "9y"),
        ] {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }

    #[test]
    fn node_status_column() {
        let node = json!({"metadata": {"name": "n1", "labels": {"node-role.kubernetes.io/worker": ""}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "MemoryPressure", "status": "True"}, {"type": "Ready", "status": "True"}],
                       "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}], "nodeInfo": {"kubeletVersion": "v1"}}});
        let t = table(&NODES, &[node], Some("5".into()), IncludeObject::Metadata);
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[1], "Ready,SchedulingDisabled");
        assert_eq!(cells[2], "worker");
        assert_eq!(cells[4], "v1");
        assert_eq!(cells[5], "10.0.0.1");
        assert_eq!(cells[6], "<none>");
        assert_eq!(t["rows"][0]["object"]["metadata"]["name"], "n1");
    }

    #[test]
    fn pod_status_column() {
        let cases = [
            (json!({"status": {"phase": "Pending"}}), "Pending", "0/1"),
            (
                json!({"status": {"phase": "Running", "containerStatuses": [{"name": "c", "ready": true, "restartCount": 2, "state": {"running": {}}}]}}),
                "Running",
                "1/1",
            ),
            (
                json!({"status": {"phase": "Running", "containerStatuses": [{"name": "c", "ready": false, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}),
                "CrashLoopBackOff",
                "0/1",
            ),
            (
                json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"}, "status": {"phase": "Running"}}),
                "Terminating",
                "0/1",
            ),
            (json!({"status": {"phase": "Failed", "reason": "Evicted"}}), "Evicted", "0/1"),
            (
                json!({"spec": {"initContainers": [{"name": "i"}]}, "status": {"phase": "Pending", "initContainerStatuses": [{"name": "i", "state": {"running": {}}}]}}),
                "Init:0/1",
                "0/1",
            ),
        ];
        for (mut pod, status, ready) in cases {
            pod["metadata"]["name"] = "p".into();
            if pod.pointer("/spec/containers").is_none() {
                if pod.get("spec").is_none() {
                    pod["spec"] = json!({});
                }
                pod["spec"]["containers"] = json!([{"name": "c"}]);
            }
            let t = table(&PODS, &[pod], None, IncludeObject::None);
            assert_eq!(t["rows"][0]["cells"][2], status);
            assert_eq!(t["rows"][0]["cells"][1], ready);
        }
    }
}
