//! Pod volumes on the real containerd, through the whole agent: every
//! volume type seen from inside a container (content, mode, read-only,
//! tmpfs), subPath and subPathExpr, HostToContainer propagation, a
//! configMap update reaching the volume (but not a subPath of it), a
//! hostPath type mismatch, and local storage limits evicting pods. Checks
//! run inside the containers through CRI exec.

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::{
    ByteString,
    api::core::v1::{ConfigMap, PodStatus, Secret},
};
use swiftlet::volumes::{MemoryObjects, mount};
use swiftlet_tests::agent::TestAgent;

const BUSYBOX: &str = "swiftlet.local/busybox:1.35";
const T: Duration = Duration::from_secs(60);

fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.namespace = Some("default".into());
    cm.metadata.name = Some(name.into());
    cm.data = Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
    cm
}

fn running(s: &PodStatus) -> bool {
    s.container_statuses
        .as_ref()
        .is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| c.state.as_ref().is_some_and(|st| st.running.is_some())))
}

/// Waits until `check` holds for the output of `script` in the container.
fn wait_exec(a: &TestAgent, pod: &str, c: &str, script: &str, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + T;
    loop {
        let (code, out, err) = a.exec(pod, c, script);
        if code == 0 && check(&out) {
            return out;
        }
        assert!(Instant::now() < deadline, "{what}: `{script}` gave {code}: {out:?} {err:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `<fstype> <options>` of the mount at `path` inside the container.
fn mount_of(a: &TestAgent, pod: &str, c: &str, path: &str) -> String {
    let (code, out, err) = a.exec(pod, c, &format!("awk '$2 == \"{path}\" {{ print $3, $4 }}' /proc/mounts | tail -1"));
    assert_eq!(code, 0, "{err}");
    assert!(!out.trim().is_empty(), "{path} is not a mount point in {pod}/{c}");
    out.trim().to_owned()
}

fn sh(a: &TestAgent, pod: &str, c: &str, script: &str) -> String {
    let (code, out, err) = a.exec(pod, c, script);
    assert_eq!(code, 0, "`{script}` in {pod}/{c}: {out} {err}");
    out.trim().to_owned()
}

fn mounts_under(dir: &Path) -> Vec<std::path::PathBuf> {
    mount::mounts_under(&mount::mount_table().unwrap(), dir)
}

#[test]
fn every_volume_type_is_seen_in_the_container_and_config_maps_update() {
    let objects = Arc::new(MemoryObjects::new());
    objects.put_config_map(config_map("settings", &[("a", "1"), ("b", "two")]));
    objects.put_config_map(config_map("kube-root-ca.crt", &[("ca.crt", "-----BEGIN CERTIFICATE-----")]));
    let mut secret = Secret::default();
    secret.metadata.namespace = Some("default".into());
    secret.metadata.name = Some("creds".into());
    secret.data = Some([("password".to_string(), ByteString(b"hunter2".to_vec()))].into());
    objects.put_secret(secret);

    let a = TestAgent::start_with_objects("", &["--signal-source=cgroupfs"], objects.clone());
    let host = a.root().join("host-data");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("hello"), "from the host").unwrap();
    // Under the agent's root dir, which it made a shared mount: what the
    // test mounts there later reaches HostToContainer mounts.
    let prop = a.root_dir().join("propagated");
    std::fs::create_dir_all(&prop).unwrap();
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: vols
  labels: {{app: vols, tier: test}}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {BUSYBOX}
    command: ["sleep", "3600"]
    env:
    - name: POD_NAME
      valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}
    - name: MODE
      valueFrom: {{configMapKeyRef: {{name: settings, key: b}}}}
    envFrom:
    - secretRef: {{name: creds}}
      prefix: S_
    resources:
      limits: {{memory: 64Mi}}
    volumeMounts:
    - {{name: host, mountPath: /host}}
    - {{name: host, mountPath: /host-ro, readOnly: true}}
    - {{name: scratch, mountPath: /scratch}}
    - {{name: ram, mountPath: /ram}}
    - {{name: cfg, mountPath: /cfg}}
    - {{name: cfg-items, mountPath: /cfg-items}}
    - {{name: secret, mountPath: /secret}}
    - {{name: info, mountPath: /info}}
    - {{name: api, mountPath: /var/run/secrets/kubernetes.io/serviceaccount}}
    - {{name: cfg, mountPath: /etc/app.conf, subPath: a}}
    - {{name: scratch, mountPath: /mine, subPathExpr: "pods/$(POD_NAME)"}}
    - {{name: prop, mountPath: /prop, mountPropagation: HostToContainer}}
    - {{name: prop, mountPath: /prop-private}}
  volumes:
  - name: host
    hostPath: {{path: {host}, type: Directory}}
  - name: scratch
    emptyDir: {{}}
  - name: ram
    emptyDir: {{medium: Memory, sizeLimit: 8Mi}}
  - name: cfg
    configMap: {{name: settings}}
  - name: cfg-items
    configMap:
      name: settings
      defaultMode: 416  # 0640 (this YAML parser reads YAML 1.2: no bare octal)
      items: [{{key: a, path: dir/first, mode: 256}}]
  - name: secret
    secret: {{secretName: creds, defaultMode: 384}}
  - name: info
    downwardAPI:
      items:
      - {{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}
      - {{path: mem, resourceFieldRef: {{containerName: c, resource: limits.memory, divisor: 1Mi}}}}
  - name: api
    projected:
      sources:
      - serviceAccountToken: {{path: token, expirationSeconds: 3607}}
      - configMap: {{name: kube-root-ca.crt, items: [{{key: ca.crt, path: ca.crt}}]}}
  - name: prop
    hostPath: {{path: {prop}}}
"#,
        host = host.display(),
        prop = prop.display(),
    );
    let name = a.add_manifest("vols.yaml", &manifest);
    a.wait_status(&name, T, "Running", running);
    let pod = a.pod(&name).unwrap();
    let uid = pod.metadata.uid.clone().unwrap();
    let pod_dir = a.root_dir().join("pods").join(&uid);

    // hostPath: both ways, and read-only where asked.
    assert_eq!(sh(&a, &name, "c", "cat /host/hello"), "from the host");
    sh(&a, &name, "c", "echo from the pod > /host/reply");
    assert_eq!(std::fs::read_to_string(host.join("reply")).unwrap(), "from the pod\n");
    assert!(mount_of(&a, &name, "c", "/host-ro").split(' ').nth(1).unwrap().starts_with("ro"));
    let (code, _, _) = a.exec(&name, "c", "touch /host-ro/x");
    assert_ne!(code, 0, "a readOnly hostPath mount is read-only");
    assert!(mount_of(&a, &name, "c", "/host").split(' ').nth(1).unwrap().starts_with("rw"));

    // emptyDir on disk, kubelet's layout and mode; memory-backed on a sized tmpfs.
    sh(&a, &name, "c", "echo scratch > /scratch/f");
    let scratch = pod_dir.join("volumes/kubernetes.io~empty-dir/scratch");
    assert_eq!(std::fs::read_to_string(scratch.join("f")).unwrap(), "scratch\n");
    assert_eq!(sh(&a, &name, "c", "stat -c %a /scratch"), "777");
    let ram = mount_of(&a, &name, "c", "/ram");
    assert!(ram.starts_with("tmpfs ") && ram.contains("size=8192k"), "{ram}");

    // configMap: keys as files through the ..data links; items with modes;
    // read-only whatever the mount says.
    assert_eq!(sh(&a, &name, "c", "cat /cfg/a /cfg/b"), "1two");
    assert_eq!(sh(&a, &name, "c", "readlink /cfg/a"), "..data/a");
    assert_eq!(sh(&a, &name, "c", "cat /cfg-items/dir/first"), "1");
    assert_eq!(sh(&a, &name, "c", "stat -L -c %a /cfg-items/dir/first"), "400");
    assert_eq!(sh(&a, &name, "c", "ls /cfg-items"), "dir");
    assert!(mount_of(&a, &name, "c", "/cfg").split(' ').nth(1).unwrap().starts_with("ro"));
    assert_ne!(a.exec(&name, "c", "echo x > /cfg/new").0, 0);

    // secret: on tmpfs, with its mode; and the env from it and the configMap.
    assert_eq!(sh(&a, &name, "c", "cat /secret/password"), "hunter2");
    assert_eq!(sh(&a, &name, "c", "stat -L -c %a /secret/password"), "600");
    assert!(mount_of(&a, &name, "c", "/secret").starts_with("tmpfs "));
    assert_eq!(sh(&a, &name, "c", "echo $MODE $S_password"), "two hunter2");

    // downwardAPI and the projected service account token + CA.
    let labels = sh(&a, &name, "c", "cat /info/labels");
    assert!(labels.contains("app=\"vols\"") && labels.contains("tier=\"test\""), "{labels}");
    assert_eq!(sh(&a, &name, "c", "cat /info/mem"), "64");
    assert_eq!(sh(&a, &name, "c", "cat /var/run/secrets/kubernetes.io/serviceaccount/token"), "default:default:1");
    assert_eq!(
        sh(&a, &name, "c", "cat /var/run/secrets/kubernetes.io/serviceaccount/ca.crt"),
        "-----BEGIN CERTIFICATE-----"
    );
    assert!(mount_of(&a, &name, "c", "/var/run/secrets/kubernetes.io/serviceaccount").starts_with("tmpfs "));
    let req = &objects.token_requests()[0];
    assert_eq!((req.pod_uid.as_str(), req.expiration_seconds), (uid.as_str(), 3607));

    // subPath of a configMap key; subPathExpr from the environment.
    assert_eq!(sh(&a, &name, "c", "cat /etc/app.conf"), "1");
    sh(&a, &name, "c", "echo mine > /mine/x");
    assert_eq!(std::fs::read_to_string(scratch.join("pods").join(&name).join("x")).unwrap(), "mine\n");
    assert!(pod_dir.join("volume-subpaths/cfg/c/9").exists(), "the kubelet's subPath layout");

    // HostToContainer: a mount made on the node after the start shows up;
    // with no propagation it does not.
    let late = prop.join("late");
    std::fs::create_dir_all(&late).unwrap();
    mount::mount_tmpfs(&late, Some(1 << 20), 0o755).unwrap();
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = mount::unmount(&self.0);
        }
    }
    let _late = Unmount(late.clone());
    std::fs::write(late.join("news"), "propagated").unwrap();
    wait_exec(&a, &name, "c", "cat /prop/late/news", "HostToContainer propagation", |o| o == "propagated");
    let (_, private, _) = a.exec(&name, "c", "cat /prop-private/late/news 2>/dev/null; true");
    assert_eq!(private, "", "no propagation without HostToContainer");

    // A configMap update reaches the volume (not the subPath mount).
    objects.put_config_map(config_map("settings", &[("a", "updated"), ("c", "new")]));
    wait_exec(&a, &name, "c", "cat /cfg/a", "the configMap update", |o| o == "updated");
    assert_eq!(sh(&a, &name, "c", "cat /cfg/c"), "new");
    assert_ne!(a.exec(&name, "c", "cat /cfg/b").0, 0, "a key that went away is gone");
    assert_eq!(sh(&a, &name, "c", "cat /etc/app.conf"), "1", "a subPath keeps what it had");

    // The pod goes: nothing stays mounted, the pod's directory is removed,
    // the hostPath stays.
    a.remove_manifest("vols.yaml");
    a.wait_gone(&name, T);
    drop(_late);
    let deadline = Instant::now() + T;
    while pod_dir.exists() || !mounts_under(&pod_dir).is_empty() {
        assert!(Instant::now() < deadline, "left: {:?}", mounts_under(&pod_dir));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(host.join("hello").exists());
}

#[test]
fn host_path_type_mismatch_and_missing_config_map_are_events_and_waiting_reasons() {
    let a = TestAgent::start("", &["--signal-source=cgroupfs"]);
    let file = a.root().join("not-yet");
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: typed\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [\"sleep\", \"3600\"]\n    volumeMounts:\n    - {{name: f, mountPath: /f}}\n  volumes:\n  - name: f\n    hostPath: {{path: {}, type: File}}\n",
        file.display()
    );
    let name = a.add_manifest("typed.yaml", &manifest);
    let s = a.wait_status(&name, T, "waiting on the volume", |s| {
        s.container_statuses.as_ref().is_some_and(|cs| {
            cs[0].state.as_ref().and_then(|st| st.waiting.as_ref()).is_some_and(|w| {
                w.reason.as_deref() == Some("ContainerCreating")
                    && w.message.as_deref().unwrap_or("").contains("hostPath type check failed")
            })
        })
    });
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    let want = format!(
        "MountVolume.SetUp failed for volume \"f\" : hostPath type check failed: {} is not a file",
        file.display()
    );
    let failed = a.events.with_reason("FailedMount");
    assert!(failed.iter().any(|e| e.object == name && e.message == want), "{failed:?}");
    let uid = a.pod(&name).unwrap().metadata.uid.unwrap();
    assert!(a.runtime_state(&uid).0.is_empty(), "no sandbox before the volumes are ready");
    // The retries pick the file up once it exists.
    std::fs::write(&file, "now a file").unwrap();
    a.wait_status(&name, T, "Running once the file exists", running);
    assert_eq!(sh(&a, &name, "c", "cat /f"), "now a file");

    // Standalone: no API server, a configMap volume fails in the kubelet's words.
    let cm = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: cm\nspec:\n  hostNetwork: true\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [\"sleep\", \"3600\"]\n    volumeMounts:\n    - {{name: cfg, mountPath: /cfg}}\n    - {{name: opt, mountPath: /opt}}\n  volumes:\n  - name: cfg\n    configMap: {{name: app-config}}\n  - name: opt\n    configMap: {{name: absent, optional: true}}\n"
    );
    let cm_name = a.add_manifest("cm.yaml", &cm);
    let deadline = Instant::now() + T;
    let want = "MountVolume.SetUp failed for volume \"cfg\" : configmap \"app-config\" not found";
    while !a.events.with_reason("FailedMount").iter().any(|e| e.object == cm_name && e.message == want) {
        assert!(Instant::now() < deadline, "{:?}", a.events.all());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_empty_dir_over_its_size_limit_gets_the_pod_evicted() {
    let a = TestAgent::start("", &["--signal-source=cgroupfs"]);
    let pod = |name: &str, volume: &str, resources: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: writer\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"sleep 2; dd if=/dev/zero of=/scratch/big bs=1M count=4; sleep 3600\"]\n{resources}    volumeMounts:\n    - {{name: scratch, mountPath: /scratch}}\n  volumes:\n  - name: scratch\n    emptyDir: {volume}\n"
        )
    };
    let sized = a.add_manifest("sized.yaml", &pod("sized", "{sizeLimit: 1Mi}", ""));
    let limited = a.add_manifest(
        "limited.yaml",
        &pod("limited", "{}", "    resources:\n      limits: {ephemeral-storage: 2Mi}\n"),
    );
    let within = a.add_manifest("within.yaml", &pod("within", "{sizeLimit: 64Mi}", ""));
    let s = a.wait_status(&sized, T, "Evicted", |s| s.reason.as_deref() == Some("Evicted"));
    assert_eq!(s.phase.as_deref(), Some("Failed"));
    assert_eq!(s.message.as_deref(), Some("Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". "));
    let s = a.wait_status(&limited, T, "Evicted", |s| s.reason.as_deref() == Some("Evicted"));
    assert_eq!(
        s.message.as_deref(),
        Some("Pod ephemeral local storage usage exceeds the total limit of containers 2Mi. ")
    );
    let evicted = a.events.with_reason("Evicted");
    assert!(evicted.iter().any(|e| e.object == sized), "{evicted:?}");
    // The evicted pod's emptyDir is freed; the pod within its limit runs on.
    let uid = a.pod(&sized).unwrap().metadata.uid.unwrap();
    let vol = a.root_dir().join("pods").join(&uid).join("volumes");
    let deadline = Instant::now() + T;
    while vol.exists() {
        assert!(Instant::now() < deadline, "the evicted pod's volumes stay");
        std::thread::sleep(Duration::from_millis(100));
    }
    let s = a.status(&within).unwrap();
    assert_eq!(s.phase.as_deref(), Some("Running"), "{s:?}");
    assert!(a.events.with_reason("Evicted").iter().all(|e| e.object != within));
}
