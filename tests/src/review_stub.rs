//! A stand-in API server that answers only TokenReview and
//! SubjectAccessReview, from rules the test sets, over plain HTTP, and
//! records what it was asked. (The full fake API server of the API-server
//! work can replace it: it answers the same two reviews from rules.)

use std::{
    collections::HashMap,
    convert::Infallible,
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;

#[derive(Default)]
pub struct Rules {
    /// token → (user, groups)
    pub tokens: HashMap<String, (String, Vec<String>)>,
    /// (user, subresource) pairs allowed on nodes.
    pub allow: Vec<(String, String)>,
    /// Every review received: (kind, spec).
    pub seen: Vec<(String, Value)>,
}

pub struct ReviewStub {
    pub addr: SocketAddr,
    pub rules: Arc<Mutex<Rules>>,
    task: tokio::task::JoinHandle<()>,
}

fn answer(rules: &Mutex<Rules>, path: &str, body: &[u8]) -> (u16, Value) {
    let Ok(mut review) = serde_json::from_slice::<Value>(body) else { return (400, json!({"message": "bad JSON"})) };
    let mut r = rules.lock().unwrap();
    let kind = review["kind"].as_str().unwrap_or_default().to_owned();
    r.seen.push((kind.clone(), review["spec"].clone()));
    let status = match (path, kind.as_str()) {
        ("/apis/authentication.k8s.io/v1/tokenreviews", "TokenReview") => {
            let token = review["spec"]["token"].as_str().unwrap_or_default();
            match r.tokens.get(token) {
                Some((user, groups)) => json!({"authenticated": true, "user": {"username": user, "groups": groups}}),
                None => json!({"authenticated": false}),
            }
        }
        ("/apis/authorization.k8s.io/v1/subjectaccessreviews", "SubjectAccessReview") => {
            let user = review["spec"]["user"].as_str().unwrap_or_default();
            let attrs = &review["spec"]["resourceAttributes"];
            let sub = attrs["subresource"].as_str().unwrap_or_default();
            let ok = attrs["resource"] == "nodes" && r.allow.iter().any(|(u, s)| u == user && s == sub);
            if ok {
                json!({"allowed": true, "reason": "allowed by the test's rule"})
            } else {
                json!({"allowed": false, "reason": "no rule allows it"})
            }
        }
        _ => return (404, json!({"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404})),
    };
    review["status"] = status;
    (201, review)
}

impl ReviewStub {
    pub async fn start() -> ReviewStub {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the review stub");
        let addr = listener.local_addr().expect("address");
        let rules: Arc<Mutex<Rules>> = Arc::default();
        let r = rules.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let r = r.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let r = r.clone();
                        async move {
                            let path = req.uri().path().to_owned();
                            let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                            let (code, v) = answer(&r, &path, &body);
                            let mut resp = Response::new(Full::new(Bytes::from(v.to_string())));
                            *resp.status_mut() = hyper::StatusCode::from_u16(code).unwrap();
                            resp.headers_mut().insert("content-type", "application/json".parse().unwrap());
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ =
                        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        });
        ReviewStub { addr, rules, task }
    }

    /// A kubeconfig pointing at the stub (no credentials).
    pub fn write_kubeconfig(&self, path: &Path) {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: stub\n  cluster:\n    server: http://{}\n\
             contexts:\n- name: stub\n  context:\n    cluster: stub\n    user: stub\ncurrent-context: stub\n\
             users:\n- name: stub\n  user: {{}}\n",
            self.addr
        );
        std::fs::write(path, text).expect("write the kubeconfig");
    }
}

impl Drop for ReviewStub {
    fn drop(&mut self) {
        self.task.abort();
    }
}
