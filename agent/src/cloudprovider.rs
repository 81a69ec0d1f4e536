//! `--cloud-provider=external`: the node registers with the
//! `node.cloudprovider.kubernetes.io/uninitialized=true:NoSchedule` taint,
//! which the external cloud controller manager removes once it has
//! initialized the node (addresses, provider ID, zone labels), as with the
//! kubelet's `initialNode`.

use k8s_openapi::api::core::v1::Taint;

use crate::config::Config;

/// The taint an external cloud provider clears.
pub const TAINT_EXTERNAL_CLOUD_PROVIDER: &str = "node.cloudprovider.kubernetes.io/uninitialized";

pub fn external(config: &Config) -> bool {
    config.flags.cloud_provider.as_deref() == Some("external")
}

/// The taints a new Node object gets: `registerWithTaints`
/// (`--register-with-taints`), then the external cloud provider's.
pub fn registration_taints(config: &Config) -> Vec<Taint> {
    let mut taints = config.kubelet.register_with_taints.clone();
    if external(config) && !taints.iter().any(|t| t.key == TAINT_EXTERNAL_CLOUD_PROVIDER && t.effect == "NoSchedule") {
        taints.push(Taint {
            key: TAINT_EXTERNAL_CLOUD_PROVIDER.into(),
            value: Some("true".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        });
    }
    taints
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load;

    #[test]
    fn external_cloud_provider_adds_the_uninitialized_taint() {
        let plain = load(["--register-with-taints=dedicated=infra:NoExecute"]).unwrap();
        let taints = registration_taints(&plain);
        assert_eq!(taints.len(), 1);
        assert_eq!(taints[0].key, "dedicated");

        let ext = load(["--cloud-provider=external", "--register-with-taints=dedicated=infra:NoExecute"]).unwrap();
        assert!(external(&ext));
        let taints = registration_taints(&ext);
        assert_eq!(taints.len(), 2);
        assert_eq!(taints[0].key, "dedicated", "the configured taints come first");
        assert_eq!(
            taints[1],
            Taint {
                key: "node.cloudprovider.kubernetes.io/uninitialized".into(),
                value: Some("true".into()),
                effect: "NoSchedule".into(),
                time_added: None
            }
        );
        // Already asked for: not twice.
        let twice = load([
            "--cloud-provider=external",
            "--register-with-taints=node.cloudprovider.kubernetes.io/uninitialized=true:NoSchedule",
        ])
        .unwrap();
        assert_eq!(registration_taints(&twice).len(), 1);
    }
}
