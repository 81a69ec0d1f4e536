//! Facts about the host the kubelet reports: its hostname and the IP
//! address it is reached at (`--node-ip`, else the address of the
//! interface that holds the default route, as the kubelet's fallback).

use std::{
    ffi::CStr,
    io,
    net::{IpAddr, Ipv4Addr},
    path::Path,
};

/// The machine's hostname (not lowercased: pods see it as it is): the
/// node name uname(2) gives, which is what gethostname(3) returns. Never
/// fails; the `Result` keeps callers' error paths for other sources.
pub fn hostname() -> io::Result<String> {
    Ok(rustix::system::uname().nodename().to_string_lossy().trim().to_owned())
}

/// The interface of the IPv4 default route, from /proc/net/route text.
pub fn default_route_interface(route_table: &str) -> Option<String> {
    route_table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // Iface Destination Gateway Flags ... Mask: destination 0 and mask 0.
        (f.len() > 7 && f[1] == "00000000" && f[7] == "00000000").then(|| f[0].to_owned())
    })
}

/// IPv4 addresses per interface. Through libc's getifaddrs: rustix has no
/// binding for it (it is a netlink conversation in the C library, not a
/// system call), and no maintained crate in the tree offers one.
fn interface_addresses() -> io::Result<Vec<(String, Ipv4Addr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid place for the list's pointer; getifaddrs
    // allocates the list, which is freed once below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = vec![];
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a non-null node of the list getifaddrs returned,
        // alive until freeifaddrs; the list is ours alone, so a shared
        // reference to a node cannot alias a write.
        let ifa = unsafe { &*cur };
        // SAFETY: a non-null `ifa_addr` points at a sockaddr of the list.
        if !ifa.ifa_addr.is_null() && i32::from(unsafe { (*ifa.ifa_addr).sa_family }) == libc::AF_INET {
            // SAFETY: an AF_INET address is a sockaddr_in, of the list.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            // SAFETY: ifa_name is a NUL-terminated interface name of the list.
            let name = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
            out.push((name, Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))));
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs, is freed once, and no reference
    // into the list outlives this point (names and addresses were copied).
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The node's IP: the configured one, else the default route's
/// interface address, else the first non-loopback IPv4 address.
pub fn node_ip(configured: &[IpAddr]) -> Option<IpAddr> {
    if let Some(ip) = configured.first() {
        return Some(*ip);
    }
    let addrs = interface_addresses().ok()?;
    let route = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    if let Some(iface) = default_route_interface(&route)
        && let Some((_, ip)) = addrs.iter().find(|(n, _)| *n == iface)
    {
        return Some(IpAddr::V4(*ip));
    }
    addrs.iter().find(|(_, ip)| !ip.is_loopback()).map(|(_, ip)| IpAddr::V4(*ip))
}

/// Creates `dir` (and missing parents) root-only, and makes it root-only
/// if it exists with access for group or others: the root dir holds pod
/// state and the cert dir the node's private key. Returns whether an
/// existing directory had to be tightened.
pub fn ensure_private_dir(dir: &Path) -> io::Result<bool> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o077 == 0 {
        return Ok(false);
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & 0o7700))?;
    Ok(true)
}

/// Writes a file only its owner may read (a key, a kubeconfig): created
/// 0600 under a temporary name, so it is never readable by others even for
/// a moment, then renamed over `path`.
pub fn write_private(path: &Path, data: &[u8]) -> io::Result<()> {
    write_atomic(path, data, 0o600)
}

/// Replaces `path` with `data` so that a reader, a crash or a full disk
/// never sees anything but the old file or the whole new one: written to a
/// temporary file in the same directory (created with `mode`), flushed to
/// disk, renamed over `path`, and the directory flushed. On any failure
/// (ENOSPC, EDQUOT, EIO) the temporary file is removed and `path` is left
/// as it was.
///
/// The temporary name is random and the file is created with O_EXCL, so
/// a symlink planted in the directory (a device-plugin pod can write the
/// device-plugins directory) is never followed, and the name cannot be
/// taken in advance; the rename replaces a planted symlink at `path`
/// itself rather than writing through it.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    use std::io::Write;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| io::Error::other(format!("{}: not a file name", path.display())))?;
    let (tmp, mut f) = create_exclusive(dir, &name.to_string_lossy(), mode)?;
    // Errors straight from the file (ENOSPC, EDQUOT, EIO keep their code).
    let written = (|| {
        // A umask may have narrowed the mode the file was created with.
        f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    // The rename is durable once the directory is.
    std::fs::File::open(dir)?.sync_all()
}

/// A new file `.<name>.tmp-<random>` in `dir`, created with O_EXCL (a name
/// taken meanwhile, or a planted symlink, is never opened: another random
/// name is tried).
fn create_exclusive(dir: &Path, name: &str, mode: u32) -> io::Result<(std::path::PathBuf, std::fs::File)> {
    use std::{
        hash::{BuildHasher, Hasher},
        os::unix::fs::OpenOptionsExt,
    };
    let mut last = None;
    for _ in 0..16 {
        // RandomState is seeded from the OS's random source per process and
        // differs per instance.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let tmp = dir.join(format!(".{name}.tmp-{:016x}", h.finish()));
        match std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_route() {
        let table = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                     eth0\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                     eth1\t00000000\t0100A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n";
        assert_eq!(default_route_interface(table).as_deref(), Some("eth1"));
        assert_eq!(default_route_interface("Iface\tDestination\n"), None);
    }

    #[test]
    fn configured_wins_and_the_machine_has_one() {
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        assert_eq!(node_ip(&[ip]), Some(ip));
        // Every machine this runs on has at least loopback; a node address
        // is found unless it has no network at all.
        assert!(interface_addresses().unwrap().iter().any(|(_, ip)| ip.is_loopback()));
    }
}
