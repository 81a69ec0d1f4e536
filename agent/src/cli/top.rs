//! `swiftlet top`: a live terminal view of the pods' and containers'
//! memory working set, headroom to their memory limit, processes and
//! inodes, read from the BPF maps of its own instance of the kernel
//! programs (so it works with or without the agent), refreshed every
//! interval, sorted and filtered from the keyboard.

use std::{
    collections::HashMap,
    io::{self, IsTerminal, Write},
    time::{Duration, Instant},
};

use super::{
    CliError,
    attach::{Attached, Found, Names},
    split_args,
};
use crate::{
    config::Config,
    eviction::signal::EvictionSignal,
    signals::{CgroupKind, Snapshot, node},
};

const USAGE: &str = "\
Usage: swiftlet top [--sort memory|headroom|processes|inodes|name] [--filter TEXT]
                    [--interval SECONDS] [--once] [--agent-pid PID] [kubelet flags]

A live view of each pod and container: working set, memory limit, headroom
(limit − working set), processes and inodes, from the kernel's counters.

It looks where the running agent looks (its command line, read from /proc):
--agent-pid picks one when several run; kubelet flags (--config, --root-dir,
--cgroup-root, --container-runtime-endpoint, ...) say where to look instead.

Keys: q quit · s next sort · m/h/p/i/n sort by memory/headroom/processes/
inodes/name · / filter (Enter to keep, Esc to clear)
";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    Memory,
    Headroom,
    Processes,
    Inodes,
    Name,
}

impl SortKey {
    const ALL: [SortKey; 5] = [SortKey::Memory, SortKey::Headroom, SortKey::Processes, SortKey::Inodes, SortKey::Name];

    pub fn parse(s: &str) -> Option<SortKey> {
        SortKey::ALL.into_iter().find(|k| k.name() == s)
    }

    pub fn name(self) -> &'static str {
        match self {
            SortKey::Memory => "memory",
            SortKey::Headroom => "headroom",
            SortKey::Processes => "processes",
            SortKey::Inodes => "inodes",
            SortKey::Name => "name",
        }
    }

    fn next(self) -> SortKey {
        let i = SortKey::ALL.iter().position(|k| *k == self).unwrap_or(0);
        SortKey::ALL[(i + 1) % SortKey::ALL.len()]
    }
}

/// One line of the table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row {
    pub namespace: String,
    pub pod: String,
    /// Empty for the pod's own line.
    pub container: String,
    pub working_set: u64,
    pub limit: Option<u64>,
    pub processes: u64,
    pub inodes: Option<i64>,
}

impl Row {
    pub fn headroom(&self) -> Option<u64> {
        self.limit.map(|l| l.saturating_sub(self.working_set))
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodGroup {
    pub pod: Row,
    pub containers: Vec<Row>,
}

/// The node's line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeLine {
    pub name: String,
    pub working_set: u64,
    pub capacity: u64,
    /// memory.available's hard threshold in bytes.
    pub memory_threshold: Option<u64>,
    pub tasks: u64,
    pub pid_limit: u64,
    pub pid_threshold: Option<u64>,
}

/// Groups the snapshot's cgroups into pods with their containers.
pub fn groups(snapshot: &Snapshot, found: &[Found], names: &Names, limits: &HashMap<String, u64>) -> Vec<PodGroup> {
    let row = |f: &Found| -> Option<Row> {
        let u = snapshot.cgroups.get(&f.path)?;
        let uid = f.pod_uid.clone().unwrap_or_default();
        let (namespace, pod) = match names.pods.get(&uid) {
            Some(p) => (p.namespace.clone(), p.name.clone()),
            None => ("?".to_owned(), format!("pod{uid}")),
        };
        let container = match &f.container_id {
            Some(id) => names.containers.get(id).cloned().unwrap_or_else(|| id.chars().take(12).collect()),
            None => String::new(),
        };
        Some(Row {
            namespace,
            pod,
            container,
            working_set: u.working_set_bytes,
            limit: limits.get(&f.path).copied(),
            processes: u.processes,
            inodes: u.inodes,
        })
    };
    let mut by_pod: HashMap<String, PodGroup> = HashMap::new();
    for f in found.iter().filter(|f| f.kind == CgroupKind::Pod) {
        if let Some(r) = row(f) {
            by_pod.insert(f.path.clone(), PodGroup { pod: r, containers: vec![] });
        }
    }
    for f in found.iter().filter(|f| f.kind == CgroupKind::Container) {
        let parent = f.path.rsplit_once('/').map(|(p, _)| p).unwrap_or_default();
        // The sandbox's pause container has no name in the runtime's
        // container list: it is not shown.
        let named =
            f.container_id.as_ref().is_some_and(|id| names.containers.contains_key(id)) || names.containers.is_empty();
        if let (Some(g), Some(r), true) = (by_pod.get_mut(parent), row(f), named) {
            g.containers.push(r);
        }
    }
    by_pod.into_values().collect()
}

fn cmp_rows(a: &Row, b: &Row, key: SortKey) -> std::cmp::Ordering {
    let name = |r: &Row| (r.namespace.clone(), r.pod.clone(), r.container.clone());
    match key {
        SortKey::Memory => b.working_set.cmp(&a.working_set),
        // Closest to its limit first; no limit last.
        SortKey::Headroom => match (a.headroom(), b.headroom()) {
            (Some(x), Some(y)) => x.cmp(&y),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        },
        SortKey::Processes => b.processes.cmp(&a.processes),
        SortKey::Inodes => b.inodes.unwrap_or(0).cmp(&a.inodes.unwrap_or(0)),
        SortKey::Name => std::cmp::Ordering::Equal,
    }
    .then_with(|| name(a).cmp(&name(b)))
}

/// Filters (case-insensitive substring of namespace, pod or container;
/// a pod matches if it or any container does) and sorts.
pub fn arrange(mut gs: Vec<PodGroup>, key: SortKey, filter: &str) -> Vec<PodGroup> {
    let f = filter.to_lowercase();
    let hit = |r: &Row| {
        f.is_empty()
            || r.namespace.to_lowercase().contains(&f)
            || r.pod.to_lowercase().contains(&f)
            || r.container.to_lowercase().contains(&f)
    };
    gs.retain(|g| hit(&g.pod) || g.containers.iter().any(hit));
    for g in &mut gs {
        g.containers.sort_by(|a, b| cmp_rows(a, b, key));
    }
    gs.sort_by(|a, b| cmp_rows(&a.pod, &b.pod, key));
    gs
}

/// Bytes with a binary unit and one decimal (12.3Mi).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes < 1024 {
        return bytes.to_string();
    }
    let mut v = bytes as f64 / 1024.0;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1}{}", UNITS[i])
}

/// The screen's lines for a frame.
pub fn render(
    node: &NodeLine,
    gs: &[PodGroup],
    key: SortKey,
    filter: &str,
    mode: &str,
    editing: bool,
    width: usize,
) -> Vec<String> {
    let mut out = vec![];
    let available = node.capacity.saturating_sub(node.working_set);
    let mut head =
        format!("swiftlet top · node {} · {} source · sort {} · {} pods", node.name, mode, key.name(), gs.len());
    if !filter.is_empty() || editing {
        head.push_str(&format!(" · filter {filter}{}", if editing { "_" } else { "" }));
    }
    out.push(head);
    let mut mem = format!(
        "memory: working set {} of {} · memory.available {}",
        human(node.working_set),
        human(node.capacity),
        human(available)
    );
    if let Some(t) = node.memory_threshold {
        mem.push_str(&format!(" · eviction below {} ({} away)", human(t), human(available.saturating_sub(t))));
    }
    out.push(mem);
    let mut pids = format!("tasks {} of {}", node.tasks, node.pid_limit);
    if let Some(t) = node.pid_threshold {
        pids.push_str(&format!(
            " · pid.available eviction below {t} ({} away)",
            node.pid_limit.saturating_sub(node.tasks).saturating_sub(t)
        ));
    }
    out.push(pids);
    out.push(String::new());
    out.push(format!(
        "{:<16} {:<28} {:<20} {:>11} {:>10} {:>10} {:>6} {:>7}",
        "NAMESPACE", "POD", "CONTAINER", "WORKING SET", "LIMIT", "HEADROOM", "PROCS", "INODES"
    ));
    let line = |r: &Row, indent: bool| {
        let opt = |v: Option<u64>| v.map(human).unwrap_or_else(|| "-".into());
        format!(
            "{:<16} {:<28} {:<20} {:>11} {:>10} {:>10} {:>6} {:>7}",
            clip(&r.namespace, 16),
            clip(&r.pod, 28),
            if indent { clip(&format!("└ {}", r.container), 20) } else { "-".to_owned() },
            human(r.working_set),
            opt(r.limit),
            opt(r.headroom()),
            r.processes,
            r.inodes.map(|i| i.to_string()).unwrap_or_else(|| "-".into())
        )
    };
    for g in gs {
        out.push(line(&g.pod, false));
        for c in &g.containers {
            out.push(line(c, true));
        }
    }
    out.push(String::new());
    out.push("q quit · s sort · m/h/p/i/n memory/headroom/processes/inodes/name · / filter · Esc clear".into());
    out.into_iter().map(|l| clip(&l, width)).collect()
}

fn clip(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_owned()
    } else {
        s.chars().take(width.saturating_sub(1)).chain(['…']).collect()
    }
}

/// The terminal in raw mode on the alternate screen, restored on drop.
struct Screen {
    orig: Option<libc::termios>,
}

impl Screen {
    fn enter() -> Screen {
        // SAFETY: termios is plain data; tcgetattr fills it for fd 0.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: `t` is a valid termios for tcgetattr to fill.
        let orig = if unsafe { libc::tcgetattr(0, &mut t) } == 0 {
            let orig = t;
            t.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG | libc::IEXTEN);
            t.c_iflag &= !(libc::IXON | libc::ICRNL);
            t.c_cc[libc::VMIN] = 0;
            t.c_cc[libc::VTIME] = 0;
            // SAFETY: setting the attributes just read and modified.
            unsafe { libc::tcsetattr(0, libc::TCSAFLUSH, &t) };
            Some(orig)
        } else {
            None
        };
        print!("\x1b[?1049h\x1b[?25l");
        let _ = io::stdout().flush();
        Screen { orig }
    }

    fn size() -> (usize, usize) {
        // SAFETY: winsize is plain data filled by the ioctl.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: TIOCGWINSZ writes one winsize into `ws`, which is one.
        if unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_col > 0 {
            (ws.ws_col as usize, ws.ws_row as usize)
        } else {
            (160, 50)
        }
    }

    fn draw(lines: &[String], height: usize) {
        let mut s = String::from("\x1b[H");
        for l in lines.iter().take(height.max(1)) {
            s.push_str(l);
            s.push_str("\x1b[K\r\n");
        }
        s.push_str("\x1b[J");
        let mut out = io::stdout().lock();
        let _ = out.write_all(s.as_bytes());
        let _ = out.flush();
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        print!("\x1b[?25h\x1b[?1049l");
        let _ = io::stdout().flush();
        if let Some(t) = &self.orig {
            // SAFETY: restoring the attributes read at enter.
            unsafe { libc::tcsetattr(0, libc::TCSAFLUSH, t) };
        }
    }
}

/// Waits up to `timeout` for keys on stdin.
fn read_keys(timeout: Duration) -> Vec<u8> {
    let mut fds = libc::pollfd { fd: 0, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut fds, 1, timeout.as_millis() as i32) };
    if n <= 0 {
        return vec![];
    }
    let mut buf = [0u8; 64];
    // SAFETY: reading into a buffer we own.
    let r = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
    if r <= 0 {
        // End of input: behave as a plain refresh loop.
        std::thread::sleep(timeout);
        return vec![];
    }
    buf[..r as usize].to_vec()
}

/// What the keys ask for.
#[derive(Debug, Default)]
struct Ui {
    filter: String,
    editing: bool,
    quit: bool,
}

impl Ui {
    fn keys(&mut self, keys: &[u8], sort: &mut SortKey) {
        let mut i = 0;
        while i < keys.len() {
            let k = keys[i];
            i += 1;
            // Escape sequences (arrows and the like) are skipped whole.
            if k == 0x1b && keys.get(i) == Some(&b'[') {
                i += 1;
                while i < keys.len() && !keys[i].is_ascii_alphabetic() && keys[i] != b'~' {
                    i += 1;
                }
                i += 1;
                continue;
            }
            if self.editing {
                match k {
                    b'\r' | b'\n' => self.editing = false,
                    0x1b => {
                        self.editing = false;
                        self.filter.clear();
                    }
                    0x7f | 0x08 => {
                        self.filter.pop();
                    }
                    0x03 => self.quit = true,
                    c if (0x20..0x7f).contains(&c) => self.filter.push(c as char),
                    _ => {}
                }
                continue;
            }
            match k {
                b'q' | 0x03 => self.quit = true,
                b's' => *sort = sort.next(),
                b'm' => *sort = SortKey::Memory,
                b'h' => *sort = SortKey::Headroom,
                b'p' => *sort = SortKey::Processes,
                b'i' => *sort = SortKey::Inodes,
                b'n' => *sort = SortKey::Name,
                b'/' => {
                    self.editing = true;
                    self.filter.clear();
                }
                0x1b => self.filter.clear(),
                _ => {}
            }
        }
    }
}

fn node_line(config: &Config, name: String, s: &Snapshot) -> NodeLine {
    let capacity = node::mem_total().unwrap_or(0);
    let pid_limit = node::pid_limit().unwrap_or(0);
    let hard = config.kubelet.eviction_thresholds();
    let find = |sig: EvictionSignal, cap: u64| {
        hard.iter().find(|t| t.signal == sig && t.is_hard()).map(|t| t.value.resolve(cap))
    };
    NodeLine {
        name,
        working_set: s.node.working_set_bytes,
        capacity,
        memory_threshold: find(EvictionSignal::MemoryAvailable, capacity),
        tasks: s.node.tasks,
        pid_limit,
        pid_threshold: find(EvictionSignal::PidAvailable, pid_limit),
    }
}

pub fn run(args: &[String]) -> Result<(), CliError> {
    let (own, rest) = split_args(args, &["sort", "filter", "interval", "agent-pid"], &["once", "help"])?;
    let opt = |k: &str| own.iter().rev().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    if opt("help").is_some() {
        print!("{USAGE}");
        return Ok(());
    }
    let mut sort = match opt("sort") {
        Some(s) => SortKey::parse(&s).ok_or_else(|| {
            CliError::Usage(format!("--sort {s:?}: expected memory, headroom, processes, inodes or name"))
        })?,
        None => SortKey::Memory,
    };
    let interval = match opt("interval") {
        Some(s) => s
            .parse::<f64>()
            .ok()
            .filter(|v| *v >= 0.1 && v.is_finite())
            .map(Duration::from_secs_f64)
            .ok_or_else(|| CliError::Usage(format!("--interval {s:?}: expected seconds, at least 0.1")))?,
        None => Duration::from_secs(1),
    };
    let once = opt("once").is_some_and(|v| v != "false");
    let agent_pid = match opt("agent-pid") {
        Some(p) => Some(p.parse::<u32>().map_err(|_| CliError::Usage(format!("--agent-pid {p:?}: expected a pid")))?),
        None => None,
    };
    let (config, from) = super::running::subcommand_config(rest, agent_pid)?;
    if !io::stdout().is_terminal() || once {
        eprintln!("swiftlet top: looking where {from} say");
    }
    let node_name = config.node_name().unwrap_or_default();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // The runtime client connects lazily on the runtime's reactor.
    let _entered = rt.enter();
    let mut attached = Attached::open(&config)?;
    let mut ui = Ui { filter: opt("filter").unwrap_or_default(), ..Default::default() };
    let mode = attached.opened.source.mode().as_str();
    let interactive = !once && io::stdin().is_terminal() && io::stdout().is_terminal();
    let screen = interactive.then(Screen::enter);
    let mut found = vec![];
    let mut names = Names::default();
    let mut limits = HashMap::new();
    let mut last_scan: Option<Instant> = None;
    loop {
        if last_scan.is_none_or(|t| t.elapsed() >= Duration::from_secs(2)) {
            found = attached.rescan();
            names = rt.block_on(attached.names());
            limits = found
                .iter()
                .filter_map(|f| attached.fs.memory_limit(&f.path).ok().flatten().map(|l| (f.path.clone(), l)))
                .collect();
            last_scan = Some(Instant::now());
        }
        let snap = attached.opened.source.snapshot()?;
        let gs = arrange(groups(&snap, &found, &names, &limits), sort, &ui.filter);
        let node = node_line(&config, node_name.clone(), &snap);
        let (width, height) = if screen.is_some() { Screen::size() } else { (usize::MAX, usize::MAX) };
        let lines = render(&node, &gs, sort, &ui.filter, mode, ui.editing, width);
        if screen.is_some() {
            Screen::draw(&lines, height);
        } else {
            let mut out = io::stdout().lock();
            for l in &lines {
                writeln!(out, "{l}")?;
            }
            out.flush()?;
        }
        if once {
            return Ok(());
        }
        let deadline = Instant::now() + interval;
        while Instant::now() < deadline && !ui.quit {
            let keys = if screen.is_some() {
                read_keys(deadline.saturating_duration_since(Instant::now()))
            } else {
                std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
                vec![]
            };
            if !keys.is_empty() {
                ui.keys(&keys, &mut sort);
                // Redraw at once so typing shows.
                break;
            }
        }
        if ui.quit {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap as Map;

    use super::*;
    use crate::{cri::labels::PodIdentity, signals::CgroupUsage};

    fn snapshot(cgs: &[(&str, u64, u64)]) -> Snapshot {
        Snapshot {
            node: Default::default(),
            cgroups: cgs
                .iter()
                .map(|(p, ws, procs)| {
                    (
                        (*p).to_owned(),
                        CgroupUsage {
                            working_set_bytes: *ws,
                            processes: *procs,
                            inodes: Some(5),
                            ..Default::default()
                        },
                    )
                })
                .collect(),
            taken_at: Instant::now(),
        }
    }

    fn found(path: &str, kind: CgroupKind, uid: &str, cid: Option<&str>) -> Found {
        Found { path: path.into(), kind, pod_uid: Some(uid.into()), container_id: cid.map(Into::into) }
    }

    #[test]
    fn pods_grouped_named_sorted_and_filtered() {
        let snap = snapshot(&[
            ("kp/poda", 300 << 20, 3),
            ("kp/poda/c1", 200 << 20, 2),
            ("kp/poda/pause", 1 << 20, 1),
            ("kp/podb", 500 << 20, 1),
            ("kp/podb/c2", 499 << 20, 1),
        ]);
        let f = vec![
            found("kp/poda", CgroupKind::Pod, "a", None),
            found("kp/poda/c1", CgroupKind::Container, "a", Some("c1")),
            found("kp/poda/pause", CgroupKind::Container, "a", Some("pause")),
            found("kp/podb", CgroupKind::Pod, "b", None),
            found("kp/podb/c2", CgroupKind::Container, "b", Some("c2")),
        ];
        let mut names = Names::default();
        names.pods.insert("a".into(), PodIdentity { uid: "a".into(), namespace: "prod".into(), name: "web".into() });
        names.pods.insert("b".into(), PodIdentity { uid: "b".into(), namespace: "prod".into(), name: "db".into() });
        names.containers.insert("c1".into(), "nginx".into());
        names.containers.insert("c2".into(), "postgres".into());
        let limits: Map<String, u64> = [("kp/poda".to_owned(), 1 << 30), ("kp/podb".to_owned(), 512 << 20)].into();
        let gs = groups(&snap, &f, &names, &limits);
        let by_mem = arrange(gs.clone(), SortKey::Memory, "");
        assert_eq!(by_mem.iter().map(|g| g.pod.pod.as_str()).collect::<Vec<_>>(), ["db", "web"]);
        assert_eq!(by_mem[1].containers.len(), 1, "the pause container is not shown");
        assert_eq!(by_mem[1].containers[0].container, "nginx");
        let by_headroom = arrange(gs.clone(), SortKey::Headroom, "");
        assert_eq!(by_headroom[0].pod.pod, "db", "12Mi of headroom comes first");
        assert_eq!(by_headroom[0].pod.headroom(), Some(12 << 20));
        assert_eq!(
            arrange(gs.clone(), SortKey::Name, "").iter().map(|g| g.pod.pod.as_str()).collect::<Vec<_>>(),
            ["db", "web"]
        );
        let filtered = arrange(gs.clone(), SortKey::Memory, "NGINX");
        assert_eq!(filtered.len(), 1);
        assert_eq!(filtered[0].pod.pod, "web");
        let node = NodeLine {
            name: "n1".into(),
            working_set: 1 << 30,
            capacity: 4 << 30,
            memory_threshold: Some(100 << 20),
            tasks: 10,
            pid_limit: 1000,
            pid_threshold: None,
        };
        let lines = render(&node, &filtered, SortKey::Memory, "nginx", "ebpf", false, 200);
        let text = lines.join("\n");
        assert!(text.contains("filter nginx"), "{text}");
        assert!(text.contains("memory.available 3.0Gi · eviction below 100.0Mi (2.9Gi away)"), "{text}");
        let row = lines.iter().find(|l| l.contains("└ nginx")).unwrap();
        assert!(row.contains("200.0Mi") && row.starts_with("prod"), "{row}");
        let pod_row = lines.iter().find(|l| l.contains(" web ")).unwrap();
        assert!(pod_row.contains("300.0Mi") && pod_row.contains("1.0Gi") && pod_row.contains("724.0Mi"), "{pod_row}");
    }

    #[test]
    fn keys() {
        let mut ui = Ui::default();
        let mut sort = SortKey::Memory;
        ui.keys(b"s", &mut sort);
        assert_eq!(sort, SortKey::Headroom);
        ui.keys(b"/we\x7fb\r", &mut sort);
        assert_eq!((ui.filter.as_str(), ui.editing), ("wb", false));
        ui.keys(b"\x1b[A", &mut sort);
        assert_eq!(ui.filter, "wb", "an arrow key is not Esc");
        ui.keys(b"\x1b", &mut sort);
        assert_eq!(ui.filter, "");
        ui.keys(b"pq", &mut sort);
        assert_eq!(sort, SortKey::Processes);
        assert!(ui.quit);
        assert_eq!(human(512), "512");
        assert_eq!(human(1536), "1.5Ki");
        assert_eq!(human(3 << 30), "3.0Gi");
    }
}
