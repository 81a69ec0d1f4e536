//! Debian's cloud kernels for the VMs: the image package resolved with
//! apt, downloaded and unpacked once into ~/.cache/swiftlet/vm.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    cmd::{self, note, step},
    setup,
};

/// A kernel of the matrix.
#[derive(Clone, Copy, Debug)]
pub struct KernelSpec {
    pub name: &'static str,
    /// The Debian meta-package that depends on the current image.
    pub meta: &'static str,
    /// What the image package's name starts with (checks the meta's choice,
    /// and finds an image when the meta is unavailable).
    prefix: &'static str,
}

pub const KERNELS: &[KernelSpec] = &[
    KernelSpec { name: "6.1", meta: "linux-image-cloud-amd64", prefix: "linux-image-6.1.0-" },
    KernelSpec { name: "6.12", meta: "linux-image-6.12-cloud-amd64", prefix: "linux-image-6.12." },
];

/// The kernel `cargo xtask test` boots by default: the oldest LTS, which
/// differs most from this host (no memcg tracepoints, no kill kfuncs,
/// mark_victim with a pid).
pub const CI_KERNEL: &str = "6.1";

/// The image package's vmlinuz (and its root, for modules), downloaded and
/// unpacked once into ~/.cache/swiftlet/vm.
pub struct KernelImage {
    pub package: String,
    pub vmlinuz: PathBuf,
    pub tree: PathBuf,
}

pub fn vm_cache() -> PathBuf {
    setup::cache_dir().join("vm")
}

pub fn fetch_kernel(k: &KernelSpec) -> Result<KernelImage> {
    let cache = vm_cache();
    fs::create_dir_all(&cache).with_context(|| format!("cannot create {}", cache.display()))?;
    let remembered = cache.join(format!("{}.package", k.meta));
    let package = match resolve_package(k) {
        Ok(p) => {
            let _ = fs::write(&remembered, &p);
            p
        }
        // Offline: the image fetched last time will do.
        Err(e) => match fs::read_to_string(&remembered) {
            Ok(p) => {
                note(format!("cannot ask apt for the {} image ({e:#}); using the cached {}", k.name, p.trim()));
                p.trim().to_owned()
            }
            Err(_) => return Err(e),
        },
    };
    let tree = cache.join(&package);
    let vmlinuz = |tree: &Path| -> Option<PathBuf> {
        fs::read_dir(tree.join("boot"))
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("vmlinuz-")))
    };
    if let Some(v) = vmlinuz(&tree) {
        return Ok(KernelImage { package, vmlinuz: v, tree });
    }
    let deb = match find_deb(&cache, &package) {
        Some(d) => d,
        None => {
            step(format!("downloading {package} (kernel {})", k.name));
            cmd::run(
                Command::new("apt-get")
                    .current_dir(&cache)
                    // As root into a root-owned cache: no _apt sandbox.
                    .args(["-q", "-o", "APT::Sandbox::User=root", "download", &package]),
            )
            .with_context(|| format!("cannot download {package}; check that the Debian mirror is reachable"))?;
            find_deb(&cache, &package).with_context(|| format!("apt-get download left no {package}_*.deb"))?
        }
    };
    let partial = cache.join(format!("{package}.partial"));
    let _ = fs::remove_dir_all(&partial);
    cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial))?;
    fs::rename(&partial, &tree)?;
    let v = vmlinuz(&tree).with_context(|| format!("{} has no boot/vmlinuz-*", deb.display()))?;
    Ok(KernelImage { package, vmlinuz: v, tree })
}

fn find_deb(dir: &Path, package: &str) -> Option<PathBuf> {
    let prefix = format!("{package}_");
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb")))
}

/// The current image package of a kernel series: what the meta-package
/// depends on, else the newest package of that series apt knows.
fn resolve_package(k: &KernelSpec) -> Result<String> {
    let ask = || -> Result<Option<String>> {
        let deps = cmd::output(Command::new("apt-cache").args(["depends", "--important", k.meta]))?;
        if let Some(p) = deps
            .lines()
            .filter_map(|l| l.trim().strip_prefix("Depends: "))
            .map(str::trim)
            .find(|p| p.starts_with(k.prefix) && p.ends_with("-cloud-amd64"))
        {
            return Ok(Some(p.to_owned()));
        }
        let found = cmd::output(Command::new("apt-cache").args(["search", "--names-only", &format!("^{}", k.prefix)]))?;
        let mut names: Vec<&str> =
            found.lines().filter_map(|l| l.split_whitespace().next()).filter(|n| n.ends_with("-cloud-amd64")).collect();
        names.sort_by_key(|n| natural_key(n));
        Ok(names.last().map(|s| (*s).to_owned()))
    };
    if let Some(p) = ask().unwrap_or(None) {
        return Ok(p);
    }
    note("refreshing the package lists (apt-get update)");
    cmd::run(Command::new("apt-get").args(["update", "-q"]))?;
    ask()?.with_context(|| format!("apt knows no {}*-cloud-amd64 package (kernel {})", k.prefix, k.name))
}

/// Sorts 6.1.0-9 before 6.1.0-56.
fn natural_key(s: &str) -> Vec<(u64, String)> {
    let mut out = vec![];
    let mut num = String::new();
    let mut text = String::new();
    for ch in s.chars() {
        if ch.is_ascii_digit() {
            if !text.is_empty() {
                out.push((0, std::mem::take(&mut text)));
            }
            num.push(ch);
        } else {
            if !num.is_empty() {
                out.push((num.parse().unwrap_or(0), String::new()));
                num.clear();
            }
            text.push(ch);
        }
    }
    if !num.is_empty() {
        out.push((num.parse().unwrap_or(0), String::new()));
    }
    if !text.is_empty() {
        out.push((0, text));
    }
    out
}

/// A module of the image (`dir` below `kernel/`), decompressed (busybox
/// insmod reads plain .ko).
pub fn find_module(tree: &Path, dir: &str, name: &str) -> Result<Option<Vec<u8>>> {
    let Some(modules) = fs::read_dir(tree.join("lib/modules")).ok().and_then(|mut d| d.next()).and_then(|e| e.ok())
    else {
        return Ok(None);
    };
    let base = modules.path().join("kernel").join(dir);
    let plain = base.join(format!("{name}.ko"));
    if plain.exists() {
        return Ok(Some(fs::read(plain)?));
    }
    let xz = base.join(format!("{name}.ko.xz"));
    if xz.exists() {
        let out = Command::new("xz").arg("-dc").arg(&xz).output().context("xz (Debian xz-utils)")?;
        if !out.status.success() {
            bail!("cannot decompress {}", xz.display());
        }
        return Ok(Some(out.stdout));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order_of_kernel_packages() {
        let mut v =
            ["linux-image-6.1.0-9-cloud-amd64", "linux-image-6.1.0-56-cloud-amd64", "linux-image-6.1.0-10-cloud-amd64"];
        v.sort_by_key(|n| natural_key(n));
        assert_eq!(v.last(), Some(&"linux-image-6.1.0-56-cloud-amd64"));
    }
}
