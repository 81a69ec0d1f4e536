//! Values in files (durations, quantities, relative paths), what
//! `/configz` shows, and `--help` and `--version`.

use super::*;

#[test]
fn durations_and_quantities_in_files() {
    let cfg = file(
        "syncFrequency: 1m30s\nfileCheckFrequency: 500ms\nnodeStatusReportFrequency: 2h\nshutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\ncontainerLogMaxSize: 50Mi\nkubeReserved:\n  cpu: 1\n  memory: 2Gi\n  ephemeral-storage: 1Gi\n",
    );
    let c = ok(&["--config=/k.yaml"], &[("/k.yaml", &cfg)]);
    assert_eq!(c.kubelet.sync_frequency, Duration::from_secs(90));
    assert_eq!(c.kubelet.file_check_frequency, Duration::from_millis(500));
    assert_eq!(c.kubelet.node_status_report_frequency, Duration::from_secs(7200));
    assert_eq!(c.kubelet.shutdown_grace_period_critical_pods, Duration::from_secs(10));
    assert_eq!(c.kubelet.container_log_max_size, q("50Mi"));
    assert_eq!(c.kubelet.kube_reserved[&ReservedResource::Cpu], q("1"), "an unquoted number is a quantity");
}

#[test]
fn relative_paths_in_a_file_are_relative_to_it() {
    let cfg = file(
        "staticPodPath: manifests\ntlsCertFile: pki/kubelet.crt\nauthentication:\n  x509:\n    clientCAFile: /abs/ca.crt\n",
    );
    let c = ok(
        &["--config=/etc/kubernetes/kubelet.yaml", "--tls-private-key-file=rel.key"],
        &[("/etc/kubernetes/kubelet.yaml", &cfg)],
    );
    assert_eq!(c.kubelet.static_pod_path, Some("/etc/kubernetes/manifests".into()));
    assert_eq!(c.kubelet.tls_cert_file, Some("/etc/kubernetes/pki/kubelet.crt".into()));
    assert_eq!(c.kubelet.authentication.client_ca_file, Some("/abs/ca.crt".into()));
    assert_eq!(c.kubelet.tls_private_key_file, Some("rel.key".into()), "flags are relative to the working directory");
}

#[test]
fn unimplemented_fields_are_logged_and_configz_shows_what_is_in_effect() {
    let cfg = file("hairpinMode: hairpin-veth\ncpuManagerPolicy: none\nstaticPodURLHeader:\n  a: [b]\n");
    let c = ok(&["--config=/k.yaml"], &[("/k.yaml", &cfg)]);
    assert_eq!(c.kubelet.other["hairpinMode"], serde_json::json!("none"), "in effect, not as asked");
    assert!(!c.kubelet.other.contains_key("staticPodURLHeader"), "nothing is in effect");
    assert!(c.warnings.iter().any(|w| w.starts_with("KubeletConfiguration hairpinMode: \"hairpin-veth\"")));
    assert!(c.warnings.iter().any(|w| w.starts_with("KubeletConfiguration staticPodURLHeader: {\"a\":[\"b\"]}")));
    assert!(!c.warnings.iter().any(|w| w.contains("cpuManagerPolicy")), "none is what swiftlet does");
    let refused = err(&["--config=/k.yaml"], &[("/k.yaml", &file("cpuManagerPolicy: static\n"))]);
    assert!(refused.starts_with("/k.yaml:3: cpuManagerPolicy: \"static\" is not supported"), "{refused}");
}

#[test]
fn configz_uses_the_kubelets_names() {
    let c =
        ok(&["--eviction-hard=memory.available<500Mi,nodefs.available<10%", "--kube-reserved=cpu=1,memory=2Gi"], &[]);
    let z = c.configz();
    let k = &z["kubeletconfig"];
    assert_eq!(k["maxPods"], 110);
    assert_eq!(k["syncFrequency"], "1m0s");
    assert_eq!(k["evictionPressureTransitionPeriod"], "5m0s");
    assert_eq!(k["healthzBindAddress"], "127.0.0.1");
    assert_eq!(k["evictionHard"], serde_json::json!({"memory.available": "500Mi", "nodefs.available": "10%"}));
    assert_eq!(k["kubeReserved"], serde_json::json!({"cpu": "1", "memory": "2Gi"}));
    assert_eq!(k["authentication"]["anonymous"]["enabled"], false);
    assert_eq!(k["authorization"]["mode"], "Webhook");
    assert_eq!(k["enforceNodeAllocatable"], serde_json::json!(["pods"]));
    assert_eq!(k["cgroupDriver"], "cgroupfs");
    assert_eq!(k["containerLogMaxSize"], "10Mi");
    assert_eq!(k["hairpinMode"], "none");
    assert_eq!(k["logging"]["verbosity"], 0);
}

#[test]
fn help_and_version() {
    let fs = MemFs::default();
    let Invocation::Help(h) = invocation_with(["--help", "--config=/missing.yaml"], &fs).unwrap() else {
        panic!("--help must win before files are read")
    };
    assert!(h.contains("--eviction-hard mapStringString"));
    assert!(h.contains("(default \"127.0.0.1\")"), "config defaults are shown");
    assert!(h.contains("imagefs.available<15%"), "{h}");
    assert!(matches!(invocation_with(["-h"], &fs).unwrap(), Invocation::Help(_)));
    assert_eq!(invocation_with(["--version"], &fs).unwrap(), Invocation::Version(version()));
    assert!(matches!(invocation_with(["--max-pods=3"], &fs).unwrap(), Invocation::Run(c) if c.kubelet.max_pods == 3));
}
