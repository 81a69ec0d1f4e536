//! The fake's certificate controllers: the kube-controller-manager's
//! approver (kubelet client CSRs approved at once, as the csrapproving
//! controller does for nodes; kubelet-serving CSRs only when the test says
//! so, as clusters leave them to an operator or an approver) and signer
//! (any approved CSR without a certificate is signed, with the lifetime
//! the test sets, at most the request's `expirationSeconds`).

use std::{sync::Arc, time::Duration};

use serde_json::{Value, json};

use super::{resources, server::State};

const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

/// The fake's CSR behaviour (changeable while it runs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Approve kubelet client CSRs at once.
    pub approve_client: bool,
    /// Approve kubelet-serving CSRs at once.
    pub approve_serving: bool,
    /// How long issued certificates are valid.
    pub lifetime: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy { approve_client: true, approve_serving: false, lifetime: Duration::from_secs(365 * 24 * 3600) }
    }
}

fn now() -> String {
    super::store::now_rfc3339()
}

fn is_approved(csr: &Value) -> bool {
    csr.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Approved" && c["status"] == "True"))
}

/// A new CSR: approved (and so signed) when the policy says so.
pub fn on_create(state: &Arc<State>, csr: &Value) {
    let policy = state.csr.read().unwrap_or_else(|p| p.into_inner()).clone();
    let signer = csr.pointer("/spec/signerName").and_then(Value::as_str).unwrap_or("");
    let approve = (signer == CLIENT_SIGNER && policy.approve_client && state.auto_approve_csrs)
        || (signer == SERVING_SIGNER && policy.approve_serving);
    if !approve {
        return;
    }
    let mut obj = csr.clone();
    let t = now();
    obj["status"] = json!({"conditions": [{
        "type": "Approved", "status": "True", "reason": "AutoApproved",
        "message": "Auto approving kubelet certificate after SubjectAccessReview.",
        "lastUpdateTime": t, "lastTransitionTime": t,
    }]});
    let _ = on_update(state, obj);
}

/// A CSR was written (created approved, or approved through
/// `/approval`): an approved one without a certificate is signed.
pub fn on_update(state: &Arc<State>, csr: Value) -> Value {
    if !is_approved(&csr) || csr.pointer("/status/certificate").and_then(Value::as_str).is_some_and(|c| !c.is_empty()) {
        return csr;
    }
    let Some(pki) = &state.pki else { return csr };
    let policy = state.csr.read().unwrap_or_else(|p| p.into_inner()).clone();
    let signer = csr.pointer("/spec/signerName").and_then(Value::as_str).unwrap_or("").to_owned();
    let name = csr.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_owned();
    let request: Option<k8s_openapi::ByteString> =
        csr.pointer("/spec/request").cloned().and_then(|r| serde_json::from_value(r).ok());
    let mut lifetime = policy.lifetime;
    if let Some(s) = csr.pointer("/spec/expirationSeconds").and_then(Value::as_u64) {
        lifetime = lifetime.min(Duration::from_secs(s));
    }
    let serving = signer == SERVING_SIGNER;
    let signed = match request.map(|r| String::from_utf8_lossy(&r.0).into_owned()) {
        Some(pem) if signer == CLIENT_SIGNER || serving => pki.sign_csr_for(&pem, serving, lifetime),
        Some(_) => return csr,
        None => Err(rcgen::Error::CouldNotParseCertificationRequest),
    };
    let mut obj = csr.clone();
    let t = now();
    match signed {
        Ok(cert) => {
            obj["status"]["certificate"] =
                serde_json::to_value(k8s_openapi::ByteString(cert.into_bytes())).unwrap_or_default()
        }
        Err(e) => {
            obj["status"]["conditions"] = json!([{
                "type": "Failed", "status": "True", "reason": "SignerValidationFailure",
                "message": format!("cannot sign the request: {e}"),
                "lastUpdateTime": t, "lastTransitionTime": t,
            }]);
        }
    }
    state
        .store
        .update(&resources::CSRS, "", &name, obj.clone(), super::server::merge_for(&resources::CSRS, Some("status")))
        .unwrap_or(obj)
}
