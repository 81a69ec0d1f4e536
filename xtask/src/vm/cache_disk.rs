//! The cache race's disk in the bench VM: its page cache must be real
//! file-backed, reclaimable cache on a block device, which a file in the
//! initramfs (shmem) is not. The VM gets a raw ext4 image as /dev/vda,
//! the virtio modules to see it (a second newc archive appended to the
//! initramfs: the kernel unpacks concatenated archives in turn), and a
//! script that mounts it where the bench looks (SWIFTLET_BENCH_CACHE_DIR).

use std::{fs, io::Write as _, path::Path, process::Command};

use anyhow::{Context as _, Result};

use super::{initramfs::Cpio, kernel::KernelImage, node::boot_modules, qemu::Drive};
use crate::{cmd, setup};

/// The bench that needs the disk, and the kernel it runs on when no
/// `--vm` is given.
pub const BENCH: &str = "eviction-race-cache";
pub const KERNEL: &str = "6.12";
/// Room for the bench's file set (896 MiB) and ext4's own.
const DISK_MIB: u64 = 1536;

pub fn wanted(names: &[String]) -> bool {
    names.iter().any(|n| n == BENCH)
}

/// The ext4 image (made once; the file set the bench writes on it is kept
/// for the next boot).
pub fn disk(dir: &Path) -> Result<Drive> {
    setup::ensure_apt(&["e2fsprogs"])?;
    let image = dir.join("cache-disk.img");
    if !image.exists() {
        let partial = dir.join("cache-disk.img.partial");
        fs::File::create(&partial)?.set_len(DISK_MIB << 20)?;
        cmd::run(Command::new("mkfs.ext4").args(["-q", "-F", "-L", "swiftlet-cache"]).arg(&partial))
            .context("mkfs.ext4 on the cache race's disk image (Debian e2fsprogs)")?;
        fs::rename(&partial, &image)?;
    }
    Ok(Drive { image, snapshot: false })
}

/// Appends the kernel's virtio disk modules to `initramfs`, with
/// /modules/disk-modules naming them in load order.
pub fn add_disk_modules(initramfs: &Path, image: &KernelImage) -> Result<()> {
    let extra = initramfs.with_extension("disk.cpio");
    let mut cpio = Cpio::create(&extra)?;
    cpio.dir("/modules")?;
    let mut order = String::new();
    for (name, module) in boot_modules(image)? {
        cpio.file(&format!("/modules/{name}.ko"), &module, false)?;
        order.push_str(&name);
        order.push('\n');
    }
    cpio.file("/modules/disk-modules", order.as_bytes(), false)?;
    cpio.finish()?;
    let bytes = fs::read(&extra)?;
    fs::OpenOptions::new().append(true).open(initramfs)?.write_all(&bytes)?;
    let _ = fs::remove_file(&extra);
    Ok(())
}

/// The lines of the VM's /init that load the modules, mount the disk at
/// /cache and point the bench at it. MGLRU is switched off: with it, a page
/// re-read through read(2) stays in an old generation, which memory.stat
/// counts as inactive_file until reclaim ages it, so hot cache would not
/// show in the working set; the classic active/inactive LRU (Debian 12's
/// 6.1, and kernels without MGLRU) is where the kubelet's working set
/// counts it, as kubernetes#43916 describes.
pub const SCRIPT: &str = r#"for m in $(cat /modules/disk-modules); do insmod /modules/$m.ko 2>/dev/null; done
n=0; while [ ! -b /dev/vda ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n+1)); done
mkdir -p /cache && mount -t ext4 /dev/vda /cache && export SWIFTLET_BENCH_CACHE_DIR=/cache \
  || echo "@@NOTE no ext4 disk at /dev/vda: the cache race will refuse to run"
[ -w /sys/kernel/mm/lru_gen/enabled ] && echo n > /sys/kernel/mm/lru_gen/enabled
echo "@@NOTE cache disk: $(grep ' /cache ' /proc/mounts) lru_gen=$(cat /sys/kernel/mm/lru_gen/enabled 2>/dev/null)"
"#;
