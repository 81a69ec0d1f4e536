//! `swiftlet top`'s keyboard: what each key event asks for (quit, a sort,
//! typing or clearing the filter), kept apart from the terminal so it is
//! tested with constructed events.

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::model::SortKey;

/// What the keys have asked for so far.
#[derive(Debug, Default)]
pub struct Ui {
    pub filter: String,
    /// The filter is being typed: keys go into it until Enter or Esc.
    pub editing: bool,
    pub quit: bool,
}

impl Ui {
    pub fn key(&mut self, key: KeyEvent, sort: &mut SortKey) {
        // Terminals that report releases send each key twice.
        if key.kind == KeyEventKind::Release {
            return;
        }
        // Raw mode turns Ctrl-C into a key: it quits, as in top(1).
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            self.quit = true;
            return;
        }
        if self.editing {
            match key.code {
                KeyCode::Enter => self.editing = false,
                KeyCode::Esc => {
                    self.editing = false;
                    self.filter.clear();
                }
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Char(c) if !c.is_control() => self.filter.push(c),
                _ => {}
            }
            return;
        }
        match key.code {
            KeyCode::Char('q') => self.quit = true,
            KeyCode::Char('s') => *sort = sort.next(),
            KeyCode::Char('m') => *sort = SortKey::Memory,
            KeyCode::Char('h') => *sort = SortKey::Headroom,
            KeyCode::Char('p') => *sort = SortKey::Processes,
            KeyCode::Char('i') => *sort = SortKey::Inodes,
            KeyCode::Char('n') => *sort = SortKey::Name,
            KeyCode::Char('/') => {
                self.editing = true;
                self.filter.clear();
            }
            KeyCode::Esc => self.filter.clear(),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn press(ui: &mut Ui, sort: &mut SortKey, codes: impl IntoIterator<Item = KeyCode>) {
        for code in codes {
            ui.key(KeyEvent::new(code, KeyModifiers::NONE), sort);
        }
    }

    fn chars(s: &str) -> Vec<KeyCode> {
        s.chars().map(KeyCode::Char).collect()
    }

    #[test]
    fn keys_sort_filter_and_quit() {
        let mut ui = Ui::default();
        let mut sort = SortKey::Memory;
        press(&mut ui, &mut sort, chars("s"));
        assert_eq!(sort, SortKey::Headroom);
        press(&mut ui, &mut sort, chars("/we"));
        assert!(ui.editing);
        press(&mut ui, &mut sort, [KeyCode::Backspace, KeyCode::Char('b'), KeyCode::Enter]);
        assert_eq!((ui.filter.as_str(), ui.editing), ("wb", false));
        press(&mut ui, &mut sort, [KeyCode::Up]);
        assert_eq!(ui.filter, "wb", "an arrow key is not Esc");
        // While typing, sort keys are text.
        press(&mut ui, &mut sort, chars("/pq"));
        assert_eq!((ui.filter.as_str(), sort, ui.quit), ("pq", SortKey::Headroom, false));
        press(&mut ui, &mut sort, [KeyCode::Esc]);
        assert_eq!((ui.filter.as_str(), ui.editing), ("", false), "Esc while typing clears and stops");
        press(&mut ui, &mut sort, chars("/x"));
        press(&mut ui, &mut sort, [KeyCode::Enter, KeyCode::Esc]);
        assert_eq!(ui.filter, "", "Esc clears a kept filter");
        let mut release = KeyEvent::new(KeyCode::Char('q'), KeyModifiers::NONE);
        release.kind = KeyEventKind::Release;
        ui.key(release, &mut sort);
        assert!(!ui.quit, "a key's release is not a press");
        press(&mut ui, &mut sort, chars("pq"));
        assert_eq!(sort, SortKey::Processes);
        assert!(ui.quit);
    }

    #[test]
    fn ctrl_c_quits_even_while_typing() {
        let mut ui = Ui { editing: true, ..Default::default() };
        let mut sort = SortKey::Memory;
        ui.key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL), &mut sort);
        assert!(ui.quit);
        assert_eq!(ui.filter, "");
    }
}
