//! The running kernel's BTF (`/sys/kernel/btf/vmlinux`): read once, parsed
//! once by aya-obj (the [`aya::Btf`] the loader and the program loads use),
//! and asked for the struct member offsets, enum values and tracepoint
//! prototypes the kernel programs need.
//!
//! Rust eBPF programs get no CO-RE relocations, so the agent looks up the
//! offsets the programs need in the running kernel's BTF and passes them in
//! as load-time constants ([`swiftlet_common::KernelLayout`]).
//!
//! Type ids come from aya-obj's public lookup by name and kind. aya-obj 0.3
//! keeps a type's members, enumerators and parameters crate-private, so the
//! few records the agent reads are decoded here, from the same bytes aya-obj
//! parsed, through an index of where each type's record starts (four bytes
//! a type; nothing else is copied or decoded up front).

use std::path::Path;

use aya_obj::btf::BtfKind;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum BtfError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("malformed BTF: {0}")]
    Malformed(&'static str),
    #[error("malformed BTF: {0}")]
    Parse(#[from] aya::BtfError),
    #[error("BTF has no {kind} named `{name}`")]
    NotFound { kind: &'static str, name: String },
    #[error("`{container}` has no member `{member}`")]
    NoMember { container: String, member: String },
}

const MAGIC: u16 = 0xeb9f;
/// Bytes of a type record's common header (name, info, size or type).
const HEADER_LEN: usize = 12;

/// A type record's header; the kind-specific data follows it.
#[derive(Debug, Clone, Copy)]
struct Header {
    kind: BtfKind,
    kind_flag: bool,
    vlen: usize,
    /// Size for structs/unions/enums/ints; referenced type otherwise.
    size_or_type: u32,
    /// Where the kind-specific data starts in the type section.
    body: usize,
}

/// Parsed kernel BTF.
pub struct Btf {
    parsed: aya::Btf,
    /// The whole BTF blob, as read.
    data: Vec<u8>,
    /// Where the type and string sections lie in `data`.
    types: std::ops::Range<usize>,
    strings: std::ops::Range<usize>,
    /// For each type id, where its record starts in the type section (id 0,
    /// void, has none).
    record_at: Vec<u32>,
}

fn u16_at(b: &[u8], off: usize) -> Result<u16, BtfError> {
    b.get(off..off + 2).map(|s| u16::from_le_bytes([s[0], s[1]])).ok_or(BtfError::Malformed("truncated"))
}

fn u32_at(b: &[u8], off: usize) -> Result<u32, BtfError> {
    b.get(off..off + 4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]])).ok_or(BtfError::Malformed("truncated"))
}

/// Bytes of kind-specific data after a type's 12-byte header.
fn body_len(kind: BtfKind, vlen: usize) -> usize {
    match kind {
        BtfKind::Int | BtfKind::Var | BtfKind::DeclTag => 4,
        BtfKind::Array => 12,
        BtfKind::Struct | BtfKind::Union | BtfKind::Enum64 | BtfKind::DataSec => 12 * vlen,
        BtfKind::Enum | BtfKind::FuncProto => 8 * vlen,
        BtfKind::Unknown
        | BtfKind::Ptr
        | BtfKind::Fwd
        | BtfKind::Typedef
        | BtfKind::Volatile
        | BtfKind::Const
        | BtfKind::Restrict
        | BtfKind::Func
        | BtfKind::Float
        | BtfKind::TypeTag => 0,
    }
}

impl Btf {
    /// The running kernel's BTF.
    pub fn from_sys_fs() -> Result<Btf, BtfError> {
        Btf::from_file(Path::new("/sys/kernel/btf/vmlinux"))
    }

    pub fn from_file(path: &Path) -> Result<Btf, BtfError> {
        let data = std::fs::read(path).map_err(|source| BtfError::Read { path: path.display().to_string(), source })?;
        Btf::parse(data)
    }

    pub fn parse(data: Vec<u8>) -> Result<Btf, BtfError> {
        if u16_at(&data, 0)? != MAGIC {
            return Err(BtfError::Malformed("bad magic (not little-endian BTF)"));
        }
        let hdr_len = u32_at(&data, 4)? as usize;
        let type_off = u32_at(&data, 8)? as usize;
        let type_len = u32_at(&data, 12)? as usize;
        let str_off = u32_at(&data, 16)? as usize;
        let str_len = u32_at(&data, 20)? as usize;
        let types = hdr_len + type_off..hdr_len + type_off + type_len;
        let strings = hdr_len + str_off..hdr_len + str_off + str_len;
        if data.get(types.clone()).is_none() {
            return Err(BtfError::Malformed("type section out of bounds"));
        }
        if data.get(strings.clone()).is_none() {
            return Err(BtfError::Malformed("string section out of bounds"));
        }
        let parsed = aya::Btf::parse(&data, aya::Endianness::Little)?;
        let section = &data[types.clone()];
        let mut record_at = vec![u32::MAX];
        let mut off = 0;
        while off < section.len() {
            let info = u32_at(section, off + 4)?;
            let kind = BtfKind::try_from((info >> 24) & 0x1f).map_err(|_| BtfError::Malformed("unknown kind"))?;
            record_at.push(u32::try_from(off).map_err(|_| BtfError::Malformed("type section over 4 GiB"))?);
            off += HEADER_LEN + body_len(kind, (info & 0xffff) as usize);
        }
        if off > section.len() {
            return Err(BtfError::Malformed("truncated"));
        }
        Ok(Btf { parsed, data, types, strings, record_at })
    }

    /// aya-obj's parse, for the loader and the program loads.
    pub fn aya(&self) -> &aya::Btf {
        &self.parsed
    }

    fn section(&self) -> &[u8] {
        &self.data[self.types.clone()]
    }

    fn header(&self, id: u32) -> Option<Header> {
        let off = *self.record_at.get(id as usize).filter(|&&o| o != u32::MAX)? as usize;
        let section = self.section();
        let info = u32_at(section, off + 4).ok()?;
        Some(Header {
            kind: BtfKind::try_from((info >> 24) & 0x1f).ok()?,
            kind_flag: info >> 31 == 1,
            vlen: (info & 0xffff) as usize,
            size_or_type: u32_at(section, off + 8).ok()?,
            body: off + HEADER_LEN,
        })
    }

    /// True when the string at `off` is `name`.
    fn name_is(&self, off: u32, name: &str) -> bool {
        let strings = &self.data[self.strings.clone()];
        let off = off as usize;
        let end = off + name.len();
        strings.get(off..end) == Some(name.as_bytes()) && strings.get(end) == Some(&0)
    }

    /// The first type of that name and kind: a forward declaration comes
    /// later than, or instead of, the full definition.
    fn find(&self, name: &str, kind: BtfKind) -> Option<u32> {
        self.parsed.id_by_type_name_kind(name, kind).ok()
    }

    /// (name, type, bit offset) of each member of a struct or union.
    fn members(&self, t: Header) -> impl Iterator<Item = (u32, u32, u32)> + '_ {
        let n = if matches!(t.kind, BtfKind::Struct | BtfKind::Union) { t.vlen } else { 0 };
        let section = self.section();
        (0..n).filter_map(move |i| {
            let o = t.body + 12 * i;
            let m_off = u32_at(section, o + 8).ok()?;
            let bit_offset = if t.kind_flag { m_off & 0xff_ffff } else { m_off };
            Some((u32_at(section, o).ok()?, u32_at(section, o + 4).ok()?, bit_offset))
        })
    }

    fn enum_values(&self, t: Header) -> impl Iterator<Item = (u32, i64)> + '_ {
        let n = if matches!(t.kind, BtfKind::Enum | BtfKind::Enum64) { t.vlen } else { 0 };
        let section = self.section();
        (0..n).filter_map(move |i| match t.kind {
            BtfKind::Enum => {
                let o = t.body + 8 * i;
                Some((u32_at(section, o).ok()?, u32_at(section, o + 4).ok()? as i32 as i64))
            }
            _ => {
                let o = t.body + 12 * i;
                let lo = u32_at(section, o + 4).ok()? as u64;
                let hi = u32_at(section, o + 8).ok()? as u64;
                Some((u32_at(section, o).ok()?, ((hi << 32) | lo) as i64))
            }
        })
    }

    /// The type of parameter `i` of a function prototype.
    fn param_type(&self, t: Header, i: usize) -> Option<u32> {
        (t.kind == BtfKind::FuncProto && i < t.vlen).then(|| u32_at(self.section(), t.body + 8 * i + 4).ok()).flatten()
    }

    /// Follows typedefs and qualifiers to the underlying type.
    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.header(id) {
                Some(h)
                    if matches!(
                        h.kind,
                        BtfKind::Typedef | BtfKind::Volatile | BtfKind::Const | BtfKind::Restrict | BtfKind::TypeTag
                    ) =>
                {
                    id = h.size_or_type
                }
                _ => break,
            }
        }
        id
    }

    /// Finds `name` among a struct's members, looking inside anonymous
    /// structs and unions (to a bounded depth, so malformed BTF with a cycle
    /// cannot recurse forever). Returns (bit offset, member type).
    fn member(&self, container: u32, name: &str, depth: u32) -> Option<(u32, u32)> {
        let t = self.header(container)?;
        for (m_name, m_ty, m_bits) in self.members(t) {
            if m_name == 0 {
                if depth >= 8 {
                    continue;
                }
                let inner = self.resolve(m_ty);
                if let Some((off, ty)) = self.member(inner, name, depth + 1) {
                    return Some((m_bits.checked_add(off)?, ty));
                }
            } else if self.name_is(m_name, name) {
                return Some((m_bits, m_ty));
            }
        }
        None
    }

    /// Byte offset of a dotted member path inside a struct, e.g.
    /// `member_offset("mem_cgroup", "memory.usage")`.
    pub fn member_offset(&self, struct_name: &str, path: &str) -> Result<u32, BtfError> {
        let mut ty = self
            .find(struct_name, BtfKind::Struct)
            .ok_or_else(|| BtfError::NotFound { kind: "struct", name: struct_name.to_owned() })?;
        let mut bits = 0;
        let mut container = struct_name.to_owned();
        for part in path.split('.') {
            let (off, member_ty) = self
                .member(self.resolve(ty), part, 0)
                .ok_or_else(|| BtfError::NoMember { container: container.clone(), member: part.to_owned() })?;
            bits = off.checked_add(bits).ok_or(BtfError::Malformed("member offset overflows"))?;
            ty = member_ty;
            container = format!("{container}.{part}");
        }
        if bits % 8 != 0 {
            return Err(BtfError::Malformed("member is a bitfield"));
        }
        Ok(bits / 8)
    }

    /// The value of an enumerator, e.g. `enum_value("node_stat_item", "NR_INACTIVE_FILE")`.
    pub fn enum_value(&self, enum_name: &str, variant: &str) -> Result<i64, BtfError> {
        let not_found = || BtfError::NotFound { kind: "enumerator", name: format!("{enum_name}::{variant}") };
        let id = self
            .find(enum_name, BtfKind::Enum)
            .or_else(|| self.find(enum_name, BtfKind::Enum64))
            .ok_or_else(not_found)?;
        let t = self.header(id).ok_or_else(not_found)?;
        self.enum_values(t).find(|(n, _)| self.name_is(*n, variant)).map(|(_, v)| v).ok_or_else(not_found)
    }

    /// The prototype behind a BTF tracepoint's `btf_trace_<name>` typedef
    /// (a pointer to a function prototype), if the kernel has it.
    fn tracepoint_proto(&self, name: &str) -> Option<Header> {
        let td = self.find(&format!("btf_trace_{name}"), BtfKind::Typedef)?;
        let ptr = self.header(self.resolve(td))?;
        if ptr.kind != BtfKind::Ptr {
            return None;
        }
        self.header(self.resolve(ptr.size_or_type)).filter(|f| f.kind == BtfKind::FuncProto)
    }

    /// Number of arguments a BTF tracepoint passes to programs, or None when
    /// the kernel has no such tracepoint (`btf_trace_<name>` typedef).
    pub fn tracepoint_args(&self, name: &str) -> Option<usize> {
        // The first parameter is the tracepoint's private `void *data`.
        self.tracepoint_proto(name).map(|f| f.vlen.saturating_sub(1))
    }

    /// Whether argument `index` of a BTF tracepoint (counting from 0, after
    /// the private `void *data`) is a pointer; None when there is no such
    /// tracepoint or argument. Tracepoints change their arguments between
    /// kernels (`mark_victim` took a pid before it took the task).
    pub fn tracepoint_arg_is_pointer(&self, name: &str, index: usize) -> Option<bool> {
        let f = self.tracepoint_proto(name)?;
        let ty = self.param_type(f, index + 1)?;
        Some(self.header(self.resolve(ty))?.kind == BtfKind::Ptr)
    }

    /// True when the kernel has a function (e.g. a kfunc) of that name.
    pub fn has_func(&self, name: &str) -> bool {
        self.func_id(name).is_some()
    }

    /// The BTF type id of a kernel function, which is how a program names
    /// a kfunc it calls.
    pub fn func_id(&self, name: &str) -> Option<u32> {
        self.find(name, BtfKind::Func)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a tiny BTF blob: `struct inner { long usage; }`,
    /// `struct outer { int a; union { struct inner memory; }; }`,
    /// `enum e { A = 0, B = 7 }`, and `btf_trace_x` (two ints) and
    /// `btf_trace_z` (a pointer) typedefs.
    fn sample() -> Vec<u8> {
        let mut strings = b"\0inner\0usage\0outer\0a\0memory\0e\0A\0B\0long\0int\0btf_trace_x\0btf_trace_z\0".to_vec();
        let s = |name: &str, strings: &Vec<u8>| -> u32 {
            let needle = format!("\0{name}\0");
            strings.windows(needle.len()).position(|w| w == needle.as_bytes()).map(|p| p as u32 + 1).unwrap()
        };
        let mut t: Vec<u32> = vec![];
        let info = |kind: u32, vlen: u32| (kind << 24) | vlen;
        // 1: long (int, 8 bytes)
        t.extend([s("long", &strings), info(1, 0), 8, 64]);
        // 2: int
        t.extend([s("int", &strings), info(1, 0), 4, 32]);
        // 3: struct inner { long usage @0 }
        t.extend([s("inner", &strings), info(4, 1), 8, s("usage", &strings), 1, 0]);
        // 4: anonymous union { struct inner memory @0 }
        t.extend([0, info(5, 1), 8, s("memory", &strings), 3, 0]);
        // 5: struct outer { int a @0; union @64 }
        t.extend([s("outer", &strings), info(4, 2), 16, s("a", &strings), 2, 0, 0, 4, 64]);
        // 6: enum e { A=0, B=7 }
        t.extend([s("e", &strings), info(6, 2), 4, s("A", &strings), 0, s("B", &strings), 7]);
        // 7: func proto (void *, int, int) -> void
        t.extend([0, info(13, 3), 0, 0, 1, 0, 2, 0, 2]);
        // 8: ptr to 7
        t.extend([0, info(2, 0), 7]);
        // 9: typedef btf_trace_x -> 8
        t.extend([s("btf_trace_x", &strings), info(8, 0), 8]);
        // 10: ptr to struct inner; 11: func proto (void *, struct inner *);
        // 12: ptr to 11; 13: typedef btf_trace_z -> 12
        t.extend([0, info(2, 0), 3]);
        t.extend([0, info(13, 2), 0, 0, 1, 0, 10]);
        t.extend([0, info(2, 0), 11]);
        t.extend([s("btf_trace_z", &strings), info(8, 0), 12]);
        let types: Vec<u8> = t.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut out = vec![];
        out.extend(MAGIC.to_le_bytes());
        out.extend([1u8, 0]);
        out.extend(24u32.to_le_bytes());
        out.extend(0u32.to_le_bytes());
        out.extend((types.len() as u32).to_le_bytes());
        out.extend((types.len() as u32).to_le_bytes());
        out.extend((strings.len() as u32).to_le_bytes());
        out.extend(types);
        out.append(&mut strings);
        out
    }

    #[test]
    fn finds_members_through_anonymous_unions() {
        let btf = Btf::parse(sample()).unwrap();
        assert_eq!(btf.member_offset("outer", "a").unwrap(), 0);
        assert_eq!(btf.member_offset("outer", "memory").unwrap(), 8);
        assert_eq!(btf.member_offset("outer", "memory.usage").unwrap(), 8);
        assert!(matches!(btf.member_offset("outer", "memory.nope"), Err(BtfError::NoMember { .. })));
        assert!(matches!(btf.member_offset("nope", "a"), Err(BtfError::NotFound { .. })));
    }

    #[test]
    fn reads_enums_and_tracepoint_arity() {
        let btf = Btf::parse(sample()).unwrap();
        assert_eq!(btf.enum_value("e", "B").unwrap(), 7);
        assert!(btf.enum_value("e", "C").is_err());
        assert_eq!(btf.tracepoint_args("x"), Some(2));
        assert_eq!(btf.tracepoint_args("y"), None);
        // btf_trace_x(void *data, int, int): the arguments are not pointers.
        assert_eq!(btf.tracepoint_arg_is_pointer("x", 0), Some(false));
        assert_eq!(btf.tracepoint_arg_is_pointer("x", 1), Some(false));
        assert_eq!(btf.tracepoint_arg_is_pointer("x", 2), None);
        assert_eq!(btf.tracepoint_arg_is_pointer("y", 0), None);
        assert_eq!(btf.tracepoint_arg_is_pointer("z", 0), Some(true));
        assert_eq!(btf.tracepoint_args("z"), Some(1));
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        assert!(Btf::parse(vec![]).is_err());
        assert!(Btf::parse(vec![0x9f, 0xeb, 1, 0, 24, 0, 0, 0, 0, 0, 0, 0, 255, 255, 0, 0]).is_err());
        let mut bad = sample();
        bad.truncate(bad.len() - 40);
        // Truncation lands in the string section; parse may fail or succeed,
        // but must not panic.
        let _ = Btf::parse(bad);
    }
}
