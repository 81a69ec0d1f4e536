//! The status a worker reports: termination messages (with the log
//! fallback), waiting reasons and probe results, generated and handed to the
//! sink with the running containers.

use k8s_openapi::jiff::Timestamp;

use super::{Lifecycle, Worker, find_container};
use crate::pods::{
    observed::{self, ContainerRunState, ObservedPod},
    resize, spec,
    status::{self, StatusInput},
};

/// Log lines a FallbackToLogsOnError message takes at most.
const FALLBACK_LOG_LINES: usize = 80;
const MAX_MESSAGE_BYTES: usize = 4096;

impl Worker {
    pub(super) async fn refresh_status(&mut self) {
        if let Ok(observed) = observed::observe(self.deps.runtime.as_ref(), &self.uid).await {
            self.report(&observed).await;
        }
    }

    /// The termination message of an exited container instance.
    pub(super) fn read_message(&self, c: &observed::ContainerState) -> Option<String> {
        let path = spec::termination_message_file(&self.deps.settings, &self.uid, &c.name, c.attempt);
        let mut text = std::fs::read(&path)
            .ok()
            .map(|b| String::from_utf8_lossy(&b[..b.len().min(MAX_MESSAGE_BYTES)]).into_owned());
        let policy = find_container(&self.pod, &c.name).and_then(|(s, _)| s.termination_message_policy.clone());
        if text.as_deref().unwrap_or("").is_empty()
            && c.exit_code != 0
            && policy.as_deref() == Some("FallbackToLogsOnError")
        {
            let log = spec::pod_log_dir(&self.deps.settings, &spec::identity(&self.pod))
                .join(spec::container_log_path(&c.name, c.attempt));
            text = std::fs::read_to_string(log).ok().map(|s| tail_log_message(&s));
        }
        text.filter(|t| !t.is_empty())
    }

    pub(super) async fn report(&mut self, observed: &ObservedPod) {
        for c in observed.containers.iter().filter(|c| c.state == ContainerRunState::Exited) {
            if !self.messages.contains_key(&c.id)
                && let Some(m) = self.read_message(c)
            {
                self.messages.insert(c.id.clone(), m);
            }
        }
        // Running containers no longer wait for anything.
        for c in observed.running() {
            if observed.latest(&c.name).map(|l| &l.id) == Some(&c.id) {
                self.waiting.remove(&c.name);
            }
        }
        let results = self.results.lock();
        let host_ip = self.deps.settings.node_ip.clone();
        let input = StatusInput {
            pod: &self.pod,
            observed,
            waiting: &self.waiting,
            readiness: &results.readiness,
            not_started: &results.not_started,
            messages: &self.messages,
            previous: self.status.as_ref(),
            host_ip: host_ip.as_deref(),
            runtime_name: &self.deps.runtime_name,
            now: Timestamp::now(),
            terminal: self.finished || self.terminal.is_some(),
            terminal_reason: self.terminal.as_ref(),
        };
        let mut status = status::generate(&input);
        status.ephemeral_container_statuses = crate::pods::ephemeral::statuses(&input);
        drop(results);
        if let Some(alloc) = &self.allocation {
            let running = self.running_resources(observed);
            resize::status::decorate(
                &mut status,
                alloc,
                &running,
                &self.resize,
                self.status.as_ref(),
                Timestamp::now(),
            );
        }
        let running: Vec<(String, String)> = observed.running().map(|c| (c.name.clone(), c.id.clone())).collect();
        let active = self.lifecycle == Lifecycle::Running && !self.finished;
        self.sink.status(&self.pod, &status, &running, active);
        self.status = Some(status);
    }
}

/// The last lines of a CRI-format log, for FallbackToLogsOnError.
fn tail_log_message(log: &str) -> String {
    let lines: Vec<&str> = log
        .lines()
        .map(|l| {
            // <time> <stream> <P|F> <content>
            l.splitn(4, ' ').nth(3).unwrap_or("")
        })
        .collect();
    let start = lines.len().saturating_sub(FALLBACK_LOG_LINES);
    let mut text = lines[start..].join("\n");
    if text.len() > 2048 {
        let cut = text.len() - 2048;
        let cut = (cut..text.len()).find(|i| text.is_char_boundary(*i)).unwrap_or(text.len());
        text = text[cut..].to_owned();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_takes_the_content_of_the_last_lines() {
        let log = (0..100)
            .map(|i| format!("2024-01-01T00:00:00.000000000Z stderr F line {i}"))
            .collect::<Vec<_>>()
            .join("\n");
        let t = tail_log_message(&log);
        assert!(t.starts_with("line 20\n"), "{t}");
        assert!(t.ends_with("line 99"));
    }
}
