//! The object store: JSON objects by (resource, namespace, name), one
//! global resourceVersion counter, a bounded history of changes for watches
//! to resume from, and a broadcast of every change.
//!
//! A watch from a resourceVersion older than the history (after
//! [`Store::compact`] or once the history overflowed) gets 410 Gone, as
//! from etcd after compaction.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::resources::{NAMESPACES, PODS, ResourceType};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeType {
    Added,
    Modified,
    Deleted,
}

impl ChangeType {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeType::Added => "ADDED",
            ChangeType::Modified => "MODIFIED",
            ChangeType::Deleted => "DELETED",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Change {
    pub rv: u64,
    /// The resource's store key (`pods`, `leases.coordination.k8s.io`).
    pub resource: String,
    pub namespace: String,
    pub kind: ChangeType,
    /// The object before the change (Modified, Deleted).
    pub old: Option<Value>,
    /// The object after the change (for Deleted: as it was deleted, with
    /// the deletion's resourceVersion).
    pub object: Value,
}

/// An API error, answered as a `Status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { code, reason, message: message.into() }
    }

    pub fn not_found(rt: &ResourceType, name: &str) -> ApiError {
        let what = if rt.group.is_empty() { rt.plural.to_owned() } else { format!("{}.{}", rt.plural, rt.group) };
        ApiError::new(404, "NotFound", format!("{what} \"{name}\" not found"))
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    pub fn conflict(rt: &ResourceType, name: &str, why: &str) -> ApiError {
        let what = if rt.group.is_empty() { rt.plural.to_owned() } else { format!("{}.{}", rt.plural, rt.group) };
        ApiError::new(409, "Conflict", format!("Operation cannot be fulfilled on {what} \"{name}\": {why}"))
    }

    pub fn gone(message: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", message)
    }

    pub fn status(&self) -> Value {
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        })
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

type Key = (String, String, String);

/// Where a watch starts: the changes to send first, the resourceVersion
/// they bring the watcher to, and the live changes after that.
pub type WatchStart = (Vec<Arc<Change>>, u64, broadcast::Receiver<Arc<Change>>);

struct Inner {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Arc<Change>>,
    /// Watches may resume from a resourceVersion ≥ this one.
    oldest_resumable: u64,
    history_limit: usize,
}

pub struct Store {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Arc<Change>>,
    uid_counter: AtomicU64,
}

/// RFC 3339 with seconds, as metav1.Time.
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

pub fn rfc3339_after(secs: i64) -> String {
    let t = k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(secs);
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata").and_then(|m| m.get(field)).and_then(Value::as_str)
}

fn set_meta(obj: &mut Value, field: &str, v: Value) {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"][field] = v;
}

impl Store {
    pub fn new(history_limit: usize) -> Store {
        let (tx, _) = broadcast::channel(4096);
        let store = Store {
            inner: Mutex::new(Inner {
                rv: 1000,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                oldest_resumable: 1000,
                history_limit,
            }),
            tx,
            uid_counter: AtomicU64::new(0),
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            store
                .create(&NAMESPACES, "", json!({"metadata": {"name": ns}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}))
                .expect("fresh store");
        }
        store
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn uid(&self) -> String {
        let n = self.uid_counter.fetch_add(1, Ordering::Relaxed);
        let t =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos() as u64;
        let a = t ^ (u64::from(std::process::id()) << 32);
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            (a >> 32) as u32,
            (a >> 16) as u16,
            (a & 0xfff) as u16,
            (n >> 48) as u16 & 0xfff,
            n & 0xffff_ffff_ffff
        )
    }

    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.tx.subscribe()
    }

    /// Forgets the history: watches from any older resourceVersion get 410.
    pub fn compact(&self) {
        let mut i = self.lock();
        i.history.clear();
        i.oldest_resumable = i.rv;
    }

    fn commit(&self, i: &mut Inner, change: Change) {
        let change = Arc::new(change);
        i.history.push_back(change.clone());
        while i.history.len() > i.history_limit {
            if let Some(c) = i.history.pop_front() {
                i.oldest_resumable = c.rv;
            }
        }
        let _ = self.tx.send(change);
    }

    pub fn get(&self, rt: &ResourceType, ns: &str, name: &str) -> ApiResult<Value> {
        self.lock()
            .objects
            .get(&(rt.key(), ns.to_owned(), name.to_owned()))
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt, name))
    }

    /// Every object of `rt` (in `ns` when given), sorted by namespace and
    /// name, and the resourceVersion of the snapshot.
    pub fn list(&self, rt: &ResourceType, ns: Option<&str>) -> (Vec<Value>, u64) {
        let i = self.lock();
        let key = rt.key();
        let items = i
            .objects
            .iter()
            .filter(|((r, n, _), _)| *r == key && ns.is_none_or(|ns| ns == n))
            .map(|(_, v)| v.clone())
            .collect();
        (items, i.rv)
    }

    /// A consistent snapshot plus the changes after `from` (None: the
    /// current objects as ADDED events), and a receiver for later changes.
    pub fn watch_from(&self, rt: &ResourceType, from: Option<u64>) -> ApiResult<WatchStart> {
        let i = self.lock();
        let rx = self.tx.subscribe();
        let key = rt.key();
        match from {
            None => {
                let changes = i
                    .objects
                    .iter()
                    .filter(|((r, _, _), _)| *r == key)
                    .map(|((_, ns, _), v)| {
                        Arc::new(Change {
                            rv: i.rv,
                            resource: key.clone(),
                            namespace: ns.clone(),
                            kind: ChangeType::Added,
                            old: None,
                            object: v.clone(),
                        })
                    })
                    .collect();
                Ok((changes, i.rv, rx))
            }
            Some(rv) if rv < i.oldest_resumable => {
                Err(ApiError::gone(format!("too old resource version: {rv} ({})", i.oldest_resumable)))
            }
            Some(rv) => {
                let changes = i.history.iter().filter(|c| c.rv > rv && c.resource == key).cloned().collect();
                Ok((changes, i.rv.max(rv), rx))
            }
        }
    }

    pub fn create(&self, rt: &ResourceType, ns: &str, mut obj: Value) -> ApiResult<Value> {
        if !obj.is_object() {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        }
        let mut i = self.lock();
        let mut name = meta_str(&obj, "name").unwrap_or("").to_owned();
        if name.is_empty() {
            let Some(prefix) = meta_str(&obj, "generateName").filter(|g| !g.is_empty()) else {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    format!(
                        "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                        rt.kind
                    ),
                ));
            };
            let n = self.uid_counter.fetch_add(1, Ordering::Relaxed);
            name = format!("{prefix}{:05x}", (i.rv * 31 + n) & 0xfffff);
        }
        if rt.namespaced {
            if ns.is_empty() {
                return Err(ApiError::bad_request("the namespace of the object is required"));
            }
            if let Some(given) = meta_str(&obj, "namespace").filter(|g| !g.is_empty() && *g != ns) {
                return Err(ApiError::bad_request(format!(
                    "the namespace of the provided object ({given}) does not match the namespace sent on the request ({ns})"
                )));
            }
            if !i.objects.contains_key(&(NAMESPACES.key(), String::new(), ns.to_owned())) {
                return Err(ApiError::not_found(&NAMESPACES, ns));
            }
        }
        let key = (rt.key(), if rt.namespaced { ns.to_owned() } else { String::new() }, name.clone());
        if i.objects.contains_key(&key) {
            let what = if rt.group.is_empty() { rt.plural.to_owned() } else { format!("{}.{}", rt.plural, rt.group) };
            return Err(ApiError::new(409, "AlreadyExists", format!("{what} \"{name}\" already exists")));
        }
        i.rv += 1;
        let rv = i.rv;
        obj["apiVersion"] = rt.api_version().into();
        obj["kind"] = rt.kind.into();
        set_meta(&mut obj, "name", name.clone().into());
        if rt.namespaced {
            set_meta(&mut obj, "namespace", ns.into());
        } else if let Some(m) = obj["metadata"].as_object_mut() {
            m.remove("namespace");
        }
        set_meta(&mut obj, "uid", self.uid().into());
        set_meta(&mut obj, "resourceVersion", rv.to_string().into());
        set_meta(&mut obj, "creationTimestamp", now_rfc3339().into());
        set_meta(&mut obj, "generation", 1.into());
        if let Some(m) = obj["metadata"].as_object_mut() {
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
            m.remove("managedFields");
        }
        i.objects.insert(key.clone(), obj.clone());
        self.commit(
            &mut i,
            Change { rv, resource: key.0, namespace: key.1, kind: ChangeType::Added, old: None, object: obj.clone() },
        );
        Ok(obj)
    }

    /// Replaces an object. `precondition_rv`: the resourceVersion the caller
    /// based its change on (409 when stale). `merge`: decides the stored
    /// object from (old, new) — e.g. keep the status on a main-resource
    /// update, keep the rest on a status update.
    pub fn update(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        mut obj: Value,
        merge: impl FnOnce(&Value, &mut Value),
    ) -> ApiResult<Value> {
        let mut i = self.lock();
        let key = (rt.key(), if rt.namespaced { ns.to_owned() } else { String::new() }, name.to_owned());
        let Some(old) = i.objects.get(&key).cloned() else {
            return Err(ApiError::not_found(rt, name));
        };
        if let Some(want) = meta_str(&obj, "resourceVersion").filter(|s| !s.is_empty())
            && Some(want) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::conflict(
                rt,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        if let Some(uid) = meta_str(&obj, "uid").filter(|s| !s.is_empty())
            && Some(uid) != meta_str(&old, "uid")
        {
            return Err(ApiError::conflict(
                rt,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&old, "uid").unwrap_or("")
                ),
            ));
        }
        if meta_str(&obj, "name").is_some_and(|n| n != name) {
            return Err(ApiError::bad_request(format!(
                "the name of the object does not match the name on the URL ({name})"
            )));
        }
        merge(&old, &mut obj);
        // Server-owned fields are kept.
        obj["apiVersion"] = rt.api_version().into();
        obj["kind"] = rt.kind.into();
        for f in ["name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"] {
            match old["metadata"].get(f) {
                Some(v) => set_meta(&mut obj, f, v.clone()),
                None => {
                    if let Some(m) = obj["metadata"].as_object_mut() {
                        m.remove(f);
                    }
                }
            }
        }
        let spec_changed = old.get("spec") != obj.get("spec");
        let generation = old["metadata"]["generation"].as_i64().unwrap_or(1) + i64::from(spec_changed);
        set_meta(&mut obj, "generation", generation.into());
        // Nothing changed: no new resourceVersion, no event (as the API server).
        let mut probe = obj.clone();
        set_meta(&mut probe, "resourceVersion", old["metadata"]["resourceVersion"].clone());
        if probe == old {
            return Ok(old);
        }
        i.rv += 1;
        let rv = i.rv;
        set_meta(&mut obj, "resourceVersion", rv.to_string().into());
        // An object being deleted whose finalizers are gone goes away now
        // (pods wait for their grace period to be cut to zero).
        let finalizers_left = obj["metadata"]["finalizers"].as_array().is_some_and(|f| !f.is_empty());
        let deleting = obj["metadata"].get("deletionTimestamp").is_some();
        let pod_waiting =
            rt.key() == PODS.key() && obj["metadata"]["deletionGracePeriodSeconds"].as_i64().unwrap_or(0) > 0;
        if deleting && !finalizers_left && !pod_waiting {
            i.objects.remove(&key);
            self.commit(
                &mut i,
                Change {
                    rv,
                    resource: key.0,
                    namespace: key.1,
                    kind: ChangeType::Deleted,
                    old: Some(old),
                    object: obj.clone(),
                },
            );
            return Ok(obj);
        }
        i.objects.insert(key.clone(), obj.clone());
        self.commit(
            &mut i,
            Change {
                rv,
                resource: key.0,
                namespace: key.1,
                kind: ChangeType::Modified,
                old: Some(old),
                object: obj.clone(),
            },
        );
        Ok(obj)
    }

    /// Deletes an object. Returns the object and whether it is gone (false:
    /// its deletion is pending, a graceful pod deletion or finalizers).
    pub fn delete(&self, rt: &ResourceType, ns: &str, name: &str, options: &DeleteOptions) -> ApiResult<(Value, bool)> {
        let mut i = self.lock();
        let key = (rt.key(), if rt.namespaced { ns.to_owned() } else { String::new() }, name.to_owned());
        let Some(old) = i.objects.get(&key).cloned() else {
            return Err(ApiError::not_found(rt, name));
        };
        if let Some(uid) = &options.precondition_uid
            && Some(uid.as_str()) != meta_str(&old, "uid")
        {
            return Err(ApiError::conflict(
                rt,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&old, "uid").unwrap_or("")
                ),
            ));
        }
        if let Some(want) = &options.precondition_rv
            && Some(want.as_str()) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::conflict(
                rt,
                name,
                "the ResourceVersion in the precondition does not match the ResourceVersion in record. The object might have been modified",
            ));
        }
        let grace = if rt.key() == PODS.key() { pod_grace(&old, options.grace_period_seconds) } else { 0 };
        let finalizers = old["metadata"]["finalizers"].as_array().is_some_and(|f| !f.is_empty());
        if grace > 0 || finalizers {
            let current = old["metadata"]["deletionGracePeriodSeconds"].as_i64();
            // A second delete may only shorten the grace period.
            if old["metadata"].get("deletionTimestamp").is_some() && current.is_some_and(|c| c <= grace) {
                return Ok((old, false));
            }
            let mut obj = old.clone();
            set_meta(&mut obj, "deletionTimestamp", rfc3339_after(grace).into());
            set_meta(&mut obj, "deletionGracePeriodSeconds", grace.into());
            i.rv += 1;
            let rv = i.rv;
            set_meta(&mut obj, "resourceVersion", rv.to_string().into());
            let generation = old["metadata"]["generation"].as_i64().unwrap_or(1) + 1;
            set_meta(&mut obj, "generation", generation.into());
            i.objects.insert(key.clone(), obj.clone());
            self.commit(
                &mut i,
                Change {
                    rv,
                    resource: key.0,
                    namespace: key.1,
                    kind: ChangeType::Modified,
                    old: Some(old),
                    object: obj.clone(),
                },
            );
            return Ok((obj, false));
        }
        i.rv += 1;
        let rv = i.rv;
        let mut obj = old.clone();
        set_meta(&mut obj, "resourceVersion", rv.to_string().into());
        i.objects.remove(&key);
        self.commit(
            &mut i,
            Change {
                rv,
                resource: key.0.clone(),
                namespace: key.1.clone(),
                kind: ChangeType::Deleted,
                old: Some(old),
                object: obj.clone(),
            },
        );
        // A namespace takes its objects with it.
        if rt.key() == NAMESPACES.key() {
            let inside: Vec<Key> = i.objects.keys().filter(|(_, n, _)| n == name).cloned().collect();
            for k in inside {
                if let Some(o) = i.objects.remove(&k) {
                    i.rv += 1;
                    let rv = i.rv;
                    let mut gone = o.clone();
                    set_meta(&mut gone, "resourceVersion", rv.to_string().into());
                    self.commit(
                        &mut i,
                        Change {
                            rv,
                            resource: k.0,
                            namespace: k.1,
                            kind: ChangeType::Deleted,
                            old: Some(o),
                            object: gone,
                        },
                    );
                }
            }
        }
        Ok((obj, true))
    }
}

/// DeleteOptions as far as the fake honours them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
}

impl DeleteOptions {
    pub fn from_json(v: &Value) -> DeleteOptions {
        DeleteOptions {
            grace_period_seconds: v.get("gracePeriodSeconds").and_then(Value::as_i64),
            precondition_uid: v.pointer("/preconditions/uid").and_then(Value::as_str).map(str::to_owned),
            precondition_rv: v.pointer("/preconditions/resourceVersion").and_then(Value::as_str).map(str::to_owned),
        }
    }
}

/// The pod's grace period for this deletion, as the pod strategy's
/// CheckGracefulDelete: the request's, else the pod's
/// terminationGracePeriodSeconds (30); zero for pods not bound to a node
/// or already terminal.
pub fn pod_grace(pod: &Value, requested: Option<i64>) -> i64 {
    let unbound = pod.pointer("/spec/nodeName").and_then(Value::as_str).is_none_or(str::is_empty);
    let phase = pod.pointer("/status/phase").and_then(Value::as_str).unwrap_or("");
    if unbound || phase == "Failed" || phase == "Succeeded" {
        return 0;
    }
    requested
        .or_else(|| pod.pointer("/spec/terminationGracePeriodSeconds").and_then(Value::as_i64))
        .unwrap_or(30)
        .max(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::{LEASES, NODES};

    #[test]
    fn create_update_conflict_delete() {
        let s = Store::new(100);
        let n = s.create(&NODES, "", json!({"metadata": {"name": "n1"}, "status": {}})).unwrap();
        let rv = n["metadata"]["resourceVersion"].as_str().unwrap().to_owned();
        assert_eq!(n["kind"], "Node");
        assert!(s.create(&NODES, "", json!({"metadata": {"name": "n1"}})).unwrap_err().reason == "AlreadyExists");
        let mut upd = n.clone();
        upd["metadata"]["labels"] = json!({"a": "b"});
        let u = s.update(&NODES, "", "n1", upd.clone(), |_, _| {}).unwrap();
        assert_ne!(u["metadata"]["resourceVersion"].as_str().unwrap(), rv);
        // Stale resourceVersion.
        assert_eq!(s.update(&NODES, "", "n1", upd, |_, _| {}).unwrap_err().code, 409);
        // Unchanged update: same resourceVersion.
        let same = s.update(&NODES, "", "n1", u.clone(), |_, _| {}).unwrap();
        assert_eq!(same["metadata"]["resourceVersion"], u["metadata"]["resourceVersion"]);
        let (gone, removed) = s.delete(&NODES, "", "n1", &DeleteOptions::default()).unwrap();
        assert!(removed);
        assert_eq!(gone["metadata"]["name"], "n1");
        assert_eq!(s.get(&NODES, "", "n1").unwrap_err().code, 404);
    }

    #[test]
    fn namespaced_objects_need_their_namespace() {
        let s = Store::new(100);
        assert_eq!(s.create(&LEASES, "nope", json!({"metadata": {"name": "l"}})).unwrap_err().code, 404);
        s.create(&LEASES, "kube-node-lease", json!({"metadata": {"name": "l"}})).unwrap();
        assert_eq!(s.list(&LEASES, Some("kube-node-lease")).0.len(), 1);
        assert_eq!(s.list(&LEASES, Some("default")).0.len(), 0);
    }

    #[test]
    fn graceful_pod_deletion() {
        let s = Store::new(100);
        let pod = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 20}, "status": {"phase": "Running"}});
        let p = s.create(&PODS, "default", pod).unwrap();
        let (d, removed) = s.delete(&PODS, "default", "p", &DeleteOptions::default()).unwrap();
        assert!(!removed);
        assert_eq!(d["metadata"]["deletionGracePeriodSeconds"], 20);
        assert!(d["metadata"]["deletionTimestamp"].is_string());
        // Wrong uid precondition.
        let wrong =
            DeleteOptions { grace_period_seconds: Some(0), precondition_uid: Some("x".into()), ..Default::default() };
        assert_eq!(s.delete(&PODS, "default", "p", &wrong).unwrap_err().code, 409);
        let zero = DeleteOptions {
            grace_period_seconds: Some(0),
            precondition_uid: p["metadata"]["uid"].as_str().map(str::to_owned),
            ..Default::default()
        };
        assert!(s.delete(&PODS, "default", "p", &zero).unwrap().1);
        // Unbound pods go at once.
        s.create(&PODS, "default", json!({"metadata": {"name": "q"}, "spec": {}})).unwrap();
        assert!(s.delete(&PODS, "default", "q", &DeleteOptions::default()).unwrap().1);
    }

    #[test]
    fn watch_resumes_or_is_gone() {
        let s = Store::new(3);
        let start = s.current_rv();
        for n in 0..2 {
            s.create(&NODES, "", json!({"metadata": {"name": format!("n{n}")}})).unwrap();
        }
        let (changes, _, _) = s.watch_from(&NODES, Some(start)).unwrap();
        assert_eq!(changes.len(), 2);
        for n in 2..6 {
            s.create(&NODES, "", json!({"metadata": {"name": format!("n{n}")}})).unwrap();
        }
        assert_eq!(s.watch_from(&NODES, Some(start)).unwrap_err().code, 410);
        let (all, _, _) = s.watch_from(&NODES, None).unwrap();
        assert_eq!(all.len(), 6);
        let now = s.current_rv();
        s.compact();
        assert!(s.watch_from(&NODES, Some(now)).is_ok());
        assert_eq!(s.watch_from(&NODES, Some(now - 1)).unwrap_err().code, 410);
    }
}
