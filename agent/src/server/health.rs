//! /healthz: named checks, answered as the apiserver's healthz package
//! answers (`ok`; on failure a 500 listing `[+]name ok` / `[-]name failed:
//! reason withheld` and `healthz check failed`; `?verbose`; `?exclude=`;
//! `/healthz/<name>` for one check).
//!
//! The agent registers `ping` and `runtime` (the container runtime
//! unreachable for longer than a bound); the pod manager registers
//! `syncloop` (a [`Heartbeat`] its loop beats).
//!
//! Each evaluation of `/healthz` records every check it ran in the SLI
//! metrics served on /metrics/slis (component-base's `slis`):
//! `kubernetes_healthcheck{name,type}` (1 healthy, 0 not) and
//! `kubernetes_healthchecks_total{name,type,status}`, with type `healthz`.

use std::{
    fmt::Write as _,
    sync::Arc,
    time::{Duration, Instant},
};

use hyper::StatusCode;
use parking_lot::{Mutex, RwLock};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::cri::CriClient;

/// One health condition.
pub trait HealthCheck: Send + Sync {
    fn name(&self) -> &str;
    /// `Err(reason)` while unhealthy; the reason goes to the log, never to
    /// the (public) response.
    fn check(&self) -> Result<(), String>;
}

/// The registered checks, in registration order.
pub struct HealthChecks {
    checks: RwLock<Vec<Arc<dyn HealthCheck>>>,
    slis: SliMetrics,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    name: String,
    r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    name: String,
    r#type: String,
    status: String,
}

/// The health checks' SLI metrics (/metrics/slis).
#[derive(Clone, Default)]
pub struct SliMetrics {
    healthcheck: Family<CheckLabels, Gauge>,
    healthchecks: Family<ResultLabels, Counter>,
}

impl SliMetrics {
    /// A registry with the two families, as /metrics/slis serves them.
    pub fn registry(&self) -> Registry {
        let mut r = Registry::default();
        r.register(
            "kubernetes_healthcheck",
            "[BETA] This metric records the result of a single healthcheck",
            self.healthcheck.clone(),
        );
        r.register(
            "kubernetes_healthchecks",
            "[BETA] This metric records the results of all healthcheck",
            self.healthchecks.clone(),
        );
        r
    }

    fn observe(&self, name: &str, ok: bool) {
        let kind = "healthz".to_owned();
        self.healthcheck.get_or_create(&CheckLabels { name: name.into(), r#type: kind.clone() }).set(i64::from(ok));
        let status = if ok { "success" } else { "error" };
        self.healthchecks.get_or_create(&ResultLabels { name: name.into(), r#type: kind, status: status.into() }).inc();
    }
}

struct Ping;

impl HealthCheck for Ping {
    fn name(&self) -> &str {
        "ping"
    }

    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

impl Default for HealthChecks {
    fn default() -> Self {
        HealthChecks::new()
    }
}

impl HealthChecks {
    /// The set with `ping`.
    pub fn new() -> HealthChecks {
        HealthChecks { checks: RwLock::new(vec![Arc::new(Ping)]), slis: SliMetrics::default() }
    }

    /// The SLI metrics every `/healthz` evaluation records.
    pub fn slis(&self) -> &SliMetrics {
        &self.slis
    }

    /// Adds a check (replacing one of the same name).
    pub fn register(&self, check: Arc<dyn HealthCheck>) {
        let mut checks = self.checks.write();
        checks.retain(|c| c.name() != check.name());
        checks.push(check);
    }

    pub fn names(&self) -> Vec<String> {
        self.checks.read().iter().map(|c| c.name().to_owned()).collect()
    }

    /// Answers `/healthz` or `/healthz/<name>` with its query: the status
    /// and the body.
    pub fn answer(&self, path: &str, query: &[(String, String)]) -> (StatusCode, String) {
        let checks = self.checks.read().clone();
        let sub = path.strip_prefix("/healthz").unwrap_or(path).trim_start_matches('/');
        if !sub.is_empty() {
            return match checks.iter().find(|c| c.name() == sub) {
                Some(c) => match c.check() {
                    Ok(()) => (StatusCode::OK, "ok".into()),
                    Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("internal server error: {e}\n")),
                },
                None => (StatusCode::NOT_FOUND, "404 page not found\n".into()),
            };
        }
        let mut excluded: Vec<String> = query
            .iter()
            .filter(|(k, _)| k == "exclude")
            .flat_map(|(_, v)| v.split(',').map(|s| s.trim().to_owned()))
            .filter(|s| !s.is_empty())
            .collect();
        let verbose = query.iter().any(|(k, _)| k == "verbose");
        let mut out = String::new();
        let mut failed = vec![];
        for c in &checks {
            if let Some(i) = excluded.iter().position(|e| e == c.name()) {
                excluded.remove(i);
                let _ = writeln!(out, "[+]{} excluded: ok", c.name());
                continue;
            }
            let verdict = c.check();
            self.slis.observe(c.name(), verdict.is_ok());
            match verdict {
                Ok(()) => {
                    let _ = writeln!(out, "[+]{} ok", c.name());
                }
                Err(e) => {
                    let _ = writeln!(out, "[-]{} failed: reason withheld", c.name());
                    failed.push(format!("{}: {e}", c.name()));
                }
            }
        }
        if !excluded.is_empty() {
            let list: Vec<String> = excluded.iter().map(|e| format!("{e:?}")).collect();
            let _ = writeln!(out, "warn: some health checks cannot be excluded: no matches for {}", list.join(","));
        }
        if !failed.is_empty() {
            tracing::info!("healthz check failed: {}", failed.join("; "));
            return (StatusCode::INTERNAL_SERVER_ERROR, format!("{out}healthz check failed\n"));
        }
        if verbose { (StatusCode::OK, format!("{out}healthz check passed\n")) } else { (StatusCode::OK, "ok".into()) }
    }
}

/// How long the runtime may be unreachable before healthz fails: the
/// kubelet's PLEG relist threshold.
pub const RUNTIME_UNREACHABLE_BOUND: Duration = Duration::from_secs(180);

/// The verdict on the runtime's health at `now`.
pub fn runtime_verdict(down_since: Option<Instant>, now: Instant, bound: Duration) -> Result<(), String> {
    match down_since {
        Some(t) if now.saturating_duration_since(t) > bound => Err(format!(
            "the container runtime has been unreachable for {}s (bound {}s)",
            now.saturating_duration_since(t).as_secs(),
            bound.as_secs()
        )),
        _ => Ok(()),
    }
}

/// `runtime`: fails while the CRI runtime has been unreachable longer than
/// the bound.
pub struct RuntimeCheck {
    pub cri: Arc<CriClient>,
    pub bound: Duration,
}

impl HealthCheck for RuntimeCheck {
    fn name(&self) -> &str {
        "runtime"
    }

    fn check(&self) -> Result<(), String> {
        runtime_verdict(self.cri.health().down_since, Instant::now(), self.bound)
    }
}

/// A loop's liveness: the loop calls [`Heartbeat::beat`] each time round;
/// the check fails when the last beat is older than the bound (the
/// kubelet's `syncloop`: twice syncFrequency, at least 5 minutes).
pub struct Heartbeat {
    name: String,
    bound: Duration,
    last: Mutex<Option<Instant>>,
}

impl Heartbeat {
    pub fn new(name: impl Into<String>, bound: Duration) -> Heartbeat {
        Heartbeat { name: name.into(), bound, last: Mutex::new(None) }
    }

    /// The kubelet's sync-loop bound for a sync frequency.
    pub fn syncloop_bound(sync_frequency: Duration) -> Duration {
        (sync_frequency * 2).max(Duration::from_secs(300))
    }

    pub fn beat(&self) {
        *self.last.lock() = Some(Instant::now());
    }

    fn verdict(&self, now: Instant) -> Result<(), String> {
        match *self.last.lock() {
            // Not started yet: the kubelet does not fail before the first loop.
            None => Ok(()),
            Some(t) if now.saturating_duration_since(t) > self.bound => Err(format!(
                "{} last ran {}s ago (bound {}s)",
                self.name,
                now.saturating_duration_since(t).as_secs(),
                self.bound.as_secs()
            )),
            Some(_) => Ok(()),
        }
    }
}

impl HealthCheck for Heartbeat {
    fn name(&self) -> &str {
        &self.name
    }

    fn check(&self) -> Result<(), String> {
        self.verdict(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(&'static str, bool);

    impl HealthCheck for Fixed {
        fn name(&self) -> &str {
            self.0
        }

        fn check(&self) -> Result<(), String> {
            if self.1 { Ok(()) } else { Err("stuck".into()) }
        }
    }

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn answers_like_the_apiserver_healthz() {
        let h = HealthChecks::new();
        assert_eq!(h.answer("/healthz", &[]), (StatusCode::OK, "ok".into()));
        h.register(Arc::new(Fixed("syncloop", true)));
        assert_eq!(
            h.answer("/healthz", &q(&[("verbose", "")])),
            (StatusCode::OK, "[+]ping ok\n[+]syncloop ok\nhealthz check passed\n".into())
        );
        h.register(Arc::new(Fixed("syncloop", false)));
        assert_eq!(h.names(), vec!["ping", "syncloop"]);
        assert_eq!(
            h.answer("/healthz", &[]),
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "[+]ping ok\n[-]syncloop failed: reason withheld\nhealthz check failed\n".into()
            )
        );
        assert_eq!(
            h.answer("/healthz", &q(&[("exclude", "syncloop"), ("exclude", "nope")])),
            (StatusCode::OK, "ok".into())
        );
        assert_eq!(
            h.answer("/healthz", &q(&[("exclude", "syncloop,nope"), ("verbose", "1")])).1,
            "[+]ping ok\n[+]syncloop excluded: ok\nwarn: some health checks cannot be excluded: no matches for \"nope\"\nhealthz check passed\n"
        );
        assert_eq!(h.answer("/healthz/ping", &[]), (StatusCode::OK, "ok".into()));
        assert_eq!(
            h.answer("/healthz/syncloop", &[]),
            (StatusCode::INTERNAL_SERVER_ERROR, "internal server error: stuck\n".into())
        );
        assert_eq!(h.answer("/healthz/none", &[]).0, StatusCode::NOT_FOUND);
        // Every evaluated check was recorded for /metrics/slis.
        let text = crate::server::exposition::encode(&[&h.slis().registry()]);
        for want in [
            "kubernetes_healthcheck{name=\"ping\",type=\"healthz\"} 1",
            "kubernetes_healthcheck{name=\"syncloop\",type=\"healthz\"} 0",
            "kubernetes_healthchecks_total{name=\"syncloop\",type=\"healthz\",status=\"success\"} 1",
            "kubernetes_healthchecks_total{name=\"syncloop\",type=\"healthz\",status=\"error\"} 1",
            "# TYPE kubernetes_healthchecks_total counter",
        ] {
            assert!(text.lines().any(|l| l == want), "{want:?} missing:\n{text}");
        }
    }

    #[test]
    fn runtime_and_heartbeat_bounds() {
        let t0 = Instant::now();
        let bound = Duration::from_secs(180);
        assert!(runtime_verdict(None, t0, bound).is_ok());
        assert!(runtime_verdict(Some(t0), t0 + bound, bound).is_ok());
        let e = runtime_verdict(Some(t0), t0 + bound + Duration::from_secs(1), bound).unwrap_err();
        assert_eq!(e, "the container runtime has been unreachable for 181s (bound 180s)");

        assert_eq!(Heartbeat::syncloop_bound(Duration::from_secs(60)), Duration::from_secs(300));
        assert_eq!(Heartbeat::syncloop_bound(Duration::from_secs(600)), Duration::from_secs(1200));
        let hb = Heartbeat::new("syncloop", Duration::from_secs(300));
        assert!(hb.verdict(t0).is_ok(), "no beat yet is not a failure");
        hb.beat();
        let beat = hb.last.lock().unwrap();
        assert!(hb.verdict(beat + Duration::from_secs(300)).is_ok());
        assert!(hb.verdict(beat + Duration::from_secs(301)).unwrap_err().starts_with("syncloop last ran 301s ago"));
    }
}
