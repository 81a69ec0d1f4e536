//! Per-cgroup block I/O statistics on cgroup v1: which disks the kernel
//! must be told about, and how.
//!
//! On cgroup v1, the `blkio.throttle.io_service_bytes_recursive` and
//! `io_serviced_recursive` files (what cAdvisor's `container_fs_*` read)
//! are kept by blk-throttle. Since Linux 6.9 blk-throttle is set up on a
//! disk only when a throttle file is first written for that disk; until
//! then no cgroup's statistics are kept for it and every file stays empty
//! (cgroup v2's `io.stat` is kept by blk-cgroup itself and needs nothing).
//! Measured on 6.18 with O_DIRECT `dd` in cgroups of a scratch tree, and on
//! fresh loop devices for each case:
//! - no write to any throttle file: nothing is counted, for any cgroup;
//! - after one write of `MAJ:MIN V` to one cgroup's
//!   `blkio.throttle.read_bps_device`, every cgroup's I/O on that disk is
//!   counted: the cgroup's children, a sibling tree with no limit on its
//!   path, and the root. The disk is switched on, not the cgroup, so one
//!   write per disk to the pods' cgroup is enough;
//! - V may be `0` (which the kernel stores as "no limit", U64_MAX, the
//!   same as writing U64_MAX): the file then lists no rule, nothing is
//!   throttled (no bio takes the throttling path), and the statistics are
//!   counted all the same. A finite limit is not needed, so none is set;
//! - clearing a rule later, or removing the cgroup written to, leaves the
//!   disk counting; only the disk's removal ends it;
//! - the iops files hold 32 bits: 2^40 written there reads back as 0.
//!   This is one more reason to write no limit at all.
//! - there is no other per-cgroup source on v1 here: the proportional
//!   policy's `blkio.io_service_bytes*` files exist only with BFQ (CFQ is
//!   gone), and this kernel has none (mq-deadline and none schedulers).
//!
//! Before 6.9 the statistics were always kept and the same write changes
//! nothing; it is made on every v1 kernel rather than guessed from the
//! version, which distribution backports make unreliable.

use std::{
    collections::BTreeSet,
    fmt, fs,
    path::{Path, PathBuf},
};

use crate::cgroups::{CgroupError, CgroupFs};

/// Where the disks and the mounts are read from (the host's by default).
#[derive(Clone, Debug)]
pub struct BlockDevices {
    pub sys_block: PathBuf,
    pub mountinfo: PathBuf,
}

impl Default for BlockDevices {
    fn default() -> BlockDevices {
        BlockDevices { sys_block: "/sys/block".into(), mountinfo: "/proc/self/mountinfo".into() }
    }
}

/// A block device number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevNum {
    pub major: u32,
    pub minor: u32,
}

impl DevNum {
    /// `major:minor`, as sysfs, mountinfo and cgroup files write it.
    pub fn parse(s: &str) -> Option<DevNum> {
        let (major, minor) = s.trim().split_once(':')?;
        Some(DevNum { major: major.parse().ok()?, minor: minor.parse().ok()? })
    }
}

impl fmt::Display for DevNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// A whole disk as `/sys/block` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disk {
    pub name: String,
    pub dev: DevNum,
    /// 512-byte sectors; 0 for a loop device bound to nothing, an
    /// uninitialised zram device, a drive without its medium.
    pub size: u64,
    /// It has a request queue (the throttle files refuse a disk without).
    pub has_queue: bool,
    pub partitions: Vec<DevNum>,
}

/// The throttle file written, in the blkio tree, for each disk.
pub const ACCOUNTING_FILE: &str = "blkio.throttle.read_bps_device";

/// The line written to [`ACCOUNTING_FILE`]: the disk with no limit.
pub fn accounting_line(dev: DevNum) -> String {
    format!("{dev} 0")
}

/// Whether a throttle file's text (`8:0 1048576` lines) has a rule for
/// `dev`: one set by someone else is left as it is (the disk is counted
/// already, and writing ours would clear it).
pub fn has_rule(text: &str, dev: DevNum) -> bool {
    text.lines().any(|l| l.split_whitespace().next().and_then(DevNum::parse) == Some(dev))
}

/// The disks whose I/O the pods' statistics should count: every disk with
/// a queue and a size (a loop device counts once bound: a block-mode
/// volume's may never be mounted), except RAM disks and zram (swap,
/// compressed memory) unless something is mounted from them.
pub fn disks_to_account(disks: &[Disk], mounted: &BTreeSet<DevNum>) -> Vec<DevNum> {
    disks
        .iter()
        .filter(|d| d.has_queue && d.size > 0)
        .filter(|d| {
            !is_memory_disk(&d.name) || mounted.contains(&d.dev) || d.partitions.iter().any(|p| mounted.contains(p))
        })
        .map(|d| d.dev)
        .collect()
}

/// RAM disks (brd) and zram: memory, not disks pods write to.
pub fn is_memory_disk(name: &str) -> bool {
    name.starts_with("ram") || name.starts_with("zram")
}

/// The devices mounts come from: the third field of each mountinfo line.
pub fn mounted_devices(mountinfo: &str) -> BTreeSet<DevNum> {
    mountinfo.lines().filter_map(|l| l.split_whitespace().nth(2).and_then(DevNum::parse)).collect()
}

/// The whole disks of a `/sys/block` directory; entries that cannot be
/// read (a disk going away) are left out.
pub fn scan_disks(sys_block: &Path) -> Vec<Disk> {
    let Ok(entries) = fs::read_dir(sys_block) else { return vec![] };
    let mut disks: Vec<Disk> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let dir = sys_block.join(&name);
            let dev = DevNum::parse(&fs::read_to_string(dir.join("dev")).ok()?)?;
            let size = fs::read_to_string(dir.join("size")).ok()?.trim().parse().ok()?;
            // A partition is a subdirectory with a `dev` of its own.
            let partitions = fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|p| p.file_name().to_string_lossy().starts_with(name.as_str()))
                .filter_map(|p| DevNum::parse(&fs::read_to_string(p.path().join("dev")).ok()?))
                .collect();
            Some(Disk { has_queue: dir.join("queue").is_dir(), name, dev, size, partitions })
        })
        .collect();
    disks.sort_by_key(|d| d.dev);
    disks
}

/// What writing the accounting lines did, per disk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Accounting {
    /// Disks counted from now on (or already: a rule was there).
    pub counted: Vec<DevNum>,
    /// Disks the kernel refused, with its answer.
    pub failed: Vec<(DevNum, String)>,
}

/// Tells the kernel to keep statistics on `disks`, through `rel` in the
/// blkio tree (created if missing; a v1 layout with a blkio controller).
pub fn account_v1(fs: &CgroupFs, rel: &str, disks: &[DevNum]) -> Result<Accounting, CgroupError> {
    let dir = fs.controller_dir("blkio", rel);
    fs::create_dir_all(&dir).map_err(|source| CgroupError::Io { path: dir.clone(), source })?;
    let file = dir.join(ACCOUNTING_FILE);
    let text = fs::read_to_string(&file).map_err(|source| CgroupError::Io { path: file.clone(), source })?;
    let mut out = Accounting::default();
    for &dev in disks {
        if has_rule(&text, dev) {
            out.counted.push(dev);
            continue;
        }
        // One line per write: the kernel parses one rule per write call.
        match fs::write(&file, accounting_line(dev)) {
            Ok(()) => out.counted.push(dev),
            Err(e) => out.failed.push((dev, e.to_string())),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(major: u32, minor: u32) -> DevNum {
        DevNum { major, minor }
    }

    fn disk(name: &str, d: DevNum, size: u64, partitions: &[DevNum]) -> Disk {
        Disk { name: name.into(), dev: d, size, has_queue: true, partitions: partitions.to_vec() }
    }

    #[test]
    fn which_disks_are_counted() {
        let vda = disk("vda", dev(254, 0), 1 << 29, &[]);
        let sda = disk("sda", dev(8, 0), 1 << 20, &[dev(8, 1), dev(8, 2)]);
        let dm = disk("dm-0", dev(252, 0), 1 << 20, &[]);
        let bound_loop = disk("loop3", dev(7, 3), 131_072, &[]);
        let free_loop = disk("loop0", dev(7, 0), 0, &[]);
        let zram_swap = disk("zram0", dev(253, 0), 1 << 20, &[]);
        let zram_unset = disk("zram1", dev(253, 1), 0, &[]);
        let ram_mounted = disk("ram0", dev(1, 0), 1 << 14, &[]);
        let ram_part_mounted = disk("ram1", dev(1, 1), 1 << 14, &[dev(259, 7)]);
        let no_queue = Disk { has_queue: false, ..disk("odd0", dev(240, 0), 100, &[]) };
        let empty_drive = disk("sr0", dev(11, 0), 0, &[]);
        let mounted = BTreeSet::from([dev(254, 0), dev(8, 1), dev(1, 0), dev(259, 7), dev(0, 23)]);
        let cases: [(&str, Vec<Disk>, Vec<DevNum>); 8] = [
            ("the root disk", vec![vda.clone()], vec![dev(254, 0)]),
            (
                "a disk with a mounted partition, and one with none",
                vec![sda.clone(), dm.clone()],
                vec![dev(8, 0), dev(252, 0)],
            ),
            ("a bound loop device, mounted or not; not a free one", vec![bound_loop, free_loop], vec![dev(7, 3)]),
            ("zram as swap or unset: memory", vec![zram_swap, zram_unset], vec![]),
            ("a RAM disk mounted, or its partition", vec![ram_mounted, ram_part_mounted], vec![dev(1, 0), dev(1, 1)]),
            ("no queue, nothing to throttle", vec![no_queue], vec![]),
            ("a drive without its medium", vec![empty_drive], vec![]),
            ("nothing", vec![], vec![]),
        ];
        for (what, disks, want) in cases {
            assert_eq!(disks_to_account(&disks, &mounted), want, "{what}");
        }
    }

    #[test]
    fn the_line_sets_no_limit_and_rules_are_found() {
        for (d, line) in [(dev(254, 0), "254:0 0"), (dev(7, 12), "7:12 0"), (dev(259, 65536), "259:65536 0")] {
            assert_eq!(accounting_line(d), line);
        }
        let file = "8:0 1048576\n254:0 1125899906842624\n";
        for (d, want) in [(dev(8, 0), true), (dev(254, 0), true), (dev(254, 1), false), (dev(8, 16), false)] {
            assert_eq!(has_rule(file, d), want, "{d}");
        }
        assert!(!has_rule("", dev(8, 0)));
    }

    #[test]
    fn mounts_and_device_numbers_parse() {
        let mountinfo = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
                         22 27 0:21 / /proc rw - proc proc rw\n\
                         bad line\n\
                         90 27 7:3 / /mnt/v rw - ext4 /dev/loop3 rw\n";
        assert_eq!(mounted_devices(mountinfo), BTreeSet::from([dev(254, 0), dev(0, 21), dev(7, 3)]));
        for (s, want) in [("254:0\n", Some(dev(254, 0))), ("8:", None), ("x:1", None), ("81", None)] {
            assert_eq!(DevNum::parse(s), want, "{s:?}");
        }
        assert_eq!(dev(259, 3).to_string(), "259:3");
    }

    /// A `/sys/block` in a temp dir: disks, their partitions, queues.
    #[test]
    fn scan_reads_disks_and_partitions() {
        let tmp = tempfile::tempdir().unwrap();
        let mk = |rel: &str, dev: &str, size: Option<&str>| {
            let d = tmp.path().join(rel);
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("dev"), dev).unwrap();
            if let Some(s) = size {
                fs::write(d.join("size"), s).unwrap();
            }
        };
        mk("sda", "8:0\n", Some("2048\n"));
        fs::create_dir(tmp.path().join("sda/queue")).unwrap();
        mk("sda/sda1", "8:1\n", Some("1024\n"));
        mk("sda/sda2", "8:2\n", Some("1024\n"));
        fs::create_dir(tmp.path().join("sda/holders")).unwrap();
        mk("loop0", "7:0\n", Some("0\n"));
        mk("broken", "nonsense", Some("1"));
        assert_eq!(
            scan_disks(tmp.path()),
            vec![
                Disk { name: "loop0".into(), dev: dev(7, 0), size: 0, has_queue: false, partitions: vec![] },
                Disk {
                    name: "sda".into(),
                    dev: dev(8, 0),
                    size: 2048,
                    has_queue: true,
                    partitions: vec![dev(8, 1), dev(8, 2)]
                },
            ]
        );
        assert!(scan_disks(&tmp.path().join("missing")).is_empty());
    }

    /// The writes on a fake v1 tree: the file is made by the test (as the
    /// kernel makes it), a rule already there is kept.
    #[test]
    fn account_v1_writes_one_line_per_disk_without_a_rule() {
        let tmp = tempfile::tempdir().unwrap();
        let cgfs = CgroupFs::with_layout(tmp.path(), crate::cgroups::Version::V1);
        let dir = tmp.path().join("blkio/kubepods");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(ACCOUNTING_FILE), "8:0 1048576\n").unwrap();
        let got = account_v1(&cgfs, "kubepods", &[dev(8, 0), dev(254, 0)]).unwrap();
        assert_eq!(got, Accounting { counted: vec![dev(8, 0), dev(254, 0)], failed: vec![] });
        // A plain file keeps the last write, where the kernel would add a rule.
        assert_eq!(fs::read_to_string(dir.join(ACCOUNTING_FILE)).unwrap(), "254:0 0");
        let err = account_v1(&cgfs, "kubepods/missing-file", &[dev(8, 0)]).unwrap_err();
        assert!(err.is_not_found(), "{err}");
    }
}
