//! `memory.stat` parsing for both cgroup versions.

use super::Version;

/// The memory.stat fields the agent uses, in bytes and hierarchical (the
/// cgroup and all its descendants) on both versions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStat {
    pub inactive_file: u64,
    pub active_file: u64,
    pub inactive_anon: u64,
    pub active_anon: u64,
    /// Anonymous memory (v1 `total_rss`, v2 `anon`).
    pub anon: u64,
    /// Page cache (v1 `total_cache`, v2 `file`).
    pub file: u64,
    /// Resident anonymous memory, as cAdvisor's container_memory_rss.
    pub rss: u64,
    /// Major page faults.
    pub pgmajfault: u64,
}

impl MemoryStat {
    /// Parses memory.stat. Unknown or malformed lines are skipped, so a
    /// kernel that adds fields never breaks the reader.
    pub fn parse(text: &str, version: Version) -> MemoryStat {
        let mut s = MemoryStat::default();
        for line in text.lines() {
            let mut it = line.split_whitespace();
            let (Some(key), Some(val)) = (it.next(), it.next()) else { continue };
            let Ok(val) = val.parse::<u64>() else { continue };
            // v1 has local (`inactive_file`) and hierarchical
            // (`total_inactive_file`) values; v2's are hierarchical.
            let key = match version {
                Version::V1 => match key.strip_prefix("total_") {
                    Some(k) => k,
                    None => continue,
                },
                Version::V2 => key,
            };
            match key {
                "inactive_file" => s.inactive_file = val,
                "active_file" => s.active_file = val,
                "inactive_anon" => s.inactive_anon = val,
                "active_anon" => s.active_anon = val,
                "rss" if version == Version::V1 => {
                    s.rss = val;
                    s.anon = val;
                }
                "anon" if version == Version::V2 => {
                    s.anon = val;
                    s.rss = val;
                }
                "cache" if version == Version::V1 => s.file = val,
                "file" if version == Version::V2 => s.file = val,
                "pgmajfault" => s.pgmajfault = val,
                _ => {}
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &str = "cache 100\nrss 200\ninactive_file 7\ntotal_cache 4096\ntotal_rss 8192\n\
total_inactive_file 1024\ntotal_active_file 3072\ntotal_inactive_anon 8192\ntotal_active_anon 0\ntotal_pgmajfault 3\n";
    const V2: &str = "anon 8192\nfile 4096\nkernel 12\ninactive_anon 8192\nactive_anon 0\n\
inactive_file 1024\nactive_file 3072\npgmajfault 3\nweird line\nfoo bar\n";

    #[test]
    fn v1_uses_hierarchical_totals() {
        let s = MemoryStat::parse(V1, Version::V1);
        assert_eq!(s.inactive_file, 1024);
        assert_eq!(s.active_file, 3072);
        assert_eq!(s.anon, 8192);
        assert_eq!(s.file, 4096);
        assert_eq!(s.pgmajfault, 3);
    }

    #[test]
    fn v2_fields_and_garbage_lines() {
        let s = MemoryStat::parse(V2, Version::V2);
        assert_eq!(
            s,
            MemoryStat {
                inactive_file: 1024,
                active_file: 3072,
                inactive_anon: 8192,
                active_anon: 0,
                anon: 8192,
                file: 4096,
                rss: 8192,
                pgmajfault: 3,
            }
        );
        assert_eq!(MemoryStat::parse("", Version::V2), MemoryStat::default());
    }
}
