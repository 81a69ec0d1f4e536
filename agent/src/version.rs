//! The versions the agent reports: the Kubernetes release whose kubelet it
//! stands in for (node status `kubeletVersion`, `kubernetes_build_info`,
//! `--version`), with swiftlet's own version as a pre-release suffix, as
//! vendors' kubelets do (`v1.33.0-eks-…`), so version-skew checks that
//! compare major and minor (kubeadm, the API server's skew policy) see a
//! 1.33 kubelet.

/// The kubelet release whose flags, configuration, API and metrics the
/// agent implements.
pub const KUBERNETES_MAJOR: &str = "1";
pub const KUBERNETES_MINOR: &str = "33";
pub const KUBERNETES_VERSION: &str = "v1.33.0";

/// `v1.33.0-swiftlet.0.1.0`: the Kubernetes version, then swiftlet's.
pub fn kubelet_version() -> String {
    format!("{KUBERNETES_VERSION}-swiftlet.{}", env!("CARGO_PKG_VERSION"))
}

/// Go's GOOS/GOARCH pair for this build (`linux/amd64`).
pub fn platform() -> String {
    format!("{}/{}", std::env::consts::OS, goarch(std::env::consts::ARCH))
}

/// Go's GOARCH for this architecture, which NodeSystemInfo reports.
pub fn goarch(arch: &str) -> &str {
    match arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "riscv64" => "riscv64",
        "s390x" => "s390x",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names() {
        assert_eq!(goarch("x86_64"), "amd64");
        assert_eq!(goarch("aarch64"), "arm64");
    }

    /// The form version-skew tools parse: `v<major>.<minor>.<patch>` and an
    /// optional pre-release of dot-separated alphanumerics, with the major
    /// and minor they compare being the Kubernetes release's.
    #[test]
    fn the_kubelet_version_is_a_semantic_kubernetes_version() {
        let v = kubelet_version();
        let rest = v.strip_prefix('v').expect("leading v");
        let (core, pre) = rest.split_once('-').expect("a pre-release suffix");
        let parts: Vec<u64> = core.split('.').map(|p| p.parse().expect("numeric")).collect();
        assert_eq!(parts.len(), 3, "{v}");
        assert_eq!(parts[0].to_string(), KUBERNETES_MAJOR);
        assert_eq!(parts[1].to_string(), KUBERNETES_MINOR);
        for id in pre.split('.') {
            assert!(!id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'), "{v}");
            // Numeric identifiers have no leading zeros (semver 2.0 §9).
            assert!(!(id.len() > 1 && id.starts_with('0') && id.chars().all(|c| c.is_ascii_digit())), "{v}");
        }
        assert!(v.starts_with(KUBERNETES_VERSION));
        assert!(pre.starts_with("swiftlet."));
    }
}
