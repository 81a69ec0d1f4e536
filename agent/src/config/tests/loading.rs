//! Loading: the defaults, every flag form, the precedence of defaults,
//! file, drop-ins and flags, and kubeadm's files.

use super::*;

#[test]
fn defaults_are_the_kubelets() {
    let c = ok(&[], &[]);
    let k = &c.kubelet;
    assert_eq!(k.max_pods, 110);
    assert_eq!((k.healthz_bind_address, k.healthz_port), ("127.0.0.1".parse().unwrap(), 10248));
    assert_eq!((k.address, k.port, k.read_only_port), ("0.0.0.0".parse().unwrap(), 10250, 0));
    assert!(!k.authentication.anonymous_enabled);
    assert!(k.authentication.webhook_enabled);
    assert_eq!(k.authentication.webhook_cache_ttl, Duration::from_secs(120));
    assert_eq!(k.authorization.mode, AuthorizationMode::Webhook);
    assert_eq!(k.authorization.webhook_cache_authorized_ttl, Duration::from_secs(300));
    assert_eq!(k.authorization.webhook_cache_unauthorized_ttl, Duration::from_secs(30));
    assert_eq!(k.file_check_frequency, Duration::from_secs(20));
    assert_eq!(k.sync_frequency, Duration::from_secs(60));
    assert_eq!(k.node_status_update_frequency, Duration::from_secs(10));
    assert_eq!(k.node_status_report_frequency, Duration::from_secs(300));
    assert_eq!(k.node_lease_duration_seconds, 40);
    assert_eq!((k.image_gc_high_threshold_percent, k.image_gc_low_threshold_percent), (85, 80));
    assert_eq!(k.image_minimum_gc_age, Duration::from_secs(120));
    assert_eq!(k.container_log_max_size, q("10Mi"));
    assert_eq!(k.container_log_max_files, 5);
    assert_eq!(k.runtime_request_timeout, Duration::from_secs(120));
    assert_eq!(k.container_runtime_endpoint, "unix:///run/containerd/containerd.sock");
    assert_eq!(k.image_endpoint(), "unix:///run/containerd/containerd.sock");
    assert_eq!(k.cgroup_driver, CgroupDriver::Cgroupfs);
    assert_eq!(k.cgroup_root, "/");
    assert_eq!(k.eviction_pressure_transition_period, Duration::from_secs(300));
    assert_eq!(k.eviction_max_pod_grace_period, 0);
    assert_eq!(k.enforce_node_allocatable, BTreeSet::from([Enforcement::Pods]));
    assert_eq!(k.shutdown_grace_period, Duration::ZERO);
    assert!(k.register_node && k.serialize_image_pulls && k.fail_swap_on);
    assert_eq!(k.pod_pids_limit, -1);
    assert_eq!(k.resolv_conf, Some(PathBuf::from("/etc/resolv.conf")));
    assert_eq!(k.static_pod_path, None);
    let mut want = default_hard_thresholds();
    want.sort_by_key(|t| t.signal);
    assert_eq!(k.eviction_hard, want);
    assert!(k.eviction_soft.is_empty());
    assert_eq!(c.flags.root_dir, PathBuf::from("/var/lib/kubelet"));
    assert_eq!(c.flags.kubeconfig, None);
    assert!(c.standalone(), "no kubeconfig means standalone");
    assert_eq!(c.swiftlet.signal_source, SourceChoice::Auto);
    assert!(c.swiftlet.kernel_eviction);
    assert_eq!(c.swiftlet.housekeeping_interval, Duration::from_secs(10));
    assert!(!c.swiftlet.standalone);
    assert_eq!(*k, KubeletConfiguration::default(), "no input, no change");
}

#[test]
fn every_flag_form() {
    type Check = fn(&Config) -> bool;
    let cases: Vec<(&[&str], Check)> = vec![
        (&["--max-pods=50"], |c| c.kubelet.max_pods == 50),
        (&["--max-pods", "50"], |c| c.kubelet.max_pods == 50),
        (&["--max_pods=0x20"], |c| c.kubelet.max_pods == 32),
        (&["--register-node=false"], |c| !c.kubelet.register_node),
        (&["--register-node=false", "--register-node"], |c| c.kubelet.register_node),
        (&["--anonymous-auth"], |c| c.kubelet.authentication.anonymous_enabled),
        (&["--anonymous-auth=false"], |c| !c.kubelet.authentication.anonymous_enabled),
        (&["--client-ca-file=/etc/kubernetes/pki/ca.crt"], |c| {
            c.kubelet.authentication.client_ca_file == Some("/etc/kubernetes/pki/ca.crt".into())
        }),
        (&["--authorization-mode=AlwaysAllow"], |c| c.kubelet.authorization.mode == AuthorizationMode::AlwaysAllow),
        (&["--kube-reserved=cpu=1,memory=2Gi"], |c| {
            c.kubelet.kube_reserved
                == Reservation::from([(ReservedResource::Cpu, q("1")), (ReservedResource::Memory, q("2Gi"))])
        }),
        (&["--system-reserved=cpu=500m,memory=1Gi,ephemeral-storage=1Gi,pid=1000"], |c| {
            c.kubelet.system_reserved.len() == 4 && c.kubelet.system_reserved[&ReservedResource::Pid] == q("1000")
        }),
        (&["--eviction-hard=memory.available<500Mi,nodefs.available<10%"], |c| {
            c.kubelet.eviction_hard
                == vec![
                    hard(EvictionSignal::MemoryAvailable, ThresholdValue::Quantity(q("500Mi"))),
                    hard(EvictionSignal::NodeFsAvailable, ThresholdValue::Percentage(0.10)),
                ]
        }),
        (
            &[
                "--eviction-soft=memory.available<1Gi",
                "--eviction-soft-grace-period=memory.available=1m30s",
                "--eviction-minimum-reclaim=memory.available=100Mi",
                "--eviction-max-pod-grace-period=30",
                "--eviction-pressure-transition-period=30s",
            ],
            |c| {
                let s = &c.kubelet.eviction_soft[0];
                s.signal == EvictionSignal::MemoryAvailable
                    && s.grace_period == Duration::from_secs(90)
                    && s.min_reclaim == Some(ThresholdValue::Quantity(q("100Mi")))
                    && c.kubelet.eviction_max_pod_grace_period == 30
                    && c.kubelet.eviction_pressure_transition_period == Duration::from_secs(30)
            },
        ),
        (&["--node-labels=a=b,c=d"], |c| {
            c.flags.node_labels == BTreeMap::from([("a".into(), "b".into()), ("c".into(), "d".into())])
        }),
        (&["--register-with-taints=key=value:NoSchedule"], |c| {
            let t = &c.kubelet.register_with_taints;
            t.len() == 1 && t[0].key == "key" && t[0].value.as_deref() == Some("value") && t[0].effect == "NoSchedule"
        }),
        (&["--register-with-taints=dedicated:NoExecute,b=c:PreferNoSchedule"], |c| {
            c.kubelet.register_with_taints.len() == 2 && c.kubelet.register_with_taints[0].value.is_none()
        }),
        (&["--enforce-node-allocatable="], |c| c.kubelet.enforce_node_allocatable.is_empty()),
        (&["--enforce-node-allocatable=none"], |c| c.kubelet.enforce_node_allocatable.is_empty()),
        (&["--kube-reserved-cgroup=/kube.slice", "--enforce-node-allocatable=pods,kube-reserved"], |c| {
            c.kubelet.enforce_node_allocatable == BTreeSet::from([Enforcement::Pods, Enforcement::KubeReserved])
        }),
        (&["--cgroup-root=/custom.slice", "--cgroup-driver=systemd"], |c| {
            c.kubelet.cgroup_root == "/custom.slice" && c.kubelet.cgroup_driver == CgroupDriver::Systemd
        }),
        (&["--cgroup-root=/custom", "--cgroup-driver=cgroupfs"], |c| c.kubelet.cgroup_root == "/custom"),
        (&["--healthz-port=0", "--healthz-bind-address=0.0.0.0"], |c| {
            c.kubelet.healthz_port == 0 && c.kubelet.healthz_bind_address == "0.0.0.0".parse::<IpAddr>().unwrap()
        }),
        (&["--port=11250", "--address=::"], |c| {
            c.kubelet.port == 11250 && c.kubelet.address == "::".parse::<IpAddr>().unwrap()
        }),
        (&["--tls-cert-file=/a.crt", "--tls-private-key-file=/a.key"], |c| {
            c.kubelet.tls_cert_file == Some("/a.crt".into()) && c.kubelet.tls_private_key_file == Some("/a.key".into())
        }),
        (&["-v", "4"], |c| c.kubelet.logging.verbosity == 4),
        (&["--v=2", "-v=5"], |c| c.kubelet.logging.verbosity == 5),
        (&["--node-status-update-frequency=1m30s"], |c| {
            c.kubelet.node_status_update_frequency == Duration::from_secs(90)
        }),
        (&["--runtime-request-timeout=500ms"], |c| c.kubelet.runtime_request_timeout == Duration::from_millis(500)),
        (&["--container-runtime-endpoint=unix:///run/x.sock"], |c| {
            c.kubelet.container_runtime_endpoint == "unix:///run/x.sock"
        }),
        (&["--pod-manifest-path=/etc/kubernetes/manifests"], |c| {
            c.kubelet.static_pod_path == Some("/etc/kubernetes/manifests".into())
        }),
        (&["--kubeconfig=/etc/kubernetes/kubelet.conf"], |c| {
            c.flags.kubeconfig == Some("/etc/kubernetes/kubelet.conf".into()) && !c.standalone()
        }),
        (&["--kubeconfig=/k", "--standalone"], |c| c.standalone()),
        (&["--bootstrap-kubeconfig=/b"], |c| c.flags.bootstrap_kubeconfig == Some("/b".into()) && !c.standalone()),
        (&["--hostname-override= MyNode "], |c| {
            c.flags.hostname_override.as_deref() == Some("mynode") && c.node_name().unwrap() == "mynode"
        }),
        (&["--node-ip=10.0.0.1,fd00::1"], |c| c.flags.node_ip.len() == 2),
        (&["--root-dir=/srv/kubelet"], |c| c.flags.root_dir == Path::new("/srv/kubelet")),
        (&["--cloud-provider=external"], |c| c.flags.cloud_provider.as_deref() == Some("external")),
        (&["--fail-swap-on=false"], |c| !c.kubelet.fail_swap_on),
        (&["--pod-infra-container-image=registry.k8s.io/pause:3.9"], |c| {
            c.warnings.iter().any(|w| w.contains("--pod-infra-container-image is deprecated"))
        }),
        (&["--cloud-provider="], |c| c.flags.cloud_provider.is_none()),
        (&["--signal-source=cgroupfs", "--kernel-eviction=false", "--housekeeping-interval=2s"], |c| {
            c.swiftlet.signal_source == SourceChoice::Cgroupfs
                && !c.swiftlet.kernel_eviction
                && c.swiftlet.housekeeping_interval == Duration::from_secs(2)
        }),
        (&[], |c| !c.swiftlet.evict_static_pods && c.swiftlet.eviction_realtime_priority == Some(10)),
        (&["--evict-static-pods", "--eviction-realtime-priority=0"], |c| {
            c.swiftlet.evict_static_pods && c.swiftlet.eviction_realtime_priority.is_none()
        }),
        (&["--eviction-realtime-priority=50"], |c| c.swiftlet.eviction_realtime_priority == Some(50)),
        (&[], |c| c.swiftlet.memory_pressure.is_none()),
        (&["--eviction-memory-pressure=20"], |c| {
            c.swiftlet.memory_pressure
                == Some(MemoryPressureSignal { threshold_percent: 20.0, grace_period: Duration::from_secs(10) })
        }),
        (&["--eviction-memory-pressure=12.5%", "--eviction-memory-pressure-grace-period=1m"], |c| {
            c.swiftlet.memory_pressure
                == Some(MemoryPressureSignal { threshold_percent: 12.5, grace_period: Duration::from_secs(60) })
        }),
        (&["--eviction-memory-pressure=0", "--eviction-memory-pressure-grace-period=5s"], |c| {
            c.swiftlet.memory_pressure.is_none()
                && c.warnings.iter().any(|w| w.contains("has no effect without --eviction-memory-pressure"))
        }),
        (&[], |c| !c.swiftlet.memory_reclaim_before_eviction),
        (&["--memory-reclaim-before-eviction"], |c| c.swiftlet.memory_reclaim_before_eviction),
        (&["--memory-reclaim-before-eviction=false"], |c| !c.swiftlet.memory_reclaim_before_eviction),
        (&["--feature-gates=A=true,B=false"], |c| {
            c.kubelet.feature_gates == BTreeMap::from([("A".into(), true), ("B".into(), false)])
        }),
        (&["--max-parallel-image-pulls=5"], |c| {
            !c.kubelet.serialize_image_pulls && c.kubelet.max_parallel_image_pulls == Some(5)
        }),
        (&["--cluster-dns=10.96.0.10", "--cluster-domain=cluster.local"], |c| {
            c.kubelet.cluster_dns == vec!["10.96.0.10".parse::<IpAddr>().unwrap()]
                && c.kubelet.cluster_domain.as_deref() == Some("cluster.local")
        }),
        (&["--image-gc-high-threshold=90", "--image-gc-low-threshold=10"], |c| {
            (c.kubelet.image_gc_high_threshold_percent, c.kubelet.image_gc_low_threshold_percent) == (90, 10)
        }),
        (&["--pod-max-pids=4096"], |c| c.kubelet.pod_pids_limit == 4096),
    ];
    for (args, check) in cases {
        let c = ok(args, &[]);
        assert!(check(&c), "{args:?} gave {c:#?}");
    }
}

#[test]
fn precedence_defaults_file_dropins_flags() {
    let files = [
        (
            "/etc/kubelet.yaml",
            file("maxPods: 50\nkubeReserved:\n  cpu: 100m\n  memory: 1Gi\nclusterDNS: [10.0.0.1, 10.0.0.2]\n"),
        ),
        ("/etc/kubelet.d/20-b.conf", file("maxPods: 70\n")),
        ("/etc/kubelet.d/10-a.conf", file("maxPods: 60\nkubeReserved:\n  memory: 2Gi\nclusterDNS: [10.0.0.9]\n")),
        ("/etc/kubelet.d/30-ignored.yaml", file("maxPods: 99\n")),
        ("/etc/kubelet.d/sub/40-nested.conf", file("syncFrequency: 2m\n")),
    ];
    let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
    let defaults_only = ok(&[], &files);
    assert_eq!(defaults_only.kubelet.max_pods, 110, "files are read only when named");

    let file_only = ok(&["--config=/etc/kubelet.yaml"], &files);
    assert_eq!(file_only.kubelet.max_pods, 50);

    let with_dropins = ok(&["--config=/etc/kubelet.yaml", "--config-dir=/etc/kubelet.d"], &files);
    assert_eq!(with_dropins.kubelet.max_pods, 70, "20-b.conf comes after 10-a.conf; .yaml files are skipped");
    assert_eq!(
        with_dropins.kubelet.kube_reserved,
        Reservation::from([(ReservedResource::Cpu, q("100m")), (ReservedResource::Memory, q("2Gi"))]),
        "maps merge key by key"
    );
    assert_eq!(with_dropins.kubelet.cluster_dns.len(), 1, "lists are replaced");
    assert_eq!(with_dropins.kubelet.sync_frequency, Duration::from_secs(120), "subdirectories are walked");

    let with_flags = ok(
        &["--config=/etc/kubelet.yaml", "--config-dir=/etc/kubelet.d", "--max-pods=80", "--kube-reserved=pid=100"],
        &files,
    );
    assert_eq!(with_flags.kubelet.max_pods, 80, "flags win over files");
    assert_eq!(
        with_flags.kubelet.kube_reserved,
        Reservation::from([(ReservedResource::Pid, q("100"))]),
        "a map flag replaces the file's map"
    );

    let dropins_only = ok(&["--config-dir=/etc/kubelet.d"], &files);
    assert_eq!(dropins_only.kubelet.max_pods, 70, "drop-ins apply without --config");

    // Flag order does not matter for precedence: --max-pods before --config still wins.
    let flag_first = ok(&["--max-pods=5", "--config=/etc/kubelet.yaml"], &files);
    assert_eq!(flag_first.kubelet.max_pods, 5);
}

#[test]
fn kubeadm_drop_in_order_lets_extra_args_win() {
    // kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
    let kubeconfig_args =
        ["--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf", "--kubeconfig=/etc/kubernetes/kubelet.conf"];
    let config_args = ["--config=/var/lib/kubelet/config.yaml"];
    let kubeadm_args =
        ["--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock", "--node-ip=10.0.0.5"];
    let extra_args = ["--container-runtime-endpoint=unix:///run/other.sock", "--max-pods=30"];
    let args: Vec<&str> =
        kubeconfig_args.iter().chain(&config_args).chain(&kubeadm_args).chain(&extra_args).copied().collect();
    let cfg = file("maxPods: 200\ncontainerRuntimeEndpoint: unix:///run/file.sock\n");
    let c = ok(&args, &[("/var/lib/kubelet/config.yaml", &cfg)]);
    assert_eq!(c.kubelet.container_runtime_endpoint, "unix:///run/other.sock");
    assert_eq!(c.kubelet.max_pods, 30);
    assert_eq!(c.flags.node_ip, vec!["10.0.0.5".parse::<IpAddr>().unwrap()]);
    assert!(!c.standalone());
}

/// What `kubeadm init` writes: zero durations and empty strings mean "the
/// default", as in the kubelet's defaulting.
#[test]
fn kubeadm_generated_config_loads_with_defaults() {
    let kubeadm = "\
apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerRuntimeEndpoint: \"\"
cpuManagerReconcilePeriod: 0s
evictionPressureTransitionPeriod: 0s
fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
imageMaximumGCAge: 0s
imageMinimumGCAge: 0s
kind: KubeletConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: \"0\"
    text:
      infoBufferSize: \"0\"
  verbosity: 0
memorySwap: {}
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
rotateCertificates: true
runtimeRequestTimeout: 0s
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
staticPodPath: /etc/kubernetes/manifests
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
volumeStatsAggPeriod: 0s
";
    let c = ok(&["--config=/var/lib/kubelet/config.yaml"], &[("/var/lib/kubelet/config.yaml", kubeadm)]);
    let k = &c.kubelet;
    let d = KubeletConfiguration::default();
    assert_eq!(k.sync_frequency, d.sync_frequency);
    assert_eq!(k.eviction_pressure_transition_period, d.eviction_pressure_transition_period);
    assert_eq!(k.authentication.webhook_cache_ttl, d.authentication.webhook_cache_ttl);
    assert_eq!(k.authorization.webhook_cache_authorized_ttl, d.authorization.webhook_cache_authorized_ttl);
    assert_eq!(k.container_runtime_endpoint, d.container_runtime_endpoint);
    assert_eq!(k.logging.flush_frequency, d.logging.flush_frequency);
    assert_eq!(k.streaming_connection_idle_timeout, Duration::from_secs(4 * 3600));
    assert_eq!(k.cgroup_driver, CgroupDriver::Systemd);
    assert_eq!(k.static_pod_path, Some("/etc/kubernetes/manifests".into()));
    assert_eq!(k.authentication.client_ca_file, Some("/etc/kubernetes/pki/ca.crt".into()));
    assert!(k.rotate_certificates);
    assert_eq!(k.eviction_hard, d.eviction_hard);
    // Durations swiftlet accepts without acting on are defaulted as
    // upstream's v1beta1 defaults them when kubeadm writes 0s.
    let z = c.configz();
    let z = &z["kubeletconfig"];
    assert_eq!(z["streamingConnectionIdleTimeout"], "4h0m0s");
    assert_eq!(z["volumeStatsAggPeriod"], "1m0s");
    assert_eq!(z["cpuManagerReconcilePeriod"], "10s");
    assert_eq!(z["httpCheckFrequency"], "20s");
}
