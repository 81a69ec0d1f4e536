//! `swiftlet events`: kernel events as JSON lines (the /debug/events
//! format) on stdout.
//!
//! With the agent running it streams the agent's own events from its debug
//! socket (`<root-dir>/swiftlet/debug.sock`): crossings of the lines the
//! eviction manager programmed, OOM kills, in-kernel kills and evictions.
//! Without it (or with `--attach`) it loads its own instance of the
//! kernel programs, registers the pods' and containers' cgroups, programs
//! the hard-threshold lines of the configuration (memory.available,
//! allocatableMemory.available, pid.available) and reports their crossings
//! and the kernel's OOM kills. Remote: `kubectl get --raw
//! /api/v1/nodes/<node>/proxy/debug/events`.

use parking_lot::RwLock;

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    path::Path,
    sync::Arc,
    time::Duration,
};

use super::{
    CliError,
    attach::{Attached, Names, RuntimePods},
    split_args,
};
use crate::{
    cm::allocatable::{Resource, enforced_allocatable, machine_capacity},
    config::Config,
    eviction::observe::{NodeInfo, kernel_lines},
    server::{
        debug_socket_path,
        events::{PodRef, from_signal, pod_uid_of_cgroup},
    },
    signals::{SignalEvent, node},
};

const USAGE: &str = "\
Usage: swiftlet events [--attach] [--socket PATH] [--agent-pid PID] [kubelet flags]

Streams kernel events as JSON lines: threshold crossings, OOM kills,
in-kernel kills and evictions, each with its kernel timestamp and pod.

  --attach        load the kernel programs here even if the agent runs
  --socket PATH   the agent's debug socket (default <root-dir>/swiftlet/debug.sock)

It looks where the running agent looks (its command line, read from /proc;
--agent-pid picks one when several run). Kubelet flags (--config, --root-dir,
--cgroup-root, --eviction-hard, --container-runtime-endpoint, ...) say where
to look and which lines to watch instead.
";

pub fn run(args: &[String]) -> Result<(), CliError> {
    let (own, rest) = split_args(args, &["socket", "agent-pid"], &["attach", "help"])?;
    let opt = |k: &str| own.iter().rev().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    if opt("help").is_some() {
        print!("{USAGE}");
        return Ok(());
    }
    let agent_pid = match opt("agent-pid") {
        Some(p) => Some(p.parse::<u32>().map_err(|_| CliError::Usage(format!("--agent-pid {p:?}: expected a pid")))?),
        None => None,
    };
    let (config, _) = super::running::subcommand_config(rest, agent_pid)?;
    let attach = opt("attach").is_some_and(|v| v != "false");
    if !attach {
        let socket = opt("socket").map(Into::into).unwrap_or_else(|| debug_socket_path(&config.flags.root_dir));
        match UnixStream::connect(&socket) {
            Ok(s) => return stream_from_agent(s, &socket),
            Err(e) => eprintln!("swiftlet events: no agent at {} ({e}); attaching to the kernel", socket.display()),
        }
    }
    attach_and_stream(&config)
}

/// Copies the agent's /debug/events to stdout, line by line.
fn stream_from_agent(mut s: UnixStream, socket: &Path) -> Result<(), CliError> {
    // HTTP/1.0: the body is the rest of the connection.
    s.write_all(b"GET /debug/events HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status)?;
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(CliError::Usage(format!("{}: /debug/events answered {}", socket.display(), status.trim())));
    }
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
    }
    let stdout = std::io::stdout();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut out = stdout.lock();
        out.write_all(line.as_bytes())?;
        out.flush()?;
    }
}

/// The node figures the kernel lines are computed from.
fn node_info(config: &Config, kubepods: String) -> NodeInfo {
    let k = &config.kubelet;
    let memory_capacity = node::mem_total().unwrap_or(0);
    let allocatable_memory = machine_capacity(&config.flags.root_dir, k.max_pods, k.pods_per_core)
        .ok()
        .map(|cap| enforced_allocatable(&cap, &k.kube_reserved, &k.system_reserved))
        .and_then(|a| a.get(&Resource::Memory).map(|q| q.value().max(0) as u64))
        .unwrap_or(memory_capacity);
    NodeInfo {
        memory_capacity,
        allocatable_memory,
        pid_limit: node::pid_limit().unwrap_or(u64::MAX),
        kubepods_cgroup: kubepods,
    }
}

fn attach_and_stream(config: &Config) -> Result<(), CliError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // The runtime client connects lazily on the runtime's reactor.
    let _entered = rt.enter();
    let mut attached = Attached::open(config)?;
    let names = Arc::new(RuntimePods::default());
    let ids: Arc<RwLock<HashMap<u64, String>>> = Arc::default();
    let refresh = |attached: &mut Attached, rt: &tokio::runtime::Runtime| {
        let found = attached.rescan();
        let mut by_id = HashMap::new();
        for f in &found {
            if let Ok(id) = attached.fs.cgroup_id(&f.path) {
                by_id.insert(id, f.path.clone());
            }
        }
        *ids.write() = by_id;
        let n: Names = rt.block_on(attached.names());
        *names.0.write() = n;
    };
    refresh(&mut attached, &rt);
    let info = node_info(config, attached.naming.kubepods());
    for l in kernel_lines(&config.kubelet.eviction_thresholds(), &info) {
        if let Err(e) = attached.opened.source.set_threshold(&l.target, l.signal, Some(l.threshold)) {
            eprintln!("swiftlet events: cannot watch {}: {e}", l.eviction_signal);
        }
    }
    eprintln!(
        "swiftlet events: attached ({} source, {} cgroups under {})",
        attached.opened.source.mode().as_str(),
        attached.registered.len(),
        attached.naming.kubepods()
    );
    let (sink_names, sink_ids) = (names.clone(), ids.clone());
    attached.opened.source.subscribe(Arc::new(move |e: SignalEvent| {
        // An OOM victim's memcg may be a container's that is not
        // registered: find it by id among what was discovered.
        let e = match e {
            SignalEvent::OomKill { cgroup: None, cgroup_id, pid, at_ns, received_ns } => SignalEvent::OomKill {
                cgroup: sink_ids.read().get(&cgroup_id).cloned(),
                cgroup_id,
                pid,
                at_ns,
                received_ns,
            },
            e => e,
        };
        let resolve = |cg: &str| {
            let uid = pod_uid_of_cgroup(cg)?;
            let n = sink_names.0.read();
            Some(match n.pods.get(&uid) {
                Some(p) => PodRef { namespace: p.namespace.clone(), name: p.name.clone(), uid },
                None => PodRef { namespace: String::new(), name: String::new(), uid },
            })
        };
        if let Some(d) = from_signal(&e, &resolve)
            && let Ok(json) = serde_json::to_string(&d)
        {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{json}");
            let _ = out.flush();
        }
    }));
    loop {
        std::thread::sleep(Duration::from_secs(2));
        refresh(&mut attached, &rt);
    }
}
