//! The rotation of one container log, decided from file names alone
//! (pure), as the kubelet's containerLogManager does it:
//!
//! 1. leftovers of an interrupted rotation go: `*.tmp` files, and
//!    uncompressed files whose `.gz` already exists;
//! 2. the oldest rotated files go until at most `max_files - 2` remain
//!    (the live log and the one about to be rotated make `max_files`);
//! 3. every remaining uncompressed rotated file is gzipped;
//! 4. the live log is renamed to `<log>.<YYYYMMDD-hhmmss>` and stays
//!    uncompressed (a reader such as `kubectl logs` or fluentd may still be
//!    on it), and the runtime is asked to reopen the log.
//!
//! Timestamps sort lexicographically, so sorting names sorts by age.

use std::path::{Path, PathBuf};

pub const COMPRESS_SUFFIX: &str = ".gz";
pub const TMP_SUFFIX: &str = ".tmp";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Remove(PathBuf),
    /// Gzip to `<file>.gz` (through `<file>.tmp`), then remove the file.
    Compress(PathBuf),
    /// Rename the live log to this, then ReopenContainerLog.
    Rotate(PathBuf),
}

fn name_of(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The actions for rotating `log`, given the files named `<log>.*` next
/// to it, `max_files` (containerLogMaxFiles) and the timestamp for the new
/// rotated file. When a file of that timestamp already exists (two
/// rotations within a second), nothing is done until the next round: the
/// newest rotated file stays plain and nothing is overwritten.
pub fn plan(log: &Path, rotated: &[PathBuf], max_files: u32, stamp: &str) -> Vec<Action> {
    let names: Vec<String> = rotated.iter().map(|p| name_of(p)).collect();
    let target = format!("{}.{stamp}", name_of(log));
    if names.iter().any(|n| n.strip_suffix(COMPRESS_SUFFIX).unwrap_or(n) == target) {
        return vec![];
    }
    let mut actions = vec![];
    let in_use = |n: &String| {
        if n.ends_with(TMP_SUFFIX) {
            return false;
        }
        if n.ends_with(COMPRESS_SUFFIX) {
            return true;
        }
        let compressed = format!("{n}{COMPRESS_SUFFIX}");
        !names.contains(&compressed)
    };
    let mut kept: Vec<String> = vec![];
    for n in &names {
        if in_use(n) {
            kept.push(n.clone());
        } else {
            actions.push(Action::Remove(PathBuf::from(n)));
        }
    }
    kept.sort();
    let max_rotated = (max_files as usize).saturating_sub(2);
    let excess = kept.len().saturating_sub(max_rotated);
    for n in kept.drain(..excess) {
        actions.push(Action::Remove(PathBuf::from(n)));
    }
    for n in &kept {
        if !n.ends_with(COMPRESS_SUFFIX) {
            actions.push(Action::Compress(PathBuf::from(n)));
        }
    }
    actions.push(Action::Rotate(PathBuf::from(target)));
    actions
}

/// Whether `name` (a file name in the log's directory) belongs to the log
/// file named `log_name`: `<log_name>.<anything>`.
pub fn is_rotated_of(log_name: &str, name: &str) -> bool {
    name.len() > log_name.len() + 1 && name.starts_with(log_name) && name.as_bytes()[log_name.len()] == b'.'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(format!("/l/0.log{s}"))
    }

    #[test]
    fn plans() {
        use Action::*;
        let log = PathBuf::from("/l/0.log");
        // (files present, max files, expected actions)
        let cases: Vec<(Vec<&str>, u32, Vec<Action>)> = vec![
            // First rotation.
            (vec![], 5, vec![Rotate(p(".20240101-000010"))]),
            // The previous rotated file is compressed, the new one is not.
            (vec![".20240101-000000"], 5, vec![Compress(p(".20240101-000000")), Rotate(p(".20240101-000010"))]),
            // At the cap (5 files: live + 3 compressed + 1 rotated): the
            // oldest compressed goes.
            (
                vec![".20240101-000001.gz", ".20240101-000002.gz", ".20240101-000003.gz", ".20240101-000004"],
                5,
                vec![Remove(p(".20240101-000001.gz")), Compress(p(".20240101-000004")), Rotate(p(".20240101-000010"))],
            ),
            // Leftovers of an interrupted compression.
            (
                vec![".20240101-000003", ".20240101-000003.gz", ".20240101-000004.tmp"],
                5,
                vec![Remove(p(".20240101-000003")), Remove(p(".20240101-000004.tmp")), Rotate(p(".20240101-000010"))],
            ),
            // max files 2: only the live log and the latest rotated one.
            (
                vec![".20240101-000001.gz", ".20240101-000002"],
                2,
                vec![Remove(p(".20240101-000001.gz")), Remove(p(".20240101-000002")), Rotate(p(".20240101-000010"))],
            ),
            // Rotated twice within one second: the name is taken, so
            // everything waits for the next round.
            (vec![".20240101-000010"], 5, vec![]),
            (vec![".20240101-000009.gz", ".20240101-000010.gz"], 5, vec![]),
        ];
        for (i, (files, max, want)) in cases.into_iter().enumerate() {
            let files: Vec<PathBuf> = files.iter().map(|f| p(f)).collect();
            assert_eq!(plan(&log, &files, max, "20240101-000010"), want, "case {i}");
        }
    }

    #[test]
    fn rotated_names() {
        assert!(is_rotated_of("0.log", "0.log.20240101-000000"));
        assert!(is_rotated_of("0.log", "0.log.20240101-000000.gz"));
        assert!(!is_rotated_of("0.log", "0.log"));
        assert!(!is_rotated_of("0.log", "0.log."));
        assert!(!is_rotated_of("0.log", "10.log.1"));
        assert!(!is_rotated_of("0.log", "0.logx"));
    }
}
