//! A newc initramfs written entry by entry: static busybox, an /init
//! script, binaries with the glibc libraries they load, kernel modules.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result};

use super::kernel::{KernelImage, find_module};
use crate::cmd::{self, note};

/// A newc cpio archive, written entry by entry.
pub struct Cpio {
    out: std::io::BufWriter<fs::File>,
    ino: u32,
}

impl Cpio {
    pub fn create(path: &Path) -> Result<Cpio> {
        let f = fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        Ok(Cpio { out: std::io::BufWriter::new(f), ino: 1 })
    }

    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) -> Result<()> {
        let name = name.trim_start_matches('/');
        let header = format!(
            "070701{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}",
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len(),
            0,
            0,
            0,
            0,
            name.len() + 1,
            0
        );
        self.ino += 1;
        self.out.write_all(header.as_bytes())?;
        self.out.write_all(name.as_bytes())?;
        self.out.write_all(&[0])?;
        let pad = |n: usize| (4 - n % 4) % 4;
        self.out.write_all(&[0; 3][..pad(110 + name.len() + 1)])?;
        self.out.write_all(data)?;
        self.out.write_all(&[0; 3][..pad(data.len())])?;
        Ok(())
    }

    pub fn dir(&mut self, name: &str) -> Result<()> {
        self.entry(name, 0o040755, &[])
    }

    pub fn file(&mut self, name: &str, data: &[u8], executable: bool) -> Result<()> {
        self.entry(name, if executable { 0o100755 } else { 0o100644 }, data)
    }

    pub fn finish(mut self) -> Result<()> {
        self.entry("TRAILER!!!", 0, &[])?;
        self.out.flush()?;
        Ok(())
    }
}

/// Every directory leading to `path` (for cpio, which needs them listed).
pub fn parents(path: &str) -> Vec<String> {
    let mut out = vec![];
    let mut cur = String::new();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    for p in &parts[..parts.len().saturating_sub(1)] {
        cur = format!("{cur}/{p}");
        out.push(cur.clone());
    }
    out
}

/// The shared libraries a dynamically linked binary loads, from ldd.
pub fn libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = cmd::output(Command::new("ldd").arg(bin))?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// The binary without its debug info (the initramfs stays small).
pub fn stripped(bin: &Path, scratch: &Path) -> Result<Vec<u8>> {
    let out = scratch.join(bin.file_name().context("binary has a name")?);
    cmd::run(Command::new("objcopy").arg("--strip-debug").arg(bin).arg(&out).stdout(Stdio::null()))?;
    let data = fs::read(&out)?;
    let _ = fs::remove_file(&out);
    Ok(data)
}

/// Writes the initramfs: busybox, `init`, the binaries (debug info
/// stripped) at their destinations with the libraries they load, and the
/// kernel's loop module.
pub fn build_initramfs(path: &Path, image: &KernelImage, binaries: &[(String, PathBuf)], init: &str) -> Result<()> {
    let started = Instant::now();
    let scratch = path.with_extension("scratch");
    fs::create_dir_all(&scratch)?;
    let mut cpio = Cpio::create(path)?;
    let mut dirs: std::collections::BTreeSet<String> =
        ["/bin", "/dev", "/proc", "/sys", "/tmp", "/t", "/t/deps", "/modules"].into_iter().map(String::from).collect();
    let mut files: Vec<(String, Vec<u8>, bool)> = vec![];
    files.push(("/init".into(), init.as_bytes().to_vec(), true));
    let busybox = fs::read("/bin/busybox").context("static busybox at /bin/busybox (Debian busybox-static)")?;
    files.push(("/bin/busybox".into(), busybox, true));
    let mut libs = std::collections::BTreeSet::new();
    for (dest, bin) in binaries {
        files.push((dest.clone(), stripped(bin, &scratch)?, true));
        libs.extend(libraries(bin)?);
    }
    for lib in libs {
        let data = fs::read(&lib).with_context(|| format!("cannot read {}", lib.display()))?;
        files.push((lib.display().to_string(), data, true));
    }
    if let Some(module) = find_module(&image.tree, "drivers/block", "loop")? {
        files.push(("/modules/loop.ko".into(), module, false));
    }
    for (name, _, _) in &files {
        dirs.extend(parents(name));
    }
    for d in &dirs {
        cpio.dir(d)?;
    }
    let mut bytes = 0;
    for (name, data, exec) in &files {
        bytes += data.len();
        cpio.file(name, data, *exec)?;
    }
    cpio.finish()?;
    let _ = fs::remove_dir_all(&scratch);
    note(format!("{} ({} MiB) in {:.1}s", path.display(), bytes >> 20, started.elapsed().as_secs_f64()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpio_paths() {
        assert_eq!(parents("/lib/x86_64-linux-gnu/libc.so.6"), vec!["/lib", "/lib/x86_64-linux-gnu"]);
        assert!(parents("/init").is_empty());
    }
}
