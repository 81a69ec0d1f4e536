//! Checks for what a test needs, failing with a message that names what is
//! missing instead of passing silently.

/// Panics unless running as root (eBPF, cgroups and containerd need it).
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("this test needs root (it loads eBPF programs and creates cgroups); run it through `cargo xtask test`");
    }
}

/// Panics unless the kernel exposes BTF.
pub fn require_btf() {
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        panic!("this test needs kernel BTF at /sys/kernel/btf/vmlinux (CONFIG_DEBUG_INFO_BTF)");
    }
}
