//! The kubelet's AtomicWriter: a volume's files change all at once.
//!
//! ```text
//! <volume>/..2024_05_01_10_00_00.123456789/<files>   the current payload
//! <volume>/..data -> ..2024_05_01_10_00_00.123456789
//! <volume>/<top-level name> -> ..data/<top-level name>
//! ```
//!
//! An update writes the new payload into a fresh timestamped directory,
//! points `..data_tmp` at it and renames that over `..data` (one atomic
//! rename), adds the user-visible links for new names, removes the links
//! of names that went away, then the old directory. A reader that follows
//! the links sees the old or the new payload, never a mix. Nothing is
//! written when the payload did not change.

use std::{
    collections::BTreeSet,
    fs,
    io::{self, Write},
    os::unix::fs::{PermissionsExt, symlink},
    path::{Path, PathBuf},
    time::SystemTime,
};

use k8s_openapi::jiff::Timestamp;

use super::payload::{Payload, validate_path};

const DATA: &str = "..data";
const DATA_TMP: &str = "..data_tmp";

fn invalid(e: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e)
}

/// The files under `dir` (relative paths), not following links.
fn walk(dir: &Path, prefix: &str, out: &mut Vec<(String, PathBuf)>) -> io::Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() { name.clone() } else { format!("{prefix}/{name}") };
        let ft = e.file_type()?;
        if ft.is_dir() {
            walk(&e.path(), &rel, out)?;
        } else {
            out.push((rel, e.path()));
        }
    }
    Ok(())
}

/// Whether the payload under `ts_dir` is exactly `payload` (bytes and modes).
fn same_payload(ts_dir: &Path, payload: &Payload) -> bool {
    let mut files = vec![];
    if walk(ts_dir, "", &mut files).is_err() || files.len() != payload.len() {
        return false;
    }
    files.iter().all(|(rel, path)| {
        let Some(want) = payload.get(rel) else { return false };
        let Ok(meta) = fs::symlink_metadata(path) else { return false };
        meta.permissions().mode() & 0o7777 == want.mode && fs::read(path).is_ok_and(|d| d == want.data)
    })
}

fn top_level(p: &str) -> &str {
    p.split('/').next().unwrap_or(p)
}

/// The new timestamped directory's name, as the kubelet's
/// (`..2006_01_02_15_04_05.<random>`).
fn ts_dir_name() -> String {
    let now = Timestamp::now();
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("..{}.{nanos:09}{}", now.strftime("%Y_%m_%d_%H_%M_%S"), std::process::id() % 1000)
}

/// Writes `payload` into `dir` atomically; true when something changed.
pub fn write(dir: &Path, payload: &Payload) -> io::Result<bool> {
    for p in payload.keys() {
        validate_path(p).map_err(invalid)?;
    }
    let data_link = dir.join(DATA);
    let old_ts = fs::read_link(&data_link).ok();
    let visible: BTreeSet<&str> = payload.keys().map(|p| top_level(p)).collect();
    if let Some(old) = &old_ts
        && same_payload(&dir.join(old), payload)
        && visible.iter().all(|v| fs::symlink_metadata(dir.join(v)).is_ok())
    {
        return Ok(false);
    }
    // The names the old payload showed, to remove those that went away.
    let mut old_visible = BTreeSet::new();
    if let Some(old) = &old_ts {
        let mut files = vec![];
        let _ = walk(&dir.join(old), "", &mut files);
        old_visible.extend(files.into_iter().map(|(rel, _)| top_level(&rel).to_owned()));
    }

    let ts_name = ts_dir_name();
    let ts = dir.join(&ts_name);
    fs::create_dir(&ts)?;
    fs::set_permissions(&ts, fs::Permissions::from_mode(0o755))?;
    let written = (|| -> io::Result<()> {
        for (rel, file) in payload {
            let path = ts.join(rel);
            if let Some(parent) = path.parent()
                && parent != ts
            {
                fs::create_dir_all(parent)?;
            }
            let mut f = fs::File::create(&path)?;
            f.write_all(&file.data)?;
            f.sync_all()?;
            fs::set_permissions(&path, fs::Permissions::from_mode(file.mode))?;
        }
        Ok(())
    })();
    if let Err(e) = written {
        let _ = fs::remove_dir_all(&ts);
        return Err(e);
    }

    let tmp = dir.join(DATA_TMP);
    let _ = fs::remove_file(&tmp);
    symlink(&ts_name, &tmp)?;
    fs::rename(&tmp, &data_link)?;

    for v in &visible {
        let link = dir.join(v);
        if fs::symlink_metadata(&link).is_err() {
            symlink(Path::new(DATA).join(v), &link)?;
        }
    }
    for gone in old_visible.iter().filter(|v| !visible.contains(v.as_str())) {
        let link = dir.join(gone);
        if fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()) {
            fs::remove_file(&link)?;
        }
    }
    if let Some(old) = old_ts
        && old != Path::new(&ts_name)
    {
        let _ = fs::remove_dir_all(dir.join(old));
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volumes::payload::FileProjection;

    fn payload(items: &[(&str, &str, u32)]) -> Payload {
        items
            .iter()
            .map(|(p, d, m)| (p.to_string(), FileProjection { data: d.as_bytes().to_vec(), mode: *m }))
            .collect()
    }

    fn read(dir: &Path, p: &str) -> String {
        fs::read_to_string(dir.join(p)).unwrap()
    }

    #[test]
    fn writes_through_the_data_link_and_swaps_atomically() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path();
        assert!(write(dir, &payload(&[("a", "1", 0o644), ("sub/b", "2", 0o600)])).unwrap());
        assert_eq!(read(dir, "a"), "1");
        assert_eq!(read(dir, "sub/b"), "2");
        assert_eq!(fs::read_link(dir.join("a")).unwrap(), Path::new("..data/a"));
        assert_eq!(fs::read_link(dir.join("sub")).unwrap(), Path::new("..data/sub"));
        let first = fs::read_link(dir.join(DATA)).unwrap();
        assert!(first.to_string_lossy().starts_with(".."), "{first:?}");
        assert_eq!(fs::metadata(dir.join("sub/b")).unwrap().permissions().mode() & 0o777, 0o600);

        // Same payload: nothing is written.
        assert!(!write(dir, &payload(&[("a", "1", 0o644), ("sub/b", "2", 0o600)])).unwrap());
        assert_eq!(fs::read_link(dir.join(DATA)).unwrap(), first);

        // A change of content, a mode change, a removed and an added name.
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(write(dir, &payload(&[("a", "one", 0o400), ("c", "3", 0o644)])).unwrap());
        assert_eq!(read(dir, "a"), "one");
        assert_eq!(fs::metadata(dir.join("a")).unwrap().permissions().mode() & 0o777, 0o400);
        assert_eq!(read(dir, "c"), "3");
        assert!(fs::symlink_metadata(dir.join("sub")).is_err(), "names that went away are removed");
        let second = fs::read_link(dir.join(DATA)).unwrap();
        assert_ne!(first, second);
        assert!(!dir.join(&first).exists(), "the old payload is removed");
        let entries: BTreeSet<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(
            entries,
            BTreeSet::from(["a".into(), "c".into(), DATA.into(), second.to_string_lossy().into_owned()])
        );

        // An empty payload leaves only the data link and an empty directory.
        assert!(write(dir, &Payload::new()).unwrap());
        assert!(fs::symlink_metadata(dir.join("a")).is_err());
    }

    #[test]
    fn bad_paths_are_refused_before_anything_is_written() {
        let d = tempfile::tempdir().unwrap();
        let e = write(d.path(), &payload(&[("ok", "1", 0o644), ("../escape", "x", 0o644)])).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 0);
    }
}
