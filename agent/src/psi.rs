//! Pressure stall information (PSI): the kernel's pressure files parsed
//! and read, for the node (`/proc/pressure/{cpu,memory,io}`) and for a
//! cgroup v2 directory (`cpu.pressure`, `memory.pressure`, `io.pressure`).
//!
//! A pressure file holds a `some` line and, on most resources and kernels,
//! a `full` line: `some avg10=0.12 avg60=0.00 avg300=0.00 total=1234`. The
//! averages are percentages of wall time over 10, 60 and 300 s; `total` is
//! the cumulative stall in microseconds. The parser is pure: a file
//! without a `full` line, or with fields a later kernel adds, parses; bad
//! input is an error naming the file and the text.
//!
//! Where there is no PSI (cgroup v1 cgroups, a kernel built or booted
//! without it) the readers return `None`, and the reason is logged once per
//! process ([`note_absent`]), as stats are read every housekeeping pass.

use std::{
    io,
    path::{Path, PathBuf},
};

use parking_lot::Mutex;
use thiserror::Error;

/// The node's pressure files.
pub const PROC_PRESSURE: &str = "/proc/pressure";

/// One line of a pressure file.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PsiLine {
    /// Percent of wall time stalled over the last 10 s.
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    /// Cumulative stall time in microseconds.
    pub total_us: u64,
}

/// One pressure file: `some` (at least one task stalled) and `full` (all
/// non-idle tasks stalled at once; absent for the node's CPU before 5.13).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pressure {
    pub some: PsiLine,
    pub full: Option<PsiLine>,
}

/// The three resources of a node or a cgroup; each None where its file
/// could not be read.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PsiSample {
    pub cpu: Option<Pressure>,
    pub memory: Option<Pressure>,
    pub io: Option<Pressure>,
}

impl PsiSample {
    pub fn is_empty(&self) -> bool {
        self.cpu.is_none() && self.memory.is_none() && self.io.is_none()
    }

    /// The pressure of `resource`, where it was read.
    pub fn get(&self, resource: Resource) -> Option<Pressure> {
        match resource {
            Resource::Cpu => self.cpu,
            Resource::Memory => self.memory,
            Resource::Io => self.io,
        }
    }
}

/// The three resources, by the name their files carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    Cpu,
    Memory,
    Io,
}

impl Resource {
    pub const ALL: [Resource; 3] = [Resource::Cpu, Resource::Memory, Resource::Io];

    /// `cpu`, `memory`, `io`: the file under /proc/pressure, and the
    /// prefix of the cgroup's `<name>.pressure`.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Cpu => "cpu",
            Resource::Memory => "memory",
            Resource::Io => "io",
        }
    }

    pub fn cgroup_file(self) -> String {
        format!("{}.pressure", self.name())
    }
}

#[derive(Debug, Error)]
pub enum PsiError {
    #[error("{file}: cannot parse {text:?}: {why}")]
    Parse { file: String, text: String, why: String },
    #[error("{file}: {source}")]
    Read { file: String, source: io::Error },
}

fn parse_line(file: &str, line: &str) -> Result<PsiLine, PsiError> {
    let err = |why: String| PsiError::Parse { file: file.to_owned(), text: line.to_owned(), why };
    let (mut avg10, mut avg60, mut avg300, mut total) = (None, None, None, None);
    for field in line.split_whitespace().skip(1) {
        let Some((k, v)) = field.split_once('=') else {
            return Err(err(format!("field {field:?} is not key=value")));
        };
        let avg = || -> Result<f64, PsiError> {
            match v.parse::<f64>() {
                Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
                _ => Err(err(format!("{k}={v:?} is not a non-negative percentage"))),
            }
        };
        match k {
            "avg10" => avg10 = Some(avg()?),
            "avg60" => avg60 = Some(avg()?),
            "avg300" => avg300 = Some(avg()?),
            "total" => total = Some(v.parse::<u64>().map_err(|_| err(format!("total={v:?} is not a count")))?),
            // A field a later kernel adds.
            _ => {}
        }
    }
    match (avg10, avg60, avg300, total) {
        (Some(avg10), Some(avg60), Some(avg300), Some(total_us)) => Ok(PsiLine { avg10, avg60, avg300, total_us }),
        _ => Err(err("avg10, avg60, avg300 and total are all required".into())),
    }
}

/// Parses a pressure file's text; `file` names it in errors.
pub fn parse(file: &str, text: &str) -> Result<Pressure, PsiError> {
    let mut some = None;
    let mut full = None;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match line.split_whitespace().next() {
            Some("some") => some = Some(parse_line(file, line)?),
            Some("full") => full = Some(parse_line(file, line)?),
            _ => {
                return Err(PsiError::Parse {
                    file: file.to_owned(),
                    text: line.to_owned(),
                    why: "a line starts with neither \"some\" nor \"full\"".into(),
                });
            }
        }
    }
    let some = some.ok_or_else(|| PsiError::Parse {
        file: file.to_owned(),
        text: text.to_owned(),
        why: "no \"some\" line".into(),
    })?;
    Ok(Pressure { some, full })
}

/// Reads and parses one pressure file.
pub fn read_file(path: &Path) -> Result<Pressure, PsiError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| PsiError::Read { file: file.clone(), source })?;
    parse(&file, &text)
}

/// The node's pressure under `proc_pressure` (normally [`PROC_PRESSURE`]).
pub fn read_node_at(proc_pressure: &Path) -> PsiSample {
    read_with(|r| read_file(&proc_pressure.join(r.name())))
}

/// The node's pressure from /proc/pressure; logs once when it is absent.
pub fn read_node() -> PsiSample {
    let s = read_node_at(Path::new(PROC_PRESSURE));
    if s.is_empty() {
        note_absent("the node", "the kernel has no PSI (/proc/pressure cannot be read: CONFIG_PSI off or psi=0)");
    }
    s
}

/// A cgroup v2 directory's pressure, through `read` (the file's text by
/// name: a `CgroupDir` opened once, or plain reads).
pub fn read_cgroup<E: std::fmt::Display>(dir_name: &str, read: impl Fn(&str) -> Result<String, E>) -> PsiSample {
    read_with(|r| {
        let name = r.cgroup_file();
        let file = format!("{}/{name}", dir_name.trim_end_matches('/'));
        let text =
            read(&name).map_err(|e| PsiError::Read { file: file.clone(), source: io::Error::other(e.to_string()) })?;
        parse(&file, &text)
    })
}

/// A cgroup v2 directory's pressure, read from the path.
pub fn read_cgroup_dir(dir: &Path) -> PsiSample {
    read_cgroup(&dir.display().to_string(), |f| std::fs::read_to_string(dir.join(f)))
}

fn read_with(read: impl Fn(Resource) -> Result<Pressure, PsiError>) -> PsiSample {
    let get = |r: Resource| match read(r) {
        Ok(p) => Some(p),
        Err(e) => {
            // An absent file is the common case (no PSI); anything else
            // is worth a line at debug level, once per pass at most.
            if !matches!(&e, PsiError::Read { source, .. } if source.kind() == io::ErrorKind::NotFound) {
                tracing::debug!("pressure: {e}");
            }
            None
        }
    };
    PsiSample { cpu: get(Resource::Cpu), memory: get(Resource::Memory), io: get(Resource::Io) }
}

/// Where PSI is absent, said once per scope for the life of the process.
static NOTED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Logs (once per `scope`) that `scope` has no pressure stall information
/// and why: the fields and series are left out, as the kubelet leaves them.
pub fn note_absent(scope: &str, why: &str) {
    let mut noted = NOTED.lock();
    if noted.iter().any(|s| s == scope) {
        return;
    }
    noted.push(scope.to_owned());
    tracing::info!("no pressure stall information for {scope}: {why}; its PSI fields and series are left out");
}

/// The node's memory pressure file a PSI trigger can be written to:
/// /proc/pressure/memory (what `memory.pressure` of the root cgroup
/// reports on cgroup v2 as well).
pub fn node_memory_file() -> PathBuf {
    Path::new(PROC_PRESSURE).join("memory")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMORY: &str = "some avg10=0.12 avg60=0.00 avg300=1.50 total=1234\n\
                          full avg10=0.05 avg60=0.00 avg300=0.25 total=567\n";

    #[test]
    fn files_of_every_shape() {
        let line = |avg10, avg60, avg300, total_us| PsiLine { avg10, avg60, avg300, total_us };
        let cases: &[(&str, &str, Option<Pressure>)] = &[
            (
                "some and full",
                MEMORY,
                Some(Pressure { some: line(0.12, 0.0, 1.5, 1234), full: Some(line(0.05, 0.0, 0.25, 567)) }),
            ),
            (
                "no full line (the node's CPU before 5.13)",
                "some avg10=3.00 avg60=2.00 avg300=1.00 total=99\n",
                Some(Pressure { some: line(3.0, 2.0, 1.0, 99), full: None }),
            ),
            (
                "a field a later kernel adds, fields in another order",
                "some total=7 avg300=0.00 avg60=0.00 avg10=0.00 max=12\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=1 extra=x\n",
                Some(Pressure { some: line(0.0, 0.0, 0.0, 7), full: Some(line(0.0, 0.0, 0.0, 1)) }),
            ),
            (
                "a total past 2^53",
                "some avg10=0.00 avg60=0.00 avg300=0.00 total=18446744073709551615",
                Some(Pressure { some: line(0.0, 0.0, 0.0, u64::MAX), full: None }),
            ),
            ("empty", "", None),
            ("only full", "full avg10=0.00 avg60=0.00 avg300=0.00 total=1\n", None),
            ("a missing average", "some avg10=0.00 avg300=0.00 total=1\n", None),
            ("a bad number", "some avg10=x avg60=0.00 avg300=0.00 total=1\n", None),
            ("a negative average", "some avg10=-1 avg60=0.00 avg300=0.00 total=1\n", None),
            ("not a number at all", "some avg10=NaN avg60=0.00 avg300=0.00 total=1\n", None),
            ("a negative total", "some avg10=0 avg60=0.00 avg300=0.00 total=-5\n", None),
            ("a field without =", "some avg10 avg60=0.00 avg300=0.00 total=1\n", None),
            ("another line", "some avg10=0 avg60=0 avg300=0 total=1\nhalf avg10=0\n", None),
        ];
        for (name, text, want) in cases {
            let got = parse("/proc/pressure/memory", text);
            match (want, &got) {
                (Some(w), Ok(g)) => assert_eq!(g, w, "{name}"),
                (None, Err(e)) => {
                    let msg = e.to_string();
                    assert!(msg.starts_with("/proc/pressure/memory: cannot parse"), "{name}: {msg}");
                }
                _ => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn errors_name_the_file_and_the_text() {
        let e = parse("/cg/pod/memory.pressure", "some avg10=1 avg60=oops avg300=0 total=1").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("/cg/pod/memory.pressure"), "{msg}");
        assert!(msg.contains("avg60=oops") && msg.contains("\"oops\""), "{msg}");
    }

    #[test]
    fn node_and_cgroup_readers() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("memory"), MEMORY).unwrap();
        std::fs::write(dir.path().join("cpu"), "some avg10=1.00 avg60=0.00 avg300=0.00 total=10\n").unwrap();
        let node = read_node_at(dir.path());
        assert_eq!(node.memory.unwrap().some.total_us, 1234);
        assert_eq!(node.cpu.unwrap().full, None);
        assert_eq!(node.io, None, "no io file: absent, not an error");

        let cg = tempfile::tempdir().unwrap();
        std::fs::write(cg.path().join("memory.pressure"), MEMORY).unwrap();
        std::fs::write(cg.path().join("io.pressure"), "garbage").unwrap();
        let s = read_cgroup_dir(cg.path());
        assert_eq!(s.memory.unwrap().full.unwrap().total_us, 567);
        assert_eq!((s.cpu, s.io), (None, None), "unreadable or unparsable: absent");
        assert!(read_cgroup_dir(&cg.path().join("gone")).is_empty());
    }
}
