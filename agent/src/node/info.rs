//! Facts read from this machine for node status: machine and boot ids,
//! kernel, OS image, architecture, host name and addresses.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::NodeAddress;

use super::status::MachineInfo;
use crate::version::goarch;

/// PRETTY_NAME of an os-release file ("Debian GNU/Linux 12 (bookworm)").
pub fn parse_os_release(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let v = l.strip_prefix("PRETTY_NAME=")?.trim();
        let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(v);
        Some(v.replace("\\\"", "\"").replace("\\\\", "\\"))
    })
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path).map(|s| s.trim().to_owned()).unwrap_or_default()
}

fn kernel_release() -> String {
    rustix::system::uname().release().to_string_lossy().into_owned()
}

pub fn machine_info() -> MachineInfo {
    let os_image = std::fs::read_to_string("/etc/os-release")
        .or_else(|_| std::fs::read_to_string("/usr/lib/os-release"))
        .ok()
        .and_then(|t| parse_os_release(&t))
        .unwrap_or_else(|| "Unknown".into());
    MachineInfo {
        machine_id: read_trimmed("/etc/machine-id"),
        system_uuid: read_trimmed("/sys/class/dmi/id/product_uuid").to_lowercase(),
        boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
        kernel_version: kernel_release(),
        os_image,
        operating_system: std::env::consts::OS.to_owned(),
        architecture: goarch(std::env::consts::ARCH).to_owned(),
    }
}

fn usable(ip: &IpAddr) -> bool {
    !ip.is_loopback() && !ip.is_unspecified() && !ip.is_multicast()
}

/// The node's addresses: InternalIP = --node-ip (both families when two
/// are given), else the address pods get as their hostIP (`host::node_ip`:
/// the default route's interface); then Hostname. (The kubelet would try
/// resolving the host name first; swiftlet keeps InternalIP and the pods'
/// hostIP the same and never blocks on DNS.)
pub fn node_addresses(node_ips: &[IpAddr], hostname: &str) -> Vec<NodeAddress> {
    let mut ips: Vec<IpAddr> = node_ips.iter().copied().filter(usable).collect();
    if ips.is_empty() {
        ips.extend(crate::host::node_ip(&[]).filter(usable));
    }
    addresses(&ips, hostname)
}

/// Pure part: InternalIPs in order, then the Hostname.
pub fn addresses(ips: &[IpAddr], hostname: &str) -> Vec<NodeAddress> {
    let mut out: Vec<NodeAddress> =
        ips.iter().map(|ip| NodeAddress { type_: "InternalIP".into(), address: ip.to_string() }).collect();
    if !hostname.is_empty() {
        out.push(NodeAddress { type_: "Hostname".into(), address: hostname.to_owned() });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_release() {
        let t = "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\n";
        assert_eq!(parse_os_release(t).as_deref(), Some("Debian GNU/Linux 12 (bookworm)"));
        assert_eq!(parse_os_release("PRETTY_NAME=Plain\n").as_deref(), Some("Plain"));
        assert_eq!(parse_os_release("ID=x\n"), None);
    }

    #[test]
    fn address_order() {
        let a = addresses(&["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()], "node-a");
        let got: Vec<(&str, &str)> = a.iter().map(|x| (x.type_.as_str(), x.address.as_str())).collect();
        assert_eq!(got, vec![("InternalIP", "10.0.0.1"), ("InternalIP", "fd00::1"), ("Hostname", "node-a")]);
        // --node-ip wins over resolution; loopback is never used.
        let given = node_addresses(&["10.9.9.9".parse().unwrap()], "node-a");
        assert_eq!(given[0].address, "10.9.9.9");
        let fallback = node_addresses(&["127.0.0.1".parse().unwrap()], "localhost");
        assert!(fallback.iter().all(|a| a.address != "127.0.0.1"));
    }
}
