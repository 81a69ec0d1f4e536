//! The test CSI driver (`swiftlet-test-csi-driver`): Identity, Controller
//! and Node on the CSI v1 protos, backed by sparse image files attached to
//! loop devices with real ext4 or btrfs filesystems and real mounts, and the
//! kubelet's plugin registration as node-driver-registrar serves it.
//!
//! | module | concern |
//! |---|---|
//! | `config` | the command line |
//! | `control` | `<state>/calls.log` and the files a test steers it with |
//! | `loopdev` | loop devices and their image files (losetup, sysfs) |
//! | `filesystems` | ext4 and btrfs on them (blkid, mkfs, resize2fs, btrfs resize) |
//! | `mounts` | the mount table, mount and umount |
//! | `identity`, `controller`, `node` | the three CSI services |
//! | `registration` | pluginregistration v1 (GetInfo, NotifyRegistrationStatus) |
//!
//! Every call is logged, then delayed and failed as the test asked, then
//! run to completion on a blocking thread even when the caller gives up
//! (as a real driver finishes an operation whose RPC timed out), so a
//! cancelled call never leaves half a mount behind.

pub mod config;
pub mod control;
pub mod controller;
pub mod filesystems;
pub mod identity;
pub mod loopdev;
pub mod mounts;
pub mod node;
pub mod registration;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

pub use config::Config;
use control::Control;
use tonic::{Response, Status};

/// The volume context key holding a volume's image file.
pub const IMAGE_KEY: &str = "swiftlet.dev/image";
/// The publish context key ControllerPublishVolume sets (the node).
pub const ATTACHED_KEY: &str = "swiftlet.dev/attached";
/// The volume context key the kubelet sets on inline ephemeral volumes.
pub const EPHEMERAL_KEY: &str = "csi.storage.k8s.io/ephemeral";
/// ext4 needs some room, a mixed-block-group btrfs exactly this much: no
/// image is smaller.
pub const MIN_SIZE: u64 = 16 << 20;
const MIB: u64 = 1 << 20;

/// A failure of a host command or file operation.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot run {cmd}: {source}")]
    Spawn { cmd: String, source: std::io::Error },
    #[error("{cmd} failed ({status}): {stderr}")]
    Failed { cmd: String, status: String, stderr: String },
    #[error("{what} {}: {source}", path.display())]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
}

impl HostError {
    pub(crate) fn io(what: &'static str, path: &Path, source: std::io::Error) -> HostError {
        HostError::Io { what, path: path.to_owned(), source }
    }
}

impl From<HostError> for Status {
    fn from(e: HostError) -> Status {
        match &e {
            HostError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                Status::not_found(e.to_string())
            }
            _ => Status::internal(e.to_string()),
        }
    }
}

/// Runs a host command to completion; its stdout on success.
pub fn run(program: &str, args: &[&std::ffi::OsStr]) -> Result<String, HostError> {
    let cmd = || {
        let mut c = program.to_owned();
        for a in args {
            c.push(' ');
            c.push_str(&a.to_string_lossy());
        }
        c
    };
    let out = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| HostError::Spawn { cmd: cmd(), source })?;
    if !out.status.success() {
        return Err(HostError::Failed {
            cmd: cmd(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `bytes` rounded up to whole MiB, and at least [`MIN_SIZE`].
pub fn image_size(bytes: u64) -> u64 {
    bytes.div_ceil(MIB).saturating_mul(MIB).max(MIN_SIZE)
}

/// The driver's state, shared by its services.
#[derive(Clone)]
pub struct Driver {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    control: Control,
    /// Serialises the operations that change the host (attach, format,
    /// mount), as a driver's per-volume locks would, only coarser.
    exclusive: parking_lot::Mutex<()>,
}

impl Driver {
    pub fn new(config: Config) -> Driver {
        let control = Control::new(&config.state, &config.fail, &config.delay);
        Driver { inner: Arc::new(Inner { config, control, exclusive: parking_lot::Mutex::new(()) }) }
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub fn control(&self) -> &Control {
        &self.inner.control
    }

    /// Holds off other host-changing operations while it lives.
    pub fn exclusive(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.inner.exclusive.lock()
    }

    pub fn state(&self) -> &Path {
        &self.inner.config.state
    }

    /// The image of a volume the controller created.
    pub fn volume_image(&self, id: &str) -> PathBuf {
        self.state().join("volumes").join(format!("{id}.img"))
    }

    /// The image of an inline ephemeral volume.
    pub fn ephemeral_image(&self, id: &str) -> PathBuf {
        self.state().join("ephemeral").join(format!("{id}.img"))
    }

    /// One call: logged as `line`, delayed and failed as the test asked,
    /// then `op` on a blocking thread.
    pub async fn call<T, F>(&self, method: &str, line: String, op: F) -> Result<Response<T>, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Driver) -> Result<T, Status> + Send + 'static,
    {
        let control = self.control();
        control.log(&line);
        if let Some(delay) = control.delay(method) {
            tokio::time::sleep(delay).await;
        }
        if control.fails(method) {
            tracing::info!(method, "injected failure");
            return Err(Status::internal("injected failure"));
        }
        let me = self.clone();
        let method = method.to_owned();
        let result = tokio::task::spawn_blocking(move || op(&me))
            .await
            .map_err(|e| Status::internal(format!("{method} did not finish: {e}")))?;
        if let Err(s) = &result {
            tracing::warn!(method, code = ?s.code(), message = s.message(), "call failed");
        }
        result.map(Response::new)
    }
}

/// Checks a volume id names a file under the state dir and nothing else.
pub fn check_volume_id(id: &str) -> Result<(), Status> {
    if id.is_empty() {
        return Err(Status::invalid_argument("volume_id is required"));
    }
    if id == "." || id == ".." || id.contains('/') || id.contains('\0') {
        return Err(Status::invalid_argument(format!("volume_id {id:?} is not a valid file name")));
    }
    Ok(())
}

/// Checks a path from a request is set and absolute.
pub fn check_path(field: &str, path: &str) -> Result<PathBuf, Status> {
    if path.is_empty() {
        return Err(Status::invalid_argument(format!("{field} is required")));
    }
    let p = PathBuf::from(path);
    if !p.is_absolute() {
        return Err(Status::invalid_argument(format!("{field} {path:?} is not absolute")));
    }
    Ok(p)
}

/// `k=v` pairs sorted by key, comma-separated (the calls.log form).
pub fn sorted_pairs(map: &std::collections::HashMap<String, String>) -> String {
    let mut pairs: Vec<String> = map.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.sort();
    pairs.join(",")
}

/// Keys sorted, comma-separated (secrets are logged by key only).
pub fn sorted_keys(map: &std::collections::HashMap<String, String>) -> String {
    let mut keys: Vec<&str> = map.keys().map(String::as_str).collect();
    keys.sort_unstable();
    keys.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_size_rounds_up_to_mib_with_a_floor() {
        assert_eq!(image_size(0), MIN_SIZE);
        assert_eq!(image_size(20 << 20), 20 << 20);
        assert_eq!(image_size((20 << 20) + 1), 21 << 20);
        assert_eq!(image_size(1), MIN_SIZE);
        assert_eq!(image_size(i64::MAX as u64), 1 << 63);
    }

    #[test]
    fn volume_ids_stay_under_the_state_dir() {
        assert!(check_volume_id("pvc-1234").is_ok());
        for bad in ["", ".", "..", "a/b", "../x"] {
            assert_eq!(check_volume_id(bad).unwrap_err().code(), tonic::Code::InvalidArgument, "{bad:?}");
        }
    }

    #[test]
    fn pairs_and_keys_are_sorted() {
        let m: std::collections::HashMap<String, String> =
            [("b", "2"), ("a", "1"), ("c", "3")].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert_eq!(sorted_pairs(&m), "a=1,b=2,c=3");
        assert_eq!(sorted_keys(&m), "a,b,c");
        assert_eq!(sorted_pairs(&Default::default()), "");
    }
}
