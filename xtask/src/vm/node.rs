//! The node VM's disk: a Debian 12 root filesystem, made with debootstrap
//! from the Debian registry, that boots Debian's cloud kernels with systemd
//! as PID 1 and cgroup v2 only, with containerd (`SystemdCgroup = true`)
//! and runc, as kubeadm sets a node up. The run's own files (swiftlet, the
//! test binary, images, the runner) come on a second disk (`payload`).
//!
//! Cached in ~/.cache/swiftlet/vm/node: the debootstrap tree (keyed by the
//! package list, about 45 s to make) and the ext4 image made from it with
//! each kernel's modules and the node's configuration (keyed by all of it,
//! a few seconds), so changing a config file rebuilds only the image. The
//! image is booted with `snapshot=on`: no run ever changes it.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, Result};
use sha2::{Digest, Sha256};

use super::{
    initramfs::Cpio,
    kernel::{KernelImage, find_module},
};
use crate::{
    cmd::{self, note, step},
    setup,
};

const SUITE: &str = "bookworm";
/// What a kubeadm node runs besides the kubelet: systemd and logind (dbus),
/// containerd and runc; kmod and udev for modules and devices; iproute2 and
/// procps for the tests' own checks; e2fsprogs, mount and util-linux for
/// the storage checks' loop devices and the test CSI driver's ext4 (named,
/// not left to what the suite's minimal base happens to hold).
const PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "dbus",
    "containerd",
    "runc",
    "kmod",
    "udev",
    "iproute2",
    "procps",
    "ca-certificates",
    "containernetworking-plugins",
    "e2fsprogs",
    "mount",
    "util-linux",
];
/// The node's hostname, and so the Node's name.
pub const HOSTNAME: &str = "swiftlet-node";
/// Image size: the tree is about 450 MB; the rest is room for containerd's
/// snapshots and the pods' writes (which go to qemu's overlay anyway).
const IMAGE_SIZE: &str = "2G";

/// containerd's configuration for a cgroup driver: the kubelet and the
/// runtime must agree on it.
pub fn containerd_config(systemd_cgroup: bool) -> String {
    format!(
        r#"version = 2

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = {systemd_cgroup}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
"#,
        pause = crate::images::PAUSE_IMAGE,
    )
}

/// The pod network: a bridge on the node with host-local addresses (the
/// VM has no other network; hostNetwork pods do not use it).
const CNI_BRIDGE: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "swiftlet-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": { "type": "host-local", "ranges": [[{ "subnet": "10.244.0.0/24" }]] }
    },
    { "type": "loopback" }
  ]
}
"#;

/// The runner unit: after boot, the payload's `run-e2e` on the serial
/// console. `Type=exec` (a oneshot would hold the boot transaction, and
/// `systemctl is-system-running --wait` inside it would wait forever).
const RUNNER_UNIT: &str = "[Unit]
Description=swiftlet's checks from the payload disk
After=multi-user.target containerd.service
Wants=containerd.service
ConditionPathExists=/payload/run-e2e

[Service]
Type=exec
ExecStart=/payload/run-e2e
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS0
TTYReset=no
TTYVHangup=no
TimeoutStopSec=60

[Install]
WantedBy=multi-user.target
";

/// Units a test VM does not need (they slow the boot or write the console).
const MASKED: &[&str] = &[
    "serial-getty@ttyS0.service",
    "getty@tty1.service",
    "systemd-timesyncd.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "fstrim.timer",
    "man-db.timer",
    "logrotate.timer",
];

/// Files written into the tree: (path, contents, mode).
fn node_files() -> Vec<(&'static str, String, u32)> {
    vec![
        ("etc/hostname", format!("{HOSTNAME}\n"), 0o644),
        ("etc/hosts", format!("127.0.0.1 localhost\n127.0.1.1 {HOSTNAME}\n::1 localhost ip6-localhost\n"), 0o644),
        (
            "etc/fstab",
            "/dev/vda / ext4 rw,relatime 0 1\n/dev/vdb /payload ext4 ro,nofail,x-systemd.device-timeout=20s 0 0\n"
                .into(),
            0o644,
        ),
        // Fixed: every boot of the snapshot is the same machine.
        ("etc/machine-id", "5f1e7a0c2b3d4e6f8a9b0c1d2e3f4a5b\n".into(), 0o444),
        ("etc/containerd/config.toml", containerd_config(true), 0o644),
        ("etc/cni/net.d/10-bridge.conflist", CNI_BRIDGE.into(), 0o644),
        ("etc/systemd/system/swiftlet-e2e.service", RUNNER_UNIT.into(), 0o644),
        // A unit that ignores SIGTERM must not hold a power-off for 90 s.
        ("etc/systemd/system.conf.d/10-swiftlet-vm.conf", "[Manager]\nDefaultTimeoutStopSec=15s\n".into(), 0o644),
        ("payload/.mountpoint", String::new(), 0o644),
    ]
}

fn cache() -> PathBuf {
    setup::cache_dir().join("vm").join("node")
}

fn key(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The Debian mirror apt uses here (debootstrap takes packages from it).
fn mirror() -> String {
    let sources = fs::read_to_string("/etc/apt/sources.list.d/debian.sources")
        .or_else(|_| fs::read_to_string("/etc/apt/sources.list"))
        .unwrap_or_default();
    sources
        .split_whitespace()
        .find(|w| {
            (w.starts_with("http://") || w.starts_with("https://")) && w.trim_end_matches('/').ends_with("/debian")
        })
        .map(str::to_owned)
        .unwrap_or_else(|| "http://deb.debian.org/debian".into())
}

/// The pristine debootstrap tree, made once per package list.
fn ensure_tree() -> Result<PathBuf> {
    let dir = cache().join(format!("rootfs-{}", key(&[SUITE, &PACKAGES.join(",")])));
    if dir.join("usr/lib/systemd/systemd").exists() || dir.join("lib/systemd/systemd").exists() {
        return Ok(dir);
    }
    setup::require_root("building the node VM's root filesystem")?;
    setup::ensure_apt(setup::APT_NODE_VM)?;
    let partial = dir.with_extension("partial");
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(partial.parent().context("cache has a parent")?)?;
    let started = Instant::now();
    step(format!("debootstrap of Debian {SUITE} for the node VM ({})", PACKAGES.join(", ")));
    cmd::run(
        Command::new("debootstrap")
            .args(["--variant=minbase", &format!("--include={}", PACKAGES.join(",")), SUITE])
            .arg(&partial)
            .arg(mirror()),
    )
    .context("debootstrap failed; check that the Debian mirror is reachable")?;
    fs::rename(&partial, &dir)?;
    note(format!("node root filesystem in {:.0}s", started.elapsed().as_secs_f64()));
    Ok(dir)
}

/// The node's disk image with every kernel's modules, cached by recipe.
pub fn ensure_image(kernels: &[&KernelImage]) -> Result<PathBuf> {
    let tree = ensure_tree()?;
    let files = node_files();
    let mut parts: Vec<String> = vec![tree.display().to_string(), IMAGE_SIZE.into(), MASKED.join(",")];
    parts.extend(files.iter().map(|(p, c, m)| format!("{p}:{m:o}:{c}")));
    parts.extend(kernels.iter().map(|k| k.package.clone()));
    let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
    let image = cache().join(format!("node-{}.raw", key(&refs)));
    if image.exists() {
        return Ok(image);
    }
    setup::require_root("building the node VM's disk image")?;
    let started = Instant::now();
    step(format!("node VM image {}", image.display()));
    let staging = cache().join("staging");
    let _ = fs::remove_dir_all(&staging);
    cmd::run(Command::new("cp").arg("-a").arg(&tree).arg(&staging))?;
    for k in kernels {
        let modules = fs::read_dir(k.tree.join("lib/modules"))?
            .flatten()
            .next()
            .with_context(|| format!("{} has no lib/modules", k.package))?
            .path();
        let version = modules.file_name().and_then(|n| n.to_str()).context("module dir name")?.to_owned();
        // The tree is merged-/usr: /lib is a link to usr/lib.
        let dest = staging.join("usr/lib/modules");
        fs::create_dir_all(&dest)?;
        cmd::run(Command::new("cp").arg("-a").arg(&modules).arg(&dest))?;
        // The unpacked package has no modules.dep, and this host has no depmod.
        cmd::run(Command::new("chroot").arg(&staging).args(["depmod", &version]))
            .with_context(|| format!("depmod {version} in the node tree"))?;
    }
    for (path, contents, mode) in &files {
        let p = staging.join(path);
        fs::create_dir_all(p.parent().context("file has a parent")?)?;
        fs::write(&p, contents)?;
        fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(*mode))?;
    }
    let _ = fs::remove_file(staging.join("payload/.mountpoint"));
    let units = staging.join("etc/systemd/system");
    let wants = units.join("multi-user.target.wants");
    fs::create_dir_all(&wants)?;
    let _ = fs::remove_file(wants.join("swiftlet-e2e.service"));
    std::os::unix::fs::symlink("/etc/systemd/system/swiftlet-e2e.service", wants.join("swiftlet-e2e.service"))?;
    for unit in MASKED {
        let _ = fs::remove_file(units.join(unit));
        std::os::unix::fs::symlink("/dev/null", units.join(unit))?;
    }
    let partial = image.with_extension("partial");
    let _ = fs::remove_file(&partial);
    cmd::run(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", HOSTNAME, "-d"])
            .arg(&staging)
            .arg(&partial)
            .arg(IMAGE_SIZE)
            .stdout(std::process::Stdio::null()),
    )
    .context("mkfs.ext4 -d (Debian e2fsprogs)")?;
    fs::rename(&partial, &image)?;
    let _ = fs::remove_dir_all(&staging);
    // Older images of other recipes are of no use.
    for e in fs::read_dir(cache())?.flatten() {
        let p = e.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with("node-") && name.ends_with(".raw") && p != image {
            let _ = fs::remove_file(&p);
        }
    }
    note(format!("node image in {:.0}s", started.elapsed().as_secs_f64()));
    Ok(image)
}

/// The modules that give the kernel `/dev/vda` (where they are built in,
/// they are not files and are skipped); each is loaded after what its
/// `depends=` names (6.1's virtio needs virtio_ring, 6.12's has it built in).
const BOOT_MODULES: &[(&str, &str)] = &[
    ("drivers/virtio", "virtio_ring"),
    ("drivers/virtio", "virtio"),
    ("drivers/virtio", "virtio_pci_modern_dev"),
    ("drivers/virtio", "virtio_pci_legacy_dev"),
    ("drivers/virtio", "virtio_pci"),
    ("drivers/block", "virtio_blk"),
];

/// A module's `depends=` list, from its modinfo section.
fn depends(module: &[u8]) -> Vec<String> {
    let needle = b"depends=";
    module
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|at| {
            let rest = &module[at + needle.len()..];
            let end = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
            String::from_utf8_lossy(&rest[..end]).split(',').filter(|d| !d.is_empty()).map(str::to_owned).collect()
        })
        .unwrap_or_default()
}

/// The boot modules this kernel has as files, dependencies first.
pub(super) fn boot_modules(image: &KernelImage) -> Result<Vec<(String, Vec<u8>)>> {
    let mut found: Vec<(String, Vec<u8>)> = vec![];
    for (dir, name) in BOOT_MODULES {
        if let Some(module) = find_module(&image.tree, dir, name)? {
            found.push(((*name).to_owned(), module));
        }
    }
    let mut ordered: Vec<(String, Vec<u8>)> = vec![];
    while !found.is_empty() {
        let names: Vec<String> = found.iter().map(|(n, _)| n.clone()).collect();
        let ready = found
            .iter()
            .position(|(_, m)| depends(m).iter().all(|d| !names.contains(d) || ordered.iter().any(|(o, _)| o == d)))
            .unwrap_or(0);
        ordered.push(found.remove(ready));
    }
    Ok(ordered)
}

/// A small initramfs that loads the virtio disk driver, mounts /dev/vda and
/// hands over to systemd.
pub fn boot_initramfs(path: &Path, image: &KernelImage) -> Result<()> {
    let mut cpio = Cpio::create(path)?;
    for d in ["/bin", "/dev", "/proc", "/sys", "/newroot", "/modules"] {
        cpio.dir(d)?;
    }
    let busybox = fs::read("/bin/busybox").context("static busybox at /bin/busybox (Debian busybox-static)")?;
    cpio.file("/bin/busybox", &busybox, true)?;
    let mut loads = String::new();
    for (name, module) in boot_modules(image)? {
        cpio.file(&format!("/modules/{name}.ko"), &module, false)?;
        loads.push_str(&format!("insmod /modules/{name}.ko\n"));
    }
    let init = format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
{loads}
n=0
while [ ! -b /dev/vda ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n+1)); done
mount -t ext4 -o rw /dev/vda /newroot || {{ echo "@@NOTE cannot mount /dev/vda"; poweroff -f; }}
umount /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/init
"#
    );
    cpio.file("/init", init.as_bytes(), true)?;
    cpio.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_dependencies_from_modinfo() {
        let module = b"\x7fELF...\0license=GPL\0depends=virtio_ring,virtio\0retpoline=Y\0";
        assert_eq!(depends(module), ["virtio_ring", "virtio"]);
        assert!(depends(b"\0depends=\0").is_empty());
        assert!(depends(b"no modinfo").is_empty());
    }
}
