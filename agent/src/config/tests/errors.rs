//! The exact error messages, in flags, files and drop-ins, and no panic
//! on odd input.

use super::*;

/// Every error names its source and field, exactly.
#[test]
fn error_messages() {
    let quantity_hint = "expected a number with an optional suffix (Ki, Mi, Gi, Ti, Pi, Ei, n, u, m, k, M, G, T, P, E)";
    let signals = "memory.available, allocatableMemory.available, nodefs.available, nodefs.inodesFree, \
                   imagefs.available, imagefs.inodesFree, pid.available";
    let cases: Vec<(&str, String, Vec<&str>, String)> = vec![
        ("unknown field", file("maxPods: 10\nmaxPod: 11\n"), vec![], "/k.yaml:4: unknown field \"maxPod\"".into()),
        (
            "unknown nested field",
            file("authentication:\n  anonymous:\n    enable: true\n"),
            vec![],
            "/k.yaml:5: authentication.anonymous: unknown field \"enable\"".into(),
        ),
        (
            "bad quantity",
            file("kubeReserved:\n  cpu: 100m\n  memory: 2Gx\n"),
            vec![],
            format!("/k.yaml:5: kubeReserved: \"memory\": \"2Gx\" is not a quantity: {quantity_hint}"),
        ),
        (
            "a cgroupRoot systemd cannot nest slices in",
            file("cgroupDriver: systemd\ncgroupRoot: /custom\n"),
            vec![],
            "/k.yaml:4: cgroupRoot: \"/custom\" is not a systemd slice path: with cgroupDriver systemd it must be / or slices such as /swiftlet.slice".into(),
        ),
        (
            "reserving an unknown resource",
            file("systemReserved:\n  gpu: 1\n"),
            vec![],
            "/k.yaml:4: systemReserved: cannot reserve \"gpu\" (only cpu, memory, ephemeral-storage, pid)".into(),
        ),
        (
            "bad threshold quantity",
            file("evictionHard:\n  memory.available: abc\n"),
            vec![],
            format!("/k.yaml:4: evictionHard: \"memory.available\": \"abc\" is not a quantity: {quantity_hint}"),
        ),
        (
            "unknown signal",
            file("evictionHard:\n  foo.available: 1Gi\n"),
            vec![],
            format!("/k.yaml:4: evictionHard: \"foo.available\" is not an eviction signal (one of {signals})"),
        ),
        (
            "threshold percent over 100",
            file("evictionSoft:\n  nodefs.available: 101%\n"),
            vec![],
            "/k.yaml:4: evictionSoft: \"nodefs.available\": \"101%\" is not a percentage between 0% and 100%".into(),
        ),
        (
            "field percent over 100",
            file("imageGCHighThresholdPercent: 101\n"),
            vec![],
            "/k.yaml:3: imageGCHighThresholdPercent: 101 must be between 0 and 100".into(),
        ),
        (
            "negative duration",
            file("nodeStatusUpdateFrequency: -10s\n"),
            vec![],
            "/k.yaml:3: nodeStatusUpdateFrequency: \"-10s\" is negative".into(),
        ),
        (
            "not a duration",
            file("syncFrequency: 10\n"),
            vec![],
            "/k.yaml:3: syncFrequency: expected a duration such as \"10s\", got integer 10".into(),
        ),
        (
            "type mismatch",
            file("maxPods: lots\n"),
            vec![],
            "/k.yaml:3: maxPods: expected an integer, got string \"lots\"".into(),
        ),
        (
            "bool mismatch",
            file("registerNode: yes\n"),
            vec![],
            "/k.yaml:3: registerNode: expected true or false, got string \"yes\"".into(),
        ),
        (
            "wrong apiVersion",
            "apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\n".into(),
            vec![],
            "/k.yaml:1: apiVersion: \"kubelet.config.k8s.io/v1\" is not supported; expected \"kubelet.config.k8s.io/v1beta1\""
                .into(),
        ),
        (
            "wrong kind",
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n".into(),
            vec![],
            "/k.yaml:2: kind: \"KubeProxyConfiguration\" is not supported; expected \"KubeletConfiguration\"".into(),
        ),
        (
            "missing kind",
            "apiVersion: kubelet.config.k8s.io/v1beta1\nmaxPods: 3\n".into(),
            vec![],
            "/k.yaml: kind: missing; expected \"KubeletConfiguration\"".into(),
        ),
        ("empty file", "# nothing\n".into(), vec![], "/k.yaml: the file is empty; expected a KubeletConfiguration".into()),
        (
            "not a mapping",
            "- a\n".into(),
            vec![],
            "/k.yaml:1: expected a KubeletConfiguration mapping, got a list".into(),
        ),
        (
            "soft threshold without grace period",
            file("evictionSoft:\n  memory.available: 1Gi\n"),
            vec![],
            "/k.yaml:4: evictionSoft: \"memory.available\" has no grace period: set it in evictionSoftGracePeriod \
             (--eviction-soft-grace-period)"
                .into(),
        ),
        (
            "gc thresholds out of order",
            file("imageGCHighThresholdPercent: 50\nimageGCLowThresholdPercent: 60\n"),
            vec![],
            "/k.yaml:4: imageGCLowThresholdPercent: 60 must be less than imageGCHighThresholdPercent (50)".into(),
        ),
        (
            "bad taint effect",
            file("registerWithTaints:\n- key: a\n  effect: Sometimes\n"),
            vec![],
            "/k.yaml:4: registerWithTaints[0]: taint \"a:Sometimes\" has effect \"Sometimes\": expected NoSchedule, \
             PreferNoSchedule or NoExecute"
                .into(),
        ),
        (
            "enforcement needing a cgroup",
            file("enforceNodeAllocatable: [pods, kube-reserved]\n"),
            vec![],
            "/k.yaml:3: enforceNodeAllocatable: \"kube-reserved\" needs kubeReservedCgroup (--kube-reserved-cgroup)".into(),
        ),
        (
            "bad ip",
            file("address: localhost\n"),
            vec![],
            "/k.yaml:3: address: \"localhost\" is not an IP address".into(),
        ),
        (
            "syntax error",
            file("maxPods: [1\n"),
            vec![],
            "/k.yaml:3: not valid YAML: unclosed bracket '['".into(),
        ),
        // Flags.
        (
            "flag bad threshold",
            file(""),
            vec!["--eviction-hard=memory.available<abc"],
            format!("flag --eviction-hard: \"memory.available\": \"abc\" is not a quantity: {quantity_hint}"),
        ),
        (
            "flag unknown signal",
            file(""),
            vec!["--eviction-hard=foo.available<1Gi"],
            format!("flag --eviction-hard: \"foo.available\" is not an eviction signal (one of {signals})"),
        ),
        (
            "flag wrong operator",
            file(""),
            vec!["--eviction-hard=memory.available>1Gi"],
            "flag --eviction-hard: \"memory.available>1Gi\" is not a threshold: expected <signal><<value>, e.g. \
             memory.available<100Mi (the operator must be <)"
                .into(),
        ),
        (
            "flag bad quantity",
            file(""),
            vec!["--kube-reserved=memory=2Gx"],
            format!("flag --kube-reserved: \"memory\": \"2Gx\" is not a quantity: {quantity_hint}"),
        ),
        (
            "flag negative duration",
            file(""),
            vec!["--sync-frequency=-1m"],
            "flag --sync-frequency: \"-1m\" is negative".into(),
        ),
        (
            "flag bad integer",
            file(""),
            vec!["--max-pods=many"],
            "flag --max-pods: \"many\" is not an integer".into(),
        ),
        (
            "flag bad bool",
            file(""),
            vec!["--register-node=maybe"],
            "flag --register-node: \"maybe\" is not a boolean (true or false)".into(),
        ),
        (
            "flag percent over 100",
            file(""),
            vec!["--image-gc-high-threshold=150"],
            "flag --image-gc-high-threshold: 150 must be between 0 and 100".into(),
        ),
        (
            "flag realtime priority out of range",
            file(""),
            vec!["--eviction-realtime-priority=100"],
            "flag --eviction-realtime-priority: 100 must be between 0 and 99".into(),
        ),
        (
            "flag memory pressure over 100",
            file(""),
            vec!["--eviction-memory-pressure=150"],
            "flag --eviction-memory-pressure: \"150\" is not a percentage of stalled time above 0 and at most 100 \
             (some avg10 of memory.pressure)"
                .into(),
        ),
        (
            "flag memory pressure grace period not a duration",
            file(""),
            vec!["--eviction-memory-pressure=20", "--eviction-memory-pressure-grace-period=soon"],
            "flag --eviction-memory-pressure-grace-period: \"soon\" is not a duration (examples: 10s, 1m30s, 2h, 500ms)"
                .into(),
        ),
        (
            "flag soft without grace",
            file(""),
            vec!["--eviction-soft=memory.available<1Gi"],
            "flag --eviction-soft: \"memory.available\" has no grace period: set it in evictionSoftGracePeriod \
             (--eviction-soft-grace-period)"
                .into(),
        ),
        (
            "flag restricted node label",
            file(""),
            vec!["--node-labels=node-role.kubernetes.io/worker="],
            format!(
                "flag --node-labels: the kubelet may not set \"node-role.kubernetes.io/worker\": {}",
                validation::kubelet_label_rule()
            ),
        ),
        (
            "flag bad signal source",
            file(""),
            vec!["--signal-source=bpf"],
            "flag --signal-source: `bpf` is not one of auto, ebpf, cgroupfs".into(),
        ),
        (
            "flag bad taint",
            file(""),
            vec!["--register-with-taints=a=b"],
            "flag --register-with-taints: taint \"a=b:\" needs an effect: expected NoSchedule, PreferNoSchedule or \
             NoExecute"
                .into(),
        ),
        (
            "flag cloud provider",
            file(""),
            vec!["--cloud-provider=aws"],
            "flag --cloud-provider: \"aws\" is not supported: only \"external\" or empty".into(),
        ),
        (
            "flag dual-stack of one family",
            file(""),
            vec!["--node-ip=10.0.0.1,10.0.0.2"],
            "flag --node-ip: \"10.0.0.1,10.0.0.2\": expected one IP address, or one IPv4 and one IPv6 address".into(),
        ),
        (
            "missing config file",
            file(""),
            vec!["--config=/nope.yaml"],
            "/nope.yaml: cannot read the file: entity not found".into(),
        ),
        (
            "missing drop-in directory",
            file(""),
            vec!["--config-dir=/nope.d"],
            "/nope.d: cannot read the drop-in directory: entity not found".into(),
        ),
    ];
    for (name, text, extra, want) in cases {
        let mut args = vec!["--config=/k.yaml"];
        args.extend(extra);
        let got = err(&args, &[("/k.yaml", &text)]);
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn errors_in_drop_ins_name_the_drop_in() {
    let files = [
        ("/k.yaml", file("maxPods: 10\n")),
        ("/d/10-ok.conf", file("maxPods: 20\n")),
        ("/d/20-bad.conf", file("# tuning\nkubeReserved:\n  memory: 2Gx\n")),
    ];
    let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
    assert_eq!(
        err(&["--config=/k.yaml", "--config-dir=/d"], &files),
        "/d/20-bad.conf:5: kubeReserved: \"memory\": \"2Gx\" is not a quantity: expected a number with an optional \
         suffix (Ki, Mi, Gi, Ti, Pi, Ei, n, u, m, k, M, G, T, P, E)"
    );
    // A flag that overrides the bad value makes the configuration valid, as
    // with the kubelet (which validates the result, not each layer).
    let c = ok(&["--config=/k.yaml", "--config-dir=/d", "--kube-reserved=memory=1Gi"], &files);
    assert_eq!(c.kubelet.max_pods, 20);
    let unknown = [("/d/10.conf", file("maxPods: 20\nfoo: bar\n"))];
    let unknown: Vec<(&str, &str)> = unknown.iter().map(|(p, t)| (*p, t.as_str())).collect();
    assert_eq!(err(&["--config-dir=/d"], &unknown), "/d/10.conf:4: unknown field \"foo\"");
    let wrong_kind = [("/d/10.conf", "apiVersion: v1\nkind: Pod\n".to_owned())];
    let wrong_kind: Vec<(&str, &str)> = wrong_kind.iter().map(|(p, t)| (*p, t.as_str())).collect();
    assert_eq!(
        err(&["--config-dir=/d"], &wrong_kind),
        "/d/10.conf:1: apiVersion: \"v1\" is not supported; expected \"kubelet.config.k8s.io/v1beta1\""
    );
    let empty = [("/d/10.conf", "\n".to_owned())];
    let empty: Vec<(&str, &str)> = empty.iter().map(|(p, t)| (*p, t.as_str())).collect();
    assert_eq!(ok(&["--config-dir=/d"], &empty).kubelet.max_pods, 110, "an empty drop-in is skipped");
}

#[test]
fn nothing_panics_on_odd_input() {
    let odd = [
        "",
        "\t",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 99999999999999999999\n",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionHard: [1, 2]\n",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionHard:\n  memory.available: [x]\n",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nauthentication: 5\n",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nport: 70000\n",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nregisterWithTaints: [{}]\n",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncpuCFSQuotaPeriod: 2s\n",
        "apiVersion: 5\nkind: []\n",
        "{{{{",
        "&a [*a]",
        "a: &x 1\nb: *x\n",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nlogging:\n  flushFrequency: -5\n",
    ];
    for text in odd {
        let r = load_mem(&["--config=/k.yaml"], &[("/k.yaml", text)]);
        if let Err(e) = r {
            assert!(e.to_string().starts_with("/k.yaml"), "{text:?}: {e}");
        }
    }
    for args in [
        &["--v=-1"][..],
        &["--port=99999"],
        &["--max-pods=-3"],
        &["--housekeeping-interval=0s"],
        &["--eviction-hard=<"],
    ] {
        assert!(load_mem(args, &[]).is_err(), "{args:?}");
    }
}

#[test]
fn crash_loop_back_off_max_needs_its_feature_gate() {
    let body = "crashLoopBackOff:\n  maxContainerRestartPeriod: 2s\n";
    let gated = format!("{HEAD}featureGates:\n  KubeletCrashLoopBackOffMax: true\n{body}");
    let c = ok(&["--config=/k.yaml"], &[("/k.yaml", &gated)]);
    assert_eq!(c.kubelet.crash_loop_back_off_max, Some(Duration::from_secs(2)));
    assert_eq!(c.configz()["kubeletconfig"]["crashLoopBackOff"]["maxContainerRestartPeriod"], "2s");
    let e = err(&["--config=/k.yaml"], &[("/k.yaml", &format!("{HEAD}{body}"))]);
    assert_eq!(
        e,
        "/k.yaml:4: crashLoopBackOff.maxContainerRestartPeriod: FeatureGate KubeletCrashLoopBackOffMax not enabled"
    );
    let too_long = format!(
        "{HEAD}featureGates:\n  KubeletCrashLoopBackOffMax: true\ncrashLoopBackOff:\n  maxContainerRestartPeriod: 10m\n"
    );
    let e = err(&["--config=/k.yaml"], &[("/k.yaml", &too_long)]);
    assert!(e.contains("crashLoopBackOff.maxContainerRestartPeriod: 10m0s must be between 1s and 300s"), "{e}");
}
