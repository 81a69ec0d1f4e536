//! Private images on the real containerd: a registry on 127.0.0.1 that
//! answers only with HTTP Basic credentials, pulled through the image
//! manager with a pod's imagePullSecrets and with a credential provider
//! plugin (tests/src/bin/swiftlet-test-credential-provider.rs, configured
//! as the kubelet's `--image-credential-provider-config` would). What
//! reaches the runtime is recorded (the AuthConfig of each PullImage), and
//! the registry tells whether containerd sent it on.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use async_trait::async_trait;
use base64::Engine;
use k8s_openapi::{
    ByteString,
    api::core::v1::{Container, LocalObjectReference, Pod, PodSpec, Secret},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use swiftlet::{
    cri::{CriClient, ImageService, api},
    images::{
        ImageErrorReason, ImageManager, ImageManagerConfig,
        credentials::{PullCredentials, SecretSource, load_plugins},
    },
};
use swiftlet_tests::{
    recorder::RecordedEvents,
    registry::Registry,
    sandbox::{ImageGuard, client},
    workload::sibling_binary,
};

/// The CRI ImageService, recording the credentials of every pull.
struct Recording {
    inner: Arc<CriClient>,
    pulls: Mutex<Vec<(String, Option<api::AuthConfig>)>>,
}

#[async_trait]
impl ImageService for Recording {
    async fn list_images(&self) -> swiftlet::cri::Result<Vec<api::Image>> {
        self.inner.list_images().await
    }
    async fn image_status(&self, image: &str) -> swiftlet::cri::Result<Option<api::Image>> {
        self.inner.image_status(image).await
    }
    async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        sb: Option<api::PodSandboxConfig>,
    ) -> swiftlet::cri::Result<String> {
        self.pulls.lock().unwrap().push((image.to_owned(), auth.clone()));
        self.inner.pull_image(image, auth, sb).await
    }
    async fn remove_image(&self, image: &str) -> swiftlet::cri::Result<()> {
        self.inner.remove_image(image).await
    }
    async fn image_fs_info(&self) -> swiftlet::cri::Result<Vec<api::FilesystemUsage>> {
        self.inner.image_fs_info().await
    }
}

struct Secrets(HashMap<String, Secret>);

#[async_trait]
impl SecretSource for Secrets {
    async fn secret(&self, _ns: &str, name: &str) -> Result<Secret, String> {
        self.0.get(name).cloned().ok_or_else(|| format!("secrets \"{name}\" not found"))
    }
}

fn pull_secret(registry: &str, user: &str, password: &str) -> Secret {
    let json = format!(r#"{{"auths":{{"{registry}":{{"username":"{user}","password":"{password}"}}}}}}"#);
    Secret {
        type_: Some("kubernetes.io/dockerconfigjson".into()),
        data: Some([(".dockerconfigjson".to_string(), ByteString(json.into_bytes()))].into()),
        ..Default::default()
    }
}

fn pod(image: &str, secrets: &[&str]) -> (Pod, Container) {
    let c = Container { name: "app".into(), image: Some(image.into()), ..Default::default() };
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("private".into()),
            namespace: Some("swiftlet-test".into()),
            uid: Some(format!("private-{}-{image}", std::process::id())),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![c.clone()],
            image_pull_secrets: Some(secrets.iter().map(|n| LocalObjectReference { name: n.to_string() }).collect()),
            ..Default::default()
        }),
        ..Default::default()
    };
    (pod, c)
}

fn config() -> ImageManagerConfig {
    ImageManagerConfig {
        registry_pull_qps: 0,
        backoff_initial: Duration::from_millis(10),
        backoff_max: Duration::from_millis(20),
        ..Default::default()
    }
}

fn basic(user: &str, password: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
}

#[tokio::test]
async fn image_pull_secrets_reach_containerd_and_the_registry() {
    let registry = Registry::start_private("alice", "s3cret");
    let app = registry.add_image("team/app", "1", "");
    let other = registry.add_image("team/other", "1", "");
    let _cleanup = ImageGuard(vec![app.id.clone(), other.id.clone()]);
    let recording = Arc::new(Recording { inner: client().await, pulls: Mutex::default() });
    let secrets = Secrets(HashMap::from([
        ("regcred".to_string(), pull_secret(&registry.host(), "alice", "s3cret")),
        ("quay".to_string(), pull_secret("quay.io", "bob", "nope")),
    ]));
    let events = Arc::new(RecordedEvents::default());
    let images = ImageManager::new(recording.clone(), events.clone(), config())
        .with_credentials(Arc::new(PullCredentials::new(Arc::new(secrets), vec![])));

    let (p, c) = pod(&app.reference, &["quay", "regcred"]);
    let r = images.ensure_image(&p, &c, None).await.unwrap_or_else(|e| panic!("pull with the secret: {e}"));
    assert_eq!(r.as_str(), app.id);
    let (image, auth) = recording.pulls.lock().unwrap().last().cloned().unwrap();
    assert_eq!(image, app.reference);
    let auth = auth.expect("the pull secret's credentials went with PullImage");
    assert_eq!((auth.username.as_str(), auth.password.as_str()), ("alice", "s3cret"));
    assert!(registry.authorizations().contains(&basic("alice", "s3cret")), "containerd sent them to the registry");

    // Without a matching secret: no credentials, the registry's 401.
    let (p, c) = pod(&other.reference, &["quay"]);
    let e = images.ensure_image(&p, &c, None).await.unwrap_err();
    assert_eq!(e.reason, ImageErrorReason::ErrImagePull);
    // containerd 1.x names the status; 2.x says what it means.
    assert!(e.message.contains("401 Unauthorized") || e.message.contains("authorization failed"), "{}", e.message);
    assert_eq!(recording.pulls.lock().unwrap().last().unwrap().1, None, "quay.io's credentials stay with quay.io");
}

#[tokio::test]
async fn a_credential_provider_plugin_is_asked_and_its_answer_cached() {
    let registry = Registry::start_private("robot", "t0k3n");
    let first = registry.add_image("team/first", "1", "");
    let second = registry.add_image("team/second", "1", "");
    let third = registry.add_image("team/third", "1", "");
    let _cleanup = ImageGuard(vec![first.id.clone(), second.id.clone(), third.id.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests");
    let plugin = sibling_binary("swiftlet-test-credential-provider");
    let provider_config = dir.path().join("credential-providers.yaml");
    std::fs::write(
        &provider_config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
- name: swiftlet-test-credential-provider
  matchImages: [\"127.0.0.1:{port}\"]
  defaultCacheDuration: 1h
  apiVersion: credentialprovider.kubelet.k8s.io/v1
  env:
  - {{name: PROVIDER_LOG, value: {log}}}
  - {{name: PROVIDER_USER, value: robot}}
  - {{name: PROVIDER_PASSWORD, value: t0k3n}}
  - {{name: PROVIDER_CACHE_DURATION, value: 2s}}
",
            port = registry.host().rsplit(':').next().unwrap(),
            log = log.display(),
        ),
    )
    .unwrap();
    let plugins = load_plugins(&provider_config, plugin.parent().unwrap()).expect("the configuration loads");
    let recording = Arc::new(Recording { inner: client().await, pulls: Mutex::default() });
    let images = ImageManager::new(recording.clone(), Arc::new(RecordedEvents::default()), config())
        .with_credentials(Arc::new(PullCredentials::new(Arc::new(Secrets(HashMap::new())), plugins)));
    let requests = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON request per line"))
            .collect()
    };

    let (p, c) = pod(&first.reference, &[]);
    images.ensure_image(&p, &c, None).await.unwrap_or_else(|e| panic!("pull with the plugin's credentials: {e}"));
    let asked = requests();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0]["apiVersion"], "credentialprovider.kubelet.k8s.io/v1");
    assert_eq!(asked[0]["kind"], "CredentialProviderRequest");
    assert_eq!(asked[0]["image"], format!("{}/team/first", registry.host()), "the repository, without its tag");
    let auth = recording.pulls.lock().unwrap().last().unwrap().1.clone().expect("credentials with PullImage");
    assert_eq!((auth.username.as_str(), auth.password.as_str()), ("robot", "t0k3n"));
    assert!(registry.authorizations().contains(&basic("robot", "t0k3n")));

    // Cached for the registry for 2 s: the next image needs no new answer.
    let (p, c) = pod(&second.reference, &[]);
    images.ensure_image(&p, &c, None).await.unwrap();
    assert_eq!(requests().len(), 1, "answered from the cache");
    // After the cache duration the plugin is asked again.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (p, c) = pod(&third.reference, &[]);
    images.ensure_image(&p, &c, None).await.unwrap();
    assert_eq!(requests().len(), 2, "asked again once the answer expired");
    assert_eq!(requests()[1]["image"], format!("{}/team/third", registry.host()));
}
