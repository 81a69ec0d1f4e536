//! The image manager with credentials, on the fake runtime: what
//! AuthConfig reaches PullImage for pull secrets and for a credential
//! provider plugin (a shell script written here), and that the plugin's
//! answer is cached for its cacheDuration.

use std::{collections::HashMap, os::unix::fs::PermissionsExt, time::Duration};

use k8s_openapi::{
    ByteString,
    api::core::v1::{Container, LocalObjectReference, ObjectReference, PodSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use parking_lot::Mutex;

use super::*;
use crate::{
    cri::fake::FakeRuntime,
    events::{EventRecorder, EventType},
    images::{ImageErrorReason, ImageManager, ImageManagerConfig},
};

#[derive(Default)]
struct Events(Mutex<Vec<(String, String)>>);

impl EventRecorder for Events {
    fn record(&self, _object: &ObjectReference, _t: EventType, reason: &str, message: &str) {
        self.0.lock().push((reason.into(), message.into()));
    }
}

struct Secrets(HashMap<String, Secret>);

#[async_trait]
impl SecretSource for Secrets {
    async fn secret(&self, _ns: &str, name: &str) -> Result<Secret, String> {
        self.0.get(name).cloned().ok_or_else(|| format!("secret {name:?} not found"))
    }
}

fn pod(image: &str, secrets: &[&str]) -> (Pod, Container) {
    let c = Container { name: "app".into(), image: Some(image.into()), ..Default::default() };
    let p = Pod {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("team".into()),
            uid: Some("u1".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![c.clone()],
            image_pull_secrets: Some(secrets.iter().map(|n| LocalObjectReference { name: n.to_string() }).collect()),
            ..Default::default()
        }),
        ..Default::default()
    };
    (p, c)
}

fn docker_secret(registry: &str, user: &str, password: &str) -> Secret {
    let json = format!(r#"{{"auths":{{"{registry}":{{"username":"{user}","password":"{password}"}}}}}}"#);
    Secret {
        type_: Some("kubernetes.io/dockerconfigjson".into()),
        data: Some([(".dockerconfigjson".to_string(), ByteString(json.into_bytes()))].into()),
        ..Default::default()
    }
}

fn manager(rt: &Arc<FakeRuntime>, events: &Arc<Events>, creds: PullCredentials) -> ImageManager {
    let cfg =
        ImageManagerConfig { registry_pull_qps: 0, backoff_initial: Duration::from_millis(1), ..Default::default() };
    ImageManager::new(rt.clone(), events.clone(), cfg).with_credentials(Arc::new(creds))
}

#[tokio::test]
async fn pull_secrets_reach_the_runtime_for_their_registry() {
    let rt = Arc::new(FakeRuntime::new());
    rt.make_private("registry.example.com/team/app:1", 10, "alice", "s3cret");
    let events = Arc::new(Events::default());
    let secrets = Secrets(HashMap::from([
        ("regcred".to_string(), docker_secret("registry.example.com", "alice", "s3cret")),
        ("elsewhere".to_string(), docker_secret("quay.io", "bob", "x")),
    ]));
    let m = manager(&rt, &events, PullCredentials::new(Arc::new(secrets), vec![]));

    let (p, c) = pod("registry.example.com/team/app:1", &["elsewhere", "regcred", "missing"]);
    m.ensure_image(&p, &c, None).await.unwrap();
    let (image, auth) = rt.pull_auths().pop().unwrap();
    assert_eq!(image, "registry.example.com/team/app:1");
    let auth = auth.expect("credentials sent");
    assert_eq!((auth.username.as_str(), auth.password.as_str()), ("alice", "s3cret"));
    let ev = events.0.lock().clone();
    assert!(
        ev.contains(&(
            "FailedToRetrieveImagePullSecret".into(),
            "Unable to retrieve some image pull secrets (missing); attempting to pull the image may not succeed."
                .into()
        )),
        "{ev:?}"
    );

    // Without the secret the registry says 401: ErrImagePull, no credentials sent.
    rt.make_private("registry.example.com/team/other:1", 10, "alice", "s3cret");
    let (p, c) = pod("registry.example.com/team/other:1", &["elsewhere"]);
    let e = m.ensure_image(&p, &c, None).await.unwrap_err();
    assert_eq!(e.reason, ImageErrorReason::ErrImagePull);
    assert!(e.message.contains("401 Unauthorized"), "{}", e.message);
    assert_eq!(rt.pull_auths().last().unwrap().1, None, "quay.io's credentials are not sent to another registry");
}

/// A plugin that appends each request to `<dir>/requests` and answers with
/// fixed credentials, cached per registry for `cache`.
fn plugin_script(dir: &std::path::Path, cache: &str) -> std::path::PathBuf {
    let bin = dir.join("test-provider");
    std::fs::write(
        &bin,
        format!(
            "#!/bin/sh\ncat >> {requests}\necho >> {requests}\nprintf '%s' '{{\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"kind\":\"CredentialProviderResponse\",\"cacheKeyType\":\"Registry\",\"cacheDuration\":\"{cache}\",\"auth\":{{\"*.example.com\":{{\"username\":\"from-plugin\",\"password\":\"'\"$TOKEN\"'\"}}}}}}'\n",
            requests = dir.join("requests").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n- name: test-provider\n  matchImages: [\"*.example.com\"]\n  defaultCacheDuration: 1h\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n  env: [{name: TOKEN, value: t0k3n}]\n",
    )
    .unwrap();
    config
}

#[tokio::test]
async fn a_credential_provider_plugin_is_asked_once_per_cache_period() {
    let dir = tempfile::tempdir().unwrap();
    let config = plugin_script(dir.path(), "1s");
    let plugins = load_plugins(&config, dir.path()).unwrap();
    let rt = Arc::new(FakeRuntime::new());
    rt.make_private("registry.example.com/team/app:1", 10, "from-plugin", "t0k3n");
    rt.make_private("registry.example.com/team/app:2", 10, "from-plugin", "t0k3n");
    rt.make_private("registry.example.com/team/app:3", 10, "from-plugin", "t0k3n");
    let events = Arc::new(Events::default());
    let m = manager(&rt, &events, PullCredentials::new(Arc::new(Secrets(HashMap::new())), plugins));
    let requests = || std::fs::read_to_string(dir.path().join("requests")).unwrap_or_default();

    let (p, c) = pod("registry.example.com/team/app:1", &[]);
    m.ensure_image(&p, &c, None).await.unwrap();
    assert_eq!(
        requests().trim(),
        r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","image":"registry.example.com/team/app","kind":"CredentialProviderRequest"}"#
    );
    let auth = rt.pull_auths().pop().unwrap().1.unwrap();
    assert_eq!(
        (auth.username.as_str(), auth.password.as_str()),
        ("from-plugin", "t0k3n"),
        "the plugin's env reached it"
    );
    // Within the cache duration the plugin is not run again.
    let (p, c) = pod("registry.example.com/team/app:2", &[]);
    m.ensure_image(&p, &c, None).await.unwrap();
    assert_eq!(requests().lines().count(), 1, "cached for the registry");
    // Once it expires, it is.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (p, c) = pod("registry.example.com/team/app:3", &[]);
    m.ensure_image(&p, &c, None).await.unwrap();
    assert_eq!(requests().lines().count(), 2, "asked again after 1s");
    // Images its patterns do not match never reach it.
    rt.make_pullable("docker.io/library/busybox:1", 1);
    let (p, c) = pod("busybox:1", &[]);
    m.ensure_image(&p, &c, None).await.unwrap();
    assert_eq!(requests().lines().count(), 2);
    assert_eq!(rt.pull_auths().pop().unwrap().1, None);
}

#[test]
fn a_missing_plugin_binary_refuses_the_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let config = plugin_script(dir.path(), "1s");
    std::fs::remove_file(dir.path().join("test-provider")).unwrap();
    let e = load_plugins(&config, dir.path()).err().unwrap();
    assert!(e.starts_with("plugin binary executable") && e.ends_with("did not exist"), "{e}");
}
