//! A device plugin for the integration tests, speaking the v1beta1 API the
//! agent serves (the agent crate's generated types, client and server).
//!
//! `swiftlet-test-device-plugin --plugin-dir <dir> --state <dir>
//!  [--resource swiftlet.dev/fake] [--devices N] [--pre-start] [--version v1beta1]`
//!
//! - Devices `fake-0` … `fake-<N-1>`; each has a file `<state>/dev-<id>`
//!   ("fake device <id>") that Allocate mounts read-only at `/fake/<id>`,
//!   a device node `/dev/fake-<id>` (the host's /dev/null, rw), the
//!   environment `FAKE_DEVICES=<ids, comma-separated>` and the annotation
//!   `swiftlet.dev/fake-devices`.
//! - `<state>/unhealthy` (one id per line, re-read every 100 ms) lists the
//!   unhealthy devices; ListAndWatch sends the list again on every change.
//! - Serves on `<plugin-dir>/swiftlet-fake-<pid>.sock`, registers on
//!   `<plugin-dir>/kubelet.sock` once it exists, and when that socket is
//!   made again (an agent restart) serves anew and registers again.
//! - Appends what it was asked to `<state>/calls.log` (`registered`,
//!   `allocate <ids>`, `prestart <ids>`).
//! - A refused registration prints the agent's error and exits with 2.

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    pin::Pin,
    time::Duration,
};

use futures::Stream;
use hyper_util::rt::TokioIo;
use swiftlet::deviceplugin::api::{
    self, device_plugin_server::DevicePluginServer, registration_client::RegistrationClient,
};
use tokio::sync::watch;
use tonic::{
    Request, Response, Status,
    transport::{Endpoint, Uri},
};

struct Args {
    plugin_dir: PathBuf,
    state: PathBuf,
    resource: String,
    devices: usize,
    pre_start: bool,
    version: String,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        plugin_dir: PathBuf::new(),
        state: PathBuf::new(),
        resource: "swiftlet.dev/fake".into(),
        devices: 2,
        pre_start: false,
        version: swiftlet::deviceplugin::VERSION.into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--plugin-dir" => a.plugin_dir = value()?.into(),
            "--state" => a.state = value()?.into(),
            "--resource" => a.resource = value()?,
            "--devices" => a.devices = value()?.parse().map_err(|e| format!("--devices: {e}"))?,
            "--version" => a.version = value()?,
            "--pre-start" => a.pre_start = true,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.plugin_dir.as_os_str().is_empty() || a.state.as_os_str().is_empty() {
        return Err("--plugin-dir and --state are required".into());
    }
    Ok(a)
}

fn log_call(state: &Path, line: &str) {
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(state.join("calls.log")) {
        let _ = writeln!(f, "{line}");
    }
}

fn device_list(ids: &[String], state: &Path) -> Vec<api::Device> {
    let unhealthy = std::fs::read_to_string(state.join("unhealthy")).unwrap_or_default();
    let unhealthy: Vec<&str> = unhealthy.lines().map(str::trim).collect();
    ids.iter()
        .map(|id| api::Device {
            id: id.clone(),
            health: if unhealthy.contains(&id.as_str()) { "Unhealthy" } else { "Healthy" }.into(),
            topology: None,
        })
        .collect()
}

#[derive(Clone)]
struct Plugin {
    state: PathBuf,
    pre_start: bool,
    devices: watch::Receiver<Vec<api::Device>>,
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl api::device_plugin_server::DevicePlugin for Plugin {
    type ListAndWatchStream = DeviceStream;

    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(api::DevicePluginOptions {
            pre_start_required: self.pre_start,
            get_preferred_allocation_available: false,
        }))
    }

    async fn list_and_watch(&self, _: Request<api::Empty>) -> Result<Response<DeviceStream>, Status> {
        let rx = self.devices.clone();
        let stream = futures::stream::unfold((rx, true), |(mut rx, first)| async move {
            if !first && rx.changed().await.is_err() {
                return None;
            }
            let devices = rx.borrow_and_update().clone();
            Some((Ok(api::ListAndWatchResponse { devices }), (rx, false)))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("no preferred allocation"))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let mut out = api::AllocateResponse::default();
        for c in request.into_inner().container_requests {
            let ids = c.devices_ids.join(",");
            log_call(&self.state, &format!("allocate {ids}"));
            let mut r = api::ContainerAllocateResponse::default();
            r.envs.insert("FAKE_DEVICES".into(), ids.clone());
            r.annotations.insert("swiftlet.dev/fake-devices".into(), ids);
            for id in &c.devices_ids {
                r.mounts.push(api::Mount {
                    container_path: format!("/fake/{id}"),
                    host_path: self.state.join(format!("dev-{id}")).display().to_string(),
                    read_only: true,
                });
                r.devices.push(api::DeviceSpec {
                    container_path: format!("/dev/fake-{id}"),
                    host_path: "/dev/null".into(),
                    permissions: "rw".into(),
                });
            }
            out.container_responses.push(r);
        }
        Ok(Response::new(out))
    }

    async fn pre_start_container(
        &self,
        request: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        log_call(&self.state, &format!("prestart {}", request.into_inner().devices_ids.join(",")));
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

/// (device, inode) of the agent's registration socket.
fn socket_identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

async fn register(kubelet: &Path, args: &Args, endpoint: &str) -> Result<(), Status> {
    let path = kubelet.to_owned();
    let channel = Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { tokio::net::UnixStream::connect(&path).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    RegistrationClient::new(channel)
        .register(api::RegisterRequest {
            version: args.version.clone(),
            endpoint: endpoint.into(),
            resource_name: args.resource.clone(),
            options: Some(api::DevicePluginOptions {
                pre_start_required: args.pre_start,
                get_preferred_allocation_available: false,
            }),
        })
        .await
        .map(|_| ())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("swiftlet-test-device-plugin: {e}");
            std::process::exit(1);
        }
    };
    std::fs::create_dir_all(&args.state).expect("state dir");
    let ids: Vec<String> = (0..args.devices).map(|i| format!("fake-{i}")).collect();
    for id in &ids {
        std::fs::write(args.state.join(format!("dev-{id}")), format!("fake device {id}\n")).expect("device file");
    }
    let (devices_tx, devices_rx) = watch::channel(device_list(&ids, &args.state));
    let endpoint = format!("swiftlet-fake-{}.sock", std::process::id());
    let socket = args.plugin_dir.join(&endpoint);
    let kubelet = args.plugin_dir.join(swiftlet::deviceplugin::KUBELET_SOCKET);
    let plugin = Plugin { state: args.state.clone(), pre_start: args.pre_start, devices: devices_rx };
    loop {
        // Wait for the agent's socket.
        let agent = loop {
            if let Some(id) = socket_identity(&kubelet) {
                break id;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let _ = std::fs::remove_file(&socket);
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind the plugin socket");
        let (stop_tx, mut stop_rx) = watch::channel(false);
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(plugin.clone()))
                .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), async move {
                    let _ = stop_rx.wait_for(|s| *s).await;
                }),
        );
        match register(&kubelet, &args, &endpoint).await {
            Ok(()) => {
                eprintln!("registered {} on {}", args.resource, kubelet.display());
                log_call(&args.state, "registered");
            }
            Err(s) if s.code() == tonic::Code::InvalidArgument => {
                eprintln!("registration refused: {}", s.message());
                std::process::exit(2);
            }
            Err(s) => {
                eprintln!("registration failed ({s}); trying again");
                server.abort();
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        }
        // Health from the control file; a new agent socket means register again.
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = device_list(&ids, &args.state);
            devices_tx.send_if_modified(|d| {
                let changed = *d != now;
                *d = now;
                changed
            });
            if socket_identity(&kubelet) != Some(agent) || !socket.exists() {
                eprintln!("the agent's socket changed: registering again");
                break;
            }
        }
        // Open ListAndWatch streams never end by themselves: cut them.
        let _ = stop_tx.send(true);
        server.abort();
    }
}
