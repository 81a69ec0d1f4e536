//! How `swiftlet top` draws a frame: the same heading, table and key help
//! as ratatui widgets on the terminal, or as plain lines when the output is
//! piped or `--once` is given. Both read the cells computed here, so the
//! two modes always show the same figures.

use ratatui::{
    Frame,
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::{Line, Text},
    widgets::{Cell, Paragraph, Row as TableRow, Table},
};

use super::model::{NodeLine, PodGroup, Row, SortKey, human};

/// The table's columns: title, width in cells, right-aligned.
const COLUMNS: [(&str, u16, bool); 8] = [
    ("NAMESPACE", 16, false),
    ("POD", 28, false),
    ("CONTAINER", 20, false),
    ("WORKING SET", 11, true),
    ("LIMIT", 10, true),
    ("HEADROOM", 10, true),
    ("PROCS", 6, true),
    ("INODES", 7, true),
];

const HELP: &str = "q quit · s sort · m/h/p/i/n memory/headroom/processes/inodes/name · / filter · Esc clear";

/// Everything one frame shows.
pub struct View<'a> {
    pub node: &'a NodeLine,
    pub groups: &'a [PodGroup],
    pub sort: SortKey,
    pub filter: &'a str,
    /// The signal source's mode (ebpf, cgroupfs, ...).
    pub mode: &'a str,
    /// The filter is being typed.
    pub editing: bool,
}

impl View<'_> {
    /// The three lines above the table: what is shown, the node's memory
    /// and its tasks, each with the distance to its eviction threshold.
    fn heading(&self) -> [String; 3] {
        let node = self.node;
        let available = node.capacity.saturating_sub(node.working_set);
        let mut head = format!(
            "swiftlet top · node {} · {} source · sort {} · {} pods",
            node.name,
            self.mode,
            self.sort.name(),
            self.groups.len()
        );
        if !self.filter.is_empty() || self.editing {
            head.push_str(&format!(" · filter {}{}", self.filter, if self.editing { "_" } else { "" }));
        }
        let mut mem = format!(
            "memory: working set {} of {} · memory.available {}",
            human(node.working_set),
            human(node.capacity),
            human(available)
        );
        if let Some(t) = node.memory_threshold {
            mem.push_str(&format!(" · eviction below {} ({} away)", human(t), human(available.saturating_sub(t))));
        }
        let mut pids = format!("tasks {} of {}", node.tasks, node.pid_limit);
        if let Some(t) = node.pid_threshold {
            pids.push_str(&format!(
                " · pid.available eviction below {t} ({} away)",
                node.pid_limit.saturating_sub(node.tasks).saturating_sub(t)
            ));
        }
        [head, mem, pids]
    }

    /// One row of cells per pod, each followed by its containers' rows;
    /// every cell already fits its column.
    fn cells(&self) -> Vec<[String; 8]> {
        let row = |r: &Row, container: bool| {
            let opt = |v: Option<u64>| v.map(human).unwrap_or_else(|| "-".into());
            let cells = [
                r.namespace.clone(),
                r.pod.clone(),
                if container { format!("└ {}", r.container) } else { "-".to_owned() },
                human(r.working_set),
                opt(r.limit),
                opt(r.headroom()),
                r.processes.to_string(),
                r.inodes.map(|i| i.to_string()).unwrap_or_else(|| "-".into()),
            ];
            let mut i = 0;
            cells.map(|c| {
                let width = COLUMNS[i].1 as usize;
                i += 1;
                clip(&c, width)
            })
        };
        self.groups
            .iter()
            .flat_map(|g| std::iter::once(row(&g.pod, false)).chain(g.containers.iter().map(|c| row(c, true))))
            .collect()
    }
}

/// The frame as plain lines of at most `width` characters, for a pipe or
/// `--once`: the heading, the table in fixed-width columns, the key help.
pub fn plain_lines(view: &View, width: usize) -> Vec<String> {
    let line = |cells: [&str; 8]| {
        let mut out = String::new();
        for (i, (cell, (_, w, right))) in cells.iter().zip(COLUMNS).enumerate() {
            if i > 0 {
                out.push(' ');
            }
            let w = w as usize;
            let pad = " ".repeat(w.saturating_sub(cell.chars().count()));
            if right {
                out.push_str(&pad);
                out.push_str(cell);
            } else {
                out.push_str(cell);
                out.push_str(&pad);
            }
        }
        out
    };
    let mut out: Vec<String> = view.heading().into();
    out.push(String::new());
    out.push(line(COLUMNS.map(|c| c.0)));
    for cells in view.cells() {
        out.push(line(cells.each_ref().map(String::as_str)));
    }
    out.push(String::new());
    out.push(HELP.into());
    out.into_iter().map(|l| clip(&l, width)).collect()
}

/// Draws the frame with ratatui: the heading, a blank line, the table
/// (as many rows as fit), and the key help on the last line.
pub fn draw(frame: &mut Frame, view: &View) {
    let [heading, _, table, help] =
        Layout::vertical([Constraint::Length(3), Constraint::Length(1), Constraint::Min(1), Constraint::Length(1)])
            .areas(frame.area());
    frame.render_widget(Paragraph::new(Text::from_iter(view.heading().map(Line::from))), heading);
    let aligned = |text: String, right: bool| {
        let line = Line::from(text);
        Cell::from(if right { line.right_aligned() } else { line })
    };
    // A narrow terminal shows the columns that fit whole, as the plain
    // lines are cut on the right, rather than squeezing every column.
    let columns = &COLUMNS[..fitting_columns(table.width)];
    let header = TableRow::new(columns.iter().map(|(title, _, right)| aligned((*title).to_owned(), *right)))
        .style(Style::new().add_modifier(Modifier::REVERSED));
    let rows = view
        .cells()
        .into_iter()
        .map(|cells| TableRow::new(cells.into_iter().zip(columns).map(|(c, (_, _, right))| aligned(c, *right))));
    let widths = columns.iter().map(|(_, w, _)| Constraint::Length(*w));
    frame.render_widget(Table::new(rows, widths).header(header).column_spacing(1), table);
    frame.render_widget(Paragraph::new(HELP).style(Style::new().add_modifier(Modifier::DIM)), help);
}

/// How many of the table's columns fit whole in `width` cells (at least
/// one, cut by the terminal if even that does not fit).
fn fitting_columns(width: u16) -> usize {
    let mut used = 0u16;
    let fit = COLUMNS
        .iter()
        .take_while(|(_, w, _)| {
            used = used.saturating_add(*w).saturating_add(if used == 0 { 0 } else { 1 });
            used <= width
        })
        .count();
    fit.max(1)
}

/// `s` cut to `width` characters, the last one an ellipsis when cut.
fn clip(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_owned()
    } else {
        s.chars().take(width.saturating_sub(1)).chain(['…']).collect()
    }
}

#[cfg(test)]
mod tests {
    use ratatui::{Terminal, backend::TestBackend};

    use super::*;

    fn row(pod: &str, container: &str, working_set: u64, limit: Option<u64>) -> Row {
        Row {
            namespace: "prod".into(),
            pod: pod.into(),
            container: container.into(),
            working_set,
            limit,
            processes: 2,
            inodes: Some(5),
        }
    }

    fn node() -> NodeLine {
        NodeLine {
            name: "n1".into(),
            working_set: 1 << 30,
            capacity: 4 << 30,
            memory_threshold: Some(100 << 20),
            tasks: 10,
            pid_limit: 1000,
            pid_threshold: Some(100),
        }
    }

    fn groups() -> Vec<PodGroup> {
        vec![PodGroup {
            pod: row("web", "", 300 << 20, Some(1 << 30)),
            containers: vec![row("web", "nginx-with-a-very-long-container-name", 200 << 20, None)],
        }]
    }

    /// The terminal's cells as lines, trailing blanks trimmed.
    fn screen(terminal: &Terminal<TestBackend>) -> Vec<String> {
        let buffer = terminal.backend().buffer();
        let width = buffer.area.width as usize;
        buffer
            .content
            .chunks(width)
            .map(|line| line.iter().map(|c| c.symbol()).collect::<String>().trim_end().to_owned())
            .collect()
    }

    #[test]
    fn the_terminal_frame_shows_heading_table_and_help() {
        let (node, groups) = (node(), groups());
        let view =
            View { node: &node, groups: &groups, sort: SortKey::Headroom, filter: "we", mode: "ebpf", editing: true };
        let mut terminal = Terminal::new(TestBackend::new(120, 12)).unwrap();
        terminal.draw(|f| draw(f, &view)).unwrap();
        let lines = screen(&terminal);
        assert_eq!(lines[0], "swiftlet top · node n1 · ebpf source · sort headroom · 1 pods · filter we_");
        assert_eq!(
            lines[1],
            "memory: working set 1.0Gi of 4.0Gi · memory.available 3.0Gi · eviction below 100.0Mi (2.9Gi away)"
        );
        assert_eq!(lines[2], "tasks 10 of 1000 · pid.available eviction below 100 (890 away)");
        assert_eq!(lines[3], "");
        assert_eq!(
            lines[4],
            "NAMESPACE        POD                          CONTAINER            WORKING SET      LIMIT   HEADROOM  PROCS  INODES"
        );
        let pod: Vec<&str> = lines[5].split_whitespace().collect();
        assert_eq!(pod, ["prod", "web", "-", "300.0Mi", "1.0Gi", "724.0Mi", "2", "5"]);
        let container: Vec<&str> = lines[6].split_whitespace().collect();
        assert_eq!(container, ["prod", "web", "└", "nginx-with-a-very…", "200.0Mi", "-", "-", "2", "5"]);
        assert_eq!(lines[11], HELP);
        // Right-aligned numbers end where their column's title ends.
        let end_of = |line: &str, text: &str| line.find(text).map(|i| line[..i].chars().count() + text.chars().count());
        assert_eq!(end_of(&lines[5], "300.0Mi"), end_of(&lines[4], "WORKING SET"));
        assert_eq!(end_of(&lines[5], "724.0Mi"), end_of(&lines[4], "HEADROOM"));
    }

    #[test]
    fn a_small_terminal_shows_whole_columns_and_keeps_the_help() {
        let (node, groups) = (node(), groups());
        let view =
            View { node: &node, groups: &groups, sort: SortKey::Memory, filter: "", mode: "ebpf", editing: false };
        let mut terminal = Terminal::new(TestBackend::new(40, 6)).unwrap();
        terminal.draw(|f| draw(f, &view)).unwrap();
        let lines = screen(&terminal);
        assert_eq!(lines[0], "swiftlet top · node n1 · ebpf source · s");
        // NAMESPACE and POD fit (16 + 1 + 28 > 40: only NAMESPACE).
        assert_eq!(lines[4], "NAMESPACE", "{lines:?}");
        assert_eq!(lines[5], "q quit · s sort · m/h/p/i/n memory/headr");
    }

    #[test]
    fn plain_lines_show_what_the_terminal_shows() {
        let (node, groups) = (node(), groups());
        let view =
            View { node: &node, groups: &groups, sort: SortKey::Memory, filter: "", mode: "cgroupfs", editing: false };
        let lines = plain_lines(&view, usize::MAX);
        let mut terminal = Terminal::new(TestBackend::new(120, lines.len() as u16)).unwrap();
        terminal.draw(|f| draw(f, &view)).unwrap();
        assert_eq!(lines, screen(&terminal).iter().map(|l| l.trim_end().to_owned()).collect::<Vec<_>>());
        assert!(!lines[0].contains("filter"), "{}", lines[0]);
        assert_eq!(plain_lines(&view, 20)[1], "memory: working set…");
    }
}
