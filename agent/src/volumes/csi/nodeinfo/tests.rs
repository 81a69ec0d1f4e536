use std::collections::BTreeMap;

use super::{memory::MemoryNodeObjects, *};

fn topo(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn manager(objects: &Arc<MemoryNodeObjects>) -> NodeInfoManager {
    NodeInfoManager::new(objects.clone(), "node-1")
}

fn annotation(objects: &MemoryNodeObjects) -> Option<String> {
    objects.node("node-1").metadata.annotations.unwrap_or_default().get(ANNOTATION_NODE_ID).cloned()
}

fn drivers(objects: &MemoryNodeObjects) -> Vec<CSINodeDriver> {
    objects.csinode("node-1").expect("the CSINode").spec.drivers
}

#[tokio::test]
async fn install_creates_the_owned_csinode_and_sets_the_annotation_and_topology_labels() {
    let objects = Arc::new(MemoryNodeObjects::with_node("node-1", "uid-1", &[("kubernetes.io/os", "linux")]));
    let m = manager(&objects);
    let t = topo(&[("topology.b.example/zone", "z1"), ("topology.b.example/rack", "r1")]);
    m.install_driver("b.example", "n-b", 16, &t).await.unwrap();

    let c = objects.csinode("node-1").unwrap();
    assert_eq!(c.metadata.name.as_deref(), Some("node-1"));
    let owner = &c.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.api_version.as_str(), owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("v1", "Node", "node-1", "uid-1")
    );
    assert_eq!(
        c.spec.drivers,
        [CSINodeDriver {
            name: "b.example".into(),
            node_id: "n-b".into(),
            topology_keys: Some(vec!["topology.b.example/rack".into(), "topology.b.example/zone".into()]),
            allocatable: Some(VolumeNodeResources { count: Some(16) }),
        }]
    );
    assert_eq!(annotation(&objects).as_deref(), Some(r#"{"b.example":"n-b"}"#));
    let labels = objects.node("node-1").metadata.labels.unwrap();
    assert_eq!(labels.get("topology.b.example/zone").map(String::as_str), Some("z1"));
    assert_eq!(labels.get("topology.b.example/rack").map(String::as_str), Some("r1"));
    assert_eq!(labels.get("kubernetes.io/os").map(String::as_str), Some("linux"));

    // A second driver, without topology or limit.
    m.install_driver("a.example", "n-a", 0, &BTreeMap::new()).await.unwrap();
    assert_eq!(annotation(&objects).as_deref(), Some(r#"{"a.example":"n-a","b.example":"n-b"}"#));
    let d = drivers(&objects);
    assert_eq!(d.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["b.example", "a.example"]);
    assert_eq!((d[1].topology_keys.clone(), d[1].allocatable.clone()), (None, None));
}

#[tokio::test]
async fn reinstall_replaces_the_entry_once_and_an_identical_one_writes_nothing() {
    let objects = Arc::new(MemoryNodeObjects::with_node("node-1", "uid-1", &[]));
    let m = manager(&objects);
    m.install_driver("b.example", "n-b", 4, &topo(&[("zone", "z1")])).await.unwrap();
    m.install_driver("a.example", "n-a", 0, &BTreeMap::new()).await.unwrap();
    m.install_driver("b.example", "n-b2", 8, &topo(&[("zone", "z1")])).await.unwrap();
    let d = drivers(&objects);
    assert_eq!(
        d.iter().map(|d| (d.name.as_str(), d.node_id.as_str())).collect::<Vec<_>>(),
        [("a.example", "n-a"), ("b.example", "n-b2")]
    );
    assert_eq!(d[1].allocatable, Some(VolumeNodeResources { count: Some(8) }));
    assert_eq!(annotation(&objects).as_deref(), Some(r#"{"a.example":"n-a","b.example":"n-b2"}"#));
    let writes = objects.writes();
    m.install_driver("b.example", "n-b2", 8, &topo(&[("zone", "z1")])).await.unwrap();
    assert_eq!(objects.writes(), writes);
}

#[tokio::test]
async fn uninstall_removes_the_entry_and_the_node_id_and_leaves_the_labels() {
    let objects = Arc::new(MemoryNodeObjects::with_node("node-1", "uid-1", &[]));
    let m = manager(&objects);
    m.install_driver("b.example", "n-b", 0, &topo(&[("zone", "z1")])).await.unwrap();
    m.install_driver("a.example", "n-a", 0, &BTreeMap::new()).await.unwrap();
    m.uninstall_driver("b.example").await.unwrap();
    assert_eq!(drivers(&objects).iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["a.example"]);
    assert_eq!(annotation(&objects).as_deref(), Some(r#"{"a.example":"n-a"}"#));
    assert_eq!(objects.node("node-1").metadata.labels.unwrap().get("zone").map(String::as_str), Some("z1"));
    // The last one takes the annotation with it.
    m.uninstall_driver("a.example").await.unwrap();
    assert!(drivers(&objects).is_empty());
    assert_eq!(annotation(&objects), None);
    // Nothing to remove: nothing written.
    let writes = objects.writes();
    m.uninstall_driver("gone.example").await.unwrap();
    assert_eq!(objects.writes(), writes);
}

#[tokio::test]
async fn collisions_bad_annotations_and_empty_node_ids_are_refused_and_conflicts_retried() {
    let objects = Arc::new(MemoryNodeObjects::with_node("node-1", "uid-1", &[("zone", "z9")]));
    let m = manager(&objects);
    let err = m.install_driver("b.example", "n-b", 0, &topo(&[("zone", "z1")])).await.unwrap_err();
    assert_eq!(
        err,
        r#"error updating Node object with CSI driver node info: detected topology value collision: driver reported "zone":"z1" but existing label is "zone":"z9""#
    );
    assert!(objects.csinode("node-1").is_none());
    assert_eq!(objects.writes(), 0);

    let err = m.install_driver("b.example", "", 0, &BTreeMap::new()).await.unwrap_err();
    assert_eq!(err, "error adding CSI driver node info: driverNodeID must not be empty");

    // Lost races are tried again.
    objects.inject_conflicts(2);
    m.install_driver("b.example", "n-b", 0, &BTreeMap::new()).await.unwrap();
    assert_eq!(drivers(&objects).len(), 1);
    objects.inject_conflicts(100);
    let err = m.install_driver("c.example", "n-c", 0, &BTreeMap::new()).await.unwrap_err();
    assert!(
        err.starts_with(
            "error updating Node object with CSI driver node info: gave up after 4 tries: [conflict: injected"
        ),
        "{err}"
    );
    objects.inject_conflicts(0);

    objects.set_annotation("node-1", ANNOTATION_NODE_ID, "{not json");
    let err = m.install_driver("b.example", "n-b", 0, &BTreeMap::new()).await.unwrap_err();
    assert!(
        err.contains(r#"failed to parse node's "csi.volume.kubernetes.io/nodeid" annotation value ("{not json")"#),
        "{err}"
    );
}

#[tokio::test]
async fn initialize_creates_an_empty_csinode_once() {
    let objects = Arc::new(MemoryNodeObjects::with_node("node-1", "uid-1", &[]));
    let m = manager(&objects);
    objects.set_failing(Some("connection refused"));
    let err = m.initialize().await.unwrap_err();
    assert!(err.contains("connection refused"), "{err}");
    objects.set_failing(None);
    assert!(m.initialize_until_done(&CancellationToken::new()).await);
    let c = objects.csinode("node-1").unwrap();
    assert!(c.spec.drivers.is_empty());
    assert_eq!(c.metadata.owner_references.unwrap()[0].uid, "uid-1");
    let writes = objects.writes();
    m.initialize().await.unwrap();
    assert_eq!(objects.writes(), writes);
    // A node that does not exist: the error names it.
    let other = NodeInfoManager::new(objects.clone(), "node-2");
    assert!(other.initialize().await.unwrap_err().contains(r#"Node "node-2" not found"#));
    // Shut down while failing: gives up.
    let stop = CancellationToken::new();
    stop.cancel();
    assert!(!other.initialize_until_done(&stop).await);
}

#[test]
fn entries_are_compared_by_name_id_key_set_and_limit() {
    let e = driver_entry("d", "n", 3, &topo(&[("b", "1"), ("a", "2")]));
    assert_eq!(e.topology_keys, Some(vec!["a".to_string(), "b".to_string()]));
    let mut shuffled = e.clone();
    shuffled.topology_keys = Some(vec!["b".into(), "a".into()]);
    assert_eq!(with_driver(std::slice::from_ref(&shuffled), &e), None);
    // Two entries of one name are folded into one.
    let twice = with_driver(&[e.clone(), e.clone()], &e).unwrap();
    assert_eq!(twice, std::slice::from_ref(&e));
    assert_eq!(driver_entry("d", "n", i64::MAX, &BTreeMap::new()).allocatable.unwrap().count, Some(i32::MAX));
    assert_eq!(without_driver(std::slice::from_ref(&e), "other"), None);
    assert_eq!(without_driver(&[e], "d"), Some(vec![]));
}
