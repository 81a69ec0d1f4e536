//! The fake API server against real clients: kube-rs (CRUD, the three
//! patch types, watches with bookmarks, 410 Gone and re-list through
//! kube-runtime's watcher, TokenReview/SubjectAccessReview), Debian's
//! kubectl (get, -o wide, describe, delete, with TLS and a client
//! certificate), a current kubectl (apply with its default validation,
//! through the fake's OpenAPI v3 and field validation), and the binary's
//! default authorization.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::{
    api::{
        authentication::v1::{TokenReview, TokenReviewSpec},
        authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
        coordination::v1::Lease,
        core::v1::{Node, Pod},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use swiftlet_tests::{
    apiserver::{
        Credentials, FakeApiServer, Options,
        auth::{AccessRule, UserInfo},
        resources::{NODES, PODS},
    },
    kubectl::{Kubectl, table},
};

async fn client(server: &FakeApiServer) -> Client {
    let path = server.dir().join("kube-rs.kubeconfig");
    let creds = match server.client_cert("test-admin", &["system:masters"]) {
        Some((cert, key)) => Credentials::ClientCert { cert, key },
        None => Credentials::None,
    };
    server.write_kubeconfig(&path, &creds).unwrap();
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
    Client::try_from(cfg).unwrap()
}

fn pod(name: &str, node: &str, labels: &[(&str, &str)]) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<std::collections::BTreeMap<_, _>>()},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "swiftlet.local/busybox:1.35"}]},
    }))
    .unwrap()
}

#[tokio::test]
async fn kube_rs_crud_patches_and_selectors() {
    let server = FakeApiServer::start(Options { tls: true, ..Default::default() }).unwrap();
    let c = client(&server).await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let created = pods.create(&PostParams::default(), &pod("a", "n1", &[("app", "web")])).await.unwrap();
    assert!(created.metadata.uid.is_some());
    // The API server's defaults.
    let spec = created.spec.as_ref().unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
    assert_eq!(spec.termination_grace_period_seconds, Some(30));
    assert_eq!(spec.containers[0].image_pull_policy.as_deref(), Some("IfNotPresent"));
    assert_eq!(created.status.as_ref().unwrap().phase.as_deref(), Some("Pending"));
    pods.create(&PostParams::default(), &pod("b", "n2", &[("app", "db")])).await.unwrap();
    let err = pods.create(&PostParams::default(), &pod("a", "n1", &[])).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 409 && s.reason == "AlreadyExists"), "{err:?}");

    let on_n1 = pods.list(&ListParams::default().fields("spec.nodeName=n1")).await.unwrap();
    assert_eq!(on_n1.items.len(), 1);
    let db = pods.list(&ListParams::default().labels("app in (db,cache)")).await.unwrap();
    assert_eq!(db.items[0].metadata.name.as_deref(), Some("b"));
    let all: Api<Pod> = Api::all(c.clone());
    assert_eq!(all.list(&ListParams::default()).await.unwrap().items.len(), 2);

    // Status subresource: the main resource keeps its status, and the
    // three patch types.
    let status = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}, {"type": "Initialized", "status": "True"}]}});
    let p = pods.patch_status("a", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    assert_eq!(p.status.as_ref().unwrap().phase.as_deref(), Some("Running"));
    let smp = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
    let p = pods.patch_status("a", &PatchParams::default(), &Patch::Strategic(&smp)).await.unwrap();
    let conds = p.status.as_ref().unwrap().conditions.as_ref().unwrap();
    assert_eq!(conds.len(), 2, "strategic merge keeps other conditions: {conds:?}");
    assert_eq!(conds.iter().find(|c| c.type_ == "Ready").unwrap().status, "False");
    let jp: json_patch::Patch =
        serde_json::from_value(json!([{"op": "add", "path": "/metadata/labels/tier", "value": "front"}])).unwrap();
    let p = pods.patch("a", &PatchParams::default(), &Patch::Json::<()>(jp)).await.unwrap();
    assert_eq!(p.metadata.labels.as_ref().unwrap()["tier"], "front");
    assert_eq!(p.status.as_ref().unwrap().phase.as_deref(), Some("Running"));
    // A stale resourceVersion conflicts.
    let mut stale = created.clone();
    stale.metadata.labels = Some([("x".to_owned(), "y".to_owned())].into());
    let err = pods.replace("a", &PostParams::default(), &stale).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 409), "{err:?}");

    // Graceful deletion of a bound pod, then grace 0.
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    let deleting = pods.get("a").await.unwrap();
    assert_eq!(deleting.metadata.deletion_grace_period_seconds, Some(30));
    pods.delete("a", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
    assert!(pods.get_opt("a").await.unwrap().is_none());

    // Cluster-scoped and other groups.
    let nodes: Api<Node> = Api::all(c.clone());
    nodes
        .create(
            &PostParams::default(),
            &Node { metadata: ObjectMeta { name: Some("n1".into()), ..Default::default() }, ..Default::default() },
        )
        .await
        .unwrap();
    let leases: Api<Lease> = Api::namespaced(c.clone(), "kube-node-lease");
    let l = leases
        .create(
            &PostParams::default(),
            &Lease { metadata: ObjectMeta { name: Some("n1".into()), ..Default::default() }, spec: None },
        )
        .await
        .unwrap();
    assert_eq!(l.metadata.namespace.as_deref(), Some("kube-node-lease"));
}

#[tokio::test]
async fn watches_bookmarks_and_gone() {
    let server =
        FakeApiServer::start(Options { bookmark_interval: Duration::from_millis(300), ..Default::default() }).unwrap();
    let c = client(&server).await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let list = pods.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.clone().unwrap();
    let mut stream = pods
        .watch(&WatchParams { bookmarks: true, ..WatchParams::default().fields("spec.nodeName=n1").timeout(30) }, &rv)
        .await
        .unwrap()
        .boxed();
    pods.create(&PostParams::default(), &pod("w", "n1", &[])).await.unwrap();
    pods.create(&PostParams::default(), &pod("other", "n2", &[])).await.unwrap();
    let mut added = vec![];
    let mut bookmarks = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while (added.is_empty() || bookmarks == 0) && tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(5), stream.try_next()).await {
            Ok(Ok(Some(WatchEvent::Added(p)))) => added.push(p.metadata.name.unwrap()),
            Ok(Ok(Some(WatchEvent::Bookmark(_)))) => bookmarks += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(added, vec!["w"], "the field selector filters the watch");
    assert!(bookmarks > 0, "bookmarks arrive");

    // An expired resourceVersion: the watch answers ERROR 410.
    server.compact();
    let mut gone = pods.watch(&WatchParams::default(), &rv).await.unwrap().boxed();
    match gone.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => assert_eq!(e.code, 410),
        other => panic!("expected a 410 error event, got {other:?}"),
    }

    // kube-runtime's watcher re-lists after a 410 and sees everything.
    let mut w = watcher(pods.clone(), watcher::Config::default()).default_backoff().applied_objects().boxed();
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 2 {
        let p = tokio::time::timeout(Duration::from_secs(10), w.try_next()).await.unwrap().unwrap().unwrap();
        seen.insert(p.metadata.name.unwrap());
    }
    assert_eq!(seen, ["other".to_owned(), "w".to_owned()].into());
}

#[tokio::test]
async fn token_and_access_reviews_follow_the_rules() {
    let server = FakeApiServer::start(Options::default()).unwrap();
    server.set_token("tok-alice", UserInfo::new("alice", &["devs"]));
    server.set_rules(vec![
        AccessRule::allow().user("alice").resource("nodes").subresource("metrics"),
        AccessRule::deny().group("devs"),
    ]);
    let c = client(&server).await;
    let tr: Api<TokenReview> = Api::all(c.clone());
    let review = |token: &str| TokenReview {
        metadata: ObjectMeta::default(),
        spec: TokenReviewSpec { token: token.into(), ..Default::default() },
        status: None,
    };
    let ok = tr.create(&PostParams::default(), &review("tok-alice")).await.unwrap();
    let st = ok.status.unwrap();
    assert_eq!(st.authenticated, Some(true));
    assert_eq!(st.user.unwrap().username.as_deref(), Some("alice"));
    let bad = tr.create(&PostParams::default(), &review("nope")).await.unwrap();
    assert_eq!(bad.status.unwrap().authenticated, Some(false));

    let sar: Api<SubjectAccessReview> = Api::all(c.clone());
    let ask = |sub: &str| SubjectAccessReview {
        metadata: ObjectMeta::default(),
        spec: SubjectAccessReviewSpec {
            user: Some("alice".into()),
            groups: Some(vec!["devs".into()]),
            resource_attributes: Some(ResourceAttributes {
                verb: Some("get".into()),
                resource: Some("nodes".into()),
                subresource: Some(sub.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        status: None,
    };
    let allowed = sar.create(&PostParams::default(), &ask("metrics")).await.unwrap().status.unwrap();
    assert!(allowed.allowed);
    let denied = sar.create(&PostParams::default(), &ask("proxy")).await.unwrap().status.unwrap();
    assert!(!denied.allowed);
    assert_eq!(denied.denied, Some(true));
    // The fake knows who asked.
    assert!(server.requests().iter().any(|r| r.user == "test-admin" || r.user == "system:anonymous"));
}

#[test]
fn kubectl_gets_describes_and_deletes() {
    let server = FakeApiServer::start(Options { tls: true, ..Default::default() }).unwrap();
    let kubeconfig = server.dir().join("kubectl.kubeconfig");
    let (cert, key) = server.client_cert("admin", &["system:masters"]).unwrap();
    server.write_kubeconfig(&kubeconfig, &Credentials::ClientCert { cert, key }).unwrap();
    let k = Kubectl::new(&kubeconfig);
    println!("kubectl: {} ({})", k.bin.display(), k.version());
    let node = json!({
        "metadata": {"name": "n1", "labels": {"node-role.kubernetes.io/worker": ""}},
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
            "addresses": [{"type": "InternalIP", "address": "10.1.2.3"}],
            "nodeInfo": {"kubeletVersion": "v0.1.0-swiftlet", "osImage": "Debian GNU/Linux 12 (bookworm)", "kernelVersion": "6.18",
                         "containerRuntimeVersion": "containerd://1.6.20", "machineID": "m", "systemUUID": "s", "bootID": "b",
                         "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
            "capacity": {"cpu": "2", "memory": "8Gi", "pods": "110"},
            "allocatable": {"cpu": "2", "memory": "7Gi", "pods": "110"},
        }
    });
    server.store().create(&NODES, "", node).unwrap();
    let mut p = json!({"metadata": {"name": "web"}, "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]}});
    swiftlet_tests::apiserver::defaults::pod(&mut p);
    server.store().create(&PODS, "default", p).unwrap();

    let nodes = k.ok(&["get", "nodes"]);
    println!("$ kubectl get nodes\n{nodes}");
    let t = table(&nodes);
    assert_eq!(t[0], ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]);
    assert_eq!(t[1][..3], ["n1", "Ready", "worker"]);
    assert_eq!(t[1][4], "v0.1.0-swiftlet");

    let wide = k.ok(&["get", "pods", "-o", "wide"]);
    println!("$ kubectl get pods -o wide\n{wide}");
    let t = table(&wide);
    assert_eq!(t[0][..6], ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP"]);
    assert_eq!(t[1][..3], ["web", "0/1", "Pending"]);
    assert_eq!(t[1][6], "n1");

    let described = k.ok(&["describe", "node", "n1"]);
    println!("$ kubectl describe node n1\n{described}");
    for want in [
        "Name:               n1",
        "KubeletReady",
        "InternalIP:  10.1.2.3",
        "Allocatable:",
        "memory:  7Gi",
        "default                     web",
    ] {
        assert!(described.contains(want), "describe lacks {want:?}");
    }

    let jp = k.ok(&["get", "node", "n1", "-o", "jsonpath={.status.allocatable.memory}"]);
    assert_eq!(jp, "7Gi");

    // A bound pod is deleted gracefully: Terminating until grace 0.
    let out = k.ok(&["delete", "pod", "web", "--wait=false"]);
    assert!(out.contains("pod \"web\" deleted"), "{out}");
    let t = table(&k.ok(&["get", "pods"]));
    assert_eq!(t[1][2], "Terminating");
    k.ok(&["delete", "pod", "web", "--grace-period=0", "--force"]);
    let after = k.run(&["get", "pod", "web"]);
    assert!(!after.status.success());
    assert!(String::from_utf8_lossy(&after.stderr).contains("not found"));
    // An unbound pod goes at once, and `kubectl delete` waits for it.
    let mut q = json!({"metadata": {"name": "loose"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    swiftlet_tests::apiserver::defaults::pod(&mut q);
    server.store().create(&PODS, "default", q).unwrap();
    let out = k.ok(&["delete", "pod", "loose"]);
    assert!(out.contains("deleted"), "{out}");
    assert!(k.ok(&["get", "pods"]).trim().is_empty());
}

const POD_YAML: &str = "apiVersion: v1
kind: Pod
metadata:
  name: validated
  namespace: default
spec:
  containers:
  - name: c
    image: swiftlet.local/busybox:1.35
";

/// kubectl 1.32 applies manifests with its default `--validate=strict`
/// (no `--validate=false`): the fake's OpenAPI v3 says it validates fields
/// itself, and it refuses a field a Pod does not have, as the API server
/// does.
#[test]
fn current_kubectl_applies_with_validation_and_unknown_fields_are_refused() {
    let server = FakeApiServer::start(Options { tls: true, ..Default::default() }).unwrap();
    let path = server.dir().join("admin.kubeconfig");
    let (cert, key) = server.client_cert("admin", &["system:masters"]).unwrap();
    server.write_kubeconfig(&path, &Credentials::ClientCert { cert, key }).unwrap();
    let kubectl = Kubectl::current(&path);
    let apply = |yaml: &str| kubectl.run_with_input(&["apply", "-f", "-"], yaml);

    let out = apply(POD_YAML);
    let text = |o: &std::process::Output| {
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
    };
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("pod/validated created"), "{}", text(&out));
    // A second apply patches (the last-applied configuration diff).
    let out = apply(&POD_YAML.replace("busybox:1.35", "busybox:1.36"));
    assert!(out.status.success() && text(&out).contains("pod/validated configured"), "{}", text(&out));
    assert_eq!(
        server.get(&PODS, "default", "validated").unwrap()["spec"]["containers"][0]["image"],
        "swiftlet.local/busybox:1.36"
    );
    // A typo is an error, as from a real API server.
    let out = apply(&POD_YAML.replace("    image:", "    imagee: typo\n    image:"));
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(r#"strict decoding error: unknown field "spec.containers[0].imagee""#),
        "{}",
        text(&out)
    );
    let out = kubectl.run_with_input(
        &["create", "-f", "-"],
        &POD_YAML.replace("validated", "other").replace("  containers:", "  nodeSelectorr: {}\n  containers:"),
    );
    assert!(text(&out).contains(r#"unknown field "spec.nodeSelectorr""#), "{}", text(&out));
}

/// The binary by hand, as the README's recipe runs it: its kubeconfig's
/// admin (group system:masters) is allowed through SubjectAccessReviews
/// (kubectl logs and proxy requests to the kubelet), anyone else is not
/// unless a --rule says so.
#[test]
fn the_fake_apiserver_binary_allows_its_admin_and_no_one_else_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("fake.kubeconfig");
    let mut child = std::process::Command::new(swiftlet_tests::workload::sibling_binary("fake-apiserver"))
        .args(["--tls", "--port", "0", "--kubeconfig"])
        .arg(&kubeconfig)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            // SAFETY: signalling the fake API server this test started, by its PID.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
            let _ = self.0.wait();
        }
    }
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let _stop = Stop(child);
    let banner: Vec<String> = lines.by_ref().take(4).map(|l| l.unwrap()).collect();
    assert!(banner.iter().any(|l| l.contains("then allow group system:masters")), "{banner:?}");
    let kubectl = Kubectl::current(&kubeconfig);
    let review = |user: &str, group: &str| {
        let sar = json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": [group],
                     "resourceAttributes": {"verb": "get", "resource": "nodes", "subresource": "proxy", "name": "n1"}},
        });
        let out = kubectl.run_with_input(&["create", "-f", "-", "-o", "json"], &sar.to_string());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["status"]["allowed"].as_bool().unwrap_or(false)
    };
    assert!(review("kubernetes-admin", "system:masters"));
    assert!(!review("someone", "system:authenticated"));
}
