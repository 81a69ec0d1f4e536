//! The API pod source: pods bound to this node (`spec.nodeName=<node>`),
//! through kube-runtime's watcher (list, then watch from the list's
//! resourceVersion with bookmarks; a 410 Gone re-lists; errors back off and
//! retry). Each change gives the pod manager a full snapshot of the API's
//! pods (`SourceKind::Api`); mirror pods are not pods to run: they go to
//! the mirror-pod manager instead.
//!
//! While the API server is away the last snapshot stands: no pod is
//! stopped because the server cannot be reached.

use std::{collections::BTreeMap, sync::Arc};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, watcher};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{CONFIG_MIRROR, mirror::MirrorPods};
use crate::pods::source::{PodSink, PodSnapshot, SourceKind};

/// The watched pods, by uid, built from watcher events.
#[derive(Default)]
pub struct PodCache {
    pods: BTreeMap<String, Pod>,
    /// During a (re-)list: the objects listed so far.
    listing: Option<BTreeMap<String, Pod>>,
    listed: bool,
}

fn key(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_else(|| {
        format!("{}/{}", p.metadata.namespace.as_deref().unwrap_or(""), p.metadata.name.as_deref().unwrap_or(""))
    })
}

pub fn is_mirror(p: &Pod) -> bool {
    p.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(CONFIG_MIRROR))
}

impl PodCache {
    /// Applies one event; true when the set of pods may have changed and a
    /// snapshot is due (never in the middle of a list).
    pub fn apply(&mut self, event: watcher::Event<Pod>) -> bool {
        match event {
            watcher::Event::Init => {
                self.listing = Some(BTreeMap::new());
                false
            }
            watcher::Event::InitApply(p) => {
                self.listing.get_or_insert_with(BTreeMap::new).insert(key(&p), p);
                false
            }
            watcher::Event::InitDone => {
                self.pods = self.listing.take().unwrap_or_default();
                self.listed = true;
                true
            }
            watcher::Event::Apply(p) => {
                self.pods.insert(key(&p), p);
                self.listed
            }
            watcher::Event::Delete(p) => {
                self.pods.remove(&key(&p));
                self.listed
            }
        }
    }

    /// (pods to run, mirror pods), each sorted by namespace and name.
    pub fn split(&self) -> (Vec<Pod>, Vec<Pod>) {
        let mut run = vec![];
        let mut mirrors = vec![];
        for p in self.pods.values() {
            if is_mirror(p) { mirrors.push(p.clone()) } else { run.push(p.clone()) }
        }
        let by_name = |a: &Pod, b: &Pod| {
            (a.metadata.namespace.as_deref(), a.metadata.name.as_deref())
                .cmp(&(b.metadata.namespace.as_deref(), b.metadata.name.as_deref()))
        };
        run.sort_by(by_name);
        mirrors.sort_by(by_name);
        (run, mirrors)
    }
}

/// A sink that keeps the latest snapshot and forwards it to a sink that
/// may be connected later (the pod manager is built after the watch).
#[derive(Default)]
pub struct LatchSink {
    inner: Mutex<Latch>,
}

#[derive(Default)]
struct Latch {
    latest: Option<PodSnapshot>,
    target: Option<Arc<dyn PodSink>>,
}

impl LatchSink {
    /// Connects the real sink; it gets the latest snapshot at once.
    pub fn connect(&self, target: Arc<dyn PodSink>) {
        let mut g = self.inner.lock();
        if let Some(s) = &g.latest {
            target.set(s.clone());
        }
        g.target = Some(target);
    }

    pub fn latest(&self) -> Option<PodSnapshot> {
        self.inner.lock().latest.clone()
    }
}

impl PodSink for LatchSink {
    fn set(&self, snapshot: PodSnapshot) {
        let mut g = self.inner.lock();
        if let Some(t) = &g.target {
            t.set(snapshot.clone());
        }
        g.latest = Some(snapshot);
    }
}

/// Gives every snapshot to each sink (the static pod source's snapshots go
/// to the pod manager and to the mirror pods).
pub struct TeeSink(pub Vec<Arc<dyn PodSink>>);

impl PodSink for TeeSink {
    fn set(&self, snapshot: PodSnapshot) {
        for s in &self.0 {
            s.set(snapshot.clone());
        }
    }
}

/// Watches this node's pods until `shutdown`.
pub async fn run(
    client: kube::Client,
    node_name: &str,
    pods: Arc<dyn PodSink>,
    mirrors: Arc<MirrorPods>,
    shutdown: CancellationToken,
) {
    let api: kube::Api<Pod> = kube::Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let mut stream = watcher(api, config).default_backoff().boxed();
    let mut cache = PodCache::default();
    let mut failing = false;
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            _ = shutdown.cancelled() => return,
        };
        match event {
            None => return,
            Some(Err(e)) => {
                if !failing {
                    warn!("pod watch: {e}; keeping the last pods and retrying");
                }
                failing = true;
            }
            Some(Ok(ev)) => {
                if failing {
                    info!("pod watch: the API server answers again");
                    failing = false;
                }
                if cache.apply(ev) {
                    let (run, mirror_pods) = cache.split();
                    debug!(pods = run.len(), mirrors = mirror_pods.len(), "API pods changed");
                    pods.set(PodSnapshot { source: SourceKind::Api, pods: run });
                    mirrors.set_mirrors(mirror_pods);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod(name: &str, uid: &str, mirror: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(uid.into()),
                annotations: mirror.then(|| [(CONFIG_MIRROR.to_owned(), "h".to_owned())].into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn names(pods: &[Pod]) -> Vec<&str> {
        pods.iter().map(|p| p.metadata.name.as_deref().unwrap()).collect()
    }

    #[test]
    fn list_then_changes_then_relist() {
        let mut c = PodCache::default();
        assert!(!c.apply(watcher::Event::Init));
        assert!(!c.apply(watcher::Event::InitApply(pod("b", "2", false))));
        assert!(!c.apply(watcher::Event::InitApply(pod("etcd", "3", true))));
        assert!(c.apply(watcher::Event::InitDone));
        let (run, mirrors) = c.split();
        assert_eq!(names(&run), vec!["b"]);
        assert_eq!(names(&mirrors), vec!["etcd"]);
        assert!(c.apply(watcher::Event::Apply(pod("a", "1", false))));
        assert_eq!(names(&c.split().0), vec!["a", "b"]);
        assert!(c.apply(watcher::Event::Delete(pod("b", "2", false))));
        assert_eq!(names(&c.split().0), vec!["a"]);
        // A re-list (after 410 Gone) replaces everything at its end only:
        // pods missing from it are gone, the old set stands until then.
        assert!(!c.apply(watcher::Event::Init));
        assert!(!c.apply(watcher::Event::InitApply(pod("c", "4", false))));
        assert_eq!(names(&c.split().0), vec!["a"]);
        assert!(c.apply(watcher::Event::InitDone));
        assert_eq!(names(&c.split().0), vec!["c"]);
        assert!(c.split().1.is_empty());
    }

    #[test]
    fn same_name_new_uid_is_a_new_pod() {
        let mut c = PodCache::default();
        c.apply(watcher::Event::Init);
        c.apply(watcher::Event::InitDone);
        c.apply(watcher::Event::Apply(pod("web", "1", false)));
        c.apply(watcher::Event::Delete(pod("web", "1", false)));
        c.apply(watcher::Event::Apply(pod("web", "2", false)));
        let (run, _) = c.split();
        assert_eq!(run.len(), 1);
        assert_eq!(run[0].metadata.uid.as_deref(), Some("2"));
    }

    struct Collect(Mutex<Vec<usize>>);
    impl PodSink for Collect {
        fn set(&self, s: PodSnapshot) {
            self.0.lock().push(s.pods.len());
        }
    }

    #[test]
    fn latch_replays_the_latest_snapshot() {
        let latch = LatchSink::default();
        latch.set(PodSnapshot { source: SourceKind::Api, pods: vec![pod("a", "1", false)] });
        latch.set(PodSnapshot { source: SourceKind::Api, pods: vec![pod("a", "1", false), pod("b", "2", false)] });
        let target = Arc::new(Collect(Mutex::new(vec![])));
        latch.connect(target.clone());
        latch.set(PodSnapshot { source: SourceKind::Api, pods: vec![] });
        assert_eq!(*target.0.lock(), vec![2, 0]);
    }
}
