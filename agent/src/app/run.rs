//! Running: starts every manager's loop, serves the kubelet API, and on
//! shutdown waits for them in order (the API loops, the servers, the rest).

use std::{sync::Arc, time::Duration};

use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::{
    cri::{ImageService, RuntimeService},
    kubeapi::pod_watch::TeeSink,
    pods::{file::FileSource, local_storage::LocalStorageMonitor, source::PodSink},
    volumes::{
        PodsInUse,
        csi::{
            nodeinfo::{KubeNodeObjects, NodeInfoManager},
            registration::CsiRegistration,
        },
    },
};

use super::{Agent, RELIST_PERIOD, StartError};

impl Agent {
    /// The memory.pressure eviction signal: PSI triggers on the node's file
    /// and, on cgroup v2, on each pod's.
    fn start_memory_pressure(&self, signal: crate::config::MemoryPressureSignal) -> std::io::Result<JoinHandle<()>> {
        use crate::eviction::{pressure::PressureConfig, pressure_watch};
        let cfg = PressureConfig {
            threshold_percent: signal.threshold_percent,
            grace_period: signal.grace_period,
            transition_period: self.config.kubelet.eviction_pressure_transition_period,
        };
        let sink = self.eviction.pressure_sink(cfg, self.recorder.clone());
        let fs = self.cgroupfs.clone();
        if fs.version() == crate::cgroups::Version::V1 {
            info!(
                "memory.pressure signal: the pods' cgroups are cgroup v1, which has no pressure files: the node only"
            );
        }
        let pod_file: pressure_watch::PodPressureFile = Box::new(move |p| {
            (fs.version() == crate::cgroups::Version::V2).then(|| fs.memory_dir(&p.cgroup).join("memory.pressure"))
        });
        pressure_watch::spawn(cfg, Arc::new(self.pods.clone()), pod_file, sink, self.shutdown.clone())
    }

    /// Runs every manager until shutdown, then waits for them to stop.
    pub async fn run(self: Arc<Self>) -> Result<(), StartError> {
        let k = &self.config.kubelet;
        let mut tasks: Vec<JoinHandle<()>> = vec![];
        tasks.push(tokio::spawn(self.pods.clone().run(RELIST_PERIOD)));
        if let Some(l) = self.eviction_loop.lock().take() {
            tasks.push(tokio::spawn(l.run(self.shutdown.clone())));
        }
        if let Some(signal) = self.config.swiftlet.memory_pressure {
            match self.start_memory_pressure(signal) {
                Ok(t) => tasks.push(t),
                Err(e) => tracing::error!("--eviction-memory-pressure is set but the signal cannot run: {e}"),
            }
        }
        tasks.push(tokio::spawn(self.image_gc.clone().run(self.shutdown.clone())));
        tasks.push(tokio::spawn(self.container_gc.clone().run(self.shutdown.clone())));
        tasks.push(tokio::spawn(self.logs.clone().run(self.shutdown.clone())));
        tasks.push(tokio::spawn(self.node_shutdown.clone().run(self.shutdown.clone())));
        if self.node_shutdown.enabled() {
            if crate::shutdown::logind::available() {
                tasks.push(tokio::spawn(crate::shutdown::logind::run(
                    self.node_shutdown.clone(),
                    self.shutdown.clone(),
                )));
            } else {
                info!(
                    "graceful node shutdown: systemd is not PID 1, so no logind; the shutdown marker and SIGTERM start it"
                );
            }
        }
        // ---- device plugins ----
        // The kubelet cannot start without its device manager; swiftlet
        // runs on without device plugins and says why.
        match self.devices.start(self.shutdown.clone()) {
            Ok(t) => tasks.push(t),
            Err(e) => tracing::error!("device plugins are not available: {e}"),
        }
        // ---- end device plugins ----
        // ---- plugin watcher ----
        // CSI drivers register through <root-dir>/plugins_registry; what
        // they report is published once the API client exists.
        let csi = Arc::new(CsiRegistration::new(self.csi_drivers.clone()));
        if self.api.is_none() {
            csi.set_standalone();
        }
        self.plugin_watcher.add_handler(crate::pluginwatcher::CSI_PLUGIN, csi.clone());
        tasks.push(tokio::spawn(self.plugin_watcher.clone().run(self.shutdown.clone())));
        // ---- end plugin watcher ----
        let in_use: Arc<dyn PodsInUse> = Arc::new(self.pods.clone());
        tasks.push(tokio::spawn(self.volumes.clone().run(in_use, self.cri.clone(), self.shutdown.clone())));
        if k.local_storage_capacity_isolation {
            let monitor = LocalStorageMonitor {
                pods: Arc::new(self.pods.clone()),
                evictor: Arc::new(self.pods.clone()),
                runtime: self.cri.clone(),
                volumes: self.volumes.clone(),
                pod_logs_dir: k.pod_logs_dir.clone(),
                period: self.config.swiftlet.housekeeping_interval,
            };
            tasks.push(tokio::spawn(monitor.run(self.shutdown.clone())));
        }
        // ---- API server ----
        // ConfigMaps, Secrets, service account tokens and the storage
        // objects for volumes and environments, and RuntimeClasses, come
        // from the API server once connected, before its first pod.
        if let Some(api) = &self.api {
            let volumes = self.volumes.clone();
            let runtime_classes = self.runtime_classes.clone();
            api.on_connect(move |client| {
                runtime_classes
                    .set_source(Arc::new(crate::kubeapi::runtime_class::KubeRuntimeClasses::new(client.clone())));
                volumes.set_objects(Arc::new(crate::volumes::kube::KubeObjects::new(client)));
            });
        }
        let mut api_task = self.api.clone().map(|api| {
            let runtime: Arc<dyn RuntimeService> = self.cri.clone();
            let images: Arc<dyn ImageService> = self.cri.clone();
            tokio::spawn(api.run(runtime, images, self.live.subscribe(), self.shutdown.clone()))
        });
        // The CSINode, once connected.
        if let Some(api) = self.api.clone() {
            let stop = self.shutdown.clone();
            let csi = csi.clone();
            let node_name = self.node_name.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    if let Some(client) = api.client() {
                        // The CSINode exists from the start, with no driver
                        // yet (as the kubelet makes it).
                        let node_info =
                            Arc::new(NodeInfoManager::new(Arc::new(KubeNodeObjects::new(client)), node_name));
                        csi.set_node_info(node_info.clone());
                        node_info.initialize_until_done(&stop).await;
                        return;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                        _ = stop.cancelled() => return,
                    }
                }
            }));
        }
        // ---- end API server ----
        if let Some(dir) = &k.static_pod_path {
            let mut sink: Arc<dyn PodSink> = Arc::new(self.pods.clone());
            // ---- API server ----
            // Static pods also get their mirror pods.
            if let Some(api) = &self.api {
                sink = Arc::new(TeeSink(vec![sink, api.mirror_sink()]));
            }
            // ---- end API server ----
            let source = FileSource::new(
                dir.clone(),
                self.node_name.clone(),
                k.file_check_frequency,
                sink,
                self.pod_metrics.manifest_errors.clone(),
            );
            tasks.push(tokio::spawn(source.run(self.shutdown.clone())));
        }
        info!(
            node = self.node_name,
            mode = self.signals.source.mode().as_str(),
            standalone = self.config.standalone(),
            static_pods = k.static_pod_path.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            "swiftlet started"
        );
        // ---- server: :10248, :10250 and the debug socket ----
        // The forwarder ends only when the eviction manager's sender is
        // dropped, which this Agent outlives: it is aborted at shutdown.
        let debug_forwarder = self.debug_events.forward(self.eviction.events());
        let servers = super::serve::serve(&self, self.shutdown.clone()).await?;
        // ---- end server ----
        let shutdown = self.shutdown.clone();
        while !shutdown.is_cancelled() {
            tokio::select! {
                // ---- API server ----
                // It ends early only on a fatal error (a bad kubeconfig, a
                // refused bootstrap): the agent stops, as the kubelet exits.
                r = async { api_task.as_mut().expect("guarded").await }, if api_task.is_some() => {
                    api_task = None;
                    match r {
                        Ok(Err(e)) => return Err(e.into()),
                        Err(e) => return Err(StartError::Io(std::io::Error::other(format!("API loops: {e}")))),
                        Ok(Ok(())) => {}
                    }
                }
                // ---- end API server ----
                _ = shutdown.cancelled() => break,
            }
        }
        if let Some(t) = api_task {
            let _ = t.await;
        }
        // ---- server ----
        // Open connections (a follow, a long scrape) must not keep the
        // agent from stopping.
        if tokio::time::timeout(Duration::from_secs(5), servers.join()).await.is_err() {
            warn!("the kubelet API servers did not stop within 5s; leaving them");
        }
        debug_forwarder.abort();
        // ---- end server ----
        for t in tasks {
            let _ = t.await;
        }
        info!("swiftlet stopped");
        Ok(())
    }
}
