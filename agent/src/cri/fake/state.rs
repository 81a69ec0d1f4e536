//! The fake's mechanics: ids and image lookup, faults taken as scripted,
//! the clock that maps tokio time to CRI timestamps, scripted exits applied
//! lazily, the gate every call passes (log, fault, latency, concurrency),
//! and the views CRI lists return.

use std::collections::HashMap;

use tokio::time::Instant;

use super::{Behavior, Call, FakeContainer, FakeImage, FakeRuntime, Method, State, Times, err, normalize};
use crate::cri::{CriError, Result, api};

impl State {
    pub(super) fn new_id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}{:04}", self.next_id)
    }

    pub(super) fn find_image(&self, name: &str) -> Option<usize> {
        if name.is_empty() {
            return None;
        }
        let normalized = normalize(name);
        if let Some(i) = self.images.iter().position(|i| i.id == name || i.tags.contains(&normalized)) {
            return Some(i);
        }
        // A unique prefix of an id (with or without "sha256:"), as
        // containerd resolves short ids; an ambiguous one is an error
        // the caller reports.
        let hex = name.strip_prefix("sha256:").unwrap_or(name);
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut hits = self.images.iter().enumerate().filter(|(_, i)| i.id["sha256:".len()..].starts_with(hex));
        match (hits.next(), hits.next()) {
            (Some((i, _)), None) => Some(i),
            _ => None,
        }
    }

    pub(super) fn ambiguous(&self, name: &str) -> bool {
        let hex = name.strip_prefix("sha256:").unwrap_or(name);
        !hex.is_empty()
            && hex.bytes().all(|b| b.is_ascii_hexdigit())
            && self.images.iter().filter(|i| i.id["sha256:".len()..].starts_with(hex)).count() > 1
    }

    pub(super) fn take_fault(&mut self, method: Method, targets: &[&str]) -> Option<CriError> {
        let pos = self.faults.iter().position(|f| {
            f.method == method
                && f.times != Times::Remaining(0)
                && f.target.as_deref().is_none_or(|t| targets.iter().any(|x| *x == t || normalize(x) == normalize(t)))
        })?;
        let f = &mut self.faults[pos];
        if let Times::Remaining(n) = &mut f.times {
            *n -= 1;
        }
        Some(err(method, f.code, f.message.clone()))
    }
}

impl FakeRuntime {
    pub(super) fn now_ns(&self) -> i64 {
        self.base_wall_ns + Instant::now().saturating_duration_since(self.base_instant).as_nanos() as i64
    }

    pub(super) fn ns_at(&self, at: Instant) -> i64 {
        self.base_wall_ns + at.saturating_duration_since(self.base_instant).as_nanos() as i64
    }

    /// Applies scripted exits whose time has come.
    pub(super) fn refresh(&self) {
        let now = Instant::now();
        let mut s = self.state.lock();
        for c in s.containers.values_mut() {
            if c.state != api::ContainerState::ContainerRunning {
                continue;
            }
            if let Some(at) = c.exit_at
                && at <= now
            {
                let (code, reason) = match &c.behavior {
                    Behavior::OomKill { .. } => (137, "OOMKilled"),
                    Behavior::Exit { code, .. } => (*code, ""),
                    _ => continue,
                };
                let at_ns = self.ns_at(at);
                finish(c, at_ns, code, reason);
            }
        }
    }

    /// Records the call, applies latency and faults. Returns a guard that
    /// keeps the call counted as in flight.
    pub(super) async fn enter(&self, method: Method, target: &str, extra_targets: &[&str]) -> Result<InFlight<'_>> {
        let latency = {
            let mut s = self.state.lock();
            s.calls.push(Call { method, target: target.to_owned() });
            let n = s.in_flight.entry(method).or_default();
            *n += 1;
            let n = *n;
            let m = s.max_in_flight.entry(method).or_default();
            *m = (*m).max(n);
            s.latency.get(&method).copied()
        };
        let guard = InFlight { rt: self, method };
        if let Some(d) = latency {
            tokio::time::sleep(d).await;
        }
        self.refresh();
        let mut targets = vec![target];
        targets.extend_from_slice(extra_targets);
        if let Some(e) = self.state.lock().take_fault(method, &targets) {
            return Err(e);
        }
        Ok(guard)
    }

    pub(super) fn container_name(&self, id: &str) -> String {
        self.state.lock().containers.get(id).map(|c| c.name().to_owned()).unwrap_or_default()
    }
}

pub(super) struct InFlight<'a> {
    rt: &'a FakeRuntime,
    method: Method,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(n) = self.rt.state.lock().in_flight.get_mut(&self.method) {
            *n = n.saturating_sub(1);
        }
    }
}

pub(super) fn finish(c: &mut FakeContainer, at_ns: i64, code: i32, reason: &str) {
    c.state = api::ContainerState::ContainerExited;
    c.finished_at = at_ns;
    c.exit_code = code;
    c.reason = if !reason.is_empty() {
        reason.to_owned()
    } else if code == 0 {
        "Completed".into()
    } else {
        "Error".into()
    };
    c.exit_at = None;
}

pub(super) fn labels_match(selector: &HashMap<String, String>, labels: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

pub(super) fn container_view(c: &FakeContainer) -> api::Container {
    api::Container {
        id: c.id.clone(),
        pod_sandbox_id: c.sandbox_id.clone(),
        metadata: c.config.metadata.clone(),
        image: c.config.image.clone(),
        image_ref: c.image_ref.clone(),
        state: c.state as i32,
        created_at: c.created_at,
        labels: c.config.labels.clone(),
        annotations: c.config.annotations.clone(),
        image_id: c.image_ref.clone(),
    }
}

pub(super) fn image_view(i: &FakeImage) -> api::Image {
    api::Image { id: i.id.clone(), repo_tags: i.tags.clone(), size: i.size, pinned: i.pinned, ..Default::default() }
}

pub(super) fn sandbox_state(ready: bool) -> i32 {
    if ready { api::PodSandboxState::SandboxReady as i32 } else { api::PodSandboxState::SandboxNotready as i32 }
}
