//! `swiftlet top`: a live terminal view of the pods' and containers'
//! memory working set, headroom to their memory limit, processes and
//! inodes, read from the BPF maps of its own instance of the kernel
//! programs (so it works with or without the agent), refreshed every
//! interval, sorted and filtered from the keyboard. `model` computes what
//! is shown, `view` draws it (ratatui on a terminal, plain lines in a pipe
//! or with `--once`), `keys` reads the keyboard.

mod keys;
mod model;
mod view;

use std::{
    collections::HashMap,
    io::{self, IsTerminal, Write},
    time::{Duration, Instant},
};

pub use model::{NodeLine, PodGroup, Row, SortKey, arrange, groups, human};
use ratatui::{
    DefaultTerminal,
    crossterm::event::{self, Event},
};

use super::{
    CliError,
    attach::{Attached, Names},
    split_args,
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

/// The terminal in raw mode on the alternate screen, restored on drop
/// (also when `run` returns early with an error).
struct Screen {
    terminal: DefaultTerminal,
}

impl Screen {
    fn enter() -> io::Result<Screen> {
        // try_init enables raw mode before entering the alternate screen:
        // undo whatever it did if a later step fails.
        let terminal = ratatui::try_init().inspect_err(|_| ratatui::restore())?;
        Ok(Screen { terminal })
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = self.terminal.show_cursor();
        ratatui::restore();
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
    let mut ui = keys::Ui { filter: opt("filter").unwrap_or_default(), ..Default::default() };
    let mode = attached.opened.source.mode().as_str();
    let interactive = !once && io::stdin().is_terminal() && io::stdout().is_terminal();
    let mut screen = if interactive { Some(Screen::enter()?) } else { None };
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
        let node = model::node_line(&config, node_name.clone(), &snap);
        let view = view::View { node: &node, groups: &gs, sort, filter: &ui.filter, mode, editing: ui.editing };
        match &mut screen {
            Some(s) => {
                s.terminal.draw(|frame| view::draw(frame, &view))?;
            }
            None => {
                let mut out = io::stdout().lock();
                for l in view::plain_lines(&view, usize::MAX) {
                    writeln!(out, "{l}")?;
                }
                out.flush()?;
            }
        }
        if once {
            return Ok(());
        }
        let deadline = Instant::now() + interval;
        wait_for_keys(deadline, screen.is_some(), &mut ui, &mut sort)?;
        if ui.quit {
            return Ok(());
        }
    }
}

/// Waits until `deadline`, or less when a key or a resize asks for a
/// redraw at once (so typing shows); without a screen, just sleeps.
fn wait_for_keys(deadline: Instant, screen: bool, ui: &mut keys::Ui, sort: &mut SortKey) -> io::Result<()> {
    if !screen {
        std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
        return Ok(());
    }
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || !event::poll(left)? {
            return Ok(());
        }
        match event::read()? {
            Event::Key(key) => {
                ui.key(key, sort);
                return Ok(());
            }
            Event::Resize(..) => return Ok(()),
            _ => {}
        }
    }
}
