//! Command-line-only settings: the kubelet's KubeletFlags and swiftlet's
//! own flags.

use std::{collections::BTreeMap, net::IpAddr, path::PathBuf, time::Duration};

use super::{error::ConfigError, flags::ParsedFlags, validation, values::Ctx};
use crate::signals::SourceChoice;

/// The kubelet's settings that exist only as flags.
#[derive(Clone, Debug, PartialEq)]
pub struct KubeletFlags {
    /// --config
    pub config: Option<PathBuf>,
    /// --config-dir
    pub config_dir: Option<PathBuf>,
    /// --kubeconfig; None means standalone mode.
    pub kubeconfig: Option<PathBuf>,
    pub bootstrap_kubeconfig: Option<PathBuf>,
    pub cert_dir: PathBuf,
    pub hostname_override: Option<String>,
    /// --node-ip: one address, or two of different families.
    pub node_ip: Vec<IpAddr>,
    pub node_labels: BTreeMap<String, String>,
    pub root_dir: PathBuf,
    /// "external" or None.
    pub cloud_provider: Option<String>,
    /// Deprecated; accepted and ignored.
    pub pod_infra_container_image: Option<String>,
    pub runtime_cgroups: Option<String>,
    pub lock_file: Option<PathBuf>,
    pub exit_on_lock_contention: bool,
    /// --image-credential-provider-config: a CredentialProviderConfig file.
    pub image_credential_provider_config: Option<PathBuf>,
    /// --image-credential-provider-bin-dir: where the plugins named there are.
    pub image_credential_provider_bin_dir: Option<PathBuf>,
}

impl Default for KubeletFlags {
    fn default() -> Self {
        KubeletFlags {
            config: None,
            config_dir: None,
            kubeconfig: None,
            bootstrap_kubeconfig: None,
            cert_dir: "/var/lib/kubelet/pki".into(),
            hostname_override: None,
            node_ip: vec![],
            node_labels: BTreeMap::new(),
            root_dir: "/var/lib/kubelet".into(),
            cloud_provider: None,
            pod_infra_container_image: None,
            runtime_cgroups: None,
            lock_file: None,
            exit_on_lock_contention: false,
            image_credential_provider_config: None,
            image_credential_provider_bin_dir: None,
        }
    }
}

/// swiftlet's own flags.
#[derive(Clone, Debug, PartialEq)]
pub struct SwiftletOptions {
    /// --signal-source: auto (eBPF, falling back to cgroupfs), ebpf, cgroupfs.
    pub signal_source: SourceChoice,
    /// --kernel-eviction: kill the victims of hard memory/PID thresholds
    /// on the kernel-event fast path.
    pub kernel_eviction: bool,
    /// --housekeeping-interval: the safety-net re-evaluation period.
    pub housekeeping_interval: Duration,
    /// --standalone: no API server even if a kubeconfig is given.
    pub standalone: bool,
    /// --node-shutdown-marker: its appearance means the node is shutting
    /// down (None: only systemd and init are asked).
    pub node_shutdown_marker: Option<PathBuf>,
    /// --evict-static-pods: static pods below system-cluster-critical may
    /// be evicted (off: as the kubelet, never).
    pub evict_static_pods: bool,
    /// --memory-reclaim-before-eviction: on cgroup v2 (memory.reclaim,
    /// kernel 5.19+), a memory line crossed asks the kernel to reclaim the
    /// pods' page cache first and evicts only if that is not enough (off:
    /// as the kubelet, the working set is evicted on).
    pub memory_reclaim_before_eviction: bool,
    /// --eviction-realtime-priority: the signal source's reader thread
    /// (which kills at a crossing) runs under SCHED_FIFO at this priority;
    /// None: the normal scheduler.
    pub eviction_realtime_priority: Option<u8>,
    /// How the kubelet API holds up under abuse (--server-*,
    /// --token-review-*, --container-logs-follows-per-user).
    pub server: ServerLimits,
}

/// swiftlet's limits on the kubelet API (the kubelet has none of these).
#[derive(Clone, Debug, PartialEq)]
pub struct ServerLimits {
    pub max_connections: usize,
    pub request_header_timeout: Duration,
    pub idle_timeout: Duration,
    pub write_timeout: Duration,
    /// TokenReviews per second (0: none are sent).
    pub token_review_qps: u32,
    pub token_review_burst: u32,
    pub log_follows_per_user: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 1024,
            request_header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(90),
            write_timeout: Duration::from_secs(60),
            token_review_qps: 10,
            token_review_burst: 20,
            log_follows_per_user: 10,
        }
    }
}

impl Default for SwiftletOptions {
    fn default() -> Self {
        SwiftletOptions {
            signal_source: SourceChoice::Auto,
            kernel_eviction: true,
            housekeeping_interval: Duration::from_secs(10),
            standalone: false,
            node_shutdown_marker: Some(PathBuf::from("/run/swiftlet/node-shutdown")),
            evict_static_pods: false,
            memory_reclaim_before_eviction: false,
            eviction_realtime_priority: Some(10),
            server: ServerLimits::default(),
        }
    }
}

/// Reads the command-line-only flags; returns warnings to log.
pub fn read(cx: &Ctx, parsed: &ParsedFlags) -> Result<(KubeletFlags, SwiftletOptions, Vec<String>), ConfigError> {
    let mut f = KubeletFlags::default();
    let mut s = SwiftletOptions::default();
    let mut warnings = vec![];
    let string = |name: &str| -> Result<Option<String>, ConfigError> {
        parsed.get(name).map(|n| cx.string(n, "")).transpose().map(|v| v.filter(|s| !s.is_empty()))
    };
    let path = |name: &str| string(name).map(|v| v.map(PathBuf::from));

    f.config = path("config")?;
    f.config_dir = path("config-dir")?;
    f.kubeconfig = path("kubeconfig")?;
    f.bootstrap_kubeconfig = path("bootstrap-kubeconfig")?;
    if let Some(p) = path("cert-dir")? {
        f.cert_dir = p;
    }
    f.hostname_override = string("hostname-override")?.map(|h| h.trim().to_lowercase()).filter(|h| !h.is_empty());
    if let Some(n) = parsed.get("node-ip") {
        let raw = cx.string(n, "")?;
        let ips: Vec<IpAddr> = raw
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| s.trim().parse().map_err(|_| cx.err(n, "", format!("{s:?} is not an IP address"))))
            .collect::<Result<_, _>>()?;
        if ips.len() > 2 || (ips.len() == 2 && ips[0].is_ipv4() == ips[1].is_ipv4()) {
            return Err(cx.err(n, "", format!("{raw:?}: expected one IP address, or one IPv4 and one IPv6 address")));
        }
        f.node_ip = ips;
    }
    if let Some(n) = parsed.get("node-labels") {
        for (k, v, entry) in cx.string_map(n, "")? {
            if let Err(why) = validation::qualified_name(&k) {
                return Err(cx.err(entry, "", format!("label key {k:?} {why}")));
            }
            if let Err(why) = validation::label_value(&v) {
                return Err(cx.err(entry, "", format!("label {k:?}: value {v:?} {why}")));
            }
            if !validation::kubelet_may_set_label(&k) {
                return Err(cx.err(
                    entry,
                    "",
                    format!("the kubelet may not set {k:?}: {}", validation::kubelet_label_rule()),
                ));
            }
            f.node_labels.insert(k, v);
        }
    }
    if let Some(p) = path("root-dir")? {
        f.root_dir = p;
    }
    if let Some(n) = parsed.get("cloud-provider") {
        match cx.string(n, "")?.as_str() {
            "" => {}
            "external" => f.cloud_provider = Some("external".into()),
            other => {
                return Err(cx.err(n, "", format!("{other:?} is not supported: only \"external\" or empty")));
            }
        }
    }
    f.pod_infra_container_image = string("pod-infra-container-image")?;
    if f.pod_infra_container_image.is_some() {
        warnings.push(
            "--pod-infra-container-image is deprecated and ignored: the sandbox image comes from the container runtime"
                .to_owned(),
        );
    }
    f.runtime_cgroups = string("runtime-cgroups")?;
    f.lock_file = path("lock-file")?;
    if let Some(n) = parsed.get("exit-on-lock-contention") {
        f.exit_on_lock_contention = cx.boolean(n, "")?;
    }
    // Accepted flags swiftlet does not act on are named at start.
    let unimplemented = [
        ("runtime-cgroups", f.runtime_cgroups.is_some(), "the runtime's cgroup is left as it is"),
        ("lock-file", f.lock_file.is_some(), "no lock file is taken"),
        ("exit-on-lock-contention", f.exit_on_lock_contention, "no lock file is taken"),
    ];
    for (flag, set, why) in unimplemented {
        if set {
            warnings.push(format!("--{flag} is not implemented ({why})"));
        }
    }
    f.image_credential_provider_config = path("image-credential-provider-config")?;
    f.image_credential_provider_bin_dir = path("image-credential-provider-bin-dir")?;
    if let (Some(_), None) = (&f.image_credential_provider_config, &f.image_credential_provider_bin_dir) {
        let n = parsed.get("image-credential-provider-config").expect("read above");
        return Err(cx.err(n, "", "needs --image-credential-provider-bin-dir (where the plugins are)"));
    }

    if let Some(n) = parsed.get("signal-source") {
        let raw = cx.string(n, "")?;
        s.signal_source = raw.parse().map_err(|e: String| cx.err(n, "", e))?;
    }
    if let Some(n) = parsed.get("kernel-eviction") {
        s.kernel_eviction = cx.boolean(n, "")?;
    }
    if let Some(n) = parsed.get("housekeeping-interval") {
        let d = cx.duration(n, "")?;
        if d.is_zero() {
            return Err(cx.err(n, "", "must be above zero"));
        }
        s.housekeeping_interval = d;
    }
    if let Some(n) = parsed.get("standalone") {
        s.standalone = cx.boolean(n, "")?;
    }
    if let Some(n) = parsed.get("node-shutdown-marker") {
        let raw = cx.string(n, "")?;
        s.node_shutdown_marker = (!raw.is_empty()).then(|| PathBuf::from(raw));
    }
    if let Some(n) = parsed.get("evict-static-pods") {
        s.evict_static_pods = cx.boolean(n, "")?;
    }
    if let Some(n) = parsed.get("memory-reclaim-before-eviction") {
        s.memory_reclaim_before_eviction = cx.boolean(n, "")?;
    }
    if let Some(n) = parsed.get("eviction-realtime-priority") {
        let p = cx.int_in(n, "", 0, 99)?;
        s.eviction_realtime_priority = (p > 0).then_some(p as u8);
    }
    read_server_limits(cx, parsed, &mut s.server)?;
    for name in ["help", "version"] {
        if let Some(n) = parsed.get(name) {
            let v = cx.string(n, "")?;
            if super::values::parse_go_bool(&v).is_none() && !(name == "version" && v == "raw") {
                return Err(cx.err(n, "", format!("{v:?} is not a boolean (true or false)")));
            }
        }
    }
    Ok((f, s, warnings))
}

fn read_server_limits(cx: &Ctx, parsed: &ParsedFlags, l: &mut ServerLimits) -> Result<(), ConfigError> {
    let count = |name: &str, min: i64| -> Result<Option<i64>, ConfigError> {
        parsed.get(name).map(|n| cx.int_in(n, "", min, i64::from(u32::MAX))).transpose()
    };
    let positive = |name: &str| -> Result<Option<Duration>, ConfigError> {
        let Some(n) = parsed.get(name) else { return Ok(None) };
        let d = cx.duration(n, "")?;
        if d.is_zero() {
            return Err(cx.err(n, "", "must be above zero"));
        }
        Ok(Some(d))
    };
    if let Some(v) = count("server-max-connections", 1)? {
        l.max_connections = v as usize;
    }
    if let Some(d) = positive("server-request-header-timeout")? {
        l.request_header_timeout = d;
    }
    if let Some(d) = positive("server-idle-timeout")? {
        l.idle_timeout = d;
    }
    if let Some(d) = positive("server-write-timeout")? {
        l.write_timeout = d;
    }
    if let Some(v) = count("token-review-qps", 0)? {
        l.token_review_qps = v as u32;
    }
    if let Some(v) = count("token-review-burst", 1)? {
        l.token_review_burst = v as u32;
    }
    if let Some(v) = count("container-logs-follows-per-user", 1)? {
        l.log_follows_per_user = v as usize;
    }
    Ok(())
}
