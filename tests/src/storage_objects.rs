//! What the storage tests on this host (`tests/tests/storage.rs`) and in
//! the node VM (`tests/tests/node_e2e/storage.rs`) both build: the API
//! objects of the test CSI driver's volumes and of `local` PVs, a pod
//! spec's volumes split into mounts and devices, a loop device the test
//! owns, and the mount table as paths.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::{Value, json};

use crate::csi::DEFAULT_NAME as DRIVER;

/// The test driver's CSIDriver object: attach required, pod info on
/// mount, fsGroup applied by the kubelet, persistent and inline volumes.
pub fn csi_driver() -> Value {
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": DRIVER},
           "spec": {"attachRequired": true, "podInfoOnMount": true, "fsGroupPolicy": "File",
                    "volumeLifecycleModes": ["Persistent", "Ephemeral"]}})
}

/// A class of the test driver's, provisioning on first use, expandable.
pub fn storage_class(name: &str, parameters: Value) -> Value {
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
           "provisioner": DRIVER, "reclaimPolicy": "Delete", "allowVolumeExpansion": true,
           "volumeBindingMode": "WaitForFirstConsumer", "parameters": parameters})
}

/// A ReadWriteOnce claim of `size` on `class`.
pub fn claim(name: &str, class: &str, size: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
           "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                    "resources": {"requests": {"storage": size}}}})
}

/// A pod volume naming a claim.
pub fn claim_volume(name: &str, claim: &str) -> Value {
    json!({"name": name, "persistentVolumeClaim": {"claimName": claim}})
}

/// A 4 MiB `local` PV at `path` (a directory, or a device with `block`)
/// on `node` only.
pub fn local_pv(name: &str, path: &str, block: bool, node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
           "spec": {"capacity": {"storage": "4Mi"}, "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "local", "persistentVolumeReclaimPolicy": "Retain",
                    "volumeMode": if block { "Block" } else { "Filesystem" },
                    "local": {"path": path},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}})
}

/// The claim bound to [`local_pv`] `pv` by name.
pub fn local_claim(name: &str, pv: &str, block: bool) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
           "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local", "volumeName": pv,
                    "volumeMode": if block { "Block" } else { "Filesystem" },
                    "resources": {"requests": {"storage": "4Mi"}}}})
}

/// A pod's volumes (a JSON array; an entry with `"block": true` is a raw
/// device) as (the spec's `volumes`, the container's `volumeMounts` at
/// /<name>, its `volumeDevices` at /dev/<name>).
pub fn volume_spec(volumes: &Value) -> (Vec<Value>, Vec<Value>, Vec<Value>) {
    let (mut spec, mut mounts, mut devices) = (vec![], vec![], vec![]);
    for v in volumes.as_array().into_iter().flatten() {
        let n = v["name"].as_str().unwrap_or_default();
        if v.get("block").is_some() {
            devices.push(json!({"name": n, "devicePath": format!("/dev/{n}")}));
        } else {
            mounts.push(json!({"name": n, "mountPath": format!("/{n}")}));
        }
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("block");
        }
        spec.push(v);
    }
    (spec, mounts, devices)
}

/// A 4 MiB loop device over a file of the test's, detached on drop.
pub struct LoopDevice(pub String);

impl LoopDevice {
    pub fn new(file: &Path) -> LoopDevice {
        std::fs::write(file, vec![0u8; 4 << 20]).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let out = Command::new("losetup").args(["--find", "--show"]).arg(file).output().expect("losetup");
        assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
        LoopDevice(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// Every mount point of this mount namespace, in mount order.
pub fn mount_points() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    text.lines().filter_map(|l| l.split(' ').nth(4)).map(|p| PathBuf::from(p.replace("\\040", " "))).collect()
}

pub fn assert_no_duplicate(mounts: &[PathBuf]) {
    let mut unique = mounts.to_vec();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), mounts.len(), "a path mounted twice: {mounts:?}");
}

/// The `volumeHandle` of a CSI PV.
pub fn csi_handle(pv: &Value) -> String {
    pv["spec"]["csi"]["volumeHandle"].as_str().expect("a CSI PV").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_volumes_are_devices_and_lose_their_marker() {
        let mut raw = claim_volume("raw", "c1");
        raw["block"] = json!(true);
        let (spec, mounts, devices) = volume_spec(&json!([claim_volume("data", "c0"), raw]));
        assert_eq!(spec, [claim_volume("data", "c0"), claim_volume("raw", "c1")]);
        assert_eq!(mounts, [json!({"name": "data", "mountPath": "/data"})]);
        assert_eq!(devices, [json!({"name": "raw", "devicePath": "/dev/raw"})]);
    }
}
