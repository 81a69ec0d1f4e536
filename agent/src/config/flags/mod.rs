//! The kubelet's command-line flags, parsed as Go's pflag parses them, and
//! swiftlet's own.
//!
//! Syntax: `--flag=value`, `--flag value`, booleans as `--flag` or
//! `--flag=false` (a bare `--flag false` does not consume `false`), `-v 4`
//! or `-v=4` for the one shorthand, `_` and `-` interchangeable in names,
//! `--` ends the flags. A flag given twice: the later value wins; map flags
//! (`--kube-reserved=cpu=1,memory=2Gi`) start afresh at their first
//! occurrence, replacing the file's map, and merge keys after that; list
//! flags append after their first occurrence (pflag's StringSlice).

use super::{
    error::ConfigError,
    tree::{Node, Origin, Value},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Str,
    Bool,
    Int,
    Duration,
    /// `k=v,k2=v2`
    Map,
    /// `k<v,k2<v2` (eviction thresholds)
    LangleMap,
    /// `Gate=true,Other=false`
    BoolMap,
    /// `a,b,c`
    List,
    /// `key=value:Effect,key2:Effect`
    Taints,
    Help,
    Version,
}

impl Kind {
    fn type_name(self) -> &'static str {
        match self {
            Kind::Str => "string",
            Kind::Bool | Kind::Help => "",
            Kind::Int => "int32",
            Kind::Duration => "duration",
            Kind::Map | Kind::LangleMap => "mapStringString",
            Kind::BoolMap => "mapStringBool",
            Kind::List => "strings",
            Kind::Taints => "[]api.Taint",
            Kind::Version => "version[=true]",
        }
    }

    fn takes_no_value(self) -> bool {
        matches!(self, Kind::Bool | Kind::Help | Kind::Version)
    }
}

/// Where a flag's value goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// A KubeletConfiguration field, by its path of camelCase names.
    Config(&'static [&'static str]),
    /// A command-line-only setting (the kubelet's KubeletFlags, or swiftlet's).
    Flag,
}

#[derive(Debug)]
pub struct FlagDef {
    pub name: &'static str,
    pub shorthand: Option<char>,
    pub kind: Kind,
    pub target: Target,
    /// Shown in --help for command-line-only flags (config fields show
    /// their KubeletConfiguration default).
    pub default: Option<&'static str>,
    pub help: &'static str,
}

const fn cfg(name: &'static str, path: &'static [&'static str], kind: Kind, help: &'static str) -> FlagDef {
    FlagDef { name, shorthand: None, kind, target: Target::Config(path), default: None, help }
}

const fn only(name: &'static str, kind: Kind, default: Option<&'static str>, help: &'static str) -> FlagDef {
    FlagDef { name, shorthand: None, kind, target: Target::Flag, default, help }
}

use Kind::*;

/// Every flag swiftlet accepts, sorted by name.
pub static FLAGS: &[FlagDef] = &[
    cfg("address", &["address"], Str, "The IP address for the Kubelet to serve on (0.0.0.0 or :: for all interfaces)"),
    cfg(
        "allowed-unsafe-sysctls",
        &["allowedUnsafeSysctls"],
        List,
        "Unsafe sysctls or sysctl patterns (ending in *) pods may use",
    ),
    cfg(
        "anonymous-auth",
        &["authentication", "anonymous", "enabled"],
        Bool,
        "Enables anonymous requests to the Kubelet server",
    ),
    cfg(
        "authentication-token-webhook",
        &["authentication", "webhook", "enabled"],
        Bool,
        "Use the TokenReview API to determine authentication for bearer tokens",
    ),
    cfg(
        "authentication-token-webhook-cache-ttl",
        &["authentication", "webhook", "cacheTTL"],
        Duration,
        "The duration to cache responses from the webhook token authenticator",
    ),
    cfg(
        "authorization-mode",
        &["authorization", "mode"],
        Str,
        "Authorization mode for Kubelet server: AlwaysAllow or Webhook",
    ),
    cfg(
        "authorization-webhook-cache-authorized-ttl",
        &["authorization", "webhook", "cacheAuthorizedTTL"],
        Duration,
        "The duration to cache 'authorized' responses from the webhook authorizer",
    ),
    cfg(
        "authorization-webhook-cache-unauthorized-ttl",
        &["authorization", "webhook", "cacheUnauthorizedTTL"],
        Duration,
        "The duration to cache 'unauthorized' responses from the webhook authorizer",
    ),
    only(
        "bootstrap-kubeconfig",
        Str,
        None,
        "Path to a kubeconfig file used to get a client certificate for the kubelet",
    ),
    only("cert-dir", Str, Some("/var/lib/kubelet/pki"), "The directory where the TLS certs are located"),
    cfg("cgroup-driver", &["cgroupDriver"], Str, "Driver the kubelet uses to manipulate cgroups: cgroupfs or systemd"),
    cfg("cgroup-root", &["cgroupRoot"], Str, "Root cgroup to use for pods"),
    cfg("cgroups-per-qos", &["cgroupsPerQOS"], Bool, "Enable creation of QoS cgroup hierarchy"),
    cfg(
        "client-ca-file",
        &["authentication", "x509", "clientCAFile"],
        Str,
        "Authenticate client certificates signed by one of the authorities in this bundle",
    ),
    only("cloud-provider", Str, None, "The provider for cloud services; only \"external\" or empty is meaningful"),
    cfg("cluster-dns", &["clusterDNS"], List, "Comma-separated list of DNS server IP addresses"),
    cfg("cluster-domain", &["clusterDomain"], Str, "Domain for this cluster"),
    only("config", Str, None, "The Kubelet will load its initial configuration from this file"),
    only(
        "config-dir",
        Str,
        None,
        "Directory of drop-in configuration files (*.conf, merged in lexical order over --config)",
    ),
    cfg(
        "container-log-max-files",
        &["containerLogMaxFiles"],
        Int,
        "Maximum number of container log files for a container (at least 2)",
    ),
    cfg(
        "container-log-max-size",
        &["containerLogMaxSize"],
        Str,
        "Maximum size of a container log file before it is rotated (e.g. 10Mi)",
    ),
    cfg(
        "container-log-max-workers",
        &["containerLogMaxWorkers"],
        Int,
        "Maximum number of concurrent log rotation workers",
    ),
    cfg(
        "container-log-monitor-interval",
        &["containerLogMonitorInterval"],
        Duration,
        "Interval at which container logs are checked for rotation",
    ),
    only(
        "container-logs-follows-per-user",
        Int,
        Some("10"),
        "swiftlet: /containerLogs?follow=true streams one authenticated user may hold open at once (more get 429)",
    ),
    cfg(
        "container-runtime-endpoint",
        &["containerRuntimeEndpoint"],
        Str,
        "The endpoint of the container runtime service (unix socket)",
    ),
    cfg(
        "cpu-cfs-quota",
        &["cpuCFSQuota"],
        Bool,
        "Enable CPU CFS quota enforcement for containers that specify CPU limits",
    ),
    cfg("cpu-cfs-quota-period", &["cpuCFSQuotaPeriod"], Duration, "The CPU CFS quota period (cpu.cfs_period_us)"),
    cfg("cpu-manager-policy", &["cpuManagerPolicy"], Str, "CPU manager policy (only none; others are refused)"),
    cfg(
        "cpu-manager-reconcile-period",
        &["cpuManagerReconcilePeriod"],
        Duration,
        "CPU manager reconciliation period (not implemented: logged when set)",
    ),
    cfg("enable-server", &["enableServer"], Bool, "Enable the Kubelet's server"),
    cfg(
        "enforce-node-allocatable",
        &["enforceNodeAllocatable"],
        List,
        "Node allocatable enforcements: none, pods, system-reserved, kube-reserved (and their -compressible forms)",
    ),
    cfg("event-burst", &["eventBurst"], Int, "Maximum size of a burst of event records"),
    cfg("event-qps", &["eventRecordQPS"], Int, "Event records per second (0 for no limit)"),
    only(
        "evict-static-pods",
        Bool,
        Some("false"),
        "swiftlet: let eviction take static pods below system-cluster-critical priority, for standalone nodes where static pods are all there is (the kubelet never evicts static or mirror pods)",
    ),
    cfg(
        "eviction-hard",
        &["evictionHard"],
        LangleMap,
        "Hard eviction thresholds (e.g. memory.available<1Gi); setting any replaces the defaults",
    ),
    cfg(
        "eviction-max-pod-grace-period",
        &["evictionMaxPodGracePeriod"],
        Int,
        "Maximum grace period (seconds) for pods terminated by a soft eviction",
    ),
    only(
        "eviction-memory-pressure",
        Str,
        None,
        "swiftlet: evict when tasks stall on memory: the node's memory.pressure some avg10 (percent, e.g. 20) held above this for the grace period sets the SystemMemoryContentionPressure condition and evicts as for memory pressure, woken by the kernel's PSI triggers; each pod's (cgroup v2) gets a warning event; empty or 0: off",
    ),
    only(
        "eviction-memory-pressure-grace-period",
        Duration,
        Some("10s"),
        "swiftlet: how long memory.pressure must stay above --eviction-memory-pressure before it evicts (and between evictions while it stays)",
    ),
    cfg(
        "eviction-minimum-reclaim",
        &["evictionMinimumReclaim"],
        Map,
        "Minimum reclaims (e.g. imagefs.available=2Gi) once eviction starts for a signal",
    ),
    cfg(
        "eviction-pressure-transition-period",
        &["evictionPressureTransitionPeriod"],
        Duration,
        "How long a pressure condition is held after its signal clears",
    ),
    only(
        "eviction-realtime-priority",
        Int,
        Some("10"),
        "swiftlet: SCHED_FIFO priority (1-99) of the thread that reads kernel events and kills at a hard threshold's crossing, so a busy node does not delay it; 0 leaves it in the normal scheduler",
    ),
    cfg(
        "eviction-soft",
        &["evictionSoft"],
        LangleMap,
        "Soft eviction thresholds (e.g. memory.available<1.5Gi), each needing a grace period",
    ),
    cfg(
        "eviction-soft-grace-period",
        &["evictionSoftGracePeriod"],
        Map,
        "Grace periods of soft thresholds (e.g. memory.available=1m30s)",
    ),
    only(
        "exit-on-lock-contention",
        Bool,
        None,
        "Exit when the lock file is contended (not implemented: logged when set)",
    ),
    cfg("fail-swap-on", &["failSwapOn"], Bool, "Fail to start if swap is enabled on the node"),
    cfg("feature-gates", &["featureGates"], BoolMap, "Feature gates (key=true|false); merged with the file's"),
    cfg(
        "file-check-frequency",
        &["fileCheckFrequency"],
        Duration,
        "Duration between checking the static pod path for new data",
    ),
    cfg(
        "hairpin-mode",
        &["hairpinMode"],
        Str,
        "How the kubelet sets up hairpin NAT: promiscuous-bridge, hairpin-veth or none",
    ),
    cfg("healthz-bind-address", &["healthzBindAddress"], Str, "The IP address for the healthz server"),
    cfg("healthz-port", &["healthzPort"], Int, "The port of the localhost healthz endpoint (0 disables)"),
    FlagDef {
        name: "help",
        shorthand: Some('h'),
        kind: Help,
        target: Target::Flag,
        default: None,
        help: "help for swiftlet",
    },
    only(
        "hostname-override",
        Str,
        None,
        "If non-empty, use this string as identification instead of the actual hostname",
    ),
    only(
        "housekeeping-interval",
        Duration,
        Some("10s"),
        "swiftlet: period of the safety-net re-evaluation of eviction thresholds (kernel events trigger it at once)",
    ),
    cfg("http-check-frequency", &["httpCheckFrequency"], Duration, "Duration between checking http for new data"),
    only(
        "image-credential-provider-bin-dir",
        Str,
        None,
        "The path to the directory where credential provider plugin binaries are located",
    ),
    only(
        "image-credential-provider-config",
        Str,
        None,
        "The path to the credential provider plugin config file (CredentialProviderConfig)",
    ),
    cfg(
        "image-gc-high-threshold",
        &["imageGCHighThresholdPercent"],
        Int,
        "Disk usage percent after which image garbage collection always runs",
    ),
    cfg(
        "image-gc-low-threshold",
        &["imageGCLowThresholdPercent"],
        Int,
        "Disk usage percent before which image garbage collection never runs",
    ),
    cfg(
        "image-maximum-gc-age",
        &["imageMaximumGCAge"],
        Duration,
        "Maximum age an image can be unused before it is garbage collected (0 disables)",
    ),
    cfg(
        "image-service-endpoint",
        &["imageServiceEndpoint"],
        Str,
        "The endpoint of the image service (defaults to --container-runtime-endpoint)",
    ),
    only(
        "kernel-eviction",
        Bool,
        Some("true"),
        "swiftlet: kill victims of hard memory and PID thresholds from the kernel-event fast path",
    ),
    cfg(
        "kernel-memcg-notification",
        &["kernelMemcgNotification"],
        Bool,
        "Use kernel memcg notification for memory thresholds (not implemented: logged when set)",
    ),
    cfg("kube-api-burst", &["kubeAPIBurst"], Int, "Burst to use while talking with the API server"),
    cfg("kube-api-qps", &["kubeAPIQPS"], Int, "QPS to use while talking with the API server"),
    cfg(
        "kube-reserved",
        &["kubeReserved"],
        Map,
        "Resources reserved for kubernetes system components (e.g. cpu=200m,memory=500Mi,ephemeral-storage=1Gi,pid=1000)",
    ),
    cfg(
        "kube-reserved-cgroup",
        &["kubeReservedCgroup"],
        Str,
        "Absolute name of the top level cgroup of the kube-reserved components",
    ),
    only(
        "kubeconfig",
        Str,
        None,
        "Path to a kubeconfig file specifying how to connect to the API server; none means standalone mode",
    ),
    cfg(
        "kubelet-cgroups",
        &["kubeletCgroups"],
        Str,
        "Absolute name of the cgroup to isolate the kubelet in (not implemented: logged when set)",
    ),
    cfg(
        "local-storage-capacity-isolation",
        &["localStorageCapacityIsolation"],
        Bool,
        "Enable local ephemeral storage isolation",
    ),
    only("lock-file", Str, None, "The path to a file to use as a lock file (not implemented: logged when set)"),
    cfg("log-flush-frequency", &["logging", "flushFrequency"], Duration, "Maximum seconds between log flushes"),
    cfg("logging-format", &["logging", "format"], Str, "Log format: text (json is accepted and logged as text)"),
    cfg(
        "make-iptables-util-chains",
        &["makeIPTablesUtilChains"],
        Bool,
        "Create the KUBE-IPTABLES-HINT chain (not implemented: logged when set)",
    ),
    cfg("max-open-files", &["maxOpenFiles"], Int, "Number of files that can be opened by the Kubelet process"),
    cfg(
        "max-parallel-image-pulls",
        &["maxParallelImagePulls"],
        Int,
        "Maximum number of image pulls in parallel (requires --serialize-image-pulls=false)",
    ),
    cfg("max-pods", &["maxPods"], Int, "Number of pods that can run on this node"),
    cfg(
        "memory-manager-policy",
        &["memoryManagerPolicy"],
        Str,
        "Memory manager policy (only None; others are refused)",
    ),
    only(
        "memory-reclaim-before-eviction",
        Bool,
        Some("false"),
        "swiftlet: on cgroup v2 (kernel 5.19+), when a hard memory threshold is crossed, reclaim the pods' page cache through memory.reclaim first and evict only if the working set is still over the line or the growth was anonymous; in-kernel kills are then kept for anonymous growth",
    ),
    cfg(
        "minimum-image-ttl-duration",
        &["imageMinimumGCAge"],
        Duration,
        "Minimum age for an unused image before it is garbage collected",
    ),
    only("node-ip", Str, None, "IP address (or comma-separated dual-stack IP addresses) of the node"),
    only(
        "node-labels",
        Map,
        None,
        "Labels to add when registering the node (key=value,...); kubernetes.io labels only from the allowed set",
    ),
    only(
        "node-shutdown-marker",
        Str,
        Some("/run/swiftlet/node-shutdown"),
        "swiftlet: a file whose appearance (made since boot) means the node is shutting down: pods stop as shutdownGracePeriod says (empty: none)",
    ),
    cfg(
        "node-status-max-images",
        &["nodeStatusMaxImages"],
        Int,
        "Maximum number of images reported in node status (-1 for no cap)",
    ),
    cfg(
        "node-status-update-frequency",
        &["nodeStatusUpdateFrequency"],
        Duration,
        "How often the kubelet computes node status and posts it if it changed",
    ),
    cfg("oom-score-adj", &["oomScoreAdj"], Int, "The oom_score_adj of the kubelet process [-1000, 1000]"),
    cfg(
        "pod-cidr",
        &["podCIDR"],
        Str,
        "The CIDR for pod IP addresses in standalone mode (not implemented: logged when set)",
    ),
    only(
        "pod-infra-container-image",
        Str,
        None,
        "Deprecated and ignored: the sandbox image comes from the container runtime",
    ),
    cfg(
        "pod-manifest-path",
        &["staticPodPath"],
        Str,
        "Path to the directory containing static pod files, or to a single static pod file",
    ),
    cfg("pod-max-pids", &["podPidsLimit"], Int, "Maximum number of processes per pod (-1 for no limit)"),
    cfg("pods-per-core", &["podsPerCore"], Int, "Number of pods per core; 0 for no limit"),
    cfg("port", &["port"], Int, "The port for the Kubelet to serve on"),
    cfg(
        "protect-kernel-defaults",
        &["protectKernelDefaults"],
        Bool,
        "Error if kernel tunables differ from the kubelet defaults (not implemented: logged when set)",
    ),
    cfg("provider-id", &["providerID"], Str, "Unique identifier of the node in the cloud provider"),
    cfg(
        "qos-reserved",
        &["qosReserved"],
        Map,
        "Memory reserved for higher QoS classes (not implemented: refused when set)",
    ),
    cfg("read-only-port", &["readOnlyPort"], Int, "The read-only port for the Kubelet to serve on (0 disables)"),
    cfg("register-node", &["registerNode"], Bool, "Register the node with the API server"),
    cfg(
        "register-with-taints",
        &["registerWithTaints"],
        Taints,
        "Register the node with these taints (comma separated <key>=<value>:<effect>)",
    ),
    cfg("registry-burst", &["registryBurst"], Int, "Maximum size of bursty image pulls"),
    cfg("registry-qps", &["registryPullQPS"], Int, "Image pulls per second (0 for no limit)"),
    cfg(
        "reserved-system-cpus",
        &["reservedSystemCPUs"],
        Str,
        "CPU list reserved for system and kubernetes daemons (counted as systemReserved cpu)",
    ),
    cfg("resolv-conf", &["resolvConf"], Str, "Resolver configuration file used as the basis for container DNS"),
    only("root-dir", Str, Some("/var/lib/kubelet"), "Directory path for managing kubelet files"),
    cfg(
        "rotate-certificates",
        &["rotateCertificates"],
        Bool,
        "Rotate the client certificate through the certificates API",
    ),
    cfg(
        "rotate-server-certificates",
        &["serverTLSBootstrap"],
        Bool,
        "Request the serving certificate through the certificates API",
    ),
    only(
        "runtime-cgroups",
        Str,
        None,
        "Absolute name of the cgroup of the container runtime (not implemented: logged when set)",
    ),
    cfg(
        "runtime-request-timeout",
        &["runtimeRequestTimeout"],
        Duration,
        "Timeout of runtime requests except long-running ones (pull, logs, exec, attach)",
    ),
    cfg("seccomp-default", &["seccompDefault"], Bool, "Use RuntimeDefault as the default seccomp profile"),
    cfg("serialize-image-pulls", &["serializeImagePulls"], Bool, "Pull images one at a time"),
    only(
        "server-idle-timeout",
        Duration,
        Some("1m30s"),
        "swiftlet: a connection to the kubelet API with nothing in flight is closed after this long (the kubelet's IdleTimeout)",
    ),
    only(
        "server-max-connections",
        Int,
        Some("1024"),
        "swiftlet: connections the kubelet API holds open (at most half the open-file limit); when full, the oldest one still waiting for a request is closed",
    ),
    only(
        "server-request-header-timeout",
        Duration,
        Some("10s"),
        "swiftlet: time a client of the kubelet API has for its TLS handshake and then for a complete request",
    ),
    only(
        "server-write-timeout",
        Duration,
        Some("1m0s"),
        "swiftlet: a kubelet API response whose client reads nothing for this long is closed (upgraded streams excepted)",
    ),
    only(
        "signal-source",
        Str,
        Some("auto"),
        "swiftlet: where eviction signals come from: auto (eBPF, else cgroupfs), ebpf or cgroupfs",
    ),
    only("standalone", Bool, None, "swiftlet: run without the API server even if a kubeconfig is given"),
    cfg(
        "streaming-connection-idle-timeout",
        &["streamingConnectionIdleTimeout"],
        Duration,
        "Idle timeout of exec, attach and port-forward sessions",
    ),
    cfg(
        "sync-frequency",
        &["syncFrequency"],
        Duration,
        "Max period between synchronizing running containers and config",
    ),
    cfg(
        "system-cgroups",
        &["systemCgroups"],
        Str,
        "Cgroup for non-kernel processes not in a container (not implemented: logged when set)",
    ),
    cfg(
        "system-reserved",
        &["systemReserved"],
        Map,
        "Resources reserved for non-kubernetes components (e.g. cpu=200m,memory=500Mi,ephemeral-storage=1Gi,pid=1000)",
    ),
    cfg(
        "system-reserved-cgroup",
        &["systemReservedCgroup"],
        Str,
        "Absolute name of the top level cgroup of the system-reserved components",
    ),
    cfg("tls-cert-file", &["tlsCertFile"], Str, "File containing the x509 certificate for HTTPS"),
    cfg("tls-cipher-suites", &["tlsCipherSuites"], List, "Cipher suites for the server"),
    cfg("tls-min-version", &["tlsMinVersion"], Str, "Minimum TLS version (VersionTLS12, VersionTLS13)"),
    cfg(
        "tls-private-key-file",
        &["tlsPrivateKeyFile"],
        Str,
        "File containing the x509 private key matching --tls-cert-file",
    ),
    only(
        "token-review-burst",
        Int,
        Some("20"),
        "swiftlet: TokenReviews sent at once before --token-review-qps applies",
    ),
    only(
        "token-review-qps",
        Int,
        Some("10"),
        "swiftlet: TokenReviews per second the webhook authenticator may send (its own limit, apart from kubeAPIQPS); bearer tokens beyond it get 429 at once",
    ),
    cfg(
        "topology-manager-policy",
        &["topologyManagerPolicy"],
        Str,
        "Topology manager policy (only none; others are refused)",
    ),
    cfg(
        "topology-manager-scope",
        &["topologyManagerScope"],
        Str,
        "Topology manager scope (not implemented: logged when set)",
    ),
    FlagDef {
        name: "v",
        shorthand: Some('v'),
        kind: Int,
        target: Target::Config(&["logging", "verbosity"]),
        default: None,
        help: "Number for the log level verbosity",
    },
    FlagDef {
        name: "version",
        shorthand: None,
        kind: Version,
        target: Target::Flag,
        default: None,
        help: "Print version information and quit",
    },
    cfg(
        "volume-plugin-dir",
        &["volumePluginDir"],
        Str,
        "Directory to search for additional volume plugins (not implemented: logged when set)",
    ),
    cfg(
        "volume-stats-agg-period",
        &["volumeStatsAggPeriod"],
        Duration,
        "How often volume disk usage is computed (not implemented: logged when set)",
    ),
];

pub fn lookup(name: &str) -> Option<&'static FlagDef> {
    FLAGS.iter().find(|f| f.name == name)
}

fn lookup_short(c: char) -> Option<&'static FlagDef> {
    FLAGS.iter().find(|f| f.shorthand == Some(c))
}

/// pflag with the kubelet's WordSepNormalizeFunc: `_` is `-`.
fn normalize(name: &str) -> String {
    name.replace('_', "-")
}

/// The command line after parsing: each flag given, once, with its final
/// value (later occurrences merged in as pflag does), in order of first
/// appearance.
#[derive(Debug, Default)]
pub struct ParsedFlags {
    pub values: Vec<(&'static FlagDef, Node)>,
}

impl ParsedFlags {
    pub fn get(&self, name: &str) -> Option<&Node> {
        self.values.iter().find(|(d, _)| d.name == name).map(|(_, n)| n)
    }

    /// A command-line-only string flag's value.
    pub fn string(&self, name: &str) -> Option<&str> {
        match &self.get(name)?.value {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    fn is_true(&self, name: &str) -> bool {
        matches!(self.string(name), Some(s) if super::values::parse_go_bool(s) == Some(true) || s == "raw")
    }

    pub fn help(&self) -> bool {
        self.is_true("help")
    }

    pub fn version(&self) -> bool {
        self.is_true("version")
    }
}

/// Parses the arguments (without the program name).
pub fn parse<I, S>(args: I) -> Result<ParsedFlags, ConfigError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let args: Vec<String> = args.into_iter().map(Into::into).collect();
    let mut out = ParsedFlags::default();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            if let Some(extra) = args.get(i) {
                return Err(ConfigError::command_line(format!("unexpected argument {extra:?}")));
            }
            break;
        }
        let (def, inline) = if let Some(body) = arg.strip_prefix("--") {
            if body.starts_with('-') || body.starts_with('=') {
                return Err(ConfigError::command_line(format!("bad flag syntax: {arg}")));
            }
            let (name, value) = match body.split_once('=') {
                Some((n, v)) => (normalize(n), Some(v.to_owned())),
                None => (normalize(body), None),
            };
            let def = lookup(&name)
                .ok_or_else(|| ConfigError::flag(&name, "unknown flag (swiftlet --help lists the flags)"))?;
            (def, value)
        } else if let Some(body) = arg.strip_prefix('-').filter(|b| !b.is_empty()) {
            let c = body.chars().next().unwrap_or_default();
            let def = lookup_short(c).ok_or_else(|| {
                ConfigError::command_line(format!("unknown shorthand flag {c:?} in {arg} (flags start with --)"))
            })?;
            let rest = &body[c.len_utf8()..];
            let value = if let Some(v) = rest.strip_prefix('=') {
                Some(v.to_owned())
            } else if !rest.is_empty() && !def.kind.takes_no_value() {
                Some(rest.to_owned())
            } else if !rest.is_empty() {
                return Err(ConfigError::command_line(format!("bad flag syntax: {arg}")));
            } else {
                None
            };
            (def, value)
        } else {
            return Err(ConfigError::command_line(format!("unexpected argument {arg:?} (flags start with --)")));
        };
        let value = match inline {
            Some(v) => v,
            None if def.kind.takes_no_value() => "true".to_owned(),
            None => match args.get(i) {
                Some(v) => {
                    i += 1;
                    v.clone()
                }
                None => return Err(ConfigError::flag(def.name, "needs a value")),
            },
        };
        set(&mut out, def, &value)?;
    }
    Ok(out)
}

/// Records one occurrence of a flag.
fn set(out: &mut ParsedFlags, def: &'static FlagDef, raw: &str) -> Result<(), ConfigError> {
    let origin = Origin::Flag(def.name);
    let existing = out.values.iter().position(|(d, _)| d.name == def.name);
    let node = match def.kind {
        Map | LangleMap | BoolMap => {
            let sep = if def.kind == LangleMap { '<' } else { '=' };
            let mut entries = match existing.map(|i| &out.values[i].1.value) {
                Some(Value::Map(e)) => e.clone(),
                _ => vec![],
            };
            for pair in raw.split(',').filter(|p| !p.is_empty()) {
                let Some((k, v)) = pair.split_once(sep) else {
                    let expected = if def.kind == LangleMap {
                        "is not a threshold: expected <signal><<value>, e.g. memory.available<100Mi (the operator must be <)"
                    } else {
                        "is not a key=value pair"
                    };
                    return Err(ConfigError::flag(def.name, format!("{pair:?} {expected}")));
                };
                let (k, v) = (k.trim().to_owned(), v.trim().to_owned());
                let v = Node::str(v, origin.clone());
                match entries.iter_mut().find(|(ek, _)| *ek == k) {
                    Some(e) => e.1 = v,
                    None => entries.push((k, v)),
                }
            }
            Node::new(Value::Map(entries), origin)
        }
        List => {
            let mut items = match existing.map(|i| &out.values[i].1.value) {
                Some(Value::List(l)) => l.clone(),
                _ => vec![],
            };
            items.extend(
                raw.split(',').filter(|s| !raw.is_empty() || !s.is_empty()).map(|s| Node::str(s, origin.clone())),
            );
            Node::new(Value::List(items), origin)
        }
        Taints => Node::new(Value::List(parse_taints(def.name, raw)?), origin),
        Str | Bool | Int | Duration | Help | Version => Node::str(raw, origin),
    };
    match existing {
        Some(i) => out.values[i].1 = node,
        None => out.values.push((def, node)),
    }
    Ok(())
}

/// `key=value:Effect`, `key:Effect` or `key`, comma separated, into the
/// shape of `registerWithTaints` entries (validated with them later).
fn parse_taints(flag: &'static str, raw: &str) -> Result<Vec<Node>, ConfigError> {
    let origin = Origin::Flag(flag);
    let mut out = vec![];
    for spec in raw.split(',').filter(|s| !s.is_empty()) {
        let invalid = || {
            ConfigError::flag(
                flag,
                format!("{spec:?} is not a taint: expected <key>=<value>:<effect> or <key>:<effect>"),
            )
        };
        let parts: Vec<&str> = spec.split(':').collect();
        let (kv, effect) = match parts.as_slice() {
            [kv] => (*kv, None),
            [kv, effect] => (*kv, Some(*effect)),
            _ => return Err(invalid()),
        };
        let kvs: Vec<&str> = kv.split('=').collect();
        let (key, value) = match kvs.as_slice() {
            [k] => (*k, None),
            [k, v] => (*k, Some(*v)),
            _ => return Err(invalid()),
        };
        let mut entries = vec![("key".to_owned(), Node::str(key, origin.clone()))];
        if let Some(v) = value {
            entries.push(("value".to_owned(), Node::str(v, origin.clone())));
        }
        if let Some(e) = effect {
            entries.push(("effect".to_owned(), Node::str(e, origin.clone())));
        }
        out.push(Node::new(Value::Map(entries), origin.clone()));
    }
    Ok(out)
}

/// `swiftlet --help`. `config_default` gives the KubeletConfiguration
/// default of a config field, as flag text, for the `(default ...)` note.
pub fn help_text(config_default: impl Fn(&[&str]) -> Option<String>) -> String {
    let mut rows = vec![];
    for f in FLAGS {
        let short = f.shorthand.map(|c| format!("-{c}, ")).unwrap_or_default();
        let left = format!("  {short:>4}--{} {}", f.name, f.kind.type_name());
        let default = match f.target {
            Target::Config(path) => config_default(path),
            Target::Flag => f.default.map(str::to_owned),
        };
        // pflag quotes string defaults only.
        let default = default.map(|d| if f.kind == Str { format!("{d:?}") } else { d });
        let note = default.map(|d| format!(" (default {d})")).unwrap_or_default();
        rows.push((left, format!("{}{note}", f.help)));
    }
    let width = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0) + 3;
    let mut s = String::from(
        "swiftlet is a Kubernetes node agent (a kubelet) whose eviction path runs in the kernel through eBPF.\n\
         It reads the kubelet's flags and KubeletConfiguration (kubelet.config.k8s.io/v1beta1) files.\n\
         Precedence: defaults < --config < --config-dir drop-ins (lexical order) < flags; a flag given twice: the later wins.\n\n\
         Usage:\n  swiftlet [flags]\n\nFlags:\n",
    );
    for (left, right) in rows {
        s.push_str(&format!("{left:width$}{right}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(args: &[&str]) -> ParsedFlags {
        parse(args.iter().copied()).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    fn str_of(p: &ParsedFlags, name: &str) -> String {
        p.string(name).unwrap_or_else(|| panic!("{name} not set")).to_owned()
    }

    fn map_of(p: &ParsedFlags, name: &str) -> Vec<(String, String)> {
        match &p.get(name).unwrap().value {
            Value::Map(e) => e
                .iter()
                .map(|(k, v)| match &v.value {
                    Value::Str(s) => (k.clone(), s.clone()),
                    other => panic!("{other:?}"),
                })
                .collect(),
            other => panic!("{other:?}"),
        }
    }

    fn list_of(p: &ParsedFlags, name: &str) -> Vec<String> {
        match &p.get(name).unwrap().value {
            Value::List(items) => items
                .iter()
                .map(|n| match &n.value {
                    Value::Str(s) => s.clone(),
                    other => format!("{other:?}"),
                })
                .collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn flag_forms() {
        let cases: &[(&[&str], &str, &str)] = &[
            (&["--max-pods=50"], "max-pods", "50"),
            (&["--max-pods", "50"], "max-pods", "50"),
            (&["--max_pods=50"], "max-pods", "50"),
            (&["--register-node"], "register-node", "true"),
            (&["--register-node=false"], "register-node", "false"),
            (&["--register-node=0"], "register-node", "0"),
            (&["-v", "4"], "v", "4"),
            (&["-v=4"], "v", "4"),
            (&["-v4"], "v", "4"),
            (&["--v=3"], "v", "3"),
            (&["--hostname-override="], "hostname-override", ""),
            (&["--kubeconfig", "--weird-but-a-value"], "kubeconfig", "--weird-but-a-value"),
            (&["--max-pods=1", "--max-pods=2"], "max-pods", "2"),
            (&["--max-pods=1", "--max-pods", "3"], "max-pods", "3"),
            (&["--node-ip=10.0.0.1,fd00::1"], "node-ip", "10.0.0.1,fd00::1"),
            (&["-h"], "help", "true"),
            (&["--version=raw"], "version", "raw"),
        ];
        for (args, name, want) in cases {
            assert_eq!(str_of(&parsed(args), name), *want, "{args:?}");
        }
    }

    #[test]
    fn bool_flag_does_not_consume_the_next_argument() {
        let err = parse(["--register-node", "false"]).unwrap_err();
        assert_eq!(err.to_string(), "command line: unexpected argument \"false\" (flags start with --)");
    }

    #[test]
    fn map_flags_merge_within_the_command_line() {
        let p = parsed(&["--kube-reserved=cpu=1,memory=2Gi", "--kube-reserved", "memory=3Gi, ephemeral-storage = 1Gi"]);
        assert_eq!(
            map_of(&p, "kube-reserved"),
            vec![
                ("cpu".into(), "1".into()),
                ("memory".into(), "3Gi".into()),
                ("ephemeral-storage".into(), "1Gi".into())
            ]
        );
        let p = parsed(&["--eviction-hard=memory.available<500Mi,nodefs.available<10%"]);
        assert_eq!(
            map_of(&p, "eviction-hard"),
            vec![("memory.available".into(), "500Mi".into()), ("nodefs.available".into(), "10%".into())]
        );
        let p = parsed(&["--node-labels=a=b,c=d=e", "--feature-gates=A=true,B=false"]);
        assert_eq!(map_of(&p, "node-labels"), vec![("a".into(), "b".into()), ("c".into(), "d=e".into())]);
        assert_eq!(map_of(&p, "feature-gates"), vec![("A".into(), "true".into()), ("B".into(), "false".into())]);
        assert!(map_of(&parsed(&["--eviction-hard="]), "eviction-hard").is_empty());
    }

    #[test]
    fn list_flags_append_after_the_first() {
        let p =
            parsed(&["--enforce-node-allocatable=pods", "--enforce-node-allocatable=kube-reserved,system-reserved"]);
        assert_eq!(list_of(&p, "enforce-node-allocatable"), vec!["pods", "kube-reserved", "system-reserved"]);
        assert!(list_of(&parsed(&["--enforce-node-allocatable="]), "enforce-node-allocatable").is_empty());
    }

    #[test]
    fn taint_flags() {
        let p = parsed(&["--register-with-taints=a=b:NoSchedule,c:NoExecute,d"]);
        let Value::List(items) = &p.get("register-with-taints").unwrap().value else { panic!() };
        let keys: Vec<Vec<String>> = items
            .iter()
            .map(|n| {
                let Value::Map(e) = &n.value else { panic!() };
                e.iter().map(|(k, v)| format!("{k}={:?}", v.value)).collect()
            })
            .collect();
        assert_eq!(
            keys,
            vec![
                vec!["key=Str(\"a\")", "value=Str(\"b\")", "effect=Str(\"NoSchedule\")"],
                vec!["key=Str(\"c\")", "effect=Str(\"NoExecute\")"],
                vec!["key=Str(\"d\")"],
            ]
        );
    }

    #[test]
    fn errors() {
        let cases: &[(&[&str], &str)] = &[
            (&["--nope=1"], "flag --nope: unknown flag (swiftlet --help lists the flags)"),
            (&["--kubeconfig"], "flag --kubeconfig: needs a value"),
            (&["stray"], "command line: unexpected argument \"stray\" (flags start with --)"),
            (&["--", "x"], "command line: unexpected argument \"x\""),
            (&["---x"], "command line: bad flag syntax: ---x"),
            (&["-x"], "command line: unknown shorthand flag 'x' in -x (flags start with --)"),
            (
                &["--eviction-hard=memory.available>1Gi"],
                "flag --eviction-hard: \"memory.available>1Gi\" is not a threshold: expected <signal><<value>, \
                 e.g. memory.available<100Mi (the operator must be <)",
            ),
            (&["--kube-reserved=cpu"], "flag --kube-reserved: \"cpu\" is not a key=value pair"),
            (
                &["--register-with-taints=a:b:c"],
                "flag --register-with-taints: \"a:b:c\" is not a taint: expected <key>=<value>:<effect> or <key>:<effect>",
            ),
        ];
        for (args, want) in cases {
            assert_eq!(parse(args.iter().copied()).unwrap_err().to_string(), *want, "{args:?}");
        }
    }

    #[test]
    fn table_is_sorted_and_unique() {
        for w in FLAGS.windows(2) {
            assert!(w[0].name < w[1].name, "{} must sort before {}", w[0].name, w[1].name);
        }
    }

    #[test]
    fn help_lists_every_flag() {
        let h = help_text(|_| None);
        for f in FLAGS {
            assert!(h.contains(&format!("--{} ", f.name)), "--{} missing from help", f.name);
        }
        assert!(h.contains("-v, --v int32"));
    }
}
