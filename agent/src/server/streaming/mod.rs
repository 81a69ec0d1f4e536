//! The kubelet's streaming endpoints on :10250: `/exec`, `/attach`,
//! `/portForward` and `/run`, each with a `{uid}` form.
//!
//! Where the protocols end: swiftlet ends the client's protocol itself
//! and speaks one protocol to the runtime. Clients come with SPDY/3.1
//! (remote command v1 to v5, `portforward.k8s.io`) or WebSocket
//! (`v5.channel.k8s.io` with its close signal, v4 and older channel
//! protocols, base64 variants, and port-forward as SPDY tunnelled in
//! binary messages); the runtime's stream server (whose URL CRI Exec,
//! Attach and PortForward return) is always spoken to as a SPDY client
//! with `v4.channel.k8s.io` or `portforward.k8s.io`. Ending both sides
//! here is what lets the agent see the session: it writes the exit code
//! in the client's own status format, ends the runtime stream and kills
//! the exec'd process when the client goes (see `reaper`), and enforces
//! streamingConnectionIdleTimeout on the data that moves.

pub mod bridge;
pub mod client;
pub mod portforward;
pub mod reaper;
pub mod request;
pub mod runtime;
pub mod status;
pub mod websocket;

use std::{
    sync::{Arc, OnceLock},
    time::Duration,
};

use hyper::{
    Request, Response, StatusCode,
    body::Incoming,
    header::{CONNECTION, HeaderValue, UPGRADE},
};
use k8s_openapi::api::core::v1::Pod;
use tracing::{debug, info};

use self::{
    client::ClientStreams,
    reaper::ExecTracker,
    request::{Kind, StreamRequest, Upgrade},
    status::Outcome,
};
use super::{
    Server,
    http::{self, Body},
    spdy::{Role, Session},
};
use crate::cri::{StreamingRuntime, api, labels};

/// How long a SPDY client has to open its streams (the kubelet's
/// streamCreationTimeout).
const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

/// The remote-command protocols accepted over SPDY, newest first.
const SPDY_REMOTE_COMMAND: &[&str] =
    &["v5.channel.k8s.io", "v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io"];
const SPDY_PORT_FORWARD: &[&str] = &["portforward.k8s.io"];

/// The streaming side of the server: the runtime's streaming calls (set
/// once the CRI client exists) and the exec processes being tracked.
#[derive(Default)]
pub struct Streaming {
    runtime: OnceLock<Arc<dyn StreamingRuntime>>,
    tracker: Arc<ExecTracker>,
}

impl Streaming {
    pub fn set_runtime(&self, rt: Arc<dyn StreamingRuntime>) {
        let _ = self.runtime.set(rt);
    }

    /// What a session task keeps after its request returned.
    fn handle(&self, runtime: Arc<dyn StreamingRuntime>) -> Handle {
        Handle { runtime, tracker: self.tracker.clone() }
    }
}

fn text(status: StatusCode, body: impl Into<bytes::Bytes>) -> Response<Body> {
    http::text(status, body)
}

fn spdy_version(protocol: &str) -> u8 {
    match protocol {
        "v5.channel.k8s.io" => 5,
        "v4.channel.k8s.io" => 4,
        "v3.channel.k8s.io" => 3,
        "v2.channel.k8s.io" => 2,
        _ => 1,
    }
}

/// The running container `name` of `pod` (regular, init or ephemeral).
fn running_container_id(pod: &Pod, name: &str) -> Option<String> {
    let s = pod.status.as_ref()?;
    let all = s
        .container_statuses
        .iter()
        .flatten()
        .chain(s.init_container_statuses.iter().flatten())
        .chain(s.ephemeral_container_statuses.iter().flatten());
    all.filter(|c| c.name == name && c.state.as_ref().is_some_and(|st| st.running.is_some()))
        .find_map(|c| c.container_id.as_deref())
        .map(|id| id.split_once("://").map_or(id, |(_, i)| i).to_owned())
}

fn find_pod(server: &Server, r: &StreamRequest) -> Option<Pod> {
    server.pods.pods().into_iter().find(|p| {
        p.metadata.namespace.as_deref().unwrap_or("default") == r.namespace
            && p.metadata.name.as_deref() == Some(r.pod.as_str())
    })
}

/// Serves a request on a streaming path (authorization already done).
pub async fn serve(server: &Server, mut req: Request<Incoming>) -> Response<Body> {
    let query = http::query_pairs(req.uri().query());
    let r = match request::parse(req.method(), req.uri().path(), &query) {
        Ok(r) => r,
        Err((status, body)) => return text(status, body),
    };
    let Some(pod) = find_pod(server, &r) else {
        return text(StatusCode::NOT_FOUND, "pod does not exist");
    };
    if r.uid.as_deref().is_some_and(|u| Some(u) != pod.metadata.uid.as_deref()) {
        return text(StatusCode::NOT_FOUND, "pod not found");
    }
    let what = format!("{} {}/{}", r.kind.name(), r.namespace, r.pod);
    let idle = server.config.kubelet.streaming_connection_idle_timeout;
    if r.kind == Kind::Run {
        return run(server, &pod, &r).await;
    }
    let Some(rt) = server.streaming.runtime.get().cloned() else {
        return text(StatusCode::SERVICE_UNAVAILABLE, "no container runtime to stream from");
    };
    let upgrade = request::upgrade(req.headers());
    // The runtime prepares the session first: its errors are answered
    // before the upgrade, as the kubelet's proxy answers them.
    let (url, container_id) = match prepare(server, rt.as_ref(), &pod, &r).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    match upgrade {
        Upgrade::None => text(StatusCode::BAD_REQUEST, "Upgrade request required"),
        Upgrade::Spdy(offered) => {
            let supported = if r.kind == Kind::PortForward { SPDY_PORT_FORWARD } else { SPDY_REMOTE_COMMAND };
            let Some(protocol) = request::negotiate(&offered, supported) else {
                let mut resp = text(
                    StatusCode::FORBIDDEN,
                    format!(
                        "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server accepts {supported:?}"
                    ),
                );
                for p in supported {
                    resp.headers_mut().append("x-accepted-stream-protocol-versions", HeaderValue::from_static(p));
                }
                return resp;
            };
            let streaming = server.streaming.handle(rt.clone());
            info!("{what}: SPDY/3.1 {protocol}");
            tokio::spawn(async move {
                let Ok(upgraded) = on_upgrade.await else { return };
                let (session, incoming) = Session::start(hyper_util::rt::TokioIo::new(upgraded), Role::Server);
                if r.kind == Kind::PortForward {
                    portforward::serve(session, incoming, url, idle, what).await;
                    return;
                }
                let version = spdy_version(protocol);
                match ClientStreams::from_spdy(session.clone(), incoming, r.options, version, STREAM_CREATION_TIMEOUT)
                    .await
                {
                    Ok(client) => remote_command(streaming, client, r, url, container_id, idle, what).await,
                    Err(e) => {
                        info!("{what}: {e}");
                        session.close().await;
                    }
                }
            });
            let mut resp = switching("SPDY/3.1");
            resp.headers_mut().insert("x-stream-protocol-version", HeaderValue::from_static(protocol));
            resp
        }
        Upgrade::WebSocket { key, protocols } => {
            let tunnel = r.kind == Kind::PortForward && protocols.iter().any(|p| p == websocket::PORT_FORWARD_TUNNEL);
            if r.kind == Kind::PortForward && !tunnel {
                return legacy_port_forward(server, on_upgrade, &key, &protocols, r, url, what);
            }
            let chosen: Option<Option<websocket::ChannelProtocol>> =
                if tunnel { Some(None) } else { websocket::choose(&protocols) };
            let Some(channel_protocol) = chosen else {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("unable to upgrade: the requested protocol(s) {protocols:?} are not supported"),
                );
            };
            let name = if tunnel { Some(websocket::PORT_FORWARD_TUNNEL) } else { channel_protocol.map(|p| p.name) };
            let streaming = server.streaming.handle(rt.clone());
            info!("{what}: WebSocket {}", name.unwrap_or("(no subprotocol)"));
            tokio::spawn(async move {
                let Ok(upgraded) = on_upgrade.await else { return };
                let ws = websocket::websocket(upgraded).await;
                if tunnel {
                    let io = websocket::tunnel(ws);
                    let (session, incoming) = Session::start(io, Role::Server);
                    portforward::serve(session, incoming, url, idle, what).await;
                    return;
                }
                let version = channel_protocol.map_or(1, |p| p.version);
                let ch = websocket::channels(ws, channel_protocol);
                // An empty message on the lowest writable channel tells
                // the client the connection is up (as the kubelet does).
                let first = if r.options.stdout {
                    websocket::CHANNEL_STDOUT
                } else if r.options.stderr {
                    websocket::CHANNEL_STDERR
                } else {
                    websocket::CHANNEL_ERROR
                };
                let _ = ch.out.send(websocket::WsOut::Data(first, bytes::Bytes::new())).await;
                let client = ClientStreams::from_websocket(ch, r.options, version);
                remote_command(streaming, client, r, url, container_id, idle, what).await;
            });
            let mut resp = switching("websocket");
            if let Ok(v) = HeaderValue::from_str(&websocket::accept_key(&key)) {
                resp.headers_mut().insert("sec-websocket-accept", v);
            }
            if let Some(n) = name {
                resp.headers_mut().insert("sec-websocket-protocol", HeaderValue::from_static(n));
            }
            resp
        }
    }
}

/// Port-forward over WebSocket without the SPDY tunnel (the kubelet's
/// older protocol: channels per `port` parameter).
fn legacy_port_forward(
    server: &Server,
    on_upgrade: hyper::upgrade::OnUpgrade,
    key: &str,
    offered: &[String],
    r: StreamRequest,
    url: String,
    what: String,
) -> Response<Body> {
    let chosen = if offered.is_empty() {
        Some(None)
    } else {
        offered.iter().find_map(|o| websocket::PORT_FORWARD.iter().find(|p| p.name == o.as_str())).map(|p| Some(*p))
    };
    let Some(protocol) = chosen else {
        return text(
            StatusCode::BAD_REQUEST,
            format!("unable to upgrade: the requested protocol(s) {offered:?} are not supported"),
        );
    };
    if r.ports.is_empty() {
        return text(StatusCode::BAD_REQUEST, "query parameter \"port\" is required");
    }
    let idle = server.config.kubelet.streaming_connection_idle_timeout;
    info!("{what}: WebSocket {} ({} port(s))", protocol.map_or("(no subprotocol)", |p| p.name), r.ports.len());
    let codec = protocol.map_or(websocket::Codec::Binary, |p| p.codec);
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else { return };
        let ws = websocket::websocket(upgraded).await;
        let mux = websocket::mux(ws, codec, 2 * r.ports.len());
        portforward::serve_websocket(mux, r.ports, url, idle, what).await;
    });
    let mut resp = switching("websocket");
    if let Ok(v) = HeaderValue::from_str(&websocket::accept_key(key)) {
        resp.headers_mut().insert("sec-websocket-accept", v);
    }
    if let Some(p) = protocol {
        resp.headers_mut().insert("sec-websocket-protocol", HeaderValue::from_static(p.name));
    }
    resp
}

fn switching(protocol: &'static str) -> Response<Body> {
    let mut resp = Response::new(http::full(bytes::Bytes::new()));
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    resp.headers_mut().insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    resp.headers_mut().insert(UPGRADE, HeaderValue::from_static(protocol));
    resp
}

/// The runtime and tracker a session task holds.
#[derive(Clone)]
struct Handle {
    runtime: Arc<dyn StreamingRuntime>,
    tracker: Arc<ExecTracker>,
}

/// Asks the runtime for the session's URL. Returns it and the container
/// id (empty for port-forward).
async fn prepare(
    server: &Server,
    rt: &dyn StreamingRuntime,
    pod: &Pod,
    r: &StreamRequest,
) -> Result<(String, String), Response<Body>> {
    let runtime_error = |e: crate::cri::CriError| {
        let status = if e.is_not_found() { StatusCode::NOT_FOUND } else { StatusCode::INTERNAL_SERVER_ERROR };
        text(status, e.message())
    };
    if r.kind == Kind::PortForward {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let Some(cri) = &server.runtime else {
            return Err(text(StatusCode::SERVICE_UNAVAILABLE, "no container runtime"));
        };
        let mut sel = labels::managed_selector();
        sel.insert(labels::POD_UID.into(), uid);
        let filter = api::PodSandboxFilter { label_selector: sel, ..Default::default() };
        let sandboxes = cri.list_pod_sandbox(Some(filter)).await.map_err(runtime_error)?;
        let Some(sb) = sandboxes.iter().find(|s| crate::cri::sandbox_ready(s.state)) else {
            return Err(text(StatusCode::NOT_FOUND, "pod sandbox not found or not ready"));
        };
        let ports = r.ports.iter().map(|p| i32::from(*p)).collect();
        let url = rt.port_forward(&sb.id, ports).await.map_err(runtime_error)?;
        return Ok((url, String::new()));
    }
    let name = r.container.as_deref().unwrap_or_default();
    let Some(id) = running_container_id(pod, name) else {
        return Err(text(StatusCode::NOT_FOUND, format!("container not found ({name:?})")));
    };
    let o = r.options;
    let url = if r.kind == Kind::Exec {
        let req = api::ExecRequest {
            container_id: id.clone(),
            cmd: r.command.clone(),
            tty: o.tty,
            stdin: o.stdin,
            stdout: o.stdout,
            stderr: o.stderr,
        };
        rt.exec(req).await.map_err(runtime_error)?
    } else {
        let req = api::AttachRequest {
            container_id: id.clone(),
            stdin: o.stdin,
            tty: o.tty,
            stdout: o.stdout,
            stderr: o.stderr,
        };
        rt.attach(req).await.map_err(runtime_error)?
    };
    Ok((url, id))
}

/// Connects to the runtime and runs the session; an exec's process is
/// claimed as it starts (see `reaper`).
async fn remote_command(
    h: Handle,
    client: ClientStreams,
    r: StreamRequest,
    url: String,
    container_id: String,
    idle: Duration,
    what: String,
) {
    let start = match r.kind {
        Kind::Exec => match h.runtime.container_pid(&container_id).await {
            Ok(Some(pid)) => h.tracker.begin(&container_id, pid).await,
            _ => None,
        },
        _ => None,
    };
    let runtime = match runtime::remote_command(&url, r.options).await {
        Ok(rt) => rt,
        Err(e) => {
            info!("{what}: {e}");
            client.sink.finish(&Outcome::Error(e.to_string()), client.version).await;
            return;
        }
    };
    let exec = match start {
        Some(s) => {
            let ended = runtime.session.clone();
            s.claim(async move { ended.ended().await }).await
        }
        None => None,
    };
    debug!("{what}: streaming (exec process {:?})", exec.as_ref().map(|e| e.pid));
    bridge::run(client, runtime, idle, exec, &what).await;
}

/// `POST /run/...`: the command's output (stdout, then stderr), as the
/// kubelet's RunInContainer.
async fn run(server: &Server, pod: &Pod, r: &StreamRequest) -> Response<Body> {
    let name = r.container.as_deref().unwrap_or_default();
    let Some(id) = running_container_id(pod, name) else {
        return text(StatusCode::INTERNAL_SERVER_ERROR, format!("container not found ({name:?})"));
    };
    let Some(cri) = &server.runtime else {
        return text(StatusCode::SERVICE_UNAVAILABLE, "no container runtime");
    };
    match cri.exec_sync(&id, r.command.clone(), Duration::ZERO).await {
        Ok(out) if out.exit_code == 0 => {
            let mut body = out.stdout;
            body.extend_from_slice(&out.stderr);
            http::respond(StatusCode::OK, "application/json", body)
        }
        Ok(out) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "command '{}' exited with {}: {}",
                r.command.join(" "),
                out.exit_code,
                String::from_utf8_lossy(&out.stderr)
            ),
        ),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, ContainerStatus, PodStatus};

    use super::*;

    #[test]
    fn only_running_containers_are_streamed_to() {
        let cs = |name: &str, running: bool, id: &str| ContainerStatus {
            name: name.into(),
            container_id: Some(format!("containerd://{id}")),
            state: Some(ContainerState { running: running.then(ContainerStateRunning::default), ..Default::default() }),
            ..Default::default()
        };
        let pod = Pod {
            status: Some(PodStatus {
                container_statuses: Some(vec![cs("app", true, "a1"), cs("done", false, "d1")]),
                ephemeral_container_statuses: Some(vec![cs("debugger", true, "e1")]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(running_container_id(&pod, "app").as_deref(), Some("a1"));
        assert_eq!(running_container_id(&pod, "debugger").as_deref(), Some("e1"));
        assert_eq!(running_container_id(&pod, "done"), None);
        assert_eq!(running_container_id(&pod, "nope"), None);
        assert_eq!(spdy_version("v5.channel.k8s.io"), 5);
        assert_eq!(spdy_version("channel.k8s.io"), 1);
    }
}
