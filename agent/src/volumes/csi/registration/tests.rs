use std::path::PathBuf;

use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

use super::*;
use crate::volumes::csi::{
    api::{self, node_server::NodeServer},
    nodeinfo::{ANNOTATION_NODE_ID, memory::MemoryNodeObjects},
};

fn v(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn with_driver(name: &str, versions: &[&str]) -> CsiRegistration {
    let drivers = Arc::new(CsiDrivers::default());
    drivers.insert(DriverInfo {
        name: name.into(),
        endpoint: "/old.sock".into(),
        node_id: "n".into(),
        max_volumes: 0,
        topology: BTreeMap::new(),
        versions: v(versions),
    });
    CsiRegistration::new(drivers)
}

#[test]
fn versions_are_validated_as_the_kubelet_validates_them() {
    let h = CsiRegistration::new(Arc::new(CsiDrivers::default()));
    let ep = Path::new("/csi.sock");
    let prefix = "validation failed for CSI Driver d.example at endpoint /csi.sock: kubernetes.io/csi: ValidatePlugin for CSI driver \"d.example\" failed.";
    let table: &[(&[&str], Option<&str>)] = &[
        (&["1.0.0"], None),
        (&["v1.2.0", "0.3.0"], None),
        (&["1.5", "2.0.0"], None),
        (
            &["0.3.0"],
            Some(
                " None of the versions specified [\"0.3.0\"] are supported. err=highest supported version reported is 0.3.0, must be v1.x",
            ),
        ),
        (&[], Some(" Plugin returned an empty list for supported versions")),
        (
            &["2.0.0", "3.1.0"],
            Some(
                " None of the versions specified [\"2.0.0\" \"3.1.0\"] are supported. err=could not find a highest supported version from versions ([2.0.0 3.1.0]) reported: <nil>",
            ),
        ),
        (
            &["one"],
            Some(
                " None of the versions specified [\"one\"] are supported. err=could not find a highest supported version from versions ([one]) reported: could not parse \"one\" as version",
            ),
        ),
        (
            &["1"],
            Some(
                " None of the versions specified [\"1\"] are supported. err=could not find a highest supported version from versions ([1]) reported: illegal version string \"1\"",
            ),
        ),
    ];
    for (versions, want) in table {
        let got = h.validate("d.example", ep, &v(versions));
        match want {
            None => assert_eq!(got, Ok(()), "{versions:?}"),
            Some(tail) => assert_eq!(got, Err(format!("{prefix}{tail}")), "{versions:?}"),
        }
    }

    // A driver of that name already registered: only a higher version may
    // take its place.
    let h = with_driver("d.example", &["1.2.0"]);
    let taken = format!(
        "{prefix} Another driver with the same name is already registered with a higher supported version: \"1.2.0\""
    );
    assert_eq!(h.validate("d.example", ep, &v(&["1.1.0"])), Err(taken.clone()));
    assert_eq!(h.validate("d.example", ep, &v(&["1.2"])), Err(taken));
    assert_eq!(h.validate("d.example", ep, &v(&["1.3.0"])), Ok(()));
    assert_eq!(h.validate("other.example", ep, &v(&["1.0.0"])), Ok(()));
}

#[test]
fn versions_parse_and_compare_generically() {
    let p = |s: &str| CsiVersion::parse(s);
    assert_eq!(p("v1.2.3-rc.1").unwrap().to_string(), "1.2.3");
    assert_eq!(p(" 1.10").unwrap(), CsiVersion(vec![1, 10]));
    assert!(p("1.2").unwrap() == p("1.2.0").unwrap());
    assert!(p("1.10.0").unwrap() > p("1.9.9").unwrap());
    assert_eq!(p("1.02").unwrap_err(), "illegal zero-prefixed version component \"02\" in \"1.02\"");
    assert!(p("1.99999999999999999999999").unwrap_err().starts_with("illegal non-numeric version component"));
    assert_eq!(highest_supported_version(&v(&["1.0.0", "junk", "1.4.0", "1.2.0"])).unwrap().to_string(), "1.4.0");
}

/// A CSI driver's Node service answering NodeGetInfo.
struct FakeNode {
    info: api::NodeGetInfoResponse,
}

fn unimplemented<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("not in this test"))
}

#[tonic::async_trait]
impl api::node_server::Node for FakeNode {
    async fn node_stage_volume(
        &self,
        _: Request<api::NodeStageVolumeRequest>,
    ) -> Result<Response<api::NodeStageVolumeResponse>, Status> {
        unimplemented()
    }
    async fn node_unstage_volume(
        &self,
        _: Request<api::NodeUnstageVolumeRequest>,
    ) -> Result<Response<api::NodeUnstageVolumeResponse>, Status> {
        unimplemented()
    }
    async fn node_publish_volume(
        &self,
        _: Request<api::NodePublishVolumeRequest>,
    ) -> Result<Response<api::NodePublishVolumeResponse>, Status> {
        unimplemented()
    }
    async fn node_unpublish_volume(
        &self,
        _: Request<api::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<api::NodeUnpublishVolumeResponse>, Status> {
        unimplemented()
    }
    async fn node_get_volume_stats(
        &self,
        _: Request<api::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<api::NodeGetVolumeStatsResponse>, Status> {
        unimplemented()
    }
    async fn node_expand_volume(
        &self,
        _: Request<api::NodeExpandVolumeRequest>,
    ) -> Result<Response<api::NodeExpandVolumeResponse>, Status> {
        unimplemented()
    }
    async fn node_get_capabilities(
        &self,
        _: Request<api::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<api::NodeGetCapabilitiesResponse>, Status> {
        unimplemented()
    }
    async fn node_get_info(
        &self,
        _: Request<api::NodeGetInfoRequest>,
    ) -> Result<Response<api::NodeGetInfoResponse>, Status> {
        Ok(Response::new(self.info.clone()))
    }
}

/// Serves a driver on `<tmp>/csi.sock`; dropping the sender stops it.
fn serve_driver(tmp: &Path) -> (PathBuf, oneshot::Sender<()>) {
    let socket = tmp.join("csi.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let node = FakeNode {
        info: api::NodeGetInfoResponse {
            node_id: "node-1-id".into(),
            max_volumes_per_node: 5,
            accessible_topology: Some(api::Topology {
                segments: [("topology.d.example/zone".to_string(), "z1".to_string())].into(),
            }),
        },
    };
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(NodeServer::new(node))
            .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), async {
                let _ = rx.await;
            })
            .await;
    });
    (socket, tx)
}

#[tokio::test]
async fn standalone_registration_fills_csi_drivers_only() {
    let tmp = tempfile::tempdir().unwrap();
    let (socket, _stop) = serve_driver(tmp.path());
    let h = CsiRegistration::new(Arc::new(CsiDrivers::default()));
    h.set_standalone();
    h.register("d.example", &socket, &v(&["1.0.0"])).await.unwrap();
    let d = h.drivers().get("d.example").unwrap();
    assert_eq!((d.node_id.as_str(), d.max_volumes, d.endpoint.as_path()), ("node-1-id", 5, socket.as_path()));
    assert_eq!(d.topology.get("topology.d.example/zone").map(String::as_str), Some("z1"));
    assert_eq!(d.versions, ["1.0.0"]);
    h.deregister("d.example").await;
    assert!(h.drivers().get("d.example").is_none());

    // A driver that does not answer is not recorded.
    let err = h.register("gone.example", &tmp.path().join("nothing.sock"), &v(&["1.0.0"])).await.unwrap_err();
    assert!(err.contains("cannot dial CSI driver gone.example"), "{err}");
    assert!(h.drivers().get("gone.example").is_none());
}

#[tokio::test]
async fn registration_publishes_and_a_failed_publish_takes_the_driver_out() {
    let tmp = tempfile::tempdir().unwrap();
    let (socket, _stop) = serve_driver(tmp.path());
    let objects = Arc::new(MemoryNodeObjects::with_node("node-1", "uid-1", &[]));
    let h = Arc::new(CsiRegistration::new(Arc::new(CsiDrivers::default())));

    // Registered before the API client exists: it waits for it.
    let early = {
        let h = h.clone();
        let socket = socket.clone();
        tokio::spawn(async move { h.register("d.example", &socket, &v(&["1.0.0"])).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!early.is_finished());
    h.set_node_info(Arc::new(NodeInfoManager::new(objects.clone(), "node-1")));
    early.await.unwrap().unwrap();
    let c = objects.csinode("node-1").unwrap();
    assert_eq!(c.spec.drivers.len(), 1);
    assert_eq!(c.spec.drivers[0].node_id, "node-1-id");
    assert_eq!(c.spec.drivers[0].topology_keys, Some(vec!["topology.d.example/zone".to_string()]));
    assert_eq!(c.spec.drivers[0].allocatable.as_ref().and_then(|a| a.count), Some(5));
    let node = objects.node("node-1");
    assert_eq!(node.metadata.annotations.unwrap()[ANNOTATION_NODE_ID], r#"{"d.example":"node-1-id"}"#);
    assert_eq!(node.metadata.labels.unwrap()["topology.d.example/zone"], "z1");

    // Deregistered: gone from CsiDrivers, the CSINode and the annotation.
    h.deregister("d.example").await;
    assert!(h.drivers().get("d.example").is_none());
    assert!(objects.csinode("node-1").unwrap().spec.drivers.is_empty());
    assert!(!objects.node("node-1").metadata.annotations.unwrap().contains_key(ANNOTATION_NODE_ID));

    // The API server failing: the registration fails and leaves nothing.
    objects.set_failing(Some("the API server is down"));
    let err = h.register("d.example", &socket, &v(&["1.0.0"])).await.unwrap_err();
    assert!(err.contains("the API server is down"), "{err}");
    assert!(h.drivers().get("d.example").is_none());
}

#[tokio::test]
async fn without_an_api_client_in_time_the_registration_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let (socket, _stop) = serve_driver(tmp.path());
    let h = CsiRegistration::new(Arc::new(CsiDrivers::default())).with_publisher_wait(Duration::from_millis(50));
    let err = h.register("d.example", &socket, &v(&["1.0.0"])).await.unwrap_err();
    assert_eq!(err, "kubernetes.io/csi: the API server client is not available after 50ms");
    assert!(h.drivers().get("d.example").is_none());
}
