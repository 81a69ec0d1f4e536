//! Packages of other Debian suites (trixie, sid) for this host's tools and
//! the VMs, without touching the host's apt configuration, package lists or
//! libc: each suite gets a private apt tree under ~/.cache/swiftlet/debian/
//! <suite> (its own sources list, lists and package cache), packages are
//! fetched with `apt-get download` and unpacked with `dpkg-deb -x`, never
//! installed (sid's closure would upgrade libc6 and systemd).
//!
//! Versions are pinned by prefix (`"2.1."`): an unpacked version matching
//! the prefix is used as it is, without the network; otherwise the suite's
//! lists are refreshed when they are older than a day, the newest matching
//! version is downloaded and unpacked. Offline, whatever matching version
//! was fetched before is used.

use std::{
    cmp::Ordering,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, SystemTime},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    cmd::{self, note, step},
    setup,
};

/// The mirror, unless `SWIFTLET_DEBIAN_MIRROR` names another.
const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
/// Debian's archive keyring (package debian-archive-keyring): it signs
/// every suite, sid included.
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
/// Lists older than this are refreshed before a version is resolved.
const LISTS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// A package unpacked from a suite.
#[derive(Clone, Debug)]
pub struct Unpacked {
    /// The Debian version, e.g. `2.1.9+ds1-5`.
    pub version: String,
    /// The root of the unpacked tree (`<root>/usr/bin/...`).
    pub root: PathBuf,
}

/// ~/.cache/swiftlet/debian: one private apt tree per suite, and the
/// unpacked packages.
pub fn cache_root() -> PathBuf {
    setup::cache_dir().join("debian")
}

/// The newest version of `package` in `suite` whose version starts with
/// `version_prefix` (empty: any), unpacked; see the module's note on when
/// the network is asked.
pub fn unpack(suite: &str, package: &str, version_prefix: &str) -> Result<Unpacked> {
    let tree = SuiteTree::new(suite)?;
    if let Some(u) = tree.newest_unpacked(package, version_prefix) {
        return Ok(u);
    }
    let version = match tree.resolve(package, version_prefix) {
        Ok(v) => v,
        Err(e) => {
            // Offline with nothing unpacked: a downloaded .deb will still do.
            if let Some(u) = tree.unpack_cached_deb(package, version_prefix)? {
                note(format!("cannot resolve {package} in {suite} ({e:#}); using the downloaded {}", u.version));
                return Ok(u);
            }
            return Err(e);
        }
    };
    let deb = match tree.find_deb(package, &version) {
        Some(d) => d,
        None => tree.download(package, &version)?,
    };
    tree.unpack_deb(package, &version, &deb)
}

/// A suite's private apt tree.
struct SuiteTree {
    suite: String,
    dir: PathBuf,
}

impl SuiteTree {
    fn new(suite: &str) -> Result<SuiteTree> {
        if suite.is_empty() || !suite.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            bail!("{suite:?} is not a Debian suite name");
        }
        let dir = cache_root().join(suite);
        for d in [dir.join("lists/partial"), dir.join("cache/archives/partial"), dir.join("debs"), dir.join("pkgs")] {
            fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
        }
        let mirror = std::env::var("SWIFTLET_DEBIAN_MIRROR").unwrap_or_else(|_| DEFAULT_MIRROR.to_owned());
        let sources = format!("deb [signed-by={KEYRING}] {mirror} {suite} main\n");
        let path = dir.join("sources.list");
        if fs::read_to_string(&path).ok().as_deref() != Some(sources.as_str()) {
            fs::write(&path, sources).with_context(|| format!("cannot write {}", path.display()))?;
        }
        Ok(SuiteTree { suite: suite.to_owned(), dir })
    }

    /// apt-get or apt-cache confined to this tree: our sources only (no
    /// sources.list.d), our lists and package cache; the host's dpkg status
    /// is read, never written.
    fn apt(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        let opt = |k: &str, v: &Path| format!("{k}={}", v.display());
        c.current_dir(self.dir.join("debs"))
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["-q", "-o", &opt("Dir::Etc::sourcelist", &self.dir.join("sources.list"))])
            .args(["-o", "Dir::Etc::sourceparts=-"])
            .args(["-o", &opt("Dir::State::Lists", &self.dir.join("lists"))])
            .args(["-o", &opt("Dir::Cache", &self.dir.join("cache"))])
            // As root into a root-owned cache: no _apt sandbox.
            .args(["-o", "APT::Sandbox::User=root"])
            // Only the package indices: no translations, no AppStream data.
            .args(["-o", "Acquire::Languages=none"])
            .args(["-o", "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false"])
            .args(["-o", "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false"])
            .args(["-o", "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false"]);
        c
    }

    fn lists_age(&self) -> Option<Duration> {
        let newest = fs::read_dir(self.dir.join("lists"))
            .ok()?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with("_Packages"))
            .filter_map(|e| e.metadata().ok()?.modified().ok())
            .max()?;
        SystemTime::now().duration_since(newest).ok()
    }

    fn update(&self) -> Result<()> {
        step(format!("refreshing the package lists of Debian {} (private, under {})", self.suite, self.dir.display()));
        setup::require_root("fetching Debian packages")?;
        cmd::output(self.apt("apt-get").arg("update")).map(|_| ()).with_context(|| {
            format!("cannot refresh the {} lists; check that the Debian mirror is reachable", self.suite)
        })
    }

    /// The newest version of the package matching the prefix, refreshing the
    /// lists when they are stale or do not know one.
    fn resolve(&self, package: &str, prefix: &str) -> Result<String> {
        let fresh = self.lists_age().is_some_and(|a| a < LISTS_MAX_AGE);
        if !fresh {
            self.update()?;
        }
        let ask = || -> Result<Option<String>> {
            let out = cmd::output(self.apt("apt-cache").args(["madison", package]))?;
            Ok(newest(madison_versions(&out, package).into_iter().filter(|v| v.starts_with(prefix))))
        };
        match ask()? {
            Some(v) => Ok(v),
            None if fresh => {
                self.update()?;
                ask()?.with_context(|| format!("Debian {} has no {package} {prefix}*", self.suite))
            }
            None => bail!("Debian {} has no {package} {prefix}*", self.suite),
        }
    }

    fn download(&self, package: &str, version: &str) -> Result<PathBuf> {
        step(format!("downloading {package} {version} from Debian {}", self.suite));
        cmd::output(self.apt("apt-get").args(["download", &format!("{package}={version}")])).with_context(|| {
            format!("cannot download {package} {version}; check that the Debian mirror is reachable")
        })?;
        self.find_deb(package, version).with_context(|| format!("apt-get download left no {package} {version} .deb"))
    }

    /// The downloaded .deb of that version (apt escapes the epoch's ':').
    fn find_deb(&self, package: &str, version: &str) -> Option<PathBuf> {
        self.debs(package).into_iter().find(|(v, _)| v == version).map(|(_, p)| p)
    }

    /// The downloaded .debs of a package: (version, path).
    fn debs(&self, package: &str) -> Vec<(String, PathBuf)> {
        let prefix = format!("{package}_");
        let Ok(rd) = fs::read_dir(self.dir.join("debs")) else { return vec![] };
        rd.flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let rest = name.strip_prefix(&prefix)?.strip_suffix(".deb")?;
                let (version, _arch) = rest.rsplit_once('_')?;
                Some((version.replace("%3a", ":"), e.path()))
            })
            .collect()
    }

    fn unpacked_dir(&self, package: &str, version: &str) -> PathBuf {
        self.dir.join("pkgs").join(format!("{package}_{}", version.replace(':', "%3a")))
    }

    /// The newest complete unpack of a matching version.
    fn newest_unpacked(&self, package: &str, prefix: &str) -> Option<Unpacked> {
        let marker = format!("{package}_");
        let versions = fs::read_dir(self.dir.join("pkgs")).ok()?.flatten().filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            // Package names have no '_'; ".partial" dirs are unpacks
            // that did not finish.
            let v = name.strip_prefix(&marker)?.replace("%3a", ":");
            (!v.contains('_') && !v.ends_with(".partial") && v.starts_with(prefix)).then_some(v)
        });
        let version = newest(versions)?;
        Some(Unpacked { root: self.unpacked_dir(package, &version), version })
    }

    fn unpack_cached_deb(&self, package: &str, prefix: &str) -> Result<Option<Unpacked>> {
        let debs: Vec<(String, PathBuf)> =
            self.debs(package).into_iter().filter(|(v, _)| v.starts_with(prefix)).collect();
        let Some(version) = newest(debs.iter().map(|(v, _)| v.clone())) else { return Ok(None) };
        let Some((_, deb)) = debs.into_iter().find(|(v, _)| *v == version) else { return Ok(None) };
        self.unpack_deb(package, &version, &deb).map(Some)
    }

    /// `dpkg-deb -x` into a partial dir renamed when complete, so an
    /// interrupted unpack is never taken for a package.
    fn unpack_deb(&self, package: &str, version: &str, deb: &Path) -> Result<Unpacked> {
        let root = self.unpacked_dir(package, version);
        let partial = PathBuf::from(format!("{}.partial", root.display()));
        let _ = fs::remove_dir_all(&partial);
        cmd::run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&partial))?;
        let _ = fs::remove_dir_all(&root);
        fs::rename(&partial, &root)
            .with_context(|| format!("cannot rename {} to {}", partial.display(), root.display()))?;
        note(format!("unpacked {package} {version} into {}", root.display()));
        Ok(Unpacked { version: version.to_owned(), root })
    }
}

/// The versions `apt-cache madison` lists for the package (one line per
/// version and source: `pkg | version | url suite/component arch Packages`).
fn madison_versions(out: &str, package: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| {
            let mut f = l.split('|').map(str::trim);
            (f.next()? == package).then_some(())?;
            let v = f.next()?;
            f.next().is_some_and(|src| src.ends_with("Packages")).then(|| v.to_owned())
        })
        .collect()
}

fn newest(versions: impl Iterator<Item = String>) -> Option<String> {
    versions.max_by(|a, b| compare_versions(a, b))
}

/// Debian's version order (deb-version(7)): epoch, then upstream version
/// and revision, each compared as alternating non-digit and digit parts,
/// where '~' sorts before everything, even the end of the part.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    let split = |v: &str| -> (u64, String, String) {
        let (epoch, rest) = match v.split_once(':') {
            Some((e, r)) if e.chars().all(|c| c.is_ascii_digit()) => (e.parse().unwrap_or(0), r),
            _ => (0, v),
        };
        match rest.rsplit_once('-') {
            Some((up, rev)) => (epoch, up.to_owned(), rev.to_owned()),
            None => (epoch, rest.to_owned(), String::new()),
        }
    };
    let (ea, ua, ra) = split(a);
    let (eb, ub, rb) = split(b);
    ea.cmp(&eb).then_with(|| compare_part(&ua, &ub)).then_with(|| compare_part(&ra, &rb))
}

fn compare_part(a: &str, b: &str) -> Ordering {
    // Letters sort before non-letters, '~' before all, the end before any
    // character except '~'.
    fn weight(c: Option<char>) -> i32 {
        match c {
            Some('~') => -1,
            None => 0,
            Some(c) if c.is_ascii_alphabetic() => c as i32,
            Some(c) => c as i32 + 256,
        }
    }
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    while !a.is_empty() || !b.is_empty() {
        let na = a.iter().position(u8::is_ascii_digit).unwrap_or(a.len());
        let nb = b.iter().position(u8::is_ascii_digit).unwrap_or(b.len());
        let (ta, tb) = (&a[..na], &b[..nb]);
        let mut i = 0;
        while i < ta.len() || i < tb.len() {
            let o = weight(ta.get(i).map(|&c| c as char)).cmp(&weight(tb.get(i).map(|&c| c as char)));
            if o != Ordering::Equal {
                return o;
            }
            i += 1;
        }
        (a, b) = (&a[na..], &b[nb..]);
        let da = a.iter().position(|c| !c.is_ascii_digit()).unwrap_or(a.len());
        let db = b.iter().position(|c| !c.is_ascii_digit()).unwrap_or(b.len());
        let num = |d: &[u8]| d.iter().fold(0u128, |n, c| n.saturating_mul(10).saturating_add(u128::from(c - b'0')));
        let o = num(&a[..da]).cmp(&num(&b[..db]));
        if o != Ordering::Equal {
            return o;
        }
        (a, b) = (&a[da..], &b[db..]);
    }
    Ordering::Equal
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debian_version_order() {
        let ordered =
            ["1.6.20~ds1-1", "1.6.20~ds1-1+deb12u3", "1.6.20", "2.1.9+ds1-5", "2.1.10~rc1-1", "2.1.10-1", "1:0.1-1"];
        for w in ordered.windows(2) {
            assert_eq!(compare_versions(w[0], w[1]), Ordering::Less, "{} < {}", w[0], w[1]);
            assert_eq!(compare_versions(w[1], w[0]), Ordering::Greater, "{} > {}", w[1], w[0]);
        }
        assert_eq!(compare_versions("2.1.9+ds1-5", "2.1.9+ds1-5"), Ordering::Equal);
    }

    #[test]
    fn madison_lines_give_the_packages_versions() {
        let out = "containerd | 2.1.9+ds1-5 | http://deb.debian.org/debian sid/main amd64 Packages\n\
                   containerd | 1.7.24~ds1-6+deb13u1 | http://deb.debian.org/debian trixie/main amd64 Packages\n\
                   containerd-shim | 9 | http://deb.debian.org/debian sid/main amd64 Packages\n\
                   containerd | 1.6.20~ds1-1+deb12u3 | http://deb.debian.org/debian bookworm/main Sources\n";
        let v = madison_versions(out, "containerd");
        assert_eq!(v, ["2.1.9+ds1-5", "1.7.24~ds1-6+deb13u1"]);
        assert_eq!(newest(v.into_iter().filter(|v| v.starts_with("2.1."))).as_deref(), Some("2.1.9+ds1-5"));
    }
}
