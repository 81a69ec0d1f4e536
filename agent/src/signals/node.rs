//! Node-wide figures that come from procfs and statfs in every mode.

use std::{fs, io, path::Path};

/// The kubelet's pid limit: the smaller of `kernel.pid_max` and
/// `kernel.threads-max`.
pub fn pid_limit() -> io::Result<u64> {
    let pid_max = pid_max()?;
    Ok(match read_u64("/proc/sys/kernel/threads-max") {
        Ok(t) => pid_max.min(t),
        Err(_) => pid_max,
    })
}

/// `kernel.pid_max`: every pid is below it.
pub fn pid_max() -> io::Result<u64> {
    read_u64("/proc/sys/kernel/pid_max")
}

/// Tasks on the node (threads included): the denominator of the fourth
/// field of /proc/loadavg, the kernel's nr_threads.
pub fn tasks() -> io::Result<u64> {
    let s = fs::read_to_string("/proc/loadavg")?;
    parse_loadavg_tasks(&s)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("/proc/loadavg: unexpected `{}`", s.trim())))
}

fn parse_loadavg_tasks(s: &str) -> Option<u64> {
    s.split_whitespace().nth(3)?.split('/').nth(1)?.parse().ok()
}

/// MemTotal from /proc/meminfo, in bytes.
pub fn mem_total() -> io::Result<u64> {
    let s = fs::read_to_string("/proc/meminfo")?;
    parse_meminfo(&s, "MemTotal")
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "/proc/meminfo has no MemTotal"))
}

/// A `Key:   123 kB` field of /proc/meminfo, in bytes.
pub fn parse_meminfo(s: &str, key: &str) -> Option<u64> {
    s.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let mut it = rest.split_whitespace();
        let v: u64 = it.next()?.parse().ok()?;
        Some(match it.next() {
            Some("kB") => v * 1024,
            _ => v,
        })
    })
}

/// Free and total bytes and inodes of the filesystem holding `path`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsStats {
    pub capacity_bytes: u64,
    pub available_bytes: u64,
    pub inodes: u64,
    pub inodes_free: u64,
}

pub fn statfs(path: &Path) -> io::Result<FsStats> {
    let st = rustix::fs::statvfs(path)?;
    let frsize = st.f_frsize;
    Ok(FsStats {
        capacity_bytes: st.f_blocks * frsize,
        // f_bavail: what unprivileged users can use, as the kubelet counts.
        available_bytes: st.f_bavail * frsize,
        inodes: st.f_files,
        inodes_free: st.f_ffree,
    })
}

fn read_u64(path: &str) -> io::Result<u64> {
    let s = fs::read_to_string(path)?;
    s.trim()
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("{path}: `{}` is not a number", s.trim())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loadavg() {
        assert_eq!(parse_loadavg_tasks("0.00 0.01 0.05 1/234 5678\n"), Some(234));
        assert_eq!(parse_loadavg_tasks("garbage"), None);
        assert_eq!(parse_loadavg_tasks("0 0 0 1-2 3"), None);
    }

    #[test]
    fn meminfo() {
        let s = "MemTotal:       24576000 kB\nMemFree:  100 kB\nHugePages_Total:       0\n";
        assert_eq!(parse_meminfo(s, "MemTotal"), Some(24_576_000 * 1024));
        assert_eq!(parse_meminfo(s, "HugePages_Total"), Some(0));
        assert_eq!(parse_meminfo(s, "Mem"), None);
        assert_eq!(parse_meminfo(s, "Nope"), None);
    }

    #[test]
    fn statfs_of_root_is_sane() {
        let s = statfs(Path::new("/")).unwrap();
        assert!(s.capacity_bytes >= s.available_bytes && s.capacity_bytes > 0);
        assert!(statfs(Path::new("/nonexistent/really")).is_err());
    }
}
