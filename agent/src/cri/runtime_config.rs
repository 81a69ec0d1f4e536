//! The cgroup driver the runtime uses, asked through the CRI RuntimeConfig
//! call, as the kubelet does at start since 1.31 (KubeletCgroupDriverFromCRI,
//! on by default): when the runtime answers, its driver wins over
//! `cgroupDriver` in the configuration (the two must agree, and the runtime
//! is the one that creates the containers' cgroups); a runtime without the
//! call (containerd before 2.0 answers Unimplemented) leaves the configured
//! driver in place.

use std::time::Duration;

use super::{CriError, RuntimeService, api};

/// The kubelet asks up to three times, 2 s apart, for a runtime that is
/// still starting.
const ATTEMPTS: usize = 3;
pub const RETRY_DELAY: Duration = Duration::from_secs(2);

/// Why the runtime's driver could not be learned.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DriverError {
    #[error("RuntimeConfig failed {ATTEMPTS} times: {0}")]
    Failed(CriError),
    #[error("the runtime returned an unknown cgroup driver {0}")]
    Unknown(i32),
}

/// The runtime's cgroup driver; None when the runtime does not implement
/// RuntimeConfig or has no Linux configuration to tell (then the configured
/// driver is used, as the kubelet falls back to it). Errors other than
/// Unimplemented are retried `ATTEMPTS` times, `retry_delay` apart.
pub async fn cgroup_driver(
    rt: &dyn RuntimeService,
    retry_delay: Duration,
) -> Result<Option<api::CgroupDriver>, DriverError> {
    let mut last = None;
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(retry_delay).await;
        }
        match rt.runtime_config().await {
            Ok(resp) => return driver_of(&resp),
            Err(e) if e.code() == Some(tonic::Code::Unimplemented) => return Ok(None),
            Err(e) => last = Some(e),
        }
    }
    Err(DriverError::Failed(last.unwrap_or(CriError::Status {
        call: "RuntimeConfig",
        code: tonic::Code::Unknown,
        message: "no attempt made".into(),
    })))
}

fn driver_of(resp: &api::RuntimeConfigResponse) -> Result<Option<api::CgroupDriver>, DriverError> {
    // An absent Linux section would read as SYSTEMD (the enum's zero), which
    // the runtime did not say.
    let Some(linux) = &resp.linux else { return Ok(None) };
    api::CgroupDriver::try_from(linux.cgroup_driver).map(Some).map_err(|_| DriverError::Unknown(linux.cgroup_driver))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::fake::{FakeRuntime, Fault, Method};

    fn answer(driver: Option<i32>) -> api::RuntimeConfigResponse {
        api::RuntimeConfigResponse { linux: driver.map(|d| api::LinuxRuntimeConfiguration { cgroup_driver: d }) }
    }

    #[test]
    fn the_runtimes_answer_names_the_driver() {
        assert_eq!(driver_of(&answer(Some(api::CgroupDriver::Systemd as i32))), Ok(Some(api::CgroupDriver::Systemd)));
        assert_eq!(driver_of(&answer(Some(api::CgroupDriver::Cgroupfs as i32))), Ok(Some(api::CgroupDriver::Cgroupfs)));
        assert_eq!(driver_of(&answer(None)), Ok(None), "no Linux section: the configured driver");
        assert_eq!(driver_of(&answer(Some(7))), Err(DriverError::Unknown(7)));
    }

    #[tokio::test]
    async fn unimplemented_falls_back_and_other_errors_are_retried() {
        let rt = FakeRuntime::new();
        // The fake answers Unimplemented, as containerd 1.x does, until told otherwise.
        assert_eq!(cgroup_driver(&rt, Duration::ZERO).await, Ok(None));
        assert_eq!(rt.count(Method::RuntimeConfig), 1, "Unimplemented is not retried");
        rt.set_runtime_config(Some(answer(Some(api::CgroupDriver::Cgroupfs as i32))));
        assert_eq!(cgroup_driver(&rt, Duration::ZERO).await, Ok(Some(api::CgroupDriver::Cgroupfs)));
        // A runtime still starting: asked again, and its answer taken.
        rt.fail(Fault::new(Method::RuntimeConfig, tonic::Code::Unavailable, "starting").once());
        assert_eq!(cgroup_driver(&rt, Duration::ZERO).await, Ok(Some(api::CgroupDriver::Cgroupfs)));
        assert_eq!(rt.count(Method::RuntimeConfig), 4);
        rt.fail(Fault::new(Method::RuntimeConfig, tonic::Code::Unavailable, "down"));
        assert!(matches!(cgroup_driver(&rt, Duration::ZERO).await, Err(DriverError::Failed(_))));
        assert_eq!(rt.count(Method::RuntimeConfig), 4 + ATTEMPTS, "three attempts for a runtime that fails");
    }
}
