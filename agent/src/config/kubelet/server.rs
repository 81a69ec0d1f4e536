//! The kubelet's HTTP servers: whether they run, where they listen, their
//! TLS and certificates, who may call them (authentication and
//! authorization), and the healthz and debugging endpoints.

use std::{path::PathBuf, time::Duration};

use super::configuration::KubeletConfiguration;
use crate::config::{
    error::ConfigError,
    tree::Node,
    values::{Ctx, Object},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AuthorizationMode {
    AlwaysAllow,
    #[default]
    Webhook,
}

impl AuthorizationMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AuthorizationMode::AlwaysAllow => "AlwaysAllow",
            AuthorizationMode::Webhook => "Webhook",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Authentication {
    /// authentication.x509.clientCAFile
    pub client_ca_file: Option<PathBuf>,
    /// authentication.webhook.enabled
    pub webhook_enabled: bool,
    /// authentication.webhook.cacheTTL
    pub webhook_cache_ttl: Duration,
    /// authentication.anonymous.enabled
    pub anonymous_enabled: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Authorization {
    pub mode: AuthorizationMode,
    /// authorization.webhook.cacheAuthorizedTTL
    pub webhook_cache_authorized_ttl: Duration,
    /// authorization.webhook.cacheUnauthorizedTTL
    pub webhook_cache_unauthorized_ttl: Duration,
}

/// Reads enableServer, the listen addresses and ports, TLS, authentication,
/// authorization, the healthz and debugging endpoints, and certificate
/// rotation.
pub(super) fn read(cx: &Ctx, o: &mut Object, c: &mut KubeletConfiguration) -> Result<(), ConfigError> {
    if let Some(v) = o.boolean("enableServer")? {
        c.enable_server = v;
    }
    if let Some(n) = o.get("address") {
        let s = cx.string(n, "address")?;
        if !s.is_empty() {
            c.address = cx.ip(n, "address")?;
        }
    }
    if let Some(p) = o.int_in("port", 0, 65535)?.filter(|p| *p != 0) {
        c.port = u16_port(p);
    }
    if let Some(p) = o.int_in("readOnlyPort", 0, 65535)? {
        c.read_only_port = u16_port(p);
    }
    read_tls(cx, o, c)?;
    if let Some(n) = o.get("authentication") {
        read_authentication(cx, n, &mut c.authentication)?;
    }
    if let Some(n) = o.get("authorization") {
        read_authorization(cx, n, &mut c.authorization)?;
    }
    if let Some(v) = o.boolean("enableDebuggingHandlers")? {
        c.enable_debugging_handlers = v;
    }
    if let Some(p) = o.int_in("healthzPort", 0, 65535)? {
        c.healthz_port = u16_port(p);
    }
    if let Some(n) = o.get("healthzBindAddress")
        && !cx.string(n, "healthzBindAddress")?.is_empty()
    {
        c.healthz_bind_address = cx.ip(n, "healthzBindAddress")?;
    }
    if let Some(v) = o.boolean("rotateCertificates")? {
        c.rotate_certificates = v;
    }
    if let Some(v) = o.boolean("serverTLSBootstrap")? {
        c.server_tls_bootstrap = v;
    }
    Ok(())
}

/// Ports were range-checked (0 to 65535) by the caller's `int_in`.
fn u16_port(v: i64) -> u16 {
    v as u16
}

/// tlsCertFile, tlsPrivateKeyFile, tlsCipherSuites and tlsMinVersion.
fn read_tls(cx: &Ctx, o: &mut Object, c: &mut KubeletConfiguration) -> Result<(), ConfigError> {
    c.tls_cert_file = o.path("tlsCertFile")?;
    c.tls_private_key_file = o.path("tlsPrivateKeyFile")?;
    if let Some(l) = o.string_list("tlsCipherSuites")? {
        c.tls_cipher_suites = l;
    }
    if let Some(n) = o.get("tlsMinVersion") {
        let v = cx.string(n, "tlsMinVersion")?;
        if !v.is_empty() {
            const VERSIONS: [&str; 4] = ["VersionTLS10", "VersionTLS11", "VersionTLS12", "VersionTLS13"];
            if !VERSIONS.contains(&v.as_str()) {
                return Err(cx.err(n, "tlsMinVersion", format!("{v:?} is not one of {}", VERSIONS.join(", "))));
            }
            c.tls_min_version = Some(v);
        }
    }
    Ok(())
}

fn read_authentication(cx: &Ctx, node: &Node, a: &mut Authentication) -> Result<(), ConfigError> {
    let mut o = Object::new(cx, node, "authentication")?;
    if let Some(n) = o.get("x509") {
        let mut x = Object::new(cx, n, "authentication.x509")?;
        a.client_ca_file = x.path("clientCAFile")?;
        x.finish()?;
    }
    if let Some(n) = o.get("webhook") {
        let mut w = Object::new(cx, n, "authentication.webhook")?;
        if let Some(v) = w.boolean("enabled")? {
            a.webhook_enabled = v;
        }
        a.webhook_cache_ttl = w.duration_or("cacheTTL", a.webhook_cache_ttl)?;
        w.finish()?;
    }
    if let Some(n) = o.get("anonymous") {
        let mut an = Object::new(cx, n, "authentication.anonymous")?;
        if let Some(v) = an.boolean("enabled")? {
            a.anonymous_enabled = v;
        }
        an.finish()?;
    }
    o.finish()
}

fn read_authorization(cx: &Ctx, node: &Node, a: &mut Authorization) -> Result<(), ConfigError> {
    let mut o = Object::new(cx, node, "authorization")?;
    if let Some(n) = o.get("mode") {
        a.mode = match cx.string(n, "authorization.mode")?.as_str() {
            "" | "Webhook" => AuthorizationMode::Webhook,
            "AlwaysAllow" => AuthorizationMode::AlwaysAllow,
            other => {
                return Err(cx.err(n, "authorization.mode", format!("{other:?} is not one of AlwaysAllow, Webhook")));
            }
        };
    }
    if let Some(n) = o.get("webhook") {
        let mut w = Object::new(cx, n, "authorization.webhook")?;
        a.webhook_cache_authorized_ttl = w.duration_or("cacheAuthorizedTTL", a.webhook_cache_authorized_ttl)?;
        a.webhook_cache_unauthorized_ttl = w.duration_or("cacheUnauthorizedTTL", a.webhook_cache_unauthorized_ttl)?;
        w.finish()?;
    }
    o.finish()
}
