//! The CSI drivers' Controller services the controllers call: which
//! driver listens where, a call with its deadline and its error as the Go
//! sidecars print it (`rpc error: code = Internal desc = …`), and the
//! volume capabilities and secrets the sidecars send.

use std::{
    collections::{BTreeMap, HashMap},
    future::Future,
    path::{Path, PathBuf},
    sync::RwLock,
    time::Duration,
};

use base64::Engine;
use serde_json::Value;
use swiftlet::volumes::csi::api::{
    VolumeCapability, controller_client::ControllerClient, volume_capability, volume_capability::access_mode::Mode,
};
use tonic::transport::Channel;

use super::objects::{access_modes, s, strings_at, volume_mode};
use crate::apiserver::{resources::SECRETS, store::Store};

/// How long one driver call may take (the sidecars' --timeout).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Driver name → its controller socket.
#[derive(Default)]
pub struct Drivers(RwLock<BTreeMap<String, PathBuf>>);

impl Drivers {
    pub fn add(&self, driver: &str, socket: &Path) {
        self.0.write().unwrap_or_else(|p| p.into_inner()).insert(driver.to_owned(), socket.to_owned());
    }

    pub fn socket(&self, driver: &str) -> Option<PathBuf> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).get(driver).cloned()
    }

    pub fn has(&self, driver: &str) -> bool {
        self.0.read().unwrap_or_else(|p| p.into_inner()).contains_key(driver)
    }
}

/// A gRPC status as Go's grpc prints it.
pub fn rpc_error(status: &tonic::Status) -> String {
    let code = match status.code() {
        tonic::Code::Ok => "OK".to_owned(),
        tonic::Code::Cancelled => "Canceled".to_owned(),
        c => format!("{c:?}"),
    };
    format!("rpc error: code = {code} desc = {}", status.message())
}

/// Dials `driver`'s controller socket.
pub async fn dial(drivers: &Drivers, driver: &str) -> Result<ControllerClient<Channel>, String> {
    let socket = drivers.socket(driver).ok_or_else(|| format!("CSI driver {driver} is not registered"))?;
    let channel = swiftlet::grpc::dial_unix(&socket, CALL_TIMEOUT, &format!("CSI driver {driver}"))
        .await
        .map_err(|e| format!("rpc error: code = Unavailable desc = connection error: {e}"))?;
    Ok(ControllerClient::new(channel))
}

/// One call with the sidecars' deadline.
pub async fn call<T>(f: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>) -> Result<T, String> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(status)) => Err(rpc_error(&status)),
        Err(_) => Err("rpc error: code = DeadlineExceeded desc = context deadline exceeded".into()),
    }
}

/// A Kubernetes access mode as the external-provisioner maps it (one
/// capability per mode of the claim).
pub fn mode_of(access_mode: &str) -> Mode {
    match access_mode {
        "ReadWriteMany" => Mode::MultiNodeMultiWriter,
        "ReadOnlyMany" => Mode::MultiNodeReaderOnly,
        _ => Mode::SingleNodeWriter,
    }
}

/// The one access mode csi-lib-utils picks for a PV's access modes
/// (ControllerPublish, ControllerExpand).
pub fn pv_mode(modes: &[String]) -> Mode {
    let has = |m: &str| modes.iter().any(|x| x == m);
    if has("ReadWriteMany") || (has("ReadOnlyMany") && has("ReadWriteOnce")) {
        Mode::MultiNodeMultiWriter
    } else if has("ReadOnlyMany") {
        Mode::MultiNodeReaderOnly
    } else {
        Mode::SingleNodeWriter
    }
}

pub fn capability(block: bool, fs_type: &str, mount_flags: Vec<String>, mode: Mode) -> VolumeCapability {
    let access_type = if block {
        volume_capability::AccessType::Block(volume_capability::BlockVolume {})
    } else {
        volume_capability::AccessType::Mount(volume_capability::MountVolume {
            fs_type: fs_type.to_owned(),
            mount_flags,
            volume_mount_group: String::new(),
        })
    };
    VolumeCapability {
        access_type: Some(access_type),
        access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
    }
}

/// The capability of a CSI PV (what the external-attacher and -resizer send).
pub fn pv_capability(pv: &Value) -> VolumeCapability {
    let flags = strings_at(pv, "/spec/mountOptions");
    capability(
        volume_mode(pv) == "Block",
        s(pv, "/spec/csi/fsType"),
        flags,
        pv_mode(&access_modes(pv, "/spec/accessModes")),
    )
}

/// The data of the Secret a `{name, namespace}` reference names, for a
/// request's `secrets`.
pub fn secret_data(store: &Store, reference: Option<&Value>) -> Result<HashMap<String, String>, String> {
    let Some(r) = reference.filter(|r| r.is_object()) else { return Ok(HashMap::new()) };
    let (ns, name) = (s(r, "/namespace"), s(r, "/name"));
    let secret = store.get(&SECRETS, ns, name).map_err(|_| format!("secrets \"{name}\" not found"))?;
    let mut out = HashMap::new();
    for (k, v) in secret.get("data").and_then(Value::as_object).into_iter().flatten() {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or(""))
            .map_err(|e| format!("secret {ns}/{name}: key {k}: {e}"))?;
        out.insert(k.clone(), String::from_utf8_lossy(&raw).into_owned());
    }
    for (k, v) in secret.get("stringData").and_then(Value::as_object).into_iter().flatten() {
        out.insert(k.clone(), v.as_str().unwrap_or("").to_owned());
    }
    Ok(out)
}
