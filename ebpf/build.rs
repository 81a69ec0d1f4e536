fn main() {
    // aya-ebpf reads `bpf_target_arch` to pick its per-architecture bindings.
    if let Err(e) = aya_build::emit_bpf_target_arch_cfg() {
        panic!("cannot determine the BPF target architecture: {e}");
    }
}
