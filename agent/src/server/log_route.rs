//! The /containerLogs handler: finds the file (`logs.rs`), opens it without
//! following a planted symlink (`crate::logs::open`), and streams it on the
//! async runtime (`logs::read_logs`), with at most
//! `--container-logs-follows-per-user` follows per authenticated user at
//! once and a write timeout (`--server-write-timeout`) per chunk.

use std::{collections::HashMap, path::PathBuf, sync::Arc};

use bytes::Bytes;
use hyper::{
    Response, StatusCode,
    header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER},
};
use parking_lot::Mutex;

use super::{Server, http, http::Body, logs};

/// Follow streams open per user.
#[derive(Debug, Default)]
pub struct Follows(Arc<Mutex<HashMap<String, usize>>>);

/// One open follow; counted until dropped.
#[derive(Debug)]
pub struct FollowGuard {
    counts: Arc<Mutex<HashMap<String, usize>>>,
    user: String,
}

impl Follows {
    /// A place for one more follow of `user`, if under `cap`.
    pub fn enter(&self, user: &str, cap: usize) -> Option<FollowGuard> {
        let mut m = self.0.lock();
        let n = m.entry(user.to_owned()).or_default();
        if *n >= cap {
            return None;
        }
        *n += 1;
        Some(FollowGuard { counts: self.0.clone(), user: user.to_owned() })
    }
}

impl Drop for FollowGuard {
    fn drop(&mut self) {
        let mut m = self.counts.lock();
        if let Some(n) = m.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.user);
            }
        }
    }
}

impl Server {
    pub(super) async fn container_logs(&self, path: &str, query: &[(String, String)], user: &str) -> Response<Body> {
        let parts: Vec<&str> = path.trim_start_matches("/containerLogs/").split('/').collect();
        let get = |i: usize| parts.get(i).map(|s| http::percent_decode(s)).filter(|s| !s.is_empty());
        let (ns, pod_name, container) = match (get(0), get(1), get(2)) {
            (Some(n), Some(p), Some(c)) if parts.len() == 3 => (n, p, c),
            (None, ..) => return http::text(StatusCode::BAD_REQUEST, r#"{"message": "Missing podNamespace."}"#),
            (_, None, _) => return http::text(StatusCode::BAD_REQUEST, r#"{"message": "Missing podID."}"#),
            _ => return http::text(StatusCode::BAD_REQUEST, r#"{"message": "Missing container name."}"#),
        };
        let opts = match logs::parse_options(query, k8s_openapi::jiff::Timestamp::now()) {
            Ok(o) => o,
            Err((status, body)) => return http::text(status, body),
        };
        let find = {
            let pods = self.pods.clone();
            let (ns, pod_name) = (ns.clone(), pod_name.clone());
            move || {
                pods.pods().into_iter().find(|p| {
                    p.metadata.namespace.as_deref().unwrap_or("default") == ns
                        && p.metadata.name.as_deref() == Some(pod_name.as_str())
                })
            }
        };
        let Some(pod) = find() else {
            return http::text(StatusCode::NOT_FOUND, format!("pod {pod_name:?} does not exist"));
        };
        let logs_dir = self.config.kubelet.pod_logs_dir.clone();
        let loc = match logs::locate(&pod, &container, opts.previous, &logs_dir) {
            Ok(l) => l,
            Err((status, body)) => return http::text(status, body),
        };
        let mut file = loc.path.clone();
        if std::fs::symlink_metadata(&file).is_err()
            && let (Some(rt), Some(id)) = (&self.runtime, &loc.container_id)
            && let Ok(st) = rt.container_status(id).await
            && !st.log_path.is_empty()
        {
            file = PathBuf::from(st.log_path);
        }
        let open = {
            let (file, logs_dir) = (file.clone(), logs_dir.clone());
            move || crate::logs::open::open_log(&file, &logs_dir)
        };
        if let Err(e) = open() {
            return http::text(
                StatusCode::BAD_REQUEST,
                format!("failed to open log file {:?}: {e}", file.display().to_string()),
            );
        }
        let limits = &self.config.swiftlet.server;
        let guard = if opts.follow {
            match self.follows.enter(user, limits.log_follows_per_user) {
                Some(g) => Some(g),
                None => {
                    let mut r = http::text(
                        StatusCode::TOO_MANY_REQUESTS,
                        format!(
                            "user {user:?} already follows {} container logs (--container-logs-follows-per-user)\n",
                            limits.log_follows_per_user
                        ),
                    );
                    r.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static("10"));
                    return r;
                }
            }
        } else {
            None
        };
        let (tx, body) = http::channel(8);
        let container_id = loc.container_id.clone();
        let running = move || {
            // Still running while the pod still lists this container
            // attempt as running.
            find().and_then(|p| p.status).is_some_and(|s| {
                s.container_statuses.iter().flatten().chain(s.init_container_statuses.iter().flatten()).any(|cs| {
                    cs.name == container
                        && cs.state.as_ref().is_some_and(|st| st.running.is_some())
                        && cs.container_id.as_deref().map(|i| i.split_once("://").map(|(_, x)| x).unwrap_or(i))
                            == container_id.as_deref()
                })
            })
        };
        let follow_running = loc.running;
        let write_timeout = limits.write_timeout;
        tokio::spawn(async move {
            let _guard = guard;
            let still = move || follow_running && running();
            if let Err(e) = logs::read_logs(&file, &open, &opts, &still, &tx, write_timeout).await {
                let msg = Bytes::from(format!("error reading {}: {e}\n", file.display()));
                let _ = tokio::time::timeout(write_timeout, tx.send(msg)).await;
            }
        });
        let mut r = Response::new(body);
        r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_are_counted_per_user() {
        let f = Follows::default();
        let a1 = f.enter("alice", 2).unwrap();
        let _a2 = f.enter("alice", 2).unwrap();
        assert!(f.enter("alice", 2).is_none());
        let _b = f.enter("bob", 2).unwrap();
        drop(a1);
        assert!(f.enter("alice", 2).is_some());
    }
}
