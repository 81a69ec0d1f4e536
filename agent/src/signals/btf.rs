//! A reader for the kernel's BTF (`/sys/kernel/btf/vmlinux`), just enough to
//! find struct member offsets, enum values and tracepoint prototypes.
//!
//! Rust eBPF programs get no CO-RE relocations, so the agent looks up the
//! offsets the programs need in the running kernel's BTF and passes them in
//! as load-time constants ([`swiftlet_common::KernelLayout`]).

use std::path::Path;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum BtfError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("malformed BTF: {0}")]
    Malformed(&'static str),
    #[error("BTF has no {kind} named `{name}`")]
    NotFound { kind: &'static str, name: String },
    #[error("`{container}` has no member `{member}`")]
    NoMember { container: String, member: String },
}

const MAGIC: u16 = 0xeb9f;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Int = 1,
    Ptr = 2,
    Array = 3,
    Struct = 4,
    Union = 5,
    Enum = 6,
    Fwd = 7,
    Typedef = 8,
    Volatile = 9,
    Const = 10,
    Restrict = 11,
    Func = 12,
    FuncProto = 13,
    Var = 14,
    Datasec = 15,
    Float = 16,
    DeclTag = 17,
    TypeTag = 18,
    Enum64 = 19,
}

impl Kind {
    fn from_u32(v: u32) -> Option<Kind> {
        use Kind::*;
        Some(match v {
            1 => Int,
            2 => Ptr,
            3 => Array,
            4 => Struct,
            5 => Union,
            6 => Enum,
            7 => Fwd,
            8 => Typedef,
            9 => Volatile,
            10 => Const,
            11 => Restrict,
            12 => Func,
            13 => FuncProto,
            14 => Var,
            15 => Datasec,
            16 => Float,
            17 => DeclTag,
            18 => TypeTag,
            19 => Enum64,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy)]
struct Member {
    name: u32,
    ty: u32,
    /// Offset in bits.
    bit_offset: u32,
}

/// A type's header; its members, enumerators or parameters are read from
/// the type section when asked for. (Reading them all up front, and indexing
/// every name, took seconds in a debug build and far longer on an emulated
/// CPU; the agent asks for a few dozen names.)
#[derive(Debug, Clone, Copy)]
struct Type {
    name: u32,
    kind: Kind,
    kind_flag: bool,
    vlen: usize,
    /// Size for structs/unions/enums/ints; referenced type otherwise.
    size_or_type: u32,
    /// Where the kind-specific data starts in the type section.
    body: usize,
}

/// Parsed kernel BTF.
pub struct Btf {
    types: Vec<Type>,
    /// The type section.
    section: Vec<u8>,
    strings: Vec<u8>,
}

fn u16_at(b: &[u8], off: usize) -> Result<u16, BtfError> {
    b.get(off..off + 2).map(|s| u16::from_le_bytes([s[0], s[1]])).ok_or(BtfError::Malformed("truncated"))
}

fn u32_at(b: &[u8], off: usize) -> Result<u32, BtfError> {
    b.get(off..off + 4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]])).ok_or(BtfError::Malformed("truncated"))
}

/// Bytes of kind-specific data after a type's 12-byte header.
fn body_len(kind: Kind, vlen: usize) -> usize {
    match kind {
        Kind::Int | Kind::Var | Kind::DeclTag => 4,
        Kind::Array => 12,
        Kind::Struct | Kind::Union | Kind::Enum64 | Kind::Datasec => 12 * vlen,
        Kind::Enum | Kind::FuncProto => 8 * vlen,
        Kind::Ptr
        | Kind::Fwd
        | Kind::Typedef
        | Kind::Volatile
        | Kind::Const
        | Kind::Restrict
        | Kind::Func
        | Kind::Float
        | Kind::TypeTag => 0,
    }
}

impl Btf {
    /// The running kernel's BTF.
    pub fn from_sys_fs() -> Result<Btf, BtfError> {
        Btf::from_file(Path::new("/sys/kernel/btf/vmlinux"))
    }

    pub fn from_file(path: &Path) -> Result<Btf, BtfError> {
        let data = std::fs::read(path).map_err(|source| BtfError::Read { path: path.display().to_string(), source })?;
        Btf::parse(&data)
    }

    pub fn parse(data: &[u8]) -> Result<Btf, BtfError> {
        if u16_at(data, 0)? != MAGIC {
            return Err(BtfError::Malformed("bad magic (not little-endian BTF)"));
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let type_off = u32_at(data, 8)? as usize;
        let type_len = u32_at(data, 12)? as usize;
        let str_off = u32_at(data, 16)? as usize;
        let str_len = u32_at(data, 20)? as usize;
        let types_start = hdr_len + type_off;
        let types_end = types_start + type_len;
        let strings = data
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or(BtfError::Malformed("string section out of bounds"))?
            .to_vec();
        let section =
            data.get(types_start..types_end).ok_or(BtfError::Malformed("type section out of bounds"))?.to_vec();

        // Type id 0 is void.
        let mut types = vec![Type { name: 0, kind: Kind::Int, kind_flag: false, vlen: 0, size_or_type: 0, body: 0 }];
        let mut off = 0;
        while off < section.len() {
            let name = u32_at(&section, off)?;
            let info = u32_at(&section, off + 4)?;
            let size_or_type = u32_at(&section, off + 8)?;
            let vlen = (info & 0xffff) as usize;
            let kind = Kind::from_u32((info >> 24) & 0x1f).ok_or(BtfError::Malformed("unknown kind"))?;
            let body = off + 12;
            off = body + body_len(kind, vlen);
            if off > section.len() {
                return Err(BtfError::Malformed("truncated"));
            }
            types.push(Type { name, kind, kind_flag: info >> 31 == 1, vlen, size_or_type, body });
        }
        Ok(Btf { types, section, strings })
    }

    /// True when the string at `off` is `name`.
    fn name_is(&self, off: u32, name: &str) -> bool {
        let off = off as usize;
        let end = off + name.len();
        self.strings.get(off..end) == Some(name.as_bytes()) && self.strings.get(end) == Some(&0)
    }

    /// The first type of that name and kind: a forward declaration comes
    /// later than, or instead of, the full definition.
    fn find(&self, name: &str, kind: Kind) -> Option<u32> {
        let first = *name.as_bytes().first()?;
        self.types
            .iter()
            .position(|t| {
                t.kind == kind
                    && t.name != 0
                    && self.strings.get(t.name as usize) == Some(&first)
                    && self.name_is(t.name, name)
            })
            .map(|i| i as u32)
    }

    fn members(&self, t: &Type) -> impl Iterator<Item = Member> + '_ {
        let (body, flag) = (t.body, t.kind_flag);
        let n = if matches!(t.kind, Kind::Struct | Kind::Union) { t.vlen } else { 0 };
        (0..n).filter_map(move |i| {
            let o = body + 12 * i;
            let m_off = u32_at(&self.section, o + 8).ok()?;
            Some(Member {
                name: u32_at(&self.section, o).ok()?,
                ty: u32_at(&self.section, o + 4).ok()?,
                bit_offset: if flag { m_off & 0xff_ffff } else { m_off },
            })
        })
    }

    fn enum_values(&self, t: &Type) -> impl Iterator<Item = (u32, i64)> + '_ {
        let (body, kind) = (t.body, t.kind);
        let n = if matches!(kind, Kind::Enum | Kind::Enum64) { t.vlen } else { 0 };
        (0..n).filter_map(move |i| match kind {
            Kind::Enum => {
                let o = body + 8 * i;
                Some((u32_at(&self.section, o).ok()?, u32_at(&self.section, o + 4).ok()? as i32 as i64))
            }
            _ => {
                let o = body + 12 * i;
                let lo = u32_at(&self.section, o + 4).ok()? as u64;
                let hi = u32_at(&self.section, o + 8).ok()? as u64;
                Some((u32_at(&self.section, o).ok()?, ((hi << 32) | lo) as i64))
            }
        })
    }

    /// The type of parameter `i` of a function prototype.
    fn param_type(&self, t: &Type, i: usize) -> Option<u32> {
        (t.kind == Kind::FuncProto && i < t.vlen).then(|| u32_at(&self.section, t.body + 8 * i + 4).ok()).flatten()
    }

    /// Follows typedefs and qualifiers to the underlying type.
    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.types.get(id as usize).map(|t| t.kind) {
                Some(Kind::Typedef | Kind::Volatile | Kind::Const | Kind::Restrict | Kind::TypeTag) => {
                    id = self.types[id as usize].size_or_type
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
        let t = self.types.get(container as usize)?;
        for m in self.members(t) {
            if m.name == 0 {
                if depth >= 8 {
                    continue;
                }
                let inner = self.resolve(m.ty);
                if let Some((off, ty)) = self.member(inner, name, depth + 1) {
                    return Some((m.bit_offset.checked_add(off)?, ty));
                }
            } else if self.name_is(m.name, name) {
                return Some((m.bit_offset, m.ty));
            }
        }
        None
    }

    /// Byte offset of a dotted member path inside a struct, e.g.
    /// `member_offset("mem_cgroup", "memory.usage")`.
    pub fn member_offset(&self, struct_name: &str, path: &str) -> Result<u32, BtfError> {
        let mut ty = self
            .find(struct_name, Kind::Struct)
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
        let id =
            self.find(enum_name, Kind::Enum).or_else(|| self.find(enum_name, Kind::Enum64)).ok_or_else(not_found)?;
        let t = self.types[id as usize];
        self.enum_values(&t).find(|(n, _)| self.name_is(*n, variant)).map(|(_, v)| v).ok_or_else(not_found)
    }

    /// Number of arguments a BTF tracepoint passes to programs, or None when
    /// the kernel has no such tracepoint (`btf_trace_<name>` typedef).
    pub fn tracepoint_args(&self, name: &str) -> Option<usize> {
        let td = self.find(&format!("btf_trace_{name}"), Kind::Typedef)?;
        let ptr = self.resolve(td);
        let proto = self.types.get(ptr as usize)?;
        if proto.kind != Kind::Ptr {
            return None;
        }
        let f = self.types.get(self.resolve(proto.size_or_type) as usize)?;
        // The first parameter is the tracepoint's private `void *data`.
        (f.kind == Kind::FuncProto).then(|| f.vlen.saturating_sub(1))
    }

    /// Whether argument `index` of a BTF tracepoint (counting from 0, after
    /// the private `void *data`) is a pointer; None when there is no such
    /// tracepoint or argument. Tracepoints change their arguments between
    /// kernels (`mark_victim` took a pid before it took the task).
    pub fn tracepoint_arg_is_pointer(&self, name: &str, index: usize) -> Option<bool> {
        let td = self.find(&format!("btf_trace_{name}"), Kind::Typedef)?;
        let ptr = self.types.get(self.resolve(td) as usize)?;
        if ptr.kind != Kind::Ptr {
            return None;
        }
        let f = self.types.get(self.resolve(ptr.size_or_type) as usize)?;
        let ty = self.param_type(f, index + 1)?;
        Some(self.types.get(self.resolve(ty) as usize)?.kind == Kind::Ptr)
    }

    /// True when the kernel has a function (e.g. a kfunc) of that name.
    pub fn has_func(&self, name: &str) -> bool {
        self.find(name, Kind::Func).is_some()
    }

    /// The BTF type id of a kernel function, which is how a program names a
    /// kfunc it calls.
    pub fn func_id(&self, name: &str) -> Option<u32> {
        self.find(name, Kind::Func)
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
        let btf = Btf::parse(&sample()).unwrap();
        assert_eq!(btf.member_offset("outer", "a").unwrap(), 0);
        assert_eq!(btf.member_offset("outer", "memory").unwrap(), 8);
        assert_eq!(btf.member_offset("outer", "memory.usage").unwrap(), 8);
        assert!(matches!(btf.member_offset("outer", "memory.nope"), Err(BtfError::NoMember { .. })));
        assert!(matches!(btf.member_offset("nope", "a"), Err(BtfError::NotFound { .. })));
    }

    #[test]
    fn reads_enums_and_tracepoint_arity() {
        let btf = Btf::parse(&sample()).unwrap();
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
        assert!(Btf::parse(&[]).is_err());
        assert!(Btf::parse(&[0x9f, 0xeb, 1, 0, 24, 0, 0, 0, 0, 0, 0, 0, 255, 255, 0, 0]).is_err());
        let mut bad = sample();
        bad.truncate(bad.len() - 40);
        // Truncation lands in the string section; parse may fail or succeed,
        // but must not panic.
        let _ = Btf::parse(&bad);
    }
}
