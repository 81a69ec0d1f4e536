//! The loader against an in-memory filesystem: flag forms, precedence,
//! defaults, thresholds, and the exact error messages.

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    net::IpAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use super::*;
use crate::{
    cm::naming::CgroupDriver,
    config::thresholds::default_hard_thresholds,
    eviction::signal::{EvictionSignal, EvictionThreshold, ThresholdValue},
    quantity::Quantity,
    signals::SourceChoice,
};

/// Files by path; directories are implied. `read_dir` returns entries in
/// reverse order so the loader's own sorting is what is tested.
#[derive(Default)]
struct MemFs(BTreeMap<PathBuf, String>);

impl MemFs {
    fn with(files: &[(&str, &str)]) -> MemFs {
        MemFs(files.iter().map(|(p, t)| (PathBuf::from(p), (*t).to_owned())).collect())
    }
}

impl ConfigFs for MemFs {
    fn read_to_string(&self, path: &Path) -> io::Result<String> {
        self.0.get(path).cloned().ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<(PathBuf, bool)>> {
        let mut out = BTreeSet::new();
        for p in self.0.keys() {
            if let Ok(rest) = p.strip_prefix(dir) {
                let mut parts = rest.components();
                let first = parts.next().expect("file below dir");
                out.insert((dir.join(first), parts.next().is_some()));
            }
        }
        if out.is_empty() {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        Ok(out.into_iter().rev().collect())
    }
}

const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

fn load_mem(args: &[&str], files: &[(&str, &str)]) -> Result<Config, ConfigError> {
    load_with(args.iter().copied(), &MemFs::with(files))
}

fn ok(args: &[&str], files: &[(&str, &str)]) -> Config {
    load_mem(args, files).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn err(args: &[&str], files: &[(&str, &str)]) -> String {
    match load_mem(args, files) {
        Ok(_) => panic!("{args:?} must fail"),
        Err(e) => e.to_string(),
    }
}

fn file(body: &str) -> String {
    format!("{HEAD}{body}")
}

fn q(s: &str) -> Quantity {
    s.parse().unwrap()
}

fn hard(signal: EvictionSignal, v: ThresholdValue) -> EvictionThreshold {
    EvictionThreshold { signal, value: v, grace_period: Duration::ZERO, min_reclaim: None }
}

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

#[test]
fn hard_thresholds_replace_the_defaults() {
    let mem = |v: &str| hard(EvictionSignal::MemoryAvailable, ThresholdValue::Quantity(q(v)));
    let cfg = |body: &str| file(body);
    type Case = (&'static str, Vec<&'static str>, Vec<(&'static str, String)>, Vec<EvictionThreshold>);
    let cases: Vec<Case> = vec![
        (
            "file sets one",
            vec!["--config=/k.yaml"],
            vec![("/k.yaml", cfg("evictionHard:\n  memory.available: 1Gi\n"))],
            vec![mem("1Gi")],
        ),
        ("flag sets one", vec!["--eviction-hard=memory.available<2Gi"], vec![], vec![mem("2Gi")]),
        (
            "flag replaces the file's map",
            vec!["--config=/k.yaml", "--eviction-hard=memory.available<2Gi"],
            vec![("/k.yaml", cfg("evictionHard:\n  nodefs.available: 20%\n"))],
            vec![mem("2Gi")],
        ),
        ("an empty map means none", vec!["--config=/k.yaml"], vec![("/k.yaml", cfg("evictionHard: {}\n"))], vec![]),
        ("an empty flag means none", vec!["--eviction-hard="], vec![], vec![]),
        (
            "0% replaces the defaults and is itself ignored",
            vec!["--config=/k.yaml"],
            vec![("/k.yaml", cfg("evictionHard:\n  memory.available: 0%\n"))],
            vec![],
        ),
        ("null means the defaults", vec!["--config=/k.yaml"], vec![("/k.yaml", cfg("evictionHard: null\n"))], {
            let mut d = default_hard_thresholds();
            d.sort_by_key(|t| t.signal);
            d
        }),
        (
            "mergeDefaultEvictionSettings keeps the other defaults",
            vec!["--config=/k.yaml"],
            vec![(
                "/k.yaml",
                cfg(
                    "mergeDefaultEvictionSettings: true\nevictionHard:\n  memory.available: 1Gi\n  imagefs.available: 0%\n",
                ),
            )],
            vec![
                mem("1Gi"),
                hard(EvictionSignal::NodeFsAvailable, ThresholdValue::Percentage(0.10)),
                hard(EvictionSignal::NodeFsInodesFree, ThresholdValue::Percentage(0.05)),
            ],
        ),
        (
            // The kubelet merges a drop-in into the main file's effective
            // map, which is the defaults when the main file has none.
            "a drop-in's evictionHard merges into the defaults",
            vec!["--config-dir=/d"],
            vec![("/d/10.conf", cfg("evictionHard:\n  memory.available: 1Gi\n  nodefs.inodesFree: null\n"))],
            vec![
                mem("1Gi"),
                hard(EvictionSignal::NodeFsAvailable, ThresholdValue::Percentage(0.10)),
                hard(EvictionSignal::ImageFsAvailable, ThresholdValue::Percentage(0.15)),
            ],
        ),
        (
            "a drop-in merges into the main file's map",
            vec!["--config=/k.yaml", "--config-dir=/d"],
            vec![
                ("/k.yaml", cfg("evictionHard:\n  memory.available: 1Gi\n")),
                ("/d/10.conf", cfg("evictionHard:\n  pid.available: 100\n")),
            ],
            vec![mem("1Gi"), hard(EvictionSignal::PidAvailable, ThresholdValue::Quantity(q("100")))],
        ),
    ];
    for (name, args, files, want) in cases {
        let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
        let c = ok(&args, &files);
        assert_eq!(c.kubelet.eviction_hard, want, "{name}");
    }
}

#[test]
fn allocatable_memory_twins_follow_enforcement() {
    let c = ok(&["--eviction-hard=memory.available<500Mi"], &[]);
    let signals: Vec<EvictionSignal> = c.kubelet.eviction_thresholds().iter().map(|t| t.signal).collect();
    assert_eq!(signals, vec![EvictionSignal::MemoryAvailable, EvictionSignal::AllocatableMemoryAvailable]);
    let c = ok(&["--eviction-hard=memory.available<500Mi", "--enforce-node-allocatable=none"], &[]);
    assert_eq!(c.kubelet.eviction_thresholds().len(), 1);
}

#[test]
fn soft_thresholds_with_grace_and_reclaim_from_a_file() {
    let cfg = file(
        "evictionSoft:\n  memory.available: 1.5Gi\n  nodefs.available: 15%\nevictionSoftGracePeriod:\n  memory.available: 1m30s\n  nodefs.available: 2m\nevictionMinimumReclaim:\n  nodefs.available: 5%\n  memory.available: 0\nevictionMaxPodGracePeriod: 60\n",
    );
    let c = ok(&["--config=/k.yaml"], &[("/k.yaml", &cfg)]);
    let soft = &c.kubelet.eviction_soft;
    assert_eq!(soft.len(), 2);
    assert_eq!(soft[0].signal, EvictionSignal::MemoryAvailable);
    assert_eq!(soft[0].value, ThresholdValue::Quantity(q("1.5Gi")));
    assert_eq!(soft[0].grace_period, Duration::from_secs(90));
    assert_eq!(soft[0].min_reclaim, Some(ThresholdValue::Quantity(q("0"))));
    assert_eq!(soft[1].grace_period, Duration::from_secs(120));
    assert_eq!(soft[1].min_reclaim, Some(ThresholdValue::Percentage(0.05)));
    let nodefs_hard = c.kubelet.eviction_hard.iter().find(|t| t.signal == EvictionSignal::NodeFsAvailable).unwrap();
    assert_eq!(nodefs_hard.min_reclaim, Some(ThresholdValue::Percentage(0.05)), "reclaims apply to hard ones too");
    assert_eq!(c.kubelet.eviction_max_pod_grace_period, 60);
}

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
            "/k.yaml:4: not valid YAML: did not find expected ',' or ']', while parsing a flow sequence".into(),
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
