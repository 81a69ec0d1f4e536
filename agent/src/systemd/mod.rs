//! systemd and logind over D-Bus (zbus, on the agent's tokio runtime): the
//! edge the systemd cgroup driver (`cm::systemd`) and the graceful node
//! shutdown (`shutdown::logind`) stand on. What the properties are is pure
//! (`properties`); this module only sends them and waits for systemd's jobs.

pub mod properties;

use std::time::Duration;

use futures::StreamExt as _;
use thiserror::Error;
use zbus::{Connection, OwnedFd, OwnedObjectPath, Variant, proxy};

use self::properties::{Property, Value};

/// How long a unit job (start, stop) may take before we stop waiting: a
/// slice starts in milliseconds, stopping one waits for its scopes.
const JOB_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Debug, Error)]
pub enum SystemdError {
    #[error(
        "cannot reach systemd on the system bus ({0}); cgroupDriver systemd and the logind shutdown inhibitor need systemd as PID 1 with dbus running"
    )]
    Connect(#[source] zbus::Error),
    #[error("systemd {op} {unit}: {source}")]
    Call {
        op: &'static str,
        unit: String,
        #[source]
        source: zbus::Error,
    },
    #[error("systemd {op} {unit}: the job ended with `{result}`")]
    Job { op: &'static str, unit: String, result: String },
    #[error("systemd {op} {unit}: the job did not end within {0:?}", JOB_TIMEOUT)]
    Timeout { op: &'static str, unit: String },
    #[error("logind {op}: {source}")]
    Logind {
        op: &'static str,
        #[source]
        source: zbus::Error,
    },
}

pub type Result<T> = std::result::Result<T, SystemdError>;

#[proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1"
)]
trait Manager {
    fn subscribe(&self) -> zbus::Result<()>;

    fn start_transient_unit(
        &self,
        name: &str,
        mode: &str,
        properties: &[(&str, Variant<'_>)],
        aux: &[(&str, &[(&str, Variant<'_>)])],
    ) -> zbus::Result<OwnedObjectPath>;

    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

    fn set_unit_properties(&self, name: &str, runtime: bool, properties: &[(&str, Variant<'_>)]) -> zbus::Result<()>;

    fn reset_failed_unit(&self, name: &str) -> zbus::Result<()>;

    fn kill_unit(&self, name: &str, whom: &str, signal: i32) -> zbus::Result<()>;

    #[zbus(signal)]
    fn job_removed(&self, id: u32, job: OwnedObjectPath, unit: String, result: String) -> zbus::Result<()>;

    #[zbus(property)]
    fn version(&self) -> zbus::Result<String>;
}

#[proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1"
)]
trait Login {
    fn inhibit(&self, what: &str, who: &str, why: &str, mode: &str) -> zbus::Result<OwnedFd>;

    #[zbus(signal)]
    fn prepare_for_shutdown(&self, start: bool) -> zbus::Result<()>;

    #[zbus(property, name = "InhibitDelayMaxUSec")]
    fn inhibit_delay_max_usec(&self) -> zbus::Result<u64>;
}

fn variant(v: &Value) -> Variant<'static> {
    match v {
        Value::Bool(b) => Variant::from(*b),
        Value::U64(n) => Variant::from(*n),
        Value::Str(s) => Variant::from(s.clone()),
        Value::StrList(l) => Variant::from(l.clone()),
    }
}

/// How a StartTransientUnit ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Started {
    Created,
    /// The unit was already there (a restarted agent, or a slice systemd
    /// made implicitly for a scope): its properties were set instead.
    Existed,
}

/// systemd's manager on the system bus.
#[derive(Clone, Debug)]
pub struct Systemd {
    manager: ManagerProxy<'static>,
}

impl Systemd {
    /// Connects and subscribes to job signals (systemd sends them only to
    /// subscribers).
    pub async fn connect() -> Result<Systemd> {
        let conn = Connection::system().await.map_err(SystemdError::Connect)?;
        Systemd::on(&conn).await
    }

    pub async fn on(conn: &Connection) -> Result<Systemd> {
        let manager = ManagerProxy::new(conn).await.map_err(SystemdError::Connect)?;
        manager.subscribe().await.map_err(SystemdError::Connect)?;
        Ok(Systemd { manager })
    }

    /// systemd's version ("252.38-1~deb12u1" → 252).
    pub async fn version(&self) -> Result<u32> {
        let v = self.manager.version().await.map_err(|source| call("Version", "", source))?;
        Ok(v.split(|c: char| !c.is_ascii_digit()).next().and_then(|n| n.parse().ok()).unwrap_or(0))
    }

    /// Starts a transient unit with `props` and waits for its job; a unit
    /// that exists gets `props`' resource part instead (`existing`).
    pub async fn start_transient_unit(&self, unit: &str, props: &[Property], existing: &[Property]) -> Result<Started> {
        let args: Vec<(&str, Variant<'static>)> = props.iter().map(|(n, v)| (*n, variant(v))).collect();
        let mut jobs = self.job_signals("StartTransientUnit", unit).await?;
        match self.manager.start_transient_unit(unit, "replace", &args, &[]).await {
            Ok(job) => {
                wait_job(&mut jobs, &job, "StartTransientUnit", unit).await?;
                Ok(Started::Created)
            }
            Err(e) if is_dbus_error(&e, "org.freedesktop.systemd1.UnitExists") => {
                self.set_unit_properties(unit, existing).await?;
                Ok(Started::Existed)
            }
            Err(source) => Err(call("StartTransientUnit", unit, source)),
        }
    }

    /// Changes a unit's properties for this boot (`runtime`), as the
    /// kubelet's updates do.
    pub async fn set_unit_properties(&self, unit: &str, props: &[Property]) -> Result<()> {
        let args: Vec<(&str, Variant<'static>)> = props.iter().map(|(n, v)| (*n, variant(v))).collect();
        self.manager
            .set_unit_properties(unit, true, &args)
            .await
            .map_err(|source| call("SetUnitProperties", unit, source))
    }

    /// Stops a unit and waits for its job. A unit systemd does not know is
    /// already stopped. A failed unit is reset so its name can be reused.
    pub async fn stop_unit(&self, unit: &str) -> Result<()> {
        let mut jobs = self.job_signals("StopUnit", unit).await?;
        match self.manager.stop_unit(unit, "replace").await {
            Ok(job) => wait_job(&mut jobs, &job, "StopUnit", unit).await?,
            Err(e) if is_dbus_error(&e, "org.freedesktop.systemd1.NoSuchUnit") => {}
            Err(source) => return Err(call("StopUnit", unit, source)),
        }
        let _ = self.manager.reset_failed_unit(unit).await;
        Ok(())
    }

    /// Sends `signal` to `whom` (`main`, `all`) of a unit.
    pub async fn kill_unit(&self, unit: &str, whom: &str, signal: i32) -> Result<()> {
        self.manager.kill_unit(unit, whom, signal).await.map_err(|source| call("KillUnit", unit, source))
    }

    /// Job signals, subscribed before the call so none is missed.
    async fn job_signals(&self, op: &'static str, unit: &str) -> Result<JobRemovedStream> {
        self.manager.receive_job_removed().await.map_err(|source| call(op, unit, source))
    }
}

fn call(op: &'static str, unit: &str, source: zbus::Error) -> SystemdError {
    SystemdError::Call { op, unit: unit.to_owned(), source }
}

fn is_dbus_error(e: &zbus::Error, name: &str) -> bool {
    matches!(e, zbus::Error::MethodError(n, _, _) if n.as_str() == name)
}

/// Waits for `job` to be removed; its result must be `done`.
async fn wait_job(jobs: &mut JobRemovedStream, job: &OwnedObjectPath, op: &'static str, unit: &str) -> Result<()> {
    let wait = async {
        while let Some(signal) = jobs.next().await {
            let Ok(args) = signal.args() else { continue };
            if args.job.as_str() == job.as_str() {
                return Some(args.result.clone());
            }
        }
        None
    };
    match tokio::time::timeout(JOB_TIMEOUT, wait).await {
        Ok(Some(result)) if result == "done" => Ok(()),
        Ok(Some(result)) => Err(SystemdError::Job { op, unit: unit.to_owned(), result }),
        Ok(None) | Err(_) => Err(SystemdError::Timeout { op, unit: unit.to_owned() }),
    }
}

/// logind's manager on the system bus.
#[derive(Clone, Debug)]
pub struct Logind {
    login: LoginProxy<'static>,
}

/// A held inhibitor lock: released when dropped (the descriptor closes).
#[derive(Debug)]
pub struct InhibitLock(
    #[allow(dead_code, reason = "held for its descriptor, which releases the lock on close")] OwnedFd,
);

impl Logind {
    pub async fn connect() -> Result<Logind> {
        let conn = Connection::system().await.map_err(SystemdError::Connect)?;
        let login = LoginProxy::new(&conn).await.map_err(|source| SystemdError::Logind { op: "connect", source })?;
        Ok(Logind { login })
    }

    /// Takes a `delay` lock on `what` (`shutdown`): logind then waits, up
    /// to InhibitDelayMaxSec, for the lock to be released before it goes on.
    pub async fn inhibit_delay(&self, what: &str, who: &str, why: &str) -> Result<InhibitLock> {
        let fd = self
            .login
            .inhibit(what, who, why, "delay")
            .await
            .map_err(|source| SystemdError::Logind { op: "Inhibit", source })?;
        Ok(InhibitLock(fd))
    }

    /// logind's InhibitDelayMaxUSec: the longest a delay lock holds.
    pub async fn inhibit_delay_max(&self) -> Result<Duration> {
        let us = self
            .login
            .inhibit_delay_max_usec()
            .await
            .map_err(|source| SystemdError::Logind { op: "InhibitDelayMaxUSec", source })?;
        Ok(Duration::from_micros(us))
    }

    /// PrepareForShutdown signals: `true` when a shutdown starts, `false`
    /// when it was cancelled.
    pub async fn prepare_for_shutdown(&self) -> Result<impl futures::Stream<Item = bool> + Unpin + use<>> {
        let stream = self
            .login
            .receive_prepare_for_shutdown()
            .await
            .map_err(|source| SystemdError::Logind { op: "PrepareForShutdown", source })?;
        Ok(stream.filter_map(|s| std::future::ready(s.args().ok().map(|a| a.start))))
    }
}
