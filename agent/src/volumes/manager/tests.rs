//! The volume manager against a temporary directory and in-memory objects.

use std::{os::unix::fs::PermissionsExt, time::SystemTime};

use k8s_openapi::{
    api::core::v1::{
        ConfigMap, ConfigMapProjection, ConfigMapVolumeSource, Container as C, DownwardAPIVolumeFile,
        DownwardAPIVolumeSource, EmptyDirVolumeSource, HostPathVolumeSource, KeyToPath, ObjectFieldSelector,
        PersistentVolumeClaimVolumeSource, PodSpec, ProjectedVolumeSource, ResourceRequirements,
        ServiceAccountTokenProjection, Volume, VolumeMount, VolumeProjection,
    },
    apimachinery::pkg::api::resource::Quantity as Q,
};

use super::*;
use crate::{
    events::EventType,
    volumes::objects::{MemoryObjects, ObjectKey, ObjectKind},
};

#[derive(Default)]
struct Events(Mutex<Vec<(String, String)>>);

impl EventRecorder for Events {
    fn record(&self, _: &k8s_openapi::api::core::v1::ObjectReference, _: EventType, reason: &str, message: &str) {
        self.0.lock().push((reason.into(), message.into()));
    }
}

fn manager(dir: &Path, objects: Arc<dyn ObjectSource>) -> (Arc<VolumeManager>, Arc<Events>) {
    let events = Arc::new(Events::default());
    let cfg = VolumeConfig {
        pods_dir: dir.join("pods"),
        allocatable_memory: 1 << 30,
        downward: DownwardContext::default(),
        refresh_period: Duration::from_secs(60),
        sweep_period: Duration::from_secs(60),
        node_name: "node-a".into(),
        node_labels: Default::default(),
        stats_period: Duration::from_secs(60),
    };
    (Arc::new(VolumeManager::new(cfg, objects, events.clone())), events)
}

fn pod(volumes: Vec<Volume>) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some("web".into());
    p.metadata.namespace = Some("ns".into());
    p.metadata.uid = Some("uid-1".into());
    p.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
    p.spec = Some(PodSpec { volumes: Some(volumes), containers: vec![C::default()], ..Default::default() });
    p
}

fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.namespace = Some("ns".into());
    cm.metadata.name = Some(name.into());
    cm.data = Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
    cm
}

fn cm_volume(name: &str, cm: &str, optional: Option<bool>) -> Volume {
    Volume {
        name: name.into(),
        config_map: Some(ConfigMapVolumeSource { name: cm.into(), optional, ..Default::default() }),
        ..Default::default()
    }
}

#[test]
fn kinds_and_unsupported_sources() {
    assert_eq!(kind_of(&cm_volume("a", "b", None)), Ok(VolumeKind::ConfigMap));
    let pvc = Volume {
        name: "data".into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource { claim_name: "c".into(), read_only: None }),
        ..Default::default()
    };
    assert_eq!(kind_of(&pvc), Ok(VolumeKind::Claim));
    let nfs = Volume {
        name: "n".into(),
        nfs: Some(k8s_openapi::api::core::v1::NFSVolumeSource {
            server: "s".into(),
            path: "/".into(),
            read_only: None,
        }),
        ..Default::default()
    };
    assert_eq!(kind_of(&nfs).unwrap_err(), "volume type nfs is not supported by this node");
    let huge = Volume {
        name: "h".into(),
        empty_dir: Some(EmptyDirVolumeSource { medium: Some("HugePages".into()), ..Default::default() }),
        ..Default::default()
    };
    assert!(kind_of(&huge).unwrap_err().contains("HugePages"));
}

#[test]
fn memory_volume_sizes() {
    let mut p = pod(vec![]);
    assert_eq!(memory_volume_size(&p, None, 1000), 1000, "node allocatable");
    assert_eq!(memory_volume_size(&p, Some(300), 1000), 300, "a smaller sizeLimit");
    assert_eq!(memory_volume_size(&p, Some(3000), 1000), 1000, "a sizeLimit above what the pod can use");
    p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
        limits: Some([("memory".to_string(), Q("500".into()))].into()),
        ..Default::default()
    });
    assert_eq!(memory_volume_size(&p, None, 1000), 500, "the pod's memory limit");
    assert_eq!(memory_volume_size(&p, Some(200), 1000), 200);
}

#[test]
fn token_refresh_at_80_percent_or_a_day() {
    let now = SystemTime::now();
    let ttl = Duration::from_secs(1000);
    let t = Token { token: "t".into(), expires_at: now + ttl };
    assert!(!token_needs_refresh(&t, ttl, now));
    assert!(!token_needs_refresh(&t, ttl, now + Duration::from_secs(799)));
    assert!(token_needs_refresh(&t, ttl, now + Duration::from_secs(800)));
    let long = Duration::from_secs(48 * 3600);
    let t = Token { token: "t".into(), expires_at: now + long };
    assert!(!token_needs_refresh(&t, long, now + Duration::from_secs(23 * 3600)));
    assert!(token_needs_refresh(&t, long, now + Duration::from_secs(24 * 3600)));
}

#[tokio::test]
async fn config_maps_are_written_refreshed_and_reported() {
    let d = tempfile::tempdir().unwrap();
    let objects = Arc::new(MemoryObjects::new());
    let (vm, events) = manager(d.path(), objects.clone());
    let p = pod(vec![cm_volume("cfg", "settings", None), cm_volume("opt", "absent", Some(true))]);
    let e = vm.setup(&p).await.unwrap_err();
    assert_eq!(e.to_string(), "MountVolume.SetUp failed for volume \"cfg\" : configmap \"settings\" not found");
    let opt = d.path().join("pods/uid-1/volumes/kubernetes.io~configmap/opt");
    assert!(opt.join("..data").exists(), "an optional configMap that does not exist is an empty volume");

    objects.put_config_map(config_map("settings", &[("a", "1")]));
    vm.setup(&p).await.unwrap();
    let dir = d.path().join("pods/uid-1/volumes/kubernetes.io~configmap/cfg");
    assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "1");

    objects.put_config_map(config_map("settings", &[("a", "2"), ("b", "x")]));
    let key = ObjectKey { kind: ObjectKind::ConfigMap, namespace: "ns".into(), name: "settings".into() };
    vm.refresh(Some(&key)).await;
    assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "2");
    assert_eq!(fs::read_to_string(dir.join("b")).unwrap(), "x");

    // Deleted: the files stay, one event per distinct error.
    objects.delete_config_map("ns", "settings");
    vm.refresh(None).await;
    vm.refresh(None).await;
    assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "2");
    let failed: Vec<_> = events.0.lock().iter().filter(|(r, _)| r == FAILED_MOUNT).cloned().collect();
    assert_eq!(failed.len(), 1, "{failed:?}");

    vm.teardown("uid-1").await.unwrap();
    assert!(!d.path().join("pods/uid-1/volumes").exists());
}

#[tokio::test]
async fn downward_api_follows_label_changes_and_host_paths_are_checked() {
    let d = tempfile::tempdir().unwrap();
    let (vm, _) = manager(d.path(), Arc::new(MemoryObjects::new()));
    let host = d.path().join("host/data");
    let downward = Volume {
        name: "info".into(),
        downward_api: Some(DownwardAPIVolumeSource {
            items: Some(vec![DownwardAPIVolumeFile {
                path: "labels".into(),
                field_ref: Some(ObjectFieldSelector { field_path: "metadata.labels".into(), ..Default::default() }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let hp = |t: &str| Volume {
        name: "host".into(),
        host_path: Some(HostPathVolumeSource { path: host.to_string_lossy().into(), type_: Some(t.into()) }),
        ..Default::default()
    };
    let e = vm.setup(&pod(vec![downward.clone(), hp("Directory")])).await.unwrap_err();
    assert_eq!(e.volume, "host");
    assert!(e.message.ends_with("is not a directory"), "{e}");
    let mut p = pod(vec![downward, hp("DirectoryOrCreate")]);
    vm.setup(&p).await.unwrap();
    assert!(host.is_dir());
    let file = d.path().join("pods/uid-1/volumes/kubernetes.io~downward-api/info/labels");
    assert_eq!(fs::read_to_string(&file).unwrap(), "app=\"web\"");
    p.metadata.labels = Some([("app".to_string(), "web2".to_string())].into());
    vm.setup(&p).await.unwrap();
    assert_eq!(fs::read_to_string(&file).unwrap(), "app=\"web2\"");
    vm.teardown("uid-1").await.unwrap();
    assert!(host.is_dir(), "a hostPath is never removed");
}

#[tokio::test]
async fn mounts_for_a_container_without_sub_paths() {
    let d = tempfile::tempdir().unwrap();
    let (vm, _) = manager(d.path(), Arc::new(MemoryObjects::new()));
    let empty = Volume { name: "scratch".into(), empty_dir: Some(Default::default()), ..Default::default() };
    let p = pod(vec![empty]);
    let c = C {
        name: "app".into(),
        volume_mounts: Some(vec![VolumeMount {
            name: "scratch".into(),
            mount_path: "/s".into(),
            ..Default::default()
        }]),
        ..Default::default()
    };
    assert!(vm.container_mounts(&p, &c, &[]).await.is_err(), "not set up yet");
    vm.setup(&p).await.unwrap();
    let m = vm.container_mounts(&p, &c, &[]).await.unwrap();
    assert_eq!(m.len(), 1);
    assert!(m[0].host_path.ends_with("pods/uid-1/volumes/kubernetes.io~empty-dir/scratch"));
    assert!(!m[0].readonly);
    let dir = Path::new(&m[0].host_path);
    assert_eq!(fs::metadata(dir).unwrap().permissions().mode() & 0o777, 0o777);
    let usage = vm.usage_paths("uid-1").await;
    assert_eq!(usage.len(), 1);
    assert!(usage[0].kind.counts_as_ephemeral_storage());
}

#[tokio::test]
async fn projected_tokens_are_requested_once_and_refreshed() {
    // Projected volumes live on tmpfs, which needs root; the payload is
    // checked here without mounting.
    let d = tempfile::tempdir().unwrap();
    let objects = Arc::new(MemoryObjects::new());
    objects.put_config_map(config_map("kube-root-ca.crt", &[("ca.crt", "CERT")]));
    let (vm, _) = manager(d.path(), objects.clone());
    let v = Volume {
        name: "kube-api-access".into(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o644),
            sources: Some(vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token".into(),
                        expiration_seconds: Some(3607),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: "kube-root-ca.crt".into(),
                        items: Some(vec![KeyToPath {
                            key: "ca.crt".into(),
                            path: "ca.crt".into(),
                            ..Default::default()
                        }]),
                        optional: None,
                    }),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut st = PodState { pod: pod(vec![v.clone()]), volumes: BTreeMap::new(), tokens: HashMap::new() };
    let p1 = vm.payload(&mut st, &v).await.unwrap();
    assert_eq!(p1["ca.crt"].data, b"CERT");
    assert_eq!(String::from_utf8(p1["token"].data.clone()).unwrap(), "ns:default:1");
    let p2 = vm.payload(&mut st, &v).await.unwrap();
    assert_eq!(p1, p2, "a fresh token is reused");
    assert_eq!(objects.token_requests().len(), 1);
    assert_eq!(objects.token_requests()[0].pod_uid, "uid-1");
    // Near expiry it is requested again.
    for t in st.tokens.values_mut() {
        t.expires_at = SystemTime::now() + Duration::from_secs(60);
    }
    let p3 = vm.payload(&mut st, &v).await.unwrap();
    assert_eq!(String::from_utf8(p3["token"].data.clone()).unwrap(), "ns:default:2");
}
