//! Kubernetes name rules the kubelet checks on node labels and taints.

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters.
fn name_part(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if s.len() > 63 {
        return Err("must be at most 63 characters".to_owned());
    }
    let ok_inner = s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let ends = s.starts_with(|c: char| c.is_ascii_alphanumeric()) && s.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !(ok_inner && ends) {
        return Err("must consist of alphanumerics, '-', '_' or '.', and start and end with an alphanumeric".to_owned());
    }
    Ok(())
}

/// A DNS-1123 subdomain: lowercase labels separated by dots, at most 253.
fn dns_subdomain(s: &str) -> Result<(), String> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if s.is_empty() || s.len() > 253 || !s.split('.').all(label_ok) {
        return Err(format!("has prefix {s:?} that is not a lowercase DNS subdomain"));
    }
    Ok(())
}

/// A qualified name: `[prefix/]name` (label keys, taint keys).
pub fn qualified_name(s: &str) -> Result<(), String> {
    match s.split_once('/') {
        Some((prefix, name)) => {
            dns_subdomain(prefix)?;
            name_part(name).map_err(|e| format!("name part {e}"))
        }
        None => name_part(s),
    }
}

/// A label value: empty, or a name part.
pub fn label_value(s: &str) -> Result<(), String> {
    if s.is_empty() { Ok(()) } else { name_part(s) }
}

const KUBELET_LABELS: [&str; 11] = [
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
];
const KUBELET_LABEL_NAMESPACES: [&str; 2] = ["kubelet.kubernetes.io", "node.kubernetes.io"];

fn in_namespace(ns: &str, domain: &str) -> bool {
    ns == domain || ns.ends_with(&format!(".{domain}"))
}

/// Whether the kubelet may set this label on its own node: labels in the
/// kubernetes.io and k8s.io namespaces only from an allowed set (so
/// `node-role.kubernetes.io/...` is refused, as by the kubelet).
pub fn kubelet_may_set_label(key: &str) -> bool {
    let Some((ns, _)) = key.split_once('/') else { return true };
    if !(in_namespace(ns, "kubernetes.io") || in_namespace(ns, "k8s.io")) {
        return true;
    }
    KUBELET_LABELS.contains(&key) || KUBELET_LABEL_NAMESPACES.iter().any(|allowed| in_namespace(ns, allowed))
}

/// The allowed sets, for the error message.
pub fn kubelet_label_rule() -> String {
    format!(
        "labels in the kubernetes.io and k8s.io namespaces must begin with an allowed prefix ({}) \
         or be one of: {}",
        KUBELET_LABEL_NAMESPACES.join(", "),
        KUBELET_LABELS.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "app.kubernetes.io/name", "example.com/x_y-z.1", "A9"] {
            assert!(qualified_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "a b", "Example.com/x", "/x", "x/", &"a".repeat(64)] {
            assert!(qualified_name(bad).is_err(), "{bad}");
        }
        assert!(label_value("").is_ok() && label_value("gpu").is_ok() && label_value("a b").is_err());
    }

    #[test]
    fn kubelet_labels() {
        for ok in [
            "kubernetes.io/hostname",
            "node.kubernetes.io/instance-type",
            "foo.node.kubernetes.io/x",
            "kubelet.kubernetes.io/x",
            "example.com/role",
            "plain",
        ] {
            assert!(kubelet_may_set_label(ok), "{ok}");
        }
        for refused in ["node-role.kubernetes.io/worker", "kubernetes.io/role", "k8s.io/x", "foo.k8s.io/y"] {
            assert!(!kubelet_may_set_label(refused), "{refused}");
        }
    }
}
