//! Turns the kernel programs' `extern "C"` calls into kfunc calls.
//!
//! bpf-linker emits a call to an undefined function as an ordinary
//! BPF-to-BPF call (`call -1`, src_reg 1) with a relocation against the
//! undefined symbol, which aya would reject. Before handing the object to
//! aya, each such call is rewritten into a kfunc call (src_reg 2, imm = the
//! function's id in the running kernel's BTF), or, when this kernel lacks
//! the function, into `r0 = 0`: the code using it is then guarded dead by a
//! load-time constant, and the object still loads.

use super::btf::Btf;

#[derive(Debug, PartialEq, Eq)]
pub struct Patched {
    /// Every patched call: function name and BTF id (None = not in this kernel).
    pub calls: Vec<(String, Option<u32>)>,
}

impl Patched {
    /// True when every kfunc the object calls exists in this kernel.
    pub fn all_resolved(&self) -> bool {
        !self.calls.is_empty() && self.calls.iter().all(|(_, id)| id.is_some())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    #[error("not a 64-bit little-endian ELF object")]
    NotElf,
    #[error("ELF object truncated at offset {0}")]
    Truncated(usize),
    #[error("relocation against undefined `{0}` is not on a call instruction")]
    NotACall(String),
}

const SHT_REL: u32 = 9;
const SHF_EXECINSTR: u64 = 4;
const BPF_CALL: u8 = 0x85;
const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
/// `mov64 r0, 0`
const MOV_R0_0: [u8; 8] = [0xb7, 0, 0, 0, 0, 0, 0, 0];

fn get<const N: usize>(b: &[u8], o: usize) -> Result<[u8; N], PatchError> {
    o.checked_add(N).and_then(|end| b.get(o..end)).and_then(|s| s.try_into().ok()).ok_or(PatchError::Truncated(o))
}

/// `base + index * size`: the offset of a table's entry, an error rather
/// than a wrap when a corrupt header puts it past the address space.
fn entry(base: usize, index: usize, size: usize) -> Result<usize, PatchError> {
    index.checked_mul(size).and_then(|o| base.checked_add(o)).ok_or(PatchError::Truncated(base))
}

/// A 64-bit header field as an offset or size.
fn usize_at(b: &[u8], o: usize) -> Result<usize, PatchError> {
    u64_at(b, o).and_then(|v| usize::try_from(v).map_err(|_| PatchError::Truncated(o)))
}
fn u16_at(b: &[u8], o: usize) -> Result<u16, PatchError> {
    get::<2>(b, o).map(u16::from_le_bytes)
}
fn u32_at(b: &[u8], o: usize) -> Result<u32, PatchError> {
    get::<4>(b, o).map(u32::from_le_bytes)
}
fn u64_at(b: &[u8], o: usize) -> Result<u64, PatchError> {
    get::<8>(b, o).map(u64::from_le_bytes)
}

struct Section {
    ty: u32,
    flags: u64,
    offset: usize,
    size: usize,
    link: usize,
    info: usize,
}

/// Rewrites every call to an undefined symbol in `elf`, in place.
pub fn patch(elf: &mut [u8], btf: &Btf) -> Result<Patched, PatchError> {
    if elf.get(..6) != Some(b"\x7fELF\x02\x01") {
        return Err(PatchError::NotElf);
    }
    let shoff = usize_at(elf, 0x28)?;
    let shentsize = u16_at(elf, 0x3a)? as usize;
    let shnum = u16_at(elf, 0x3c)? as usize;
    let mut sections = Vec::with_capacity(shnum);
    for i in 0..shnum {
        let o = entry(shoff, i, shentsize)?;
        let field = |at: usize| entry(o, 1, at);
        sections.push(Section {
            ty: u32_at(elf, field(4)?)?,
            flags: u64_at(elf, field(8)?)?,
            offset: usize_at(elf, field(24)?)?,
            size: usize_at(elf, field(32)?)?,
            link: u32_at(elf, field(40)?)? as usize,
            info: u32_at(elf, field(44)?)? as usize,
        });
    }
    let mut calls = vec![];
    for rel in sections.iter().filter(|s| s.ty == SHT_REL) {
        let (Some(target), Some(symtab)) = (sections.get(rel.info), sections.get(rel.link)) else { continue };
        if target.flags & SHF_EXECINSTR == 0 {
            continue;
        }
        let Some(strtab) = sections.get(symtab.link) else { continue };
        for r in 0..rel.size / 16 {
            let ro = entry(rel.offset, r, 16)?;
            let r_offset = usize_at(elf, ro)?;
            let sym = (u64_at(elf, entry(ro, 1, 8)?)? >> 32) as usize;
            let so = entry(symtab.offset, sym, 24)?;
            if u16_at(elf, entry(so, 1, 6)?)? != 0 {
                continue; // defined: a map, a subprogram; aya's business
            }
            let name_at = entry(strtab.offset, 1, u32_at(elf, so)? as usize)?;
            let name_bytes = elf.get(name_at..).ok_or(PatchError::Truncated(name_at))?;
            let end = name_bytes.iter().position(|&c| c == 0).unwrap_or(name_bytes.len());
            let name = String::from_utf8_lossy(&name_bytes[..end]).into_owned();
            let io = entry(target.offset, 1, r_offset)?;
            let insn = get::<8>(elf, io)?;
            // Already patched (the relocations stay in the object).
            if insn == MOV_R0_0 || (insn[0] == BPF_CALL && insn[1] >> 4 == BPF_PSEUDO_KFUNC_CALL) {
                continue;
            }
            if insn[0] != BPF_CALL {
                return Err(PatchError::NotACall(name));
            }
            let id = btf.func_id(&name);
            let insn = &mut elf[io..io + 8];
            match id {
                Some(id) => {
                    insn[1] = (BPF_PSEUDO_KFUNC_CALL << 4) | (insn[1] & 0x0f);
                    insn[2..4].copy_from_slice(&0u16.to_le_bytes()); // vmlinux BTF
                    insn[4..8].copy_from_slice(&id.to_le_bytes());
                }
                None => insn.copy_from_slice(&MOV_R0_0),
            }
            calls.push((name, id));
        }
    }
    Ok(Patched { calls })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_garbage() {
        let btf = Btf::from_sys_fs().expect("this test needs kernel BTF");
        assert!(matches!(patch(&mut [0u8; 4], &btf), Err(PatchError::NotElf)));
        let mut truncated = b"\x7fELF\x02\x01\0\0".to_vec();
        truncated.resize(0x30, 0);
        assert!(matches!(patch(&mut truncated, &btf), Err(PatchError::Truncated(_))));
    }

    #[test]
    fn offsets_past_the_address_space_are_errors() {
        let btf = Btf::from_sys_fs().expect("this test needs kernel BTF");
        let mut elf = super::super::ebpf::object().to_vec();
        // The section headers said to lie at the very end of the address
        // space: an error naming where, not an overflow.
        elf[0x28..0x30].copy_from_slice(&(u64::MAX - 8).to_le_bytes());
        assert!(matches!(patch(&mut elf, &btf), Err(PatchError::Truncated(_))));
        // Every relocation section's offset made huge in turn.
        let good = super::super::ebpf::object().to_vec();
        let shoff = u64::from_le_bytes(good[0x28..0x30].try_into().unwrap()) as usize;
        let shentsize = u16::from_le_bytes(good[0x3a..0x3c].try_into().unwrap()) as usize;
        let shnum = u16::from_le_bytes(good[0x3c..0x3e].try_into().unwrap()) as usize;
        let mut results = vec![];
        for i in 0..shnum {
            let o = shoff + i * shentsize;
            if u32::from_le_bytes(good[o + 4..o + 8].try_into().unwrap()) != SHT_REL {
                continue;
            }
            let mut elf = good.clone();
            elf[o + 24..o + 32].copy_from_slice(&(u64::MAX - 15).to_le_bytes());
            results.push(patch(&mut elf, &btf));
            elf[o + 32..o + 40].copy_from_slice(&u64::MAX.to_le_bytes());
            results.push(patch(&mut elf, &btf));
        }
        // A section on data is skipped (Ok); one on code has its entries
        // out of reach.
        assert!(results.iter().all(|r| matches!(r, Ok(_) | Err(PatchError::Truncated(_)))), "{results:?}");
        assert!(results.iter().any(|r| matches!(r, Err(PatchError::Truncated(_)))), "{results:?}");
    }

    #[test]
    fn patches_the_agents_own_object() {
        let btf = Btf::from_sys_fs().expect("kernel BTF");
        let mut elf = super::super::ebpf::object().to_vec();
        let p = patch(&mut elf, &btf).unwrap();
        let mut names: Vec<&str> = p.calls.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names, ["bpf_send_signal_task", "bpf_task_from_pid", "bpf_task_release"]);
        // Resolved exactly where the kernel has them (6.13 and later).
        assert_eq!(p.all_resolved(), btf.has_func("bpf_send_signal_task"), "{:?}", p.calls);
        for (name, id) in &p.calls {
            assert_eq!(*id, btf.func_id(name), "{name}");
        }
        // Patching twice finds nothing left to patch.
        assert!(patch(&mut elf, &btf).unwrap().calls.is_empty());
    }
}
