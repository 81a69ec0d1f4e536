//! The HTTP side: routing, verbs, content negotiation (JSON or Table),
//! watch streams, and the connection loop (plain HTTP or TLS).

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};

use super::{
    auth::{AuthConfig, Pki, UserInfo},
    defaults, openapi,
    patch::{self, PatchKind},
    resources::{self, ResourceType},
    selectors::{FieldSelector, LabelSelector},
    store::{ApiError, ApiResult, Change, ChangeType, DeleteOptions, Store},
    table::{self, IncludeObject},
};

pub type Body = BoxBody<Bytes, Infallible>;

/// One request as the fake saw it (for assertions in tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    /// When it arrived.
    pub at: std::time::Instant,
    pub method: String,
    /// Path and query.
    pub uri: String,
    pub user: String,
    pub content_type: String,
    pub status: u16,
}

/// A fault to inject: the next `count` requests whose method matches and
/// whose path contains `path_contains` are answered with `code`.
#[derive(Clone, Debug)]
pub struct Fault {
    pub method: Method,
    pub path_contains: String,
    pub code: u16,
    pub count: usize,
}

pub struct State {
    pub store: Store,
    pub auth: RwLock<AuthConfig>,
    pub pki: Option<Pki>,
    pub bookmark_interval: Duration,
    pub auto_approve_csrs: bool,
    /// Which CSRs are approved by themselves, and for how long certificates
    /// are issued.
    pub csr: RwLock<super::csr::Policy>,
    pub requests: Mutex<Vec<RequestRecord>>,
    pub faults: Mutex<Vec<Fault>>,
    pub server_address: String,
    pub shutdown: watch::Receiver<bool>,
    /// The client the fake proxies pod subresources to kubelets with.
    pub kubelet_client: Option<Arc<rustls::ClientConfig>>,
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(v).unwrap_or_default())).boxed())
        .expect("valid response")
}

fn error_response(e: &ApiError) -> Response<Body> {
    json_response(e.code, &e.status())
}

fn query_map(q: Option<&str>) -> HashMap<String, String> {
    q.map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect()).unwrap_or_default()
}

fn wants_table(req_accept: &str) -> bool {
    req_accept.split(',').next().is_some_and(|first| first.contains("as=Table"))
}

fn user_of(state: &State, req: &Request<Incoming>, peer: Option<&UserInfo>) -> UserInfo {
    if let Some(token) =
        req.headers().get(header::AUTHORIZATION).and_then(|h| h.to_str().ok()).and_then(|h| h.strip_prefix("Bearer "))
    {
        let auth = state.auth.read().unwrap_or_else(|p| p.into_inner());
        return auth.tokens.get(token.trim()).cloned().unwrap_or_else(|| UserInfo::new("system:anonymous", &[]));
    }
    peer.cloned().unwrap_or_else(|| UserInfo::new("system:anonymous", &["system:unauthenticated"]))
}

enum Target {
    Version,
    Health,
    Api,
    Apis,
    Group(String),
    ResourceList(String, String),
    OpenApiV3Index,
    OpenApiV3(String),
    Resource { rt: ResourceType, ns: Option<String>, name: Option<String>, sub: Option<String> },
}

fn route(path: &str) -> Result<Target, ApiError> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let nf = || ApiError::new(404, "NotFound", "the server could not find the requested resource");
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["version"] => return Ok(Target::Version),
        ["healthz" | "readyz" | "livez", ..] => return Ok(Target::Health),
        ["api"] => return Ok(Target::Api),
        ["apis"] => return Ok(Target::Apis),
        ["openapi", "v3"] => return Ok(Target::OpenApiV3Index),
        ["openapi", "v3", rest @ ..] => return Ok(Target::OpenApiV3(rest.join("/"))),
        ["apis", g] => return Ok(Target::Group((*g).to_owned())),
        ["api", v] => return Ok(Target::ResourceList(String::new(), (*v).to_owned())),
        ["apis", g, v] => return Ok(Target::ResourceList((*g).to_owned(), (*v).to_owned())),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(nf()),
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, plural, more @ ..] if *plural != "status" && *plural != "finalize" => {
            (Some((*ns).to_owned()), std::iter::once(*plural).chain(more.iter().copied()).collect::<Vec<_>>())
        }
        _ => (None, rest.to_vec()),
    };
    let Some(rt) = rest.first().and_then(|p| resources::find(group, version, p)) else {
        return Err(nf());
    };
    if ns.is_some() && !rt.namespaced {
        return Err(nf());
    }
    if rest.len() > 3 {
        return Err(nf());
    }
    Ok(Target::Resource {
        rt,
        ns,
        name: rest.get(1).map(|s| (*s).to_owned()),
        sub: rest.get(2).map(|s| (*s).to_owned()),
    })
}

/// The TLS client's certificate: who it names and until when it is valid
/// (the API server checks the validity at every request, not only at the
/// handshake).
#[derive(Clone, Debug)]
pub struct Peer {
    pub user: UserInfo,
    pub not_after: std::time::SystemTime,
}

pub async fn handle(state: Arc<State>, req: Request<Incoming>, peer: Option<Peer>) -> Response<Body> {
    let arrived = std::time::Instant::now();
    if let Some(p) = &peer
        && std::time::SystemTime::now() > p.not_after
    {
        state.requests.lock().unwrap_or_else(|p| p.into_inner()).push(RequestRecord {
            at: arrived,
            method: req.method().to_string(),
            uri: req.uri().to_string(),
            user: p.user.username.clone(),
            content_type: String::new(),
            status: 401,
        });
        return error_response(&ApiError::new(401, "Unauthorized", "the client certificate has expired"));
    }
    let user = user_of(&state, &req, peer.as_ref().map(|p| &p.user));
    let method = req.method().clone();
    let uri = req.uri().to_string();
    let path = req.uri().path().to_owned();
    let content_type = req.headers().get(header::CONTENT_TYPE).and_then(|h| h.to_str().ok()).unwrap_or("").to_owned();
    let fault = {
        let mut faults = state.faults.lock().unwrap_or_else(|p| p.into_inner());
        let hit = faults.iter_mut().find(|f| f.count > 0 && f.method == method && path.contains(&f.path_contains));
        hit.map(|f| {
            f.count -= 1;
            f.code
        })
    };
    let response = match fault {
        Some(code) => {
            let reason = match code {
                409 => "Conflict",
                410 => "Expired",
                429 => "TooManyRequests",
                500 => "InternalError",
                503 => "ServiceUnavailable",
                _ => "Unknown",
            };
            error_response(&ApiError::new(code, reason, format!("injected fault on {path}")))
        }
        None => match dispatch(&state, req, &user).await {
            Ok(r) => r,
            Err(e) => error_response(&e),
        },
    };
    state.requests.lock().unwrap_or_else(|p| p.into_inner()).push(RequestRecord {
        at: arrived,
        method: method.to_string(),
        uri,
        user: user.username,
        content_type,
        status: response.status().as_u16(),
    });
    response
}

async fn dispatch(state: &Arc<State>, req: Request<Incoming>, user: &UserInfo) -> ApiResult<Response<Body>> {
    let target = route(req.uri().path())?;
    // exec, attach, portforward and log go to the pod's kubelet.
    if let Target::Resource { rt, ns, name: Some(name), sub: Some(sub) } = &target
        && rt.kind == "Pod"
        && super::proxy::proxied(sub)
    {
        let pod = state.store.get(rt, ns.as_deref().unwrap_or(""), name)?;
        return super::proxy::proxy(state, &pod, sub, req).await;
    }
    let q = query_map(req.uri().query());
    let accept = req.headers().get(header::ACCEPT).and_then(|h| h.to_str().ok()).unwrap_or("").to_owned();
    let content_type = req.headers().get(header::CONTENT_TYPE).and_then(|h| h.to_str().ok()).unwrap_or("").to_owned();
    let method = req.method().clone();
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let parse_body = || -> ApiResult<Value> {
        if body.is_empty() {
            return Ok(json!({}));
        }
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))
    };
    match target {
        Target::Version => Ok(json_response(
            200,
            &json!({
                "major": "1", "minor": "34", "gitVersion": "v1.34.0-fake", "gitCommit": "0000000",
                "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24",
                "compiler": "gc", "platform": "linux/amd64",
            }),
        )),
        Target::Health => Ok(Response::builder()
            .status(200)
            .header(header::CONTENT_TYPE, "text/plain")
            .body(Full::new(Bytes::from_static(b"ok")).boxed())
            .expect("response")),
        Target::Api => Ok(json_response(200, &resources::api_versions(&state.server_address))),
        Target::Apis => Ok(json_response(200, &resources::api_group_list())),
        Target::Group(g) => resources::api_group(&g)
            .map(|d| json_response(200, &d))
            .ok_or_else(|| ApiError::new(404, "NotFound", "the server could not find the requested resource")),
        Target::OpenApiV3Index => Ok(json_response(200, &openapi::v3_index())),
        Target::OpenApiV3(p) => openapi::v3_group_version(&p)
            .map(|d| json_response(200, &d))
            .ok_or_else(|| ApiError::new(404, "NotFound", "the server could not find the requested resource")),
        Target::ResourceList(g, v) => resources::resource_list(&g, &v)
            .map(|d| json_response(200, &d))
            .ok_or_else(|| ApiError::new(404, "NotFound", "the server could not find the requested resource")),
        Target::Resource { rt, ns, name, sub } => {
            let ns_str = ns.clone().unwrap_or_default();
            if rt.create_only {
                if method != Method::POST || name.is_some() {
                    return Err(ApiError::new(405, "MethodNotAllowed", format!("{} only supports create", rt.plural)));
                }
                // As RBAC has it: bootstrap tokens may ask for a client
                // certificate (system:node-bootstrapper), not review
                // tokens or access.
                if user.groups.iter().any(|g| g == "system:bootstrappers") {
                    return Err(ApiError::new(
                        403,
                        "Forbidden",
                        format!(
                            "{} is forbidden: User \"{}\" cannot create resource \"{}\"",
                            rt.plural, user.username, rt.plural
                        ),
                    ));
                }
                let review = parse_body()?;
                let auth = state.auth.read().unwrap_or_else(|p| p.into_inner());
                let mut answer =
                    if rt.kind == "TokenReview" { auth.token_review(review) } else { auth.access_review(review) };
                answer["kind"] = rt.kind.into();
                answer["apiVersion"] = rt.api_version().into();
                return Ok(json_response(201, &answer));
            }
            let table = wants_table(&accept);
            let include = IncludeObject::parse(q.get("includeObject").map(String::as_str));
            let validation = openapi::FieldValidation::parse(q.get("fieldValidation").map(String::as_str))
                .map_err(ApiError::bad_request)?;
            let warned = |code: u16, obj: &Value, warnings: Vec<String>| {
                let mut r = json_response(code, obj);
                for w in warnings {
                    if let Ok(v) = header::HeaderValue::from_str(&format!("299 - {w:?}")) {
                        r.headers_mut().append(header::WARNING, v);
                    }
                }
                r
            };
            let one = |obj: Value| {
                if table {
                    let rv = obj.pointer("/metadata/resourceVersion").and_then(Value::as_str).map(str::to_owned);
                    json_response(200, &table::table(&rt, &[obj], rv, include))
                } else {
                    json_response(200, &obj)
                }
            };
            if rt.kind == "Pod"
                && sub.as_deref() == Some("ephemeralcontainers")
                && let Some(n) = &name
            {
                let ns = ns_str.clone();
                return super::ephemeral::serve(state, &rt, &ns, n, &method, &content_type, parse_body()?)
                    .map(|v| json_response(200, &v));
            }
            if rt.kind == "Pod"
                && sub.as_deref() == Some("resize")
                && let Some(n) = &name
            {
                let ns = ns_str.clone();
                return super::resize::serve(state, &rt, &ns, n, &method, &content_type, parse_body()?)
                    .map(|v| json_response(200, &v));
            }
            match (method, name, sub.as_deref()) {
                (Method::GET, None, None) => {
                    if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
                        return watch(state, rt, ns, &q, table, include);
                    }
                    list(state, &rt, ns.as_deref(), &q, table, include)
                }
                (Method::GET, Some(n), _) => Ok(one(state.store.get(&rt, &ns_str, &n)?)),
                (Method::POST, None, None) => {
                    let mut obj = parse_body()?;
                    let warnings = openapi::check_fields(&rt, &obj, validation, false)?;
                    if rt.kind == "Pod" {
                        defaults::pod(&mut obj);
                        super::admission::pod(&state.store, &ns_str, &mut obj)?;
                    }
                    super::storage::admission::on_create(&state.store, &rt, &mut obj)?;
                    if rt.kind == "CertificateSigningRequest" {
                        obj["spec"]["username"] = user.username.clone().into();
                        obj["spec"]["groups"] = json!(user.groups);
                        if let Some(s) = obj.get_mut("status") {
                            *s = json!({});
                        }
                    }
                    let created = state.store.create(&rt, &ns_str, obj)?;
                    if rt.kind == "CertificateSigningRequest" {
                        super::csr::on_create(state, &created);
                    }
                    Ok(warned(201, &created, warnings))
                }
                (Method::PUT, Some(n), sub) => {
                    let obj = parse_body()?;
                    let warnings = openapi::check_fields(&rt, &obj, validation, false)?;
                    let mut updated = update(state, &rt, &ns_str, &n, sub, obj)?;
                    if rt.kind == "CertificateSigningRequest" {
                        updated = super::csr::on_update(state, updated);
                    }
                    Ok(warned(200, &updated, warnings))
                }
                (Method::PATCH, Some(n), sub) => {
                    let kind = super::patch::kind_of(&content_type)?;
                    let p = parse_body()?;
                    let warnings =
                        if p.is_object() { openapi::check_fields(&rt, &p, validation, true)? } else { vec![] };
                    let patched = patch_object(state, &rt, &ns_str, &n, sub, kind, &p)?;
                    Ok(warned(200, &patched, warnings))
                }
                (Method::DELETE, Some(n), None) => {
                    let mut opts = DeleteOptions::from_json(&parse_body()?);
                    if let Some(g) = q.get("gracePeriodSeconds").and_then(|g| g.parse().ok()) {
                        opts.grace_period_seconds = Some(g);
                    }
                    let (obj, _) = state.store.delete(&rt, &ns_str, &n, &opts)?;
                    Ok(json_response(200, &obj))
                }
                (Method::DELETE, None, None) => {
                    let opts = DeleteOptions::from_json(&parse_body()?);
                    let (items, _) = state.store.list(&rt, ns.as_deref());
                    let (labels, fields) = selectors(&q)?;
                    let mut deleted = vec![];
                    for o in items.into_iter().filter(|o| labels.matches(o) && fields.matches(o)) {
                        let n = o.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_owned();
                        let on = o.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("").to_owned();
                        if let Ok((d, _)) = state.store.delete(&rt, &on, &n, &opts) {
                            deleted.push(d);
                        }
                    }
                    Ok(json_response(
                        200,
                        &json!({"kind": rt.list_kind(), "apiVersion": rt.api_version(), "metadata": {}, "items": deleted}),
                    ))
                }
                (m, _, sub) => Err(ApiError::new(
                    405,
                    "MethodNotAllowed",
                    format!(
                        "{m} is not supported on {}{}",
                        rt.plural,
                        sub.map(|s| format!("/{s}")).unwrap_or_default()
                    ),
                )),
            }
        }
    }
}

fn selectors(q: &HashMap<String, String>) -> ApiResult<(LabelSelector, FieldSelector)> {
    let labels = LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
    let fields = FieldSelector::parse(q.get("fieldSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(format!("invalid field selector: {e}")))?;
    Ok((labels, fields))
}

fn list(
    state: &Arc<State>,
    rt: &ResourceType,
    ns: Option<&str>,
    q: &HashMap<String, String>,
    table: bool,
    include: IncludeObject,
) -> ApiResult<Response<Body>> {
    let (labels, fields) = selectors(q)?;
    let (items, rv) = state.store.list(rt, ns);
    if q.get("resourceVersionMatch").is_some_and(|m| m == "Exact")
        && let Some(want) = q.get("resourceVersion").and_then(|r| r.parse::<u64>().ok())
        && want != rv
    {
        return Err(ApiError::gone(format!("too old resource version: {want} ({rv})")));
    }
    let mut items: Vec<Value> = items.into_iter().filter(|o| labels.matches(o) && fields.matches(o)).collect();
    // Paging: `continue` is the namespace/name of the last item returned.
    if let Some(after) = q.get("continue").filter(|c| !c.is_empty()) {
        let key = |o: &Value| {
            format!(
                "{}/{}",
                o.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or(""),
                o.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("")
            )
        };
        items.retain(|o| key(o).as_str() > after.as_str());
    }
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(limit) = q.get("limit").and_then(|l| l.parse::<usize>().ok()).filter(|l| *l > 0)
        && items.len() > limit
    {
        let remaining = items.len() - limit;
        items.truncate(limit);
        let last = items.last().expect("limit > 0");
        meta["continue"] = format!(
            "{}/{}",
            last.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or(""),
            last.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("")
        )
        .into();
        meta["remainingItemCount"] = remaining.into();
    }
    if table {
        return Ok(json_response(200, &table::table(rt, &items, Some(rv.to_string()), include)));
    }
    Ok(json_response(
        200,
        &json!({"kind": rt.list_kind(), "apiVersion": rt.api_version(), "metadata": meta, "items": items}),
    ))
}

/// The stored object for an update of `sub` ("status", "approval" or the
/// main resource): a main update keeps the status of resources that have a
/// status subresource; a status update changes only the status.
pub(super) fn merge_for(rt: &ResourceType, sub: Option<&str>) -> impl FnOnce(&Value, &mut Value) + use<> {
    let has_status = rt.status;
    let sub = sub.map(str::to_owned);
    move |old: &Value, new: &mut Value| match sub.as_deref() {
        None if has_status => new["status"] = old.get("status").cloned().unwrap_or(json!({})),
        None => {}
        Some("status") => {
            let status = new.get("status").cloned().unwrap_or(json!({}));
            let rv = new.pointer("/metadata/resourceVersion").cloned();
            *new = old.clone();
            new["status"] = status;
            if let Some(rv) = rv {
                new["metadata"]["resourceVersion"] = rv;
            }
        }
        Some(_) => {
            let conditions = new.pointer("/status/conditions").cloned().unwrap_or(json!([]));
            *new = old.clone();
            new["status"]["conditions"] = conditions;
        }
    }
}

fn check_sub(rt: &ResourceType, sub: Option<&str>) -> ApiResult<()> {
    match sub {
        None => Ok(()),
        Some("status") if rt.status => Ok(()),
        Some("approval") if rt.kind == "CertificateSigningRequest" => Ok(()),
        Some(s) => Err(ApiError::new(404, "NotFound", format!("{}/{s} is not served", rt.plural))),
    }
}

fn update(
    state: &Arc<State>,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    sub: Option<&str>,
    mut obj: Value,
) -> ApiResult<Value> {
    check_sub(rt, sub)?;
    if super::storage::admission::applies_to(rt)
        && let Ok(old) = state.store.get(rt, ns, name)
    {
        super::storage::admission::on_update(&state.store, rt, sub, &old, &mut obj)?;
    }
    state.store.update(rt, ns, name, obj, merge_for(rt, sub))
}

fn patch_object(
    state: &Arc<State>,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    sub: Option<&str>,
    kind: PatchKind,
    p: &Value,
) -> ApiResult<Value> {
    check_sub(rt, sub)?;
    // Without a resourceVersion in the patch, a patch applies to whatever
    // is current: retry when another write slipped in between.
    for _ in 0..10 {
        let current = state.store.get(rt, ns, name)?;
        let mut patched = patch::apply(kind, &current, p).map_err(|e| ApiError::new(422, "Invalid", e))?;
        super::storage::admission::on_update(&state.store, rt, sub, &current, &mut patched)?;
        match state.store.update(rt, ns, name, patched.clone(), merge_for(rt, sub)) {
            Err(e)
                if e.code == 409
                    && patched.pointer("/metadata/resourceVersion") == current.pointer("/metadata/resourceVersion") =>
            {
                continue;
            }
            other => return other,
        }
    }
    Err(ApiError::conflict(rt, name, "too many concurrent writes"))
}

/// What one watch filters on.
struct WatchFilter {
    resource: String,
    ns: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl WatchFilter {
    fn matches(&self, o: &Value) -> bool {
        self.labels.matches(o) && self.fields.matches(o)
    }

    /// The event this change means for this watch: selectors are checked on
    /// both sides, so an object leaving the selection is DELETED and one
    /// entering it ADDED, as the API server's watch cache does.
    fn event(&self, c: &Change) -> Option<(&'static str, Value)> {
        if c.resource != self.resource || self.ns.as_ref().is_some_and(|n| *n != c.namespace) {
            return None;
        }
        let new = self.matches(&c.object);
        match c.kind {
            ChangeType::Added => new.then(|| ("ADDED", c.object.clone())),
            ChangeType::Modified => match (c.old.as_ref().is_some_and(|o| self.matches(o)), new) {
                (true, true) => Some(("MODIFIED", c.object.clone())),
                (false, true) => Some(("ADDED", c.object.clone())),
                (true, false) => Some(("DELETED", c.object.clone())),
                (false, false) => None,
            },
            ChangeType::Deleted => {
                (c.old.as_ref().is_some_and(|o| self.matches(o)) || new).then(|| ("DELETED", c.object.clone()))
            }
        }
    }
}

fn watch(
    state: &Arc<State>,
    rt: ResourceType,
    ns: Option<String>,
    q: &HashMap<String, String>,
    table: bool,
    include: IncludeObject,
) -> ApiResult<Response<Body>> {
    let (labels, fields) = selectors(q)?;
    let from = match q.get("resourceVersion").map(String::as_str) {
        None | Some("") | Some("0") => None,
        Some(v) => Some(v.parse::<u64>().map_err(|_| {
            ApiError::new(422, "Invalid", format!("resourceVersion: Invalid value: {v:?}: must be an integer"))
        })?),
    };
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|b| b == "true" || b == "1");
    let initial_events = q.get("sendInitialEvents").is_some_and(|b| b == "true" || b == "1");
    let timeout = q.get("timeoutSeconds").and_then(|t| t.parse::<u64>().ok()).map(Duration::from_secs);
    let filter = WatchFilter { resource: rt.key(), ns, labels, fields };
    let (tx, rx) = mpsc::channel::<Bytes>(1024);
    let state = state.clone();
    tokio::spawn(async move {
        let line = |kind: &str, obj: Value| {
            let obj = if table && kind != "BOOKMARK" && kind != "ERROR" {
                table::table(&rt, &[obj], None, include)
            } else {
                obj
            };
            let mut b = serde_json::to_vec(&json!({"type": kind, "object": obj})).unwrap_or_default();
            b.push(b'\n');
            Bytes::from(b)
        };
        let bookmark = |rv: u64, initial_end: bool| {
            let mut meta = json!({"resourceVersion": rv.to_string()});
            if initial_end {
                meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
            }
            line("BOOKMARK", json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": meta}))
        };
        // Anything older than the history is gone: the ERROR event with a
        // 410 Status, as the API server sends it on an open stream.
        let (initial, start, mut changes) = match state.store.watch_from(&rt, from) {
            Ok(x) => x,
            Err(e) => {
                let _ = tx.send(line("ERROR", e.status())).await;
                return;
            }
        };
        let mut seen = start;
        for c in initial {
            seen = seen.max(c.rv);
            if let Some((kind, obj)) = filter.event(&c)
                && tx.send(line(kind, obj)).await.is_err()
            {
                return;
            }
        }
        if from.is_none() && initial_events && tx.send(bookmark(seen, true)).await.is_err() {
            return;
        }
        let mut shutdown = state.shutdown.clone();
        let mut tick = tokio::time::interval(state.bookmark_interval);
        tick.tick().await;
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        loop {
            tokio::select! {
                c = changes.recv() => match c {
                    Ok(c) => {
                        if c.rv <= seen { continue }
                        seen = c.rv;
                        if let Some((kind, obj)) = filter.event(&c)
                            && tx.send(line(kind, obj)).await.is_err() { return }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let _ = tx.send(line("ERROR", ApiError::gone("the watch fell behind; re-list").status())).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tick.tick(), if bookmarks => {
                    if tx.send(bookmark(seen, false)).await.is_err() { return }
                }
                _ = async { match deadline { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => return,
                _ = async { shutdown.wait_for(|s| *s).await.is_ok() } => return,
                _ = tx.closed() => return,
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .expect("response"))
}
