//! A tiny OCI distribution registry on 127.0.0.1 for image pull tests:
//! serves generated images (an empty layer and a config whose digest, the
//! image id, can be given a prefix), answers 404 MANIFEST_UNKNOWN for
//! anything else, and records every request. containerd reaches
//! 127.0.0.1 registries over plain HTTP (containerd 2 after an HTTPS
//! attempt, see `serve`).

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Write},
    net::{TcpListener, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
};

use sha2::{Digest, Sha256};

const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

fn digest(data: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(data))
}

#[derive(Default)]
struct Content {
    /// (repository, tag or digest) → manifest digest
    manifests: HashMap<(String, String), String>,
    /// digest → (media type, bytes)
    blobs: HashMap<String, (String, Vec<u8>)>,
    requests: Vec<String>,
    /// When set, every request needs `Authorization: Basic <this>`
    /// (base64 of `user:password`), else 401 with a Basic challenge.
    basic_auth: Option<String>,
    /// The Authorization header of each request ("" when none).
    authorizations: Vec<String>,
}

pub struct Registry {
    port: u16,
    content: Arc<Mutex<Content>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

/// An image the registry serves.
#[derive(Clone, Debug)]
pub struct TestImage {
    /// `127.0.0.1:<port>/<repo>:<tag>`
    pub reference: String,
    /// The image id (the config's digest), as the runtime reports it.
    pub id: String,
    /// Bytes of config + layer.
    pub size: u64,
}

/// A port nothing listens on.
pub fn closed_port() -> u16 {
    crate::node_process::free_port()
}

impl Registry {
    pub fn start() -> Registry {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local addr").port();
        let content = Arc::new(Mutex::new(Content::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (content.clone(), stop.clone());
        let thread = thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let c = c.clone();
                thread::spawn(move || serve(conn, &c));
            }
        });
        Registry { port, content, stop, thread: Some(thread) }
    }

    /// A registry that answers only requests with these credentials (HTTP
    /// Basic), as a private registry does.
    pub fn start_private(user: &str, password: &str) -> Registry {
        use base64::Engine;
        let r = Registry::start();
        r.content.lock().unwrap().basic_auth =
            Some(base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")));
        r
    }

    /// The Authorization header of every request so far ("" when none).
    pub fn authorizations(&self) -> Vec<String> {
        self.content.lock().unwrap().authorizations.clone()
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Serves `repo:tag`, an image whose id starts with `sha256:<id_prefix>`
    /// (found by varying a label in its config; keep the prefix short).
    pub fn add_image(&self, repo: &str, tag: &str, id_prefix: &str) -> TestImage {
        // An empty tar: two zero blocks.
        let layer = vec![0u8; 1024];
        let diff_id = digest(&layer);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&layer).expect("gzip in memory");
        let layer_gz = gz.finish().expect("gzip in memory");
        let (config, config_digest) = (0u64..)
            .map(|nonce| {
                let config = serde_json::to_vec(&serde_json::json!({
                    "architecture": "amd64",
                    "os": "linux",
                    "config": {"Labels": {"io.swiftlet.test": format!("{repo}:{tag}"), "nonce": nonce.to_string()}},
                    "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                }))
                .expect("json");
                let d = digest(&config);
                (config, d)
            })
            .find(|(_, d)| d["sha256:".len()..].starts_with(id_prefix))
            .expect("an unbounded search ends");
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest(&layer_gz), "size": layer_gz.len()}],
        }))
        .expect("json");
        let manifest_digest = digest(&manifest);
        let size = (config.len() + layer_gz.len()) as u64;
        let mut c = self.content.lock().unwrap();
        c.manifests.insert((repo.into(), tag.into()), manifest_digest.clone());
        c.manifests.insert((repo.into(), manifest_digest.clone()), manifest_digest.clone());
        c.blobs.insert(manifest_digest, (MANIFEST_TYPE.into(), manifest));
        c.blobs.insert(config_digest.clone(), ("application/vnd.oci.image.config.v1+json".into(), config));
        c.blobs.insert(digest(&layer_gz), ("application/vnd.oci.image.layer.v1.tar+gzip".into(), layer_gz));
        TestImage { reference: format!("{}/{repo}:{tag}", self.host()), id: config_digest, size }
    }

    /// Every request so far, as `METHOD /path`.
    pub fn requests(&self) -> Vec<String> {
        self.content.lock().unwrap().requests.clone()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn respond(conn: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8], head: bool) {
    let mut out = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let _ = conn.write_all(out.as_bytes());
    if !head {
        let _ = conn.write_all(body);
    }
    let _ = conn.flush();
}

fn serve(mut conn: TcpStream, content: &Mutex<Content>) {
    let mut reader = BufReader::new(conn.try_clone().expect("clone a TCP stream"));
    // containerd 2 tries HTTPS first even for 127.0.0.1 and falls back to
    // plain HTTP only on the answer Go's HTTP server gives a TLS handshake
    // (containerd 1.x went straight to HTTP): answer it the same way.
    if reader.fill_buf().is_ok_and(|b| b.first() == Some(&0x16)) {
        let _ = conn.write_all(b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n");
        return;
    }
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
        return;
    }
    let mut authorization = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" || line == "\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.trim().eq_ignore_ascii_case("authorization")
        {
            authorization = v.trim().to_owned();
        }
    }
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or("").to_owned(), parts.next().unwrap_or("").to_owned());
    let head = method == "HEAD";
    let mut c = content.lock().unwrap();
    c.requests.push(format!("{method} {path}"));
    c.authorizations.push(authorization.clone());
    if let Some(want) = &c.basic_auth
        && authorization != format!("Basic {want}")
    {
        drop(c);
        let body = serde_json::to_vec(
            &serde_json::json!({"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]}),
        )
        .expect("json");
        return respond(
            &mut conn,
            "401 Unauthorized",
            &[
                ("Content-Type", "application/json".into()),
                ("WWW-Authenticate", "Basic realm=\"swiftlet-test\"".into()),
            ],
            &body,
            head,
        );
    }
    let not_found = |code: &str| {
        serde_json::to_vec(&serde_json::json!({"errors": [{"code": code, "message": "not found"}]})).expect("json")
    };
    if path == "/v2/" || path == "/v2" {
        drop(c);
        return respond(&mut conn, "200 OK", &[("Content-Type", "application/json".into())], b"{}", head);
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        drop(c);
        return respond(&mut conn, "404 Not Found", &[], b"", head);
    };
    let found = if let Some((repo, reference)) = rest.rsplit_once("/manifests/") {
        c.manifests
            .get(&(repo.to_owned(), reference.to_owned()))
            .and_then(|d| c.blobs.get(d).map(|b| (d.clone(), b.clone())))
            .ok_or("MANIFEST_UNKNOWN")
    } else if let Some((_, d)) = rest.rsplit_once("/blobs/") {
        c.blobs.get(d).map(|b| (d.to_owned(), b.clone())).ok_or("BLOB_UNKNOWN")
    } else {
        Err("NAME_UNKNOWN")
    };
    drop(c);
    match found {
        Ok((d, (media_type, body))) => {
            respond(&mut conn, "200 OK", &[("Content-Type", media_type), ("Docker-Content-Digest", d)], &body, head)
        }
        Err(code) => {
            respond(&mut conn, "404 Not Found", &[("Content-Type", "application/json".into())], &not_found(code), head)
        }
    }
}
