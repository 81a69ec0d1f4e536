//! The fixture the controllers' tests share: a fake API server with the
//! storage controllers running and a fake CSI driver added.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::fake_csi::{Call, FakeCsi};
use crate::apiserver::{
    FakeApiServer, Options,
    resources::{CSINODES, EVENTS, NODES, PODS, PVCS, ResourceType, STORAGE_CLASSES},
    storage::{StorageOptions, admission},
    store::DeleteOptions,
};

pub const DRIVER: &str = "fake.csi.swiftlet.dev";
const WAIT: Duration = Duration::from_secs(10);

pub struct Fixture {
    pub server: FakeApiServer,
    pub csi: FakeCsi,
}

impl Fixture {
    pub fn new() -> Fixture {
        let server = FakeApiServer::start(Options::default()).unwrap();
        let csi = FakeCsi::start(DRIVER);
        server.add_csi_controller(DRIVER, &csi.socket);
        server.start_storage_controllers(StorageOptions { resync: Duration::from_millis(50) });
        Fixture { server, csi }
    }

    /// Creates as a POST does (the storage admission included).
    pub fn create(&self, rt: &ResourceType, ns: &str, mut obj: Value) -> Value {
        admission::on_create(self.server.store(), rt, &mut obj).unwrap();
        self.server.store().create(rt, ns, obj).unwrap()
    }

    pub fn get(&self, rt: &ResourceType, ns: &str, name: &str) -> Option<Value> {
        self.server.get(rt, ns, name)
    }

    pub fn wait<T>(&self, what: &str, mut f: impl FnMut(&Fixture) -> Option<T>) -> T {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(v) = f(self) {
                return v;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The object once `pointer` holds `want`.
    pub fn wait_field(&self, rt: &ResourceType, ns: &str, name: &str, pointer: &str, want: &str) -> Value {
        self.wait(&format!("{}/{name} {pointer} = {want}", rt.plural), |f| {
            f.get(rt, ns, name).filter(|o| o.pointer(pointer).and_then(Value::as_str) == Some(want))
        })
    }

    pub fn wait_gone(&self, rt: &ResourceType, ns: &str, name: &str) {
        self.wait(&format!("{}/{name} to go", rt.plural), |f| f.get(rt, ns, name).is_none().then_some(()));
    }

    pub fn events(&self, object: &str, reason: &str) -> Vec<Value> {
        self.server
            .list(&EVENTS, None)
            .into_iter()
            .filter(|e| e["involvedObject"]["name"] == object && e["reason"] == reason)
            .collect()
    }

    pub fn wait_event(&self, object: &str, reason: &str) -> Value {
        self.wait(&format!("event {reason} on {object}"), |f| f.events(object, reason).into_iter().next())
    }

    pub fn calls(&self, pick: impl Fn(&Call) -> bool) -> Vec<Call> {
        self.csi.calls().into_iter().filter(|c| pick(c)).collect()
    }

    pub fn class(&self, name: &str, extra: Value) -> Value {
        let mut sc = json!({"metadata": {"name": name}, "provisioner": DRIVER});
        for (k, v) in extra.as_object().into_iter().flatten() {
            sc[k] = v.clone();
        }
        self.create(&STORAGE_CLASSES, "", sc)
    }

    pub fn claim(&self, name: &str, class: Option<&str>, size: &str, extra: Value) -> Value {
        let mut pvc = json!({"metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}});
        if let Some(c) = class {
            pvc["spec"]["storageClassName"] = c.into();
        }
        for (k, v) in extra.as_object().into_iter().flatten() {
            pvc["spec"][k] = v.clone();
        }
        self.create(&PVCS, "default", pvc)
    }

    pub fn node(&self, name: &str, labels: Value) {
        self.create(&NODES, "", json!({"metadata": {"name": name, "labels": labels}, "status": {}}));
    }

    pub fn csinode(&self, node: &str, node_id: &str, keys: &[&str]) {
        self.create(
            &CSINODES,
            "",
            json!({"metadata": {"name": node}, "spec": {"drivers": [{"name": DRIVER, "nodeID": node_id, "topologyKeys": keys}]}}),
        );
    }

    pub fn pod(&self, name: &str, node: &str, volumes: Value) -> Value {
        self.server
            .store()
            .create(
                &PODS,
                "default",
                json!({"metadata": {"name": name},
                   "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}], "volumes": volumes},
                   "status": {"phase": "Running"}}),
            )
            .unwrap()
    }

    pub fn delete(&self, rt: &ResourceType, ns: &str, name: &str) {
        let opts = DeleteOptions { grace_period_seconds: Some(0), ..Default::default() };
        self.server.store().delete(rt, ns, name, &opts).unwrap();
    }

    /// Writes the object back after `edit`, as another client would.
    pub fn edit(&self, rt: &ResourceType, ns: &str, name: &str, edit: impl Fn(&mut Value)) {
        let mut obj = self.get(rt, ns, name).unwrap();
        edit(&mut obj);
        self.server.store().update(rt, ns, name, obj, |_, _| {}).unwrap();
    }
}

pub fn static_pv(name: &str, size: &str, class: &str, modes: &[&str], extra: Value) -> Value {
    let mut pv = json!({"metadata": {"name": name}, "spec": {
        "capacity": {"storage": size}, "accessModes": modes, "storageClassName": class,
        "hostPath": {"path": format!("/srv/{name}")}}});
    for (k, v) in extra.as_object().into_iter().flatten() {
        pv[if k == "labels" { "metadata" } else { "spec" }][k] = v.clone();
    }
    pv
}
